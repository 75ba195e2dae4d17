#include "recurrent_state_manager.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

RecurrentStateManager::RecurrentStateManager(const GroupSetup& setup)
    : GroupManagerBase(setup, plan::Behaviour::kRecurrent) {
  block_size_ = 0;  // the plan's block size is a whole request; hits use the snapshot interval
}

void RecurrentStateManager::release(RequestSlot slot, BlockPool& pool) {
  Slot& s = at(slot);
  pool.free(s.table);
  pool.free(std::span<const BlockId>(&s.restore, 1));  // the null block is skipped
  s = Slot{};
}

std::int64_t RecurrentStateManager::find_longest_cache_hit(std::span<const BlockHash> hashes,
                                                           const BlockPool& pool,
                                                           std::int64_t limit) const {
  if (block_size_ == 0) return 0;  // prefix caching off
  const std::int64_t max_blocks =
      std::min<std::int64_t>(limit / block_size_, static_cast<std::int64_t>(hashes.size()));
  for (std::int64_t n = max_blocks; n > 0; --n) {
    if (pool.peek(hashes[static_cast<std::size_t>(n - 1)], id_).has_value()) return n * block_size_;
  }
  return 0;
}

std::int64_t RecurrentStateManager::stage_hit(RequestSlot slot, std::span<const BlockHash> hashes,
                                              const BlockPool& pool, std::int64_t hit) {
  if (hit == 0) return 0;
  const auto kept = pool.peek(hashes[static_cast<std::size_t>(hit / block_size_ - 1)], id_);
  if (!kept) {
    throw_internal(fmt::format("group {}: no snapshot kept at the {}-token hit", id_.value(), hit));
  }
  at(slot).restore = *kept;
  return pool.is_free(*kept) ? 1 : 0;  // leaves the free queue when taken
}

void RecurrentStateManager::take_hit(RequestSlot slot, BlockPool& pool, std::int64_t /*hit*/) {
  const Slot& s = at(slot);
  pool.touch(std::span<const BlockId>(&s.restore, 1));  // the null block is skipped
}

void RecurrentStateManager::keep_snapshot(Slot& s, std::int64_t snapshot_at,
                                          std::span<const BlockHash> hashes, BlockPool& pool) {
  auto& table = s.table;
  if (static_cast<std::int64_t>(table.size()) != states_wanted(true)) return;
  const auto index = static_cast<std::size_t>(snapshot_at / block_size_ - 1);
  // Another request may have kept this boundary already (equal contents): then cache_block
  // refuses and the slot simply goes back uncached. Either way the request lets go of it: held by
  // no one, a kept snapshot waits in the free queue's cached tail, evicted in LRU order like any
  // cached block, and the next step that reaches a boundary takes a fresh slot.
  if (index < hashes.size()) pool.cache_block(table.back(), hashes[index], id_);
  pool.free(std::span<const BlockId>(&table.back(), 1));
  table.pop_back();
}

void RecurrentStateManager::release_restore(Slot& s, BlockPool& pool) {
  pool.free(std::span<const BlockId>(&s.restore, 1));
  s.restore = kNullBlock;
}

std::optional<RecurrentStep> RecurrentStateManager::recurrent_step(const SequenceView& seq) const {
  const Slot& s = at(seq.slot);
  RecurrentStep step;
  step.restore_from = s.restore;
  if (seq.snapshot_at > 0 && static_cast<std::int64_t>(s.table.size()) == states_wanted(true)) {
    step.snapshot_at = seq.snapshot_at;
    step.snapshot = s.table.back();
  }
  return step;
}

std::string RecurrentStateManager::check(const SequenceView& seq, const BlockPool& pool,
                                         std::vector<std::int32_t>& refs) const {
  const Slot& s = at(seq.slot);
  const auto& table = s.table;
  for (BlockId b : table) ++refs[static_cast<std::size_t>(b.value())];
  ++refs[static_cast<std::size_t>(s.restore.value())];
  // Live state + checkpoints, plus the snapshot slot between the step that reached a boundary
  // and the commit that verified it.
  const auto states = static_cast<std::int64_t>(table.size());
  const std::int64_t plain = states_wanted(false);
  if (!table.empty() && states != plain && !(block_size_ > 0 && states == plain + 1)) {
    return fmt::format("request {} group {}: {} state blocks, expected {}", seq.id, id_.value(),
                       table.size(), plain);
  }
  // States the runner writes to are never shared; the restored one is a kept snapshot.
  for (BlockId b : table) {
    if (pool.cached_hash(b).has_value()) {
      return fmt::format("request {} group {}: state block {} is cached", seq.id, id_.value(),
                         b.value());
    }
  }
  if (!s.restore.is_null() && pool.cached_group(s.restore) != id_) {
    return fmt::format("request {} group {}: restores from block {}, not a kept snapshot", seq.id,
                       id_.value(), s.restore.value());
  }
  return "";
}

GroupStats RecurrentStateManager::stats(const BlockPool& pool) const {
  std::int64_t held = 0;
  for (const Slot& s : slots_) {
    for (BlockId b : s.table) held += b.is_null() ? 0 : 1;
    held += s.restore.is_null() ? 0 : 1;
  }
  return stats_holding(held, pool);
}

}  // namespace mixkv::cache
