// Acceptance of a chain of drafts. Greedy: the rule that makes speculative decoding give exactly
// the tokens of plain greedy decoding (R9 of the brief). Sampled: speculative sampling, whose
// tokens are distributed as plain sampling's.
#pragma once

#include <span>
#include <vector>

#include "mixkv/sample/sampler.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

struct Verdict {
  int accepted = 0;             // drafts accepted, a prefix of them
  std::vector<TokenId> tokens;  // the accepted drafts, then the bonus token
};

// `drafts` d1..dk were verified in one target step whose picks (the target's token after each
// of [last, d1, ..., dk]) are `picks` (k + 1 of them). d(i+1) is accepted while it equals pick i;
// the bonus is the pick at the first mismatch (or after the last draft).
Verdict accept_greedy(std::span<const TokenId> drafts, std::span<const TokenId> picks);

// What a rejected draft's replacement is drawn from. Only kResidual keeps the target's
// distribution; kTarget exists so a test can show that its check catches a wrong rule.
enum class Resample { kResidual, kTarget };

// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) over one verify step.
// `logits` holds k + 1 rows of `vocab` (the target's logits after each of [last, d1, ..., dk]);
// `draft_probs`, when given, k rows of the drafter's distribution q_i the drafts were drawn
// from; without it each draft is its drafter's certain choice (q_i one-hot at d_i: n-gram,
// oracle, and the model drafters, which draft greedily). d_i is accepted with probability
// min(1, p_i(d_i) / q_i(d_i)), p_i being sampler.distribution() at that position; the first
// rejected one is replaced by a draw from max(0, p_i - q_i) normalised, and when all are
// accepted the bonus is drawn from p_{k+1}. A greedy sampler gives accept_greedy over its picks.
// The sampler is not committed to.
Verdict accept_sampled(const sample::Sampler& sampler, std::span<const TokenId> drafts,
                       std::span<const float> logits, std::size_t vocab,
                       std::span<const float> draft_probs = {},
                       Resample resample = Resample::kResidual);

}  // namespace mixkv::spec
