// Attention groups: layers share a metadata builder only when the backend's plan allows it.
#include "mixkv/attn/attention_groups.hpp"

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace mixkv::attn {

using backend::all_backends;
using backend::Backend;
using backend::kernel_page_rule;
using backend::model_traits;
using backend::parse_backend;

namespace {

using mixkv::testing::kGiB;

plan::CachePlan make(const model::ModelDesc& desc, plan::Policy policy = plan::Policy::kMixkv,
                     Backend backend = Backend::kFlashinfer) {
  plan::PlanOptions o;
  o.policy = policy;
  o.backend = backend;
  o.memory_bytes = 40 * kGiB;
  return plan::make_plan(desc, o);
}

const AttentionGroup& group_of(const std::vector<AttentionGroup>& groups, std::string_view layer) {
  for (const auto& g : groups) {
    if (std::find(g.layers.begin(), g.layers.end(), layer) != g.layers.end()) return g;
  }
  throw std::runtime_error("layer in no attention group");
}

TEST(AttentionGroups, SlidingAndFullLayersNeverShareAFlashinferBuilder) {
  const auto desc = testing::describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b");
  for (auto policy : {plan::Policy::kVllm, plan::Policy::kMixkv}) {
    const auto groups = build_attention_groups(desc, make(desc, policy));
    for (const auto& g : groups) {
      for (const auto& name : g.layers) {
        const auto& layer = *std::find_if(desc.layers.begin(), desc.layers.end(),
                                          [&](const auto& l) { return l.name == name; });
        EXPECT_EQ(attention_params(layer).window_left, g.params.window_left) << name;
        EXPECT_EQ(layer.sinks, g.params.sinks) << name;
      }
    }
    EXPECT_EQ(group_of(groups, "layers.0").params.window_left, 127);
    EXPECT_TRUE(group_of(groups, "layers.0").params.sinks);
    EXPECT_EQ(group_of(groups, "layers.1").params.window_left, -1);
    // The EAGLE head has no sinks: its own group, split for that reason.
    const AttentionGroup& draft = group_of(groups, "draft.layers.0");
    EXPECT_EQ(draft.layers.size(), 1u);
    EXPECT_NE(draft.split_reason.find("sinks"), std::string::npos) << draft.split_reason;
  }
}

TEST(AttentionGroups, DflashDraftIsNonCausalAndSeparateEvenInTheTargetsKvCacheGroup) {
  const auto desc = testing::describe_builtin("qwen3-8b", "dflash-qwen3-8b-b16");
  for (auto policy : {plan::Policy::kVllm, plan::Policy::kMixkv}) {
    const auto plan = make(desc, policy);
    const auto groups = build_attention_groups(desc, plan);
    const AttentionGroup& target = group_of(groups, "layers.0");
    const AttentionGroup& draft = group_of(groups, "draft.layers.0");
    EXPECT_NE(target.id, draft.id);
    EXPECT_TRUE(target.params.causal);
    EXPECT_FALSE(draft.params.causal);
    EXPECT_EQ(draft.layers.size(), 5u);
    EXPECT_EQ(target.kv_cache_group, draft.kv_cache_group);  // one block table, two builders
    EXPECT_NE(draft.split_reason.find("non-causal"), std::string::npos) << draft.split_reason;
  }
}

TEST(AttentionGroups, MhaDraftGetsAKernelPageFromItsOwnHeads) {
  model::DescribeOptions d;
  d.tp = 4;
  const auto desc = testing::describe_builtin("qwen3.5-27b", "mha-draft-qwen3.5-27b", d);
  for (auto policy : {plan::Policy::kVllm, plan::Policy::kMixkv}) {
    const auto plan = make(desc, policy);
    const auto groups = build_attention_groups(desc, plan);
    const AttentionGroup& draft = group_of(groups, "draft.layers.0");
    const AttentionGroup& target = group_of(groups, "layers.3");
    EXPECT_EQ(draft.params.num_q_heads, 10);
    EXPECT_EQ(draft.params.num_kv_heads, 10);
    EXPECT_NE(draft.id, target.id);
    const auto& draft_layer = desc.layers.back();
    EXPECT_TRUE(kernel_page_rule(Backend::kFlashinfer, draft_layer, model_traits(desc))
                    .accepts(draft.kernel_block_size));
    EXPECT_NE(draft.kernel_path.find("GQA 1"), std::string::npos);
    EXPECT_NE(target.kernel_path.find("GQA 6"), std::string::npos);
  }
}

TEST(AttentionGroups, DraftKvDtypeGivesTheDraftItsOwnGroupAndDtype) {
  model::DescribeOptions d;
  d.draft_kv_dtype = DType::kFp8E4m3;
  const auto desc = testing::describe_builtin("qwen3-8b", "dflash-qwen3-8b-b16", d);
  const auto groups = build_attention_groups(desc, make(desc));
  EXPECT_EQ(group_of(groups, "layers.0").params.kv_dtype, DType::kBfloat16);
  EXPECT_EQ(group_of(groups, "draft.layers.0").params.kv_dtype, DType::kFp8E4m3);
}

TEST(AttentionGroups, VllmGroupWithTwoDtypesFailsValidationNamingTheLayers) {
  const char* text = R"({"model": "mixed", "layers": [
      {"name": "a", "owner": "target", "index": 0, "kind": "full", "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64,
       "kv_dtype": "bfloat16"},
      {"name": "b", "owner": "target", "index": 1, "kind": "full", "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64,
       "kv_dtype": "float16"}]})";
  const auto desc =
      model::describe(model::parse_model_source("mixed", "mixed.json", text), std::nullopt, {});
  plan::PlanOptions o;
  o.policy = plan::Policy::kVllm;
  o.memory_bytes = kGiB;
  o.max_model_len = 4096;
  const auto plan = plan::make_plan(desc, o);
  testing::expect_error([&] { build_attention_groups(desc, plan); }, ErrorCode::kInvalidInput,
                        {"layer a is bfloat16", "layer b is float16"});
  o.policy = plan::Policy::kMixkv;
  const auto groups = build_attention_groups(desc, plan::make_plan(desc, o));
  EXPECT_NE(group_of(groups, "a").id, group_of(groups, "b").id);
}

