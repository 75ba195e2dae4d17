#include "mixkv/cache/kv_cache_manager.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::cache {
namespace {

bool is_attention(plan::Behaviour b) { return b != plan::Behaviour::kRecurrent; }

// Grows `v` geometrically to hold `n`. BlockPool::allocate and BlockHasher::extend reserve exactly
// what they append, which alone would copy a table or hash list every time a block is added.
template <class T>
void reserve_for(std::vector<T>& v, std::size_t n) {
  if (v.capacity() < n) v.reserve(std::max(n, 2 * v.capacity()));
}

}  // namespace

KvCacheManager::KvCacheManager(const plan::CachePlan& plan, int num_spec_tokens,
                               ManagerOptions options)
    : pool_(plan.pools.at(0).num_blocks), num_spec_tokens_(num_spec_tokens), options_(options) {
  if (num_spec_tokens < 0)
    throw_invalid(fmt::format("num_spec_tokens is {}, expected >= 0", num_spec_tokens));
  if (options.snapshot_interval < 0) {
    throw_invalid(fmt::format("snapshot_interval is {}, expected 0 (automatic) or a token count",
                              options.snapshot_interval));
  }
  // A snapshot boundary must be a block boundary of every attention group, or a hit there would
  // not be valid for them (vLLM aligns its Mamba block size with the attention block size alike).
  std::int64_t aligned = 1;
  bool recurrent = false;
  for (const auto& pg : plan.groups) {
    if (is_attention(pg.behaviour)) {
      aligned = std::lcm(aligned, pg.block_size);
      if (options.snapshot_interval > 0 && options.snapshot_interval % pg.block_size != 0) {
        throw_invalid(fmt::format(
            "snapshot_interval {} is not a multiple of group {}'s block size {}; use a multiple "
            "of {}",
            options.snapshot_interval, pg.id, pg.block_size, std::lcm(aligned, pg.block_size)));
      }
    } else {
      recurrent = true;
    }
  }
  has_recurrent_ = recurrent;
  if (recurrent && options.enable_prefix_caching) {
    snapshot_interval_ = options.snapshot_interval > 0 ? options.snapshot_interval
                         : aligned > 1                 ? aligned
                                                       : kDefaultSnapshotInterval;
  }
  std::map<std::int64_t, int> hasher_of_block_size;
  for (const auto& pg : plan.groups) {
    Group g;
    g.id = pg.id;
    g.behaviour = pg.behaviour;
    g.block_size = is_attention(pg.behaviour) ? pg.block_size : snapshot_interval_;
    g.window = pg.window.value_or(pg.chunk.value_or(0));
    std::int64_t data = 0;
    for (const auto& p : pg.placement) data += p.bytes;
    g.padding_per_block = plan.block_unit_bytes - data;
    g.stats.group = pg.id;
    g.stats.behaviour = pg.behaviour;
    if (g.block_size > 0) {
      auto [it, inserted] =
          hasher_of_block_size.emplace(g.block_size, static_cast<int>(hashers_.size()));
      if (inserted)
        hashers_.emplace_back(static_cast<std::int32_t>(g.block_size), options_.hash_seed);
      g.hasher = it->second;
    }
    groups_.push_back(g);
  }
}

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
  r.prompt_len = static_cast<std::int64_t>(prompt.size());
  r.tokens = std::move(prompt);
  r.keys = std::move(keys);
  r.hashes.resize(hashers_.size());
  r.groups.resize(groups_.size());
  r.capacity = capacity_of(r);  // no slots yet (unbounded for a model without attention)
  update_hashes(r);
  std::int32_t slot = 0;
  if (free_slots_.empty()) {
    requests_.push_back(std::move(r));
    slot = static_cast<std::int32_t>(requests_.size() - 1);
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
    requests_[static_cast<std::size_t>(slot)] = std::move(r);
  }
  index_.insert(id.value(), slot);
}

