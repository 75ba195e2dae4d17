// Composes one single-type manager per KV-cache group over the shared block pool (vLLM's
// KVCacheCoordinator): the prefix hit valid for every group, all-or-nothing admission and
// growth, the commit of a verified step, and the hash lists, one per distinct block size.
// KvCacheManager drives it with one request at a time; every rule of a kind lives in its manager.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "chunked_local_manager.hpp"
#include "full_attention_manager.hpp"
#include "mixkv/cache/block_hash.hpp"
#include "mixkv/cache/block_pool.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/plan/plan.hpp"
#include "recurrent_state_manager.hpp"
#include "sliding_window_manager.hpp"

namespace mixkv::cache {

class KvCacheCoordinator {
 public:
  // Throws kInvalidInput for a snapshot interval that is not a multiple of every attention
  // group's block size, naming the group and the multiple to use.
  KvCacheCoordinator(const plan::CachePlan& plan, int num_spec_tokens,
                     const ManagerOptions& options);

  // Tokens between recurrent snapshots; 0 without recurrent groups or with prefix caching off.
  std::int64_t snapshot_interval() const { return snapshot_interval_; }
  // Some group has work in every commit(), so a step cannot skip the groups.
  bool commits_every_step() const { return commits_every_step_; }
  std::size_t num_groups() const { return managers_.size(); }
  std::size_t num_hashers() const { return hashers_.size(); }

  // Extends each hash list (one per distinct block size) to the full blocks of `tokens`;
  // returns the token count at which some list has a new full block.
  std::int64_t extend_hashes(std::span<const TokenId> tokens, const SequenceKeys& keys,
                             std::span<std::vector<BlockHash>> hashes);

  void open(RequestSlot slot);
  void release(RequestSlot slot, BlockPool& pool);

  // The longest prefix of at most `limit` tokens every group can serve: each group lowers it to
  // its own longest hit until none does (a fixed point). Pure.
  std::int64_t find_prefix_hit(std::span<const std::vector<BlockHash>> hashes,
                               const BlockPool& pool, std::int64_t limit) const;
  // Takes the hit of `hit` tokens and blocks for `total` tokens in every group, or returns false
  // with nothing changed. `num_tokens`: the request's tokens (the groups' hit statistics).
  bool admit(RequestSlot slot, std::span<const std::vector<BlockHash>> hashes, BlockPool& pool,
             std::int64_t hit, std::int64_t total, std::int64_t num_tokens, bool snapshot);
  // Blocks for `total` tokens in every group: the number added, or nullopt (nothing changed)
  // when the pool is too small.
  // Inline, like the other members a step calls: recurrent hybrids run them every step.
  std::optional<std::int64_t> grow(RequestSlot slot, BlockPool& pool, std::int64_t total,
                                   bool snapshot) {
    std::int64_t needed = 0;
    for (const auto& m : managers_) {
      needed += std::visit([&](const auto& k) { return k.extra_blocks(slot, total, snapshot); }, m);
    }
    if (needed > pool.num_free()) return std::nullopt;
    if (needed > 0) take_blocks(slot, pool, total, snapshot);
    return needed;
  }
  void commit(const SequenceView& seq, std::span<const std::vector<BlockHash>> hashes,
              int accepted_drafts, BlockPool& pool) {
    for (auto& m : managers_) {
      std::visit([&](auto& k) { k.commit(seq, hashes, accepted_drafts, pool); }, m);
    }
  }

  // The least capacity over the groups: tokens every table has slots for.
  std::int64_t capacity(RequestSlot slot) const {
    std::int64_t c = std::numeric_limits<std::int64_t>::max();
    for (const auto& m : managers_) {
      c = std::min(c, std::visit([&](const auto& k) { return k.capacity(slot); }, m));
    }
    return c;
  }
  // The least computed count at which some group has work in commit().
  std::int64_t next_event(RequestSlot slot) const {
    if (commits_every_step_) return 0;
    std::int64_t e = std::numeric_limits<std::int64_t>::max();
    for (const auto& m : managers_) {
      e = std::min(e, std::visit([&](const auto& k) { return k.next_event(slot); }, m));
    }
    return e;
  }
  // A commit of `computed` tokens beyond the capacity: names the group that lacks the slots.
  [[noreturn]] void throw_over_capacity(const SequenceView& seq, std::int64_t computed,
                                        std::int64_t capacity) const;
  // The first token a step reaching a snapshot boundary keeps (0: none): at most one per step.
  std::int64_t snapshot_target(std::int64_t computed, std::int64_t num_new,
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

  // Throws std::out_of_range for a group outside the plan.
  std::span<const BlockId> table(RequestSlot slot, int group) const;
  // nullopt for a group outside the plan or not recurrent.
  std::optional<RecurrentStep> recurrent_step(const SequenceView& seq, int group) const;
  std::vector<GroupStats> stats(const BlockPool& pool) const;
  // Every group's invariants for one request, counting its blocks into `refs`.
  std::string check(const SequenceView& seq, const BlockPool& pool,
                    std::vector<std::int32_t>& refs) const;

 private:
  using AnyManager = std::variant<FullAttentionManager, SlidingWindowManager, ChunkedLocalManager,
                                  RecurrentStateManager>;
  // grow() once the blocks are known to fit.
  void take_blocks(RequestSlot slot, BlockPool& pool, std::int64_t total, bool snapshot);
  static AnyManager make_manager(const plan::KvCacheGroup& group, const GroupSetup& setup);
  std::vector<AnyManager> managers_;  // in group order: every loop keeps it
  std::vector<BlockHasher> hashers_;  // one per distinct block size
  std::int64_t snapshot_interval_ = 0;
  bool commits_every_step_ = false;
};

}  // namespace mixkv::cache
