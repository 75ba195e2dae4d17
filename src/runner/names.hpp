// Every weight the runner reads, named once: a logical role (llama.cpp's vocabulary: token_embd,
// attn_q, ffn_gate, ...) and, per family, its HuggingFace and GGUF spelling. The loader and the
// shape listing (weight_shapes) both go through these tables, so a name is never spelled twice.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixkv/runner/model_runner.hpp"
#include "mixkv/weights/safetensors.hpp"

namespace mixkv::runner {

enum class Role {
  // Whole model.
  kTokenEmbd,
  kOutputNorm,
  kOutput,
  // Per layer: norms.
  kAttnNorm,      // before the mixer
  kAttnPostNorm,  // on the mixer's output (Gemma 2's post_attention_layernorm)
  kFfnNorm,       // before the MLP
  kFfnPostNorm,   // on the MLP's output (Gemma 2)
  // Attention.
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kAttnSinks,
  kAttnQNorm,
  kAttnKNorm,
  // MLP.
  kFfnGate,
  kFfnUp,
  kFfnDown,
  // Gated DeltaNet (Qwen3-Next) and Mamba2 (Nemotron-H) mixers.
  kSsmInQkvz,
  kSsmInBa,
  kSsmIn,
  kSsmConv,
  kSsmConvBias,
  kSsmDtBias,
  kSsmALog,
  kSsmD,
  kSsmNorm,
  kSsmOut,
  // Drafter heads (EAGLE, MTP, DFlash): under the drafter's own prefix.
  kDraftFc,
  kDraftNorm,
  kDraftHiddenNorm,
  kMtpNormEmbedding,
  kMtpNormHidden,
};

// One role's names. Per-layer names are suffixes of the family's layer prefix.
struct TensorName {
  Role role;
  std::string_view hf;
  std::string_view gguf;  // empty: GGUF files of the family do not carry it
};

struct NameTable {
  std::string_view family;
  std::string_view hf_layer_prefix;   // "{}" is the layer index: "model.layers.{}."
  std::span<const TensorName> model;  // full names
  std::span<const TensorName> layer;  // suffixes
  std::string_view gguf_layer_prefix = "blk.{}.";
  const TensorName& find(Role role) const;  // throws (internal) when the family lacks it
};

// The tables: Llama's (also gpt-oss, Qwen3 and the drafters), Qwen3-Next's (Llama's plus its
// Gated DeltaNet layers), Gemma 2's, Nemotron-H's; and the drafter heads'.
const NameTable& llama_names();
const NameTable& qwen3_next_names();
const NameTable& gemma2_names();
const NameTable& nemotron_h_names();
const NameTable& draft_head_names();

using ShapeList = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

// Hands out the weights of one model (or drafter) by role, each checked against the shape the
// caller states, and records every (name, shape) it was asked for. Without a TensorMap it only
// records, returning empty tensors: weight_shapes() runs the same family code the loader runs.
class WeightSource {
 public:
  WeightSource(const NameTable& names, const weights::TensorMap* weights, std::string origin,
               WeightNaming naming = WeightNaming::kHuggingFace);

  // A whole-model tensor, or one of a layer under `prefix` (layer_prefix(index) for the family's
  // layers; "draft.layers.0.", "mtp.layers.0." for a drafter's).
  std::vector<float> model(Role role, std::vector<std::int64_t> shape);
  std::vector<float> layer(std::string_view prefix, Role role, std::vector<std::int64_t> shape);
  // A drafter head's tensor under `prefix` ("draft.", "mtp.").
  std::vector<float> head(std::string_view prefix, Role role, std::vector<std::int64_t> shape);
  std::string layer_prefix(int index) const;

  const ShapeList& requested() const { return requested_; }
  const NameTable& names() const { return names_; }

 private:
  std::vector<float> get(std::string name, std::vector<std::int64_t> shape);
  const NameTable& names_;
  const weights::TensorMap* weights_;
  std::string origin_;
  WeightNaming naming_;
  ShapeList requested_;
};

}  // namespace mixkv::runner