void KvCacheManager::update_hashes(Request& r) {
  if (!options_.enable_prefix_caching) return;
  // Most decode steps fill no block: decide without touching the hash lists.
  const auto num_tokens = static_cast<std::int64_t>(r.tokens.size());
  if (num_tokens < r.hash_at) return;
  r.hash_at = std::numeric_limits<std::int64_t>::max();
  for (std::size_t h = 0; h < hashers_.size(); ++h) {
    auto& hashes = r.hashes[h];
    const std::int64_t block_size = hashers_[h].block_size();
    if (static_cast<std::int64_t>(hashes.size() + 1) * block_size <= num_tokens) {
      reserve_for(hashes, static_cast<std::size_t>(num_tokens / block_size));
      hashers_[h].extend(r.tokens, r.keys, hashes);
    }
    r.hash_at = std::min(r.hash_at, static_cast<std::int64_t>(hashes.size() + 1) * block_size);
  }
}

std::int64_t KvCacheManager::first_needed_token(const Group& g, std::int64_t num_computed) const {
  switch (g.behaviour) {
    case plan::Behaviour::kSliding:
      // The next query, at position num_computed, sees the window - 1 tokens before it.
      return std::max<std::int64_t>(0, num_computed - (g.window - 1));
    case plan::Behaviour::kChunked:
      return num_computed / g.window * g.window;
    default:
      return 0;
  }
}

std::int64_t KvCacheManager::capacity_of(const Request& r) const {
  std::int64_t c = std::numeric_limits<std::int64_t>::max();
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    if (is_attention(g.behaviour))
      c = std::min(c, static_cast<std::int64_t>(r.groups[gi].table.size()) * g.block_size);
  }
  return c;
}

std::int64_t KvCacheManager::next_event_of(const Request& r) const {
  if (has_recurrent_) return 0;
  std::int64_t e = std::numeric_limits<std::int64_t>::max();
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    const GroupState& gs = r.groups[gi];
    if (options_.enable_prefix_caching) e = std::min(e, (gs.num_cached + 1) * g.block_size);
    // The count at which drop_out_of_window finds a block out of the window (chunked: a lower
    // bound, where the check runs and may find nothing yet).
    const std::int64_t next_drop = (gs.window_start + 1) * g.block_size;
    if (g.behaviour == plan::Behaviour::kSliding) e = std::min(e, next_drop + g.window - 1);
    if (g.behaviour == plan::Behaviour::kChunked) e = std::min(e, next_drop);
  }
  return e;
}

void KvCacheManager::throw_over_capacity(const Request& r, std::int64_t computed) const {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    if (is_attention(g.behaviour) &&
        static_cast<std::int64_t>(r.groups[gi].table.size()) * g.block_size < computed) {
      throw_invalid(
          fmt::format("request {}: {} computed tokens exceed the slots allocated in group {}", r.id,
                      computed, g.id));
    }
  }
  throw_internal(fmt::format("request {}: capacity {} is stale", r.id, r.capacity));
}

std::int64_t KvCacheManager::blocks_wanted(const Group& g, std::int64_t tokens,
                                           bool snapshot) const {
  // Live state + checkpoints, and a block for the snapshot only in steps that reach a boundary.
  if (!is_attention(g.behaviour)) return 1 + num_spec_tokens_ + (snapshot ? 1 : 0);
  return ceil_div(tokens, g.block_size);
}

std::int64_t KvCacheManager::extra_blocks(const Group& g, std::size_t held, std::int64_t tokens,
                                          bool snapshot) const {
  const auto h = static_cast<std::int64_t>(held);
  // Multiply before dividing: most decode steps fit in the look-ahead blocks already held.
  if (is_attention(g.behaviour) && h * g.block_size >= tokens) return 0;
  return std::max<std::int64_t>(0, blocks_wanted(g, tokens, snapshot) - h);
}

std::int64_t KvCacheManager::longest_hit(const Group& g, const Request& r,
                                         std::int64_t limit) const {
  if (g.hasher < 0) return 0;  // a recurrent group with prefix caching off
  const auto& hashes = r.hashes[static_cast<std::size_t>(g.hasher)];
  const GroupId group{g.id};
  const std::int64_t max_blocks =
      std::min<std::int64_t>(limit / g.block_size, static_cast<std::int64_t>(hashes.size()));
  auto cached = [&](std::int64_t i) {
    return pool_.peek(hashes[static_cast<std::size_t>(i)], group).has_value();
  };
  if (!is_attention(g.behaviour)) {
    // The latest boundary with a kept state: a snapshot needs nothing before it.
    for (std::int64_t n = max_blocks; n > 0; --n) {
      if (cached(n - 1)) return n * g.block_size;
    }
    return 0;
  }
  if (g.behaviour == plan::Behaviour::kAllTokens) {
    std::int64_t n = 0;
    while (n < max_blocks && cached(n)) ++n;
    return n * g.block_size;
  }
  // Windowed groups: a hit at n blocks needs only the blocks its next query sees.
  for (std::int64_t n = max_blocks; n > 0; --n) {
    const std::int64_t first = first_needed_token(g, n * g.block_size) / g.block_size;
    bool all = true;
    for (std::int64_t i = n - 1; i >= first && all; --i) all = cached(i);
    if (all) return n * g.block_size;
  }
  return 0;
}

