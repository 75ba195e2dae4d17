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
  const std::int64_t min_n = min_n_;
  if (size <= min_n) return {};
  // Every earlier occurrence of the last min_n tokens, latest first; the longest match (its
  // agreement with the suffix, read backwards, up to max_n) wins, and a later one on a tie.
  std::int64_t best_end = -1;  // the token after the chosen occurrence
  std::int64_t best_len = 0;
  for (std::int64_t end = size - 1; end >= min_n; --end) {
    std::int64_t len = 0;
    while (len < max_n_ && end - 1 - len >= 0 &&
           tokens[static_cast<std::size_t>(end - 1 - len)] ==
               tokens[static_cast<std::size_t>(size - 1 - len)]) {
      ++len;
    }
    if (len >= min_n && len > best_len) {
      best_len = len;
      best_end = end;
      if (len == max_n_) break;
    }
  }
  if (best_end < 0) return {};
  // What followed, read on into the proposal itself where it runs past the end (a cycle).
  std::vector<TokenId> out;
  const auto limit = std::max(0, std::min(k, ctx.max_drafts));
  for (std::int64_t i = 0; i < limit; ++i) {
    const std::int64_t at = best_end + i;
    out.push_back(at < size ? tokens[static_cast<std::size_t>(at)]
                            : out[static_cast<std::size_t>(at - size)]);
  }
  return out;
}

}  // namespace mixkv::spec
