// Prompt lookup's rules on hand-written token sequences: which occurrence it copies, how it
// follows a copy across steps and across a one-token edit, and the estimates it gives the
// scheduler for its drafts.
#include "mixkv/spec/ngram.hpp"

#include <gtest/gtest.h>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {
namespace {

using Tokens = std::vector<TokenId>;

DraftContext at(const Tokens& tokens, std::size_t request = 0) {
  return {request, tokens, static_cast<std::int64_t>(tokens.size()) - 1, {}};
}

TEST(NgramDrafter, CopiesTheLongestMatchTheLatestOnTiesUpToMaxN) {
  const Tokens tokens = {1, 2, 3, 1, 2};
  EXPECT_EQ(NgramDrafter(1, 3).propose(at(tokens), 3), (Tokens{3, 1, 2}));
  // The default lookup wants 2 matching tokens: one is chance on new text, unless every
  // earlier occurrence of the token went on the same way (seen once, or always before the same
  // token: an identifier, not " the"); then the latest occurrence's continuation.
  EXPECT_TRUE(NgramDrafter().propose(at({4, 5, 4, 6, 4}), 3).empty());
  EXPECT_EQ(NgramDrafter().propose(at({4, 5, 6, 4}), 3), (Tokens{5, 6, 4}));
  EXPECT_EQ(NgramDrafter().propose(at({4, 5, 7, 4, 5, 8, 4}), 3), (Tokens{5, 8, 4}));
  EXPECT_EQ(NgramDrafter().propose(at({4, 5, 6, 4, 5}), 3), (Tokens{6, 4, 5}));
  // A cycle is read on through the proposal itself; never more than the scheduler verifies.
  const Tokens cycle = {4, 1, 2, 3, 1, 2, 3};
  EXPECT_EQ(NgramDrafter().propose(at(cycle), 4), (Tokens{1, 2, 3, 1}));
  EXPECT_EQ(NgramDrafter().propose({0, cycle, 6, {}, 2}, 4), (Tokens{1, 2}));
  // The longest match wins over a later, shorter one: "5 1 2 3" occurred once (followed by 8),
  // "1 2 3" last before 9.
  const Tokens copy = {5, 1, 2, 3, 8, 7, 1, 2, 3, 9, 5, 1, 2, 3};
  EXPECT_EQ(NgramDrafter().propose(at(copy), 2), (Tokens{8, 7}));
  // On equally long matches, the latest.
  const Tokens twice = {1, 2, 3, 8, 1, 2, 3, 9, 1, 2, 3};
  EXPECT_EQ(NgramDrafter().propose(at(twice), 1), (Tokens{9}));
  // At most max_n tokens are compared: beyond, the latest of the long matches.
  const Tokens longer = {6, 1, 2, 3, 8, 0, 1, 2, 3, 9, 6, 1, 2, 3};
  EXPECT_EQ(NgramDrafter(3, 3).propose(at(longer), 1), (Tokens{9}));
  EXPECT_EQ(NgramDrafter(3, 4).propose(at(longer), 1), (Tokens{8}));
  EXPECT_THROW(NgramDrafter(0, 2), Error);
  EXPECT_THROW(NgramDrafter(3, 2), Error);
}

TEST(NgramDrafter, FollowsTheSpanItCopiesOverALaterEquallyLongMatch) {
  // "5 6" occurs once, before "7 8": that span is copied. Once the text took its 7, "6 7"
  // matches there and, later, before 9 (both 2 long at max_n 2): the followed span goes on.
  Tokens text = {5, 6, 7, 8, 0, 6, 7, 9, 0, 5, 6};
  NgramDrafter d(2, 2);
  EXPECT_EQ(d.propose(at(text), 2), (Tokens{7, 8}));
  text.push_back(7);
  EXPECT_EQ(d.propose(at(text), 2), (Tokens{8, 0}));
  // A fresh drafter has no span to follow: the latest match.
  EXPECT_EQ(NgramDrafter(2, 2).propose(at(text), 2), (Tokens{9, 0}));
  // Nor has another request.
  EXPECT_EQ(d.propose(at(text, 1), 2), (Tokens{9, 0}));
}

TEST(NgramDrafter, ResumesACopyAfterAOneTokenEdit) {
  // The prompt's "10 .. 17", copied with 14 replaced by 99 (a renamed variable).
  const Tokens prompt = {10, 11, 12, 13, 14, 15, 16, 17, 1};
  Tokens text = prompt;
  text.insert(text.end(), {10, 11, 12});
  NgramDrafter d;
  EXPECT_EQ(d.propose(at(text), 3), (Tokens{13, 14, 15}));
  text.insert(text.end(), {13, 99});  // 13 accepted, then the edit
  // "99" occurs nowhere: the copy resumes after the token it replaced.
  EXPECT_EQ(d.propose(at(text), 3), (Tokens{15, 16, 17}));
  // Without the followed copy (a fresh drafter) there is nothing to propose.
  EXPECT_TRUE(NgramDrafter().propose(at(text), 3).empty());

  // A short chance match that the next token leaves is no copy: nothing resumes.
  Tokens chance = {20, 21, 22, 23, 24, 2, 20, 21};
  NgramDrafter c;
  EXPECT_EQ(c.propose(at(chance), 2), (Tokens{22, 23}));
  chance.push_back(98);
  EXPECT_TRUE(c.propose(at(chance), 2).empty());
}

TEST(NgramDrafter, ResumesACopyWhereAnEditInsertedOrDroppedTokens) {
  // 14 occurs twice, so that a token seen once does not find the copy on its own.
  const Tokens prompt = {14, 2, 10, 11, 12, 13, 14, 15, 16, 17, 1};
  // 13 rewritten as two tokens (a corrected spelling that tokenizes longer): "97 98" occurs
  // nowhere, and once the copy goes on with 14 no two tokens match; 14 lies just after the
  // place the copy had reached, so the copy resumes after it.
  Tokens text = prompt;
  text.insert(text.end(), {10, 11, 12});
  NgramDrafter d;
  EXPECT_EQ(d.propose(at(text), 3), (Tokens{13, 14, 15}));
  text.insert(text.end(), {97, 98});
  EXPECT_TRUE(d.propose(at(text), 3).empty());
  text.push_back(14);
  EXPECT_EQ(d.propose(at(text), 3), (Tokens{15, 16, 17}));
  EXPECT_TRUE(NgramDrafter().propose(at(text), 3).empty());  // no copy to resume

  // 13 dropped: the copy resumes after 14, one token before the place it had reached.
  Tokens dropped = prompt;
  dropped.insert(dropped.end(), {10, 11, 12});
  NgramDrafter e;
  EXPECT_EQ(e.propose(at(dropped), 3), (Tokens{13, 14, 15}));
  dropped.push_back(14);
  EXPECT_EQ(e.propose(at(dropped), 3), (Tokens{15, 16, 17}));
  // Another request has no copy of its own to resume.
  EXPECT_TRUE(e.propose(at(dropped, 1), 3).empty());

  // An occurrence further than kResyncAfter past that place is not taken for the copy's.
  Tokens far = {14, 10, 11, 12, 13, 3, 4, 5, 6, 7, 8, 0, 9, 2, 2, 14, 15, 1, 10, 11, 12};
  NgramDrafter f;
  EXPECT_EQ(f.propose(at(far), 2), (Tokens{13, 3}));
  far.insert(far.end(), {97, 14});
  EXPECT_TRUE(f.propose(at(far), 2).empty());
}

TEST(NgramDrafter, PassesOverAnOccurrenceThatEndsAMessage) {
  // A prompt quoting code between fences (7 opens it, 5 6 the code, 7 closes it, then the end
  // of turn 0), and an answer that opens its own fence: "1 7" occurs twice, and the latest is
  // followed by the end of turn. The answer goes on as after the opening fence.
  const Tokens text = {1, 7, 5, 6, 1, 7, 0, 9, 1, 7};
  const Tokens stops = {0};
  DraftContext ctx = at(text);
  EXPECT_EQ(NgramDrafter().propose(ctx, 3), (Tokens{0, 9, 1}));  // not told what ends a turn
  ctx.stop_tokens = stops;
  EXPECT_EQ(NgramDrafter().propose(ctx, 3), (Tokens{5, 6, 1}));
  // Nor is a token seen once copied into the end of a turn.
  const Tokens once = {3, 4, 5, 0, 4};
  DraftContext c = at(once);
  EXPECT_EQ(NgramDrafter().propose(c, 2), (Tokens{5, 0}));
  const Tokens ended = {3, 5, 4, 0, 4};
  DraftContext e = at(ended);
  e.stop_tokens = stops;
  EXPECT_TRUE(NgramDrafter().propose(e, 2).empty());
}

TEST(NgramDrafter, EstimatesLearnFromTheTokensThatFollowedItsProposals) {
  NgramDrafter d;
  // Each draft's estimate is the drafter's for its match length and position.
  const Tokens text = {1, 2, 3, 9, 1, 2};
  const Tokens drafts = d.propose(at(text), 3);
  ASSERT_EQ(drafts, (Tokens{3, 9, 1}));
  const std::span<const double> c = d.confidence(0);
  ASSERT_EQ(c.size(), 3u);
  for (int j = 0; j < 3; ++j) EXPECT_DOUBLE_EQ(c[static_cast<std::size_t>(j)], d.estimate(2, j));
  EXPECT_TRUE(d.confidence(1).empty());
  // A 2-token match keeps being wrong: its estimate falls, whether or not its drafts were
  // verified (the text after them tells).
  const double before = d.estimate(2, 0);
  Tokens wrong = {1, 2, 3, 9, 1, 2};
  for (TokenId t = 50; t < 56; ++t) {
    wrong.push_back(t);  // never the proposed 3
    wrong.insert(wrong.end(), {1, 2});
    d.propose(at(wrong), 2);
  }
  EXPECT_LT(d.estimate(2, 0), before / 2);
  // A long copy keeps being right: its estimates rise.
  Tokens right(40);
  for (std::size_t i = 0; i < right.size(); ++i) right[i] = static_cast<TokenId>(100 + i);
  right.push_back(0);
  const double long_before = d.estimate(NgramDrafter::kLengths - 1, 0);
  Tokens copy = right;
  copy.insert(copy.end(), right.begin(), right.begin() + 8);
  for (std::size_t i = 8; i < 30; ++i) {
    EXPECT_EQ(d.propose(at(copy, 2), 1), (Tokens{right[i]}));
    copy.push_back(right[i]);
  }
  EXPECT_GT(d.estimate(NgramDrafter::kLengths - 1, 0), long_before);
  // A request forgotten (finished, preempted) has no estimate left to give.
  d.forget(2);
  EXPECT_TRUE(d.confidence(2).empty());
}

// Two requests share a drafter (a batch): one whose first drafts keep missing falls back on its
// own. Its first draft's confidence ends below the other request's for a match of the same
// length and position (the shared estimate is the same for both), and its factor climbs back
// once its drafts pass; a forgotten request starts over at 1.
TEST(NgramDrafter, ARequestWhoseDraftsKeepMissingFallsBackAlone) {
  NgramDrafter d;
  Tokens wrong = {1, 2, 3, 9, 1, 2};
  for (TokenId t = 50; t < 56; ++t) {
    d.propose(at(wrong, 0), 2);
    wrong.push_back(t);  // never the proposed 3
    wrong.insert(wrong.end(), {1, 2});
  }
  EXPECT_LT(d.request_factor(0), 0.5);
  EXPECT_EQ(d.request_factor(1), 1.0);
  ASSERT_EQ(d.propose(at(wrong, 0), 2).size(), 2u);
  const Tokens other = {7, 8, 30, 9, 7, 8};
  ASSERT_EQ(d.propose(at(other, 1), 2), (Tokens{30, 9}));
  const double missing = d.confidence(0)[0], fresh = d.confidence(1)[0];
  EXPECT_DOUBLE_EQ(fresh, d.estimate(2, 0));
  EXPECT_NEAR(missing, fresh * d.request_factor(0), 1e-12);
  EXPECT_DOUBLE_EQ(d.confidence(0)[1], d.confidence(1)[1]);  // later drafts: the shared estimate
  // Request 0 now copies a long span: its drafts pass and its factor climbs back.
  const double low = d.request_factor(0);
  Tokens span(20);
  for (std::size_t i = 0; i < span.size(); ++i) span[i] = static_cast<TokenId>(200 + i);
  Tokens copy = wrong;
  copy.insert(copy.end(), span.begin(), span.end());
  copy.push_back(0);
  copy.insert(copy.end(), span.begin(), span.begin() + 4);
  for (std::size_t i = 4; i < 16; ++i) {
    d.propose(at(copy, 0), 1);
    copy.push_back(span[i]);
  }
  EXPECT_GT(d.request_factor(0), 2 * low);
  d.forget(0);
  EXPECT_EQ(d.request_factor(0), 1.0);
}

}  // namespace
}  // namespace mixkv::spec
