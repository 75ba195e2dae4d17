#include "mixkv/cache/kv_cache_manager.hpp"

#include <fmt/format.h>

#include "kv_cache_coordinator.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::cache {

KvCacheManager::KvCacheManager(const plan::CachePlan& plan, int num_spec_tokens,
                               ManagerOptions options)
    : pool_(plan.pools.at(0).num_blocks), num_spec_tokens_(num_spec_tokens), options_(options) {
  if (num_spec_tokens < 0)
    throw_invalid(fmt::format("num_spec_tokens is {}, expected >= 0", num_spec_tokens));
  if (options.snapshot_interval < 0) {
    throw_invalid(fmt::format("snapshot_interval is {}, expected 0 (automatic) or a token count",
                              options.snapshot_interval));
  }
  coordinator_ = std::make_unique<KvCacheCoordinator>(plan, num_spec_tokens, options);
  snapshot_interval_ = coordinator_->snapshot_interval();
  every_step_ = coordinator_->commits_every_step();
}

KvCacheManager::KvCacheManager(const KvCacheManager& other)
    : pool_(other.pool_),
      num_spec_tokens_(other.num_spec_tokens_),
      options_(other.options_),
      coordinator_(std::make_unique<KvCacheCoordinator>(*other.coordinator_)),
      snapshot_interval_(other.snapshot_interval_),
      every_step_(other.every_step_),
      requests_(other.requests_),
      free_slots_(other.free_slots_),
      index_(other.index_) {}

KvCacheManager& KvCacheManager::operator=(const KvCacheManager& other) {
  if (this != &other) *this = KvCacheManager(other);
  return *this;
}

KvCacheManager::KvCacheManager(KvCacheManager&&) noexcept = default;
KvCacheManager& KvCacheManager::operator=(KvCacheManager&&) noexcept = default;
KvCacheManager::~KvCacheManager() = default;

KvCacheManager::SlotIndex::SlotIndex() : entries_(16), shift_(64 - 4) {}

void KvCacheManager::SlotIndex::insert(std::int64_t id, std::int32_t slot) {
  if (2 * (size_ + 1) > entries_.size()) grow();
  const std::size_t mask = entries_.size() - 1;
  std::size_t i = home(id);
  while (entries_[i].slot >= 0) i = (i + 1) & mask;
  entries_[i] = {id, slot};
  ++size_;
}

void KvCacheManager::SlotIndex::erase(std::int64_t id) {
  const std::size_t mask = entries_.size() - 1;
  std::size_t hole = home(id);
  while (entries_[hole].slot >= 0 && entries_[hole].id != id) hole = (hole + 1) & mask;
  if (entries_[hole].slot < 0) return;  // absent
  entries_[hole].slot = -1;
  --size_;
  // Backward shift instead of tombstones: move later entries of the run into the hole when their
  // home is not after it (cyclically), so every entry stays reachable from its home without a gap.
  for (std::size_t j = (hole + 1) & mask; entries_[j].slot >= 0; j = (j + 1) & mask) {
    const std::size_t h = home(entries_[j].id);
    const bool stays = hole < j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (stays) continue;
    entries_[hole] = entries_[j];
    entries_[j].slot = -1;
    hole = j;
  }
}

void KvCacheManager::SlotIndex::grow() {
  std::vector<Entry> old(entries_.size() * 2);
  old.swap(entries_);
  --shift_;
  size_ = 0;
  for (const Entry& e : old) {
    if (e.slot >= 0) insert(e.id, e.slot);
  }
}

SequenceView KvCacheManager::view(const Request& r) {
  return {r.slot, r.id, r.num_computed, r.snapshot_at};
}

void KvCacheManager::throw_no_request(RequestId id) {
  throw_invalid(fmt::format("no request {}", id.value()));
}

