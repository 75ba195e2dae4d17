// Every supported family, described from its built-in config, against the facts of
// shared/design/model-facts.md.
#include <gtest/gtest.h>

#include <cmath>

#include "mixkv/model/describe.hpp"
#include "test_support.hpp"

namespace mixkv::model {
namespace {

using testing::describe_builtin;
using testing::describe_text;
using testing::layers_of;

using testing::indices;

const StateTensor& state_named(const LayerDesc& layer, std::string_view name) {
  for (const auto& t : layer.state) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << layer.name << " has no state tensor " << name;
  static const StateTensor kMissing;
  return kMissing;
}

TEST(Qwen3Next, FullAttentionEveryFourthLayerAndGdnElsewhere) {
  const ModelDesc d = describe_builtin("qwen3-next-80b-a3b");
  ASSERT_EQ(d.layers.size(), 48u);
  auto full = layers_of(d, LayerKind::kFull);
  auto gdn = layers_of(d, LayerKind::kGdn);
  ASSERT_EQ(full.size(), 12u);
  ASSERT_EQ(gdn.size(), 36u);
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(full[i]->index, static_cast<int>(4 * i + 3));
    EXPECT_EQ(full[i]->num_q_heads, 16);
    EXPECT_EQ(full[i]->num_kv_heads, 2);
    EXPECT_EQ(full[i]->head_size, 256);
    EXPECT_DOUBLE_EQ(full[i]->scale, 1.0 / 16.0);
  }
  for (const auto* l : gdn) {
    EXPECT_EQ(state_named(*l, "conv").shape, (std::vector<std::int64_t>{3, 8192}));
    EXPECT_EQ(state_named(*l, "conv").dtype, DType::kBfloat16);
    EXPECT_EQ(state_named(*l, "temporal").shape, (std::vector<std::int64_t>{32, 128, 128}));
    EXPECT_EQ(state_named(*l, "temporal").dtype, DType::kBfloat16);
  }
}

TEST(Qwen3Next, ConvStateGrowsOneRowPerSpeculativeToken) {
  DescribeOptions options;
  options.num_spec_tokens = 2;
  const ModelDesc d = describe_builtin("qwen3-next-80b-a3b", {}, options);
  EXPECT_EQ(d.num_spec_tokens, 2);
  for (const auto* l : layers_of(d, LayerKind::kGdn)) {
    EXPECT_EQ(state_named(*l, "conv").shape, (std::vector<std::int64_t>{5, 8192}));
    EXPECT_EQ(state_named(*l, "temporal").shape, (std::vector<std::int64_t>{32, 128, 128}));
  }
}

TEST(Qwen3Next, TensorParallelFourReplicatesKvHeadsAndShardsState) {
  DescribeOptions options;
  options.tp = 4;
  const ModelDesc d = describe_builtin("qwen3-next-80b-a3b", {}, options);
  EXPECT_EQ(d.tp, 4);
  for (const auto* l : layers_of(d, LayerKind::kFull)) {
    EXPECT_EQ(l->num_q_heads, 4);
    EXPECT_EQ(l->num_kv_heads, 1);  // 2 KV heads over 4 ranks: replicated
  }
  for (const auto* l : layers_of(d, LayerKind::kGdn)) {
    EXPECT_EQ(state_named(*l, "temporal").shape, (std::vector<std::int64_t>{8, 128, 128}));
    EXPECT_EQ(state_named(*l, "conv").shape, (std::vector<std::int64_t>{3, 2048}));
  }
}

TEST(Qwen35, NestedTextConfigAndFloat32TemporalStateFromConfig) {
  const ModelDesc d = describe_builtin("qwen3.5-27b");
  ASSERT_EQ(d.layers.size(), 64u);
  EXPECT_EQ(layers_of(d, LayerKind::kFull).size(), 16u);
  auto gdn = layers_of(d, LayerKind::kGdn);
  ASSERT_EQ(gdn.size(), 48u);
  const LayerDesc& full = *layers_of(d, LayerKind::kFull).front();
  EXPECT_EQ(full.num_q_heads, 24);
  EXPECT_EQ(full.num_kv_heads, 4);
  EXPECT_EQ(full.head_size, 256);
  // conv channels = 2 x 16 x 128 + 48 x 128; the config asks for float32 temporal state.
  EXPECT_EQ(state_named(*gdn.front(), "conv").shape, (std::vector<std::int64_t>{3, 10240}));
  EXPECT_EQ(state_named(*gdn.front(), "temporal").shape, (std::vector<std::int64_t>{48, 128, 128}));
  EXPECT_EQ(state_named(*gdn.front(), "temporal").dtype, DType::kFloat32);
  EXPECT_EQ(state_named(*gdn.front(), "conv").dtype, DType::kBfloat16);
}

TEST(GptOss, AlternatingWindow128WithSinksEverywhere) {
  const ModelDesc d = describe_builtin("gpt-oss-20b");
  auto sliding = layers_of(d, LayerKind::kSliding);
  auto full = layers_of(d, LayerKind::kFull);
  ASSERT_EQ(sliding.size(), 12u);
  ASSERT_EQ(full.size(), 12u);
  for (const auto& l : d.layers) {
    EXPECT_TRUE(l.sinks) << l.name;
    EXPECT_DOUBLE_EQ(l.scale, 0.125) << l.name;
    EXPECT_EQ(l.num_q_heads, 64);
    EXPECT_EQ(l.num_kv_heads, 8);
    EXPECT_EQ(l.head_size, 64);
    EXPECT_EQ(l.window.has_value(), l.kind == LayerKind::kSliding);
  }
  for (const auto* l : sliding) {
    EXPECT_EQ(*l->window, 128);
    EXPECT_EQ(l->index % 2, 0);
  }
  EXPECT_EQ(describe_builtin("gpt-oss-120b").layers.size(), 36u);
}

TEST(Gemma2, SoftCapEverywhereAlternatingWindowAndQueryPreAttnScalar) {
  const ModelDesc d = describe_builtin("gemma-2-9b");
  ASSERT_EQ(d.layers.size(), 42u);
  for (const auto& l : d.layers) {
    ASSERT_TRUE(l.soft_cap.has_value()) << l.name;
    EXPECT_DOUBLE_EQ(*l.soft_cap, 50.0);
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / std::sqrt(256.0));
    EXPECT_EQ(l.kind, l.index % 2 == 0 ? LayerKind::kSliding : LayerKind::kFull) << l.name;
    if (l.kind == LayerKind::kSliding) {
      EXPECT_EQ(*l.window, 4096);
    }
  }
}