std::int64_t KvCacheManager::find_prefix_hit(RequestId id) const {
  if (!options_.enable_prefix_caching) return 0;
  const Request& r = request(id);
  // The last known token is always computed: its logits pick the next token.
  std::int64_t hit = static_cast<std::int64_t>(r.tokens.size()) - 1;
  // Fixed point: each group can only lower the hit; stop when every group accepts it.
  for (bool changed = true; changed && hit > 0;) {
    changed = false;
    for (const auto& g : groups_) {
      const std::int64_t h = longest_hit(g, r, hit);
      if (h < hit) {
        hit = h;
        changed = true;
      }
    }
  }
  return std::max<std::int64_t>(hit, 0);
}

std::optional<std::int64_t> KvCacheManager::admit(RequestId id, int lookahead) {
  Request& r = request(id);
  if (r.num_computed != 0 || !r.groups[0].table.empty()) {
    throw_invalid(fmt::format("request {} is already admitted", id.value()));
  }
  const std::int64_t hit = find_prefix_hit(id);
  const std::int64_t total = static_cast<std::int64_t>(r.tokens.size()) + lookahead;
  // Plan the whole admission first, so a failure changes nothing.
  // The prefill computes the rest of the prompt; its look-ahead covers the first drafts.
  const std::int64_t snapshot_at =
      snapshot_target(hit, static_cast<std::int64_t>(r.tokens.size()) - hit, lookahead);
  std::vector<std::vector<BlockId>> hit_tables(groups_.size());
  std::vector<BlockId> restores(groups_.size());
  std::int64_t needed = 0;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    if (is_attention(g.behaviour)) {
      const auto& hashes = r.hashes[static_cast<std::size_t>(g.hasher)];
      const std::int64_t hit_blocks = hit / g.block_size;
      const std::int64_t first = first_needed_token(g, hit) / g.block_size;
      for (std::int64_t i = 0; i < hit_blocks; ++i) {
        const BlockId b = i < first
                              ? kNullBlock
                              : *pool_.peek(hashes[static_cast<std::size_t>(i)], GroupId{g.id});
        if (!b.is_null() && pool_.is_free(b)) ++needed;  // leaves the free queue when taken
        hit_tables[gi].push_back(b);
      }
      needed += blocks_wanted(g, total, false) - hit_blocks;
    } else {
      if (hit > 0) {
        // The hit is a boundary every group accepted, so this group holds a snapshot there.
        const auto& hashes = r.hashes[static_cast<std::size_t>(g.hasher)];
        restores[gi] =
            *pool_.peek(hashes[static_cast<std::size_t>(hit / g.block_size - 1)], GroupId{g.id});
        if (pool_.is_free(restores[gi])) ++needed;
      }
      needed += blocks_wanted(g, total, snapshot_at > 0);
    }
  }
  if (needed > pool_.num_free()) return std::nullopt;

  // Take every hit block before allocating any: an allocation pops the free queue and would
  // evict a cached block that a later group's hit (or restore) was about to take.
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    GroupState& gs = r.groups[gi];
    gs.table = std::move(hit_tables[gi]);
    pool_.touch(gs.table);
    if (!restores[gi].is_null()) {
      gs.restore = restores[gi];
      pool_.touch(std::span<const BlockId>(&gs.restore, 1));
    }
    if (is_attention(g.behaviour)) gs.num_cached = hit / g.block_size;
    if (g.hasher >= 0) {
      ++g.stats.hit_queries;
      g.stats.hit_tokens += longest_hit(g, r, static_cast<std::int64_t>(r.tokens.size()) - 1);
    }
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& table = r.groups[gi].table;
    const std::int64_t extra = blocks_wanted(groups_[gi], total, snapshot_at > 0) -
                               static_cast<std::int64_t>(table.size());
    if (!pool_.allocate(static_cast<std::int32_t>(extra), table))
      throw_internal("admission lost blocks it counted");
  }
  r.num_computed = hit;
  r.capacity = capacity_of(r);
  r.next_event = 0;  // the prefill's commit checks every group
  r.snapshot_at = snapshot_at;
  return hit;
}

