#include "mixkv/spec/acceptance.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {

Verdict accept_greedy(std::span<const TokenId> drafts, std::span<const TokenId> picks) {
  if (picks.size() != drafts.size() + 1) {
    throw_internal(fmt::format("accept_greedy: {} picks for {} drafts; a verify step has one more",
                               picks.size(), drafts.size()));
  }
  Verdict v;
  while (static_cast<std::size_t>(v.accepted) < drafts.size() &&
         drafts[static_cast<std::size_t>(v.accepted)] ==
             picks[static_cast<std::size_t>(v.accepted)]) {
    ++v.accepted;
  }
  v.tokens.assign(drafts.begin(), drafts.begin() + v.accepted);
  v.tokens.push_back(picks[static_cast<std::size_t>(v.accepted)]);
  return v;
}

}  // namespace mixkv::spec
