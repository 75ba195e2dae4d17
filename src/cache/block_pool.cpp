#include "mixkv/cache/block_pool.hpp"

#include <bit>
#include <limits>
#include <unordered_set>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

namespace {

struct KeyHash {
  std::size_t operator()(const std::pair<BlockHash, std::int32_t>& key) const noexcept {
    return std::hash<BlockHash>{}(key.first) ^ static_cast<std::size_t>(key.second);
  }
};

}  // namespace

BlockPool::BlockPool(std::int64_t num_blocks) {
  if (num_blocks < 1 || num_blocks >= std::numeric_limits<std::int32_t>::max()) {
    throw_invalid(
        fmt::format("a block pool needs between 1 and {} blocks (the null block included), got {}",
                    std::numeric_limits<std::int32_t>::max() - 1, num_blocks));
  }
  num_blocks_ = static_cast<std::int32_t>(num_blocks);
  sentinel_ = num_blocks_;
  records_.resize(static_cast<std::size_t>(num_blocks_) + 1);

  // The queue starts as every block but the null one in ascending order, like vLLM's.
  Record& sentinel = records_[static_cast<std::size_t>(sentinel_)];
  sentinel.next = sentinel_;
  sentinel.prev_or_refs = sentinel_;
  for (std::int32_t b = 1; b < num_blocks_; ++b) push_tail(b);

  // At most num_blocks - 1 entries over at least half as many buckets: chains average two or less.
  const auto buckets = std::bit_ceil(static_cast<std::size_t>(num_blocks_ + 1) / 2);
  buckets_.assign(buckets, kEnd);
  bucket_mask_ = buckets - 1;
}

double BlockPool::usage() const {
  if (num_blocks_ <= 1) return 0.0;
  return static_cast<double>(num_used()) / static_cast<double>(num_blocks_ - 1);
}

bool BlockPool::allocate(std::int32_t count, std::vector<BlockId>& out) {
  if (count < 0) throw_internal(fmt::format("allocate() asked for {} blocks", count));
  if (count > num_free_) return false;
  out.reserve(out.size() + static_cast<std::size_t>(count));  // the only step that can throw
  for (std::int32_t i = 0; i < count; ++i) {
    const std::int32_t b = records_[static_cast<std::size_t>(sentinel_)].next;
    unlink_from_queue(b);
    Record& r = records_[static_cast<std::size_t>(b)];
    if (r.group != kUncached) {
      const auto group = static_cast<std::size_t>(r.group);
      if (group >= evictions_by_group_.size()) evictions_by_group_.resize(group + 1, 0);
      ++evictions_by_group_[group];
      drop_entry(b);
      ++counters_.evictions;
    }
    r.prev_or_refs = 1;
    r.next = kReferenced;
    out.push_back(BlockId(b));
  }
  return true;
}

void BlockPool::free(std::span<const BlockId> table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const std::int32_t b = checked(*it);
    if (b == kNullBlock.value()) continue;
    Record& r = records_[static_cast<std::size_t>(b)];
    if (r.next != kReferenced) throw_internal(fmt::format("block {} freed while already free", b));
    if (--r.prev_or_refs > 0) continue;
    if (r.group != kUncached) {
      push_tail(b);
    } else {
      push_head(b);
    }
  }
}

void BlockPool::touch(std::span<const BlockId> blocks) {
  for (BlockId id : blocks) {
    const std::int32_t b = checked(id);
    if (b == kNullBlock.value()) continue;
    Record& r = records_[static_cast<std::size_t>(b)];
    if (r.next != kReferenced) {
      unlink_from_queue(b);
      r.prev_or_refs = 1;
      r.next = kReferenced;
    } else {
      ++r.prev_or_refs;
    }
  }
}

bool BlockPool::cache_block(BlockId block, const BlockHash& hash, GroupId group) {
  const std::int32_t b = checked(block);
  if (b == kNullBlock.value()) throw_internal("the null block cannot be cached");
  if (group.value() < 0) throw_internal(fmt::format("group id {} is negative", group.value()));
  Record& r = records_[static_cast<std::size_t>(b)];
  if (r.next != kReferenced) {
    throw_internal(fmt::format("block {} is free and cannot be cached", b));
  }
  if (r.group != kUncached) {
    if (r.hash == hash && r.group == group.value()) return true;
    throw_internal(
        fmt::format("block {} is cached as {} in group {}; cannot re-cache as {} in group {}", b,
                    to_string(r.hash), r.group, to_string(hash), group.value()));
  }
  if (find(hash, group.value()) != kEnd) return false;
  r.hash = hash;
  r.group = group.value();
  std::int32_t& head = buckets_[bucket_of(hash, r.group)];
  r.chain = head;
  head = b;
  return true;
}

