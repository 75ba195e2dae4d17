// Speculative sampling keeps the target's distribution: chi-square tests over seeded runs on a
// tiny model's logits, with drafts the target often rejects, and the same test failing when the
// rejected draft's replacement is drawn from the wrong distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/model/architecture.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/acceptance.hpp"

namespace mixkv::spec {
namespace {

// Regularised upper incomplete gamma Q(a, x): the series for x < a + 1, else the continued
// fraction (modified Lentz), both to double precision.
double upper_gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_front = a * std::log(x) - x - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 1000 && std::abs(term) > 1e-16 * std::abs(sum); ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_front);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1) < 1e-16) break;
  }
  return std::exp(log_front) * h;
}

// Pearson's chi-square p-value of `counts` against `probs`, categories with an expected count
// under 5 pooled into one.
double chi_square_p(const std::map<TokenId, int>& counts, const std::vector<float>& probs,
                    int total) {
  double stat = 0, pooled_expected = 0, pooled_observed = 0;
  int categories = 0;
  for (std::size_t t = 0; t < probs.size(); ++t) {
    const double expected = probs[t] * total;
    const auto it = counts.find(static_cast<TokenId>(t));
    const double observed = it == counts.end() ? 0 : it->second;
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += observed;
      continue;
    }
    stat += (observed - expected) * (observed - expected) / expected;
    ++categories;
  }
  if (pooled_expected > 0) {
    stat +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++categories;
  }
  return upper_gamma_q((categories - 1) / 2.0, stat / 2);
}

// tiny-swa's logits at the last three positions of prompt + [d1, d2]: the target's rows for
// the token after the prompt, after d1 and after d2, as one verify step computes them.
std::vector<float> verify_logits(const std::vector<TokenId>& tokens) {
  const engine::TinyModel& m = *engine::find_tiny_model("tiny-swa");
  const model::ModelSource src = engine::tiny_model_source(m);
  runner::ModelRunner runner(
      src,
      runner::generate_weights(model::read_architecture(src),
                               model::describe(src, std::nullopt, {}), m.seed),
      {});
  cache::KvCacheManager manager(runner.plan(), 0);
  const cache::RequestId id{0};
  manager.add_request(id, tokens);
  EXPECT_EQ(manager.admit(id, 0), 0);
  runner::SequenceInput in;
  in.tokens = tokens;
  for (std::size_t g = 0; g < runner.plan().groups.size(); ++g) {
    in.block_tables.push_back(manager.block_table(id, static_cast<int>(g)));
  }
  const runner::ForwardOutput out = runner.forward(std::span(&in, 1));
  const auto vocab = static_cast<std::size_t>(runner.vocab_size());
  return {out.logits.end() - static_cast<std::ptrdiff_t>(3 * vocab), out.logits.end()};
}

struct Histograms {
  std::map<TokenId, int> first;
  std::map<TokenId, int> second_after_d1;  // the second token, where d1 was accepted
  int first_total = 0, second_total = 0;
};

constexpr int kSamples = 20000;

Histograms run_speculative(const sample::SamplingParams& params, const std::vector<TokenId>& prompt,
                           const std::vector<TokenId>& drafts, const std::vector<float>& logits,
                           std::size_t vocab, std::span<const float> draft_probs,
                           Resample resample) {
  Histograms h;
  for (int s = 0; s < kSamples; ++s) {
    sample::SamplingParams p = params;
    p.seed = static_cast<std::uint64_t>(s) + 1;
    const sample::Sampler sampler(p, prompt);
    const Verdict v = accept_sampled(sampler, drafts, logits, vocab, draft_probs, resample);
    ++h.first[v.tokens[0]];
    ++h.first_total;
    if (v.accepted >= 1) {
      ++h.second_after_d1[v.tokens.at(1)];
      ++h.second_total;
    }
  }
  return h;
}

class SpeculativeSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    prompt = engine::encode_bytes("the quick brown fox");
    params.temperature = 1.0;
    params.top_k = 40;
    // Drafts: d1 a token the target gives some but not most probability (often rejected), d2
    // the target's likeliest after it.
    auto probe = prompt;
    probe.push_back(0);
    probe.push_back(0);
    const auto rough = verify_logits(probe);
    vocab = rough.size() / 3;
    const sample::Sampler sampler(params, prompt);
    std::vector<float> p1;
    sampler.distribution(std::span(rough).first(vocab), {}, p1);
    std::vector<std::pair<float, TokenId>> ranked;
    for (std::size_t t = 0; t < vocab; ++t) ranked.emplace_back(p1[t], static_cast<TokenId>(t));
    std::sort(ranked.rbegin(), ranked.rend());
    const TokenId d1 = ranked[3].second;
    auto with_d1 = prompt;
    with_d1.push_back(d1);
    with_d1.push_back(0);
    const auto row2 = verify_logits(with_d1);
    const TokenId d2 = runner::argmax(std::span(row2).subspan(vocab, vocab));
    drafts = {d1, d2};
    auto tokens = prompt;
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    logits = verify_logits(tokens);
    sampler.distribution(std::span(logits).first(vocab), {}, target_first);
    sampler.distribution(std::span(logits).subspan(vocab, vocab), std::vector<TokenId>{d1},
                         target_second);
  }

  sample::SamplingParams params;
  std::vector<TokenId> prompt, drafts;
  std::vector<float> logits, target_first, target_second;
  std::size_t vocab = 0;
};

