// Real config.json files of public models (tests/model/fixtures/, each with its `_source`), read
// against the facts worked out by hand from the config and its HF configuration class: layer
// kinds and counts, heads, head size, scale, window or chunk, state shapes and dtypes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mixkv/model/describe.hpp"
#include "mixkv/model/model_json.hpp"
#include "model/config_reader.hpp"
#include "test_support.hpp"

namespace mixkv::model {
namespace {

using testing::describe_builtin;
using testing::layers_of;

std::string fixture(std::string_view name) {
  return std::string(MIXKV_SOURCE_DIR) + "/tests/model/fixtures/" + std::string(name);
}

ModelDesc describe_fixture(std::string_view name, std::optional<std::string> draft = std::nullopt,
                           const DescribeOptions& options = {}) {
  const std::string target = fixture(name);
  if (!draft) return describe_refs(target, std::nullopt, options);
  return describe_refs(target, *draft, options);
}

using testing::indices;

std::vector<int> every(int from, int to, int step) {
  std::vector<int> out;
  for (int i = from; i <= to; i += step) out.push_back(i);
  return out;
}

const StateTensor& state(const LayerDesc& layer, std::string_view name) {
  for (const auto& t : layer.state) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << layer.name << " has no state tensor " << name;
  static const StateTensor kMissing;
  return kMissing;
}

void expect_attention(const LayerDesc& l, int q, int kv, int head) {
  EXPECT_EQ(l.num_q_heads, q) << l.name;
  EXPECT_EQ(l.num_kv_heads, kv) << l.name;
  EXPECT_EQ(l.head_size, head) << l.name;
  EXPECT_EQ(l.head_size_v, head) << l.name;
}

using Shape = std::vector<std::int64_t>;

TEST(RealConfigs, Phi3MiniSlidesEveryLayerOver2047TokensWithHeadSize96) {
  const ModelDesc d = describe_fixture("phi-3-mini-4k-instruct.json");
  ASSERT_EQ(d.layers.size(), 32u);
  for (const auto& l : d.layers) {
    EXPECT_EQ(l.kind, LayerKind::kSliding);
    EXPECT_EQ(l.window, 2047);
    expect_attention(l, 32, 32, 96);  // 3072 / 32: MHA
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / std::sqrt(96.0));
  }
}

TEST(RealConfigs, Phi4MiniKeepsFullHeadsUnderPartialRotary) {
  // partial_rotary_factor 0.75 rotates 96 of 128 dims; the cache still holds all 128.
  const ModelDesc d = describe_fixture("phi-4-mini-instruct.json");
  ASSERT_EQ(d.layers.size(), 32u);
  for (const auto& l : d.layers) {
    EXPECT_EQ(l.kind, LayerKind::kSliding);
    EXPECT_EQ(l.window, 262144);
    expect_attention(l, 24, 8, 128);
  }
  EXPECT_EQ(d.facts.max_position_embeddings, 131072);
}

TEST(RealConfigs, Llama4ScoutChunksThreeLayersInFourAndKeepsEveryFourthGlobal) {
  const ModelDesc d = describe_fixture("llama-4-scout-17b-16e.json");
  ASSERT_EQ(d.layers.size(), 48u);
  const auto global = layers_of(d, LayerKind::kFull);
  const auto chunked = layers_of(d, LayerKind::kChunked);
  EXPECT_EQ(indices(global), every(3, 47, 4));  // the NoPE layers
  ASSERT_EQ(chunked.size(), 36u);
  for (const auto* l : chunked) {
    EXPECT_EQ(l->chunk, 8192);
    EXPECT_NE((l->index + 1) % 4, 0);
  }
  for (const auto& l : d.layers) {
    expect_attention(l, 40, 8, 128);
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / std::sqrt(128.0));
  }
}

