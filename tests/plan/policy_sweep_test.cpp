// Every built-in target, alone and with each of its drafters, on the flashinfer, flash-attn and
// cpu backends: mixkv serves at least as many requests as vLLM's policy at 256, 2,500, 32,768
// tokens and the max model length, plans where vLLM fails, and keeps 95% of the physical limit
// at 2,500 tokens.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "plan/plan_test_support.hpp"

namespace mixkv::plan {
namespace {

constexpr std::int64_t kGiB = std::int64_t{1} << 30;
// Enough for one max-length request of every built-in (Llama 3.1 70B at 131,072 tokens needs 40
// GiB).
constexpr std::int64_t kMemory = 80 * kGiB;

class PolicySweep : public ::testing::TestWithParam<backend::Backend> {};

TEST_P(PolicySweep, MixkvServesAtLeastAsManyAsVllmAndNearThePhysicalLimit) {
  const backend::Backend backend = GetParam();
  for (const auto& pair : testing::builtin_pairs()) {
    const model::ModelDesc desc = testing::describe_pair(pair);
    const std::int64_t max_len = *desc.facts.max_position_embeddings;
    for (std::int64_t len : {std::int64_t{256}, std::int64_t{2500}, std::int64_t{32768}, max_len}) {
      const std::string label =
          fmt::format("{} on {} at {} tokens", pair.label(), backend::to_string(backend), len);
      PlanOptions o;
      o.backend = backend;
      o.memory_bytes = kMemory;
      o.request_len = std::min(len, max_len);
      o.policy = Policy::kMixkv;
      const CachePlan mixkv = make_plan(desc, o);
      testing::expect_plan_invariants(desc, mixkv, label);
      o.policy = Policy::kVllm;
      std::optional<CachePlan> vllm;
      try {
        vllm = make_plan(desc, o);
      } catch (const Error& e) {
        ADD_FAILURE() << label
                      << ": vllm policy failed (allowed, but none of the built-ins should): "
                      << e.what();
      }
      if (vllm) {
        testing::expect_plan_invariants(desc, *vllm, label + " (vllm)");
        EXPECT_GE(mixkv.concurrency.max_concurrency, vllm->concurrency.max_concurrency) << label;
      }
      if (len == 2500) {
        EXPECT_GE(mixkv.concurrency.efficiency, 0.95) << label;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PolicySweep,
                         ::testing::Values(backend::Backend::kFlashinfer,
                                           backend::Backend::kFlashAttn, backend::Backend::kCpu),
                         [](const auto& info) {
                           std::string name(backend::to_string(info.param));
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace mixkv::plan