TEST(AttentionGroups, VllmKeepsTheDsaIndexerCacheInItsOwnFp8GroupBesideBf16Mla) {
  // vLLM's --kv-cache-dtype does not apply to the indexer's key cache, which is fp8 with scales
  // under either policy; it must not count as a second cache dtype of the KV-cache group.
  const auto desc = testing::describe_pair(
      {std::string(MIXKV_SOURCE_DIR) + "/tests/model/fixtures/deepseek-v3.2.json", std::nullopt});
  const auto groups = build_attention_groups(desc, make(desc, plan::Policy::kVllm));
  const AttentionGroup& mla = group_of(groups, "layers.0");
  const AttentionGroup& indexer = group_of(groups, "layers.0.indexer");
  EXPECT_EQ(mla.kv_cache_group, indexer.kv_cache_group);
  EXPECT_NE(mla.id, indexer.id);
  EXPECT_EQ(mla.params.kv_dtype, DType::kBfloat16);
  EXPECT_EQ(indexer.params.kv_dtype, DType::kFp8E4m3);
}

TEST(AttentionGroups, TargetOnlyUniformModelIsOneGroupPerKvCacheGroup) {
  // R8: nothing to split, nothing changes.
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const auto plan = make(desc, plan::Policy::kVllm);
  const auto groups = build_attention_groups(desc, plan);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].layers.size(), 32u);
  EXPECT_EQ(groups[0].kernel_block_size, plan.groups[0].kernel_block_size);
}

TEST(AttentionGroups, FlashAttentionAppliesWindowPerLayerSoOneBuilderServesBoth) {
  const auto desc = testing::describe_builtin("gemma-2-9b");
  const auto plan = make(desc, plan::Policy::kVllm, Backend::kFlashAttn);
  const auto groups = build_attention_groups(desc, plan);
  EXPECT_EQ(groups.size(), plan.groups.size());  // split only by KV-cache group
}

TEST(AttentionGroups, BackendWithoutTheDtypeIsAnError) {
  model::DescribeOptions d;
  d.kv_dtype = DType::kFloat32;
  const auto desc = testing::describe_builtin("qwen3-8b", {}, d);
  testing::expect_error([&] { build_attention_groups(desc, make(desc)); }, ErrorCode::kInvalidInput,
                        {"layers.0", "flashinfer", "float32"});
}

}  // namespace
}  // namespace mixkv::attn

