#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <ostream>

#include "cli.hpp"
#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/layout/geometry_json.hpp"
#include "mixkv/plan/plan.hpp"
#include "mixkv/plan/plan_json.hpp"
#include "model_options.hpp"
#include "plan_report.hpp"

namespace mixkv::cli {

Action add_plan_command(CLI::App& app) {
  struct Args {
    ModelArgs model;
    PlanArgs plan;
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
  add_plan_options(*cmd, args->plan);
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
    std::string memory_note;
    plan::PlanOptions options = plan_options_from_args(args->plan, desc, &memory_note);

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
