#include "model_options.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "mixkv/describe.hpp"
#include "mixkv/error.hpp"

namespace mixkv::cli {
namespace {

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

void add_model_options(CLI::App& cmd, ModelArgs& args) {
  cmd.add_option("model", args.model,
                 "Target model: built-in name, config.json (or its directory), or model file")
      ->required();
  cmd.add_option("--draft", args.draft,
                 "Drafter: built-in name, config.json, or 'mtp' (the target's MTP layers)");
  cmd.add_option("--tp", args.tp, "Tensor-parallel size (default 1)");
  cmd.add_option(
      "--num-spec-tokens", args.num_spec_tokens,
      "Speculative tokens per step (default: 0, or the drafter's own: DFlash block-1, MTP layers, "
      "3 for EAGLE / draft models)");
  cmd.add_option("--kv-dtype", args.kv_dtype,
                 "KV cache dtype: auto|bfloat16|float16|float32|fp8|fp8_e4m3|fp8_e5m2|nvfp4")
      ->capture_default_str();
  cmd.add_option("--draft-kv-dtype", args.draft_kv_dtype,
                 "Drafter KV cache dtype (default: as --kv-dtype)");
  cmd.add_option(
      "--layer-kv-dtype", args.layer_kv_dtypes,
      "Per-layer override NAME=DTYPE, NAME may be a glob (e.g. 'draft.*=fp8'); repeatable");
  cmd.add_option("--ssm-dtype", args.ssm_dtype,
                 "Recurrent temporal/SSM state dtype: auto (the config's own, else the model "
                 "dtype) or a dtype")
      ->capture_default_str();
}

model::ModelDesc describe_from_args(const ModelArgs& args) {
  model::DescribeOptions options;
  options.tp = args.tp;
  options.num_spec_tokens = args.num_spec_tokens;
  options.kv_dtype = dtype_option("--kv-dtype", args.kv_dtype);
  options.draft_kv_dtype = dtype_option("--draft-kv-dtype", args.draft_kv_dtype);
  options.ssm_dtype = dtype_option("--ssm-dtype", args.ssm_dtype);
  for (const auto& text : args.layer_kv_dtypes) {
    options.layer_kv_dtypes.push_back(model::parse_layer_dtype_override(text));
  }
  std::optional<std::string_view> draft;
  if (!args.draft.empty()) draft = args.draft;
  return model::describe_refs(args.model, draft, options);
}

}  // namespace mixkv::cli