TEST(RealConfigs, Llama4NoRopeLayersListDecidesWhichLayersChunk) {
  const ModelDesc d = testing::describe_text(R"({"model_type": "llama4_text",
      "num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 0], "attention_chunk_size": 4096})");
  EXPECT_EQ(indices(layers_of(d, LayerKind::kChunked)), (std::vector<int>{0, 2}));
  EXPECT_EQ(indices(layers_of(d, LayerKind::kFull)), (std::vector<int>{1, 3}));
  // Llama4TextConfig's defaults fill the attention shape.
  expect_attention(d.layers.front(), 40, 8, 128);
}

TEST(RealConfigs, Mistral3TextConfigFormsAreFullAttentionWithTheirOwnHeadDim) {
  const ModelDesc ministral = describe_fixture("ministral-3-8b-instruct-2512.json");
  ASSERT_EQ(ministral.layers.size(), 34u);
  for (const auto& l : ministral.layers) {
    EXPECT_EQ(l.kind, LayerKind::kFull);
    expect_attention(l, 32, 8, 128);
  }
  // Devstral-Small-2: head_dim 128 although hidden_size / heads is 160; yarn's mscale leaves the
  // softmax scale alone (it scales cos/sin).
  const ModelDesc devstral = describe_fixture("devstral-small-2-24b.json");
  ASSERT_EQ(devstral.layers.size(), 40u);
  for (const auto& l : devstral.layers) {
    EXPECT_EQ(l.kind, LayerKind::kFull);
    expect_attention(l, 32, 8, 128);
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / std::sqrt(128.0));
  }
}

TEST(RealConfigs, KimiK25NestsAKimiK2TextConfigOfMlaLayers) {
  const ModelDesc d = describe_fixture("kimi-k2.5.json");
  ASSERT_EQ(d.layers.size(), 61u);
  for (const auto& l : d.layers) {
    EXPECT_EQ(l.kind, LayerKind::kMla);
    EXPECT_EQ(l.num_q_heads, 64);
    EXPECT_EQ(l.num_kv_heads, 1);
    EXPECT_EQ(l.head_size, 576);  // kv_lora_rank 512 + qk_rope_head_dim 64
    EXPECT_EQ(l.head_size_v, 512);
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / std::sqrt(192.0));  // no rope_scaling: no yarn mscale
    EXPECT_EQ(kv_bytes_per_token(l), 1152);
  }
  // num_nextn_predict_layers 0: --draft mtp has nothing to use.
  testing::expect_error([] { describe_fixture("kimi-k2.5.json", "mtp"); }, ErrorCode::kInvalidInput,
                        {"declares no MTP layers"});
}

TEST(RealConfigs, DeepSeekV32PlansEachIndexerKeyCacheAsItsOwnLayer) {
  const ModelDesc d = describe_fixture("deepseek-v3.2.json");
  ASSERT_EQ(d.layers.size(), 122u);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  int indexers = 0;
  for (std::size_t i = 0; i < d.layers.size(); i += 2) {
    const LayerDesc& mla = d.layers[i];
    const LayerDesc& idx = d.layers[i + 1];
    EXPECT_EQ(mla.kind, LayerKind::kMla);
    EXPECT_FALSE(mla.indexer);
    EXPECT_EQ(mla.head_size, 576);
    EXPECT_NEAR(mla.scale, mscale * mscale / std::sqrt(192.0), 1e-12);
    // Same layer index, own spec: 128 fp8 key elements plus one fp32 scale per 128.
    EXPECT_EQ(idx.name, mla.name + ".indexer");
    EXPECT_EQ(idx.index, mla.index);
    EXPECT_TRUE(idx.indexer);
    EXPECT_EQ(idx.kind, LayerKind::kMla);
    EXPECT_EQ(idx.num_q_heads, 64);
    EXPECT_EQ(idx.num_kv_heads, 1);
    EXPECT_EQ(idx.head_size, 132);
    EXPECT_EQ(idx.kv_dtype, DType::kFp8E4m3);
    EXPECT_EQ(kv_bytes_per_token(idx), 132);
    EXPECT_DOUBLE_EQ(idx.scale, 1.0 / std::sqrt(128.0));
    indexers += idx.indexer ? 1 : 0;
  }
  EXPECT_EQ(indexers, 61);
}

