// `mixkv verify` as a library call: built-in pairs verify on the cpu and flashinfer geometries,
// recurrent and refused layers are reported rather than passed, and planted faults show up as a
// mismatch on the group they were planted in.
#include "mixkv/kernels/verify.hpp"

#include <gtest/gtest.h>

#include <set>

#include "mixkv/plan/plan.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace {

using mixkv::testing::kMiB;

VerifyReport run_verify(std::string_view target, std::optional<std::string_view> draft,
                        plan::Policy policy, backend::Backend backend, int requests = 2,
                        PlantedFault fault = PlantedFault::kNone, int fault_group = -1,
                        std::int64_t memory = 64 * kMiB) {
  VerifyOptions o;
  o.plan.policy = policy;
  o.plan.backend = backend;
  o.plan.memory_bytes = memory;
  o.requests = requests;
  o.seed = 7;
  o.longest_request = 512;
  o.fault = fault;
  o.fault_group = fault_group;
  return verify(mixkv::testing::describe_builtin(target, draft), o);
}

void expect_all_pass(const VerifyReport& r) {
  ASSERT_FALSE(r.groups.empty());
  int verified = 0;
  for (const GroupResult& g : r.groups) {
    if (g.status == GroupStatus::kNotVerified || g.status == GroupStatus::kSkipped) continue;
    ++verified;
    EXPECT_EQ(g.status, GroupStatus::kPass)
        << "attention group " << g.attention_group << ": " << g.reason;
    EXPECT_GT(g.layers_checked, 0);
    EXPECT_LE(g.max_abs_error, g.tolerance);
  }
  EXPECT_GT(verified, 0);
  EXPECT_FALSE(r.mismatch());
}

struct Pair {
  const char* target;
  const char* draft;  // nullptr: none
  plan::Policy policy;
};

class VerifyPairs : public ::testing::TestWithParam<std::tuple<Pair, backend::Backend>> {};

TEST_P(VerifyPairs, EveryAttentionGroupMatchesTheReference) {
  const auto& [pair, backend] = GetParam();
  const std::optional<std::string_view> draft =
      pair.draft ? std::optional<std::string_view>(pair.draft) : std::nullopt;
  const VerifyReport r = run_verify(pair.target, draft, pair.policy, backend);
  expect_all_pass(r);
  EXPECT_EQ(r.plan.memory_bytes, 64 * kMiB);
  EXPECT_GT(r.bytes_allocated, 0);
}