void KvCacheManager::add_request(RequestId id, std::vector<TokenId> prompt, SequenceKeys keys) {
  if (prompt.empty()) throw_invalid(fmt::format("request {} has an empty prompt", id.value()));
  if (index_.find(id.value()) >= 0)
    throw_invalid(fmt::format("request {} already exists", id.value()));
  Request r;
  r.id = id.value();
  r.live = true;
  r.tokens = std::move(prompt);
  r.keys = std::move(keys);
  r.hashes.resize(coordinator_->num_hashers());
  update_hashes(r);  // throws for bad multimodal keys: before a slot is taken
  const RequestSlot slot = free_slots_.empty()
                               ? RequestSlot{static_cast<std::int32_t>(requests_.size())}
                               : free_slots_.back();
  r.slot = slot;
  coordinator_->open(slot);
  r.capacity = coordinator_->capacity(slot);  // no slots yet (unbounded without attention)
  if (slot.index() == requests_.size()) {
    requests_.push_back(std::move(r));
  } else {
    free_slots_.pop_back();
    requests_[slot.index()] = std::move(r);
  }
  index_.insert(id.value(), slot.value());
}

void KvCacheManager::update_hashes(Request& r) {
  if (!options_.enable_prefix_caching) return;
  // Most decode steps fill no block: decide without touching the hash lists.
  if (static_cast<std::int64_t>(r.tokens.size()) < r.hash_at) return;
  r.hash_at = coordinator_->extend_hashes(r.tokens, r.keys, r.hashes);
}

std::int64_t KvCacheManager::find_prefix_hit(RequestId id) const {
  if (!options_.enable_prefix_caching) return 0;
  const Request& r = request(id);
  // The last known token is always computed: its logits pick the next token.
  return coordinator_->find_prefix_hit(r.hashes, pool_,
                                       static_cast<std::int64_t>(r.tokens.size()) - 1);
}

std::optional<std::int64_t> KvCacheManager::admit(RequestId id, int lookahead) {
  Request& r = request(id);
  if (r.num_computed != 0 || r.admitted) {
    throw_invalid(fmt::format("request {} is already admitted", id.value()));
  }
  const std::int64_t hit = find_prefix_hit(id);
  const auto num_tokens = static_cast<std::int64_t>(r.tokens.size());
  // The prefill computes the rest of the prompt; its look-ahead covers the first drafts.
  const std::int64_t snapshot_at = coordinator_->snapshot_target(hit, num_tokens - hit, lookahead);
  if (!coordinator_->admit(r.slot, r.hashes, pool_, hit, num_tokens + lookahead, num_tokens,
                           snapshot_at > 0)) {
    return std::nullopt;
  }
  r.admitted = true;
  r.num_computed = hit;
  r.capacity = coordinator_->capacity(r.slot);
  r.next_event = 0;  // the prefill's commit checks every group
  r.snapshot_at = snapshot_at;
  return hit;
}

bool KvCacheManager::allocate(RequestId id, std::int64_t num_new, int lookahead) {
  Request& r = request(id);
  if (num_new < 0 || lookahead < 0) throw_invalid("allocate() takes non-negative token counts");
  const std::int64_t total = r.num_computed + num_new + lookahead;
  // Most decode steps fit in the look-ahead slots already held (recurrent tables may lack their
  // snapshot slot, and pick the step's snapshot boundary: they take the slow path).
  if (total <= r.capacity && !every_step_) return true;
  return grow(r, num_new, lookahead);
}

bool KvCacheManager::grow(Request& r, std::int64_t num_new, int lookahead) {
  const std::int64_t snapshot_at =
      coordinator_->snapshot_target(r.num_computed, num_new, lookahead);
  const auto added =
      coordinator_->grow(r.slot, pool_, r.num_computed + num_new + lookahead, snapshot_at > 0);
  if (!added) return false;
  r.snapshot_at = snapshot_at;
  if (*added > 0) r.capacity = coordinator_->capacity(r.slot);
  return true;
}