TEST(RealConfigs, DeepSeekV32IndexerKeepsItsFormatUnderTpAndKvDtype) {
  DescribeOptions options;
  options.tp = 8;
  options.kv_dtype = DType::kFp8E4m3;
  const ModelDesc d = describe_fixture("deepseek-v3.2.json", std::nullopt, options);
  for (const auto& l : d.layers) {
    if (l.indexer) {
      EXPECT_EQ(l.num_q_heads, 64) << l.name;  // vLLM replicates the indexer
      EXPECT_EQ(l.kv_dtype, DType::kFp8E4m3);
    } else {
      EXPECT_EQ(l.num_q_heads, 16) << l.name;
    }
  }
  options.tp.reset();
  options.kv_dtype = DType::kFloat16;
  options.layer_kv_dtypes = {{"layers.*", DType::kBfloat16}};
  const ModelDesc wide = describe_fixture("deepseek-v3.2.json", std::nullopt, options);
  for (const auto& l : wide.layers) {
    EXPECT_EQ(l.kv_dtype, l.indexer ? DType::kFp8E4m3 : DType::kBfloat16) << l.name;
  }
}

TEST(RealConfigs, DeepSeekV32MtpLayerCarriesItsIndexer) {
  const ModelDesc d = describe_fixture("deepseek-v3.2.json", "mtp");
  EXPECT_EQ(d.num_spec_tokens, 1);
  const auto draft = layers_of(d, LayerKind::kMla, Owner::kDraft);
  ASSERT_EQ(draft.size(), 2u);
  EXPECT_EQ(draft[0]->name, "mtp.layers.0");
  EXPECT_EQ(draft[1]->name, "mtp.layers.0.indexer");
  EXPECT_EQ(draft[0]->index, 61);
  EXPECT_EQ(draft[1]->index, 61);
  EXPECT_TRUE(draft[1]->indexer);
}

TEST(RealConfigs, Glm47FlashIsMlaWithAnMtpLayer) {
  const ModelDesc d = describe_fixture("glm-4.7-flash.json");
  ASSERT_EQ(d.layers.size(), 47u);
  for (const auto& l : d.layers) {
    EXPECT_EQ(l.kind, LayerKind::kMla);
    EXPECT_EQ(l.num_q_heads, 20);
    EXPECT_EQ(l.head_size, 576);
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / 16.0);  // (192 + 64) ** -0.5
  }
  const ModelDesc mtp = describe_fixture("glm-4.7-flash.json", "mtp");
  ASSERT_EQ(layers_of(mtp, LayerKind::kMla, Owner::kDraft).size(), 1u);
  EXPECT_EQ(mtp.num_spec_tokens, 1);
}

TEST(RealConfigs, FalconH1HoldsAttentionAndMamba2AtEveryLayerIndex) {
  const ModelDesc d = describe_fixture("falcon-h1-7b-instruct.json");
  ASSERT_EQ(d.layers.size(), 88u);
  const auto attn = layers_of(d, LayerKind::kFull);
  const auto mamba = layers_of(d, LayerKind::kMamba2);
  ASSERT_EQ(attn.size(), 44u);
  ASSERT_EQ(mamba.size(), 44u);
  for (std::size_t i = 0; i < 44; ++i) {
    EXPECT_EQ(attn[i]->index, static_cast<int>(i));
    EXPECT_EQ(mamba[i]->index, static_cast<int>(i));
    EXPECT_EQ(attn[i]->name, "layers." + std::to_string(i) + ".attn");
    EXPECT_EQ(mamba[i]->name, "layers." + std::to_string(i) + ".mamba");
    expect_attention(*attn[i], 12, 2, 128);
    // conv over x, B, C: 24 x 128 + 2 x 1 x 256; SSM state float32 (no config key says otherwise).
    EXPECT_EQ(state(*mamba[i], "conv").shape, (Shape{3, 3584}));
    EXPECT_EQ(state(*mamba[i], "conv").dtype, DType::kBfloat16);
    EXPECT_EQ(state(*mamba[i], "ssm").shape, (Shape{24, 128, 256}));
    EXPECT_EQ(state(*mamba[i], "ssm").dtype, DType::kFloat32);
  }
  DescribeOptions tp2;
  tp2.tp = 2;
  const ModelDesc sharded = describe_fixture("falcon-h1-7b-instruct.json", std::nullopt, tp2);
  const LayerDesc& m = *layers_of(sharded, LayerKind::kMamba2).front();
  EXPECT_EQ(state(m, "conv").shape, (Shape{3, 12 * 128 + 2 * 256}));  // one group, replicated
  EXPECT_EQ(state(m, "ssm").shape, (Shape{12, 128, 256}));
  expect_attention(*layers_of(sharded, LayerKind::kFull).front(), 6, 1, 128);
}

