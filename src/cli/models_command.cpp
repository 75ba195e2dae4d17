#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli.hpp"
#include "mixkv/builtin/builtin_models.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/model/describe.hpp"

namespace mixkv::cli {
namespace {

using builtin::Role;

// Drafters that fit `target`: the built-in drafters trained for it, plus "mtp" when the target
// declares MTP layers.
std::vector<std::string> drafters_for(std::string_view target) {
  std::vector<std::string> out;
  for (const auto& m : builtin::builtin_models()) {
    for (auto t : m.targets) {
      if (t == target) out.emplace_back(m.name);
    }
  }
  try {
    model::describe_refs(target, model::kMtpDraft, {});
    out.emplace_back(model::kMtpDraft);
  } catch (const Error&) {
    // No MTP layers declared: nothing to add.
  }
  return out;
}

}  // namespace

Action add_models_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd =
      app.add_subcommand("models", "List the built-in models and which drafter fits which target");
  cmd->add_flag("--json", *json, "Print a JSON list");
  return [json](std::ostream& out) {
    nlohmann::json list = nlohmann::json::array();
    std::string text =
        fmt::format("{:<24} {:<7} {:<70} {}\n", "name", "role", "summary", "drafters / targets");
    for (const auto& m : builtin::builtin_models()) {
      std::vector<std::string> pairs;
      if (m.role == Role::kTarget) {
        pairs = drafters_for(m.name);
      } else {
        pairs.assign(m.targets.begin(), m.targets.end());
      }
      const std::string_view role = m.role == Role::kTarget ? "target" : "draft";
      text +=
          fmt::format("{:<24} {:<7} {:<70} {}\n", m.name, role, m.summary, fmt::join(pairs, ", "));
      list.push_back({{"name", m.name},
                      {"role", role},
                      {"summary", m.summary},
                      {m.role == Role::kTarget ? "drafters" : "targets", pairs}});
    }
    out << (*json ? list.dump(2) + "\n" : text);
  };
}

}  // namespace mixkv::cli