INSTANTIATE_TEST_SUITE_P(
    BuiltIn, VerifyPairs,
    ::testing::Combine(
        ::testing::Values(Pair{"gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv},
                          Pair{"qwen3-next-80b-a3b", nullptr, plan::Policy::kVllm},
                          Pair{"qwen3-8b", "dflash-qwen3-8b-b16", plan::Policy::kMixkv}),
        ::testing::Values(backend::Backend::kCpu, backend::Backend::kFlashinfer)));

TEST(Verify, BatchHasSharedPrefixesAndSpansLongerThanTheWindow) {
  const VerifyReport r = run_verify("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv,
                                    backend::Backend::kFlashinfer, 4);
  ASSERT_EQ(r.requests.size(), 4u);
  EXPECT_GT(r.requests[0].kv_len, 128);  // gpt-oss's window
  EXPECT_EQ(r.requests[1].shares_prefix_with, 0);
  EXPECT_GT(r.requests[1].shared_tokens, 0);
  std::set<std::string> params;
  for (const auto& g : r.groups) params.insert(g.params);
  EXPECT_TRUE(std::any_of(params.begin(), params.end(), [](const std::string& p) {
    return p.find("window 127") != std::string::npos && p.find("sinks") != std::string::npos;
  }));
}

// Qwen3-Next per TP rank with two speculative tokens: every GDN group runs decode, a speculative
// verify writing three checkpoints, and a chunked prefill against the reference.
VerifyReport run_gdn_verify(PlantedFault fault = PlantedFault::kNone, int fault_group = -1,
                            bool chunked_prefill = true) {
  VerifyOptions o;
  o.chunked_prefill = chunked_prefill;
  o.plan.policy = plan::Policy::kVllm;
  o.plan.backend = backend::Backend::kCpu;
  o.plan.memory_bytes = 64 * kMiB;
  o.requests = 2;
  o.seed = 5;
  o.longest_request = 256;
  o.fault = fault;
  o.fault_group = fault_group;
  model::DescribeOptions d;
  d.tp = 4;
  d.num_spec_tokens = 2;
  return verify(mixkv::testing::describe_builtin("qwen3-next-80b-a3b", std::nullopt, d), o);
}

std::vector<const GroupResult*> recurrent_groups(const VerifyReport& r) {
  std::vector<const GroupResult*> out;
  for (const auto& g : r.groups) {
    if (g.attention_group < 0) out.push_back(&g);
  }
  return out;
}

TEST(Verify, GdnGroupsRunDecodeCheckpointsAndPrefillWithinTolerance) {
  const VerifyReport r = run_gdn_verify();
  const auto gdn = recurrent_groups(r);
  ASSERT_EQ(gdn.size(), 3u);
  for (const GroupResult* g : gdn) {
    EXPECT_EQ(g->kind, "gdn");
    EXPECT_EQ(g->status, GroupStatus::kPass) << g->kv_cache_group << ": " << g->reason;
    EXPECT_GT(g->layers_checked, 0);
    EXPECT_GT(g->tolerance, 0);
    EXPECT_LE(g->max_abs_error, g->tolerance);
    EXPECT_NE(g->params.find("k4/v8 128x128 w4"), std::string::npos) << g->params;
  }
  EXPECT_FALSE(r.mismatch());
}

TEST(Verify, Mamba2GroupsMatchTheReference) {
  // Float32 SSM state (the config does not say otherwise) makes one request's pages larger than
  // 64 MiB holds at vLLM's hybrid block size.
  const VerifyReport r =
      run_verify("nemotron-h-8b", std::nullopt, plan::Policy::kVllm, backend::Backend::kFlashinfer,
                 2, PlantedFault::kNone, -1, 256 * kMiB);
  const auto groups = recurrent_groups(r);
  ASSERT_FALSE(groups.empty());
  for (const GroupResult* g : groups) {
    EXPECT_EQ(g->kind, "mamba2");
    EXPECT_EQ(g->status, GroupStatus::kPass) << g->reason;
    EXPECT_GT(g->layers_checked, 0);
    EXPECT_LE(g->max_abs_error, g->tolerance);
  }
}

// Kimi-Linear-48B per TP rank with two speculative tokens: every KDA group runs its three convs
// and the recurrence through a decode step, a speculative verify writing three checkpoints and
// a chunked prefill against the reference; a state slot one page off is caught there.
VerifyReport run_kda_verify(PlantedFault fault = PlantedFault::kNone, int fault_group = -1) {
  VerifyOptions o;
  o.plan.policy = plan::Policy::kVllm;
  o.plan.backend = backend::Backend::kCpu;
  o.plan.memory_bytes = 64 * kMiB;
  o.requests = 2;
  o.seed = 3;
  o.longest_request = 256;
  o.fault = fault;
  o.fault_group = fault_group;
  model::DescribeOptions d;
  d.tp = 4;
  d.num_spec_tokens = 2;
  return verify(mixkv::testing::describe_builtin("kimi-linear-48b", std::nullopt, d), o);
}

TEST(Verify, KdaGroupsRunDecodeCheckpointsAndPrefillWithinTolerance) {
  const VerifyReport r = run_kda_verify();
  const auto kda = recurrent_groups(r);
  ASSERT_FALSE(kda.empty());
  for (const GroupResult* g : kda) {
    EXPECT_EQ(g->kind, "kda");
    EXPECT_EQ(g->status, GroupStatus::kPass) << g->kv_cache_group << ": " << g->reason;
    EXPECT_GT(g->layers_checked, 0);
    EXPECT_GT(g->tolerance, 0);
    EXPECT_LE(g->max_abs_error, g->tolerance);
    EXPECT_NE(g->params.find("k8/v8 128x128 w4"), std::string::npos) << g->params;
  }
  EXPECT_FALSE(r.mismatch());

  const int last = kda.back()->kv_cache_group;
  const VerifyReport bad = run_kda_verify(PlantedFault::kStateSlot, last);
  EXPECT_TRUE(bad.mismatch());
  for (const GroupResult* g : recurrent_groups(bad)) {
    if (g->kv_cache_group != last) continue;
    EXPECT_EQ(g->status, GroupStatus::kMismatch);
    EXPECT_NE(g->reason.find("decode"), std::string::npos) << g->reason;
  }
}

// Layers without a CPU kernel (Jamba's Mamba1) are reported, with the reason, not passed.
TEST(Verify, Mamba1GroupsAreReportedNotVerifiedWithTheReason) {
  const VerifyReport r =
      run_verify("jamba-v0.1", std::nullopt, plan::Policy::kVllm, backend::Backend::kCpu, 1);
  int mamba1 = 0;
  for (const GroupResult* g : recurrent_groups(r)) {
    EXPECT_EQ(g->status, GroupStatus::kNotVerified);
    EXPECT_NE(g->reason.find("no CPU kernel for mamba1 layers"), std::string::npos) << g->reason;
    ++mamba1;
  }
  EXPECT_GT(mamba1, 0);
  EXPECT_FALSE(r.mismatch());
}

TEST(Verify, MemoryTooSmallIsBadInput) {
  VerifyOptions o;
  o.plan.memory_bytes = 1024;
  mixkv::testing::expect_error([&] { verify(mixkv::testing::describe_builtin("qwen3-8b"), o); },
                               ErrorCode::kInvalidInput, {"--memory-scale"});
  o.plan.memory_bytes = 64 * kMiB;
  o.requests = 0;
  mixkv::testing::expect_error([&] { verify(mixkv::testing::describe_builtin("qwen3-8b"), o); },
                               ErrorCode::kInvalidInput, {"--requests"});
}

// The target's kernel-page stride off by one page (the manager page split into one kernel page
// too many): only the group it was planted in mismatches.
TEST(VerifyPlantedFault, OffByOneStrideOnTheTargetGroupIsCaughtThere) {
  for (auto backend : {backend::Backend::kCpu, backend::Backend::kFlashinfer}) {
    const VerifyReport clean =
        run_verify("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv, backend, 2);
    int target = -1;
    for (const auto& g : clean.groups) {
      if (g.attention_group >= 0 && g.layers.front().rfind("draft.", 0) != 0) {
        target = g.attention_group;
        break;
      }
    }
    ASSERT_GE(target, 0);
    const VerifyReport r = run_verify("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv,
                                      backend, 2, PlantedFault::kKernelPageStride, target);
    EXPECT_TRUE(r.mismatch());
    for (const auto& g : r.groups) {
      if (g.attention_group == target) {
        EXPECT_EQ(g.status, GroupStatus::kMismatch) << g.reason;
        EXPECT_GT(g.max_abs_error, g.tolerance);
      } else if (g.attention_group >= 0) {
        EXPECT_EQ(g.status, GroupStatus::kPass) << g.attention_group << ": " << g.reason;
      }
    }
  }
}

TEST(VerifyPlantedFault, SlidingGroupGivenTheFullWindowIsCaught) {
  const VerifyReport clean = run_verify("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv,
                                        backend::Backend::kFlashinfer, 2);
  int sliding = -1;
  for (const auto& g : clean.groups) {
    if (g.params.find("window") != std::string::npos) sliding = g.attention_group;
  }
  ASSERT_GE(sliding, 0);
  const VerifyReport r =
      run_verify("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv,
                 backend::Backend::kFlashinfer, 2, PlantedFault::kFullWindow, sliding);
  for (const auto& g : r.groups) {
    if (g.attention_group < 0) continue;
    EXPECT_EQ(g.status, g.attention_group == sliding ? GroupStatus::kMismatch : GroupStatus::kPass)
        << g.attention_group << ": " << g.reason;
  }
}

// An engine that gives the whole model the target's kernel page reads the MHA drafter's pages
// (16 tokens under flashinfer, from its 10 KV heads) as 32-token pages: verify catches it on the
// drafter's group and nowhere else.
// Disabled for now: since the mixkv policy also merges layers across bytes per token (issue 12
// §2), this pair's target and drafter share one KV-cache group and one kernel page at every TP,
// so the planted fault changes nothing. It needs a pair whose pages still differ (issue 12 notes).
TEST(VerifyPlantedFault, DISABLED_DraftGroupGivenTheTargetKernelPageIsCaught) {
  model::DescribeOptions d;
  d.tp = 8;
  const model::ModelDesc desc =
      mixkv::testing::describe_builtin("qwen3.5-27b", "mha-draft-qwen3.5-27b", d);
  VerifyOptions o;
  o.plan.backend = backend::Backend::kFlashinfer;
  o.plan.memory_bytes = 128 * kMiB;
  o.requests = 2;
  o.seed = 5;
  o.longest_request = 512;
  const VerifyReport clean = verify(desc, o);
  ASSERT_FALSE(clean.mismatch());
  int draft = -1;
  for (const auto& g : clean.groups) {
    if (g.attention_group >= 0 && g.layers.front().rfind("draft.", 0) == 0) {
      draft = g.attention_group;
    }
  }
  ASSERT_GE(draft, 0);

  o.fault = PlantedFault::kTargetKernelPage;
  const VerifyReport r = verify(desc, o);
  EXPECT_TRUE(r.mismatch());
  for (const auto& g : r.groups) {
    if (g.attention_group < 0) continue;
    EXPECT_EQ(g.status, g.attention_group == draft ? GroupStatus::kMismatch : GroupStatus::kPass)
        << g.attention_group << ": " << g.reason;
  }
}

// The recurrent states of one KV-cache group read and written one manager page too far: that
// group mismatches. (Its stray writes land in other groups' blocks, so only the groups checked
// before it are sure to pass: the fault goes on the last one.)
TEST(VerifyPlantedFault, StateSlotOffByOnePageIsCaughtOnThatGroup) {
  const VerifyReport clean = run_gdn_verify();
  const int last = recurrent_groups(clean).back()->kv_cache_group;
  const VerifyReport r = run_gdn_verify(PlantedFault::kStateSlot, last);
  EXPECT_TRUE(r.mismatch());
  for (const GroupResult* g : recurrent_groups(r)) {
    if (g->kv_cache_group == last) {
      EXPECT_EQ(g->status, GroupStatus::kMismatch);
      EXPECT_GT(g->max_abs_error, g->tolerance);
      EXPECT_NE(g->reason.find("decode"), std::string::npos) << g->reason;
    } else {
      EXPECT_EQ(g->status, GroupStatus::kPass) << g->kv_cache_group << ": " << g->reason;
    }
  }
  for (const auto& g : r.groups) {
    if (g.attention_group >= 0) {
      EXPECT_EQ(g.status, GroupStatus::kPass);
    }
  }
}

// The verify sweeps run without the chunked-prefill check: a state slot one page off must still
// be caught there, by the decode step, on its own group only.
TEST(VerifyPlantedFault, StateSlotOffByOnePageIsCaughtWithoutTheChunkedPrefill) {
  const VerifyReport clean = run_gdn_verify(PlantedFault::kNone, -1, false);
  EXPECT_FALSE(clean.mismatch());
  const int last = recurrent_groups(clean).back()->kv_cache_group;
  const VerifyReport r = run_gdn_verify(PlantedFault::kStateSlot, last, false);
  EXPECT_TRUE(r.mismatch());
  for (const GroupResult* g : recurrent_groups(r)) {
    EXPECT_EQ(g->status, g->kv_cache_group == last ? GroupStatus::kMismatch : GroupStatus::kPass)
        << g->kv_cache_group << ": " << g->reason;
  }
}

}  // namespace
}  // namespace mixkv::kernels