namespace mixkv::attn {
namespace {

TEST(AttentionGroupErrors, NonCausalLayerOnAnMlaOnlyBackendNamesTheLayer) {
  const char* text = R"({"model": "mla-dflash", "layers": [
      {"name": "t", "owner": "target", "index": 0, "kind": "mla", "num_q_heads": 16, "num_kv_heads": 1,
       "head_size": 576, "head_size_v": 512},
      {"name": "d", "owner": "draft", "index": 0, "kind": "mla", "num_q_heads": 16, "num_kv_heads": 1,
       "head_size": 576, "head_size_v": 512, "causal": false}]})";
  const auto desc =
      model::describe(model::parse_model_source("m", "m.json", text), std::nullopt, {});
  plan::PlanOptions o;
  o.backend = Backend::kFlashMla;
  o.memory_bytes = std::int64_t{1} << 30;
  o.max_model_len = 4096;
  const auto plan = plan::make_plan(desc, o);
  testing::expect_error([&] { build_attention_groups(desc, plan); }, ErrorCode::kInvalidInput,
                        {"layer d is non-causal", "flashmla"});
}

TEST(AttentionGroupErrors, NoKernelPageForTheManagerBlockListsGroupHeadsAndSizes) {
  const auto desc = testing::describe_builtin("qwen3-8b");
  plan::PlanOptions o;
  o.policy = plan::Policy::kVllm;
  o.memory_bytes = std::int64_t{40} << 30;
  plan::CachePlan plan = plan::make_plan(desc, o);
  plan.groups[0].block_size = 40;  // no FlashInfer page divides 40 tokens
  testing::expect_error([&] { build_attention_groups(desc, plan); }, ErrorCode::kInvalidInput,
                        {"32/8 heads", "64, 32, 16", "40-token manager block"});
}

TEST(TrtllmGen, SingleKvHeadFallsBackToNativePagesAndSaysSo) {
  model::DescribeOptions d;
  d.tp = 4;  // Qwen3-Next's 2 KV heads are replicated: 1 per rank
  const auto desc = testing::describe_builtin("qwen3-next-80b-a3b", {}, d);
  plan::PlanOptions o;
  o.backend = Backend::kFlashinferTrtllm;
  o.memory_bytes = std::int64_t{40} << 30;
  const auto groups = build_attention_groups(desc, plan::make_plan(desc, o));
  EXPECT_NE(groups.at(0).kernel_path.find("rejects a single KV head"), std::string::npos);
  EXPECT_LE(groups.at(0).kernel_block_size, 64);
}

TEST(TrtllmGen, Fp8SlidingWindowWithSpeculationIsRefused) {
  model::DescribeOptions d;
  d.kv_dtype = DType::kFp8E4m3;
  const auto desc = testing::describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b", d);
  plan::PlanOptions o;
  o.backend = Backend::kFlashinferTrtllm;
  o.memory_bytes = std::int64_t{40} << 30;
  const auto plan = plan::make_plan(desc, o);
  testing::expect_error([&] { build_attention_groups(desc, plan); }, ErrorCode::kInvalidInput,
                        {"layers.0", "#3864"});
}

TEST(BackendCaps, EveryBackendHasCapabilitiesAndAName) {
  for (Backend b : all_backends()) {
    EXPECT_FALSE(capabilities(b).cache_dtypes.empty()) << to_string(b);
    EXPECT_EQ(parse_backend(to_string(b)), b);
  }
}

TEST(KvLayout, ParsesItsNamesAndRefusesOthersByFlag) {
  for (KvLayout l : {KvLayout::kNHD, KvLayout::kHND}) {
    EXPECT_EQ(parse_kv_layout(to_string(l), "--kv-layout"), l);
  }
  testing::expect_error([] { parse_kv_layout("hnd", "--kv-layout"); }, ErrorCode::kInvalidInput,
                        {"--kv-layout 'hnd' is not a KV layout; use NHD or HND"});
}

}  // namespace
}  // namespace mixkv::attn