TEST(RealConfigs, FalconH1AutoHeadDimDividesTheMambaWidth) {
  const ModelDesc d = testing::describe_text(R"({"model_type": "falcon_h1", "num_hidden_layers": 1,
      "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
      "mamba_d_ssm": 1536, "mamba_n_heads": 24, "mamba_d_state": 128})");
  const LayerDesc& m = *layers_of(d, LayerKind::kMamba2).front();
  EXPECT_EQ(state(m, "ssm").shape, (Shape{24, 64, 128}));             // "auto": 1536 / 24
  EXPECT_EQ(state(m, "conv").shape, (Shape{3, 1536 + 2 * 1 * 128}));  // default 1 group, conv 4
}

TEST(RealConfigs, MiniMaxM1LightningLayersKeepOneStatePerHead) {
  const ModelDesc d = describe_fixture("minimax-m1-80k.json");
  ASSERT_EQ(d.layers.size(), 80u);
  const auto softmax = layers_of(d, LayerKind::kFull);
  const auto lightning = layers_of(d, LayerKind::kLightning);
  EXPECT_EQ(indices(softmax), every(7, 79, 8));  // attn_type_list: 1 every eighth layer
  ASSERT_EQ(lightning.size(), 70u);
  for (const auto* l : softmax) expect_attention(*l, 64, 8, 128);
  for (const auto* l : lightning) {
    ASSERT_EQ(l->state.size(), 1u);
    EXPECT_EQ(state(*l, "kv").shape, (Shape{64, 128, 128}));
    EXPECT_EQ(state(*l, "kv").dtype, DType::kBfloat16);
    EXPECT_EQ(state_bytes(*l), 64 * 128 * 128 * 2);
  }
  // No conv, so speculation adds nothing to the state.
  DescribeOptions spec;
  spec.num_spec_tokens = 2;
  const ModelDesc s = describe_fixture("minimax-m1-80k.json", std::nullopt, spec);
  EXPECT_EQ(state(*layers_of(s, LayerKind::kLightning).front(), "kv").shape, (Shape{64, 128, 128}));
}

TEST(RealConfigs, PlainAttentionUnderNewNames) {
  const ModelDesc m2 = describe_fixture("minimax-m2.json");
  ASSERT_EQ(m2.layers.size(), 62u);
  for (const auto& l : m2.layers) {
    EXPECT_EQ(l.kind, LayerKind::kFull);
    expect_attention(l, 48, 8, 128);
  }
  const ModelDesc hunyuan = describe_fixture("hunyuan-a13b-instruct.json");
  ASSERT_EQ(hunyuan.layers.size(), 32u);
  for (const auto& l : hunyuan.layers) expect_attention(l, 32, 8, 128);
  const ModelDesc vl = describe_fixture("qwen3-vl-30b-a3b-instruct.json");
  ASSERT_EQ(vl.layers.size(), 48u);
  for (const auto& l : vl.layers) {
    EXPECT_EQ(l.kind, LayerKind::kFull);
    expect_attention(l, 32, 4, 128);
  }
  EXPECT_EQ(vl.facts.vocab_size, 151936);
}

