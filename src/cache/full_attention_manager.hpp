// Full attention and MLA groups: every token's KV stays for the request's lifetime, so a hit is
// the run of leading cached blocks and nothing is ever skipped.
#pragma once

#include "attention_manager.hpp"

namespace mixkv::cache {

class FullAttentionManager final : public AttentionManager {
 public:
  explicit FullAttentionManager(const GroupSetup& setup);

  std::int64_t find_longest_cache_hit(std::span<const BlockHash> hashes, const BlockPool& pool,
                                      std::int64_t limit) const;
  std::int64_t stage_hit(RequestSlot slot, std::span<const BlockHash> hashes, const BlockPool& pool,
                         std::int64_t hit) {
    return stage_hit_from(slot, hashes, pool, hit, 0);
  }
  void commit(const SequenceView& seq, HashLists lists, int /*accepted*/, BlockPool& pool) {
    cache_full_blocks(at(seq.slot), seq.num_computed, lists, pool);
  }
  std::int64_t next_event(RequestSlot slot) const { return next_cache_event(at(slot)); }
  std::string check(const SequenceView& seq, const BlockPool& pool,
                    std::vector<std::int32_t>& refs) const {
    return check_table(seq, pool, refs, 0);
  }
};
static_assert(SingleTypeManager<FullAttentionManager>);

}  // namespace mixkv::cache
