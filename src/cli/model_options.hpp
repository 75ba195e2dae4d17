// Options every command that reads a model shares (describe, plan, ...).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/model/describe.hpp"
#include "mixkv/model/model.hpp"
#include "mixkv/plan/plan.hpp"

namespace CLI {
class App;
}

namespace mixkv::cli {

struct ModelArgs {
  std::string model;
  std::string draft;
  std::optional<int> tp;
  std::optional<int> num_spec_tokens;
  std::optional<int> draft_layers;  // --draft self
  std::string kv_dtype = "auto";
  std::string draft_kv_dtype;
  std::string ssm_dtype = "auto";
  std::vector<std::string> layer_kv_dtypes;
};

void add_model_options(CLI::App& cmd, ModelArgs& args);
// The describe options of `args` (tp, speculative tokens, dtypes checked and parsed); the
// Python binding uses it too, so both refuse a bad dtype with the same message.
model::DescribeOptions describe_options_from_args(const ModelArgs& args);

// A dtype flag's text: "auto" (or empty) -> nullopt; otherwise a dtype, or an Error naming
// `option` and the dtypes.
std::optional<DType> dtype_option(std::string_view option, const std::string& text);
model::ModelDesc describe_from_args(const ModelArgs& args);

// Plan options as `plan` reads them (memory, backend, block size, lengths, policy).
struct PlanArgs {
  std::string memory;
  std::string gpu;
  double utilization = 0.9;
  std::optional<std::int64_t> block_size;
  std::string backend = "flashinfer";
  std::optional<std::int64_t> max_model_len;  // unset: the model's max positions
  std::int64_t request_len = 2500;
  std::string policy = "mixkv";
  std::int64_t max_num_batched_tokens = plan::kDefaultMaxNumBatchedTokens;
};
void add_plan_options(CLI::App& cmd, PlanArgs& args);
// Resolves the options (default memory: --gpu h100); `memory_note` says where the memory came from.
// A --max-model-len below 1, or a --request-len above the max model length, is an error.
plan::PlanOptions plan_options_from_args(const PlanArgs& args, const model::ModelDesc& desc,
                                         std::string* memory_note = nullptr);

}  // namespace mixkv::cli
