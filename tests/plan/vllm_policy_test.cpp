// --policy vllm reproduces vLLM's numbers (shared/design/vllm-reference.md §3.2).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"
#include "test_support.hpp"

namespace mixkv::plan {
namespace {

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

PlanOptions vllm_options(std::int64_t memory = 40 * kGiB) {
  PlanOptions o;
  o.policy = Policy::kVllm;
  o.backend = backend::Backend::kFlashinfer;
  o.memory_bytes = memory;
  return o;
}

model::ModelDesc qwen3_next(std::optional<int> tp = {}, std::optional<int> spec = {},
                            std::optional<std::string_view> draft = {}) {
  model::DescribeOptions d;
  d.tp = tp;
  d.num_spec_tokens = spec;
  return testing::describe_builtin("qwen3-next-80b-a3b", draft, d);
}

const KvCacheGroup& first_group(const CachePlan& plan, Behaviour behaviour) {
  for (const auto& g : plan.groups) {
    if (g.behaviour == behaviour) return g;
  }
  throw std::runtime_error("no such group");
}

TEST(VllmPolicy, Qwen3NextAttentionBlockIs544TokensAndPage1114112) {
  const CachePlan plan = make_plan(qwen3_next(), vllm_options());
  const KvCacheGroup& full = first_group(plan, Behaviour::kAllTokens);
  EXPECT_EQ(full.block_size, 544);
  EXPECT_EQ(full.page_bytes, 1'114'112);
  EXPECT_EQ(full.kernel_block_size, 32);
  const KvCacheGroup& gdn = first_group(plan, Behaviour::kRecurrent);
  EXPECT_EQ(gdn.page_bytes, 1'114'112);
  EXPECT_EQ(gdn.real_page_bytes, 1'097'728);
  // 16,384 B of padding on 1,097,728 B: 1.49%.
  bool padding_reported = false;
  for (const auto& w : plan.warnings)
    padding_reported = padding_reported || w.find("1.49%") != std::string::npos;
  EXPECT_TRUE(padding_reported);
  ASSERT_EQ(plan.groups.size(), 4u);
  for (const auto& g : plan.groups) EXPECT_EQ(g.layers.size(), 12u);
  EXPECT_EQ(plan.tensors.size(), 12u);
  for (const auto& t : plan.tensors) EXPECT_EQ(t.shared_by.size(), 4u);
  ASSERT_EQ(plan.pools.size(), 1u);
  EXPECT_EQ(plan.pools[0].num_blocks, 3212);
  EXPECT_EQ(plan.tensors[0].bytes, 3'578'527'744);
}

TEST(VllmPolicy, Qwen3NextConcurrencyAtMaxModelLenMatchesVllm) {
  const CachePlan plan = make_plan(qwen3_next(), vllm_options());
  // 3,212 blocks / (482 + 3) blocks per 262,144-token request.
  EXPECT_NEAR(plan.concurrency.at_max_model_len, 3212.0 / 485.0, 1e-9);
  EXPECT_EQ(plan.max_model_len, 262144);
}

TEST(VllmPolicy, TwoSpeculativeTokensGrowTheBlockTo560) {
  const CachePlan plan = make_plan(qwen3_next({}, 2), vllm_options());
  const KvCacheGroup& full = first_group(plan, Behaviour::kAllTokens);
  EXPECT_EQ(full.block_size, 560);
  EXPECT_EQ(full.page_bytes, 1'146'880);
  EXPECT_EQ(full.kernel_block_size, 16);
}

TEST(VllmPolicy, TensorParallelFourHalvesTheBlock) {
  const CachePlan plan = make_plan(qwen3_next(4), vllm_options());
  const KvCacheGroup& full = first_group(plan, Behaviour::kAllTokens);
  EXPECT_EQ(full.block_size, 272);
  EXPECT_EQ(full.page_bytes, 278'528);
}

TEST(VllmPolicy, MtpLayerMakesGroupsOfThirteenWithThreePaddingLayers) {
  const model::ModelDesc desc = [] {
    // Qwen3-Next with its MTP layer declared (the built-in config does not name the field).
    auto source = model::load_model_source("qwen3-next-80b-a3b");
    auto doc = *source.doc;
    doc["num_nextn_predict_layers"] = 1;
    model::DescribeOptions d;
    d.num_spec_tokens = 1;
    return model::describe_mtp(
        model::parse_model_source("qwen3-next+mtp", "qwen3-next+mtp", doc.dump()), d);
  }();
  const CachePlan plan = make_plan(desc, vllm_options());
  EXPECT_EQ(first_group(plan, Behaviour::kAllTokens).page_bytes, 1'114'112);
  EXPECT_EQ(first_group(plan, Behaviour::kAllTokens).layers.size(), 13u);
  EXPECT_EQ(plan.tensors.size(), 13u);
  EXPECT_EQ(plan.pools[0].num_blocks, 2965);
  bool padding_warned = false;
  for (const auto& w : plan.warnings)
    padding_warned = padding_warned || w.find("3 padding layers") != std::string::npos;
  EXPECT_TRUE(padding_warned);
  // 3 GDN groups of 12 leave one empty slot each in every block.
  EXPECT_GT(plan.waste_per_request.padding_layers, 0);
}

TEST(VllmPolicy, MhaDraftSetsTheCommonPageAndPadsRecurrentPagesSeveralFold) {
  model::DescribeOptions d;
  d.tp = 4;
  const auto desc = testing::describe_builtin("qwen3.5-27b", "mha-draft-qwen3.5-27b", d);
  const CachePlan plan = make_plan(desc, vllm_options());
  const KvCacheGroup& gdn = first_group(plan, Behaviour::kRecurrent);
  EXPECT_GE(gdn.page_bytes, 4 * gdn.real_page_bytes);
  bool factor_printed = false;
  for (const auto& w : plan.warnings) {
    factor_printed = factor_printed || (w.find("factor") != std::string::npos &&
                                        w.find("draft.layers.0") != std::string::npos);
  }
  EXPECT_TRUE(factor_printed);
}

TEST(VllmPolicy, UniformAttentionModelIsOneGroupOfSixteenTokenBlocks) {
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const CachePlan plan = make_plan(desc, vllm_options());
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.groups[0].block_size, 16);
  EXPECT_EQ(plan.tensors.size(), 32u);
  EXPECT_EQ(plan.pools[0].num_blocks, 40 * kGiB / (16 * 4096) / 32);
}

TEST(VllmPolicy, OneMoreDraftLayerKeepsGroupsWhole) {
  // gpt-oss-20b + EAGLE-3: 12 sliding + 13 full layers give groups of 13 with one padding slot.
  const auto desc = testing::describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b");
  const CachePlan plan = make_plan(desc, vllm_options());
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.tensors.size(), 13u);
}

TEST(VllmPolicy, MemoryTooSmallNamesTheLongestRequestThatFits) {
  mixkv::testing::expect_error([] { make_plan(qwen3_next(), vllm_options(2 * kGiB)); },
                               ErrorCode::kInvalidInput,
                               {"max_model_len 262144", "longest request that fits is"});
}

TEST(VllmPolicy, PagesThatDoNotDivideNameBothLayers) {
  const char* text = R"({"model": "odd", "layers": [
      {"name": "a", "owner": "target", "index": 0, "kind": "full", "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64},
      {"name": "b", "owner": "target", "index": 1, "kind": "sliding", "window": 512, "num_q_heads": 9, "num_kv_heads": 3,
       "head_size": 64}]})";
  const auto desc =
      model::describe(model::parse_model_source("odd", "odd.json", text), std::nullopt, {});
  PlanOptions o = vllm_options();
  o.max_model_len = 4096;
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"layer a", "layer b", "does not divide"});
}

}  // namespace
}  // namespace mixkv::plan
