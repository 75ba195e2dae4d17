// Prompt lookup (n-gram) drafting, as vLLM's "ngram" method: find the most recent earlier
// occurrence of the last n tokens (n from max_n down to min_n) and propose what followed it,
// extended through its own proposal so a repeating cycle yields k tokens. No weights: greedy
// output that repeats itself (as small models' does) is predicted well, anything else not at all.
#pragma once

#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int min_n = 1, int max_n = 3);
  std::string name() const override { return "ngram"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  int min_n_;
  int max_n_;
};

}  // namespace mixkv::spec
