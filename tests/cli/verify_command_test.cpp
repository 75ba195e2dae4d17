// `mixkv verify`, driven in-process: the table, --json, and the exit statuses (0 pass, 3
// mismatch, 2 bad input).
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_test_support.hpp"
#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/verify.hpp"
#include "test_support.hpp"

namespace mixkv::cli {
namespace {

testing::CliResult run_verify(std::vector<std::string> args) {
  return testing::run_cli("verify", std::move(args));
}

TEST(VerifyCommand, TablePassesAndExitsZero) {
  testing::CliResult r =
      run_verify({"qwen3-8b", "--draft", "dflash-qwen3-8b-b16", "--requests", "2"});
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("all verified groups pass"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("non-causal"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("MISMATCH"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;  // no progress when stderr is not a terminal
}

TEST(VerifyCommand, JsonReportsEveryGroup) {
  testing::CliResult r = run_verify({"qwen3-next-80b-a3b", "--policy", "vllm", "--backend", "cpu",
                                     "--requests", "2", "--seed", "3", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["passed"], true);
  EXPECT_EQ(j["backend"], "cpu");
  std::set<std::string> statuses;
  for (const auto& g : j["groups"]) {
    for (const char* key :
         {"kv_cache_group", "layers", "status", "max_abs_error", "max_rel_error", "tolerance"}) {
      EXPECT_TRUE(g.contains(key)) << key;
    }
    statuses.insert(g["status"].get<std::string>());
  }
  // Attention and GDN groups alike.
  EXPECT_EQ(statuses, (std::set<std::string>{"pass"}));
  EXPECT_TRUE(std::any_of(j["groups"].begin(), j["groups"].end(),
                          [](const auto& g) { return g["kind"] == "gdn"; }));
}

TEST(VerifyCommand, PlantedMismatchExitsThree) {
  testing::CliResult r = run_verify({"gpt-oss-20b", "--draft", "eagle3-gpt-oss-20b", "--requests",
                                     "2", "--plant-fault", "stride", "--fault-group", "0"});
  EXPECT_EQ(r.status, 3) << r.err << r.out;
  EXPECT_NE(r.out.find("MISMATCH"), std::string::npos) << r.out;
  testing::CliResult j =
      run_verify({"gpt-oss-20b", "--draft", "eagle3-gpt-oss-20b", "--requests", "2",
                  "--plant-fault", "stride", "--fault-group", "0", "--json"});
  EXPECT_EQ(j.status, 3);
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["passed"], false);
  EXPECT_EQ(doc["groups"][0]["status"], "MISMATCH");
}

TEST(VerifyCommand, PlantedStateSlotFaultMismatchesARecurrentGroup) {
  testing::CliResult r =
      run_verify({"qwen3-next-80b-a3b", "--policy", "vllm", "--backend", "cpu", "--requests", "1",
                  "--plant-fault", "state-slot", "--fault-group", "0", "--json"});
  EXPECT_EQ(r.status, 3) << r.err;
  auto doc = nlohmann::json::parse(r.out);
  bool recurrent_mismatch = false;
  for (const auto& g : doc["groups"]) {
    if (g["attention_group"].is_null() && g["kv_cache_group"] == 0) {
      recurrent_mismatch = g["status"] == "MISMATCH";
    }
  }
  EXPECT_TRUE(recurrent_mismatch) << r.out;
}

TEST(VerifyCommand, BadInputExitsTwo) {
  EXPECT_EQ(run_verify({"qwen3-8b", "--backend", "nope"}).status, 2);
  EXPECT_EQ(run_verify({"qwen3-8b", "--memory-scale", "lots"}).status, 2);
  EXPECT_EQ(run_verify({"qwen3-8b", "--memory-scale", "1KiB"}).status, 2);
  EXPECT_EQ(run_verify({"qwen3-8b", "--requests", "0"}).status, 2);
  EXPECT_EQ(run_verify({"no-such-model"}).status, 2);
}

// Plain `mixkv verify` picks a scale that holds its requests: the pairs issue 12 §3 found failing.
TEST(VerifyCommand, PlainVerifyPassesWhereTheOldDefaultScaleFailed) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"qwen3.5-27b", "--draft", "mha-draft-qwen3.5-27b", "--tp", "4"},
           {"qwen3-next-80b-a3b", "--num-spec-tokens", "2"},
           {"qwen3-8b", "--draft", "dflash-qwen3-8b-b16"},
           {"gemma-2-9b", "--backend", "flash-attn"}}) {
    testing::CliResult r = run_verify(args);
    EXPECT_EQ(r.status, 0) << args[0] << ": " << r.err << r.out;
    EXPECT_NE(r.out.find("all verified groups pass"), std::string::npos) << r.out;
  }
}

TEST(VerifyCommand, ScaleTooSmallNamesTheSmallestThatWorks) {
  testing::CliResult r = run_verify({"qwen3-8b", "--memory-scale", "1KiB"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("the smallest scale that works is --memory-scale "), std::string::npos)
      << r.err;
  // Options that no scale can fix say what is wrong, not "a larger scale".
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"qwen3-8b", "--request-len", "0"},
           {"qwen3-8b", "--block-size", "7"},
           {"qwen3-8b", "--memory-scale", "64MiB", "--block-size", "7"}}) {
    testing::CliResult bad = run_verify(args);
    EXPECT_EQ(bad.status, 2) << bad.err;
    EXPECT_EQ(bad.err.find("scale"), std::string::npos) << bad.err;
    EXPECT_NE(bad.err.find(args[args.size() - 2]), std::string::npos) << bad.err;
  }
}