std::optional<BlockId> BlockPool::peek(const BlockHash& hash, GroupId group) const {
  const std::int32_t b = find(hash, group.value());
  if (b == kEnd) return std::nullopt;
  return BlockId{b};
}

std::optional<BlockId> BlockPool::lookup(const BlockHash& hash, GroupId group) {
  ++counters_.queries;
  const std::int32_t b = find(hash, group.value());
  if (b == kEnd) return std::nullopt;
  ++counters_.hits;
  return BlockId(b);
}

std::int64_t BlockPool::evictions(GroupId group) const {
  const auto g = static_cast<std::size_t>(group.value());
  return g < evictions_by_group_.size() ? evictions_by_group_[g] : 0;
}

std::int32_t BlockPool::ref_count(BlockId block) const {
  const Record& r = records_[static_cast<std::size_t>(checked(block))];
  return r.next == kReferenced ? r.prev_or_refs : 0;
}

bool BlockPool::is_free(BlockId block) const {
  return records_[static_cast<std::size_t>(checked(block))].next != kReferenced;
}

std::optional<BlockHash> BlockPool::cached_hash(BlockId block) const {
  const Record& r = records_[static_cast<std::size_t>(checked(block))];
  if (r.group == kUncached) return std::nullopt;
  return r.hash;
}

std::optional<GroupId> BlockPool::cached_group(BlockId block) const {
  const Record& r = records_[static_cast<std::size_t>(checked(block))];
  if (r.group == kUncached) return std::nullopt;
  return GroupId(r.group);
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> out;
  out.reserve(static_cast<std::size_t>(num_free_));
  for (std::int32_t b = records_[static_cast<std::size_t>(sentinel_)].next; b != sentinel_;
       b = records_[static_cast<std::size_t>(b)].next) {
    out.push_back(BlockId(b));
  }
  return out;
}

std::string BlockPool::check_invariants() const {
  const auto n = static_cast<std::size_t>(num_blocks_);
  const Record& null = records_[0];
  if (null.next != kReferenced || null.prev_or_refs != 0 || null.group != kUncached) {
    return "the null block is in the free queue, referenced or cached";
  }

  // The queue: a well-linked cycle through the sentinel, uncached blocks before cached ones.
  std::vector<char> queued(n, 0);
  std::int32_t count = 0;
  bool seen_cached = false;
  std::int32_t prev = sentinel_;
  for (std::int32_t b = records_[n].next; b != sentinel_;
       b = records_[static_cast<std::size_t>(b)].next) {
    if (b < 1 || b >= num_blocks_) return fmt::format("the free queue links to {}, not a block", b);
    const auto i = static_cast<std::size_t>(b);
    if (queued[i]) return fmt::format("block {} is in the free queue twice", b);
    queued[i] = 1;
    if (records_[i].prev_or_refs != prev) {
      return fmt::format("block {} in the free queue has predecessor {}, expected {}", b,
                         records_[i].prev_or_refs, prev);
    }
    const bool cached = records_[i].group != kUncached;
    if (seen_cached && !cached) {
      return fmt::format("uncached free block {} follows a cached one", b);
    }
    seen_cached = seen_cached || cached;
    prev = b;
    ++count;
  }
  if (records_[n].prev_or_refs != prev) return "the free queue's tail link is wrong";
  if (count != num_free_) {
    return fmt::format("{} blocks in the free queue, num_free() says {}", count, num_free_);
  }

  // Every block off the queue is referenced; with the count above, free + used == total.
  std::int32_t used = 0;
  std::int32_t cached = 0;
  for (std::size_t i = 1; i < n; ++i) {
    const Record& r = records_[i];
    if (!queued[i]) {
      if (r.next != kReferenced) {
        return fmt::format("block {} is marked free but is not in the queue", i);
      }
      if (r.prev_or_refs < 1) {
        return fmt::format("block {} is out of the queue with {} references", i, r.prev_or_refs);
      }
      ++used;
    }
    if (r.group != kUncached) ++cached;
  }
  if (count + used != num_blocks_ - 1) {
    return fmt::format("{} free + {} used blocks, expected {}", count, used, num_blocks_ - 1);
  }

  // The prefix map: exactly the cached blocks, each in its own key's bucket, no key twice.
  std::vector<char> indexed(n, 0);
  std::unordered_set<std::pair<BlockHash, std::int32_t>, KeyHash> keys;
  std::int32_t entries = 0;
  for (std::size_t bucket = 0; bucket < buckets_.size(); ++bucket) {
    for (std::int32_t b = buckets_[bucket]; b != kEnd;
         b = records_[static_cast<std::size_t>(b)].chain) {
      if (b < 1 || b >= num_blocks_) {
        return fmt::format("the prefix map links to {}, not a block", b);
      }
      const auto i = static_cast<std::size_t>(b);
      const Record& r = records_[i];
      if (indexed[i]) return fmt::format("block {} is in the prefix map twice", b);
      indexed[i] = 1;
      if (r.group == kUncached) return fmt::format("uncached block {} is in the prefix map", b);
      if (bucket_of(r.hash, r.group) != bucket) {
        return fmt::format("block {} is filed in bucket {}, its key hashes to {}", b, bucket,
                           bucket_of(r.hash, r.group));
      }
      if (!keys.insert({r.hash, r.group}).second) {
        return fmt::format("key {} of group {} is held by two blocks", to_string(r.hash), r.group);
      }
      ++entries;
    }
  }
  if (entries != cached) {
    return fmt::format("{} prefix-map entries for {} cached blocks", entries, cached);
  }
  return "";
}

