#include "model_options.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "mixkv/core/error.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "mixkv/weights/gguf_model.hpp"

namespace mixkv::cli {
std::optional<DType> dtype_option(std::string_view option, const std::string& text) {
  if (text.empty() || text == "auto") return std::nullopt;
  auto dtype = parse_dtype(text);
  if (!dtype) {
    throw_invalid(fmt::format("{} '{}' is not a dtype; use auto or one of {}", option, text,
                              fmt::join(dtype_names(), ", ")));
  }
  return dtype;
}

void add_model_options(CLI::App& cmd, ModelArgs& args) {
  cmd.add_option("model", args.model,
                 "Target model: built-in name, config.json (or its directory), or model file")
      ->required();
  cmd.add_option("--draft", args.draft,
                 "Drafter: built-in name, config.json, 'mtp' (the target's MTP layers) or 'self' "
                 "(the target's first --draft-layers layers, sharing their KV)");
  cmd.add_option("--draft-layers", args.draft_layers,
                 fmt::format("Target layers a --draft self drafter runs (default {})",
                             model::kDefaultSelfDraftLayers));
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
                 "Recurrent temporal/SSM state dtype: auto (the config's own, else float32 for "
                 "Mamba2 and the model dtype for the others) or a dtype")
      ->capture_default_str();
}

model::DescribeOptions describe_options_from_args(const ModelArgs& args) {
  model::DescribeOptions options;
  options.tp = args.tp;
  options.num_spec_tokens = args.num_spec_tokens;
  options.draft_layers = args.draft_layers;
  options.kv_dtype = dtype_option("--kv-dtype", args.kv_dtype);
  options.draft_kv_dtype = dtype_option("--draft-kv-dtype", args.draft_kv_dtype);
  options.ssm_dtype = dtype_option("--ssm-dtype", args.ssm_dtype);
  for (const auto& text : args.layer_kv_dtypes) {
    options.layer_kv_dtypes.push_back(model::parse_layer_dtype_override(text));
  }
  return options;
}

model::ModelDesc describe_from_args(const ModelArgs& args) {
  const model::DescribeOptions options = describe_options_from_args(args);
  std::optional<std::string_view> draft;
  if (!args.draft.empty()) draft = args.draft;
  return weights::describe_refs(args.model, draft, options);  // GGUF files too
}

void add_plan_options(CLI::App& cmd, PlanArgs& args) {
  auto* memory =
      cmd.add_option("--memory", args.memory, "Bytes for the KV cache per rank (e.g. 40GiB, 80GB)");
  cmd.add_option("--gpu", args.gpu, "GPU: h100|h200|b200|b300 (memory minus estimated weights)")
      ->excludes(memory);
  cmd.add_option("--gpu-memory-utilization", args.utilization, "Share of GPU memory mixkv may use")
      ->capture_default_str();
  cmd.add_option("--block-size", args.block_size,
                 "Attention block size in tokens (multiple of 16)");
  cmd.add_option("--backend", args.backend,
                 "Attention backend: "
                 "flashinfer|flashinfer-trtllm|flash-attn|flash-attn3|triton|flex|flashmla|"
                 "cutlass-mla|cpu")
      ->capture_default_str();
  cmd.add_option("--max-model-len", args.max_model_len,
                 "Longest request (default: the model's max positions)");
  cmd.add_option("--request-len", args.request_len, "Tokens per request of the workload")
      ->capture_default_str();
  cmd.add_option("--policy", args.policy, "Planning policy: mixkv|vllm")->capture_default_str();
  cmd.add_option("--max-num-batched-tokens", args.max_num_batched_tokens,
                 "vLLM's tokens per scheduler step: what --policy vllm charges a sliding or "
                 "chunked layer per request")
      ->capture_default_str();
}

plan::PlanOptions plan_options_from_args(const PlanArgs& args, const model::ModelDesc& desc,
                                         std::string* memory_note) {
  plan::PlanOptions options;
  auto backend = backend::parse_backend(args.backend);
  if (!backend) {
    throw_invalid(fmt::format("--backend '{}' is unknown; use one of {}", args.backend,
                              fmt::join(backend::backend_names(), ", ")));
  }
  options.backend = *backend;
  auto policy = plan::parse_policy(args.policy);
  if (!policy)
    throw_invalid(fmt::format("--policy '{}' is unknown; use mixkv or vllm", args.policy));
  options.policy = *policy;
  options.block_size = args.block_size;
  if (args.max_model_len) {
    // 0 would mean "the model's own" to make_plan; a user who writes it means something else.
    if (*args.max_model_len < 1) {
      throw_invalid(fmt::format(
          "--max-model-len {} is not a length; give at least 1 token, or omit it for the "
          "model's max positions ({})",
          *args.max_model_len,
          desc.facts.max_position_embeddings
              ? fmt::format("{}", *desc.facts.max_position_embeddings)
              : std::string("not stated by this model")));
    }
    options.max_model_len = *args.max_model_len;
  }
  options.request_len = args.request_len;
  options.max_num_batched_tokens = args.max_num_batched_tokens;
  const std::int64_t max_len = options.max_model_len > 0
                                   ? options.max_model_len
                                   : desc.facts.max_position_embeddings.value_or(0);
  if (max_len > 0 && options.request_len > max_len) {
    // No request of that length can be admitted: the plan would score zero requests.
    throw_invalid(fmt::format(
        "--request-len {} is above the max model length {}{}: no such request can be served; "
        "lower --request-len or raise --max-model-len",
        options.request_len, max_len,
        options.max_model_len > 0 ? "" : " (the model's max positions)"));
  }
  std::string note;
  if (!args.memory.empty()) {
    options.memory_bytes = plan::parse_memory_size(args.memory);
    note = fmt::format("KV memory given: {} B", options.memory_bytes);
  } else {
    const plan::MemoryBudget budget = plan::budget_for_gpu(
        plan::find_gpu(args.gpu.empty() ? "h100" : args.gpu), args.utilization, desc);
    options.memory_bytes = budget.kv_bytes;
    note = "KV memory: " + budget.explanation;
  }
  if (memory_note) *memory_note = note;
  return options;
}

}  // namespace mixkv::cli
