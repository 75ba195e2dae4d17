#include "kv_cache_coordinator.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

// The one place a group's behaviour picks code: the plan's enum becomes a kind.
KvCacheCoordinator::AnyManager KvCacheCoordinator::make_manager(const plan::KvCacheGroup& group,
                                                                const GroupSetup& setup) {
  switch (group.behaviour) {
    case plan::Behaviour::kAllTokens:
      return FullAttentionManager(setup);
    case plan::Behaviour::kSliding:
      return SlidingWindowManager(setup);
    case plan::Behaviour::kChunked:
      return ChunkedLocalManager(setup);
    case plan::Behaviour::kRecurrent:
      return RecurrentStateManager(setup);
  }
  throw_invalid(fmt::format("group {} has an unknown behaviour", group.id));
}

KvCacheCoordinator::KvCacheCoordinator(const plan::CachePlan& plan, int num_spec_tokens,
                                       const ManagerOptions& options) {
  managers_.reserve(plan.groups.size());
  for (const auto& g : plan.groups) {
    managers_.push_back(
        make_manager(g, group_setup(plan, g, num_spec_tokens, options.enable_prefix_caching)));
  }
  // A snapshot boundary must be a block boundary of every attention group, or a hit there would
  // not be valid for them (vLLM aligns its Mamba block size with the attention block size alike).
  std::int64_t aligned = 1;
  bool takes_interval = false;
  for (const auto& m : managers_) {
    const std::int64_t a = std::visit([](const auto& k) { return k.hit_alignment(); }, m);
    const GroupId id = std::visit([](const auto& k) { return k.group(); }, m);
    if (a == 0) {
      takes_interval = true;
      continue;
    }
    aligned = std::lcm(aligned, a);
    if (options.snapshot_interval > 0 && options.snapshot_interval % a != 0) {
      throw_invalid(fmt::format(
          "snapshot_interval {} is not a multiple of group {}'s block size {}; use a multiple "
          "of {}",
          options.snapshot_interval, id.value(), a, aligned));
    }
  }
  if (takes_interval && options.enable_prefix_caching) {
    snapshot_interval_ = options.snapshot_interval > 0 ? options.snapshot_interval
                         : aligned > 1                 ? aligned
                                                       : kDefaultSnapshotInterval;
  }
  std::map<std::int64_t, int> hasher_of_block_size;
  for (auto& m : managers_) {
    std::visit(
        [&](auto& k) {
          k.set_snapshot_interval(snapshot_interval_);
          commits_every_step_ = commits_every_step_ || k.commits_every_step();
          int hasher = -1;
          if (k.block_size() > 0) {
            auto [it, inserted] =
                hasher_of_block_size.emplace(k.block_size(), static_cast<int>(hashers_.size()));
            if (inserted) {
              hashers_.emplace_back(static_cast<std::int32_t>(k.block_size()), options.hash_seed);
            }
            hasher = it->second;
          }
          k.set_hasher(hasher);
        },
        m);
  }
}

std::int64_t KvCacheCoordinator::extend_hashes(std::span<const TokenId> tokens,
                                               const SequenceKeys& keys,
                                               std::span<std::vector<BlockHash>> hashes) {
  const auto num_tokens = static_cast<std::int64_t>(tokens.size());
  std::int64_t next = std::numeric_limits<std::int64_t>::max();
  for (std::size_t h = 0; h < hashers_.size(); ++h) {
    auto& list = hashes[h];
    const std::int64_t block_size = hashers_[h].block_size();
    if (static_cast<std::int64_t>(list.size() + 1) * block_size <= num_tokens) {
      reserve_for(list, static_cast<std::size_t>(num_tokens / block_size));
      hashers_[h].extend(tokens, keys, list);
    }
    next = std::min(next, static_cast<std::int64_t>(list.size() + 1) * block_size);
  }
  return next;
}

void KvCacheCoordinator::open(RequestSlot slot) {
  for (auto& m : managers_) std::visit([&](auto& k) { k.open(slot); }, m);
}

void KvCacheCoordinator::release(RequestSlot slot, BlockPool& pool) {
  for (auto& m : managers_) std::visit([&](auto& k) { k.release(slot, pool); }, m);
}