void KvCacheManager::commit(RequestId id, std::int64_t newly_computed,
                            std::span<const TokenId> new_tokens, int accepted_drafts) {
  Request& r = request(id);
  const std::int64_t known = static_cast<std::int64_t>(r.tokens.size() + new_tokens.size());
  if (newly_computed < 0 || r.num_computed + newly_computed > known) {
    throw_invalid(fmt::format("request {}: {} tokens computed, but only {} are known", id.value(),
                              r.num_computed + newly_computed, known));
  }
  if (accepted_drafts < 0 || accepted_drafts > num_spec_tokens_) {
    throw_invalid(fmt::format("request {}: {} accepted drafts, at most {} speculative tokens",
                              id.value(), accepted_drafts, num_spec_tokens_));
  }
  if (r.num_computed + newly_computed > r.capacity) {
    coordinator_->throw_over_capacity(view(r), r.num_computed + newly_computed, r.capacity);
  }
  // A step appends a token or a few: push_back beats insert's call to memmove.
  reserve_for(r.tokens, r.tokens.size() + new_tokens.size());
  for (const TokenId t : new_tokens) r.tokens.push_back(t);
  r.num_computed += newly_computed;
  update_hashes(r);
  if (r.num_computed < r.next_event) return;  // no block filled or left a window
  commit_groups(r, accepted_drafts);
}

void KvCacheManager::commit_groups(Request& r, int accepted_drafts) {
  coordinator_->commit(view(r), r.hashes, accepted_drafts, pool_);
  if (snapshot_interval_ > 0) r.snapshot_at = 0;  // the next allocate() picks the next boundary
  r.next_event = coordinator_->next_event(r.slot);
}

void KvCacheManager::free(RequestId id) {
  const std::int32_t slot = index_.find(id.value());
  if (slot < 0) throw_invalid(fmt::format("no request {}", id.value()));
  Request& r = requests_[static_cast<std::size_t>(slot)];
  coordinator_->release(r.slot, pool_);
  r = Request{};  // releases its memory; the slot is reused by a later request
  index_.erase(id.value());
  free_slots_.push_back(RequestSlot{slot});
}

std::int64_t KvCacheManager::num_computed(RequestId id) const { return request(id).num_computed; }

std::span<const BlockId> KvCacheManager::block_table(RequestId id, int group) const {
  return coordinator_->table(request(id).slot, group);
}

RecurrentStep KvCacheManager::recurrent_step(RequestId id, int group) const {
  const Request& r = request(id);
  const auto step = coordinator_->recurrent_step(view(r), group);
  if (!step) throw_invalid(fmt::format("group {} is not a recurrent KV-cache group", group));
  return *step;
}

std::vector<GroupStats> KvCacheManager::stats() const { return coordinator_->stats(pool_); }

std::string KvCacheManager::check_invariants() const {
  if (auto pool = pool_.check_invariants(); !pool.empty()) return "pool: " + pool;
  std::vector<std::int32_t> refs(static_cast<std::size_t>(pool_.num_blocks()), 0);
  std::size_t live = 0;
  for (std::size_t slot = 0; slot < requests_.size(); ++slot) {
    const Request& r = requests_[slot];
    if (!r.live) continue;
    ++live;
    if (index_.find(r.id) != static_cast<std::int32_t>(slot)) {
      return fmt::format("request {} in slot {} is indexed at slot {}", r.id, slot,
                         index_.find(r.id));
    }
    if (r.slot.index() != slot) {
      return fmt::format("request {} in slot {} names slot {}", r.id, slot, r.slot.value());
    }
    std::string broken = coordinator_->check(view(r), pool_, refs);
    if (!broken.empty()) return broken;
  }
  for (const Request& r : requests_) {
    if (!r.live || !r.admitted) continue;
    if (r.capacity != coordinator_->capacity(r.slot)) {
      return fmt::format("request {}: capacity {}, its tables hold {}", r.id, r.capacity,
                         coordinator_->capacity(r.slot));
    }
    if (r.next_event > coordinator_->next_event(r.slot)) {
      return fmt::format("request {}: next event at {} tokens, after the true {}", r.id,
                         r.next_event, coordinator_->next_event(r.slot));
    }
  }
  if (live != index_.size() || live + free_slots_.size() != requests_.size()) {
    return fmt::format("{} live requests, {} indexed, {} free slots of {}", live, index_.size(),
                       free_slots_.size(), requests_.size());
  }
  for (std::int32_t b = 1; b < pool_.num_blocks(); ++b) {
    if (refs[static_cast<std::size_t>(b)] != pool_.ref_count(BlockId{b})) {
      return fmt::format("block {}: {} tables hold it but its reference count is {}", b,
                         refs[static_cast<std::size_t>(b)], pool_.ref_count(BlockId{b}));
    }
  }
  return "";
}

}  // namespace mixkv::cache