TEST(Gemma3, FiveLocalOneGlobalWithScaleFromQueryPreAttnScalar) {
  const ModelDesc d = describe_builtin("gemma-3-27b");
  ASSERT_EQ(d.layers.size(), 62u);
  auto full = layers_of(d, LayerKind::kFull);
  EXPECT_EQ(indices(full), (std::vector<int>{5, 11, 17, 23, 29, 35, 41, 47, 53, 59}));
  EXPECT_EQ(layers_of(d, LayerKind::kSliding).size(), 52u);
  for (const auto& l : d.layers) {
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / std::sqrt(168.0));
    EXPECT_FALSE(l.soft_cap.has_value());
    if (l.window) {
      EXPECT_EQ(*l.window, 1024);
    }
  }
}

TEST(Gemma3, PatternRuleAppliesWithoutLayerTypes) {
  const ModelDesc d =
      describe_text(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
      "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
      "sliding_window": 512, "sliding_window_pattern": 6, "query_pre_attn_scalar": 64}})");
  EXPECT_EQ(indices(layers_of(d, LayerKind::kFull)), (std::vector<int>{5, 11}));
  EXPECT_EQ(layers_of(d, LayerKind::kSliding).size(), 10u);
}

TEST(Llama, AllFullAttentionWithHeadDimFromHiddenSize) {
  for (auto [name, layers, q] :
       {std::tuple{"llama-3.1-8b", 32u, 32}, std::tuple{"llama-3.1-70b", 80u, 64}}) {
    const ModelDesc d = describe_builtin(name);
    ASSERT_EQ(d.layers.size(), layers) << name;
    for (const auto& l : d.layers) {
      EXPECT_EQ(l.kind, LayerKind::kFull);
      EXPECT_EQ(l.num_q_heads, q);
      EXPECT_EQ(l.num_kv_heads, 8);
      EXPECT_EQ(l.head_size, 128);
      EXPECT_TRUE(l.causal);
      EXPECT_EQ(kv_bytes_per_token(l), 2 * 8 * 128 * 2);
    }
  }
}

TEST(Mistral, EveryLayerSlidingWindow4096) {
  const ModelDesc d = describe_builtin("mistral-7b");
  ASSERT_EQ(d.layers.size(), 32u);
  for (const auto& l : d.layers) {
    EXPECT_EQ(l.kind, LayerKind::kSliding);
    EXPECT_EQ(*l.window, 4096);
  }
}

TEST(Qwen3, DenseModelsAreFullAttention) {
  EXPECT_EQ(layers_of(describe_builtin("qwen3-8b"), LayerKind::kFull).size(), 36u);
  const ModelDesc d = describe_builtin("qwen3-32b");
  EXPECT_EQ(layers_of(d, LayerKind::kFull).size(), 64u);
  EXPECT_EQ(d.layers.front().num_q_heads, 64);
}

