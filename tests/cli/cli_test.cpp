// The command line, driven in-process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/layer_table.hpp"
#include "cli_test_support.hpp"

namespace mixkv::cli {
namespace {

testing::CliResult run_cli(std::vector<std::string> args) {
  return testing::run_cli("", std::move(args));
}

TEST(CompactIndices, RunsAndProgressions) {
  EXPECT_EQ(compact_indices({3, 7, 11, 15}), "3..15 step 4");
  EXPECT_EQ(compact_indices({0, 1, 2, 4, 5, 6}), "0-2,4-6");
  EXPECT_EQ(compact_indices({5}), "5");
  // Six runs, short enough to print whole.
  EXPECT_EQ(compact_indices({0, 1, 2, 4, 6, 8, 10, 20, 21}), "0-2,4,6,8,10,20-21");
}

// Issue 12 §6: an irregular set must not print as "0,2,4,...,50", which reads as a step-2 run.
TEST(CompactIndices, IrregularSetsPrintWhatIsTrue) {
  // Nemotron-H 8B's Mamba2 blocks: 24 irregularly spaced indices from 0 to 50.
  const std::vector<int> mamba = {0,  2,  4,  6,  9,  11, 13, 15, 17, 20, 22, 24,
                                  26, 28, 31, 33, 35, 37, 39, 42, 44, 46, 48, 50};
  EXPECT_EQ(compact_indices(mamba), "0,2,4,(+20 more),50");
  // Gemma 3 27B's local layers: all of 0..61 but every sixth.
  std::vector<int> local;
  for (int i = 0; i < 62; ++i) {
    if ((i + 1) % 6 != 0) local.push_back(i);
  }
  EXPECT_EQ(compact_indices(local), "0-61 except 5..59 step 6");
  // Irregular holes, but short enough to list every run.
  EXPECT_EQ(compact_indices({0, 1, 3, 4, 5, 7, 8, 9, 10, 12, 13, 14, 15, 16, 18, 19}),
            "0-1,3-5,7-10,12-16,18-19");
}

TEST(DescribeCommand, TableFoldsIdenticalLayersIntoOneRow) {
  testing::CliResult r = run_cli({"describe", "qwen3-next-80b-a3b"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty());
  EXPECT_NE(r.out.find("3..47 step 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("conv(3,8192)"), std::string::npos) << r.out;
  // Header + model line + two rows (gdn, full).
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 4);
}

TEST(DescribeCommand, JsonOutputParsesAndHonoursOptions) {
  testing::CliResult r = run_cli({"describe", "qwen3-next-80b-a3b", "--tp", "4",
                                  "--num-spec-tokens", "2", "--kv-dtype", "fp8", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tp"], 4);
  EXPECT_EQ(j["num_spec_tokens"], 2);
  EXPECT_EQ(j["layers"][3]["kv_dtype"], "fp8_e4m3");
  EXPECT_EQ(j["layers"][3]["num_kv_heads"], 1);
  EXPECT_EQ(j["layers"][0]["state"][0]["shape"], (nlohmann::json{5, 2048}));
}

TEST(DescribeCommand, DraftAndLayerOverride) {
  testing::CliResult r = run_cli({"describe", "qwen3.5-27b", "--draft", "dflash-qwen3.5-27b",
                                  "--layer-kv-dtype", "draft.*=fp8", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layers"].back()["kv_dtype"], "fp8_e4m3");
  EXPECT_EQ(j["layers"][3]["kv_dtype"], "bfloat16");
}

TEST(DescribeCommand, BadDtypeIsUsageErrorOnStderr) {
  testing::CliResult r = run_cli({"describe", "qwen3-8b", "--kv-dtype", "int3"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("--kv-dtype 'int3'"), std::string::npos) << r.err;
}

TEST(DescribeCommand, UnknownModelIsUsageError) {
  testing::CliResult r = run_cli({"describe", "no-such-model"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("mixkv models"), std::string::npos) << r.err;
}

TEST(ModelsCommand, ListsTargetsDraftersAndPairings) {
  testing::CliResult r = run_cli({"models", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  bool found_pair = false;
  for (const auto& m : j) {
    if (m["name"] == "qwen3.5-27b") {
      EXPECT_EQ(m["role"], "target");
      const auto& d = m["drafters"];
      found_pair = std::find(d.begin(), d.end(), "dflash-qwen3.5-27b") != d.end() &&
                   std::find(d.begin(), d.end(), "mha-draft-qwen3.5-27b") != d.end() &&
                   std::find(d.begin(), d.end(), "mtp") != d.end();
    }
  }
  EXPECT_TRUE(found_pair) << r.out;
}

TEST(Cli, HelpForEveryCommandExitsZero) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--help"}, {"describe", "--help"}, {"models", "--help"}}) {
    testing::CliResult r = run_cli(args);
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << r.out;
  }
  EXPECT_NE(run_cli({"describe", "--help"}).out.find("--num-spec-tokens"), std::string::npos);
}

TEST(Cli, MissingCommandOrUnknownOptionIsUsageError) {
  EXPECT_EQ(run_cli({}).status, 2);
  EXPECT_EQ(run_cli({"describe", "qwen3-8b", "--frobnicate"}).status, 2);
}

}  // namespace
}  // namespace mixkv::cli
