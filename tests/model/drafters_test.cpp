// Drafters join the target's description: EAGLE-3 heads, DFlash block drafters, the target's own
// MTP layers, and ordinary models used as drafts.
#include <gtest/gtest.h>

#include "mixkv/model/describe.hpp"
#include "test_support.hpp"

namespace mixkv::model {
namespace {

using testing::describe_builtin;
using testing::layers_of;

std::vector<const LayerDesc*> draft_layers(const ModelDesc& d) {
  std::vector<const LayerDesc*> out;
  for (const auto& l : d.layers) {
    if (l.owner == Owner::kDraft) out.push_back(&l);
  }
  return out;
}

TEST(DflashDrafter, LayersAreOwnedByTheDraftAndNonCausal) {
  const ModelDesc d = describe_builtin("qwen3.5-27b", "dflash-qwen3.5-27b");
  EXPECT_EQ(d.draft, "dflash-qwen3.5-27b");
  auto draft = draft_layers(d);
  ASSERT_EQ(draft.size(), 5u);
  for (const auto* l : draft) {
    EXPECT_FALSE(l->causal) << l->name;
    EXPECT_EQ(l->num_q_heads, 32);
    EXPECT_EQ(l->num_kv_heads, 8);
    EXPECT_EQ(l->head_size, 128);
    EXPECT_TRUE(l->name.starts_with("draft.layers."));
  }
  // Target layers stay causal and come first.
  EXPECT_EQ(d.layers.front().owner, Owner::kTarget);
  for (const auto& l : d.layers) {
    if (l.owner == Owner::kTarget) {
      EXPECT_TRUE(l.causal);
    }
  }
  ASSERT_TRUE(d.draft_info.has_value());
  EXPECT_EQ(d.draft_info->kind, DraftKind::kDflash);
  EXPECT_EQ(d.draft_info->block_size, 16);
  EXPECT_EQ(d.draft_info->target_layer_ids, (std::vector<int>{1, 16, 31, 46, 61}));
}

TEST(DflashDrafter, DefaultSpeculativeTokensAreTheBlockMinusItsAnchor) {
  const ModelDesc d = describe_builtin("qwen3.5-27b", "dflash-qwen3.5-27b");
  EXPECT_EQ(d.num_spec_tokens, 15);
  // The target's GDN conv state carries one row per speculative token.
  const auto* gdn = layers_of(d, LayerKind::kGdn).front();
  EXPECT_EQ(gdn->state.front().shape.front(), 3 + 15);
}

TEST(DflashDrafter, QwenEightBDrafterReadsBlockAndTargetLayers) {
  const ModelDesc d = describe_builtin("qwen3-8b", "dflash-qwen3-8b-b16");
  EXPECT_EQ(draft_layers(d).size(), 5u);
  EXPECT_EQ(d.draft_info->target_layer_ids, (std::vector<int>{1, 9, 17, 25, 33}));
}

ModelSource dflash_source(std::string_view extra_fields) {
  const std::string text =
      std::string(R"({"model_type": "qwen3", "architectures": ["DFlashDraftModel"],
      "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
      "block_size": 8, "sliding_window": 2048,
      "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
      "dflash_config": {"target_layer_ids": [1, 2]})") +
      std::string(extra_fields) + "}";
  return parse_model_source("dflash-test", "dflash-test.json", text);
}

TEST(DflashDrafter, SlidingLayersKeepTheirWindowAndExplicitIsCausalWins) {
  const ModelSource target = load_model_source("qwen3-8b");
  ModelDesc d = describe(target, dflash_source(""), {});
  auto draft = draft_layers(d);
  ASSERT_EQ(draft.size(), 3u);
  EXPECT_EQ(draft[0]->kind, LayerKind::kSliding);
  EXPECT_EQ(*draft[0]->window, 2048);
  EXPECT_EQ(draft[2]->kind, LayerKind::kFull);
  for (const auto* l : draft) {
    EXPECT_FALSE(l->causal);
  }
  EXPECT_EQ(d.num_spec_tokens, 7);

  d = describe(target, dflash_source(R"(, "is_causal": true)"), {});
  for (const auto* l : draft_layers(d)) {
    EXPECT_TRUE(l->causal);
  }
}

TEST(Eagle3Drafter, OneCausalLayerOwnedByTheDraft) {
  const ModelDesc d = describe_builtin("llama-3.1-8b", "eagle3-llama-3.1-8b");
  auto draft = draft_layers(d);
  ASSERT_EQ(draft.size(), 1u);
  EXPECT_TRUE(draft[0]->causal);
  EXPECT_EQ(draft[0]->kind, LayerKind::kFull);
  EXPECT_EQ(draft[0]->num_q_heads, 32);
  EXPECT_EQ(draft[0]->num_kv_heads, 8);
  EXPECT_EQ(d.draft_info->kind, DraftKind::kEagle3);
  // No aux layers in the config: EAGLE-3's default taps (2, L/2, L-3).
  EXPECT_EQ(d.draft_info->target_layer_ids, (std::vector<int>{2, 16, 29}));
  EXPECT_EQ(d.num_spec_tokens, 3);
}

TEST(Eagle3Drafter, GptOssHeadIsFullAttentionWithoutSinksAndUsesItsAuxLayers) {
  const ModelDesc d = describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b");
  auto draft = draft_layers(d);
  ASSERT_EQ(draft.size(), 1u);
  EXPECT_EQ(draft[0]->kind, LayerKind::kFull);
  EXPECT_FALSE(draft[0]->window.has_value());
  EXPECT_FALSE(draft[0]->sinks);
  EXPECT_EQ(d.draft_info->target_layer_ids, (std::vector<int>{1, 11, 21}));
}

TEST(Eagle3Drafter, RunsInTheTargetDtypeUnlessToldOtherwise) {
  // The EAGLE-3 Llama head's own config says float16; engines load drafts in the target's dtype.
  ModelDesc d = describe_builtin("llama-3.1-8b", "eagle3-llama-3.1-8b");
  EXPECT_EQ(draft_layers(d)[0]->kv_dtype, DType::kBfloat16);
  DescribeOptions options;
  options.kv_dtype = DType::kFp8E4m3;
  options.draft_kv_dtype = DType::kBfloat16;
  d = describe_builtin("llama-3.1-8b", "eagle3-llama-3.1-8b", options);
  EXPECT_EQ(d.layers.front().kv_dtype, DType::kFp8E4m3);
  EXPECT_EQ(draft_layers(d)[0]->kv_dtype, DType::kBfloat16);
}

TEST(DraftKvDtype, FollowsKvDtypeWhenNotGiven) {
  DescribeOptions options;
  options.kv_dtype = DType::kFp8E4m3;
  const ModelDesc d = describe_builtin("qwen3.5-27b", "dflash-qwen3.5-27b", options);
  for (const auto* l : draft_layers(d)) {
    EXPECT_EQ(l->kv_dtype, DType::kFp8E4m3);
  }
}

TEST(MhaDraft, FortyKvHeadsBesideTheGqaTarget) {
  const ModelDesc d = describe_builtin("qwen3.5-27b", "mha-draft-qwen3.5-27b");
  auto draft = draft_layers(d);
  ASSERT_EQ(draft.size(), 1u);
  EXPECT_EQ(draft[0]->num_q_heads, 40);
  EXPECT_EQ(draft[0]->num_kv_heads, 40);
  EXPECT_EQ(draft[0]->head_size, 128);
  EXPECT_EQ(d.draft_info->kind, DraftKind::kModel);
  // 40 x 128 x 2 x 2 bytes per token: more than one target full layer (4 x 256 x 2 x 2).
  EXPECT_EQ(kv_bytes_per_token(*draft[0]), 20480);
  EXPECT_EQ(kv_bytes_per_token(*layers_of(d, LayerKind::kFull).front()), 4096);
}

TEST(MtpDrafter, DeepseekDeclaresOneMlaLayerAfterItsLast) {
  const ModelDesc d = describe_builtin("deepseek-v3", kMtpDraft);
  auto draft = draft_layers(d);
  ASSERT_EQ(draft.size(), 1u);
  EXPECT_EQ(draft[0]->kind, LayerKind::kMla);
  EXPECT_EQ(draft[0]->index, 61);
  EXPECT_EQ(draft[0]->name, "mtp.layers.0");
  EXPECT_EQ(d.draft_info->kind, DraftKind::kMtp);
  EXPECT_EQ(d.num_spec_tokens, 1);
}

TEST(MtpDrafter, QwenAndGlmMtpLayersAreFullAttention) {
  for (auto [target, index, q] :
       {std::tuple{"qwen3.5-27b", 64, 24}, std::tuple{"glm-4.5-air", 46, 96}}) {
    const ModelDesc d = describe_builtin(target, kMtpDraft);
    auto draft = draft_layers(d);
    ASSERT_EQ(draft.size(), 1u) << target;
    EXPECT_EQ(draft[0]->kind, LayerKind::kFull);
    EXPECT_EQ(draft[0]->index, index);
    EXPECT_EQ(draft[0]->num_q_heads, q);
    EXPECT_TRUE(draft[0]->causal);
  }
}

TEST(MtpDrafter, TargetWithoutMtpLayersIsAnError) {
  testing::expect_error([] { describe_builtin("llama-3.1-8b", kMtpDraft); },
                        ErrorCode::kInvalidInput,
                        {"declares no MTP layers", "num_nextn_predict_layers"});
}

TEST(PlainDraftModel, AnySupportedModelCanDraft) {
  const ModelDesc d = describe_builtin("qwen3-32b", "qwen3-8b");
  EXPECT_EQ(draft_layers(d).size(), 36u);
  EXPECT_EQ(d.draft_info->kind, DraftKind::kModel);
  EXPECT_EQ(d.layers.size(), 64u + 36u);
  EXPECT_EQ(draft_layers(d).front()->name, "draft.layers.0");
}

TEST(DrafterTargetLayers, MustExistInTheTarget) {
  // The Qwen3.5 DFlash drafter taps layers up to 61; Qwen3-8B has 36 layers.
  testing::expect_error([] { describe_builtin("qwen3-8b", "dflash-qwen3.5-27b"); },
                        ErrorCode::kInvalidInput, {"target_layer_ids", "layer 46", "36 layers"});
}

TEST(DrafterTensorParallel, DraftHeadsShardLikeTheTarget) {
  DescribeOptions options;
  options.tp = 8;
  const ModelDesc d = describe_builtin("qwen3.5-27b", "mha-draft-qwen3.5-27b", options);
  EXPECT_EQ(draft_layers(d)[0]->num_q_heads, 5);
  EXPECT_EQ(draft_layers(d)[0]->num_kv_heads, 5);
  EXPECT_EQ(layers_of(d, LayerKind::kFull).front()->num_q_heads, 3);
  EXPECT_EQ(layers_of(d, LayerKind::kFull).front()->num_kv_heads, 1);
}

}  // namespace
}  // namespace mixkv::model
