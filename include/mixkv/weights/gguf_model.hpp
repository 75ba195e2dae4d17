// GGUF files as model documents: the architecture keys of a GGUF (`llama.*`) become the
// HuggingFace-style config.json they were converted from, which then takes the same family path
// as any config.json, so `describe`, `plan` and the runner see one ModelDesc however the model
// arrived. (This lives in weights, not model, because model sits below the file readers.)
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "mixkv/model/describe.hpp"
#include "mixkv/weights/gguf.hpp"

namespace mixkv::weights {

// The config.json equivalent of `file`'s metadata: model_type, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings,
// rope_theta, rope_scaling, rms_norm_eps, vocab_size, tie_word_embeddings and torch_dtype (the
// dtype llama.cpp would give the cache: float32 for an all-F32 file, bfloat16 for BF16, float16
// otherwise). Throws Error (unsupported) for an architecture other than llama, (invalid input)
// naming the key for a missing or mistyped one.
nlohmann::json hf_config_from_gguf(const GgufFile& file);

// A model document for `file`, called `name` in messages.
model::ModelSource model_source_from_gguf(const GgufFile& file, std::string name);

// model::load_model_source, plus GGUF: a path to a GGUF file, or a fetched model's name
// (smollm2-135m; Error saying to run `make deps` when its file is missing).
model::ModelSource load_model_source(std::string_view ref);

// model::describe_refs with load_model_source above: what the CLI and the engine call.
model::ModelDesc describe_refs(std::string_view target_ref,
                               std::optional<std::string_view> draft_ref,
                               const model::DescribeOptions& options);

}  // namespace mixkv::weights
