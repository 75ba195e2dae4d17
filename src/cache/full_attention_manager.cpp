#include "full_attention_manager.hpp"

namespace mixkv::cache {

FullAttentionManager::FullAttentionManager(const GroupSetup& setup)
    : AttentionManager(setup, plan::Behaviour::kAllTokens) {}

std::int64_t FullAttentionManager::find_longest_cache_hit(std::span<const BlockHash> hashes,
                                                          const BlockPool& pool,
                                                          std::int64_t limit) const {
  // A hit needs every block before it; the chained hashes make the first miss the end.
  const std::int64_t max_blocks =
      std::min<std::int64_t>(limit / block_size_, static_cast<std::int64_t>(hashes.size()));
  std::int64_t n = 0;
  while (n < max_blocks && cached(hashes, pool, n)) ++n;
  return n * block_size_;
}

}  // namespace mixkv::cache
