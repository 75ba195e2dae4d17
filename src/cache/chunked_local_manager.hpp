// Chunked local attention groups: the tokens are cut into chunks of `chunk` tokens and a query
// sees its own chunk's tokens up to itself. The blocks before the current chunk are freed when a
// chunk begins (still cached, for other requests), and a hit needs only the blocks of the chunk
// the next query is in.
#pragma once

#include "attention_manager.hpp"

namespace mixkv::cache {

class ChunkedLocalManager final : public WindowedAttentionManager<ChunkedLocalManager> {
 public:
  // Throws kInvalidInput unless the group has a chunk of at least one token.
  explicit ChunkedLocalManager(const GroupSetup& setup);

  // The next query, at position num_computed, sees its chunk from the chunk's first token.
  std::int64_t first_needed_token(std::int64_t num_computed) const {
    return num_computed / chunk_ * chunk_;
  }
  std::int64_t next_event(RequestSlot slot) const {
    const Slot& s = at(slot);
    // A lower bound: the end of block window_start, where a new chunk may begin (until one does,
    // the drop finds nothing to free).
    return std::min(next_cache_event(s), (s.window_start + 1) * block_size_);
  }

 private:
  std::int64_t chunk_;
};
static_assert(SingleTypeManager<ChunkedLocalManager>);

}  // namespace mixkv::cache