bool KvCacheManager::allocate(RequestId id, std::int64_t num_new, int lookahead) {
  Request& r = request(id);
  if (num_new < 0 || lookahead < 0) throw_invalid("allocate() takes non-negative token counts");
  const std::int64_t total = r.num_computed + num_new + lookahead;
  // Most decode steps fit in the look-ahead slots already held (recurrent tables may lack their
  // snapshot slot, and pick the step's snapshot boundary: they take the loop).
  if (total <= r.capacity && !has_recurrent_) return true;
  return grow(r, num_new, lookahead);
}

bool KvCacheManager::grow(Request& r, std::int64_t num_new, int lookahead) {
  const std::int64_t total = r.num_computed + num_new + lookahead;
  const std::int64_t snapshot_at = snapshot_target(r.num_computed, num_new, lookahead);
  const bool snapshot = snapshot_at > 0;
  std::int64_t needed = 0;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi)
    needed += extra_blocks(groups_[gi], r.groups[gi].table.size(), total, snapshot);
  if (needed > pool_.num_free()) return false;
  r.snapshot_at = snapshot_at;
  if (needed == 0) return true;
  // Reserve every table before taking any block, so nothing below throws halfway.
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& table = r.groups[gi].table;
    const std::int64_t extra = extra_blocks(groups_[gi], table.size(), total, snapshot);
    reserve_for(table, table.size() + static_cast<std::size_t>(extra));
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& table = r.groups[gi].table;
    const std::int64_t extra = extra_blocks(groups_[gi], table.size(), total, snapshot);
    if (extra > 0 && !pool_.allocate(static_cast<std::int32_t>(extra), table)) {
      throw_internal("allocation lost blocks it counted");
    }
  }
  r.capacity = capacity_of(r);
  return true;
}

std::int64_t KvCacheManager::snapshot_target(std::int64_t computed, std::int64_t num_new,
                                             std::int64_t lookahead) const {
  const std::int64_t c = snapshot_interval_;
  if (c == 0) return 0;
  // The latest boundary among the tokens sure to be computed (a prefill may cross several: one
  // snapshot per step keeps the cost at one block), else the first among the drafts, which is
  // kept if they are accepted and asked for again next step if not.
  const std::int64_t last = (computed + num_new) / c * c;
  if (last > computed) return last;
  return last + c <= computed + num_new + lookahead ? last + c : 0;
}

void KvCacheManager::keep_snapshot(const Group& g, GroupState& gs, const Request& r) {
  auto& table = gs.table;
  if (static_cast<std::int64_t>(table.size()) != 2 + num_spec_tokens_) return;
  const auto& hashes = r.hashes[static_cast<std::size_t>(g.hasher)];
  const auto index = static_cast<std::size_t>(r.snapshot_at / g.block_size - 1);
  // Another request may have kept this boundary already (equal contents): then cache_block
  // refuses and the slot simply goes back uncached. Either way the request lets go of it: held by
  // no one, a kept snapshot waits in the free queue's cached tail, evicted in LRU order like any
  // cached block, and the next step that reaches a boundary takes a fresh slot.
  if (index < hashes.size()) pool_.cache_block(table.back(), hashes[index], GroupId{g.id});
  pool_.free(std::span<const BlockId>(&table.back(), 1));
  table.pop_back();
}

