#include "chunked_local_manager.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

ChunkedLocalManager::ChunkedLocalManager(const GroupSetup& setup)
    : WindowedAttentionManager(setup, plan::Behaviour::kChunked), chunk_(setup.chunk.value_or(0)) {
  if (chunk_ < 1) {
    throw_invalid(fmt::format(
        "group {} is a chunked-attention group without a chunk size; give its layers a chunk of "
        "at least one token",
        id_.value()));
  }
}

}  // namespace mixkv::cache
