// Random operation sequences against the block pool, checked after every operation against a
// deliberately naive model (std::list queue, std::map prefix map) and against check_invariants().
// Fixed seeds: a failure names the sequence and step that reproduce it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "mixkv/cache/block_pool.hpp"

namespace mixkv::cache {
namespace {

using Key = std::pair<std::uint64_t, std::int32_t>;  // (content id, group)

BlockHash hash_of(std::uint64_t content) { return BlockHash{content * 0x100000001B3ULL, content}; }

// The pool's specification, written as plainly as possible.
class Model {
 public:
  explicit Model(std::int32_t num_blocks) : refs_(num_blocks, 0), key_(num_blocks) {
    for (std::int32_t b = 1; b < num_blocks; ++b) queue_.push_back(b);
  }

  std::optional<std::vector<std::int32_t>> allocate(std::int32_t count) {
    if (count > static_cast<std::int32_t>(queue_.size())) return std::nullopt;
    std::vector<std::int32_t> out;
    for (std::int32_t i = 0; i < count; ++i) {
      const std::int32_t b = queue_.front();
      queue_.pop_front();
      if (key_[b]) {
        ++evictions_by_group_[key_[b]->second];
        map_.erase(*key_[b]);
        key_[b].reset();
        ++evictions_;
      }
      refs_[b] = 1;
      out.push_back(b);
    }
    return out;
  }

  void free(const std::vector<std::int32_t>& table) {
    for (auto it = table.rbegin(); it != table.rend(); ++it) {
      if (*it == 0 || --refs_[*it] > 0) continue;
      if (key_[*it]) {
        queue_.push_back(*it);
      } else {
        queue_.push_front(*it);
      }
    }
  }

  void touch(const std::vector<std::int32_t>& blocks) {
    for (std::int32_t b : blocks) {
      if (b == 0) continue;
      if (refs_[b] == 0) queue_.erase(std::find(queue_.begin(), queue_.end(), b));
      ++refs_[b];
    }
  }

  bool cache(std::int32_t b, const Key& key) {
    if (key_[b]) return *key_[b] == key;
    if (map_.count(key)) return false;
    key_[b] = key;
    map_[key] = b;
    return true;
  }

  std::optional<std::int32_t> lookup(const Key& key) const {
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }

  const std::list<std::int32_t>& queue() const { return queue_; }
  std::int32_t refs(std::int32_t b) const { return refs_[b]; }
  const std::optional<Key>& key(std::int32_t b) const { return key_[b]; }
  std::int64_t evictions() const { return evictions_; }
  const std::map<std::int32_t, std::int64_t>& evictions_by_group() const {
    return evictions_by_group_;
  }

