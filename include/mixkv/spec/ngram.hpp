// Prompt lookup (n-gram) drafting, as vLLM's "ngram" method and llama.cpp's lookup decoding:
// over the prompt and the generated text, find the earlier occurrence that matches the longest
// suffix of the tokens (at least min_n, at most max_n; the most recent among equally long ones)
// and propose what followed it, read on through its own proposal so a repeating cycle yields k
// tokens. No weights: answers that copy the prompt, and greedy output that repeats itself (as
// small models' does), are predicted well, anything else not at all.
#pragma once

#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

// Default match lengths, tuned on SmolLM2 over bench-generate's prompt set (docs/spec.md):
// matches of 1 or 2 tokens (" the", ",\n") are mostly chance on new text, and each failed draft
// costs a verify row; from 3 tokens on they are mostly copies. Longer matches win over shorter
// ones (a copy in progress beats a phrase that recurs), up to kNgramMaxMatch.
inline constexpr int kNgramMinMatch = 3;
inline constexpr int kNgramMaxMatch = 32;

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int min_n = kNgramMinMatch, int max_n = kNgramMaxMatch);
  std::string name() const override { return "ngram"; }
  bool drafts_for_free() const override { return true; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  int min_n_;
  int max_n_;
};

}  // namespace mixkv::spec
