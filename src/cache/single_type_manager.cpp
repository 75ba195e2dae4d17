#include "single_type_manager.hpp"

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

GroupSetup group_setup(const plan::CachePlan& plan, const plan::KvCacheGroup& group,
                       int num_spec_tokens, bool prefix_caching) {
  GroupSetup s;
  s.id = GroupId{group.id};
  s.block_size = group.block_size;
  s.window = group.window;
  s.chunk = group.chunk;
  std::int64_t data = 0;
  for (const auto& p : group.placement) data += p.bytes;
  s.padding_per_block = plan.block_unit_bytes - data;
  s.num_spec_tokens = num_spec_tokens;
  s.prefix_caching = prefix_caching;
  return s;
}

GroupManagerBase::GroupManagerBase(const GroupSetup& setup, plan::Behaviour behaviour)
    : id_(setup.id),
      block_size_(setup.block_size),
      padding_per_block_(setup.padding_per_block),
      num_spec_tokens_(setup.num_spec_tokens),
      prefix_caching_(setup.prefix_caching) {
  stats_.group = setup.id.value();
  stats_.behaviour = behaviour;
}

GroupStats GroupManagerBase::stats_holding(std::int64_t blocks_held, const BlockPool& pool) const {
  GroupStats s = stats_;
  s.blocks_held = blocks_held;
  s.padding_bytes = blocks_held * padding_per_block_;
  s.evictions = pool.evictions(id_);
  return s;
}

void GroupManagerBase::throw_lost_blocks() { throw_internal("allocation lost blocks it counted"); }

}  // namespace mixkv::cache
