// Sliding-window groups: a query at position p sees the `window` tokens p - window + 1 .. p, so a
// request needs only the blocks of its last window - 1 tokens plus the new ones. Blocks that fall
// out of the window are freed (still cached, for other requests), and a hit needs only the blocks
// the next query sees.
#pragma once

#include "attention_manager.hpp"

namespace mixkv::cache {

class SlidingWindowManager final : public WindowedAttentionManager<SlidingWindowManager> {
 public:
  // Throws kInvalidInput unless the group has a window of at least one token.
  explicit SlidingWindowManager(const GroupSetup& setup);

  // The next query, at position num_computed, sees the window - 1 tokens before it.
  std::int64_t first_needed_token(std::int64_t num_computed) const {
    return std::max<std::int64_t>(0, num_computed - (window_ - 1));
  }
  std::int64_t next_event(RequestSlot slot) const {
    const Slot& s = at(slot);
    // Block window_start leaves once the first needed token passes its end.
    return std::min(next_cache_event(s), (s.window_start + 1) * block_size_ + window_ - 1);
  }

 private:
  std::int64_t window_;
};
static_assert(SingleTypeManager<SlidingWindowManager>);

}  // namespace mixkv::cache
