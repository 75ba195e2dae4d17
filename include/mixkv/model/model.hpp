// Per-layer description of a target model and its speculative drafter: what each layer needs from
// the KV cache, per tensor-parallel rank. Everything downstream (planning, attention grouping,
// layout, kernels) consumes a ModelDesc and nothing else about the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/core/dtype.hpp"

namespace mixkv::model {

enum class LayerKind {
  kFull,       // full causal attention: one K and V per token
  kSliding,    // sliding-window attention: only the last `window` tokens are read
  kChunked,    // chunked-local attention: tokens attend within aligned chunks of `chunk` tokens
  kMla,        // multi-head latent attention: one latent vector (head_size wide) per token
  kGdn,        // Gated DeltaNet linear attention: fixed-size recurrent state
  kKda,        // Kimi Delta Attention: fixed-size recurrent state
  kMamba2,     // Mamba2 selective state space: fixed-size state
  kMamba1,     // Mamba (v1) selective state space: fixed-size state
  kLightning,  // MiniMax lightning (linear) attention: one fixed-size key-value state per head
};

enum class Owner { kTarget, kDraft };

// How a drafter proposes tokens; decides its default number of speculative tokens.
enum class DraftKind {
  kEagle,   // EAGLE head: decoder layer(s) fed by target hidden states, one token per forward
  kEagle3,  // EAGLE-3 head: like kEagle with three fused target hidden states
  kMtp,     // multi-token-prediction layers declared by the target itself
  kDflash,  // DFlash block-diffusion drafter: a whole block per forward, non-causal in the block
  kModel,   // an ordinary model used as a draft model
  kSelf,    // self-speculative: the target's first layers, final norm and LM head (LayerSkip)
};

std::string_view to_string(LayerKind kind);
std::string_view to_string(Owner owner);
std::string_view to_string(DraftKind kind);
std::optional<LayerKind> parse_layer_kind(std::string_view text);
std::optional<Owner> parse_owner(std::string_view text);
std::optional<DraftKind> parse_draft_kind(std::string_view text);

// Attention kinds keep K/V per token; recurrent kinds keep a fixed-size state per sequence.
bool is_recurrent(LayerKind kind);
bool is_attention(LayerKind kind);

// One tensor of a recurrent layer's per-sequence state.
struct StateTensor {
  std::string name;                 // "conv", "temporal", "ssm", "q_conv", ...
  std::vector<std::int64_t> shape;  // per TP rank
  DType dtype = DType::kBfloat16;

  bool operator==(const StateTensor&) const = default;
};

struct LayerDesc {
  std::string name;  // unique within a ModelDesc, e.g. "layers.3", "draft.layers.0", "mtp.layers.0"
  Owner owner = Owner::kTarget;
  int index = 0;  // position in its owner's layer stack (the checkpoint's layer index)
  LayerKind kind = LayerKind::kFull;
  // Attention geometry per TP rank. For kMla, num_kv_heads is 1 and head_size is the cached latent
  // width (kv_lora_rank + qk_rope_head_dim); head_size_v is kv_lora_rank, a view of that latent.
  // Recurrent layers report their head counts and head sizes for information.
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  int head_size_v = 0;
  std::optional<std::int64_t> window;  // kSliding only: tokens visible to a query, itself included
  std::optional<std::int64_t> chunk;   // kChunked only
  std::optional<double> soft_cap;      // logits soft cap (tanh capping), if any
  double scale = 1.0;                  // softmax scale applied to q.k
  bool sinks = false;                  // learned per-head sink logits
  bool causal = true;
  // kMla only: the key cache of a DeepSeek sparse-attention (DSA) lightning indexer. It is planned
  // like an MLA latent (one "KV head" of head_size elements per token, always fp8: the key plus
  // its fp32 scale, as vLLM stores it), but it is read by the indexer's top-k scoring, not by
  // softmax attention, and its dtype does not follow --kv-dtype.
  bool indexer = false;
  // Cache element type. Recurrent layers: the type of their conv state (see `state` for all).
  DType kv_dtype = DType::kBfloat16;
  std::vector<StateTensor> state;  // recurrent kinds only; empty for attention

  bool operator==(const LayerDesc&) const = default;
};

struct DraftInfo {
  DraftKind kind = DraftKind::kModel;
  std::optional<int> block_size;      // DFlash: tokens per drafted block (anchor included)
  std::vector<int> target_layer_ids;  // EAGLE-3 / DFlash: target layers whose hidden states feed it
  // kSelf: the drafter is the target's first `shared_target_layers` layers. Their KV *is* the
  // target's (the same tokens at the same positions give the same K/V), so the drafter owns no
  // layer of its own and the plan charges it no byte.
  int shared_target_layers = 0;

  bool operator==(const DraftInfo&) const = default;
};

// Whole-model numbers the KV-cache planner needs beside the per-layer cache shapes: how long a
// context the target was built for, and how much memory its weights (and the drafter's) take
// before any cache is allocated.
struct ModelFacts {
  std::optional<std::int64_t> max_position_embeddings;  // the target's
  std::optional<std::int64_t> hidden_size;              // the target's
  std::optional<std::int64_t> vocab_size;               // the target's
  std::optional<std::int64_t> weight_bytes;  // estimated weight bytes per TP rank, target + drafter
  std::string weight_estimate;               // one line: how weight_bytes was estimated
  bool operator==(const ModelFacts&) const = default;
};

// Bounds of a ModelDesc, the same whether it comes from CLI options or a native model file:
// generous, yet they catch typos and keep every later product in range.
inline constexpr int kMaxTp = 1024;
inline constexpr int kMaxSpecTokens = 1024;

struct ModelDesc {
  std::string model;                 // target name (built-in name or file)
  std::optional<std::string> draft;  // drafter name, if any
  int tp = 1;
  int num_spec_tokens = 0;
  std::optional<DraftInfo> draft_info;
  ModelFacts facts;
  std::vector<LayerDesc> layers;  // target layers in order, then drafter layers in order

  bool operator==(const ModelDesc&) const = default;
};

// Cache bytes one token adds to an attention layer (K and V, or the MLA latent).
std::int64_t kv_bytes_per_token(const LayerDesc& layer);
// Bytes of one sequence's recurrent state (all its tensors); 0 for attention layers.
std::int64_t state_bytes(const LayerDesc& layer);

// Checks every field of every layer; throws Error naming the layer and field at fault. Names
// (model, drafter, layers, state tensors) must hold no control characters: they are printed.
void validate(const ModelDesc& desc);

}  // namespace mixkv::model
