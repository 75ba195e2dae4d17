#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <ostream>

#include "cli.hpp"
#include "mixkv/attention_groups.hpp"
#include "mixkv/error.hpp"
#include "mixkv/geometry.hpp"
#include "mixkv/geometry_json.hpp"
#include "mixkv/memory_budget.hpp"
#include "mixkv/plan.hpp"
#include "mixkv/plan_json.hpp"
#include "model_options.hpp"
#include "plan_report.hpp"

namespace mixkv::cli {

Action add_plan_command(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::string memory;
    std::string gpu;
    double utilization = 0.9;
    std::optional<std::int64_t> block_size;
    std::string backend = "flashinfer";
    std::int64_t max_model_len = 0;
    std::int64_t request_len = 2500;
    std::string policy = "mixkv";
    bool compare = false;
    bool explain = false;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Plan the KV cache for a memory budget: groups, pages, blocks, concurrency");
  cmd->footer(
      "Memory: --memory SIZE (bytes for the KV cache per rank, e.g. 40GiB), or --gpu with its "
      "utilization, which "
      "subtracts the estimated weights per rank (default: --gpu h100). docs/planning.md explains "
      "both policies; "
      "docs/plan-json.md the --json schema.");
  add_model_options(*cmd, args->model);
  auto* memory = cmd->add_option("--memory", args->memory,
                                 "Bytes for the KV cache per rank (e.g. 40GiB, 80GB)");
  cmd->add_option("--gpu", args->gpu, "GPU: h100|h200|b200|b300 (memory minus estimated weights)")
      ->excludes(memory);
  cmd->add_option("--gpu-memory-utilization", args->utilization,
                  "Share of GPU memory mixkv may use")
      ->capture_default_str();
  cmd->add_option("--block-size", args->block_size,
                  "Attention block size in tokens (multiple of 16)");
  cmd->add_option("--backend", args->backend,
                  "Attention backend: "
                  "flashinfer|flashinfer-trtllm|flash-attn|flash-attn3|triton|flex|flashmla|"
                  "cutlass-mla|cpu")
      ->capture_default_str();
  cmd->add_option("--max-model-len", args->max_model_len,
                  "Longest request (default: the model's max positions)");
  cmd->add_option("--request-len", args->request_len, "Tokens per request of the workload")
      ->capture_default_str();
  cmd->add_option("--policy", args->policy, "Planning policy: mixkv|vllm")->capture_default_str();
  cmd->add_flag("--compare", args->compare, "Plan with both policies and compare them");
  cmd->add_flag("--explain", args->explain, "Show the attention groups and why each was split");
  cmd->add_flag("--json", args->json, "Print the plan as JSON (docs/plan-json.md)");

  // The plan with its attention groups and geometry, as JSON.
  auto full_json = [](const model::ModelDesc& desc, const plan::CachePlan& plan) {
    const auto groups = attn::build_attention_groups(desc, plan);
    nlohmann::json j = plan::to_json(plan);
    j["attention_groups"] = layout::to_json(groups);
    j["geometry"] = layout::to_json(layout::make_geometry(desc, plan, groups));
    return j;
  };
  auto explained = [](const model::ModelDesc& desc, const plan::CachePlan& plan) {
    return format_attention_groups(attn::build_attention_groups(desc, plan));
  };
  return [args, full_json, explained](std::ostream& out) {
    const model::ModelDesc desc = describe_from_args(args->model);
    plan::PlanOptions options;
    auto backend = attn::parse_backend(args->backend);
    if (!backend) {
      throw_invalid(fmt::format("--backend '{}' is unknown; use one of {}", args->backend,
                                fmt::join(attn::backend_names(), ", ")));
    }
    options.backend = *backend;
    auto policy = plan::parse_policy(args->policy);
    if (!policy)
      throw_invalid(fmt::format("--policy '{}' is unknown; use mixkv or vllm", args->policy));
    options.policy = *policy;
    options.block_size = args->block_size;
    options.max_model_len = args->max_model_len;
    options.request_len = args->request_len;
    std::string memory_note;
    if (!args->memory.empty()) {
      options.memory_bytes = plan::parse_memory_size(args->memory);
      memory_note = fmt::format("KV memory given: {} B", options.memory_bytes);
    } else {
      const plan::MemoryBudget budget = plan::budget_for_gpu(
          plan::find_gpu(args->gpu.empty() ? "h100" : args->gpu), args->utilization, desc);
      options.memory_bytes = budget.kv_bytes;
      memory_note = "KV memory: " + budget.explanation;
    }

    if (args->compare) {
      options.policy = plan::Policy::kVllm;
      std::optional<plan::CachePlan> vllm;
      std::string vllm_error;
      try {
        vllm = plan::make_plan(desc, options);
      } catch (const Error& e) {
        vllm_error = e.what();
      }
      options.policy = plan::Policy::kMixkv;
      const plan::CachePlan mixkv = plan::make_plan(desc, options);
      if (args->json) {
        nlohmann::json j = {{"vllm", vllm ? full_json(desc, *vllm) : nlohmann::json(nullptr)},
                            {"mixkv", full_json(desc, mixkv)}};
        if (!vllm) j["vllm_error"] = vllm_error;
        out << j.dump(2) << '\n';
      } else if (vllm) {
        out << format_plan_comparison(desc, *vllm, mixkv) << memory_note << '\n';
      } else {
        out << "vllm policy fails: " << vllm_error << '\n'
            << format_plan(desc, mixkv) << memory_note << '\n';
      }
      if (args->explain && !args->json) {
        if (vllm) out << "vllm " << explained(desc, *vllm);
        out << "mixkv " << explained(desc, mixkv);
      }
      return;
    }
    const plan::CachePlan plan = plan::make_plan(desc, options);
    if (args->json) {
      out << full_json(desc, plan).dump(2) << '\n';
    } else {
      out << format_plan(desc, plan) << memory_note << '\n';
      if (args->explain) out << explained(desc, plan);
    }
  };
}

}  // namespace mixkv::cli
