// The sampler: OpenAI's and vLLM's parameters, applied in vLLM's order, and seeded draws.
#include "mixkv/sample/sampler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "mixkv/runner/model_runner.hpp"
#include "test_support.hpp"

namespace mixkv::sample {
namespace {

std::vector<float> probs_of(const Sampler& s, const std::vector<float>& logits,
                            std::vector<TokenId> pending = {}) {
  std::vector<float> p;
  s.distribution(logits, pending, p);
  return p;
}

SamplingParams at_temperature(double t) {
  SamplingParams p;
  p.temperature = t;
  return p;
}

TEST(Sampler, DefaultsAreGreedyAndPickExactlyTheRunnersArgmaxWithItsTieRule) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  const Sampler s({}, {});
  EXPECT_TRUE(s.greedy());
  EXPECT_EQ(s.pick(logits), runner::argmax(logits));
  EXPECT_EQ(s.pick(logits), 1);  // the lower id of the tie
  EXPECT_EQ(s.next(logits), 1);
  EXPECT_EQ(probs_of(s, logits), (std::vector<float>{0, 1, 0, 0, 0}));
  // vLLM's epsilon: a temperature below 1e-5 is greedy too.
  EXPECT_TRUE(Sampler(at_temperature(1e-6), {}).greedy());
}

TEST(Sampler, TemperatureScalesTheSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.0f};
  for (double t : {0.5, 1.0, 2.0}) {
    const auto p = probs_of(Sampler(at_temperature(t), {}), logits);
    double z = 0;
    for (float l : logits) z += std::exp(l / t);
    for (std::size_t i = 0; i < logits.size(); ++i) {
      EXPECT_NEAR(p[i], std::exp(logits[i] / t) / z, 1e-6) << "t " << t << " token " << i;
    }
  }
}

TEST(Sampler, TopKKeepsTheKLikeliestAndTiesAtTheCut) {
  SamplingParams params = at_temperature(1.0);
  params.top_k = 2;
  const auto p = probs_of(Sampler(params, {}), {1.0f, 3.0f, 2.0f, 0.0f});
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[3], 0);
  EXPECT_NEAR(p[1] + p[2], 1.0, 1e-6);
  EXPECT_NEAR(p[1] / p[2], std::exp(1.0), 1e-5);
  const auto tie = probs_of(Sampler(params, {}), {3.0f, 2.0f, 2.0f, 0.0f});
  EXPECT_GT(tie[1], 0);
  EXPECT_GT(tie[2], 0);
  EXPECT_EQ(tie[3], 0);
  params.top_k = -1;  // vLLM's spelling of "all"
  EXPECT_GT(probs_of(Sampler(params, {}), {3.0f, 2.0f, 2.0f, 0.0f})[3], 0);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.2 (logits are their logs).
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams params = at_temperature(1.0);
  params.top_p = 0.5;
  EXPECT_EQ(probs_of(Sampler(params, {}), logits), (std::vector<float>{1, 0, 0}));
  params.top_p = 0.6;
  auto p = probs_of(Sampler(params, {}), logits);
  EXPECT_NEAR(p[0], 0.625, 1e-6);
  EXPECT_NEAR(p[1], 0.375, 1e-6);
  EXPECT_EQ(p[2], 0);
  params.top_p = 1.0;
  EXPECT_GT(probs_of(Sampler(params, {}), logits)[2], 0);
}

TEST(Sampler, MinPDropsTokensBelowTheFractionOfTheLikeliest) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams params = at_temperature(1.0);
  params.min_p = 0.5;  // floor 0.25
  const auto p = probs_of(Sampler(params, {}), logits);
  EXPECT_NEAR(p[0], 0.625, 1e-6);
  EXPECT_EQ(p[2], 0);
}

