// Greedy acceptance and the weightless drafters.
#include "mixkv/spec/acceptance.hpp"

#include <gtest/gtest.h>

#include "mixkv/core/error.hpp"
#include "mixkv/spec/ngram.hpp"
#include "mixkv/spec/oracle.hpp"
#include "mixkv/spec/random.hpp"

namespace mixkv::spec {
namespace {

TEST(AcceptGreedy, AcceptsTheMatchingPrefixAndTakesThePickAtTheFirstMismatch) {
  const std::vector<TokenId> drafts = {5, 6, 7};
  EXPECT_EQ(accept_greedy(drafts, std::vector<TokenId>{5, 6, 7, 8}).tokens,
            (std::vector<TokenId>{5, 6, 7, 8}));
  const Verdict v = accept_greedy(drafts, std::vector<TokenId>{5, 9, 7, 8});
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.tokens, (std::vector<TokenId>{5, 9}));
  EXPECT_EQ(accept_greedy({}, std::vector<TokenId>{4}).tokens, std::vector<TokenId>{4});
  EXPECT_THROW(accept_greedy(drafts, std::vector<TokenId>{5}), Error);
}

TEST(Drafters, OracleNgramAndRandomPropose) {
  const std::vector<TokenId> tokens = {1, 2, 3, 1, 2};
  const DraftContext ctx{0, tokens, 4, {}};
  EXPECT_EQ(NgramDrafter(1, 3).propose(ctx, 3), (std::vector<TokenId>{3, 1, 2}));
  // The default lookup wants 3 matching tokens: a 2-token match is chance on new text.
  EXPECT_TRUE(NgramDrafter().propose(ctx, 3).empty());
  const std::vector<TokenId> cycle = {4, 1, 2, 3, 1, 2, 3};
  EXPECT_EQ(NgramDrafter().propose({0, cycle, 6, {}}, 4), (std::vector<TokenId>{1, 2, 3, 1}));
  // No more than the scheduler will verify.
  EXPECT_EQ(NgramDrafter().propose({0, cycle, 6, {}, 2}, 4), (std::vector<TokenId>{1, 2}));
  // The longest match wins over a later, shorter one: "5 1 2 3" occurred once (followed by 8),
  // "1 2 3" last before 9.
  const std::vector<TokenId> copy = {5, 1, 2, 3, 8, 7, 1, 2, 3, 9, 5, 1, 2, 3};
  EXPECT_EQ(NgramDrafter().propose({0, copy, 13, {}}, 2), (std::vector<TokenId>{8, 7}));
  // On equally long matches, the latest.
  const std::vector<TokenId> twice = {1, 2, 3, 8, 4, 1, 2, 3, 9, 4, 1, 2, 3};
  EXPECT_EQ(NgramDrafter().propose({0, twice, 12, {}}, 1), (std::vector<TokenId>{9}));
  // At most max_n tokens are compared: beyond, the latest of the long matches.
  const std::vector<TokenId> longer = {6, 1, 2, 3, 8, 0, 1, 2, 3, 9, 6, 1, 2, 3};
  EXPECT_EQ(NgramDrafter(3, 3).propose({0, longer, 13, {}}, 1), (std::vector<TokenId>{9}));
  EXPECT_EQ(NgramDrafter(3, 4).propose({0, longer, 13, {}}, 1), (std::vector<TokenId>{8}));
  OracleDrafter oracle({{1, 2, 3, 1, 2, 9, 8}});
  EXPECT_EQ(oracle.propose(ctx, 3), (std::vector<TokenId>{9, 8}));
  const DraftContext other{1, tokens, 4, {}};
  EXPECT_TRUE(oracle.propose(other, 3).empty());
  RandomDrafter random(10, 1);
  for (TokenId t : random.propose(ctx, 16)) EXPECT_TRUE(t >= 0 && t < 10);
  EXPECT_THROW(NgramDrafter(0, 2), Error);
}

}  // namespace
}  // namespace mixkv::spec
