// Sampling through the engine: seeded runs are reproducible and independent of the batch; greedy
// parameters with penalties stay bit-identical under speculation; speculative sampling runs with
// every kind of drafter; a model without logits refuses sampled requests.
#include <gtest/gtest.h>

#include "engine_test_support.hpp"
#include "mixkv/core/error.hpp"
#include "test_support.hpp"

namespace mixkv::engine {
namespace {

std::vector<std::vector<TokenId>> two_prompts() {
  return {encode_bytes("Once upon a time, in a paged cache,"), encode_bytes("The quick brown")};
}

GenerateOptions sampled(std::uint64_t seed) {
  GenerateOptions o;
  o.max_tokens = 48;
  o.sampling.temperature = 0.9;
  o.sampling.top_k = 50;
  o.sampling.top_p = 0.95;
  o.sampling.seed = seed;
  return o;
}

TEST(Sampling, SeededRunsAreReproducibleAndDoNotDependOnTheBatch) {
  ModelRunner runner = testing::tiny_runner("tiny-swa");
  const auto prompts = two_prompts();
  const GenerateReport a = generate(runner, prompts, nullptr, sampled(11));
  const GenerateReport b = generate(runner, prompts, nullptr, sampled(11));
  testing::expect_same_tokens(a, b, "the same seed twice");
  const GenerateReport c = generate(runner, prompts, nullptr, sampled(12));
  EXPECT_NE(a.requests[0].tokens, c.requests[0].tokens);
  // Request 1 of the batch draws with seed + 1: alone, with that seed, it gives the same tokens.
  GenerateOptions alone = sampled(12);
  alone.max_batch = 1;
  const GenerateReport d =
      generate(runner, std::vector<std::vector<TokenId>>{prompts[1]}, nullptr, alone);
  EXPECT_EQ(d.requests[0].tokens, a.requests[1].tokens);
  // And it is not greedy decoding.
  GenerateOptions greedy;
  greedy.max_tokens = 48;
  EXPECT_NE(generate(runner, prompts, nullptr, greedy).requests[0].tokens, a.requests[0].tokens);
}

TEST(Sampling, GreedyWithPenaltiesIsBitIdenticalUnderSpeculation) {
  ModelRunner runner = testing::tiny_runner("tiny-swa", {.num_spec_tokens = 4});
  const auto prompts = two_prompts();
  GenerateOptions o;
  o.max_tokens = 64;
  o.sampling.repetition_penalty = 1.3;
  o.sampling.frequency_penalty = 0.4;
  o.sampling.presence_penalty = 0.2;
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  GenerateOptions none;
  none.max_tokens = 64;
  EXPECT_NE(generate(runner, prompts, nullptr, none).requests[0].tokens, plain.requests[0].tokens)
      << "the penalties change nothing: the test would not see them applied at draft positions";
  o.num_spec_tokens = 4;
  OracleDrafter oracle(testing::references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  testing::expect_same_tokens(plain, fast, "oracle speculation with penalties");
  EXPECT_GT(fast.requests[0].stats.accepted_tokens, 0);
  NgramDrafter ngram;
  testing::expect_same_tokens(plain, generate(runner, prompts, &ngram, o), "n-gram speculation");
}

TEST(Sampling, SpeculativeSamplingRunsWithEachDrafterAndIsReproducible) {
  ModelRunner runner = testing::tiny_runner("tiny-swa", {.num_spec_tokens = 3});
  const auto prompts = two_prompts();
  GenerateOptions o = sampled(3);
  o.num_spec_tokens = 3;
  const GenerateReport plain = generate(runner, prompts, nullptr, sampled(3));
  // The oracle proposes plain's sampled tokens: a different path of the same distribution may
  // accept few of them, but the run must complete with max_tokens each.
  OracleDrafter oracle(testing::references(prompts, plain));
  RandomDrafter random(runner.vocab_size(), 9);
  NgramDrafter ngram;
  for (Drafter* d : std::initializer_list<Drafter*>{&oracle, &random, &ngram}) {
    const GenerateReport a = generate(runner, prompts, d, o);
    for (const auto& r : a.requests) {
      EXPECT_EQ(r.tokens.size(), 48u) << d->name();
      for (TokenId t : r.tokens) ASSERT_LT(t, runner.vocab_size());
    }
  }
  RandomDrafter again(runner.vocab_size(), 9);
  RandomDrafter again2(runner.vocab_size(), 9);
  testing::expect_same_tokens(generate(runner, prompts, &again, o),
                              generate(runner, prompts, &again2, o), "the same seeds twice");
}

TEST(Sampling, OutOfRangeParametersAreRefusedNamingTheRequestAndField) {
  ModelRunner runner = testing::tiny_runner("tiny-swa");
  GenerateOptions o;
  o.sampling.top_p = 1.5;
  ::mixkv::testing::expect_error([&] { generate(runner, two_prompts(), nullptr, o); },
                                 ErrorCode::kInvalidInput, {"request 0", "top_p = 1.5"});
}

}  // namespace
}  // namespace mixkv::engine
