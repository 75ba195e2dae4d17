#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ostream>

#include "cli.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/simulate.hpp"
#include "mixkv/plan/plan.hpp"
#include "model_options.hpp"

namespace mixkv::cli {
namespace {

std::string format_report(const model::ModelDesc& desc, const plan::CachePlan& plan,
                          const sim::SimReport& r, const std::string& trace_name) {
  std::string s;
  auto line = [&](std::string_view label, const std::string& value) {
    s += fmt::format("  {:<22}{}\n", label, value);
  };
  s += fmt::format("simulate {} ({} policy, {} blocks, {} speculative tokens, acceptance {:.2f})\n",
                   desc.model, plan::to_string(plan.policy), r.pool_blocks, r.num_spec_tokens,
                   r.acceptance);
  line("trace", trace_name);
  line("requests finished", fmt::format("{} of {}", r.requests_finished, r.requests));
  line("steps",
       fmt::format("{} ({} request-steps, {} decode)", r.steps, r.request_steps, r.decode_steps));
  line("peak concurrency", std::to_string(r.peak_concurrency));
  line("preemptions", std::to_string(r.preemptions));
  line("prefix hit rate", fmt::format("{:.1f}% ({} of {} prompt tokens)", 100 * r.prefix_hit_rate,
                                      r.hit_tokens, r.prompt_tokens));
  line("mean accepted length",
       fmt::format("{:.2f} tokens per decode step", r.mean_accepted_length));
  line("manager throughput", fmt::format("{:.2f} M request-steps/s ({:.0f} ns per request-step)",
                                         r.request_steps_per_second / 1e6, r.ns_per_request_step));
  line("time",
       fmt::format("{:.3f} s wall, {:.3f} s in the manager", r.wall_seconds, r.manager_seconds));
  s += "  KV usage per group (blocks held, over the run):\n";
  s += fmt::format("    {:>5}  {:<11} {:>10} {:>10} {:>10} {:>12} {:>10}\n", "group", "behaviour",
                   "block size", "peak", "mean", "hit tokens", "evictions");
  for (const auto& g : r.groups) {
    s += fmt::format("    {:>5}  {:<11} {:>10} {:>10} {:>10.1f} {:>12} {:>10}\n", g.group,
                     plan::to_string(g.behaviour), g.block_size, g.peak_blocks_held,
                     g.mean_blocks_held, g.hit_tokens, g.evictions);
  }
  return s;
}

}  // namespace

Action add_simulate_command(CLI::App& app) {
  struct Args {
    ModelArgs model;
    PlanArgs plan;
    std::string trace;
    std::int64_t requests = 200;
    double acceptance = 0.7;
    std::uint64_t seed = 0;
    std::int64_t max_batch = 256;
    bool json = false;
    bool csv = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "simulate",
      "Replay a request trace through a continuous-batching scheduler driving the KV-cache "
      "manager with speculative steps");
  cmd->footer(
      "Trace: JSONL, one request per line: {\"arrival_step\": 0, \"prompt_len\": 900, "
      "\"prefix_id\": 1, \"output_len\": 200} (or \"prompt\": [token ids]). Without --trace, a "
      "seeded synthetic trace of --requests requests with shared prefixes. Memory as for `plan` "
      "(default: --gpu h100). docs/cache.md describes the scheduler.");
  add_model_options(*cmd, args->model);
  add_plan_options(*cmd, args->plan);
  cmd->add_option("--trace", args->trace, "JSONL request trace (default: built-in synthetic)");
  cmd->add_option("--requests", args->requests, "Requests of the synthetic trace")
      ->capture_default_str();
  cmd->add_option("--acceptance", args->acceptance,
                  "Probability each draft token is accepted (0 to 1)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the synthetic trace and of acceptance")
      ->capture_default_str();
  cmd->add_option("--max-batch", args->max_batch, "Running requests at most")
      ->capture_default_str();
  CLI::Option* json = cmd->add_flag("--json", args->json, "Print the full report as JSON");
  cmd->add_flag("--csv", args->csv,
                "Print the KV usage series as CSV, one row per sample and group (docs/cache.md)")
      ->excludes(json);

  return [args](std::ostream& out) {
    const model::ModelDesc desc = describe_from_args(args->model);
    std::string memory_note;
    const plan::PlanOptions options = plan_options_from_args(args->plan, desc, &memory_note);
    const plan::CachePlan plan = plan::make_plan(desc, options);

    std::vector<sim::TraceRequest> trace;
    std::string trace_name;
    if (!args->trace.empty()) {
      trace = sim::read_trace(args->trace);
      trace_name = args->trace;
    } else {
      sim::SyntheticOptions so;
      so.requests = args->requests;
      so.seed = args->seed;
      so.max_len = plan.max_model_len;
      so.num_spec_tokens = desc.num_spec_tokens;
      trace = sim::synthetic_trace(so);
      trace_name = fmt::format("synthetic, {} requests, seed {}", args->requests, args->seed);
    }
    sim::SimOptions sim_options;
    sim_options.acceptance = args->acceptance;
    sim_options.seed = args->seed;
    sim_options.max_batch = args->max_batch;
    // A bar only for a person watching: never in a pipe, a file or a test's captured stream.
    if (isatty(STDERR_FILENO) != 0) {
      sim_options.progress = [](std::int64_t done, std::int64_t total) {
        constexpr int kWidth = 30;
        const auto filled = static_cast<int>(kWidth * done / std::max<std::int64_t>(total, 1));
        std::fprintf(stderr, "\rsimulate: [%s%s] %lld/%lld requests",
                     std::string(static_cast<std::size_t>(filled), '#').c_str(),
                     std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(),
                     static_cast<long long>(done), static_cast<long long>(total));
        if (done == total) std::fputs("\r\033[K", stderr);
        std::fflush(stderr);
      };
    }
    const sim::SimReport report = sim::simulate(plan, desc.num_spec_tokens, trace, sim_options);
    if (!report.invariants.empty()) {
      throw_internal("the KV-cache manager broke an invariant: " + report.invariants);
    }
    if (args->csv) {
      out << sim::to_csv(report);
    } else if (args->json) {
      nlohmann::json j = sim::to_json(report);
      j["model"] = desc.model;
      j["policy"] = plan::to_string(plan.policy);
      j["memory_bytes"] = plan.memory_bytes;
      j["trace"] = trace_name;
      out << j.dump(2) << '\n';
    } else {
      out << format_report(desc, plan, report, trace_name) << memory_note << '\n';
    }
  };
}

}  // namespace mixkv::cli
