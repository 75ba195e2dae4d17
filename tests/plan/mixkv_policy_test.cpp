// --policy mixkv: its plans are executable, and it serves more requests than vLLM's planner.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "plan/plan_test_support.hpp"
#include "test_support.hpp"

namespace mixkv::plan {
namespace {

using mixkv::testing::kGiB;

PlanOptions options(Policy policy, std::int64_t memory = 40 * kGiB) {
  PlanOptions o;
  o.policy = policy;
  o.memory_bytes = memory;
  return o;
}

TEST(MixkvPolicy, MhaDraftOnGdnTargetReachesNinetyFivePercentOfThePhysicalLimit) {
  model::DescribeOptions d;
  d.tp = 4;
  const auto desc = mixkv::testing::describe_builtin("qwen3.5-27b", "mha-draft-qwen3.5-27b", d);
  const CachePlan vllm = make_plan(desc, options(Policy::kVllm));
  const CachePlan mixkv = make_plan(desc, options(Policy::kMixkv));
  testing::expect_plan_invariants(desc, vllm, "vllm");
  testing::expect_plan_invariants(desc, mixkv, "mixkv");
  EXPECT_GE(mixkv.concurrency.efficiency, 0.95);
  EXPECT_GT(mixkv.concurrency.max_requests, 2 * vllm.concurrency.max_requests);
}

TEST(MixkvPolicy, Qwen3NextBeatsVllmAtEveryLength) {
  const auto desc = mixkv::testing::describe_builtin("qwen3-next-80b-a3b");
  for (std::int64_t len : {256, 2500, 32768, 262144}) {
    PlanOptions v = options(Policy::kVllm), m = options(Policy::kMixkv);
    v.request_len = m.request_len = len;
    const CachePlan vllm = make_plan(desc, v);
    const CachePlan mixkv = make_plan(desc, m);
    testing::expect_plan_invariants(desc, mixkv, "mixkv");
    EXPECT_GE(mixkv.concurrency.max_concurrency, vllm.concurrency.max_concurrency) << len;
  }
}

TEST(MixkvPolicy, OnePoolOfEqualBlocksWithGroupsInsideIt) {
  const auto desc = mixkv::testing::describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b");
  const CachePlan plan = make_plan(desc, options(Policy::kMixkv));
  ASSERT_EQ(plan.pools.size(), 1u);
  EXPECT_EQ(plan.tensors.size(), 1u);
  EXPECT_EQ(plan.pools[0].page_bytes, plan.block_unit_bytes);
  testing::expect_plan_invariants(desc, plan, "gpt-oss");
  EXPECT_EQ(plan.waste_per_request.padded_pages, 0);
}

TEST(MixkvPolicy, FlashmlaServesOnlyMlaLayers) {
  const auto desc = mixkv::testing::describe_builtin("deepseek-v3");
  PlanOptions o = options(Policy::kMixkv, 80 * kGiB);
  o.backend = backend::Backend::kFlashMla;
  const CachePlan plan = make_plan(desc, o);
  for (const auto& g : plan.groups) EXPECT_EQ(g.kernel_block_size, 64);
  mixkv::testing::expect_error([&] { make_plan(mixkv::testing::describe_builtin("qwen3-8b"), o); },
                               ErrorCode::kInvalidInput, {"flashmla", "layers.0"});
}

TEST(MixkvPolicy, UserBlockSizeIsHonoured) {
  const auto desc = mixkv::testing::describe_builtin("qwen3-8b");
  PlanOptions o = options(Policy::kMixkv);
  o.block_size = 64;
  const CachePlan plan = make_plan(desc, o);
  for (const auto& g : plan.groups) EXPECT_EQ(g.block_size, 64);
  o.block_size = 24;
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"--block-size 24"});
  o.block_size = 16;
  o.backend = backend::Backend::kFlashMla;
  mixkv::testing::expect_error(
      [&] { make_plan(mixkv::testing::describe_builtin("deepseek-v3"), o); },
      ErrorCode::kInvalidInput, {"--block-size 16", "flashmla", "layers.0", "64"});
}

TEST(PlanOptionsCheck, BadMemoryAndLengthsAreErrors) {
  const auto desc = mixkv::testing::describe_builtin("qwen3-8b");
  mixkv::testing::expect_error([&] { make_plan(desc, options(Policy::kMixkv, 0)); },
                               ErrorCode::kInvalidInput, {"--memory"});
  PlanOptions o = options(Policy::kMixkv);
  o.request_len = 0;
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"--request-len"});
}