TEST(VerifyCommand, NoFreeBlockMentionsTheMemoryScale) {
  // vLLM's block unit for Qwen3 8B is 36 x 16 x 4,096 B = 2,359,296 B: 3 MiB is one block, which
  // plans a 16-token request but leaves nothing beside the null block for verify's requests.
  testing::CliResult r = run_verify(
      {"qwen3-8b", "--policy", "vllm", "--memory-scale", "3MiB", "--max-model-len", "16"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.err.find("no free block"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the smallest scale that works is --memory-scale "), std::string::npos)
      << r.err;
}

TEST(VerifyCommand, FaultGroupThePlanDoesNotHaveIsAnError) {
  testing::CliResult r = run_verify({"qwen3-8b", "--plant-fault", "stride", "--fault-group", "99"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.err.find("--fault-group 99"), std::string::npos) << r.err;
  testing::CliResult alone = run_verify({"qwen3-8b", "--fault-group", "0"});
  EXPECT_EQ(alone.status, 2) << alone.out;
  EXPECT_NE(alone.err.find("--plant-fault"), std::string::npos) << alone.err;
  testing::CliResult len = run_verify({"qwen3-8b", "--max-model-len", "0"});
  EXPECT_EQ(len.status, 2) << len.out;
  EXPECT_NE(len.err.find("--max-model-len 0"), std::string::npos) << len.err;
}

// Plain verify (no --memory-scale, no TP or length options) on every built-in target, alone and
// with each of its drafters, on every backend that serves the pair: verify finds a scale for
// itself and every verified group passes. Kept fast for CI with one short request and one layer
// per group, and no chunked-prefill check (the scale is still the one verify picks for it; the
// prefill references of large hybrids, 24 GDN groups for Qwen3.5, took three quarters of the
// sweep); PlainVerifyPassesWhere... runs the whole default batch, prefill included. The (pair,
// backend) runs are dealt over kSweepShards tests (run i to shard i mod kSweepShards; a large
// hybrid's runs cost the most), so that `ctest -j` runs the sweep on every core instead of as one
// long test. Named *VerifySweep* so `make test-sanitize` leaves it to `make test`.
constexpr int kSweepShards = 8;

// A backend accepts the pair when it plans it and builds its attention groups.
bool accepts(const model::ModelDesc& desc, backend::Backend backend) {
  plan::PlanOptions p;
  p.backend = backend;
  p.memory_bytes = std::int64_t{64} << 30;
  p.max_model_len = 2048;
  try {
    attn::build_attention_groups(desc, plan::make_plan(desc, p));
  } catch (const Error&) {
    return false;
  }
  return true;
}

class PlainVerifySweep : public ::testing::TestWithParam<int> {};

TEST_P(PlainVerifySweep, EveryBuiltInPairPassesOnEveryBackendItAccepts) {
  int run = 0;  // index of the (pair, backend) run, over every shard's
  for (const auto& pair : mixkv::testing::builtin_pairs()) {
    const model::ModelDesc desc = mixkv::testing::describe_pair(pair);
    for (backend::Backend backend : backend::all_backends()) {
      if (!accepts(desc, backend) || run++ % kSweepShards != GetParam()) continue;
      const std::string label = pair.label() + " on " + std::string(backend::to_string(backend));
      kernels::VerifyOptions o;
      o.plan.backend = backend;
      o.requests = 1;
      o.longest_request = 64;
      o.max_layers_per_group = 1;
      o.chunked_prefill = false;
      try {
        const kernels::VerifyReport r = kernels::verify(desc, o);
        for (const kernels::GroupResult& g : r.groups) {
          EXPECT_NE(g.status, kernels::GroupStatus::kMismatch)
              << label << ": group " << g.attention_group << " " << g.reason;
        }
      } catch (const Error& e) {
        ADD_FAILURE() << label << ": " << e.what();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, PlainVerifySweep, ::testing::Range(0, kSweepShards));

// The shards together verify more than 60 (pair, backend) runs: each accepted one runs, and one
// that throws fails its shard.
TEST(PlainVerifySweepCoverage, MoreThanSixtyPairsAndBackendsAreSwept) {
  int runs = 0;
  for (const auto& pair : mixkv::testing::builtin_pairs()) {
    const model::ModelDesc desc = mixkv::testing::describe_pair(pair);
    for (backend::Backend backend : backend::all_backends()) runs += accepts(desc, backend) ? 1 : 0;
  }
  EXPECT_GT(runs, 60);
}

}  // namespace
}  // namespace mixkv::cli
