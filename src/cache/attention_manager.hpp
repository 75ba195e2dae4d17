// What the attention kinds (full, sliding window, chunked local) share: a table of one block per
// `block_size` tokens for each request, full verified blocks cached as they fill, and hit blocks
// taken from the prefix map. Each kind adds the first token its next query sees
// (first_needed_token), from which follow its longest hit, the hit blocks it leaves null and the
// blocks it drops as the request advances.
//
//   table:  [ null | null | b2 | b3 | b4 | b5 | b6 ]     block_size tokens each
//             dropped (out of  ^window_start  ^num_cached: b2..b4 cached, b5.. not yet verified
//             the window)                      or not yet full
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mixkv/core/checked_math.hpp"
#include "single_type_manager.hpp"

namespace mixkv::cache {

class AttentionManager : public GroupManagerBase {
 public:
  std::int64_t hit_alignment() const { return block_size_; }
  // The coordinator checked that the interval is a multiple of block_size().
  void set_snapshot_interval(std::int64_t) {}
  bool commits_every_step() const { return false; }

  void open(RequestSlot slot) { open_slot(slots_, slot); }
  void release(RequestSlot slot, BlockPool& pool);
  std::span<const BlockId> table(RequestSlot slot) const { return at(slot).table; }
  std::int64_t capacity(RequestSlot slot) const {
    return static_cast<std::int64_t>(at(slot).table.size()) * block_size_;
  }

  void unstage_hit(RequestSlot slot) { at(slot).table.clear(); }
  void take_hit(RequestSlot slot, BlockPool& pool, std::int64_t hit);
  std::int64_t extra_blocks(RequestSlot slot, std::int64_t tokens, bool /*snapshot*/) const {
    const auto held = static_cast<std::int64_t>(at(slot).table.size());
    // Multiply before dividing: most decode steps fit in the look-ahead blocks already held.
    if (held * block_size_ >= tokens) return 0;
    return std::max<std::int64_t>(0, ceil_div(tokens, block_size_) - held);
  }
  void reserve(RequestSlot slot, std::int64_t extra) {
    auto& table = at(slot).table;
    reserve_for(table, table.size() + static_cast<std::size_t>(extra));
  }
  void append(RequestSlot slot, std::int64_t extra, BlockPool& pool) {
    if (!pool.allocate(static_cast<std::int32_t>(extra), at(slot).table)) throw_lost_blocks();
  }

  std::optional<RecurrentStep> recurrent_step(const SequenceView&) const { return std::nullopt; }
  GroupStats stats(const BlockPool& pool) const;

 protected:
  // One request's table. Kept on one line, so a step touches one line per group.
  struct Slot {
    std::vector<BlockId> table;
    std::int64_t num_cached = 0;  // leading blocks in the prefix map (or null)
    // Windowed kinds: every block before this index is null, so a step whose window starts in the
    // same block skips the drop (and the cold front of the table) entirely. 0 for full attention.
    std::int64_t window_start = 0;
  };

  AttentionManager(const GroupSetup& setup, plan::Behaviour behaviour);

  Slot& at(RequestSlot slot) { return slots_[slot.index()]; }
  const Slot& at(RequestSlot slot) const { return slots_[slot.index()]; }
  bool cached(std::span<const BlockHash> hashes, const BlockPool& pool, std::int64_t i) const {
    return pool.peek(hashes[static_cast<std::size_t>(i)], id_).has_value();
  }

  // The hit of `hit` tokens, with null blocks before `first_block` (outside the next query's
  // window): the blocks that would leave the free queue.
  std::int64_t stage_hit_from(RequestSlot slot, std::span<const BlockHash> hashes,
                              const BlockPool& pool, std::int64_t hit, std::int64_t first_block);
  // Caches the full blocks among the first `num_computed` tokens that are not cached yet.
  void cache_full_blocks(Slot& s, std::int64_t num_computed, HashLists lists, BlockPool& pool) {
    // Multiply before dividing: a decode step fills a block only every few steps.
    if (prefix_caching_ && (s.num_cached + 1) * block_size_ <= num_computed) {
      cache_blocks(s, num_computed, hashes_in(lists), pool);
    }
  }
  // The computed count at which cache_full_blocks() has a block to cache.
  std::int64_t next_cache_event(const Slot& s) const {
    return prefix_caching_ ? (s.num_cached + 1) * block_size_
                           : std::numeric_limits<std::int64_t>::max();
  }

  // Frees the blocks that hold only tokens before `first_token` and nulls them in the table.
  void drop_blocks_before(Slot& s, std::int64_t first_token, BlockPool& pool) {
    if (first_token >= (s.window_start + 1) * block_size_) drop_blocks(s, first_token, pool);
  }

  // The checks every attention kind shares, with its own first needed block.
  std::string check_table(const SequenceView& seq, const BlockPool& pool,
                          std::vector<std::int32_t>& refs, std::int64_t first_needed_block) const;

  std::vector<Slot> slots_;  // per request slot

 private:
  // The out-of-line parts, for the steps whose thresholds say there is work.
  void cache_blocks(Slot& s, std::int64_t num_computed, std::span<const BlockHash> hashes,
                    BlockPool& pool);
  void drop_blocks(Slot& s, std::int64_t first_token, BlockPool& pool);
};

// The windowed kinds (sliding window, chunked local) differ only in the first token their next
// query sees, Kind::first_needed_token(num_computed), and in when a block can first leave
// (Kind::next_event); the rest follows from it here.
template <class Kind>
class WindowedAttentionManager : public AttentionManager {
 public:
  // The largest block boundary n (at most `limit` tokens) whose blocks from the window of a query
  // at n on are all cached: the blocks before the window are not needed.
  std::int64_t find_longest_cache_hit(std::span<const BlockHash> hashes, const BlockPool& pool,
                                      std::int64_t limit) const {
    const std::int64_t max_blocks =
        std::min<std::int64_t>(limit / block_size_, static_cast<std::int64_t>(hashes.size()));
    for (std::int64_t n = max_blocks; n > 0; --n) {
      const std::int64_t first = kind().first_needed_token(n * block_size_) / block_size_;
      bool all = true;
      for (std::int64_t i = n - 1; i >= first && all; --i) all = cached(hashes, pool, i);
      if (all) return n * block_size_;
    }
    return 0;
  }
  // Hit blocks before the window stay null: the request never holds them.
  std::int64_t stage_hit(RequestSlot slot, std::span<const BlockHash> hashes, const BlockPool& pool,
                         std::int64_t hit) {
    return stage_hit_from(slot, hashes, pool, hit, kind().first_needed_token(hit) / block_size_);
  }
  void commit(const SequenceView& seq, HashLists lists, int /*accepted*/, BlockPool& pool) {
    Slot& s = at(seq.slot);
    cache_full_blocks(s, seq.num_computed, lists, pool);
    remove_skipped_blocks(s, seq.num_computed, pool);
  }
  std::string check(const SequenceView& seq, const BlockPool& pool,
                    std::vector<std::int32_t>& refs) const {
    return check_table(seq, pool, refs, kind().first_needed_token(seq.num_computed) / block_size_);
  }

 protected:
  using AttentionManager::AttentionManager;

 private:
  const Kind& kind() const { return static_cast<const Kind&>(*this); }
  // Frees the blocks that hold only tokens before the next query's window (they stay cached, so
  // other requests can still hit them) and nulls them in the table.
  void remove_skipped_blocks(Slot& s, std::int64_t num_computed, BlockPool& pool) {
    drop_blocks_before(s, kind().first_needed_token(num_computed), pool);
  }
};

}  // namespace mixkv::cache