TEST(Qwen2, SlidingFromMaxWindowLayersWhenEnabled) {
  const ModelDesc d = describe_text(R"({"model_type": "qwen2", "num_hidden_layers": 6,
      "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
      "use_sliding_window": true, "sliding_window": 1024, "max_window_layers": 4})");
  EXPECT_EQ(indices(layers_of(d, LayerKind::kFull)), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(indices(layers_of(d, LayerKind::kSliding)), (std::vector<int>{4, 5}));
  EXPECT_EQ(d.layers.front().head_size, 64);
}

TEST(Qwen2, SlidingWindowIgnoredUnlessEnabled) {
  const ModelDesc d = describe_text(R"({"model_type": "qwen2", "num_hidden_layers": 2,
      "num_attention_heads": 4, "hidden_size": 256, "use_sliding_window": false, "sliding_window": 1024})");
  EXPECT_EQ(layers_of(d, LayerKind::kFull).size(), 2u);
  EXPECT_EQ(d.layers.front().num_kv_heads, 4);  // no num_key_value_heads: MHA
}

TEST(ChunkedAttention, LayerTypesCanSelectChunkedLayers) {
  const ModelDesc d = describe_text(R"({"model_type": "llama", "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "attention_chunk_size": 8192,
      "layer_types": ["chunked_attention", "full_attention"]})");
  ASSERT_EQ(d.layers[0].kind, LayerKind::kChunked);
  EXPECT_EQ(*d.layers[0].chunk, 8192);
  EXPECT_EQ(d.layers[1].kind, LayerKind::kFull);
}

TEST(NemotronH, PatternCharactersPickMambaAndAttentionBlocks) {
  const ModelDesc d = describe_builtin("nemotron-h-8b");
  auto mamba = layers_of(d, LayerKind::kMamba2);
  auto attention = layers_of(d, LayerKind::kFull);
  ASSERT_EQ(mamba.size(), 24u);
  ASSERT_EQ(attention.size(), 4u);
  EXPECT_EQ(indices(attention), (std::vector<int>{7, 18, 29, 40}));
  // conv channels = 128 x 64 + 2 x 8 groups x 128 state
  EXPECT_EQ(state_named(*mamba.front(), "conv").shape, (std::vector<std::int64_t>{3, 10240}));
  EXPECT_EQ(state_named(*mamba.front(), "ssm").shape, (std::vector<std::int64_t>{128, 64, 128}));
  EXPECT_EQ(attention.front()->head_size, 128);
}

TEST(GraniteHybrid, AttentionMultiplierIsTheScale) {
  const ModelDesc d = describe_builtin("granite-4.0-h-small");
  auto attention = layers_of(d, LayerKind::kFull);
  EXPECT_EQ(indices(attention), (std::vector<int>{5, 15, 25, 35}));
  EXPECT_EQ(layers_of(d, LayerKind::kMamba2).size(), 36u);
  EXPECT_DOUBLE_EQ(attention.front()->scale, 0.0078125);
  // One B/C group: conv channels = 128 x 64 + 2 x 128.
  EXPECT_EQ(state_named(*layers_of(d, LayerKind::kMamba2).front(), "conv").shape,
            (std::vector<std::int64_t>{3, 8448}));
}

TEST(Jamba, AttentionPeriodAndOffsetWithMambaV1Elsewhere) {
  const ModelDesc d = describe_builtin("jamba-v0.1");
  EXPECT_EQ(indices(layers_of(d, LayerKind::kFull)), (std::vector<int>{4, 12, 20, 28}));
  auto mamba = layers_of(d, LayerKind::kMamba1);
  ASSERT_EQ(mamba.size(), 28u);
  EXPECT_EQ(state_named(*mamba.front(), "conv").shape, (std::vector<std::int64_t>{3, 8192}));
  EXPECT_EQ(state_named(*mamba.front(), "ssm").shape, (std::vector<std::int64_t>{8192, 16}));
}

TEST(DeepseekV3, MlaCachesOneLatentWithYarnScaledSoftmax) {
  const ModelDesc d = describe_builtin("deepseek-v3");
  ASSERT_EQ(d.layers.size(), 61u);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  for (const auto& l : d.layers) {
    EXPECT_EQ(l.kind, LayerKind::kMla);
    EXPECT_EQ(l.num_q_heads, 128);
    EXPECT_EQ(l.num_kv_heads, 1);
    EXPECT_EQ(l.head_size, 576);
    EXPECT_EQ(l.head_size_v, 512);
    EXPECT_NEAR(l.scale, mscale * mscale / std::sqrt(192.0), 1e-12);
    EXPECT_EQ(kv_bytes_per_token(l), 576 * 2);
  }
}