TEST_F(SpeculativeSampling, OneHotDraftsKeepTheTargetsDistributionAtBothPositions) {
  ASSERT_GT(target_first[static_cast<std::size_t>(drafts[0])], 0.01);
  ASSERT_LT(target_first[static_cast<std::size_t>(drafts[0])], 0.5);  // rejected more often
  const Histograms h =
      run_speculative(params, prompt, drafts, logits, vocab, {}, Resample::kResidual);
  EXPECT_GT(chi_square_p(h.first, target_first, h.first_total), 0.001);
  ASSERT_GT(h.second_total, 200);
  EXPECT_GT(chi_square_p(h.second_after_d1, target_second, h.second_total), 0.001);
  // Plain sampling over the same seeds, for reference, fits too.
  std::map<TokenId, int> plain;
  for (int s = 0; s < kSamples; ++s) {
    sample::SamplingParams p = params;
    p.seed = static_cast<std::uint64_t>(s) + 1;
    ++plain[sample::Sampler(p, prompt).next(std::span(logits).first(vocab))];
  }
  EXPECT_GT(chi_square_p(plain, target_first, kSamples), 0.001);
}

TEST_F(SpeculativeSampling, DraftsDrawnFromADrafterDistributionKeepTheTargetsDistribution) {
  // One draft per step, drawn from q: uniform over the target's top-40 set (the guarantee
  // holds for any q the draft is really drawn from). The bonus row is d1's; it does not change
  // the first token.
  std::vector<float> q(vocab, 0.0f);
  std::vector<TokenId> support;
  for (std::size_t t = 0; t < vocab; ++t) {
    if (target_first[t] > 0) support.push_back(static_cast<TokenId>(t));
  }
  for (TokenId t : support)
    q[static_cast<std::size_t>(t)] = 1.0f / static_cast<float>(support.size());
  const std::span<const float> rows = std::span(logits).first(2 * vocab);
  std::map<TokenId, int> first;
  for (int s = 0; s < kSamples; ++s) {
    sample::SamplingParams p = params;
    p.seed = static_cast<std::uint64_t>(s) + 1;
    const sample::Sampler sampler(p, prompt);
    // The drafter's own draw, on a stream of its own.
    const double u = sample::uniform(p.seed ^ 0x5eed, 0, sample::Stream::kSample);
    const std::vector<TokenId> draft = {
        support[static_cast<std::size_t>(u * static_cast<double>(support.size()))]};
    ++first[accept_sampled(sampler, draft, rows, vocab, q).tokens[0]];
  }
  EXPECT_GT(chi_square_p(first, target_first, kSamples), 0.001);
}

TEST_F(SpeculativeSampling, TheTestCatchesAReplacementDrawnFromTheTargetInsteadOfTheResidual) {
  const Histograms h =
      run_speculative(params, prompt, drafts, logits, vocab, {}, Resample::kTarget);
  EXPECT_LT(chi_square_p(h.first, target_first, h.first_total), 0.001);
}

TEST_F(SpeculativeSampling, GreedyParametersGiveGreedyAcceptance) {
  const sample::Sampler greedy({}, prompt);
  std::vector<TokenId> picks;
  for (std::size_t i = 0; i < 3; ++i) {
    picks.push_back(runner::argmax(std::span(logits).subspan(i * vocab, vocab)));
  }
  EXPECT_EQ(accept_sampled(greedy, drafts, logits, vocab).tokens,
            accept_greedy(drafts, picks).tokens);
}

TEST(ChiSquare, PValueMatchesKnownQuantiles) {
  // chi-square with 10 degrees of freedom: P(X > 18.307) = 0.05, P(X > 29.588) = 0.001.
  EXPECT_NEAR(upper_gamma_q(5, 18.307 / 2), 0.05, 1e-4);
  EXPECT_NEAR(upper_gamma_q(5, 29.588 / 2), 0.001, 1e-5);
  EXPECT_NEAR(upper_gamma_q(0.5, 3.841 / 2), 0.05, 1e-4);  // 1 degree of freedom
}

}  // namespace
}  // namespace mixkv::spec
