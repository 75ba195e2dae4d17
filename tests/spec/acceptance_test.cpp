// Greedy acceptance and the weightless drafters (prompt lookup: ngram_test.cpp).
#include "mixkv/spec/acceptance.hpp"

#include <gtest/gtest.h>

#include "mixkv/core/error.hpp"
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

TEST(Drafters, OracleAndRandomPropose) {
  const std::vector<TokenId> tokens = {1, 2, 3, 1, 2};
  const DraftContext ctx{0, tokens, 4, {}};
  OracleDrafter oracle({{1, 2, 3, 1, 2, 9, 8}});
  EXPECT_EQ(oracle.propose(ctx, 3), (std::vector<TokenId>{9, 8}));
  const DraftContext other{1, tokens, 4, {}};
  EXPECT_TRUE(oracle.propose(other, 3).empty());
  RandomDrafter random(10, 1);
  for (TokenId t : random.propose(ctx, 16)) EXPECT_TRUE(t >= 0 && t < 10);
}

}  // namespace
}  // namespace mixkv::spec