// DeepSeek-V3 with SpecForge's EAGLE-3 head: vLLM puts all 62 layers (MLA and the head's GQA
// layer) in one block table of 32-token blocks; mixkv's search holds that layout too, so it never
// serves fewer requests (it planned 227 vs 228 at TP1 and 235 vs 238 at TP4 before).
TEST(MixkvPolicy, DeepseekWithEagle3HeadServesAtLeastAsManyAsVllm) {
  const std::string head =
      std::string(MIXKV_SOURCE_DIR) + "/tests/plan/fixtures/deepseek-v3-eagle3-specforge.json";
  for (int tp : {1, 4}) {
    model::DescribeOptions d;
    d.tp = tp;
    const auto desc = model::describe_refs("deepseek-v3", head, d);
    const CachePlan vllm = make_plan(desc, options(Policy::kVllm));
    const CachePlan mixkv = make_plan(desc, options(Policy::kMixkv));
    testing::expect_plan_invariants(desc, mixkv, "mixkv");
    EXPECT_GE(mixkv.concurrency.max_requests, vllm.concurrency.max_requests) << "tp " << tp;
    EXPECT_GE(mixkv.concurrency.max_concurrency, vllm.concurrency.max_concurrency) << "tp " << tp;
  }
}

// The longest request that fits is the longest max_model_len that plans: it plans, one more token
// does not, under each policy; mixkv's is never shorter than vLLM's.
TEST(MixkvPolicy, LongestRequestThatFitsIsTheLongestThatPlans) {
  for (const char* name : {"glm-4.5-air", "gemma-3-27b", "qwen3-next-80b-a3b"}) {
    SCOPED_TRACE(name);
    const auto desc = mixkv::testing::describe_builtin(name);
    std::int64_t longest[2] = {0, 0};
    for (Policy policy : {Policy::kVllm, Policy::kMixkv}) {
      PlanOptions o = options(policy, 2 * kGiB);
      o.request_len = 1024;
      std::int64_t fits = 0;
      try {
        fits = make_plan(desc, o).max_model_len_that_fits;  // the model's whole length fits
      } catch (const Error& e) {
        const std::string text = e.what();
        const auto at = text.find("longest request that fits is ");
        ASSERT_NE(at, std::string::npos) << text;
        fits = std::stoll(text.substr(at + 29));
        o.max_model_len = fits + 1;
        EXPECT_THROW(make_plan(desc, o), Error) << fits + 1;
      }
      o.max_model_len = fits;
      EXPECT_EQ(make_plan(desc, o).max_model_len_that_fits, fits);
      longest[policy == Policy::kMixkv] = fits;
    }
    EXPECT_GE(longest[1], longest[0]);
  }
}

TEST(MixkvPolicy, PlanningIsNearLinearInLayers) {
  // 4,096 layers (the most a config may have) in the hybrid pattern of Qwen3-Next: the search
  // tries O(sqrt n) splits per class, so this plans in well under a second (make bench times it).
  auto desc = mixkv::testing::describe_builtin("qwen3-next-80b-a3b");
  const std::vector<model::LayerDesc> base = desc.layers;
  desc.layers.clear();
  for (int i = 0; i < 4096; ++i) {
    model::LayerDesc l = base[static_cast<std::size_t>(i) % base.size()];
    l.name = "layers." + std::to_string(i);
    l.index = i;
    desc.layers.push_back(l);
  }
  PlanOptions o = options(Policy::kMixkv, 80 * kGiB);
  o.max_model_len = 8192;
  const CachePlan plan = make_plan(desc, o);
  testing::expect_plan_invariants(desc, plan, "4096 layers");
  o.policy = Policy::kVllm;
  EXPECT_GE(plan.concurrency.max_concurrency, make_plan(desc, o).concurrency.max_concurrency);
}

TEST(PlanOptionsCheck, HugeLengthsAndBlocksAreErrorsNamingTheOption) {
  const auto desc = mixkv::testing::describe_builtin("qwen3-8b");
  PlanOptions o = options(Policy::kMixkv, kGiB);
  o.max_model_len = std::int64_t{1} << 62;
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"--max-model-len", "4611686018427387904"});
  o = options(Policy::kMixkv, kGiB);
  o.request_len = std::numeric_limits<std::int64_t>::max();
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"--request-len"});
  o = options(Policy::kMixkv, kGiB);
  o.block_size = std::int64_t{1} << 62;
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"--block-size"});
  o = options(Policy::kVllm, kGiB);
  o.max_num_batched_tokens = 0;
  mixkv::testing::expect_error([&] { make_plan(desc, o); }, ErrorCode::kInvalidInput,
                               {"--max-num-batched-tokens"});
}

TEST(PlanOptionsCheck, NothingFitsSaysSoInsteadOfZeroTokens) {
  const auto desc = mixkv::testing::describe_builtin("qwen3-8b");
  for (Policy policy : {Policy::kVllm, Policy::kMixkv}) {
    PlanOptions o = options(policy, 64 * 1024);
    o.max_model_len = 4096;
    o.request_len = 4096;
    try {
      make_plan(desc, o);
      ADD_FAILURE() << "64 KiB should not plan";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("is 0 tokens"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mixkv::plan
