// tiny-gemma (Gemma 2: soft-capped attention logits, sliding and full layers, a scale from
// query_pre_attn_scalar): the soft cap reaches the kernel, the runner's attention equals the dense
// reference with it, and speculation gives exactly the tokens of plain decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/engine_test_support.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/kernels/dense_reference.hpp"

namespace mixkv::engine {
namespace {

using testing::expect_same_tokens;
using testing::references;

ModelRunner make_gemma(const RunnerOptions& o = {}) {
  return testing::tiny_runner("tiny-gemma", o);
}

TEST(TinyGemma, AttentionLayersRunWithTheSoftCapWindowAndScaleOfTheConfig) {
  ModelRunner runner = make_gemma();
  const kernels::AttentionSpec& sliding = runner.attention_spec("layers.0");
  const kernels::AttentionSpec& full = runner.attention_spec("layers.1");
  for (const kernels::AttentionSpec* s : {&sliding, &full}) {
    ASSERT_TRUE(s->params.soft_cap.has_value());
    EXPECT_EQ(*s->params.soft_cap, 50.0);
    EXPECT_DOUBLE_EQ(s->params.scale, 1.0 / std::sqrt(24.0));  // query_pre_attn_scalar, not 16
    EXPECT_EQ(s->params.num_q_heads, 4);
    EXPECT_EQ(s->params.num_kv_heads, 2);
  }
  EXPECT_EQ(sliding.params.window_left, 31);
  EXPECT_EQ(full.params.window_left, -1);
  EXPECT_THROW((void)runner.attention_spec("layers.9"), Error);
  const auto shapes = weight_shapes(runner.config(), runner.desc());
  const std::map<std::string, std::vector<std::int64_t>> named(shapes.begin(), shapes.end());
  EXPECT_EQ(named.count("model.layers.0.pre_feedforward_layernorm.weight"), 1u);
  EXPECT_EQ(named.count("model.layers.0.post_feedforward_layernorm.weight"), 1u);
  EXPECT_EQ(runner.config().final_logit_softcap, 30.0);
}

// Each attention layer's output for the last query of a prompt longer than the window, computed
// by the kernel with the runner's spec over the K/V the runner wrote, equals the dense reference
// with the soft cap (and differs from it without): queries large enough that the cap bends the
// logits.
TEST(TinyGemma, RunnerAttentionMatchesTheDenseReferenceWithTheSoftCap) {
  ModelRunner runner = make_gemma();
  const std::vector<std::vector<TokenId>> prompts = {
      encode_bytes(std::string(60, 'a') + "the soft cap bends large attention logits")};
  GenerateOptions o;
  o.max_tokens = 8;
  int checked = 0;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    for (const char* name : {"layers.0", "layers.1"}) {
      const kernels::AttentionSpec& spec = runner.attention_spec(name);
      const layout::LayerGeometry& g = runner.geometry().layer(name);
      const auto tensor = runner.cache_tensor(g.tensor);
      std::vector<std::int64_t> blocks;
      for (cache::BlockId b : m.block_table(id, g.kv_cache_group)) blocks.push_back(b.value());
      const std::int64_t kv_len = m.num_computed(id);
      ASSERT_GT(kv_len, 64);
      const std::int64_t kw = kernels::k_row_elements(spec), vw = kernels::v_row_elements(spec);
      std::vector<float> k(static_cast<std::size_t>(kv_len * kw));
      std::vector<float> v(static_cast<std::size_t>(kv_len * vw));
      for (std::int64_t p = 0; p < kv_len; ++p) {
        const layout::TokenLocation at = layout::locate_token(g, blocks, p);
        std::memcpy(k.data() + p * kw, tensor.data() + at.k_offset, g.k_token_bytes);
        std::memcpy(v.data() + p * vw, tensor.data() + at.v_offset, g.v_token_bytes);
      }
      // The query: a key the layer wrote, scaled so q.k reaches past the cap.
      std::vector<float> q(static_cast<std::size_t>(spec.params.num_q_heads * spec.head_size));
      for (std::size_t i = 0; i < q.size(); ++i) {
        q[i] = 8.0f *
               k[static_cast<std::size_t>((kv_len - 3) * kw) + i % static_cast<std::size_t>(kw)];
      }
      const std::vector<std::int64_t> pages = layout::kernel_block_table(g, blocks);
      const kernels::PagedSequence seq{pages, kv_len, 1};
      std::vector<float> got(static_cast<std::size_t>(spec.params.num_q_heads * spec.head_size_v));
      kernels::paged_attention(spec, g, {tensor, std::span(&seq, 1), q, {}, {}}, got);
      const std::vector<double> want = kernels::dense_attention(spec, {k, v, q, kv_len, 1}, {});
      kernels::AttentionSpec uncapped = spec;
      uncapped.params.soft_cap.reset();
      const std::vector<double> plain =
          kernels::dense_attention(uncapped, {k, v, q, kv_len, 1}, {});
      double err = 0.0, cap_effect = 0.0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(got[i] - want[i]));
        cap_effect = std::max(cap_effect, std::abs(want[i] - plain[i]));
      }
      EXPECT_LT(err, 1e-4) << name;
      EXPECT_GT(cap_effect, 1e-2) << name;
      ++checked;
    }
  };
  generate(runner, prompts, nullptr, o);
  EXPECT_EQ(checked, 2);
}

TEST(TinyGemma, SpeculationIsBitIdenticalToPlainDecodingAtBatchOneAndSixteen) {
  ModelRunner runner = make_gemma({.num_spec_tokens = 4});
  // Batch 1: a prompt beyond the 32-token window.
  const std::vector<std::vector<TokenId>> one = {
      encode_bytes("Gemma caps its attention logits at fifty and alternates its windows.")};
  GenerateOptions o;
  o.max_tokens = 256;
  const GenerateReport plain_one = generate(runner, one, nullptr, o);
  o.num_spec_tokens = 4;
  OracleDrafter oracle_one(references(one, plain_one));
  const GenerateReport fast = generate(runner, one, &oracle_one, o);
  expect_same_tokens(plain_one, fast, "oracle, batch 1");
  EXPECT_EQ(fast.requests[0].stats.acceptance_rate(), 1.0);
  RandomDrafter random(runner.vocab_size(), 5);
  const GenerateReport slow = generate(runner, one, &random, o);
  expect_same_tokens(plain_one, slow, "random, batch 1");
  EXPECT_GT(slow.requests[0].stats.drafted_tokens, 900);

  // Sixteen mixed prompts (1 to 134 tokens, half sharing a 40-token prefix).
  const auto prompts = testing::mixed_prompts(
      "Soft-capped logits stay below the cap, whatever the batch around them.", 40, 3, 7);
  o = {};
  o.max_tokens = 256;
  o.max_batch = 16;
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 3;
  OracleDrafter oracle(references(prompts, plain));
  expect_same_tokens(plain, generate(runner, prompts, &oracle, o), "oracle, batch 16");
  o.num_spec_tokens = 2;
  RandomDrafter noise(runner.vocab_size(), 6);
  expect_same_tokens(plain, generate(runner, prompts, &noise, o), "random, batch 16");
}

TEST(TinyGemma, Gemma3IsRefusedByItsModelType) {
  // Described like Gemma 2, but its layer adds q/k norms the runner does not compute.
  const model::ModelSource src = model::parse_model_source("g3", "test gemma3", R"({
    "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 260, "torch_dtype": "float32"})");
  try {
    ModelRunner runner(src, weights::TensorMap{});
    FAIL() << "a gemma3 config ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'model_type' is 'gemma3_text'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mixkv::engine
