#include "mixkv/plan/memory_budget.hpp"

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace mixkv::plan {
namespace {

TEST(MemorySize, UnitsAreBinaryOrDecimalAsWritten) {
  EXPECT_EQ(parse_memory_size("40GiB"), std::int64_t{40} << 30);
  EXPECT_EQ(parse_memory_size("40 GiB"), std::int64_t{40} << 30);
  EXPECT_EQ(parse_memory_size("512MiB"), std::int64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("80GB"), 80'000'000'000);
  EXPECT_EQ(parse_memory_size("1.5TiB"), std::int64_t{3} << 39);
  EXPECT_EQ(parse_memory_size("42949672960"), std::int64_t{40} << 30);
}

TEST(MemorySize, NonsenseIsAnErrorWithAnExample) {
  for (const char* bad : {"", "GiB", "40XB", "4.0.0G", "-5GiB", "0", "1e30"}) {
    mixkv::testing::expect_error([&] { parse_memory_size(bad); }, ErrorCode::kInvalidInput,
                                 {"memory size"});
  }
}

TEST(GpuBudget, SubtractsTheWeightEstimatePerRank) {
  model::DescribeOptions d;
  d.tp = 4;
  const auto desc = mixkv::testing::describe_builtin("qwen3.5-27b", {}, d);
  const MemoryBudget budget = budget_for_gpu(find_gpu("b300"), 0.9, desc);
  const auto usable = static_cast<std::int64_t>(288'400'343'040 * 0.9);
  EXPECT_EQ(budget.kv_bytes, usable - *desc.facts.weight_bytes);
  EXPECT_NE(budget.explanation.find("estimate"), std::string::npos);
}

TEST(GpuBudget, ModelThatDoesNotFitAndUnknownGpuAreErrors) {
  const auto desc = mixkv::testing::describe_builtin("deepseek-v3");
  mixkv::testing::expect_error([&] { budget_for_gpu(find_gpu("h100"), 0.9, desc); },
                               ErrorCode::kInvalidInput, {"does not fit", "--tp"});
  mixkv::testing::expect_error([] { find_gpu("a100"); }, ErrorCode::kInvalidInput,
                               {"unknown GPU 'a100'", "h200"});
  mixkv::testing::expect_error([&] { budget_for_gpu(find_gpu("h100"), 1.5, desc); },
                               ErrorCode::kInvalidInput, {"utilization"});
}

}  // namespace
}  // namespace mixkv::plan
