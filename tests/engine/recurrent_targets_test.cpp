// The tiny targets with recurrent layers, tiny-hybrid (Gated DeltaNet + full attention) and
// tiny-mamba (Nemotron-H: Mamba2 + attention blocks): speculative decoding gives exactly the
// tokens of plain decoding, and after any accept/reject sequence, prefix hit or preemption the
// live recurrent states and the attention pages equal, byte for byte, those of a run without
// speculation.
#include <gtest/gtest.h>

#include <map>

#include "engine_test_support.hpp"
#include "mixkv/engine/generator.hpp"

namespace mixkv::engine {
namespace {

using testing::expect_same_tokens;
using testing::references;
using testing::tiny_runner;

struct RecurrentTarget {
  const char* model;
  const char* test_name;
  std::size_t recurrent_layers;
  const char* last_state;  // the name of a recurrent layer's last state tensor
  // The mixed batch: the text whose first 64 tokens every other prompt shares, and its pattern.
  const char* shared_text;
  int stride_i, stride_j;
  // Preemption: tokens per request, and a cache far too small for 16 growing requests.
  std::int64_t preempt_tokens;
  std::int64_t tight_memory;
};

const RecurrentTarget kTargets[] = {
    {"tiny-hybrid", "TinyHybrid", 6, "temporal",
     "A hybrid model keeps one state per layer and pages for the rest; a hit restores both.", 7, 5,
     96, 512 << 10},
    {"tiny-mamba", "TinyMamba", 4, "ssm",
     "A Mamba2 block keeps a conv and an SSM state; a prefix hit restores both of them.", 5, 3, 64,
     384 << 10},
};

class RecurrentTargets : public ::testing::TestWithParam<RecurrentTarget> {
 protected:
  ModelRunner runner(const RunnerOptions& o) const { return tiny_runner(GetParam().model, o); }

  // 16 prompts of 1 to 134 tokens; every other one starts with the same 64 tokens. The snapshot
  // interval is 16 (the attention block) and each prefill chunk keeps the latest boundary it
  // crosses, so the sharers keep the state at 64 (chunks of 24 or 32) and later ones hit it.
  std::vector<std::vector<TokenId>> mixed_batch() const {
    return testing::mixed_prompts(GetParam().shared_text, 64, GetParam().stride_i,
                                  GetParam().stride_j);
  }

  // A request's cache as the kernels see it: the live state bytes of every recurrent layer and
  // the K/V bytes of every verified position of every attention layer.
  static testing::CacheImage image_of(const ModelRunner& runner, const cache::KvCacheManager& m,
                                      cache::RequestId id) {
    return testing::cache_image(runner, m, id, [](const std::string&) { return true; });
  }

  void expect_same_image(const testing::CacheImage& want, const testing::CacheImage& got,
                         const std::string& what) const {
    testing::expect_same_cache(want, got, GetParam().recurrent_layers, what);
  }
};

TEST_P(RecurrentTargets, TheSameLastTokenAfterOtherHistoriesGivesOtherTokens) {
  ModelRunner runner = this->runner({});
  GenerateOptions o;
  o.max_tokens = 4;
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("xxxxxxxxz"),
                                                     encode_bytes("yyyyyyyyz")};
  const GenerateReport r = generate(runner, prompts, nullptr, o);
  EXPECT_NE(r.requests[0].tokens, r.requests[1].tokens);
}

TEST_P(RecurrentTargets, SpeculationIsBitIdenticalToPlainDecodingAtBatchOne) {
  ModelRunner runner = this->runner({.num_spec_tokens = 4});
  const std::vector<std::vector<TokenId>> prompts = {
      encode_bytes("Once upon a time, a recurrent state met a paged cache.")};
  GenerateOptions o;
  o.max_tokens = 256;  // batch 1 is cheap: 256 in every build
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  ASSERT_EQ(plain.requests[0].tokens.size(), 256u);

  o.num_spec_tokens = 4;
  OracleDrafter oracle(references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, fast, "oracle");
  EXPECT_EQ(fast.requests[0].stats.acceptance_rate(), 1.0);
  EXPECT_EQ(fast.requests[0].stats.decode_steps, 51);  // 255 tokens in steps of 1 + 4

  RandomDrafter random(runner.vocab_size(), 5);
  const GenerateReport slow = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, slow, "random");
  EXPECT_LT(slow.requests[0].stats.acceptance_rate(), 0.05);
  EXPECT_GT(slow.requests[0].stats.drafted_tokens, 900);

  NgramDrafter ngram(1, 3);  // short matches: random weights seldom repeat 3 tokens
  const GenerateReport lookup = generate(runner, prompts, &ngram, o);
  expect_same_tokens(plain, lookup, "ngram");
  EXPECT_GT(lookup.requests[0].stats.drafted_tokens, 0);
}

