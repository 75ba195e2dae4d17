// Options every command that reads a model shares (describe, plan, ...).
#pragma once

#include <optional>
#include <string>
#include <vector>

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
  std::string kv_dtype = "auto";
  std::string draft_kv_dtype;
  std::string ssm_dtype = "auto";
  std::vector<std::string> layer_kv_dtypes;
};

void add_model_options(CLI::App& cmd, ModelArgs& args);
model::ModelDesc describe_from_args(const ModelArgs& args);

// Plan options as `plan` reads them (memory, backend, block size, lengths, policy).
struct PlanArgs {
  std::string memory;
  std::string gpu;
  double utilization = 0.9;
  std::optional<std::int64_t> block_size;
  std::string backend = "flashinfer";
  std::int64_t max_model_len = 0;
  std::int64_t request_len = 2500;
  std::string policy = "mixkv";
};
void add_plan_options(CLI::App& cmd, PlanArgs& args);
// Resolves the options (default memory: --gpu h100); `memory_note` says where the memory came from.
plan::PlanOptions plan_options_from_args(const PlanArgs& args, const model::ModelDesc& desc,
                                         std::string* memory_note = nullptr);

}  // namespace mixkv::cli
