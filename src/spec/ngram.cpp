#include "mixkv/spec/ngram.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  if (min_n < 1 || max_n < min_n) {
    throw_invalid(fmt::format("ngram drafter: n from {} to {} is not a range of positive lengths",
                              min_n, max_n));
  }
}

std::vector<TokenId> NgramDrafter::propose(const DraftContext& ctx, int k) {
  const std::span<const TokenId> tokens = ctx.tokens;
  const auto size = static_cast<std::int64_t>(tokens.size());
  for (std::int64_t n = max_n_; n >= min_n_; --n) {
    if (size <= n) continue;
    const auto suffix = tokens.subspan(static_cast<std::size_t>(size - n));
    // The most recent earlier occurrence: start j, ending before the suffix's own start.
    for (std::int64_t j = size - n - 1; j >= 0; --j) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + j)) continue;
      // What followed, read on into the proposal itself where it runs past the end (a cycle).
      std::vector<TokenId> out;
      const auto limit = std::max(0, std::min(k, ctx.max_drafts));
      for (std::int64_t i = 0; i < limit; ++i) {
        const std::int64_t at = j + n + i;
        out.push_back(at < size ? tokens[static_cast<std::size_t>(at)]
                                : out[static_cast<std::size_t>(at - size)]);
      }
      return out;
    }
  }
  return {};
}

}  // namespace mixkv::spec
