// `mixkv bench-generate`: plain and speculative tokens/s over the built-in prompt set, greedy
// tokens checked against plain, and its options' errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_test_support.hpp"

namespace mixkv::cli {
namespace {

using testing::run_cli;

TEST(BenchGenerateCommand, JsonReportsEachCategoryAndDrafterWithPerPositionCounts) {
  // Fixed draft lengths: adaptive ones follow this machine's step times (docs/sched.md), which a
  // test must not depend on.
  auto r = run_cli("bench-generate", {"tiny-swa", "--draft", "ngram,oracle", "--max-tokens", "8",
                                      "--runs", "1", "--fixed-draft-length", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("categories")) << r.out;
  EXPECT_EQ(j["step_cost_ratio"].size(), 5u);  // 1 to 1 + 4 rows over 1
  EXPECT_EQ(j["step_cost_ratio"][0], 1.0);
  ASSERT_EQ(j["categories"].size(), 2u);  // copy and novel prompts
  for (const auto& c : j["categories"]) {
    EXPECT_GT(c["plain_tokens_per_second"].get<double>(), 0) << c;
    // Decoding alone (after each request's first token), beside the whole request's rate.
    EXPECT_GT(c["plain_decode_tokens_per_second"].get<double>(), 0) << c;
    for (const char* d : {"ngram", "oracle"}) {
      ASSERT_TRUE(c.contains(d)) << c;
      const auto& s = c[d];
      EXPECT_GT(s["tokens_per_second"].get<double>(), 0);
      EXPECT_GT(s["decode_tokens_per_second"].get<double>(), 0) << s;
      EXPECT_GT(s["decode_ratio_to_plain"].get<double>(), 0) << s;
      EXPECT_GE(s["acceptance_rate"].get<double>(), 0);
      EXPECT_LE(s["acceptance_rate"].get<double>(), 1);
      const auto drafted = s["drafted_per_position"].get<std::vector<std::int64_t>>();
      const auto accepted = s["accepted_per_position"].get<std::vector<std::int64_t>>();
      ASSERT_EQ(drafted.size(), accepted.size());
      for (std::size_t p = 0; p < drafted.size(); ++p) EXPECT_LE(accepted[p], drafted[p]);
    }
    // The oracle proposes plain's own continuation: it is accepted.
    EXPECT_GT(c["oracle"]["acceptance_rate"].get<double>(), 0.9) << c;
  }
  // Per prompt, beside the ratio of the medians, the median of each run's ratio to the plain run
  // before it (one run here: the two are the same number).
  for (const auto& p : j["prompts"]) {
    for (const char* d : {"ngram", "oracle"}) {
      const auto& s = p[d];
      ASSERT_TRUE(s.contains("paired_decode_ratio_to_plain")) << s;
      EXPECT_DOUBLE_EQ(s["paired_decode_ratio_to_plain"].get<double>(),
                       s["decode_ratio_to_plain"].get<double>())
          << p["name"] << " " << d;
    }
  }
  // Where the threads sat, before and after the runs: a round trip in ns, or null where the
  // machine has one CPU or was too busy to answer within the probe's budget.
  ASSERT_TRUE(j.contains("thread_round_trip_ns")) << r.out;
  for (const char* when : {"before", "after"}) {
    const auto& v = j["thread_round_trip_ns"][when];
    EXPECT_TRUE(v.is_null() || (v.is_number() && v.get<double>() > 0)) << v;
  }
}

// With one thread nothing is handed between threads: no round trip is measured or reported.
TEST(BenchGenerateCommand, OneThreadReportsNoRoundTrip) {
  auto r = run_cli("bench-generate",
                   {"tiny-swa", "--max-tokens", "4", "--runs", "1", "--threads", "1", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out).contains("thread_round_trip_ns")) << r.out;
}

// A fixed step cost makes the adaptive draft lengths (so the drafting counts) independent of the
// machine's timings: two runs draft alike.
TEST(BenchGenerateCommand, AFixedStepCostGivesTheSameDraftsEveryRun) {
  const auto file = std::filesystem::temp_directory_path() /
                    ("mixkv-bench-prompts-" +
                     std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".txt");
  std::ofstream(file) << "Once upon a time\nThe cache pages\n";
  const std::vector<std::string> args = {
      "tiny-swa", "--draft",   "oracle",      "--max-tokens",        "12",   "--runs",
      "1",        "--prompts", file.string(), "--step-cost-per-row", "0.25", "--json"};
  const auto a = run_cli("bench-generate", args), b = run_cli("bench-generate", args);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["step_cost_ratio"], (nlohmann::json{1.0, 1.25, 1.5, 1.75, 2.0}));
  for (std::size_t i = 0; i < ja["prompts"].size(); ++i) {
    EXPECT_EQ(ja["prompts"][i]["oracle"]["drafted_per_position"],
              jb["prompts"][i]["oracle"]["drafted_per_position"]);
    EXPECT_GT(ja["prompts"][i]["oracle"]["mean_accepted_length"].get<double>(), 2.0);
  }
  std::filesystem::remove(file);
  const auto bad = run_cli("bench-generate", {"tiny-swa", "--step-cost-per-row", "-1"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--step-cost-per-row"), std::string::npos) << bad.err;
}

TEST(BenchGenerateCommand, AnUnknownDrafterIsAUsageError) {
  const auto r = run_cli("bench-generate", {"tiny-swa", "--draft", "bogus", "--max-tokens", "4"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("bogus"), std::string::npos) << r.err;
  // none is plain decoding alone, so it goes with no drafter.
  const auto mixed = run_cli("bench-generate", {"tiny-swa", "--draft", "none,ngram"});
  EXPECT_EQ(mixed.status, 2);
  EXPECT_NE(mixed.err.find("none alone (plain only)"), std::string::npos) << mixed.err;
}

// --draft none measures plain decoding alone: no drafter's figures, and no claim about drafts.
TEST(BenchGenerateCommand, DraftNoneRunsPlainOnly) {
  const auto r = run_cli("bench-generate", {"tiny-swa", "--draft", "none", "--max-tokens", "4",
                                            "--runs", "1", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& c : j["categories"]) {
    EXPECT_GT(c["plain_decode_tokens_per_second"].get<double>(), 0) << c;
    for (const char* d : {"ngram", "oracle"}) EXPECT_FALSE(c.contains(d)) << c;
  }
  const auto text = run_cli("bench-generate", {"tiny-swa", "--draft", "none", "--max-tokens",
                                               "4", "--runs", "1"});
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("plain t/s"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("identical to plain"), std::string::npos) << text.out;
}

// --kv-dtype plans the cache in that dtype (greedy speculation still matches plain in it) and
// says so in the JSON; a dtype mixkv does not know is a usage error naming the flag.
TEST(BenchGenerateCommand, KvDtypeSetsTheCacheDtypeAndAnUnknownOneIsAUsageError) {
  const auto r = run_cli("bench-generate", {"tiny-swa", "--draft", "oracle", "--max-tokens", "4",
                                            "--runs", "1", "--kv-dtype", "bfloat16", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kv_dtype"], "bfloat16");
  EXPECT_EQ(j["identical_to_plain"], true);
  const auto bad = run_cli("bench-generate", {"tiny-swa", "--kv-dtype", "bogus16"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--kv-dtype"), std::string::npos) << bad.err;
}

// The committed prompt file (what scripts/bench-llamacpp-generate.py feeds llama.cpp) is the
// built-in set: same names, categories and, greedy, the same tokens generated.
TEST(BenchGenerateCommand, ThePromptFileIsTheBuiltInSetAndSelfDraftsMatchPlain) {
  const std::vector<std::string> common = {"tiny-swa", "--draft",      "self", "--draft-layers",
                                           "2",        "--max-tokens", "6",    "--runs",
                                           "1",        "--json"};
  auto with_file = common;
  with_file.insert(with_file.end(),
                   {"--prompts", MIXKV_SOURCE_DIR "/bench/generate-prompts.jsonl"});
  const auto a = run_cli("bench-generate", common);
  const auto b = run_cli("bench-generate", with_file);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["draft_layers"], 2);
  ASSERT_EQ(ja["prompts"].size(), jb["prompts"].size());
  for (std::size_t i = 0; i < ja["prompts"].size(); ++i) {
    const auto &pa = ja["prompts"][i], &pb = jb["prompts"][i];
    EXPECT_EQ(pa["name"], pb["name"]);
    EXPECT_EQ(pa["category"], pb["category"]);
    EXPECT_EQ(pa["generated_tokens"], pb["generated_tokens"]);
    EXPECT_TRUE(pa["self"]["identical_to_plain"].get<bool>()) << pa;
    // Both rates are measured (their order is a matter of timing on a loaded machine, so it is
    // not asserted here).
    EXPECT_GT(pa["plain_decode_tokens_per_second"].get<double>(), 0.0) << pa;
    EXPECT_GT(pa["plain_tokens_per_second"].get<double>(), 0.0) << pa;
  }
  const auto bad =
      run_cli("bench-generate", {"tiny-swa", "--draft", "ngram", "--draft-layers", "2"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--draft-layers"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace mixkv::cli