TEST(Sampler, PenaltiesFollowVllmOverPromptOutputAndPendingTokens) {
  const std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f};
  SamplingParams params;
  params.repetition_penalty = 2.0;
  Sampler s(params, std::vector<TokenId>{0, 1, 0});
  // Prompt tokens 0 and 1: 2 -> 1 (a positive logit divided), -2 -> -4 (a negative one
  // multiplied); token 0's 1.0 now ties token 2's and the lower id wins.
  auto penalised = logits;
  penalised[0] = 1.0f;
  penalised[1] = -4.0f;
  EXPECT_EQ(s.pick(logits), runner::argmax(penalised));
  EXPECT_EQ(s.pick(logits), 0);
  s.commit(0);  // repeated in the output: penalised once, not twice
  EXPECT_EQ(s.pick(logits), 0);
  s.commit(2);  // an output token is penalised too: token 2's 1.0 -> 0.5
  penalised[2] = 0.5f;
  EXPECT_EQ(s.pick(logits), runner::argmax(penalised));
  SamplingParams hot = params;
  hot.temperature = 1.0;
  const auto p = probs_of(Sampler(hot, std::vector<TokenId>{0, 1}), logits);
  EXPECT_NEAR(p[0] / p[2], 1.0, 1e-6);  // both at logit 1.0
  EXPECT_NEAR(p[3] / p[1] / std::exp(4.5), 1.0, 1e-5);
  SamplingParams freq;
  freq.frequency_penalty = 0.6;
  freq.presence_penalty = 0.5;
  Sampler f(freq, std::vector<TokenId>{0});  // the prompt does not count for these two
  EXPECT_EQ(f.pick(logits), 0);
  f.commit(0);  // 2 - 0.6 - 0.5 = 0.9 < 1.0
  EXPECT_EQ(f.pick(logits), 2);
  // A pending draft counts as an output token for the positions after it.
  EXPECT_EQ(f.pick(logits, std::vector<TokenId>{2}), 0);     // token 2: 1.0 - 1.1 < 0.9
  EXPECT_EQ(f.pick(logits, std::vector<TokenId>{2, 0}), 3);  // token 0: 2 - 1.2 - 0.5 < 0.5
}

TEST(Sampler, SeededDrawsAreReproducibleAndDependOnSeedAndPositionOnly) {
  std::vector<float> logits(64);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  auto run = [&](std::uint64_t seed) {
    SamplingParams params = at_temperature(1.0);
    params.seed = seed;
    Sampler s(params, {});
    std::vector<TokenId> out;
    for (int i = 0; i < 32; ++i) {
      out.push_back(s.next(logits));
      s.commit(out.back());
    }
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
  EXPECT_EQ(uniform(3, 10, Stream::kSample), uniform(3, 10, Stream::kSample));
  EXPECT_NE(uniform(3, 10, Stream::kSample), uniform(3, 10, Stream::kAccept));
  EXPECT_NE(uniform(3, 10, Stream::kSample), uniform(3, 11, Stream::kSample));
  // Uniform enough: the mean of many draws is near 1/2 and every draw is in [0, 1).
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = uniform(42, i, Stream::kSample);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
}

TEST(Sampler, DrawWalksTheCumulativeSumInIdOrder) {
  const std::vector<float> p = {0.0f, 0.25f, 0.0f, 0.75f};
  EXPECT_EQ(draw(p, 0.0), 1);
  EXPECT_EQ(draw(p, 0.2499), 1);
  EXPECT_EQ(draw(p, 0.25), 3);
  EXPECT_EQ(draw(p, 0.999999999), 3);
  EXPECT_THROW(draw(std::vector<float>{0.0f, 0.0f}, 0.5), Error);
}

TEST(SamplerErrors, OutOfRangeParametersNameTheFieldAndRange) {
  auto expect_refused = [](SamplingParams p, std::initializer_list<std::string_view> parts) {
    testing::expect_error([&] { validate(p); }, ErrorCode::kInvalidInput, parts);
    testing::expect_error([&] { Sampler(p, {}); }, ErrorCode::kInvalidInput, parts);
  };
  SamplingParams p;
  p.temperature = -0.5;
  expect_refused(p, {"temperature = -0.5", ">= 0"});
  p = {};
  p.temperature = std::nan("");
  expect_refused(p, {"temperature"});
  p = {};
  p.top_p = 0;
  expect_refused(p, {"top_p = 0", "(0, 1]"});
  p = {};
  p.top_k = -2;
  expect_refused(p, {"top_k = -2"});
  p = {};
  p.min_p = 1.5;
  expect_refused(p, {"min_p = 1.5", "[0, 1]"});
  p = {};
  p.repetition_penalty = 0;
  expect_refused(p, {"repetition_penalty = 0", "> 0"});
  p = {};
  p.presence_penalty = 2.5;
  expect_refused(p, {"presence_penalty = 2.5", "[-2, 2]"});
  p = {};
  p.frequency_penalty = -3;
  expect_refused(p, {"frequency_penalty = -3", "[-2, 2]"});
}

}  // namespace
}  // namespace mixkv::sample
