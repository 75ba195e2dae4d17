// The block pool: all-or-nothing allocation, reference counts, eviction order, lazy eviction of
// cached blocks and the prefix map.
#include <gtest/gtest.h>

#include <type_traits>
#include <vector>

#include "mixkv/cache/block_pool.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::cache {
namespace {

const GroupId kGroup0{0};
const GroupId kGroup1{1};

BlockHash key(std::uint64_t n) { return BlockHash{n, ~n}; }

std::vector<BlockId> ids(std::initializer_list<std::int32_t> values) {
  std::vector<BlockId> out;
  for (auto v : values) out.push_back(BlockId(v));
  return out;
}

std::vector<BlockId> take(BlockPool& pool, std::int32_t count) {
  std::vector<BlockId> out;
  EXPECT_TRUE(pool.allocate(count, out));
  return out;
}

// Caches the blocks of `table` as a chain 1, 2, 3, ... starting at `first`.
void cache_all(BlockPool& pool, const std::vector<BlockId>& table, std::uint64_t first,
               GroupId group = GroupId{0}) {
  for (std::size_t i = 0; i < table.size(); ++i) {
    EXPECT_TRUE(pool.cache_block(table[i], key(first + i), group));
  }
}

TEST(BlockId, IsNotImplicitlyConvertibleFromOrToInt) {
  static_assert(!std::is_convertible_v<int, BlockId>);
  static_assert(!std::is_convertible_v<BlockId, int>);
  static_assert(!std::is_convertible_v<GroupId, BlockId>);
  static_assert(std::is_constructible_v<BlockId, std::int32_t>);
  EXPECT_TRUE(BlockId{}.is_null());
  EXPECT_EQ(BlockId{}, kNullBlock);
}

TEST(BlockPool, RecordIsThirtyTwoBytesAndTheMapAddsAtMostFour) {
  static_assert(BlockPool::kRecordBytes == 32);
  for (std::int64_t n : {2, 100, 1024, 1025, 100000}) {
    const BlockPool pool(n);
    EXPECT_LE(pool.metadata_bytes_per_block(), 32.0 + 4.0 + 32.0 / static_cast<double>(n)) << n;
  }
}

TEST(BlockPool, SizeMustLeaveRoomForTheNullBlock) {
  EXPECT_THROW(BlockPool(0), Error);
  EXPECT_THROW(BlockPool(-5), Error);
  BlockPool only_null(1);
  EXPECT_EQ(only_null.num_free(), 0);
  EXPECT_EQ(only_null.num_used(), 0);
  std::vector<BlockId> out;
  EXPECT_FALSE(only_null.allocate(1, out));
  EXPECT_TRUE(only_null.allocate(0, out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(only_null.check_invariants(), "");
}

TEST(BlockPool, FreshPoolHandsOutBlocksInAscendingOrder) {
  BlockPool pool(6);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.free_queue(), ids({1, 2, 3, 4, 5}));
  EXPECT_EQ(take(pool, 3), ids({1, 2, 3}));
  EXPECT_EQ(pool.num_used(), 3);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.6);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, NullBlockIsNeverHandedOut) {
  BlockPool pool(8);
  const auto all = take(pool, 7);
  for (BlockId b : all) EXPECT_FALSE(b.is_null());
  std::vector<BlockId> out;
  EXPECT_FALSE(pool.allocate(1, out));
  EXPECT_FALSE(pool.is_free(kNullBlock));
  EXPECT_EQ(pool.ref_count(kNullBlock), 0);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, AllocationAppendsToTheCallersTable) {
  BlockPool pool(6);
  std::vector<BlockId> table = ids({0});
  ASSERT_TRUE(pool.allocate(2, table));
  EXPECT_EQ(table, ids({0, 1, 2}));
  for (BlockId b : table) {
    if (!b.is_null()) {
      EXPECT_EQ(pool.ref_count(b), 1);
    }
  }
}

TEST(BlockPool, FailedAllocationChangesNothing) {
  BlockPool pool(10);
  auto a = take(pool, 4);
  cache_all(pool, a, 1);
  pool.free(a);  // four cached free blocks at the tail
  auto b = take(pool, 3);
  const auto queue = pool.free_queue();
  const auto counters = pool.counters();
  const auto free_before = pool.num_free();
  std::vector<BlockId> out = ids({7});
  EXPECT_FALSE(pool.allocate(free_before + 1, out));
  EXPECT_EQ(out, ids({7}));
  EXPECT_EQ(pool.free_queue(), queue);
  EXPECT_EQ(pool.counters(), counters);
  EXPECT_EQ(pool.num_free(), free_before);
  for (std::uint64_t i = 1; i <= 4; ++i) EXPECT_TRUE(pool.lookup(key(i), kGroup0).has_value());
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, AllocationIsAllOrNothingAtTheExactBoundary) {
  BlockPool pool(5);
  std::vector<BlockId> out;
  EXPECT_FALSE(pool.allocate(5, out));
  EXPECT_TRUE(pool.allocate(4, out));
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, FreeWalksTheTableTailFirstSoThePrefixIsEvictedLast) {
  BlockPool pool(5);
  const auto table = take(pool, 4);  // 1 2 3 4, prefix first
  cache_all(pool, table, 10);
  pool.free(table);
  EXPECT_EQ(pool.free_queue(), ids({4, 3, 2, 1}));
  // The next allocation evicts the request's last block, keeping its prefix findable.
  const auto one = take(pool, 1);
  EXPECT_EQ(one, ids({4}));
  EXPECT_FALSE(pool.lookup(key(13), kGroup0).has_value());
  EXPECT_EQ(pool.lookup(key(10), kGroup0), BlockId(1));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, FreedCachedBlocksQueueInLeastRecentlyUsedOrder) {
  BlockPool pool(7);
  const auto a = take(pool, 2);
  const auto b = take(pool, 2);
  cache_all(pool, a, 10);
  cache_all(pool, b, 20);
  pool.free(b);
  pool.free(a);
  EXPECT_EQ(pool.free_queue(), ids({5, 6, 4, 3, 2, 1}));
  const auto next = take(pool, 4);  // the two never-used blocks, then b's (freed first)
  EXPECT_EQ(next, ids({5, 6, 4, 3}));
  EXPECT_EQ(pool.counters().evictions, 2);
  EXPECT_EQ(pool.evictions(kGroup0), 2);
  EXPECT_EQ(pool.evictions(GroupId(7)), 0);  // a group that never cached anything
  EXPECT_TRUE(pool.lookup(key(10), kGroup0).has_value());
  EXPECT_FALSE(pool.lookup(key(20), kGroup0).has_value());
}

TEST(BlockPool, UncachedFreedBlocksAreReusedBeforeCachedOnes) {
  BlockPool pool(5);
  const auto table = take(pool, 4);
  // The first three blocks are full and cached; the last, partial block is not.
  for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(pool.cache_block(table[i], key(i), kGroup0));
  pool.free(table);
  EXPECT_EQ(pool.free_queue(), ids({4, 3, 2, 1}));
  const auto cached = take(pool, 2);
  pool.free(cached);  // block 3 lost its entry when reused: both are uncached and go to the head
  EXPECT_EQ(pool.free_queue(), ids({4, 3, 2, 1}));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, FreedCachedBlockStaysFindableUntilReallocated) {
  BlockPool pool(3);
  const auto table = take(pool, 1);
  ASSERT_TRUE(pool.cache_block(table[0], key(1), kGroup0));
  pool.free(table);
  EXPECT_TRUE(pool.is_free(table[0]));
  EXPECT_EQ(pool.lookup(key(1), kGroup0), table[0]);
  EXPECT_EQ(pool.cached_hash(table[0]), key(1));
  EXPECT_EQ(pool.cached_group(table[0]), kGroup0);
  EXPECT_EQ(pool.counters().evictions, 0);
}

TEST(BlockPool, TouchRevivesAFreeCachedBlockFromTheMiddleOfTheQueue) {
  BlockPool pool(6);
  const auto table = take(pool, 5);
  cache_all(pool, table, 1);
  pool.free(table);
  ASSERT_EQ(pool.free_queue(), ids({5, 4, 3, 2, 1}));
  const auto hit = pool.lookup(key(3), kGroup0);  // block 3, mid-queue
  ASSERT_EQ(hit, BlockId(3));
  const std::vector<BlockId> revived = {*hit};
  pool.touch(revived);
  EXPECT_EQ(pool.free_queue(), ids({5, 4, 2, 1}));
  EXPECT_EQ(pool.ref_count(BlockId(3)), 1);
  EXPECT_FALSE(pool.is_free(BlockId(3)));
  EXPECT_EQ(pool.cached_hash(BlockId(3)), key(3));  // keeps its entry
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.check_invariants(), "");
  // Held again, it is no longer evictable: exhausting the pool never hands it out.
  const auto rest = take(pool, 4);
  for (BlockId b : rest) EXPECT_NE(b, BlockId(3));
}