std::int64_t KvCacheCoordinator::find_prefix_hit(std::span<const std::vector<BlockHash>> hashes,
                                                 const BlockPool& pool, std::int64_t limit) const {
  std::int64_t hit = limit;
  // Fixed point: each group can only lower the hit; stop when every group accepts it.
  for (bool changed = true; changed && hit > 0;) {
    changed = false;
    for (const auto& m : managers_) {
      const std::int64_t h = std::visit(
          [&](const auto& k) { return k.find_longest_cache_hit(k.hashes_in(hashes), pool, hit); },
          m);
      if (h < hit) {
        hit = h;
        changed = true;
      }
    }
  }
  return std::max<std::int64_t>(hit, 0);
}

bool KvCacheCoordinator::admit(RequestSlot slot, std::span<const std::vector<BlockHash>> hashes,
                               BlockPool& pool, std::int64_t hit, std::int64_t total,
                               std::int64_t num_tokens, bool snapshot) {
  // Plan the whole admission first, so a failure changes nothing.
  std::int64_t needed = 0;
  for (auto& m : managers_) {
    std::visit(
        [&](auto& k) {
          needed += k.stage_hit(slot, k.hashes_in(hashes), pool, hit);
          needed += k.extra_blocks(slot, total, snapshot);
        },
        m);
  }
  if (needed > pool.num_free()) {
    for (auto& m : managers_) std::visit([&](auto& k) { k.unstage_hit(slot); }, m);
    return false;
  }
  // Take every hit block before allocating any: an allocation pops the free queue and would
  // evict a cached block that a later group's hit (or restore) was about to take.
  for (auto& m : managers_) {
    std::visit(
        [&](auto& k) {
          k.take_hit(slot, pool, hit);
          if (k.hasher() >= 0) {
            k.count_hit_query(k.find_longest_cache_hit(k.hashes_in(hashes), pool, num_tokens - 1));
          }
        },
        m);
  }
  for (auto& m : managers_) {
    std::visit([&](auto& k) { k.append(slot, k.extra_blocks(slot, total, snapshot), pool); }, m);
  }
  return true;
}

void KvCacheCoordinator::take_blocks(RequestSlot slot, BlockPool& pool, std::int64_t total,
                                     bool snapshot) {
  // Reserve every table before taking any block, so nothing below throws halfway.
  for (auto& m : managers_) {
    std::visit([&](auto& k) { k.reserve(slot, k.extra_blocks(slot, total, snapshot)); }, m);
  }
  for (auto& m : managers_) {
    std::visit(
        [&](auto& k) {
          if (const std::int64_t extra = k.extra_blocks(slot, total, snapshot); extra > 0) {
            k.append(slot, extra, pool);
          }
        },
        m);
  }
}

void KvCacheCoordinator::throw_over_capacity(const SequenceView& seq, std::int64_t computed,
                                             std::int64_t capacity) const {
  for (const auto& m : managers_) {
    std::visit(
        [&](const auto& k) {
          if (k.capacity(seq.slot) < computed) {
            throw_invalid(
                fmt::format("request {}: {} computed tokens exceed the slots allocated in group {}",
                            seq.id, computed, k.group().value()));
          }
        },
        m);
  }
  throw_internal(fmt::format("request {}: capacity {} is stale", seq.id, capacity));
}

std::span<const BlockId> KvCacheCoordinator::table(RequestSlot slot, int group) const {
  return std::visit([&](const auto& k) { return k.table(slot); },
                    managers_.at(static_cast<std::size_t>(group)));
}

std::optional<RecurrentStep> KvCacheCoordinator::recurrent_step(const SequenceView& seq,
                                                                int group) const {
  if (group < 0 || static_cast<std::size_t>(group) >= managers_.size()) return std::nullopt;
  return std::visit([&](const auto& k) { return k.recurrent_step(seq); },
                    managers_[static_cast<std::size_t>(group)]);
}

std::vector<GroupStats> KvCacheCoordinator::stats(const BlockPool& pool) const {
  std::vector<GroupStats> out;
  out.reserve(managers_.size());
  for (const auto& m : managers_) {
    out.push_back(std::visit([&](const auto& k) { return k.stats(pool); }, m));
  }
  return out;
}

std::string KvCacheCoordinator::check(const SequenceView& seq, const BlockPool& pool,
                                      std::vector<std::int32_t>& refs) const {
  for (const auto& m : managers_) {
    std::string broken = std::visit([&](const auto& k) { return k.check(seq, pool, refs); }, m);
    if (!broken.empty()) return broken;
  }
  return "";
}

}  // namespace mixkv::cache
