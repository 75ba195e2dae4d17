// `mixkv simulate`: the continuous-batching scheduler over the KV-cache manager, its trace
// reader, and the command.
#include "mixkv/engine/simulate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_test_support.hpp"
#include "test_support.hpp"

namespace mixkv::sim {
namespace {

// A plan of about `blocks` blocks for `desc` (like the manager's tests), max_model_len 4096.
plan::CachePlan small_plan(const model::ModelDesc& desc, std::int64_t blocks,
                           plan::Policy policy = plan::Policy::kVllm) {
  plan::PlanOptions o;
  o.policy = policy;
  o.max_model_len = 4096;
  o.request_len = 1024;
  o.memory_bytes = std::int64_t{8} << 30;
  const std::int64_t unit = plan::make_plan(desc, o).block_unit_bytes;
  o.memory_bytes = unit * blocks;
  return plan::make_plan(desc, o);
}

std::vector<TraceRequest> small_trace(std::int64_t requests, int k, std::uint64_t seed = 1) {
  SyntheticOptions so;
  so.requests = requests;
  so.seed = seed;
  so.max_len = 4096;
  so.num_spec_tokens = k;
  return synthetic_trace(so);
}

TEST(Simulator, SyntheticTraceFinishesEveryRequestAndKeepsTheInvariants) {
  struct Case {
    const char* target;
    std::optional<std::string_view> draft;
  };
  for (const auto& c :
       {Case{"llama-3.1-8b", "eagle3-llama-3.1-8b"}, Case{"gpt-oss-20b", "eagle3-gpt-oss-20b"},
        Case{"qwen3-next-80b-a3b", std::nullopt}}) {
    SCOPED_TRACE(c.target);
    const auto desc = testing::describe_builtin(c.target, c.draft);
    const auto plan = small_plan(desc, 20000, plan::Policy::kMixkv);
    cache::KvCacheManager manager(plan, desc.num_spec_tokens);
    const auto trace = small_trace(60, desc.num_spec_tokens);
    const SimReport r = simulate(manager, plan, desc.num_spec_tokens, trace);
    EXPECT_EQ(r.requests_finished, 60);
    EXPECT_EQ(manager.check_invariants(), "");
    EXPECT_EQ(r.invariants, "");
    EXPECT_EQ(manager.num_requests(), 0u);
    EXPECT_EQ(manager.pool().num_used(), 0);
    EXPECT_GT(r.peak_concurrency, 1);
    EXPECT_GE(r.request_steps, r.decode_steps + 60);
    EXPECT_GT(r.request_steps_per_second, 0);
    EXPECT_EQ(r.groups.size(), plan.groups.size());
    ASSERT_FALSE(r.usage.empty());
    EXPECT_EQ(r.usage.front().blocks_held.size(), plan.groups.size());
    std::int64_t output = 0;
    for (const auto& t : trace) output += t.output_len;
    EXPECT_GE(r.generated_tokens, output);
  }
}

TEST(Simulator, SharedPrefixesHitOnAFullAttentionModel) {
  const auto desc = testing::describe_builtin("llama-3.1-8b", "eagle3-llama-3.1-8b");
  const auto plan = small_plan(desc, 20000);
  const SimReport r = simulate(plan, desc.num_spec_tokens, small_trace(60, 3));
  EXPECT_GT(r.prefix_hit_rate, 0.2);
  EXPECT_LT(r.prefix_hit_rate, 1.0);
  EXPECT_EQ(r.preemptions, 0);
  std::int64_t group_hits = 0;
  for (const auto& g : r.groups) group_hits += g.hit_tokens;
  EXPECT_GT(group_hits, 0);
}

TEST(Simulator, SharedPrefixesHitOnARecurrentHybridThroughSnapshots) {
  const auto desc = testing::describe_builtin("qwen3-next-80b-a3b");
  const auto plan = small_plan(desc, 20000);
  cache::KvCacheManager manager(plan, desc.num_spec_tokens);
  const SimReport r = simulate(manager, plan, desc.num_spec_tokens, small_trace(60, 0));
  // Hits stop at the latest snapshot (every 272 tokens here), not the latest 16-token block.
  EXPECT_GT(r.prefix_hit_rate, 0.05);
  EXPECT_EQ(r.invariants, "");
  for (const auto& g : r.groups) {
    if (g.behaviour != plan::Behaviour::kRecurrent) continue;
    EXPECT_EQ(g.block_size, manager.snapshot_interval());
    EXPECT_GT(g.hit_tokens, 0);
  }
}

TEST(Simulator, TinyMemoryForcesPreemptionsAndStillFinishes) {
  const auto desc = testing::describe_builtin("llama-3.1-8b", "eagle3-llama-3.1-8b");
  const auto plan = small_plan(desc, 600);  // a few requests of ~2,000 tokens at a time
  cache::KvCacheManager manager(plan, desc.num_spec_tokens);
  const SimReport r = simulate(manager, plan, desc.num_spec_tokens, small_trace(40, 3));
  EXPECT_EQ(r.requests_finished, 40);
  EXPECT_GT(r.preemptions, 0);
  EXPECT_EQ(manager.check_invariants(), "");
  EXPECT_EQ(manager.pool().num_used(), 0);
  for (const auto& s : r.usage) EXPECT_LE(s.blocks_used, plan.pools[0].num_blocks - 1);
  // Pressure reuses cached blocks; every eviction is charged to the group that cached the block.
  std::int64_t evictions = 0;
  for (const auto& g : r.groups) evictions += g.evictions;
  EXPECT_GT(evictions, 0);
  EXPECT_EQ(evictions, manager.pool().counters().evictions);
}

TEST(Simulator, AcceptanceSetsTheMeanAcceptedLength) {
  const auto desc = testing::describe_builtin("llama-3.1-8b", "eagle3-llama-3.1-8b");
  ASSERT_EQ(desc.num_spec_tokens, 3);
  const auto plan = small_plan(desc, 20000);
  const auto trace = small_trace(20, 3);
  SimOptions o;
  o.acceptance = 0;
  const SimReport none = simulate(plan, 3, trace, o);
  o.acceptance = 1;
  const SimReport all = simulate(plan, 3, trace, o);
  o.acceptance = 0.7;
  const SimReport some = simulate(plan, 3, trace, o);
  EXPECT_DOUBLE_EQ(none.mean_accepted_length, 1.0);
  EXPECT_DOUBLE_EQ(all.mean_accepted_length, 4.0);
  EXPECT_GT(some.mean_accepted_length, 1.5);
  EXPECT_LT(some.mean_accepted_length, 3.5);
  EXPECT_LT(all.steps, none.steps);
  EXPECT_EQ(all.requests_finished, 20);
  EXPECT_EQ(none.requests_finished, 20);
}

TEST(Simulator, ReadsJsonlTracesWithExplicitPromptsAndPrefixes) {
  std::istringstream in(
      "{\"arrival_step\": 2, \"prompt_len\": 300, \"prefix_id\": 7, \"output_len\": 5}\n"
      "\n"
      "{\"arrival_step\": 0, \"prompt\": [1, 2, 3, 4, 5], \"output_len\": 3}\n"
      "{\"arrival_step\": 4, \"prompt_len\": 300, \"prefix_id\": 7, \"prefix_len\": 256, "
      "\"output_len\": 5}\n"
      "{\"arrival_step\": 4, \"prompt_len\": 50, \"prefix_id\": null, \"output_len\": 1}\n");
  const auto trace = parse_trace(in, "t.jsonl");
  ASSERT_EQ(trace.size(), 4u);
  EXPECT_EQ(trace[0].tokens.size(), 5u);  // sorted by arrival
  EXPECT_EQ(trace[0].source, "t.jsonl:3");
  EXPECT_EQ(trace[1].prefix_id, 7);
  EXPECT_EQ(trace[2].prefix_len, 256);
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const auto plan = small_plan(desc, 2000);
  const SimReport r = simulate(plan, desc.num_spec_tokens, trace);
  EXPECT_EQ(r.requests_finished, 4);
  EXPECT_EQ(r.hit_tokens, 256);  // the second prefix-7 request hits the shared 256 tokens
}

TEST(Simulator, BadTraceLinesNameTheFileAndLine) {
  struct Case {
    std::string line;
    std::string needle;
  };
  for (const auto& c : std::vector<Case>{
           {"{\"arrival_step\": 0, \"prompt_len\": 10", "not JSON"},
           {"[1, 2]", "JSON object"},
           {"{\"prompt_len\": 10, \"output_len\": 1}", "\"arrival_step\""},
           {"{\"arrival_step\": -1, \"prompt_len\": 10, \"output_len\": 1}", ">= 0"},
           {"{\"arrival_step\": 0, \"prompt_len\": \"10\", \"output_len\": 1}", "integer"},
           {"{\"arrival_step\": 0, \"output_len\": 1}", "exactly one"},
           {"{\"arrival_step\": 0, \"prompt_len\": 0, \"output_len\": 1}", "\"prompt_len\""},
           {"{\"arrival_step\": 0, \"prompt\": [], \"output_len\": 1}", "non-empty"},
           {"{\"arrival_step\": 0, \"prompt\": [1, -2], \"output_len\": 1}", "token ids"},
           {"{\"arrival_step\": 0, \"prompt_len\": 9, \"prefix_id\": \"a\", \"output_len\": 1}",
            "\"prefix_id\""},
           {"{\"arrival_step\": 0, \"prompt_len\": 9, \"output_len\": 0}", "\"output_len\""}}) {
    std::istringstream in("{\"arrival_step\": 0, \"prompt_len\": 10, \"output_len\": 1}\n" +
                          c.line + "\n");
    testing::expect_error([&] { parse_trace(in, "bad.jsonl"); }, ErrorCode::kInvalidInput,
                          {"bad.jsonl:2", c.needle});
  }
  std::istringstream empty("\n");
  testing::expect_error([&] { parse_trace(empty, "e.jsonl"); }, ErrorCode::kInvalidInput,
                        {"e.jsonl", "no requests"});
  testing::expect_error([] { read_trace("/nonexistent/trace.jsonl"); }, ErrorCode::kInvalidInput,
                        {"/nonexistent/trace.jsonl"});
}

TEST(Simulator, RequestsThatCannotFitAreErrors) {
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const auto plan = small_plan(desc, 600);
  std::istringstream too_long("{\"arrival_step\": 0, \"prompt_len\": 4000, \"output_len\": 200}\n");
  const auto long_trace = parse_trace(too_long, "long.jsonl");
  testing::expect_error([&] { simulate(plan, 0, long_trace); }, ErrorCode::kInvalidInput,
                        {"long.jsonl:1", "max_model_len"});
  // 3,000 tokens need ~190 blocks of 16: more than a pool cut to 100 blocks holds (the planner
  // itself never makes such a pool, so the plan is edited).
  auto tiny = plan;
  tiny.pools[0].num_blocks = 100;
  std::istringstream big("{\"arrival_step\": 0, \"prompt_len\": 3000, \"output_len\": 10}\n");
  const auto big_trace = parse_trace(big, "big.jsonl");
  testing::expect_error([&] { simulate(tiny, 0, big_trace); }, ErrorCode::kInvalidInput,
                        {"big.jsonl:1", "do not fit"});
}

testing::CliResult run_simulate(std::vector<std::string> args) {
  return testing::run_cli("simulate", std::move(args));
}

TEST(SimulateCommand, JsonCarriesTheReportKeys) {
  const testing::CliResult r =
      run_simulate({"gpt-oss-20b", "--draft", "eagle3-gpt-oss-20b", "--requests", "30", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* key :
       {"model", "policy", "memory_bytes", "trace", "requests", "requests_finished", "steps",
        "request_steps", "preemptions", "peak_concurrency", "prefix_hit_rate",
        "mean_accepted_length", "wall_seconds", "manager_seconds", "request_steps_per_second",
        "groups", "usage", "num_spec_tokens"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["requests_finished"], 30);
  EXPECT_EQ(j["num_spec_tokens"], 3);
  for (const char* key :
       {"group", "behaviour", "block_size", "peak_blocks_held", "hit_tokens", "evictions"}) {
    EXPECT_TRUE(j["groups"][0].contains(key)) << key;
  }
  EXPECT_TRUE(j["usage"][0].contains("blocks_held"));
}

TEST(Simulator, ProgressReportsFinishedRequestsUpToTheTotal) {
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const auto plan = small_plan(desc, 20000);
  SimOptions o;
  std::vector<std::int64_t> seen;
  o.progress = [&](std::int64_t done, std::int64_t total) {
    EXPECT_EQ(total, 30);
    seen.push_back(done);
  };
  const SimReport r = simulate(plan, 0, small_trace(30, 0), o);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), 30);
  EXPECT_EQ(r.requests_finished, 30);
}

TEST(SimulateCommand, CsvHasOneRowPerSampleAndGroupUnderAStableHeader) {
  const testing::CliResult r =
      run_simulate({"gpt-oss-20b", "--draft", "eagle3-gpt-oss-20b", "--requests", "30", "--csv"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream in(r.out);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "step,running,waiting,blocks_used,group,behaviour,block_size,blocks_held");
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::istringstream cells_in(line);
    for (std::string c; std::getline(cells_in, c, ',');) cells.push_back(c);
    ASSERT_EQ(cells.size(), 8u) << line;
    rows.push_back(cells);
  }
  // The same run as JSON: its usage series times its groups gives the rows, in order.
  const auto j = nlohmann::json::parse(
      run_simulate({"gpt-oss-20b", "--draft", "eagle3-gpt-oss-20b", "--requests", "30", "--json"})
          .out);
  const std::size_t groups = j["groups"].size();
  ASSERT_EQ(rows.size(), j["usage"].size() * groups);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& sample = j["usage"][i / groups];
    EXPECT_EQ(rows[i][0], std::to_string(sample["step"].get<std::int64_t>()));
    EXPECT_EQ(rows[i][4], std::to_string(j["groups"][i % groups]["group"].get<int>()));
    EXPECT_EQ(rows[i][7], std::to_string(sample["blocks_held"][i % groups].get<std::int64_t>()));
  }
  // stderr is not a terminal here: no progress bar.
  EXPECT_EQ(r.err.find('\r'), std::string::npos);
  EXPECT_EQ(run_simulate({"llama-3.1-8b", "--csv", "--json"}).status, 2);  // one format at a time
}

TEST(SimulateCommand, HumanSummaryAndExitCodes) {
  const testing::CliResult ok =
      run_simulate({"llama-3.1-8b", "--requests", "10", "--memory", "20GiB"});
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_NE(ok.out.find("prefix hit rate"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("request-steps/s"), std::string::npos) << ok.out;
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  for (const auto& c : std::vector<Case>{
           {{"llama-3.1-8b", "--acceptance", "1.5"}, "--acceptance"},
           {{"llama-3.1-8b", "--requests", "0"}, "--requests"},
           {{"llama-3.1-8b", "--max-batch", "0"}, "--max-batch"},
           {{"llama-3.1-8b", "--trace", "/nonexistent/t.jsonl"}, "/nonexistent/t.jsonl"},
           {{"llama-3.1-8b", "--policy", "sglang"}, "--policy"},
           {{"llama-3.1-8b", "--gpu", "a100"}, "unknown GPU"}}) {
    const testing::CliResult r = run_simulate(c.args);
    EXPECT_EQ(r.status, 2) << c.needle;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_simulate({"llama-3.1-8b", "--no-such-flag"}).status, 2);
}

}  // namespace
}  // namespace mixkv::sim
