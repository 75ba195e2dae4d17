// What every per-kind manager of one KV-cache group provides (vLLM's single-type managers): the
// group's block table for each request, its own longest prefix hit, what it allocates, caches,
// skips and checks each step. The coordinator drives one per group through this interface; each
// kind's rules live in its own file and nowhere else.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mixkv/cache/block_pool.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::cache {

// Grows `v` geometrically to hold `n`. BlockPool::allocate and BlockHasher::extend reserve exactly
// what they append, which alone would copy a table or hash list every time a block is added.
// Always inline: commit() calls it for the tokens on every step, and the check is all it costs.
template <class T>
[[gnu::always_inline]] inline void reserve_for(std::vector<T>& v, std::size_t n) {
  if (v.capacity() < n) v.reserve(std::max(n, 2 * v.capacity()));
}

// A request's hash lists, one per distinct block size; each group reads the one of its size.
using HashLists = std::span<const std::vector<BlockHash>>;

// One request as a group's manager reads it during a call.
struct SequenceView {
  RequestSlot slot;
  std::int64_t id = 0;            // the caller's RequestId, for error messages
  std::int64_t num_computed = 0;  // tokens whose KV is computed and verified
  std::int64_t snapshot_at = 0;   // RecurrentStep::snapshot_at of the step in flight, or 0
};

// What a group's manager is built from: the plan's group and the manager's options.
struct GroupSetup {
  GroupId id;
  std::int64_t block_size = 0;         // tokens per block (a recurrent group: its plan's value)
  std::optional<std::int64_t> window;  // a sliding group's window
  std::optional<std::int64_t> chunk;   // a chunked group's chunk
  std::int64_t padding_per_block = 0;  // bytes of a block that hold no data
  int num_spec_tokens = 0;
  bool prefix_caching = true;
};
GroupSetup group_setup(const plan::CachePlan& plan, const plan::KvCacheGroup& group,
                       int num_spec_tokens, bool prefix_caching);

// The state every kind shares: who it is, its hash granularity and its counters.
class GroupManagerBase {
 public:
  GroupId group() const { return id_; }
  // Tokens per hashed block: the granularity of this group's hits; 0 when it takes none.
  std::int64_t block_size() const { return block_size_; }
  // Which of a request's hash lists is this group's (-1: none, the group takes no hits).
  int hasher() const { return hasher_; }
  void set_hasher(int hasher) { hasher_ = hasher; }
  std::span<const BlockHash> hashes_in(HashLists lists) const {
    return hasher_ < 0 ? std::span<const BlockHash>{} : lists[static_cast<std::size_t>(hasher_)];
  }
  // An admission looked for a prefix in this group and found `hit_tokens` cached.
  void count_hit_query(std::int64_t hit_tokens) {
    ++stats_.hit_queries;
    stats_.hit_tokens += hit_tokens;
  }

 protected:
  GroupManagerBase(const GroupSetup& setup, plan::Behaviour behaviour);
  GroupStats stats_holding(std::int64_t blocks_held, const BlockPool& pool) const;
  // append() found fewer free blocks than the caller counted.
  [[noreturn]] static void throw_lost_blocks();
  // Dense per-request storage, indexed by slot like the manager's requests.
  template <class Slot>
  static void open_slot(std::vector<Slot>& slots, RequestSlot slot) {
    if (slot.index() >= slots.size()) slots.resize(slot.index() + 1);
    slots[slot.index()] = Slot{};
  }

  GroupId id_;
  std::int64_t block_size_ = 0;
  std::int64_t padding_per_block_ = 0;
  int num_spec_tokens_ = 0;
  bool prefix_caching_ = true;
  int hasher_ = -1;
  GroupStats stats_;  // hit queries and hit tokens; the rest is counted when asked
};

// The interface, checked at compile time: the coordinator holds one of the kinds per group in a
// std::variant and dispatches once per call, so the kinds' small members inline into its loops.
template <class M>
concept SingleTypeManager = requires(M& m, const M& c, RequestSlot slot, const SequenceView& seq,
                                     std::span<const BlockHash> hashes, HashLists lists,
                                     BlockPool& pool, const BlockPool& cpool, std::int64_t n,
                                     bool snapshot, int accepted, std::vector<std::int32_t>& refs) {
  { c.group() } -> std::same_as<GroupId>;
  { c.block_size() } -> std::same_as<std::int64_t>;
  // Tokens every prefix hit must be a multiple of for this group, fixed by the plan; 0 for a kind
  // that takes the snapshot interval the coordinator derives from the others.
  { c.hit_alignment() } -> std::same_as<std::int64_t>;
  m.set_snapshot_interval(n);
  // True when commit() has work every step, whatever next_event() says.
  { c.commits_every_step() } -> std::same_as<bool>;
  // A request's slot: opened empty on arrival, released (every block back to the pool) on free.
  m.open(slot);
  m.release(slot, pool);
  { c.table(slot) } -> std::same_as<std::span<const BlockId>>;
  // Tokens the table has slots for (the largest int64 for a kind not bounded by tokens).
  { c.capacity(slot) } -> std::same_as<std::int64_t>;
  // Computed-token count at or after which commit() has work for this request.
  { c.next_event(slot) } -> std::same_as<std::int64_t>;
  // The longest prefix of at most `n` tokens this group can serve from the cache. Pure.
  { c.find_longest_cache_hit(hashes, cpool, n) } -> std::same_as<std::int64_t>;
  // Admission, in three phases over all groups so that it is all or nothing: stage_hit() writes
  // the hit of `n` tokens into the empty slot without taking it and returns how many of its
  // blocks would leave the free queue; then either unstage_hit() (nothing fits: the slot is empty
  // again) or take_hit(), followed by append() of extra_blocks() once every group took its hit.
  { m.stage_hit(slot, hashes, cpool, n) } -> std::same_as<std::int64_t>;
  m.unstage_hit(slot);
  m.take_hit(slot, pool, n);
  // Blocks to add so the table serves `n` tokens (`snapshot`: the step reaches a snapshot
  // boundary).
  { c.extra_blocks(slot, n, snapshot) } -> std::same_as<std::int64_t>;
  m.reserve(slot, n);       // may throw (memory) before anything is taken
  m.append(slot, n, pool);  // takes `n` blocks the caller counted as free
  // The step is verified: cache what became full, drop what left the window, swap states. Takes
  // every list and reads its own only when it has a block to cache.
  m.commit(seq, lists, accepted, pool);
  { c.recurrent_step(seq) } -> std::same_as<std::optional<RecurrentStep>>;
  // Counts every block the slot holds into `refs`, and returns what broke ("" when nothing).
  { c.check(seq, cpool, refs) } -> std::same_as<std::string>;
  { c.stats(cpool) } -> std::same_as<GroupStats>;
};

}  // namespace mixkv::cache
