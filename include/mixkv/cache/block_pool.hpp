// The run-time block pool of one id space: hands out blocks all or nothing, counts references,
// keeps free blocks in eviction order and indexes full blocks by (chained hash, group) so a later
// request can reuse them. docs/cache.md gives the block state machine and the invariants.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mixkv/cache/block_hash.hpp"

namespace mixkv::cache {

// A manager block of one pool. Explicit, so a token index, kernel page or group id can never be
// passed where a block is expected. The default value is the null block.
class BlockId {
 public:
  constexpr BlockId() = default;
  constexpr explicit BlockId(std::int32_t value) : value_(value) {}

  constexpr std::int32_t value() const { return value_; }
  constexpr bool is_null() const { return value_ == 0; }

  friend constexpr auto operator<=>(const BlockId&, const BlockId&) = default;

 private:
  std::int32_t value_ = 0;
};

// Block 0: stands in a block table for a block the request does not hold (a sliding window's
// skipped blocks, recurrent layers' past states). Never handed out, never freed, never cached.
inline constexpr BlockId kNullBlock{0};

// A KV-cache group: part of the prefix-map key, since equal tokens in two groups are two entries.
class GroupId {
 public:
  constexpr GroupId() = default;
  constexpr explicit GroupId(std::int32_t value) : value_(value) {}

  constexpr std::int32_t value() const { return value_; }

  friend constexpr auto operator<=>(const GroupId&, const GroupId&) = default;

 private:
  std::int32_t value_ = 0;
};

struct BlockPoolCounters {
  std::int64_t queries = 0;    // prefix-map lookups
  std::int64_t hits = 0;       // lookups that found a block
  std::int64_t evictions = 0;  // cached blocks whose entry was dropped because they were reused

  bool operator==(const BlockPoolCounters&) const = default;
};

class BlockPool {
 public:
  // `num_blocks` counts the null block, so num_blocks - 1 blocks can be handed out.
  // Throws kInvalidInput unless 1 <= num_blocks < 2^31 - 1.
  explicit BlockPool(std::int64_t num_blocks);

  std::int32_t num_blocks() const { return num_blocks_; }
  // Blocks that can be handed out, cached or not. num_free() + num_used() == num_blocks() - 1.
  std::int32_t num_free() const { return num_free_; }
  std::int32_t num_used() const { return num_blocks_ - 1 - num_free_; }
  // Share of the usable blocks that are referenced, in [0, 1].
  double usage() const;
  const BlockPoolCounters& counters() const { return counters_; }
  // Evictions of blocks that were cached under `group` (counters().evictions summed by group).
  std::int64_t evictions(GroupId group) const;

  // Appends `count` blocks, each with one reference, to `out`. The blocks come from the head of the
  // free queue; a cached one loses its prefix-map entry (lazy eviction). With fewer than `count`
  // free blocks, returns false and changes nothing, `out` included.
  [[nodiscard]] bool allocate(std::int32_t count, std::vector<BlockId>& out);

  // Drops one reference from each block of `table`, given in the request's order (prefix first).
  // It is walked tail first: blocks reaching zero references that are cached join the tail of the
  // queue, so a request's prefix, shared most often, is evicted last; uncached ones join the head,
  // since nothing can reuse them. Null blocks are skipped. Throws kInternal for a block that is
  // already free (a double free).
  void free(std::span<const BlockId> table);

  // Adds one reference to each block (a prefix hit); a free block leaves the queue, keeping its
  // entry. Null blocks are skipped. Callers check capacity first: touching free blocks lowers
  // num_free().
  void touch(std::span<const BlockId> blocks);

  // Makes `block`, which must be referenced and full, the entry for (hash, group). Returns false,
  // leaving the block uncached, when another block already holds that entry: the two have the
  // same contents, and keeping the first keeps every block table append-only. Throws kInternal for
  // the null block, a free block, or a block cached under a different key.
  bool cache_block(BlockId block, const BlockHash& hash, GroupId group);

  // The block holding (hash, group), free or not. Counts a query, and a hit when found.
  std::optional<BlockId> lookup(const BlockHash& hash, GroupId group);
  // Like lookup(), without counting a query: for planning a hit before taking it.
  std::optional<BlockId> peek(const BlockHash& hash, GroupId group) const;

  // Inspection, for tests and debugging. Throw kInternal for an id outside the pool.
  std::int32_t ref_count(BlockId block) const;
  bool is_free(BlockId block) const;
  std::optional<BlockHash> cached_hash(BlockId block) const;
  std::optional<GroupId> cached_group(BlockId block) const;
  // The free queue, head (evicted next) first.
  std::vector<BlockId> free_queue() const;

  // Walks every structure and returns a description of the first broken invariant, or "" when all
  // hold: free + used == total; a block has zero references iff it is in the queue (the null block
  // aside); the queue holds uncached blocks before cached ones; every prefix-map entry is a cached
  // block filed under its own (hash, group), no key twice. O(num_blocks): tests only.
  std::string check_invariants() const;

  // Bytes of state per block: the block record plus its share of the prefix-map buckets.
  static constexpr std::size_t kRecordBytes = 32;
  double metadata_bytes_per_block() const;

 private:
  static constexpr std::int32_t kUncached = -1;    // Record::group of a block with no entry
  static constexpr std::int32_t kEnd = -1;         // end of a bucket chain
  static constexpr std::int32_t kReferenced = -1;  // Record::next of a block out of the queue

  // One block's state, 32 bytes so that touching a block touches one cache line. A block is either
  // in the free queue or referenced, never both, so `prev_or_refs` holds its queue predecessor
  // while free and its reference count while referenced; `next == kReferenced` tells which.
  struct alignas(32) Record {
    BlockHash hash;  // meaningful iff group != kUncached
    std::int32_t group = kUncached;
    std::int32_t chain = kEnd;  // next block in the same prefix-map bucket
    std::int32_t prev_or_refs = 0;
    std::int32_t next = kReferenced;
  };
  static_assert(sizeof(Record) == kRecordBytes);

  std::int32_t checked(BlockId block) const;
  std::size_t bucket_of(const BlockHash& hash, std::int32_t group) const;
  std::int32_t find(const BlockHash& hash, std::int32_t group) const;
  void unlink_from_queue(std::int32_t b);
  void push_head(std::int32_t b);
  void push_tail(std::int32_t b);
  void drop_entry(std::int32_t b);

  std::int32_t num_blocks_;
  std::int32_t sentinel_;  // index of the queue's sentinel record, one past the last block
  std::int32_t num_free_ = 0;
  std::vector<Record> records_;        // num_blocks + 1: the last is the queue sentinel
  std::vector<std::int32_t> buckets_;  // prefix map: head of each chain, power-of-two count
  std::size_t bucket_mask_ = 0;
  BlockPoolCounters counters_;
  std::vector<std::int64_t> evictions_by_group_;  // index: group id; grown on first eviction
};

}  // namespace mixkv::cache

template <>
struct std::hash<mixkv::cache::BlockId> {
  std::size_t operator()(mixkv::cache::BlockId id) const noexcept {
    return std::hash<std::int32_t>{}(id.value());
  }
};
