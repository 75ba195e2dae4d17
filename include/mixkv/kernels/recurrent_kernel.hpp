// Recurrent-state kernels on the CPU over mixkv's planned geometry: the short causal conv state
// update, the Gated DeltaNet and Kimi Delta Attention steps and chunked prefills, and the Mamba2
// SSM step. States are
// addressed by explicit manager block ids (slots), so the kernels know nothing of the manager's
// policy; a speculative verify writes one checkpoint state per draft position. docs/kernels.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mixkv/core/dtype.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/model.hpp"

namespace mixkv::kernels {

// Where one state tensor sits inside a layer's per-block state: the layer's state tensors are
// concatenated in model::LayerDesc::state order from LayerGeometry::offset (what
// model::state_bytes and the planners size), each row-major in its own dtype.
struct StateTensorPlace {
  std::int64_t offset = 0;    // bytes from the start of the layer's state
  std::int64_t elements = 0;  // product of the tensor's shape
  DType dtype = DType::kFloat32;
  bool operator==(const StateTensorPlace&) const = default;
};

// Depthwise causal conv over [state rows ; new tokens]; state shape [rows, channels], oldest row
// first. rows = kernel - 1 + num_spec_tokens: the state keeps the last `rows` inputs (so it is
// always the tail of the input stream), the conv reads the last kernel - 1 of them.
struct ConvSpec {
  std::int64_t channels = 0;
  std::int64_t kernel = 0;
  std::int64_t rows = 0;
  bool silu = true;  // SiLU on the output (GDN and Mamba2 layers both use it)
  StateTensorPlace place;
  bool operator==(const ConvSpec&) const = default;
};

// Gated delta rule, one state S[k_dim][v_dim] per value head (state shape [v_heads, k_dim,
// v_dim]); value head h reads key/query head h / (v_heads / k_heads). Queries are multiplied by
// `scale` inside the kernel; L2-normalising q and k (Qwen3-Next does) is the caller's job.
struct GdnSpec {
  std::int64_t num_k_heads = 0;
  std::int64_t num_v_heads = 0;
  std::int64_t k_dim = 0;
  std::int64_t v_dim = 0;
  float scale = 1.0f;
  StateTensorPlace place;
  bool operator==(const GdnSpec&) const = default;
};

// Kimi Delta Attention is the same gated delta rule over the same state [v_heads, k_dim, v_dim]
// (Kimi Linear: as many key as value heads); only its gate differs, one decay per key channel
// instead of one per head (KdaInputs::g), so it shares GDN's spec.
using KdaSpec = GdnSpec;

// Mamba2 selective state space: state [heads, head_dim, state_size]; head h reads B/C group
// h / (heads / groups).
struct Mamba2Spec {
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t state_size = 0;
  std::int64_t groups = 0;
  StateTensorPlace place;
  bool operator==(const Mamba2Spec&) const = default;
};

struct GdnLayerSpec {
  ConvSpec conv;  // over the concatenated q, k, v projections
  GdnSpec gdn;
};
// Kimi Linear's KDA layer: a short conv on each of q, k and v (own state tensors, no bias), then
// the recurrence over the "recurrent" state.
struct KdaLayerSpec {
  ConvSpec q_conv, k_conv, v_conv;
  KdaSpec kda;
};
struct Mamba2LayerSpec {
  ConvSpec conv;  // over x, B, C
  Mamba2Spec ssm;
};

// Specs of a GDN ("conv", "temporal"), KDA ("q_conv", "k_conv", "v_conv", "recurrent") or Mamba2
// ("conv", "ssm") layer from its state tensors. The conv width is rows - num_spec_tokens + 1.
// Throws Error naming the layer for another kind, state tensors that are missing or inconsistent
// with the layer's heads, or an nvfp4 state.
GdnLayerSpec gdn_layer_spec(const model::LayerDesc& layer, int num_spec_tokens);
KdaLayerSpec kda_layer_spec(const model::LayerDesc& layer, int num_spec_tokens);
Mamba2LayerSpec mamba2_layer_spec(const model::LayerDesc& layer, int num_spec_tokens);

// One request of a batch: it reads the state in block `in_slot` and consumes `num_tokens`
// tokens. `out_slots` holds either one block (the state after the last token: decode with
// out == in, or prefill) or num_tokens blocks (a speculative verify: the state after token i
// goes to out_slots[i]). An output slot may equal the input slot: the state is read first.
struct StateSequence {
  std::int64_t in_slot = 0;
  std::int64_t num_tokens = 1;
  std::span<const std::int64_t> out_slots;
};

// One state tensor of block `slot`, decoded to float / encoded from float, through the geometry
// (offset + slot * kernel_page_stride + place.offset). Throws Error when the geometry is not a
// recurrent layer's, the tensor does not fit its state, or the bytes lie outside `cache`.
std::vector<float> read_state(const StateTensorPlace& place, const layout::LayerGeometry& layer,
                              std::span<const std::byte> cache, std::int64_t slot);
void write_state(const StateTensorPlace& place, const layout::LayerGeometry& layer,
                 std::span<std::byte> cache, std::int64_t slot, std::span<const float> values);

struct ConvInputs {
  std::span<const float> x;       // [sum num_tokens, channels], batch order
  std::span<const float> weight;  // [channels, kernel]; weight[c][kernel-1] meets the newest
  std::span<const float> bias;    // [channels] or empty
};
// out: [sum num_tokens, channels].
void conv_update(const ConvSpec& spec, const layout::LayerGeometry& layer,
                 std::span<std::byte> cache, std::span<const StateSequence> batch,
                 const ConvInputs& inputs, std::span<float> out);

struct GdnInputs {
  std::span<const float> q;     // [sum num_tokens, k_heads, k_dim]
  std::span<const float> k;     // [sum num_tokens, k_heads, k_dim]
  std::span<const float> v;     // [sum num_tokens, v_heads, v_dim]
  std::span<const float> g;     // [sum num_tokens, v_heads]: log decay (<= 0 in models)
  std::span<const float> beta;  // [sum num_tokens, v_heads]
};
// Per token and value head: S = exp(g) S; u = beta (v - S^T k); S = S + k u^T;
// o = S^T (scale q). out: [sum num_tokens, v_heads, v_dim].
void gdn_step(const GdnSpec& spec, const layout::LayerGeometry& layer, std::span<std::byte> cache,
              std::span<const StateSequence> batch, const GdnInputs& inputs, std::span<float> out);
// The same recurrence in chunks of `chunk` tokens (UT transform within a chunk, one state update
// per chunk). Only the final state is stored, so every request needs exactly one out slot.
void gdn_chunked_prefill(const GdnSpec& spec, const layout::LayerGeometry& layer,
                         std::span<std::byte> cache, std::span<const StateSequence> batch,
                         const GdnInputs& inputs, std::int64_t chunk, std::span<float> out);

struct KdaInputs {
  std::span<const float> q;     // [sum num_tokens, k_heads, k_dim]
  std::span<const float> k;     // [sum num_tokens, k_heads, k_dim]
  std::span<const float> v;     // [sum num_tokens, v_heads, v_dim]
  std::span<const float> g;     // [sum num_tokens, v_heads, k_dim]: log decay per key channel
  std::span<const float> beta;  // [sum num_tokens, v_heads]
};
// Per token and value head, with D = diag(exp(g)) over the key channels:
// S = D S; u = beta (v - S^T k); S = S + k u^T; o = S^T (scale q). out: [sum num_tokens,
// v_heads, v_dim]. Gates are log decays (<= 0: kda_gate's form); positive ones may overflow.
void kda_step(const KdaSpec& spec, const layout::LayerGeometry& layer, std::span<std::byte> cache,
              std::span<const StateSequence> batch, const KdaInputs& inputs, std::span<float> out);
// The same recurrence in chunks of `chunk` tokens (UT transform within a chunk, one state update
// per chunk; each key is carried through the chunk decayed token by token, so no factor exceeds
// 1 whatever the gates). Only the final state is stored: one out slot per request.
void kda_chunked_prefill(const KdaSpec& spec, const layout::LayerGeometry& layer,
                         std::span<std::byte> cache, std::span<const StateSequence> batch,
                         const KdaInputs& inputs, std::int64_t chunk, std::span<float> out);
// Kimi Linear's gate (flash-linear-attention's fused_kda_gate): per token, head h and key
// channel i, g = -exp(a_log[h]) * softplus(raw + dt_bias[h * k_dim + i]). raw and g: [tokens,
// heads, k_dim]; a_log: [heads]; dt_bias: [heads * k_dim] or empty.
void kda_gate(std::int64_t heads, std::int64_t k_dim, std::span<const float> raw,
              std::span<const float> a_log, std::span<const float> dt_bias, std::span<float> g);

struct Mamba2Inputs {
  std::span<const float> x;        // [sum num_tokens, heads, head_dim]
  std::span<const float> dt;       // [sum num_tokens, heads], before dt_bias and softplus
  std::span<const float> b;        // [sum num_tokens, groups, state_size]
  std::span<const float> c;        // [sum num_tokens, groups, state_size]
  std::span<const float> a;        // [heads] (negative in models: A = -exp(A_log))
  std::span<const float> d;        // [heads]
  std::span<const float> dt_bias;  // [heads]
};
// Per token and head: dt = softplus(dt + dt_bias); dA = exp(dt A);
// s[p][n] = dA s[p][n] + dt x[p] B[n]; y[p] = sum_n C[n] s[p][n] + D x[p].
// out: [sum num_tokens, heads, head_dim].
void mamba2_step(const Mamba2Spec& spec, const layout::LayerGeometry& layer,
                 std::span<std::byte> cache, std::span<const StateSequence> batch,
                 const Mamba2Inputs& inputs, std::span<float> out);

}  // namespace mixkv::kernels
