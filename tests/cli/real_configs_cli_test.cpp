// Every real config kept as a fixture (tests/model/fixtures/) describes and plans from the command
// line under both policies, and with its MTP layers or EAGLE-3 head where it has one.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_support.hpp"

namespace mixkv::cli {
namespace {

std::string fixtures_dir() { return std::string(MIXKV_SOURCE_DIR) + "/tests/model/fixtures"; }

std::vector<std::string> fixtures() {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(fixtures_dir())) {
    if (entry.path().extension() == ".json") out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void expect_plans(std::vector<std::string> args) {
  for (std::string policy : {"mixkv", "vllm"}) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--memory", "40GiB", "--max-model-len", "32768", "--policy", policy});
    const testing::CliResult r = testing::run_cli("plan", a);
    EXPECT_EQ(r.status, 0) << args.front() << " under " << policy << ": " << r.err;
  }
}

TEST(RealConfigsCli, EveryFixtureDescribesAndPlans) {
  const auto files = fixtures();
  ASSERT_GE(files.size(), 18u);
  for (const auto& f : files) {
    const testing::CliResult d = testing::run_cli("describe", {f});
    EXPECT_EQ(d.status, 0) << f << ": " << d.err;
    expect_plans({f});
  }
}

TEST(RealConfigsCli, MtpAndEagle3DraftersPlan) {
  for (std::string name : {"deepseek-v3.2.json", "glm-4.7-flash.json", "mimo-7b-rl.json",
                           "nemotron-3-nano-30b-a3b.json"}) {
    expect_plans({fixtures_dir() + "/" + name, "--draft", "mtp"});
  }
  expect_plans({fixtures_dir() + "/phi-4-mini-instruct.json", "--draft",
                fixtures_dir() + "/eagle3-phi-4-mini.json"});
  expect_plans({"llama-3.1-8b", "--draft", fixtures_dir() + "/eagle3-llama3.1-8b-yuhuili.json"});
}

TEST(RealConfigsCli, LayerTableNamesTheIndexerAndTwoSpecsAtOneIndex) {
  const testing::CliResult ds =
      testing::run_cli("describe", {fixtures_dir() + "/deepseek-v3.2.json"});
  ASSERT_EQ(ds.status, 0) << ds.err;
  EXPECT_NE(ds.out.find("indexer"), std::string::npos) << ds.out;
  EXPECT_NE(ds.out.find("132 B/tok"), std::string::npos) << ds.out;
  const testing::CliResult fh =
      testing::run_cli("describe", {fixtures_dir() + "/falcon-h1-7b-instruct.json"});
  ASSERT_EQ(fh.status, 0) << fh.err;
  EXPECT_NE(fh.out.find("ssm(24,128,256) float32"), std::string::npos) << fh.out;
  const testing::CliResult g =
      testing::run_cli("describe", {fixtures_dir() + "/gemma-3-4b-it.json"});
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_NE(g.out.find("0-33 except 5..29 step 6"), std::string::npos) << g.out;
}

}  // namespace
}  // namespace mixkv::cli
