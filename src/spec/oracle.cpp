#include "mixkv/spec/oracle.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {

OracleDrafter::OracleDrafter(std::vector<std::vector<TokenId>> references)
    : references_(std::move(references)) {}

std::vector<TokenId> OracleDrafter::propose(const DraftContext& ctx, int k) {
  const std::size_t request = ctx.request;
  const std::span<const TokenId> tokens = ctx.tokens;
  if (request >= references_.size()) return {};
  const auto& ref = references_[request];
  // Only a request still on its reference path has a known continuation.
  if (tokens.size() > ref.size() || !std::equal(tokens.begin(), tokens.end(), ref.begin())) {
    return {};
  }
  const std::size_t n = std::min(ref.size() - tokens.size(), static_cast<std::size_t>(k));
  return {ref.begin() + static_cast<std::ptrdiff_t>(tokens.size()),
          ref.begin() + static_cast<std::ptrdiff_t>(tokens.size() + n)};
}

}  // namespace mixkv::spec
