// The JSON form of a ModelDesc. `mixkv describe --json` prints it, and the same document is the
// native mixkv model file (docs/model-file.md): reading it back gives the same ModelDesc.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "mixkv/model/model.hpp"

namespace mixkv::model {

inline constexpr std::string_view kModelFileFormat = "mixkv-model/1";

nlohmann::json to_json(const ModelDesc& desc);

// True when `doc` is a native mixkv model file rather than a HuggingFace config.
bool is_native_model_file(const nlohmann::json& doc);

// Reads a native model file; `origin` names it in errors. Validates the result.
ModelDesc model_desc_from_json(const nlohmann::json& doc, std::string_view origin);

}  // namespace mixkv::model