TEST(RealConfigs, HunyuanCrossLayerAttentionCachesEveryShareFactorthLayer) {
  const ModelDesc d = testing::describe_text(R"({"model_type": "hunyuan", "num_hidden_layers": 8,
      "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
      "attention_head_dim": 128, "use_cla": true, "cla_share_factor": 2})");
  EXPECT_EQ(indices(layers_of(d, LayerKind::kFull)), (std::vector<int>{0, 2, 4, 6}));
  expect_attention(d.layers.front(), 8, 2, 128);
}

TEST(RealConfigs, MimoDeclaresOneMtpLayer) {
  const ModelDesc d = describe_fixture("mimo-7b-rl.json");
  ASSERT_EQ(d.layers.size(), 36u);
  for (const auto& l : d.layers) {
    EXPECT_EQ(l.kind, LayerKind::kFull);  // use_sliding_window false
    expect_attention(l, 32, 8, 128);
  }
  const ModelDesc mtp = describe_fixture("mimo-7b-rl.json", "mtp");
  const auto draft = layers_of(mtp, LayerKind::kFull, Owner::kDraft);
  ASSERT_EQ(draft.size(), 1u);
  EXPECT_EQ(draft[0]->index, 36);
  EXPECT_EQ(mtp.num_spec_tokens, 1);
}

TEST(RealConfigs, Gemma3TextConfigWithOnlyNonDefaultKeysTakesGemma3TextConfigDefaults) {
  // gemma-3-4b-it names neither heads nor head_dim: 8 heads, 4 KV heads, head_dim 256 (not
  // 2560 / 8 = 320), query_pre_attn_scalar 256, a global layer every sixth.
  const ModelDesc d = describe_fixture("gemma-3-4b-it.json");
  ASSERT_EQ(d.layers.size(), 34u);
  EXPECT_EQ(indices(layers_of(d, LayerKind::kFull)), every(5, 29, 6));
  EXPECT_EQ(layers_of(d, LayerKind::kSliding).size(), 29u);
  for (const auto& l : d.layers) {
    expect_attention(l, 8, 4, 256);
    EXPECT_DOUBLE_EQ(l.scale, 1.0 / 16.0);
    EXPECT_FALSE(l.soft_cap.has_value());  // final_logit_softcapping caps logits, not attention
    if (l.kind == LayerKind::kSliding) {
      EXPECT_EQ(l.window, 1024);
    }
  }
  EXPECT_EQ(d.facts.vocab_size, 262208);  // Gemma3TextConfig's default
}

TEST(RealConfigs, NemotronHLayersBlockTypeInfinityAndMtp) {
  const ModelDesc d = describe_fixture("nemotron-3-nano-30b-a3b.json");
  const auto mamba = layers_of(d, LayerKind::kMamba2);
  const auto attn = layers_of(d, LayerKind::kFull);
  ASSERT_EQ(mamba.size(), 23u);
  ASSERT_EQ(attn.size(), 6u);
  EXPECT_EQ(indices(attn).front(), 5);  // "mamba, moe, mamba, moe, mamba, attention, ..."
  EXPECT_EQ(indices(attn)[1], 12);
  for (const auto* l : attn) expect_attention(*l, 32, 2, 128);
  for (const auto* l : mamba) {
    EXPECT_EQ(state(*l, "conv").shape, (Shape{3, 64 * 64 + 2 * 8 * 128}));
    EXPECT_EQ(state(*l, "ssm").shape, (Shape{64, 64, 128}));
    EXPECT_EQ(state(*l, "ssm").dtype, DType::kFloat32);
  }
  // mtp_layers_block_type ["attention", "moe"]: one attention layer after the 52 blocks.
  const ModelDesc mtp = describe_fixture("nemotron-3-nano-30b-a3b.json", "mtp");
  EXPECT_EQ(mtp.num_spec_tokens, 1);
  const auto draft = layers_of(mtp, LayerKind::kFull, Owner::kDraft);
  ASSERT_EQ(draft.size(), 1u);
  EXPECT_EQ(draft[0]->index, 52);
  EXPECT_EQ(draft[0]->name, "mtp.layers.0");
  EXPECT_EQ(state(*layers_of(mtp, LayerKind::kMamba2).front(), "conv").shape, (Shape{4, 6144}));
}