 private:
  std::list<std::int32_t> queue_;
  std::vector<std::int32_t> refs_;
  std::vector<std::optional<Key>> key_;
  std::map<Key, std::int32_t> map_;
  std::int64_t evictions_ = 0;
  std::map<std::int32_t, std::int64_t> evictions_by_group_;
};

// A request: the content it computes (a shared-prefix id: equal ids give equal blocks) and its
// table.
struct Request {
  std::uint64_t prefix = 0;
  std::int32_t group = 0;
  std::vector<BlockId> table;
  std::size_t cached = 0;  // leading blocks already offered to the prefix map
};

std::vector<std::int32_t> raw(const std::vector<BlockId>& table) {
  std::vector<std::int32_t> out;
  for (BlockId b : table) out.push_back(b.value());
  return out;
}

std::uint64_t content(const Request& r, std::size_t index) { return r.prefix * 1000 + index; }

void expect_same(const BlockPool& pool, const Model& model, std::int32_t num_blocks) {
  const std::vector<BlockId> queue = pool.free_queue();
  ASSERT_EQ(queue.size(), model.queue().size());
  ASSERT_TRUE(std::equal(queue.begin(), queue.end(), model.queue().begin(),
                         [](BlockId a, std::int32_t b) { return a.value() == b; }));
  for (std::int32_t b = 0; b < num_blocks; ++b) {
    ASSERT_EQ(pool.ref_count(BlockId(b)), model.refs(b)) << "block " << b;
    const auto& key = model.key(b);
    ASSERT_EQ(pool.cached_hash(BlockId(b)).has_value(), key.has_value()) << "block " << b;
    if (key) {
      ASSERT_EQ(*pool.cached_hash(BlockId(b)), hash_of(key->first));
      ASSERT_EQ(pool.cached_group(BlockId(b)), GroupId(key->second));
    }
  }
  ASSERT_EQ(pool.counters().evictions, model.evictions());
  for (const auto& [group, count] : model.evictions_by_group())
    ASSERT_EQ(pool.evictions(GroupId(group)), count) << "group " << group;
  ASSERT_EQ(pool.check_invariants(), "");
}

// What the sequences exercised, so a change that makes them trivial fails loudly.
struct Coverage {
  std::int64_t hits = 0;
  std::int64_t revived = 0;  // hits on free blocks, pulled out of the middle of the queue
  std::int64_t failed_allocations = 0;
  std::int64_t duplicate_caches = 0;
  std::int64_t evictions = 0;
};

void run_sequence(std::uint32_t seed, Coverage& coverage) {
  std::mt19937 rng(seed);
  auto below = [&](std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
  };
  const auto num_blocks = static_cast<std::int32_t>(1 + below(48));
  BlockPool pool(num_blocks);
  Model model(num_blocks);
  std::vector<Request> requests;
  const int steps = 40 + static_cast<int>(below(40));

  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(testing::Message() << "sequence seed " << seed << ", step " << step);
    const std::size_t op = below(10);
    if (op <= 2) {  // admit a request, reusing its longest cached prefix, then allocate the rest
      Request r;
      r.prefix = below(4);
      r.group = static_cast<std::int32_t>(below(2));
      std::vector<BlockId> hits;
      for (std::size_t i = 0;; ++i) {
        const auto hit = pool.lookup(hash_of(content(r, i)), GroupId(r.group));
        ASSERT_EQ(hit.has_value(), model.lookup({content(r, i), r.group}).has_value());
        if (!hit) break;
        ASSERT_EQ(hit->value(), *model.lookup({content(r, i), r.group}));
        hits.push_back(*hit);
        ++coverage.hits;
        coverage.revived += pool.is_free(*hit) ? 1 : 0;
      }
      pool.touch(hits);
      model.touch(raw(hits));
      r.table = hits;
      r.cached = hits.size();
      const auto more = static_cast<std::int32_t>(below(6));
      const auto expected = model.allocate(more);
      ASSERT_EQ(pool.allocate(more, r.table), expected.has_value());
      coverage.failed_allocations += expected ? 0 : 1;
      if (expected) {
        ASSERT_EQ(raw(r.table), [&] {
          auto all = raw(hits);
          all.insert(all.end(), expected->begin(), expected->end());
          return all;
        }());
      } else {
        ASSERT_EQ(r.table, hits);
      }
      requests.push_back(std::move(r));
    } else if (op <= 4 && !requests.empty()) {  // a request grows
      Request& r = requests[below(requests.size())];
      const auto more = static_cast<std::int32_t>(1 + below(3));
      const auto before = r.table;
      const auto expected = model.allocate(more);
      ASSERT_EQ(pool.allocate(more, r.table), expected.has_value());
      if (!expected) {
        ASSERT_EQ(r.table, before);
        ++coverage.failed_allocations;
      }
    } else if (op <= 6 && !requests.empty()) {  // a request's leading blocks become full
      Request& r = requests[below(requests.size())];
      const std::size_t upto = r.cached + below(r.table.size() - r.cached + 1);
      for (; r.cached < upto; ++r.cached) {
        const BlockId b = r.table[r.cached];
        if (b.is_null()) continue;
        const Key key{content(r, r.cached), r.group};
        const bool cached = model.cache(b.value(), key);
        ASSERT_EQ(pool.cache_block(b, hash_of(key.first), GroupId(key.second)), cached);
        coverage.duplicate_caches += cached ? 0 : 1;
      }
    } else if (op == 7 &&
               !requests.empty()) {  // a sliding window drops one block for the null block
      Request& r = requests[below(requests.size())];
      const std::size_t i = below(r.table.size() + 1);
      if (i < r.table.size() && !r.table[i].is_null()) {
        const std::vector<BlockId> dropped = {r.table[i]};
        pool.free(dropped);
        model.free(raw(dropped));
        r.table[i] = kNullBlock;
      }
    } else if (!requests.empty()) {  // a request finishes or is preempted
      const std::size_t i = below(requests.size());
      pool.free(requests[i].table);
      model.free(raw(requests[i].table));
      requests.erase(requests.begin() + static_cast<std::ptrdiff_t>(i));
    }
    expect_same(pool, model, num_blocks);
    if (testing::Test::HasFatalFailure()) return;
  }
  coverage.evictions += pool.counters().evictions;
  for (const Request& r : requests) pool.free(r.table);
  ASSERT_EQ(pool.num_free(), num_blocks - 1);
  ASSERT_EQ(pool.check_invariants(), "");
}

TEST(BlockPoolProperty, RandomOperationSequencesMatchTheModelAndKeepEveryInvariant) {
  Coverage coverage;
  for (std::uint32_t seed = 1; seed <= 3000; ++seed) {
    run_sequence(seed, coverage);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(coverage.hits, 1000);
  EXPECT_GT(coverage.revived, 1000);
  EXPECT_GT(coverage.failed_allocations, 1000);
  EXPECT_GT(coverage.duplicate_caches, 100);
  EXPECT_GT(coverage.evictions, 1000);
  std::printf(
      "coverage: %lld hits (%lld revived), %lld failed allocations, %lld duplicate caches, "
      "%lld evictions\n",
      static_cast<long long>(coverage.hits), static_cast<long long>(coverage.revived),
      static_cast<long long>(coverage.failed_allocations),
      static_cast<long long>(coverage.duplicate_caches),
      static_cast<long long>(coverage.evictions));
}

}  // namespace
}  // namespace mixkv::cache
