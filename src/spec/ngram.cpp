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
      std::vector<TokenId> seq(tokens.begin(), tokens.end());
      std::vector<TokenId> out;
      for (std::int64_t i = 0; i < k; ++i) {
        const TokenId next = seq[static_cast<std::size_t>(j + n + i)];
        out.push_back(next);
        seq.push_back(next);
      }
      return out;
    }
  }
  return {};
}

}  // namespace mixkv::spec
