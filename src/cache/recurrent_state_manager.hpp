// Recurrent groups (Gated DeltaNet, KDA, Mamba2 and other state-space layers): a request holds one
// live state, one checkpoint per speculative token, and while a step that reaches a snapshot
// boundary is in flight, one snapshot block. Prefix hits restore a kept snapshot: every
// snapshot_interval tokens the state is cached under the chained hash of the tokens before it.
//
//   table:  [ live | checkpoint 1 .. checkpoint K | snapshot ]   restore: a kept snapshot, held
//             the state after the last verified token   ^ only while a   from a hit until the
//                                                         boundary is pending   first commit
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "single_type_manager.hpp"

namespace mixkv::cache {

class RecurrentStateManager final : public GroupManagerBase {
 public:
  explicit RecurrentStateManager(const GroupSetup& setup);

  // Hits come at snapshot boundaries, which the coordinator aligns with the attention groups.
  std::int64_t hit_alignment() const { return 0; }
  // 0: no snapshots (prefix caching off), so no hits either.
  void set_snapshot_interval(std::int64_t interval) { block_size_ = interval; }
  // Every verified step moves the live state to the accepted checkpoint.
  bool commits_every_step() const { return true; }

  void open(RequestSlot slot) { open_slot(slots_, slot); }
  void release(RequestSlot slot, BlockPool& pool);
  std::span<const BlockId> table(RequestSlot slot) const { return at(slot).table; }
  // A state holds any number of tokens.
  std::int64_t capacity(RequestSlot) const { return std::numeric_limits<std::int64_t>::max(); }
  std::int64_t next_event(RequestSlot) const { return 0; }

  // The latest snapshot boundary (at most `limit` tokens) with a kept state: a snapshot needs
  // nothing before it.
  std::int64_t find_longest_cache_hit(std::span<const BlockHash> hashes, const BlockPool& pool,
                                      std::int64_t limit) const;
  // The hit is a boundary every group accepted, so this group kept a snapshot there.
  std::int64_t stage_hit(RequestSlot slot, std::span<const BlockHash> hashes, const BlockPool& pool,
                         std::int64_t hit);
  void unstage_hit(RequestSlot slot) { at(slot).restore = kNullBlock; }
  void take_hit(RequestSlot slot, BlockPool& pool, std::int64_t hit);
  // Live state + checkpoints, and a block for the snapshot only in steps that reach a boundary.
  std::int64_t extra_blocks(RequestSlot slot, std::int64_t /*tokens*/, bool snapshot) const {
    return std::max<std::int64_t>(
        0, states_wanted(snapshot) - static_cast<std::int64_t>(at(slot).table.size()));
  }
  void reserve(RequestSlot slot, std::int64_t extra) {
    auto& table = at(slot).table;
    reserve_for(table, table.size() + static_cast<std::size_t>(extra));
  }
  void append(RequestSlot slot, std::int64_t extra, BlockPool& pool) {
    if (!pool.allocate(static_cast<std::int32_t>(extra), at(slot).table)) throw_lost_blocks();
  }
  // Inline: a recurrent group commits every step.
  void commit(const SequenceView& seq, HashLists lists, int accepted, BlockPool& pool) {
    Slot& s = at(seq.slot);
    // The state after the last accepted draft becomes the live one; the other checkpoints are
    // overwritten by the next step's drafts.
    if (!s.table.empty()) std::swap(s.table[0], s.table[static_cast<std::size_t>(accepted)]);
    if (seq.snapshot_at > 0 && seq.snapshot_at <= seq.num_computed) {
      keep_snapshot(s, seq.snapshot_at, hashes_in(lists), pool);
    }
    if (!s.restore.is_null()) release_restore(s, pool);  // copied into the live state by now
  }
  std::optional<RecurrentStep> recurrent_step(const SequenceView& seq) const;
  std::string check(const SequenceView& seq, const BlockPool& pool,
                    std::vector<std::int32_t>& refs) const;
  GroupStats stats(const BlockPool& pool) const;

 private:
  struct Slot {
    std::vector<BlockId> table;
    // The cached snapshot a hit restores from, held until the first commit has copied it.
    BlockId restore;
  };
  Slot& at(RequestSlot slot) { return slots_[slot.index()]; }
  const Slot& at(RequestSlot slot) const { return slots_[slot.index()]; }
  std::int64_t states_wanted(bool snapshot) const {
    return 1 + num_spec_tokens_ + (snapshot ? 1 : 0);
  }
  // The snapshot block holds the state after `snapshot_at` verified tokens: cache it and let go.
  void keep_snapshot(Slot& s, std::int64_t snapshot_at, std::span<const BlockHash> hashes,
                     BlockPool& pool);

  void release_restore(Slot& s, BlockPool& pool);

  std::vector<Slot> slots_;  // per request slot
};
static_assert(SingleTypeManager<RecurrentStateManager>);

}  // namespace mixkv::cache
