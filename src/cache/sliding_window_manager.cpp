#include "sliding_window_manager.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

SlidingWindowManager::SlidingWindowManager(const GroupSetup& setup)
    : WindowedAttentionManager(setup, plan::Behaviour::kSliding),
      window_(setup.window.value_or(0)) {
  if (window_ < 1) {
    throw_invalid(fmt::format(
        "group {} is a sliding-window group without a window; give its layers a window of at "
        "least one token",
        id_.value()));
  }
}

}  // namespace mixkv::cache