TEST_P(RecurrentTargets, SpeculationAndPrefixHitsAreBitIdenticalInAMixedBatchOfSixteen) {
  ModelRunner runner = this->runner({.num_spec_tokens = 3});
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = testing::kGeneratedTokens;
  o.max_batch = 16;
  o.prefill_chunk = 24;
  std::map<std::size_t, testing::CacheImage> plain_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    plain_images[i] = image_of(runner, m, id);
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.before_free = nullptr;

  o.num_spec_tokens = 3;
  OracleDrafter oracle(references(prompts, plain));
  expect_same_tokens(plain, generate(runner, prompts, &oracle, o), "oracle");
  NgramDrafter ngram;
  expect_same_tokens(plain, generate(runner, prompts, &ngram, o), "ngram");
  // Random drafts, nearly all rolled back (two per step keep the test short): every request
  // ends with the plain run's recurrent states and pages.
  o.num_spec_tokens = 2;
  RandomDrafter random(runner.vocab_size(), 6);
  std::map<std::size_t, testing::CacheImage> random_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    random_images[i] = image_of(runner, m, id);
  };
  expect_same_tokens(plain, generate(runner, prompts, &random, o), "random");
  ASSERT_EQ(random_images.size(), 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    expect_same_image(plain_images.at(i), random_images.at(i), "random " + std::to_string(i));
  }

  // Five at a time: later requests restore the shared prefix's recurrent snapshots (and its
  // attention blocks), and end with the plain run's cache bytes too.
  o.num_spec_tokens = 3;
  o.max_batch = 5;
  std::map<std::size_t, testing::CacheImage> hit_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    hit_images[i] = image_of(runner, m, id);
  };
  const GenerateReport narrow = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, narrow, "five at a time");
  std::int64_t hits = 0;
  for (const auto& r : narrow.requests) hits += r.stats.prefix_hit_tokens;
  EXPECT_GE(hits, 3 * 64);
  ASSERT_EQ(hit_images.size(), 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    expect_same_image(plain_images.at(i), hit_images.at(i), "hit " + std::to_string(i));
  }

  // Each request alone, another chunking, no prefix cache: the same tokens.
  o = {};
  o.max_tokens = testing::kGeneratedTokens;
  o.prefill_chunk = 7;
  o.prefix_caching = false;
  for (std::size_t i : {std::size_t{0}, std::size_t{9}}) {
    const std::vector<std::vector<TokenId>> one = {prompts[i]};
    EXPECT_EQ(generate(runner, one, nullptr, o).requests[0].tokens, plain.requests[i].tokens)
        << "request " << i;
  }
}

TEST_P(RecurrentTargets, RollbackLeavesRecurrentStatesAndPagesByteForByteAsPlainDecoding) {
  ModelRunner runner = this->runner({.num_spec_tokens = 3});
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("rollback: every rejected draft"),
                                                     encode_bytes(std::string(45, 'w'))};
  GenerateOptions o;
  o.max_tokens = 80;
  std::vector<testing::CacheImage> images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    images.push_back(image_of(runner, m, id));
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  // Random drafts: rejections at every step (and the occasional acceptance).
  o.num_spec_tokens = 3;
  RandomDrafter random(runner.vocab_size(), 3);
  const GenerateReport spec = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, spec, "random");
  EXPECT_GT(spec.requests[0].stats.drafted_tokens, 200);
  // The oracle: every draft accepted, the last checkpoint made live at each step.
  OracleDrafter oracle(references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, fast, "oracle");
  ASSERT_EQ(images.size(), 6u);
  for (std::size_t i = 0; i < 2; ++i) {
    expect_same_image(images[i], images[i + 2], "random, request " + std::to_string(i));
    expect_same_image(images[i], images[i + 4], "oracle, request " + std::to_string(i));
  }
  // The states are not trivially equal: two requests end in different states.
  EXPECT_NE(images[0].states.at("layers.0"), images[1].states.at("layers.0"));
}

TEST_P(RecurrentTargets, Bfloat16StatesGiveTheSameTokensPlainAndSpeculative) {
  // One kernel call per token stores the state in its dtype after every token, so a verify
  // block rounds exactly as one-by-one decoding does.
  ModelRunner runner = this->runner({.num_spec_tokens = 3, .ssm_dtype = DType::kBfloat16});
  const model::LayerDesc& first = runner.desc().layers[0];
  ASSERT_EQ(first.state.back().name, GetParam().last_state);
  EXPECT_EQ(first.state.back().dtype, DType::kBfloat16);
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("bf16 states, rounded alike")};
  GenerateOptions o;
  o.max_tokens = 128;
  std::vector<testing::CacheImage> images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    images.push_back(image_of(runner, m, id));
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 3;
  OracleDrafter oracle(references(prompts, plain));
  expect_same_tokens(plain, generate(runner, prompts, &oracle, o), "bf16, oracle");
  RandomDrafter random(runner.vocab_size(), 9);
  expect_same_tokens(plain, generate(runner, prompts, &random, o), "bf16, random");
  ASSERT_EQ(images.size(), 3u);
  expect_same_image(images[0], images[1], "bf16, oracle");
  expect_same_image(images[0], images[2], "bf16, random");
}

TEST_P(RecurrentTargets, PreemptionByRecomputeKeepsTheTokens) {
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = GetParam().preempt_tokens;
  o.max_batch = 16;
  ModelRunner roomy = runner({.num_spec_tokens = 2});
  const GenerateReport want = generate(roomy, prompts, nullptr, o);
  // Preempted requests restart from a zeroed state or a restored snapshot.
  ModelRunner tight =
      runner({.memory_bytes = GetParam().tight_memory, .max_model_len = 256, .num_spec_tokens = 2});
  o.num_spec_tokens = 2;
  RandomDrafter random(tight.vocab_size(), 4);
  const GenerateReport got = generate(tight, prompts, &random, o);
  EXPECT_GT(got.preemptions, 0);
  expect_same_tokens(want, got, "preempted");
}

INSTANTIATE_TEST_SUITE_P(TinyTargets, RecurrentTargets, ::testing::ValuesIn(kTargets),
                         [](const auto& info) { return std::string(info.param.test_name); });

}  // namespace
}  // namespace mixkv::engine