TEST(KimiLinear, OneBasedFullLayersAreMlaAndTheRestKda) {
  const ModelDesc d = describe_builtin("kimi-linear-48b");
  ASSERT_EQ(d.layers.size(), 27u);
  EXPECT_EQ(indices(layers_of(d, LayerKind::kMla)), (std::vector<int>{3, 7, 11, 15, 19, 23, 26}));
  auto kda = layers_of(d, LayerKind::kKda);
  ASSERT_EQ(kda.size(), 20u);
  EXPECT_EQ(state_named(*kda.front(), "q_conv").shape, (std::vector<std::int64_t>{3, 4096}));
  EXPECT_EQ(state_named(*kda.front(), "recurrent").shape,
            (std::vector<std::int64_t>{32, 128, 128}));
  EXPECT_NEAR(layers_of(d, LayerKind::kMla).front()->scale, 1.0 / std::sqrt(192.0), 1e-12);
}

TEST(Glm45Air, FullAttentionGqa96Over8) {
  const ModelDesc d = describe_builtin("glm-4.5-air");
  ASSERT_EQ(d.layers.size(), 46u);
  EXPECT_EQ(d.layers.front().num_q_heads, 96);
  EXPECT_EQ(d.layers.front().num_kv_heads, 8);
  EXPECT_EQ(d.layers.front().head_size, 128);
}

TEST(SupportedTypes, IncludeEveryRequiredFamily) {
  auto types = supported_model_types();
  for (std::string_view family :
       {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt_oss", "qwen3_next",
        "qwen3_5", "nemotron_h", "granitemoehybrid", "jamba", "deepseek_v3", "kimi_linear",
        "glm4_moe"}) {
    EXPECT_NE(std::find(types.begin(), types.end(), family), types.end()) << family;
  }
}

TEST(KvDtype, AutoFollowsTheModelDtypeAndOptionsOverrideIt) {
  EXPECT_EQ(describe_builtin("qwen3-8b").layers.front().kv_dtype, DType::kBfloat16);
  DescribeOptions options;
  options.kv_dtype = DType::kFp8E4m3;
  const ModelDesc d = describe_builtin("qwen3-8b", {}, options);
  EXPECT_EQ(d.layers.front().kv_dtype, DType::kFp8E4m3);
  EXPECT_EQ(kv_bytes_per_token(d.layers.front()), 2 * 8 * 128);
}

TEST(KvDtype, Nvfp4CountsOneScalePerSixteenElements) {
  DescribeOptions options;
  options.kv_dtype = DType::kNvfp4;
  const ModelDesc d = describe_builtin("qwen3-8b", {}, options);
  // 8 x 128 elements per K: 512 data bytes + 64 scale bytes; the same for V.
  EXPECT_EQ(kv_bytes_per_token(d.layers.front()), 2 * (512 + 64));
}

TEST(SsmDtype, OptionSetsTemporalStateButNotConvState) {
  DescribeOptions options;
  options.ssm_dtype = DType::kFloat32;
  const ModelDesc d = describe_builtin("qwen3-next-80b-a3b", {}, options);
  const LayerDesc& gdn = *layers_of(d, LayerKind::kGdn).front();
  EXPECT_EQ(state_named(gdn, "temporal").dtype, DType::kFloat32);
  EXPECT_EQ(state_named(gdn, "conv").dtype, DType::kBfloat16);
  EXPECT_EQ(state_bytes(gdn), 3 * 8192 * 2 + 32 * 128 * 128 * 4);
}

TEST(LayerKvDtype, GlobOverridesApplyToMatchingAttentionLayersOnly) {
  DescribeOptions options;
  options.layer_kv_dtypes = {parse_layer_dtype_override("layers.3=float16"),
                             parse_layer_dtype_override("layers.1?=fp8_e5m2")};
  const ModelDesc d = describe_builtin("qwen3-next-80b-a3b", {}, options);
  for (const auto& l : d.layers) {
    if (l.name == "layers.3") {
      EXPECT_EQ(l.kv_dtype, DType::kFloat16);
    } else if (l.name == "layers.11" || l.name == "layers.15" || l.name == "layers.19") {
      EXPECT_EQ(l.kv_dtype, DType::kFp8E5m2) << l.name;
    } else {
      EXPECT_EQ(l.kv_dtype, DType::kBfloat16) << l.name;  // GDN layers 10, 12.. untouched
    }
  }
}

}  // namespace
}  // namespace mixkv::model
