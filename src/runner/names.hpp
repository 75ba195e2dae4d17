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
#include "mixkv/weights/gguf.hpp"
#include "mixkv/weights/safetensors.hpp"
#include "runner/ops.hpp"

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
  // llama.cpp's converter permuted the rows of the family's GGUF attn_q / attn_k for ggml's
  // adjacent-pair RoPE (convert_hf_to_gguf.py, LlamaModel.permute): the runner rotates pairs
  // there (ops::rope_pairs) instead of HF's halves, leaving the file's bytes as they are.
  bool gguf_rope_pairs = false;
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

// Where a WeightSource reads: float tensors (generated or safetensors; copied), or a GGUF file
// (viewed in place: matrices stay in their stored type in the mapping). Neither: shapes only.
struct WeightStore {
  const weights::TensorMap* tensors = nullptr;
  const weights::GgufFile* gguf = nullptr;
};

// Hands out the weights of one model (or drafter) by role, each checked against the shape the
// caller states, and records every (name, shape) it was asked for. Without a store it only
// records, returning empty weights: weight_shapes() runs the same family code the loader runs.
// Matrices (projections, embedding, LM head) come as kernel views; the small tensors (norms,
// biases, convolutions, sinks) as float values.
class WeightSource {
 public:
  WeightSource(const NameTable& names, WeightStore store, std::string origin,
               WeightNaming naming = WeightNaming::kHuggingFace);

  // A whole-model tensor, or one of a layer under `prefix` (layer_prefix(index) for the family's
  // layers; "draft.layers.0.", "mtp.layers.0." for a drafter's).
  std::vector<float> model(Role role, std::vector<std::int64_t> shape);
  std::vector<float> layer(std::string_view prefix, Role role, std::vector<std::int64_t> shape);
  Matrix model_matrix(Role role, std::int64_t rows, std::int64_t cols);
  Matrix layer_matrix(std::string_view prefix, Role role, std::int64_t rows, std::int64_t cols);
  // A drafter head's tensor under `prefix` ("draft.", "mtp.").
  std::vector<float> head(std::string_view prefix, Role role, std::vector<std::int64_t> shape);
  Matrix head_matrix(std::string_view prefix, Role role, std::int64_t rows, std::int64_t cols);
  std::string layer_prefix(int index) const;

  // Block-format and bf16 matrices handed out from now on reduce in `order` (block formats
  // packed where that pays).
  void set_weight_order(kernels::ReductionOrder order) { order_ = order; }
  kernels::ReductionOrder weight_order() const { return order_; }

  const ShapeList& requested() const { return requested_; }
  const NameTable& names() const { return names_; }
  WeightNaming naming() const { return naming_; }

 private:
  std::string name_of(std::string_view prefix, Role role) const;
  // Records the request; the GGUF tensor or float tensor of that name and shape (both null when
  // listing shapes only).
  const weights::GgufTensor* find(const std::string& name, const std::vector<std::int64_t>& shape,
                                  const weights::Tensor** tensor);
  std::vector<float> values(const std::string& name, std::vector<std::int64_t> shape);
  Matrix matrix(const std::string& name, std::int64_t rows, std::int64_t cols);
  const NameTable& names_;
  WeightStore store_;
  std::string origin_;
  WeightNaming naming_;
  ShapeList requested_;
  kernels::ReductionOrder order_ = kernels::ReductionOrder::kGgml;
};

}  // namespace mixkv::runner