TEST(RealConfigs, NemotronHMtpPatternStringAndItsStepsMakeTheSpeculativeTokens) {
  const ModelDesc d = testing::describe_text(R"({"model_type": "nemotron_h",
      "hybrid_override_pattern": "M*", "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "hidden_size": 64, "mamba_num_heads": 4, "mamba_head_dim": 16,
      "n_groups": 1, "ssm_state_size": 8, "num_nextn_predict_layers": 2,
      "mtp_hybrid_override_pattern": "M*E"})");
  EXPECT_EQ(d.layers.size(), 2u);  // no --draft: the MTP layers stay out
  const ModelSource src = parse_model_source("t", "test.json", R"({"model_type": "nemotron_h",
      "hybrid_override_pattern": "M*", "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "hidden_size": 64, "mamba_num_heads": 4, "mamba_head_dim": 16,
      "n_groups": 1, "ssm_state_size": 8, "num_nextn_predict_layers": 2,
      "mtp_hybrid_override_pattern": "M*E"})");
  const ModelDesc mtp = describe_mtp(src, {});
  EXPECT_EQ(mtp.num_spec_tokens, 2);  // two steps, each of one Mamba2 and one attention layer
  std::vector<std::string> names;
  std::vector<int> idx;
  for (const auto& l : mtp.layers) {
    if (l.owner == Owner::kDraft) names.push_back(l.name), idx.push_back(l.index);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"mtp.layers.0", "mtp.layers.1", "mtp.layers.2",
                                             "mtp.layers.3"}));
  EXPECT_EQ(idx, (std::vector<int>{2, 3, 5, 6}));  // blocks 2..7, E blocks hold no cache
}

TEST(RealConfigs, Mamba2StateIsFloat32UnlessTheConfigSaysSo) {
  // Nemotron-H 8B's config has no mamba_ssm_cache_dtype: float32, as HF, vLLM and TRT-LLM size it.
  const ModelDesc nemo = describe_builtin("nemotron-h-8b");
  for (const auto* l : layers_of(nemo, LayerKind::kMamba2)) {
    EXPECT_EQ(state(*l, "ssm").dtype, DType::kFloat32) << l->name;
    EXPECT_EQ(state(*l, "conv").dtype, DType::kBfloat16) << l->name;
  }
  const ModelDesc granite = describe_builtin("granite-4.0-h-small");
  EXPECT_EQ(state(*layers_of(granite, LayerKind::kMamba2).front(), "ssm").dtype, DType::kFloat32);
  // A config that asks for bfloat16 gets it; --ssm-dtype still overrides.
  nlohmann::json c = nlohmann::json::parse(load_model_source("nemotron-h-8b").doc->dump());
  c["mamba_ssm_cache_dtype"] = "bfloat16";
  const ModelDesc asked = testing::describe_text(c.dump());
  EXPECT_EQ(state(*layers_of(asked, LayerKind::kMamba2).front(), "ssm").dtype, DType::kBfloat16);
  DescribeOptions o;
  o.ssm_dtype = DType::kFloat16;
  const ModelDesc forced = describe_builtin("nemotron-h-8b", {}, o);
  EXPECT_EQ(state(*layers_of(forced, LayerKind::kMamba2).front(), "ssm").dtype, DType::kFloat16);
}

TEST(RealConfigs, Eagle3HeadSayingLlamaForCausalLMWithDraftVocabIsEagle3) {
  const ModelDesc d = describe_refs("llama-3.1-8b", fixture("eagle3-llama3.1-8b-yuhuili.json"), {});
  ASSERT_TRUE(d.draft_info.has_value());
  EXPECT_EQ(d.draft_info->kind, DraftKind::kEagle3);
  EXPECT_EQ(d.draft_info->target_layer_ids, (std::vector<int>{2, 16, 29}));
  EXPECT_EQ(d.num_spec_tokens, 3);
  const auto draft = layers_of(d, LayerKind::kFull, Owner::kDraft);
  ASSERT_EQ(draft.size(), 1u);
  expect_attention(*draft[0], 32, 8, 128);
}

