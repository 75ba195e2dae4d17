// Prompt lookup (n-gram) drafting, as vLLM's "ngram" method: find the most recent earlier
// occurrence of the last n tokens (n from max_n down to min_n) and propose what followed it,
// extended through its own proposal so a repeating cycle yields k tokens. No weights: greedy
// output that repeats itself (as small models' does) is predicted well, anything else not at all.
#pragma once

#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

// Default match lengths, tuned on SmolLM2 over bench-generate's prompt set (docs/engine.md):
// matches of 1 or 2 tokens (" the", ",\n") are mostly chance on new text, and each failed draft
// costs a verify row; 3 to 5 tokens keep the copies and drop most of those.
inline constexpr int kNgramMinMatch = 3;
inline constexpr int kNgramMaxMatch = 5;

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int min_n = kNgramMinMatch, int max_n = kNgramMaxMatch);
  std::string name() const override { return "ngram"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  int min_n_;
  int max_n_;
};

}  // namespace mixkv::spec
