#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ostream>

#include "cli.hpp"
#include "layer_table.hpp"
#include "mixkv/describe.hpp"
#include "mixkv/error.hpp"
#include "mixkv/model_json.hpp"

namespace mixkv::cli {
namespace {

struct DescribeArgs {
  std::string model;
  std::string draft;
  std::optional<int> tp;
  std::optional<int> num_spec_tokens;
  std::string kv_dtype = "auto";
  std::string draft_kv_dtype;
  std::string ssm_dtype = "auto";
  std::vector<std::string> layer_kv_dtypes;
  bool json = false;
};

// "auto" (or empty) -> nullopt; otherwise a dtype, or a clear error naming the option.
std::optional<DType> dtype_option(std::string_view option, const std::string& text) {
  if (text.empty() || text == "auto") return std::nullopt;
  auto dtype = parse_dtype(text);
  if (!dtype) {
    throw_invalid(fmt::format("{} '{}' is not a dtype; use auto or one of {}", option, text,
                              fmt::join(dtype_names(), ", ")));
  }
  return dtype;
}

}  // namespace


Action add_describe_command(CLI::App& app) {
  auto args = std::make_shared<DescribeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "describe", "Print what every layer of a model (and its drafter) needs from the KV cache");
  cmd->footer(
      "MODEL and --draft take a built-in name (see `mixkv models`), a HuggingFace config.json (or its "
      "directory), or a native mixkv model file (docs/model-file.md). --draft mtp uses the target's own "
      "MTP layers. Numbers are per tensor-parallel rank.");
  cmd->add_option("model", args->model, "Target model")->required();
  cmd->add_option("--draft", args->draft, "Drafter: built-in name, config.json, or 'mtp'");
  cmd->add_option("--tp", args->tp, "Tensor-parallel size (default 1)");
  cmd->add_option("--num-spec-tokens", args->num_spec_tokens,
                  "Speculative tokens per step (default: 0, or the drafter's own: DFlash block-1, MTP layers, "
                  "3 for EAGLE / draft models)");
  cmd->add_option("--kv-dtype", args->kv_dtype,
                  "KV cache dtype: auto|bfloat16|float16|float32|fp8|fp8_e4m3|fp8_e5m2|nvfp4")
      ->capture_default_str();
  cmd->add_option("--draft-kv-dtype", args->draft_kv_dtype, "Drafter KV cache dtype (default: as --kv-dtype)");
  cmd->add_option("--layer-kv-dtype", args->layer_kv_dtypes,
                  "Per-layer override NAME=DTYPE, NAME may be a glob (e.g. 'draft.*=fp8'); repeatable");
  cmd->add_option("--ssm-dtype", args->ssm_dtype,
                  "Recurrent temporal/SSM state dtype: auto (the config's own, else the model dtype) or a dtype")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print the JSON document (the native model-file format)");

  return [args](std::ostream& out) {
    model::DescribeOptions options;
    options.tp = args->tp;
    options.num_spec_tokens = args->num_spec_tokens;
    options.kv_dtype = dtype_option("--kv-dtype", args->kv_dtype);
    options.draft_kv_dtype = dtype_option("--draft-kv-dtype", args->draft_kv_dtype);
    options.ssm_dtype = dtype_option("--ssm-dtype", args->ssm_dtype);
    for (const auto& text : args->layer_kv_dtypes) {
      options.layer_kv_dtypes.push_back(model::parse_layer_dtype_override(text));
    }
    std::optional<std::string_view> draft;
    if (!args->draft.empty()) draft = args->draft;
    const model::ModelDesc desc = model::describe_refs(args->model, draft, options);
    if (args->json) {
      out << model::to_json(desc).dump(2) << '\n';
    } else {
      out << format_layer_table(desc);
    }
  };
}

}  // namespace mixkv::cli
