// --policy vllm reproduces vLLM's numbers (shared/design/vllm-reference.md §3.2).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"
#include "test_support.hpp"

namespace mixkv::plan {
namespace {

using mixkv::testing::kGiB;

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
  return mixkv::testing::describe_builtin("qwen3-next-80b-a3b", draft, d);
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
  const auto desc = mixkv::testing::describe_builtin("qwen3.5-27b", "mha-draft-qwen3.5-27b", d);
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
  const auto desc = mixkv::testing::describe_builtin("llama-3.1-8b");
  const CachePlan plan = make_plan(desc, vllm_options());
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.groups[0].block_size, 16);
  EXPECT_EQ(plan.tensors.size(), 32u);
  EXPECT_EQ(plan.pools[0].num_blocks, 40 * kGiB / (16 * 4096) / 32);
}

TEST(VllmPolicy, OneMoreDraftLayerKeepsGroupsWhole) {
  // gpt-oss-20b + EAGLE-3: 12 sliding + 13 full layers give groups of 13 with one padding slot.
  const auto desc = mixkv::testing::describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b");
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

// vLLM's "maximum concurrency for N tokens per request" (vllm-reference.md §1.3, §1.5, §1.6, §2.8)
// charges a sliding layer cdiv(min(window - 1 + max_num_batched_tokens, L), bs) + 1 blocks and a
// chunked layer cdiv(min(chunk + max_num_batched_tokens, L), bs), whatever the request's own
// span. Figures below are computed by hand from those formulas.
TEST(VllmPolicy, ConcurrencyAtMaxModelLenChargesSlidingLayersAsVllmDoes) {
  // Gemma 2 9B: 21 sliding (4,096) + 21 full layers, 8 KV heads x 256 x 2 (K, V) x 2 B = 8,192
  // B per token; 16-token blocks: page 131,072 B, groups of 21, block unit 21 x 131,072 =
  // 2,752,512 B; 40 GiB / 2,752,512 = 15,603 blocks. At L = 8,192: full cdiv(8192, 16) = 512;
  // sliding min(4095 + 8192, 8192) = 8192 -> 512 + 1 = 513.
  const auto desc = mixkv::testing::describe_builtin("gemma-2-9b");
  PlanOptions o = vllm_options();
  const CachePlan plan = make_plan(desc, o);
  ASSERT_EQ(plan.pools[0].num_blocks, 15'603);
  EXPECT_EQ(plan.max_model_len, 8192);
  EXPECT_NEAR(plan.concurrency.at_max_model_len, 15603.0 / (512 + 513), 1e-9);
  // --max-num-batched-tokens 2048: sliding min(4095 + 2048, 8192) = 6143 -> 384 + 1 = 385.
  o.max_num_batched_tokens = 2048;
  const CachePlan small_batch = make_plan(desc, o);
  EXPECT_EQ(small_batch.max_num_batched_tokens, 2048);
  EXPECT_NEAR(small_batch.concurrency.at_max_model_len, 15603.0 / (512 + 385), 1e-9);
  // mixkv keeps its exact figure: a window of 4,096 tokens needs 257 blocks of 16, not 385.
  o.policy = Policy::kMixkv;
  const CachePlan mixkv = make_plan(desc, o);
  EXPECT_GT(mixkv.concurrency.at_max_model_len, small_batch.concurrency.at_max_model_len);
}

TEST(VllmPolicy, ConcurrencyAtMaxModelLenChargesChunkedLayersAsVllmDoes) {
  // Three chunked (8,192) layers and one full layer, 2 KV heads x 64 x 2 x 2 B = 512 B per token:
  // 16-token pages of 8,192 B; buckets of 3 and 1 are not within 1.5x, so groups of one layer
  // and a block unit of 8,192 B: 1 GiB / 8,192 = 131,072 blocks. At L = 32,768: full
  // cdiv(32768, 16) = 2,048; each chunked cdiv(min(8192 + 8192, 32768), 16) = 1,024.
  const char* text = R"({"model": "chunky", "facts": {"max_position_embeddings": 32768}, "layers": [
      {"name": "c0", "owner": "target", "index": 0, "kind": "chunked", "chunk": 8192, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64},
      {"name": "c1", "owner": "target", "index": 1, "kind": "chunked", "chunk": 8192, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64},
      {"name": "c2", "owner": "target", "index": 2, "kind": "chunked", "chunk": 8192, "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64},
      {"name": "f3", "owner": "target", "index": 3, "kind": "full", "num_q_heads": 8, "num_kv_heads": 2, "head_size": 64}]})";
  const auto desc =
      model::describe(model::parse_model_source("chunky", "chunky.json", text), std::nullopt, {});
  PlanOptions o = vllm_options(kGiB);
  const CachePlan plan = make_plan(desc, o);
  ASSERT_EQ(plan.pools[0].num_blocks, 131'072);
  ASSERT_EQ(plan.groups.size(), 4u);
  EXPECT_NEAR(plan.concurrency.at_max_model_len, 131072.0 / (2048 + 3 * 1024), 1e-9);
  // --max-num-batched-tokens 4096: cdiv(min(8192 + 4096, 32768), 16) = 768 per chunked layer.
  o.max_num_batched_tokens = 4096;
  EXPECT_NEAR(make_plan(desc, o).concurrency.at_max_model_len, 131072.0 / (2048 + 3 * 768), 1e-9);
}

TEST(VllmPolicy, LongestRequestThatFitsIsVllmsEstimate) {
  // The same Gemma 2 plan in 1 GiB: 390 blocks of 2,752,512 B. vLLM's estimate is the largest L
  // with cdiv(L, 16) + cdiv(min(4095 + 8192, L), 16) + 1 <= 390: L = 3,104 (194 + 194 + 1 = 389;
  // 3,105 needs 195 + 195 + 1 = 391).
  const auto desc = mixkv::testing::describe_builtin("gemma-2-9b");
  PlanOptions o = vllm_options(kGiB);
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"longest request that fits is 3104 tokens"});
  o.max_model_len = 3104;
  EXPECT_EQ(make_plan(desc, o).max_model_len_that_fits, 3104);
}

}  // namespace
}  // namespace mixkv::plan
