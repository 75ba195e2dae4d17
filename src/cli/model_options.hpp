// Options every command that reads a model shares (describe, plan, ...).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mixkv/model.hpp"

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

}  // namespace mixkv::cli
