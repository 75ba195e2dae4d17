// `mixkv verify`, driven in-process: the table, --json, and the exit statuses (0 pass, 3
// mismatch, 2 bad input).
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_test_support.hpp"

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

}  // namespace
}  // namespace mixkv::cli