void KvCacheManager::drop_out_of_window(const Group& g, GroupState& gs, std::int64_t num_computed) {
  const std::int64_t first_token = first_needed_token(g, num_computed);
  if (first_token < (gs.window_start + 1) * g.block_size) return;  // no block left the window
  auto& table = gs.table;
  const std::int64_t first = first_token / g.block_size;
  for (std::int64_t i = std::min<std::int64_t>(first, static_cast<std::int64_t>(table.size())) - 1;
       i >= 0; --i) {
    BlockId& b = table[static_cast<std::size_t>(i)];
    if (b.is_null()) break;  // everything before is dropped already
    pool_.free(std::span<const BlockId>(&b, 1));
    b = kNullBlock;
  }
  gs.window_start = std::max(gs.window_start, first);
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
  if (r.num_computed + newly_computed > r.capacity)
    throw_over_capacity(r, r.num_computed + newly_computed);
  // A step appends a token or a few: push_back beats insert's call to memmove.
  reserve_for(r.tokens, r.tokens.size() + new_tokens.size());
  for (const TokenId t : new_tokens) r.tokens.push_back(t);
  r.num_computed += newly_computed;
  update_hashes(r);
  if (r.num_computed < r.next_event) return;  // no block filled or left a window
  commit_groups(r, accepted_drafts);
}

void KvCacheManager::commit_groups(Request& r, int accepted_drafts) {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    GroupState& gs = r.groups[gi];
    auto& table = gs.table;
    if (!is_attention(g.behaviour)) {
      // The state after the last accepted draft becomes the live one; the other checkpoints are
      // overwritten by the next step's drafts.
      if (!table.empty()) std::swap(table[0], table[static_cast<std::size_t>(accepted_drafts)]);
      if (r.snapshot_at > 0 && r.snapshot_at <= r.num_computed) keep_snapshot(g, gs, r);
      if (!gs.restore.is_null()) {  // copied into the live state by this step
        pool_.free(std::span<const BlockId>(&gs.restore, 1));
        gs.restore = kNullBlock;
      }
      continue;
    }
    // Multiply before dividing: a decode step fills a block only every few steps.
    if (options_.enable_prefix_caching && (gs.num_cached + 1) * g.block_size <= r.num_computed) {
      const auto& hashes = r.hashes[static_cast<std::size_t>(g.hasher)];
      const std::int64_t full = std::min<std::int64_t>(r.num_computed / g.block_size,
                                                       static_cast<std::int64_t>(hashes.size()));
      for (std::int64_t i = gs.num_cached; i < full; ++i) {
        const BlockId b = table[static_cast<std::size_t>(i)];
        if (!b.is_null()) pool_.cache_block(b, hashes[static_cast<std::size_t>(i)], GroupId{g.id});
      }
      gs.num_cached = std::max(gs.num_cached, full);
    }
    // Full groups keep every block.
    if (g.behaviour != plan::Behaviour::kAllTokens) drop_out_of_window(g, gs, r.num_computed);
  }
  if (snapshot_interval_ > 0) r.snapshot_at = 0;  // the next allocate() picks the next boundary
  r.next_event = next_event_of(r);
}

void KvCacheManager::free(RequestId id) {
  const std::int32_t slot = index_.find(id.value());
  if (slot < 0) throw_invalid(fmt::format("no request {}", id.value()));
  Request& r = requests_[static_cast<std::size_t>(slot)];
  for (const auto& gs : r.groups) {
    pool_.free(gs.table);
    pool_.free(std::span<const BlockId>(&gs.restore, 1));  // the null block is skipped
  }
  r = Request{};  // releases its memory; the slot is reused by a later request
  index_.erase(id.value());
  free_slots_.push_back(slot);
}

std::int64_t KvCacheManager::num_computed(RequestId id) const { return request(id).num_computed; }

std::span<const BlockId> KvCacheManager::block_table(RequestId id, int group) const {
  return request(id).groups.at(static_cast<std::size_t>(group)).table;
}

RecurrentStep KvCacheManager::recurrent_step(RequestId id, int group) const {
  const Request& r = request(id);
  if (group < 0 || static_cast<std::size_t>(group) >= groups_.size() ||
      is_attention(groups_[static_cast<std::size_t>(group)].behaviour)) {
    throw_invalid(fmt::format("group {} is not a recurrent KV-cache group", group));
  }
  const GroupState& gs = r.groups[static_cast<std::size_t>(group)];
  RecurrentStep step;
  step.restore_from = gs.restore;
  if (r.snapshot_at > 0 && static_cast<std::int64_t>(gs.table.size()) == 2 + num_spec_tokens_) {
    step.snapshot_at = r.snapshot_at;
    step.snapshot = gs.table.back();
  }
  return step;
}

