// tiny-hybrid (Gated DeltaNet + full attention): speculative decoding gives exactly the tokens of
// plain decoding, and after any accept/reject sequence or prefix hit the live recurrent states and
// the attention pages equal, byte for byte, those of a run without speculation.
#include <gtest/gtest.h>

#include <map>

#include "engine_test_support.hpp"
#include "mixkv/error.hpp"
#include "mixkv/generator.hpp"
#include "mixkv/recurrent_kernel.hpp"

namespace mixkv::engine {
namespace {

using testing::references;

ModelRunner make_hybrid(const RunnerOptions& o = {}) {
  const TinyModel& m = *find_tiny_model("tiny-hybrid");
  const model::ModelSource src = tiny_model_source(m);
  const auto desc = model::describe(src, std::nullopt, {});
  return ModelRunner(src, generate_weights(read_transformer_config(src), desc, m.seed), o);
}

// tiny-hybrid with its MTP layer as the drafter (weights seeded seed + 1, as `mixkv generate`).
ModelRunner make_hybrid_mtp(RunnerOptions o) {
  const TinyModel& m = *find_tiny_model("tiny-hybrid");
  const model::ModelSource src = tiny_model_source(m);
  const auto config = read_transformer_config(src);
  TensorMap w = generate_weights(config, model::describe(src, std::nullopt, {}), m.seed);
  model::DescribeOptions d;
  d.num_spec_tokens = o.num_spec_tokens;
  w.merge(generate_draft_weights(config, model::describe_mtp(src, d), m.seed + 1));
  o.mtp = true;
  return ModelRunner(src, w, o);
}

// 16 prompts of 1 to 134 tokens; every other one starts with the same 64 tokens. tiny-hybrid's
// snapshot interval is 16 (its attention block) and each prefill chunk keeps the latest boundary
// it crosses, so the sharers keep the state at 64 (chunks of 24 or 32) and later ones hit it.
std::vector<std::vector<TokenId>> mixed_batch() {
  return testing::mixed_prompts(
      "A hybrid model keeps one state per layer and pages for the rest; a hit restores both.", 64,
      7, 5);
}

void expect_same_tokens(const GenerateReport& a, const GenerateReport& b, const char* what) {
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].tokens, b.requests[i].tokens) << what << ", request " << i;
  }
}

// A request's cache as the kernels see it (testing::cache_image): the live state bytes of every
// GDN layer (conv rows and delta-rule state) and the K/V bytes of every verified position of
// every attention layer, the target's layers only.
using Image = testing::CacheImage;
Image image_of(const ModelRunner& runner, const cache::KvCacheManager& m, cache::RequestId id) {
  return testing::cache_image(
      runner, m, id, [](const std::string& layer) { return layer.starts_with("layers."); });
}

void expect_same_image(const Image& want, const Image& got, const std::string& what) {
  ASSERT_EQ(want.states.size(), 6u) << what;  // 6 GDN layers
  ASSERT_EQ(want.states.size(), got.states.size()) << what;
  for (const auto& [name, bytes] : want.states) {
    EXPECT_EQ(bytes, got.states.at(name)) << what << ": state of " << name;
  }
  ASSERT_FALSE(want.pages.empty()) << what;
  EXPECT_EQ(want.pages.size(), got.pages.size()) << what;
  for (const auto& [key, bytes] : want.pages) {
    const auto it = got.pages.find(key);
    ASSERT_NE(it, got.pages.end()) << what << ": " << key.first << " position " << key.second;
    EXPECT_EQ(it->second, bytes) << what << ": " << key.first << " position " << key.second;
  }
}

TEST(TinyHybrid, RunsGatedDeltaNetLayersThroughTheCachePlan) {
  ModelRunner runner = make_hybrid({.num_spec_tokens = 2});
  int gdn = 0;
  for (const layout::LayerGeometry& g : runner.geometry().layers) gdn += g.recurrent ? 1 : 0;
  EXPECT_EQ(gdn, 6);
  // Conv states keep the planned speculative rows: kernel 4 - 1 + 2.
  const auto spec = kernels::gdn_layer_spec(runner.desc().layers[0], 2);
  EXPECT_EQ(spec.conv.rows, 5);
  EXPECT_EQ(spec.conv.kernel, 4);
  // The recurrence matters: the same last token after different histories gives other logits.
  GenerateOptions o;
  o.max_tokens = 4;
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("xxxxxxxxz"),
                                                     encode_bytes("yyyyyyyyz")};
  const GenerateReport r = generate(runner, prompts, nullptr, o);
  EXPECT_NE(r.requests[0].tokens, r.requests[1].tokens);
}

TEST(TinyHybrid, SpeculationIsBitIdenticalToPlainDecodingAtBatchOne) {
  ModelRunner runner = make_hybrid({.num_spec_tokens = 4});
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

  NgramDrafter ngram;
  const GenerateReport lookup = generate(runner, prompts, &ngram, o);
  expect_same_tokens(plain, lookup, "ngram");
  EXPECT_GT(lookup.requests[0].stats.drafted_tokens, 0);
}

