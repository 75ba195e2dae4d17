// --policy mixkv: its plans are executable, and it serves more requests than vLLM's planner.
#include <gtest/gtest.h>

#include "plan/plan_test_support.hpp"
#include "test_support.hpp"

namespace mixkv::plan {
namespace {

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

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

}  // namespace
}  // namespace mixkv::plan
