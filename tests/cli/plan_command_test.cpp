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

}  // namespace
}  // namespace mixkv::cli