std::vector<GroupStats> KvCacheManager::stats() const {
  std::vector<GroupStats> out;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    GroupStats s = groups_[gi].stats;
    for (const auto& r : requests_) {
      if (!r.live) continue;
      for (BlockId b : r.groups[gi].table) s.blocks_held += b.is_null() ? 0 : 1;
      s.blocks_held += r.groups[gi].restore.is_null() ? 0 : 1;
    }
    s.padding_bytes = s.blocks_held * groups_[gi].padding_per_block;
    s.evictions = pool_.evictions(GroupId{groups_[gi].id});
    out.push_back(s);
  }
  return out;
}

std::string KvCacheManager::check_invariants() const {
  if (auto pool = pool_.check_invariants(); !pool.empty()) return "pool: " + pool;
  std::vector<std::int32_t> refs(static_cast<std::size_t>(pool_.num_blocks()), 0);
  std::size_t live = 0;
  for (std::size_t slot = 0; slot < requests_.size(); ++slot) {
    const Request& r = requests_[slot];
    if (!r.live) continue;
    ++live;
    const std::int64_t id = r.id;
    if (index_.find(id) != static_cast<std::int32_t>(slot))
      return fmt::format("request {} in slot {} is indexed at slot {}", id, slot, index_.find(id));
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
      const Group& g = groups_[gi];
      const auto& table = r.groups[gi].table;
      for (BlockId b : table) ++refs[static_cast<std::size_t>(b.value())];
      const BlockId restore = r.groups[gi].restore;
      ++refs[static_cast<std::size_t>(restore.value())];
      if (!is_attention(g.behaviour)) {
        // Live state + checkpoints, plus the snapshot slot between the step that reached a
        // boundary and the commit that verified it.
        const auto states = static_cast<std::int64_t>(table.size());
        const std::int64_t plain = blocks_wanted(g, 0, false);
        if (!table.empty() && states != plain && !(snapshot_interval_ > 0 && states == plain + 1)) {
          return fmt::format("request {} group {}: {} state blocks, expected {}", id, g.id,
                             table.size(), plain);
        }
        // States the runner writes to are never shared; the restored one is a kept snapshot.
        for (BlockId b : table) {
          if (pool_.cached_hash(b).has_value())
            return fmt::format("request {} group {}: state block {} is cached", id, g.id,
                               b.value());
        }
        if (!restore.is_null() && pool_.cached_group(restore) != GroupId{g.id}) {
          return fmt::format("request {} group {}: restores from block {}, not a kept snapshot", id,
                             g.id, restore.value());
        }
        continue;
      }
      if (!restore.is_null())
        return fmt::format("request {} group {}: an attention group restores a state", id, g.id);
      if (!table.empty() &&
          static_cast<std::int64_t>(table.size()) * g.block_size < r.num_computed) {
        return fmt::format("request {} group {}: {} computed tokens in {} blocks", id, g.id,
                           r.num_computed, table.size());
      }
      // Windowed groups never drop a block their next query sees.
      const std::int64_t first = first_needed_token(g, r.num_computed) / g.block_size;
      for (std::size_t i = static_cast<std::size_t>(first); i < table.size(); ++i) {
        if (table[i].is_null())
          return fmt::format("request {} group {}: in-window block {} dropped", id, g.id, i);
      }
      // Nothing is cached beyond the verified, computed tokens.
      for (std::size_t i = static_cast<std::size_t>(r.num_computed / g.block_size);
           i < table.size(); ++i) {
        if (!table[i].is_null() && pool_.cached_hash(table[i]).has_value()) {
          return fmt::format("request {} group {}: block {} cached beyond its {} verified tokens",
                             id, g.id, i, r.num_computed);
        }
      }
    }
  }
  for (const Request& r : requests_) {
    if (!r.live || r.groups.empty() || r.groups[0].table.empty()) continue;
    if (r.capacity != capacity_of(r)) {
      return fmt::format("request {}: capacity {}, its tables hold {}", r.id, r.capacity,
                         capacity_of(r));
    }
    if (r.next_event > next_event_of(r)) {
      return fmt::format("request {}: next event at {} tokens, after the true {}", r.id,
                         r.next_event, next_event_of(r));
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