TEST(BlockPool, SharedBlockReturnsToTheQueueOnlyWhenTheLastReferenceGoes) {
  BlockPool pool(4);
  const auto a = take(pool, 2);
  cache_all(pool, a, 1);
  const std::vector<BlockId> b = {a[0]};  // a second request hits a's first block
  pool.touch(b);
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.free(a);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_FALSE(pool.is_free(a[0]));
  EXPECT_TRUE(pool.is_free(a[1]));
  pool.free(b);
  EXPECT_TRUE(pool.is_free(a[0]));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, ReallocatingACachedBlockRemovesItsPrefixEntry) {
  BlockPool pool(2);  // one usable block
  auto table = take(pool, 1);
  ASSERT_TRUE(pool.cache_block(table[0], key(9), kGroup1));
  pool.free(table);
  const auto again = take(pool, 1);
  EXPECT_EQ(again, table);
  EXPECT_FALSE(pool.lookup(key(9), kGroup1).has_value());
  EXPECT_FALSE(pool.cached_hash(again[0]).has_value());
  EXPECT_EQ(pool.counters().evictions, 1);
  // The block can now be cached under new contents.
  EXPECT_TRUE(pool.cache_block(again[0], key(10), kGroup1));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, CacheKeyIncludesTheGroup) {
  BlockPool pool(4);
  const auto table = take(pool, 2);
  EXPECT_TRUE(pool.cache_block(table[0], key(1), kGroup0));
  EXPECT_TRUE(pool.cache_block(table[1], key(1), kGroup1));
  EXPECT_EQ(pool.lookup(key(1), kGroup0), table[0]);
  EXPECT_EQ(pool.lookup(key(1), kGroup1), table[1]);
  EXPECT_FALSE(pool.lookup(key(1), GroupId{2}).has_value());
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, SecondBlockWithTheSameKeyStaysUncached) {
  BlockPool pool(4);
  const auto a = take(pool, 1);
  const auto b = take(pool, 1);
  EXPECT_TRUE(pool.cache_block(a[0], key(1), kGroup0));
  EXPECT_FALSE(pool.cache_block(b[0], key(1), kGroup0));
  EXPECT_FALSE(pool.cached_hash(b[0]).has_value());
  EXPECT_EQ(pool.lookup(key(1), kGroup0), a[0]);
  pool.free(b);  // worthless once free: reused first
  EXPECT_EQ(pool.free_queue().front(), b[0]);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, CachingTwiceUnderOneKeyIsANoOpAndUnderAnotherIsAnError) {
  BlockPool pool(3);
  const auto a = take(pool, 1);
  EXPECT_TRUE(pool.cache_block(a[0], key(1), kGroup0));
  EXPECT_TRUE(pool.cache_block(a[0], key(1), kGroup0));
  EXPECT_THROW(pool.cache_block(a[0], key(2), kGroup0), Error);
  EXPECT_THROW(pool.cache_block(a[0], key(1), kGroup1), Error);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, OnlyHeldBlocksCanBeCached) {
  BlockPool pool(3);
  EXPECT_THROW(pool.cache_block(kNullBlock, key(1), kGroup0), Error);
  EXPECT_THROW(pool.cache_block(BlockId(1), key(1), kGroup0), Error);  // free
  const auto a = take(pool, 1);
  EXPECT_THROW(pool.cache_block(a[0], key(1), GroupId{-1}), Error);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, NullBlocksInATableAreSkippedByFreeAndTouch) {
  BlockPool pool(4);
  auto table = take(pool, 3);
  const BlockId dropped = table[0];
  table[0] = kNullBlock;  // a sliding window dropped its first block
  pool.free(std::vector<BlockId>{dropped});
  pool.touch(std::vector<BlockId>{kNullBlock, table[1]});
  EXPECT_EQ(pool.ref_count(table[1]), 2);
  pool.free(table);
  EXPECT_EQ(pool.ref_count(table[1]), 1);
  EXPECT_EQ(pool.ref_count(kNullBlock), 0);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, DoubleFreeIsAnInternalError) {
  BlockPool pool(3);
  const auto a = take(pool, 1);
  pool.free(a);
  try {
    pool.free(a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
}

TEST(BlockPool, IdsOutsideThePoolAreRejected) {
  BlockPool pool(3);
  EXPECT_THROW(pool.ref_count(BlockId(3)), Error);
  EXPECT_THROW(pool.touch(std::vector<BlockId>{BlockId(-1)}), Error);
  EXPECT_THROW(pool.free(std::vector<BlockId>{BlockId(99)}), Error);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, CountsQueriesAndHits) {
  BlockPool pool(3);
  const auto a = take(pool, 1);
  ASSERT_TRUE(pool.cache_block(a[0], key(1), kGroup0));
  EXPECT_TRUE(pool.lookup(key(1), kGroup0));
  EXPECT_FALSE(pool.lookup(key(2), kGroup0));
  EXPECT_FALSE(pool.lookup(key(1), kGroup1));
  EXPECT_EQ(pool.counters(), (BlockPoolCounters{.queries = 3, .hits = 1, .evictions = 0}));
}

TEST(BlockPool, ManyEntriesInFewBucketsStayFindable) {
  // Hashes that agree in their low bits all share a bucket: chains must still resolve exactly.
  BlockPool pool(65);
  const auto table = take(pool, 64);
  for (std::size_t i = 0; i < table.size(); ++i) {
    ASSERT_TRUE(pool.cache_block(table[i], BlockHash{0, i}, kGroup0));
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(pool.lookup(BlockHash{0, i}, kGroup0), table[i]);
  }
  pool.free(table);
  const auto half = take(pool, 32);  // evicts the entries of table[32..63]
  for (std::size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(pool.lookup(BlockHash{0, i}, kGroup0).has_value(), i < 32) << i;
  }
  EXPECT_EQ(pool.check_invariants(), "");
}

}  // namespace
}  // namespace mixkv::cache
