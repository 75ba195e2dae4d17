// `mixkv plan`, driven in-process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_test_support.hpp"

namespace mixkv::cli {
namespace {

testing::CliResult run_plan(std::vector<std::string> args) {
  return testing::run_cli("plan", std::move(args));
}

TEST(PlanCommand, JsonCarriesTheContractKeys) {
  testing::CliResult r =
      run_plan({"qwen3-next-80b-a3b", "--memory", "40GiB", "--policy", "vllm", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* key :
       {"schema_version", "policy", "backend", "memory_bytes", "request_len", "pools",
        "kv_cache_groups", "tensors", "concurrency", "waste_bytes", "warnings"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["policy"], "vllm");
  EXPECT_EQ(j["pools"][0]["num_blocks"], 3212);
  for (const auto& g : j["kv_cache_groups"]) {
    EXPECT_EQ(g["block_size"], g["kind"] == "full" ? 544 : 262144) << g.dump();
  }
  for (const char* key :
       {"id", "pool", "kind", "layers", "block_size", "page_bytes", "real_page_bytes"}) {
    EXPECT_TRUE(j["kv_cache_groups"][0].contains(key)) << key;
  }
  for (const char* key :
       {"request_len", "max_requests", "physical_limit", "efficiency", "at_max_model_len"}) {
    EXPECT_TRUE(j["concurrency"].contains(key)) << key;
  }
}

TEST(PlanCommand, CompareShowsBothPoliciesAndTheirRatio) {
  testing::CliResult r = run_plan({"qwen3.5-27b", "--draft", "mha-draft-qwen3.5-27b", "--tp", "4",
                                   "--gpu", "b300", "--compare"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("mixkv/vllm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("factor"), std::string::npos) << r.out;
  testing::CliResult j = run_plan({"qwen3.5-27b", "--draft", "mha-draft-qwen3.5-27b", "--tp", "4",
                                   "--gpu", "b300", "--compare", "--json"});
  ASSERT_EQ(j.status, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_GT(doc["mixkv"]["concurrency"]["max_requests"].get<int>(),
            doc["vllm"]["concurrency"]["max_requests"].get<int>());
}

TEST(PlanCommand, BadInputsExitTwoWithAClearMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  for (const auto& c : std::vector<Case>{
           {{"qwen3-8b", "--memory", "0"}, "memory size"},
           {{"qwen3-8b", "--gpu", "a100"}, "unknown GPU"},
           {{"qwen3-8b", "--memory", "40GiB", "--backend", "xformers"}, "--backend"},
           {{"qwen3-8b", "--memory", "40GiB", "--policy", "sglang"}, "--policy"},
           {{"qwen3-8b", "--memory", "40GiB", "--block-size", "20"}, "--block-size 20"},
           {{"qwen3-8b", "--memory", "1GiB"}, "longest request that fits"}}) {
    testing::CliResult r = run_plan(c.args);
    EXPECT_EQ(r.status, 2) << c.needle;
    EXPECT_TRUE(r.out.empty());
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
}

// The reproducers of issue 12 §5, in the words a user types: each a clear error, exit 2.
TEST(PlanCommand, HostileOptionsExitTwoNamingTheOption) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> needles;
  };
  for (const auto& c : std::vector<Case>{
           {{"qwen3-8b", "--memory", "1GiB", "--max-model-len", "4611686018427387904"},
            {"--max-model-len", "4611686018427387904"}},
           {{"qwen3-8b", "--memory", "1GiB", "--request-len", "9223372036854775807"},
            {"--request-len"}},
           {{"qwen3-8b", "--memory", "1GiB", "--block-size", "4611686018427387904"},
            {"--block-size"}},
           {{"qwen3-8b", "--memory", "40GiB", "--request-len", "2147483647"},
            {"--request-len 2147483647", "above the max model length 40960"}},
           {{"qwen3-8b", "--memory", "40GiB", "--max-model-len", "0"}, {"--max-model-len 0"}},
           {{"qwen3-8b", "--memory", "40GiB", "--max-model-len", "1024", "--request-len", "2500"},
            {"--request-len 2500", "--max-model-len"}},
           {{"qwen3-8b", "--memory", "40GiB", "--policy", "vllm", "--max-num-batched-tokens", "0"},
            {"--max-num-batched-tokens"}},
           {{"qwen3-8b", "--memory", "9EiB"}, {"below 8 EiB"}}}) {
    testing::CliResult r = run_plan(c.args);
    EXPECT_EQ(r.status, 2) << c.args.back() << r.err;
    EXPECT_TRUE(r.out.empty());
    for (const auto& needle : c.needles) {
      EXPECT_NE(r.err.find(needle), std::string::npos) << needle << " in " << r.err;
    }
    EXPECT_EQ(r.err.find("not understood"), std::string::npos) << r.err;
  }
}

TEST(PlanCommand, ExbibytesAreUnderstood) {
  testing::CliResult r = run_plan({"qwen3-8b", "--memory", "1EiB", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["memory_bytes"], std::int64_t{1} << 60);
}

TEST(PlanCommand, MaxNumBatchedTokensReachesTheVllmConcurrency) {
  testing::CliResult a =
      run_plan({"gemma-2-9b", "--memory", "40GiB", "--policy", "vllm", "--json"});
  testing::CliResult b = run_plan({"gemma-2-9b", "--memory", "40GiB", "--policy", "vllm",
                                   "--max-num-batched-tokens", "2048", "--json"});
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["max_num_batched_tokens"], 8192);
  EXPECT_EQ(jb["max_num_batched_tokens"], 2048);
  // 15,603 blocks over 512 + 513 and 512 + 385 blocks per 8,192-token request.
  EXPECT_NEAR(ja["concurrency"]["at_max_model_len"].get<double>(), 15603.0 / 1025, 1e-9);
  EXPECT_NEAR(jb["concurrency"]["at_max_model_len"].get<double>(), 15603.0 / 897, 1e-9);
}

}  // namespace
}  // namespace mixkv::cli