double BlockPool::metadata_bytes_per_block() const {
  const double bytes = static_cast<double>(records_.size() * sizeof(Record) +
                                           buckets_.size() * sizeof(std::int32_t));
  return bytes / static_cast<double>(num_blocks_);
}

std::int32_t BlockPool::checked(BlockId block) const {
  const std::int32_t b = block.value();
  if (b < 0 || b >= num_blocks_) {
    throw_internal(fmt::format("block {} is outside the pool of {} blocks", b, num_blocks_));
  }
  return b;
}

std::size_t BlockPool::bucket_of(const BlockHash& hash, std::int32_t group) const {
  // The digest is uniform already; the group is spread so equal content in two groups separates.
  const std::uint64_t mixed = hash.lo ^ (static_cast<std::uint64_t>(group) * 0x9E3779B97F4A7C15ULL);
  return static_cast<std::size_t>(mixed) & bucket_mask_;
}

std::int32_t BlockPool::find(const BlockHash& hash, std::int32_t group) const {
  for (std::int32_t b = buckets_[bucket_of(hash, group)]; b != kEnd;
       b = records_[static_cast<std::size_t>(b)].chain) {
    const Record& r = records_[static_cast<std::size_t>(b)];
    if (r.hash == hash && r.group == group) return b;
  }
  return kEnd;
}

void BlockPool::unlink_from_queue(std::int32_t b) {
  Record& r = records_[static_cast<std::size_t>(b)];
  records_[static_cast<std::size_t>(r.prev_or_refs)].next = r.next;
  records_[static_cast<std::size_t>(r.next)].prev_or_refs = r.prev_or_refs;
  --num_free_;
}

void BlockPool::push_head(std::int32_t b) {
  Record& sentinel = records_[static_cast<std::size_t>(sentinel_)];
  Record& r = records_[static_cast<std::size_t>(b)];
  r.prev_or_refs = sentinel_;
  r.next = sentinel.next;
  records_[static_cast<std::size_t>(sentinel.next)].prev_or_refs = b;
  sentinel.next = b;
  ++num_free_;
}

void BlockPool::push_tail(std::int32_t b) {
  Record& sentinel = records_[static_cast<std::size_t>(sentinel_)];
  Record& r = records_[static_cast<std::size_t>(b)];
  r.next = sentinel_;
  r.prev_or_refs = sentinel.prev_or_refs;
  records_[static_cast<std::size_t>(sentinel.prev_or_refs)].next = b;
  sentinel.prev_or_refs = b;
  ++num_free_;
}

void BlockPool::drop_entry(std::int32_t b) {
  Record& r = records_[static_cast<std::size_t>(b)];
  std::int32_t* link = &buckets_[bucket_of(r.hash, r.group)];
  while (*link != b) link = &records_[static_cast<std::size_t>(*link)].chain;
  *link = r.chain;
  r.chain = kEnd;
  r.group = kUncached;
}

}  // namespace mixkv::cache
