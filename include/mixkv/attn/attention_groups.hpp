// Attention groups: the layers of one KV-cache group that one backend serves with one metadata
// builder (one plan() call). Layers share a builder only if they agree on everything that
// builder's plan fixes for its backend — window_left, soft cap, scale, sinks, causality, cache
// dtype, head counts where the backend's kernel choice depends on them — so "window left is not
// the same for all layers" cannot happen, and a non-causal drafter gets its own metadata.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/backend/backend.hpp"
#include "mixkv/model/model.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::attn {

// The order of a kernel page's K (V) half: NHD token by token (a token's KV heads side by side),
// HND KV head by KV head (a head's tokens side by side); layout::LayerGeometry.
enum class KvLayout { kNHD, kHND };
std::string_view to_string(KvLayout layout);
// Parses "NHD" or "HND"; throws Error naming `where` otherwise.
KvLayout parse_kv_layout(std::string_view text, const std::string& where);

// What a backend's metadata builder fixes for all of its layers, and what it can serve.
// Sources: shared/design/peers.md §5 (FlashInfer plan()/run(), FlashAttention) and
// vllm-reference.md §5–§6 (vLLM's builders).
struct BackendCaps {
  backend::Backend backend = backend::Backend::kFlashinfer;
  // Fixed per plan: FlashInfer's plan() takes window_left, logits_soft_cap and sm_scale and its
  // run() asserts window_left matches; sinks pick another kernel; causal is a plan() argument.
  bool uniform_window = false;
  bool uniform_soft_cap = false;
  bool uniform_scale = false;
  bool uniform_sinks = false;
  bool uniform_causal = true;  // every builder here builds causal or non-causal metadata
  // FlashInfer's decode plan depends on the GQA group size (CUDA-core kernels dispatch group
  // sizes 1, 2, 3, 4, 6, 8; others need the tensor-core path), so heads join its key.
  bool uniform_heads = false;
  bool supports_non_causal = true;
  std::vector<DType> cache_dtypes;
  KvLayout layout = KvLayout::kNHD;
  bool kv_split = true;  // K and V in separate halves of each kernel page
};
const BackendCaps& capabilities(backend::Backend backend);

// The per-layer parameters an attention group shares. window_left is FlashInfer's spelling:
// tokens to the left a query may see, -1 for no window.
struct AttentionParams {
  std::int64_t window_left = -1;
  std::optional<double> soft_cap;
  double scale = 1.0;
  bool sinks = false;
  bool causal = true;
  DType kv_dtype = DType::kBfloat16;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  bool operator==(const AttentionParams&) const = default;
};
AttentionParams attention_params(const model::LayerDesc& layer);

struct AttentionGroup {
  int id = 0;
  int kv_cache_group = 0;
  backend::Backend backend = backend::Backend::kFlashinfer;
  std::vector<std::string> layers;
  std::int64_t kernel_block_size = 0;
  AttentionParams params;  // for fields the backend does not fix, those of the first layer
  KvLayout layout = KvLayout::kNHD;
  bool kv_split = true;
  std::string kernel_path;   // e.g. "flashinfer decode, CUDA cores (GQA 8)"
  std::string split_reason;  // why it is not part of the previous group of its KV-cache group
  bool operator==(const AttentionGroup&) const = default;
};

// What the kernel of `layer` (a member of `group`) is given: the group's parameters where the
// group's backend fixes them for the whole group (one builder per group), the layer's own
// elsewhere (a cpu group may mix layers with and without sinks, say); the cache dtype is always
// the group's.
AttentionParams kernel_params(const AttentionGroup& group, const model::LayerDesc& layer);

// Partitions every KV-cache group of `plan` into attention groups and picks each group's kernel
// page from its own heads. Throws Error when a group's backend cannot serve it (dtype,
// non-causal) or no kernel page divides its manager block, naming the group, its heads, the
// manager block and the sizes the backend accepts; and when layers of one vllm-policy KV-cache
// group disagree on their cache dtype.
std::vector<AttentionGroup> build_attention_groups(const model::ModelDesc& desc,
                                                   const plan::CachePlan& plan);

}  // namespace mixkv::attn
