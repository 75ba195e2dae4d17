#include "mixkv/spec/acceptance.hpp"

#include <fmt/format.h>

#include <algorithm>

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

Verdict accept_sampled(const sample::Sampler& sampler, std::span<const TokenId> drafts,
                       std::span<const float> logits, std::size_t vocab,
                       std::span<const float> draft_probs, Resample resample) {
  const std::size_t k = drafts.size();
  if (vocab == 0 || logits.size() != (k + 1) * vocab) {
    throw_internal(fmt::format("accept_sampled: {} logits for {} drafts of vocabulary {}",
                               logits.size(), k, vocab));
  }
  if (!draft_probs.empty() && draft_probs.size() != k * vocab) {
    throw_internal(fmt::format("accept_sampled: {} draft probabilities for {} drafts of {}",
                               draft_probs.size(), k, vocab));
  }
  auto row = [&](std::size_t i) { return logits.subspan(i * vocab, vocab); };
  if (sampler.greedy()) {
    std::vector<TokenId> picks;
    for (std::size_t i = 0; i <= k; ++i) picks.push_back(sampler.pick(row(i), drafts.first(i)));
    return accept_greedy(drafts, picks);
  }
  const std::uint64_t seed = sampler.params().seed;
  Verdict v;
  std::vector<float> p;
  for (std::size_t i = 0; i < k; ++i) {
    const std::int64_t position = sampler.position() + static_cast<std::int64_t>(i);
    sampler.distribution(row(i), drafts.first(i), p);
    const TokenId d = drafts[i];
    if (d < 0 || static_cast<std::size_t>(d) >= vocab) {
      throw_internal(
          fmt::format("accept_sampled: draft {} outside the vocabulary of {}", d, vocab));
    }
    const auto q =
        draft_probs.empty() ? std::span<const float>{} : draft_probs.subspan(i * vocab, vocab);
    const double q_d = q.empty() ? 1.0 : q[static_cast<std::size_t>(d)];
    if (!(q_d > 0)) {
      throw_internal(
          fmt::format("accept_sampled: draft {} has probability {} under its drafter", d, q_d));
    }
    // u < p/q, written without the division.
    if (sample::uniform(seed, position, sample::Stream::kAccept) * q_d <
        p[static_cast<std::size_t>(d)]) {
      v.tokens.push_back(d);
      ++v.accepted;
      continue;
    }
    if (resample == Resample::kResidual) {
      double left = 0;
      for (std::size_t t = 0; t < vocab; ++t) {
        const double qt = q.empty() ? (t == static_cast<std::size_t>(d) ? 1.0 : 0.0) : q[t];
        p[t] = static_cast<float>(std::max(0.0, p[t] - qt));
        left += p[t];
      }
      // p <= q everywhere means p == q, where a draft is never rejected; rounding aside, the
      // target's own distribution is the limit of the residual.
      if (!(left > 0)) sampler.distribution(row(i), drafts.first(i), p);
    }
    v.tokens.push_back(sample::draw(p, sample::uniform(seed, position, sample::Stream::kSample)));
    return v;
  }
  sampler.distribution(row(k), drafts, p);
  v.tokens.push_back(
      sample::draw(p, sample::uniform(seed, sampler.position() + static_cast<std::int64_t>(k),
                                      sample::Stream::kSample)));
  return v;
}

}  // namespace mixkv::spec
