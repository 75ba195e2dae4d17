// `mixkv verify` over every built-in target, alone and with each of its drafters, on the cpu,
// flashinfer and flash-attn geometries: every attention group's kernel matches the dense
// reference. Scaled small (two short requests, two layers per group, no chunked-prefill check, the
// least memory and TP that plan) to run in CI.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "mixkv/kernels/verify.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace {

using mixkv::testing::kMiB;

// The first (TP, memory scale) that plans, trying TP 1, 2, 4, 8 with 64 to 512 MiB each: a large
// hybrid's recurrent states with a drafter's checkpoints take more than 64 MiB for even one short
// request at TP1 (qwen3.5-27b + DFlash: 17 states per GDN layer). Two layers per group, short
// requests: the sweep is about every pair's geometry, the kernel tests about the kernels.
VerifyReport verify_small(const mixkv::testing::Pair& pair, backend::Backend backend) {
  VerifyOptions o;
  o.plan.backend = backend;
  o.requests = 2;
  o.seed = 11;
  o.longest_request = 128;
  o.max_layers_per_group = 2;
  o.chunked_prefill = false;  // the prefill kernel's own tests check it (verify_test.cpp)
  for (int tp : {1, 2, 4, 8}) {
    model::DescribeOptions d;
    d.tp = tp;
    const model::ModelDesc desc = mixkv::testing::describe_pair(pair, d);
    for (std::int64_t memory = 64 * kMiB; memory <= 512 * kMiB; memory *= 2) {
      o.plan.memory_bytes = memory;
      try {
        return verify(desc, o);
      } catch (const Error&) {
        if (tp == 8 && memory == 512 * kMiB) throw;
      }
    }
  }
  return {};
}

class VerifySweep : public ::testing::TestWithParam<backend::Backend> {};

TEST_P(VerifySweep, EveryBuiltInPairPasses) {
  int verified_groups = 0;
  for (const auto& pair : mixkv::testing::builtin_pairs()) {
    SCOPED_TRACE(pair.label());
    const VerifyReport r = verify_small(pair, GetParam());
    EXPECT_FALSE(r.mismatch());
    for (const GroupResult& g : r.groups) {
      if (g.status == GroupStatus::kPass) ++verified_groups;
      EXPECT_NE(g.status, GroupStatus::kMismatch)
          << fmt::format("group {} ({}): {}", g.attention_group, g.kind, g.reason);
    }
  }
  EXPECT_GT(verified_groups, 25);
}

INSTANTIATE_TEST_SUITE_P(Backends, VerifySweep,
                         ::testing::Values(backend::Backend::kCpu, backend::Backend::kFlashinfer,
                                           backend::Backend::kFlashAttn),
                         [](const auto& info) {
                           std::string name(backend::to_string(info.param));
                           std::erase(name, '-');
                           return name;
                         });

}  // namespace
}  // namespace mixkv::kernels
