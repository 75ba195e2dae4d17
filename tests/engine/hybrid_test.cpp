// tiny-hybrid (Gated DeltaNet + full attention): its layers run through the plan's recurrent
// groups, its own MTP layer drafts tokens that leave the plain run's states and pages, and a
// verify without enough state blocks is refused. What it shares with tiny-mamba is in
// recurrent_targets_test.cpp.
#include <gtest/gtest.h>

#include <map>

#include "engine_test_support.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/kernels/recurrent_kernel.hpp"

namespace mixkv::engine {
namespace {

using testing::expect_same_tokens;
using testing::references;

ModelRunner make_hybrid(const RunnerOptions& o = {}) {
  return testing::tiny_runner("tiny-hybrid", o);
}

// tiny-hybrid with its MTP layer as the drafter (weights seeded seed + 1, as `mixkv generate`).
ModelRunner make_hybrid_mtp(RunnerOptions o) {
  const TinyModel& m = *find_tiny_model("tiny-hybrid");
  const model::ModelSource src = tiny_model_source(m);
  const auto config = model::read_architecture(src);
  weights::TensorMap w = generate_weights(config, model::describe(src, std::nullopt, {}), m.seed);
  model::DescribeOptions d;
  d.num_spec_tokens = o.num_spec_tokens;
  w.merge(generate_draft_weights(config, model::describe_mtp(src, d), m.seed + 1));
  o.mtp = true;
  return ModelRunner(src, w, o);
}

// 16 prompts of 1 to 134 tokens; every other one starts with the same 64 tokens. tiny-hybrid's
// snapshot interval is 16 (its attention block) and each prefill chunk keeps the latest boundary
// it crosses, so the sharers keep the state at 64 (chunks of 24 or 32) and later ones hit it.
std::vector<std::vector<TokenId>> hybrid_batch() {
  return testing::mixed_prompts(
      "A hybrid model keeps one state per layer and pages for the rest; a hit restores both.", 64,
      7, 5);
}

// A request's cache as the kernels see it: the live state bytes of every GDN layer (conv rows
// and delta-rule state) and the K/V bytes of every verified position of every attention layer,
// the target's layers only.
testing::CacheImage image_of(const ModelRunner& runner, const cache::KvCacheManager& m,
                             cache::RequestId id) {
  return testing::cache_image(
      runner, m, id, [](const std::string& layer) { return layer.starts_with("layers."); });
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
  const auto prompts = hybrid_batch();
  o = {};
  o.max_tokens = testing::kGeneratedTokens;
  o.max_batch = 16;
  std::map<std::size_t, testing::CacheImage> plain_images, mtp_images;
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
    testing::expect_same_cache(plain_images.at(i), mtp_images.at(i), 6,
                               "mtp, request " + std::to_string(i));
  }
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