TEST(RealConfigs, DraftVocabSizeDoesNotTurnADflashDrafterIntoEagle3) {
  nlohmann::json c = nlohmann::json::parse(load_model_source("dflash-qwen3-8b-b16").doc->dump());
  c["draft_vocab_size"] = 32000;
  const ModelDesc d =
      describe(load_model_source("qwen3-8b"), parse_model_source("d", "dflash.json", c.dump()), {});
  ASSERT_TRUE(d.draft_info.has_value());
  EXPECT_EQ(d.draft_info->kind, DraftKind::kDflash);
}

TEST(RealConfigs, Eagle3HeadBorrowingPhi3IsReadByItsLlamaArchitecture) {
  const ModelDesc d =
      describe_refs(fixture("phi-4-mini-instruct.json"), fixture("eagle3-phi-4-mini.json"), {});
  ASSERT_TRUE(d.draft_info.has_value());
  EXPECT_EQ(d.draft_info->kind, DraftKind::kEagle3);
  const auto draft = layers_of(d, LayerKind::kFull, Owner::kDraft);
  ASSERT_EQ(draft.size(), 1u);  // a Llama layer: full attention, whatever sliding_window says
  expect_attention(*draft[0], 24, 8, 128);
  EXPECT_FALSE(draft[0]->window.has_value());
  EXPECT_TRUE(layers_of(d, LayerKind::kSliding, Owner::kDraft).empty());
}

TEST(RealConfigs, IndexerAndLightningLayersRoundTripThroughTheModelFile) {
  for (std::string_view name : {"deepseek-v3.2.json", "minimax-m1-80k.json"}) {
    const ModelDesc d = describe_fixture(name);
    const ModelDesc back = model_desc_from_json(to_json(d), "round trip");
    EXPECT_EQ(back.layers, d.layers) << name;
  }
  nlohmann::json bad = to_json(describe_fixture("minimax-m1-80k.json"));
  bad["layers"][0]["indexer"] = true;  // layer 0 is a lightning layer
  testing::expect_error([&] { model_desc_from_json(bad, "bad.json"); }, ErrorCode::kInvalidInput,
                        {"bad.json", "layers.0", "indexer"});
}

TEST(ConfigJson, AcceptsPythonsInfinityAndNanWhereNumbersGo) {
  const nlohmann::json doc = parse_config_json(
      R"({"a": [0.0, Infinity], "b": -Infinity, "c": NaN, "d": "Infinity and NaN stay text",
          "e": {"f": [NaN,Infinity]}, "g": "\"Infinity\""})");
  EXPECT_TRUE(std::isinf(doc["a"][1].get<double>()) && doc["a"][1].get<double>() > 0);
  EXPECT_TRUE(std::isinf(doc["b"].get<double>()) && doc["b"].get<double>() < 0);
  EXPECT_TRUE(std::isnan(doc["c"].get<double>()));
  EXPECT_EQ(doc["d"], "Infinity and NaN stay text");
  EXPECT_TRUE(std::isnan(doc["e"]["f"][0].get<double>()));
  EXPECT_EQ(doc["g"], "\"Infinity\"");
  // Only the bare words are numbers: anything else is still invalid JSON.
  EXPECT_THROW(parse_config_json(R"({"a": Infinityx})"), nlohmann::json::parse_error);
  EXPECT_THROW(parse_config_json(R"({"a": infinity})"), nlohmann::json::parse_error);
}

TEST(ConfigJson, InfinityWhereMixkvNeedsACountIsAClearError) {
  testing::expect_error(
      [] {
        testing::describe_text(R"({"model_type": "llama", "num_hidden_layers": Infinity,
            "num_attention_heads": 8, "hidden_size": 512})");
      },
      ErrorCode::kInvalidInput, {"num_hidden_layers", "Infinity", "expected an integer"});
}

}  // namespace
}  // namespace mixkv::model
