// The draft-length policy with fixed step costs (never the machine's timings): drafts that fail
// are not paid for, drafts that pass are taken up to k, a drafter's own forward counts, and under
// batching the step's drafts shrink to what its shared weight pass makes worth verifying.
#include "mixkv/sched/draft_policy.hpp"

#include <gtest/gtest.h>

#include <numeric>

#include "mixkv/core/error.hpp"

namespace mixkv::sched {
namespace {

std::vector<double> flat(double p, int k = 4) { return std::vector<double>(k, p); }

TEST(DraftPolicy, TakesNoDraftsThatFailAndAllThatPass) {
  const LinearStepCost cost(1.0, 0.25);
  const auto bad = flat(0.1), good = flat(0.9);
  EXPECT_EQ(choose_draft_lengths(cost, 1, std::vector<DraftCandidate>{{4, bad}}, false),
            std::vector<int>{0});
  EXPECT_EQ(choose_draft_lengths(cost, 1, std::vector<DraftCandidate>{{4, good}}, false),
            std::vector<int>{4});
  // Only what the drafter proposed can be verified.
  EXPECT_EQ(choose_draft_lengths(cost, 1, std::vector<DraftCandidate>{{2, good}}, false),
            std::vector<int>{2});
  // Acceptance that falls along the chain stops it where the next row stops paying:
  // 1 + 0.9 + 0.45 over 1.5 beats 1 + 0.9 + 0.45 + 0.045 over 1.75.
  const std::vector<double> falling = {0.9, 0.5, 0.1, 0.1};
  EXPECT_EQ(choose_draft_lengths(cost, 1, std::vector<DraftCandidate>{{4, falling}}, false),
            std::vector<int>{2});
  // A probe is taken whatever it costs.
  EXPECT_EQ(choose_draft_lengths(cost, 1, std::vector<DraftCandidate>{{4, bad, 1}}, false),
            std::vector<int>{1});
}

TEST(DraftPolicy, ADrafterThatRunsAForwardPerDraftPaysForIt) {
  // Each chain position costs 0.4 of a decode step (a self drafter of 12 of 30 layers).
  const LinearStepCost cost(1.0, 0.25, 0.4);
  const auto p = flat(0.75);
  const std::vector<DraftCandidate> one = {{4, p}};
  // Free drafts: 1 + 0.75 + 0.56 + 0.42 over 1.75 is the best rate.
  EXPECT_EQ(choose_draft_lengths(cost, 1, one, false), std::vector<int>{3});
  // 1 + 0.75 over 1.65 pays; the next draft adds 0.56 tokens for 0.65 more.
  EXPECT_EQ(choose_draft_lengths(cost, 1, one, true), std::vector<int>{1});
  const auto weak = flat(0.5);
  EXPECT_EQ(choose_draft_lengths(cost, 1, std::vector<DraftCandidate>{{4, weak}}, true),
            std::vector<int>{0});
}

TEST(DraftPolicy, CapsTheStepsDraftsUnderBatching) {
  // A weight pass shared by up to 16 rows, then compute-bound rows that cost a step each.
  class KneeCost final : public StepCost {
   public:
    double step(std::int64_t rows) const override {
      return 1.0 + 0.05 * static_cast<double>(std::min<std::int64_t>(rows, 16) - 1) +
             1.0 * static_cast<double>(std::max<std::int64_t>(rows - 16, 0));
    }
    double draft(int) const override { return 0.0; }
  } cost;
  const auto p = flat(0.8);
  const auto total = [](const std::vector<int>& v) { return std::reduce(v.begin(), v.end()); };
  const std::vector<DraftCandidate> one = {{4, p}};
  EXPECT_EQ(choose_draft_lengths(cost, 1, one, false), std::vector<int>{4});
  const std::vector<DraftCandidate> eight(8, DraftCandidate{4, p});
  const std::vector<int> got = choose_draft_lengths(cost, 8, eight, false);
  EXPECT_EQ(total(got), 8);  // what fits the shared pass, not 8 x 4
  // The first drafts of each request come before anyone's second (they are likelier accepted).
  for (int d : got) EXPECT_EQ(d, 1);
  // Sixteen requests fill the pass alone: plain decoding.
  const std::vector<DraftCandidate> sixteen(16, DraftCandidate{4, p});
  EXPECT_EQ(total(choose_draft_lengths(cost, 16, sixteen, false)), 0);
  // An explicit cap holds whatever the cost says.
  const LinearStepCost cheap(1.0, 0.01);
  const std::vector<int> capped = choose_draft_lengths(cheap, 8, eight, false, 5);
  EXPECT_EQ(total(capped), 5);
  // The likelier request gets the drafts first.
  const auto high = flat(0.95), low = flat(0.6);
  const std::vector<DraftCandidate> mixed = {{4, low}, {4, high}};
  EXPECT_EQ(choose_draft_lengths(cheap, 2, mixed, false, 4), (std::vector<int>{0, 4}));
}

TEST(DraftPolicy, AcceptanceEstimateFollowsTheVerifySteps) {
  AcceptanceEstimate e(4, 0.5);
  e.update(4, 2, 0.5);  // positions 0, 1 accepted, 2 rejected, 3 unseen
  EXPECT_EQ(std::vector<double>(e.conditional().begin(), e.conditional().end()),
            (std::vector<double>{0.75, 0.75, 0.25, 0.25}));
  // A chain kept at 2 that always passes: the undrafted positions follow the last drafted one.
  AcceptanceEstimate short_chain(4, 0.5);
  short_chain.update(2, 2, 0.5);
  EXPECT_EQ(std::vector<double>(short_chain.conditional().begin(), short_chain.conditional().end()),
            (std::vector<double>{0.75, 0.75, 0.75, 0.75}));
  e.update(1, 1, 0.5);  // one drafted, accepted
  EXPECT_DOUBLE_EQ(e.conditional()[0], 0.875);
  e.update(0, 0, 0.5);  // nothing drafted: nothing learnt
  EXPECT_DOUBLE_EQ(e.conditional()[0], 0.875);
}

TEST(DraftPolicy, MeasuredCostFollowsTheStepsItSaw) {
  MeasuredStepCost m;
  // Nothing measured: the prior, in one-row steps.
  EXPECT_DOUBLE_EQ(m.step(1), 1.0);
  EXPECT_DOUBLE_EQ(m.step(5), 1.0 + 4 * MeasuredStepCost::kPriorPerRow);
  EXPECT_DOUBLE_EQ(m.draft(3), 0.0);
  // One row count measured: the prior's shape scales it.
  for (int i = 0; i < 4; ++i) m.observe_step(1, 0.010);
  EXPECT_NEAR(m.step(1), 0.010, 1e-12);
  EXPECT_NEAR(m.step(3), 0.010 * (1 + 2 * MeasuredStepCost::kPriorPerRow), 1e-9);
  // Several counts of an affine truth: the local fit recovers it, between and past them.
  for (int rows = 2; rows <= 5; ++rows) {
    for (int i = 0; i < 4; ++i) m.observe_step(rows, 0.010 + 0.002 * (rows - 1));
  }
  EXPECT_EQ(m.measured_rows(), 5);
  EXPECT_NEAR(m.step(4), 0.016, 1e-6);
  EXPECT_NEAR(m.step(7), 0.022, 1e-4);
  m.observe_draft(2, 0.004);
  EXPECT_NEAR(m.draft(3), 0.006, 1e-12);
  EXPECT_THROW(LinearStepCost(0.0, 1.0), Error);
}

}  // namespace
}  // namespace mixkv::sched
