// `mixkv verify`: run the plan's attention and recurrent kernels over a scaled-down cache and
// compare them with the dense references (docs/kernels.md). Exit status 3 when a group mismatches.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/verify.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "model_options.hpp"

namespace mixkv::cli {

Action add_verify_command(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::optional<std::int64_t> block_size;
    std::string backend = "flashinfer";
    std::int64_t max_model_len = 0;
    std::int64_t request_len = 2500;
    std::string policy = "mixkv";
    std::string memory_scale = "64MiB";
    int requests = 4;
    std::uint64_t seed = 1;
    bool json = false;
    std::string fault;
    int fault_group = -1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Run the plan's kernels over a scaled-down cache and compare with references");
  cmd->footer(
      "Plans the model in --memory-scale bytes (same geometry rules, fewer blocks), allocates the "
      "cache, writes random K/V through the slot mappings and random states into the state "
      "blocks of a batch of requests, and checks every attention group's kernel (decode and "
      "extend) and every GDN/Mamba2 group's kernels (decode, speculative checkpoints, chunked "
      "prefill) against dense references. Exit "
      "status: 0 all verified groups pass, 3 a group mismatches, 2 bad input, 1 internal error. "
      "docs/kernels.md.");
  add_model_options(*cmd, args->model);
  cmd->add_option("--block-size", args->block_size,
                  "Attention block size in tokens (multiple of 16)");
  cmd->add_option("--backend", args->backend,
                  "Attention backend whose page geometry to verify: "
                  "flashinfer|flashinfer-trtllm|flash-attn|flash-attn3|triton|flex|flashmla|"
                  "cutlass-mla|cpu")
      ->capture_default_str();
  cmd->add_option("--max-model-len", args->max_model_len,
                  "Longest request of the scaled plan (default: the largest that fits, <= 2048)");
  cmd->add_option("--request-len", args->request_len, "Tokens per request of the workload")
      ->capture_default_str();
  cmd->add_option("--policy", args->policy, "Planning policy: mixkv|vllm")->capture_default_str();
  cmd->add_option("--memory-scale", args->memory_scale, "KV memory of the scaled-down plan")
      ->capture_default_str();
  cmd->add_option("--requests", args->requests, "Requests in the batch (1-64)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Random seed")->capture_default_str();
  cmd->add_flag("--json", args->json, "Print the results as JSON");
  // Testing aids (hidden): plant a fault in what the kernels are given, to see verify catch it.
  cmd->add_option("--plant-fault", args->fault, "stride|window|target-page|state-slot")->group("");
  cmd->add_option("--fault-group", args->fault_group,
                  "attention group (stride, window, target-page) or KV-cache group (state-slot) "
                  "of the fault")
      ->group("");

  return [args](std::ostream& out) {
    const model::ModelDesc desc = describe_from_args(args->model);
    kernels::VerifyOptions options;
    auto backend = backend::parse_backend(args->backend);
    if (!backend) {
      throw_invalid(fmt::format("--backend '{}' is unknown; use one of {}", args->backend,
                                fmt::join(backend::backend_names(), ", ")));
    }
    options.plan.backend = *backend;
    auto policy = plan::parse_policy(args->policy);
    if (!policy)
      throw_invalid(fmt::format("--policy '{}' is unknown; use mixkv or vllm", args->policy));
    options.plan.policy = *policy;
    options.plan.block_size = args->block_size;
    options.plan.max_model_len = args->max_model_len;
    options.plan.request_len = args->request_len;
    options.plan.memory_bytes = plan::parse_memory_size(args->memory_scale);
    options.requests = args->requests;
    options.seed = args->seed;
    if (args->fault == "stride") {
      options.fault = kernels::PlantedFault::kKernelPageStride;
    } else if (args->fault == "window") {
      options.fault = kernels::PlantedFault::kFullWindow;
    } else if (args->fault == "target-page") {
      options.fault = kernels::PlantedFault::kTargetKernelPage;
    } else if (args->fault == "state-slot") {
      options.fault = kernels::PlantedFault::kStateSlot;
    } else if (!args->fault.empty()) {
      throw_invalid(fmt::format(
          "--plant-fault '{}' is unknown; use stride, window, target-page or state-slot",
          args->fault));
    }
    options.fault_group = args->fault_group;
    const bool progress = isatty(STDERR_FILENO) != 0;
    if (progress) {
      options.progress = [](int done, int total) {
        std::fprintf(stderr, "\rverify: %d/%d layers", done, total);
        if (done == total) std::fputs("\r\033[K", stderr);
        std::fflush(stderr);
      };
    }
    const kernels::VerifyReport report = kernels::verify(desc, options);

    if (args->json) {
      nlohmann::json groups = nlohmann::json::array();
      for (const auto& g : report.groups) {
        groups.push_back(
            {{"attention_group",
              g.attention_group >= 0 ? nlohmann::json(g.attention_group) : nlohmann::json(nullptr)},
             {"kv_cache_group", g.kv_cache_group},
             {"kind", g.kind},
             {"params", g.params},
             {"layers", g.layers},
             {"layers_checked", g.layers_checked},
             {"status", std::string(kernels::to_string(g.status))},
             {"reason", g.reason},
             {"max_abs_error", g.max_abs_error},
             {"max_rel_error", g.max_rel_error},
             {"tolerance", g.tolerance},
             {"max_abs_error_original", g.max_abs_error_original},
             {"tolerance_original", g.tolerance_original}});
      }
      nlohmann::json requests = nlohmann::json::array();
      for (const auto& q : report.requests) {
        requests.push_back({{"kv_len", q.kv_len},
                            {"extend_queries", q.extend_queries},
                            {"shares_prefix_with", q.shares_prefix_with},
                            {"shared_tokens", q.shared_tokens}});
      }
      nlohmann::json j = {{"model", desc.model},
                          {"draft", desc.draft ? nlohmann::json(*desc.draft) : nullptr},
                          {"policy", std::string(plan::to_string(report.plan.policy))},
                          {"backend", std::string(backend::to_string(report.plan.backend))},
                          {"memory_bytes", report.plan.memory_bytes},
                          {"max_model_len", report.plan.max_model_len},
                          {"bytes_allocated", report.bytes_allocated},
                          {"requests", requests},
                          {"groups", groups},
                          {"passed", !report.mismatch()}};
      out << j.dump(2) << '\n';
    } else {
      out << fmt::format(
          "verify {}{}: {} policy, {} geometry, scaled plan of {} B (max_model_len {}), {} B "
          "allocated\n",
          desc.model, desc.draft ? " + " + *desc.draft : "", plan::to_string(report.plan.policy),
          backend::to_string(report.plan.backend), report.plan.memory_bytes,
          report.plan.max_model_len, report.bytes_allocated);
      std::vector<std::string> lens;
      for (const auto& q : report.requests) {
        lens.push_back(q.shares_prefix_with >= 0
                           ? fmt::format("{} ({} shared with #{})", q.kv_len, q.shared_tokens,
                                         q.shares_prefix_with)
                           : fmt::format("{}", q.kv_len));
      }
      out << fmt::format(
          "requests: {}; attention: decode, then extend; recurrent: decode, speculative "
          "checkpoints, chunked prefill\n\n",
          fmt::join(lens, ", "));
      out << fmt::format("{:<6} {:<4} {:<10} {:<40} {:>7} {:>10} {:>10} {:>10}  {}\n", "group",
                         "kv", "kind", "parameters", "layers", "max abs", "max rel", "tolerance",
                         "result");
      for (const auto& g : report.groups) {
        const std::string id = g.attention_group >= 0 ? fmt::format("a{}", g.attention_group) : "-";
        const std::string layers = fmt::format("{}/{}", g.layers_checked, g.layers.size());
        const bool ran =
            g.status == kernels::GroupStatus::kPass || g.status == kernels::GroupStatus::kMismatch;
        out << fmt::format(
            "{:<6} {:<4} {:<10} {:<40} {:>7} {:>10} {:>10} {:>10}  {}\n", id, g.kv_cache_group,
            g.kind, g.params, layers, ran ? fmt::format("{:.2e}", g.max_abs_error) : "-",
            ran ? fmt::format("{:.2e}", g.max_rel_error) : "-",
            ran ? fmt::format("{:.2e}", g.tolerance) : "-", kernels::to_string(g.status));
        // Mismatches, skips and kinds without a kernel say why.
        if (!g.reason.empty()) out << "       " << g.reason << '\n';
      }
      out << (report.mismatch() ? "\nverify: MISMATCH\n" : "\nverify: all verified groups pass\n");
    }
    if (report.mismatch()) throw ExitStatus{3};
  };
}

}  // namespace mixkv::cli
