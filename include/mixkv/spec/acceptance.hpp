// Greedy acceptance of a chain of drafts: the rule that makes speculative decoding give exactly
// the tokens of plain greedy decoding (R9 of the brief).
#pragma once

#include <span>
#include <vector>

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

}  // namespace mixkv::spec