TEST(TinyHybrid, SpeculationAndPrefixHitsAreBitIdenticalInAMixedBatchOfSixteen) {
  ModelRunner runner = make_hybrid({.num_spec_tokens = 3});
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = testing::kGeneratedTokens;
  o.max_batch = 16;
  o.prefill_chunk = 24;
  std::map<std::size_t, Image> plain_images;
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
  std::map<std::size_t, Image> random_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    random_images[i] = image_of(runner, m, id);
  };
  expect_same_tokens(plain, generate(runner, prompts, &random, o), "random");
  ASSERT_EQ(random_images.size(), 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    expect_same_image(plain_images.at(i), random_images.at(i), "random " + std::to_string(i));
  }

  // Five at a time: later requests restore the shared prefix's recurrent snapshot (and its
  // attention blocks), and end with the plain run's cache bytes too.
  o.num_spec_tokens = 3;
  o.max_batch = 5;
  std::map<std::size_t, Image> hit_images;
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

TEST(TinyHybrid, RollbackLeavesRecurrentStatesAndPagesByteForByteAsPlainDecoding) {
  ModelRunner runner = make_hybrid({.num_spec_tokens = 3});
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("rollback: every rejected draft"),
                                                     encode_bytes(std::string(45, 'w'))};
  GenerateOptions o;
  o.max_tokens = 80;
  std::vector<Image> images;
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

TEST(TinyHybrid, Bfloat16StatesGiveTheSameTokensPlainAndSpeculative) {
  // One kernel call per token stores the state in its dtype after every token, so a verify
  // block rounds exactly as one-by-one decoding does.
  ModelRunner runner = make_hybrid({.num_spec_tokens = 3, .ssm_dtype = DType::kBfloat16});
  const model::LayerDesc& gdn = runner.desc().layers[0];
  ASSERT_EQ(gdn.state.back().name, "temporal");
  EXPECT_EQ(gdn.state.back().dtype, DType::kBfloat16);
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("bf16 states, rounded alike")};
  GenerateOptions o;
  o.max_tokens = 128;
  std::vector<Image> images;
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

TEST(TinyHybrid, MtpSpeculationIsBitIdenticalToPlainDecoding) {
  ModelRunner runner = make_hybrid_mtp({.num_spec_tokens = 2});
  ASSERT_TRUE(runner.has_drafter());
  const model::LayerDesc& mtp = runner.desc().layers.back();
  EXPECT_EQ(mtp.name, "mtp.layers.0");
  EXPECT_EQ(mtp.kind, model::LayerKind::kFull);
  // Batch 1, 256 tokens (kGeneratedTokens).
  GenerateOptions o;
  o.max_tokens = testing::kGeneratedTokens;
  const std::vector<std::vector<TokenId>> one = {encode_bytes("The MTP layer drafts ahead.")};
  const GenerateReport plain_one = generate(runner, one, nullptr, o);
  o.num_spec_tokens = 2;
  EagleDrafter drafter(runner);
  EXPECT_EQ(drafter.name(), "mtp");
  const GenerateReport got_one = generate(runner, one, &drafter, o);
  expect_same_tokens(plain_one, got_one, "mtp, batch 1");
  EXPECT_GT(got_one.requests[0].stats.drafted_tokens, 3 * testing::kGeneratedTokens / 2);

  // The mixed batch, all 16 at once, then six at a time (prefix hits through the snapshots and
  // the MTP layer's blocks): the same tokens, and the target's states and pages of a plain run.
  const auto prompts = mixed_batch();
  o = {};
  o.max_tokens = testing::kGeneratedTokens;
  o.max_batch = 16;
  std::map<std::size_t, Image> plain_images, mtp_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    plain_images[i] = image_of(runner, m, id);
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 2;
  o.before_free = nullptr;
  expect_same_tokens(plain, generate(runner, prompts, &drafter, o), "mtp, batch 16");
  o.max_batch = 6;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    mtp_images[i] = image_of(runner, m, id);
  };
  const GenerateReport got = generate(runner, prompts, &drafter, o);
  expect_same_tokens(plain, got, "mtp, mixed batch");
  std::int64_t hits = 0;
  for (const auto& r : got.requests) hits += r.stats.prefix_hit_tokens;
  EXPECT_GE(hits, 3 * 64);
  for (std::size_t i = 0; i < 16; ++i) {
    expect_same_image(plain_images.at(i), mtp_images.at(i), "mtp, request " + std::to_string(i));
  }
}

TEST(TinyHybrid, PreemptionByRecomputeKeepsTheTokens) {
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = 96;
  o.max_batch = 16;
  ModelRunner roomy = make_hybrid({.num_spec_tokens = 2});
  const GenerateReport want = generate(roomy, prompts, nullptr, o);
  // A cache far too small for 16 growing requests: preempted ones restart from a zeroed state
  // or a restored snapshot.
  ModelRunner tight =
      make_hybrid({.memory_bytes = 512 << 10, .max_model_len = 256, .num_spec_tokens = 2});
  o.num_spec_tokens = 2;
  RandomDrafter random(tight.vocab_size(), 4);
  const GenerateReport got = generate(tight, prompts, &random, o);
  EXPECT_GT(got.preemptions, 0);
  expect_same_tokens(want, got, "preempted");
}

TEST(TinyHybrid, TooFewStateBlocksForAVerifyAreRefused) {
  ModelRunner runner = make_hybrid({.num_spec_tokens = 2});
  const std::vector<TokenId> tokens = {1, 2, 3};
  std::vector<cache::BlockId> blocks = {cache::BlockId(1), cache::BlockId(2)};
  SequenceInput in;
  in.tokens = tokens;
  in.checkpoints = true;  // three tokens need three state blocks
  for (std::size_t g = 0; g < runner.plan().groups.size(); ++g) in.block_tables.push_back(blocks);
  try {
    runner.forward(std::span(&in, 1));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state blocks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mixkv::engine
