#include "mixkv/kernels/recurrent_kernel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/activation.hpp"
#include "mixkv/kernels/convert.hpp"

namespace mixkv::kernels {
namespace {

// Partial sums of the Mamba2 output (one AVX-512 register).
constexpr std::int64_t kLanes = 16;

// The inner loops, compiled for the baseline and for AVX2+FMA and AVX-512 machines; the loader
// picks one at start-up (GCC function multiversioning), as the attention kernel's. Each request's
// tokens always run through the same clone, so checkpoints stay bit-identical to a rerun.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MIXKV_KERNEL_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define MIXKV_KERNEL_CLONES
#endif

// The layer's state tensors, placed one after another (model::state_bytes sums them so).
std::vector<StateTensorPlace> places(const model::LayerDesc& layer) {
  std::vector<StateTensorPlace> out;
  std::int64_t offset = 0;
  for (const model::StateTensor& t : layer.state) {
    check_cache_dtype(t.dtype, fmt::format("layer {} state tensor '{}'", layer.name, t.name));
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) n = checked_mul(n, d, "state tensor elements");
    out.push_back({offset, n, t.dtype});
    offset = checked_add(offset, storage_bytes(t.dtype, n), "state bytes");
  }
  return out;
}

const model::StateTensor& tensor_named(const model::LayerDesc& layer, std::string_view name,
                                       std::size_t rank, std::size_t* index) {
  for (std::size_t i = 0; i < layer.state.size(); ++i) {
    if (layer.state[i].name != name) continue;
    if (layer.state[i].shape.size() != rank) {
      throw_invalid(fmt::format("layer {}: state tensor '{}' has {} dimensions, expected {}",
                                layer.name, name, layer.state[i].shape.size(), rank));
    }
    *index = i;
    return layer.state[i];
  }
  throw_invalid(
      fmt::format("layer {} ({}) has no '{}' state tensor; describe the layer with its "
                  "state tensors (docs/model-file.md)",
                  layer.name, model::to_string(layer.kind), name));
}

ConvSpec conv_spec(const model::LayerDesc& layer, int num_spec_tokens,
                   const std::vector<StateTensorPlace>& placed, std::string_view name = "conv") {
  std::size_t i = 0;
  const model::StateTensor& t = tensor_named(layer, name, 2, &i);
  ConvSpec c;
  c.rows = t.shape[0];
  c.channels = t.shape[1];
  c.kernel = c.rows - num_spec_tokens + 1;
  c.place = placed[i];
  if (num_spec_tokens < 0 || c.kernel < 1 || c.channels < 1) {
    throw_invalid(
        fmt::format("layer {}: {} state [{}, {}] does not hold kernel - 1 + {} "
                    "speculative rows for any kernel width",
                    layer.name, name, c.rows, c.channels, num_spec_tokens));
  }
  return c;
}

void require(bool ok, const model::LayerDesc& layer, std::string_view what) {
  if (!ok) throw_invalid(fmt::format("layer {} ({}): {}", layer.name, to_string(layer.kind), what));
}

std::string where(const layout::LayerGeometry& layer) {
  return fmt::format("recurrent kernel on layer {}", layer.layer);
}

// Byte offset of `place` in block `slot`, checked against the tensor.
std::int64_t state_offset(const StateTensorPlace& place, const layout::LayerGeometry& layer,
                          std::size_t cache_bytes, std::int64_t slot) {
  if (!layer.recurrent) {
    throw_invalid(
        fmt::format("{}: the geometry is an attention layer's, not a recurrent one", where(layer)));
  }
  const std::int64_t bytes = storage_bytes(place.dtype, place.elements);
  if (place.offset < 0 || place.offset + bytes > layer.state_bytes) {
    throw_invalid(
        fmt::format("{}: state tensor at +{} ({} B) does not fit the layer's {} B state; "
                    "the spec does not belong to this geometry",
                    where(layer), place.offset, bytes, layer.state_bytes));
  }
  if (slot < 0) throw_invalid(fmt::format("{}: state slot {} is negative", where(layer), slot));
  const std::int64_t at = checked_add(
      checked_add(layer.offset, checked_mul(slot, layer.kernel_page_stride, "state offset"),
                  "state offset"),
      place.offset, "state offset");
  if (at + bytes > static_cast<std::int64_t>(cache_bytes)) {
    throw_invalid(fmt::format("{}: state slot {} (bytes {}..{}) lies outside the {} B tensor",
                              where(layer), slot, at, at + bytes, cache_bytes));
  }
  return at;
}

// Checks the batch once; returns the total token count.
std::int64_t check_batch(const StateTensorPlace& place, const layout::LayerGeometry& layer,
                         std::size_t cache_bytes, std::span<const StateSequence> batch,
                         bool final_state_only) {
  std::int64_t tokens = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const StateSequence& s = batch[i];
    if (s.num_tokens < 1) {
      throw_invalid(fmt::format("{}: request {} has {} tokens; give at least one", where(layer), i,
                                s.num_tokens));
    }
    const auto outs = static_cast<std::int64_t>(s.out_slots.size());
    if (outs != 1 && (outs != s.num_tokens || final_state_only)) {
      throw_invalid(fmt::format(
          "{}: request {} has {} out slots for {} tokens; give 1 (final state){}", where(layer), i,
          outs, s.num_tokens, final_state_only ? "" : " or one per token (checkpoints)"));
    }
    state_offset(place, layer, cache_bytes, s.in_slot);
    for (std::int64_t o : s.out_slots) state_offset(place, layer, cache_bytes, o);
    tokens = checked_add(tokens, s.num_tokens, "batch tokens");
  }
  return tokens;
}

void check_size(const layout::LayerGeometry& layer, std::string_view name, std::size_t got,
                std::int64_t want) {
  if (static_cast<std::int64_t>(got) != want) {
    throw_invalid(
        fmt::format("{}: {} has {} elements, expected {}", where(layer), name, got, want));
  }
}

// bf16 and float32 states (the usual ones) convert in vectorisable loops; bf16 rounds to nearest
// even exactly like float_to_bf16 (NaN kept quiet), which the tests check byte for byte. Other
// dtypes go through the conversion module.
constexpr std::size_t kConvertBlock = 256;

MIXKV_KERNEL_CLONES
void decode_state(DType dtype, const std::byte* bytes, std::size_t n, float* values) {
  if (dtype == DType::kFloat32) {
    std::memcpy(values, bytes, n * sizeof(float));
  } else if (dtype == DType::kBfloat16) {
    std::uint16_t bits[kConvertBlock];
    for (std::size_t i0 = 0; i0 < n; i0 += kConvertBlock) {
      const std::size_t m = std::min(kConvertBlock, n - i0);
      std::memcpy(bits, bytes + 2 * i0, 2 * m);
      for (std::size_t i = 0; i < m; ++i) {
        values[i0 + i] = std::bit_cast<float>(static_cast<std::uint32_t>(bits[i]) << 16);
      }
    }
  } else {
    decode_row_unchecked(dtype, bytes, n, 1.0f, values);
  }
}

MIXKV_KERNEL_CLONES
void encode_state(DType dtype, const float* values, std::size_t n, std::byte* bytes) {
  if (dtype == DType::kFloat32) {
    std::memcpy(bytes, values, n * sizeof(float));
  } else if (dtype == DType::kBfloat16) {
    std::uint16_t bits[kConvertBlock];
    for (std::size_t i0 = 0; i0 < n; i0 += kConvertBlock) {
      const std::size_t m = std::min(kConvertBlock, n - i0);
      for (std::size_t i = 0; i < m; ++i) {
        const std::uint32_t u = std::bit_cast<std::uint32_t>(values[i0 + i]);
        const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
        bits[i] = static_cast<std::uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
      }
      std::memcpy(bytes + 2 * i0, bits, 2 * m);
    }
  } else {
    encode_row(dtype, std::span<const float>(values, n), 1.0f,
               std::span<std::byte>(bytes, static_cast<std::size_t>(storage_bytes(
                                               dtype, static_cast<std::int64_t>(n)))));
  }
}

void load(const StateTensorPlace& place, const layout::LayerGeometry& layer,
          std::span<const std::byte> cache, std::int64_t slot, float* values) {
  const std::int64_t at = state_offset(place, layer, cache.size(), slot);
  decode_state(place.dtype, cache.data() + at, static_cast<std::size_t>(place.elements), values);
}

void store(const StateTensorPlace& place, const layout::LayerGeometry& layer,
           std::span<std::byte> cache, std::int64_t slot, const float* values) {
  const std::int64_t at = state_offset(place, layer, cache.size(), slot);
  encode_state(place.dtype, values, static_cast<std::size_t>(place.elements), cache.data() + at);
}

// Stores the state after token t of `s` when the request wants it.
void store_after(const StateTensorPlace& place, const layout::LayerGeometry& layer,
                 std::span<std::byte> cache, const StateSequence& s, std::int64_t t,
                 const float* values) {
  if (s.out_slots.size() == 1) {
    if (t == s.num_tokens - 1) store(place, layer, cache, s.out_slots[0], values);
  } else {
    store(place, layer, cache, s.out_slots[static_cast<std::size_t>(t)], values);
  }
}

// log(1 + e^x); past 20 the correction is below float resolution (PyTorch's threshold).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// GDN's and KDA's spec (`kind` names which in the message).
void check_delta_rule(const GdnSpec& spec, const layout::LayerGeometry& layer,
                      std::string_view kind) {
  if (spec.num_k_heads < 1 || spec.num_v_heads < 1 || spec.k_dim < 1 || spec.v_dim < 1 ||
      spec.num_v_heads % spec.num_k_heads != 0) {
    throw_invalid(fmt::format(
        "{}: {} heads k{}/v{} of {}x{} do not make a state; value heads must be a multiple of "
        "key heads",
        where(layer), kind, spec.num_k_heads, spec.num_v_heads, spec.k_dim, spec.v_dim));
  }
  check_size(layer, fmt::format("the {} spec's state", kind),
             static_cast<std::size_t>(spec.place.elements),
             spec.num_v_heads * spec.k_dim * spec.v_dim);
}

void check_gdn_inputs(const GdnSpec& spec, const layout::LayerGeometry& layer, const GdnInputs& in,
                      std::int64_t tokens, std::size_t out) {
  check_size(layer, "q", in.q.size(), tokens * spec.num_k_heads * spec.k_dim);
  check_size(layer, "k", in.k.size(), tokens * spec.num_k_heads * spec.k_dim);
  check_size(layer, "v", in.v.size(), tokens * spec.num_v_heads * spec.v_dim);
  check_size(layer, "g", in.g.size(), tokens * spec.num_v_heads);
  check_size(layer, "beta", in.beta.size(), tokens * spec.num_v_heads);
  check_size(layer, "out", out, tokens * spec.num_v_heads * spec.v_dim);
}

void check_kda_inputs(const KdaSpec& spec, const layout::LayerGeometry& layer, const KdaInputs& in,
                      std::int64_t tokens, std::size_t out) {
  check_size(layer, "q", in.q.size(), tokens * spec.num_k_heads * spec.k_dim);
  check_size(layer, "k", in.k.size(), tokens * spec.num_k_heads * spec.k_dim);
  check_size(layer, "v", in.v.size(), tokens * spec.num_v_heads * spec.v_dim);
  check_size(layer, "g (one log decay per key channel)", in.g.size(),
             tokens * spec.num_v_heads * spec.k_dim);
  check_size(layer, "beta", in.beta.size(), tokens * spec.num_v_heads);
  check_size(layer, "out", out, tokens * spec.num_v_heads * spec.v_dim);
}

void check_chunk(const layout::LayerGeometry& layer, std::int64_t chunk) {
  if (chunk < 1 || chunk > 1024) {
    throw_invalid(fmt::format("{}: chunk size {} is out of range; use 1 to 1024 (64 is usual)",
                              where(layer), chunk));
  }
}

MIXKV_KERNEL_CLONES
void conv_loops(const ConvSpec& spec, const layout::LayerGeometry& layer,
                std::span<std::byte> cache, std::span<const StateSequence> batch,
                const ConvInputs& in, std::span<float> out) {
  const std::int64_t c_n = spec.channels, k_n = spec.kernel, rows = spec.rows;
  // Weights transposed to [kernel][channels] so the inner loop runs over contiguous channels.
  std::vector<float> w(static_cast<std::size_t>(k_n * c_n));
  for (std::int64_t c = 0; c < c_n; ++c) {
    for (std::int64_t j = 0; j < k_n; ++j) w[j * c_n + c] = in.weight[c * k_n + j];
  }
  std::vector<float> stream;  // [rows + num_tokens][channels]: the state, then the new inputs
  std::int64_t row0 = 0;
  for (const StateSequence& s : batch) {
    const std::int64_t n = s.num_tokens;
    stream.resize(static_cast<std::size_t>((rows + n) * c_n));
    load(spec.place, layer, cache, s.in_slot, stream.data());
    std::copy_n(in.x.data() + row0 * c_n, n * c_n, stream.data() + rows * c_n);
    for (std::int64_t t = 0; t < n; ++t) {
      float* o = out.data() + (row0 + t) * c_n;
      for (std::int64_t c = 0; c < c_n; ++c) o[c] = in.bias.empty() ? 0.0f : in.bias[c];
      // Input row of tap j for token t: rows + t - (kernel - 1) + j.
      const float* first = stream.data() + (rows + t - (k_n - 1)) * c_n;
      for (std::int64_t j = 0; j < k_n; ++j) {
        const float* x = first + j * c_n;
        const float* wj = w.data() + j * c_n;
        for (std::int64_t c = 0; c < c_n; ++c) o[c] += wj[c] * x[c];
      }
      if (spec.silu) {
        for (std::int64_t c = 0; c < c_n; ++c) o[c] = silu(o[c]);
      }
      // The state after token t: the `rows` inputs ending with it.
      store_after(spec.place, layer, cache, s, t, stream.data() + (t + 1) * c_n);
    }
    row0 += n;
  }
}

// The gated delta rule per token and value head, for GDN (one decay per head: `g` holds one
// log decay per token and head) and KDA (one per key channel: k_dim of them). Inlined into each
// kernel's clones; GDN's arithmetic is the same whichever form it runs through.
template <bool kPerChannel>
[[gnu::always_inline]] inline void delta_rule_step(
    const GdnSpec& spec, const layout::LayerGeometry& layer, std::span<std::byte> cache,
    std::span<const StateSequence> batch, const float* q_in, const float* k_in, const float* v_in,
    const float* g_in, const float* beta_in, std::span<float> out) {
  const std::int64_t hv = spec.num_v_heads, hk = spec.num_k_heads, dk = spec.k_dim, dv = spec.v_dim;
  const std::int64_t per_k = hv / hk;
  const std::int64_t gates = kPerChannel ? dk : 1;
  std::vector<float> state(static_cast<std::size_t>(spec.place.elements));
  std::vector<float> sk(static_cast<std::size_t>(dv)), qs(static_cast<std::size_t>(dk));
  std::vector<float> decay(static_cast<std::size_t>(gates));
  std::int64_t row0 = 0;
  for (const StateSequence& s : batch) {
    load(spec.place, layer, cache, s.in_slot, state.data());
    for (std::int64_t t = 0; t < s.num_tokens; ++t) {
      const std::int64_t row = row0 + t;
      for (std::int64_t h = 0; h < hv; ++h) {
        float* st = state.data() + h * dk * dv;
        const float* q = q_in + (row * hk + h / per_k) * dk;
        const float* k = k_in + (row * hk + h / per_k) * dk;
        const float* v = v_in + (row * hv + h) * dv;
        const float* g = g_in + (row * hv + h) * gates;
        for (std::int64_t i = 0; i < gates; ++i) decay[i] = std::exp(g[i]);
        const float beta = beta_in[row * hv + h];
        float* o = out.data() + (row * hv + h) * dv;
        // Pass 1: decay the state and read S^T k. Pass 2: rank-1 update and read S^T q. (Blocks
        // of columns kept in L1 across both passes measured slower: the inner loops get short.)
        for (std::int64_t i = 0; i < dk; ++i) qs[i] = q[i] * spec.scale;
        std::fill(sk.begin(), sk.end(), 0.0f);
        for (std::int64_t i = 0; i < dk; ++i) {
          float* si = st + i * dv;
          const float ki = k[i];
          const float di = decay[kPerChannel ? i : 0];
          for (std::int64_t j = 0; j < dv; ++j) {
            si[j] *= di;
            sk[j] += si[j] * ki;
          }
        }
        for (std::int64_t j = 0; j < dv; ++j) sk[j] = beta * (v[j] - sk[j]);  // u
        std::fill(o, o + dv, 0.0f);
        for (std::int64_t i = 0; i < dk; ++i) {
          float* si = st + i * dv;
          const float ki = k[i], qi = qs[i];
          for (std::int64_t j = 0; j < dv; ++j) {
            si[j] += ki * sk[j];
            o[j] += si[j] * qi;
          }
        }
      }
      store_after(spec.place, layer, cache, s, t, state.data());
    }
    row0 += s.num_tokens;
  }
}

MIXKV_KERNEL_CLONES
void gdn_step_loops(const GdnSpec& spec, const layout::LayerGeometry& layer,
                    std::span<std::byte> cache, std::span<const StateSequence> batch,
                    const GdnInputs& in, std::span<float> out) {
  delta_rule_step<false>(spec, layer, cache, batch, in.q.data(), in.k.data(), in.v.data(),
                         in.g.data(), in.beta.data(), out);
}

MIXKV_KERNEL_CLONES
void kda_step_loops(const KdaSpec& spec, const layout::LayerGeometry& layer,
                    std::span<std::byte> cache, std::span<const StateSequence> batch,
                    const KdaInputs& in, std::span<float> out) {
  delta_rule_step<true>(spec, layer, cache, batch, in.q.data(), in.k.data(), in.v.data(),
                        in.g.data(), in.beta.data(), out);
}

// Pieces of the chunked delta rule that GDN and KDA share. Every inner loop runs over contiguous
// floats without a reduction, so it vectorises without reassociating sums; chunk-major buffers
// ([k_dim][chunk]) hold a chunk's keys (and queries) transposed for that.

// U = K S0 and SQ = Q S0 for the chunk's `len` rows, one state row at a time (it stays in L1).
// kt, qt: [k_dim][chunk]; u, sq: [len][v_dim], overwritten.
[[gnu::always_inline]] inline void state_products(const float* st, std::int64_t dk, std::int64_t dv,
                                                  const float* kt, const float* qt,
                                                  std::int64_t chunk, std::int64_t len, float* u,
                                                  float* sq) {
  std::fill_n(u, len * dv, 0.0f);
  std::fill_n(sq, len * dv, 0.0f);
  for (std::int64_t i = 0; i < dk; ++i) {
    const float* si = st + i * dv;
    for (std::int64_t t = 0; t < len; ++t) {
      const float ki = kt[i * chunk + t], qi = qt[i * chunk + t];
      float* ut = u + t * dv;
      float* sqt = sq + t * dv;
      for (std::int64_t j = 0; j < dv; ++j) {
        ut[j] += ki * si[j];
        sqt[j] += qi * si[j];
      }
    }
  }
}

// U = (I + A)^{-1} U by forward substitution (the UT transform's solve); A strictly lower
// triangular, rows of `chunk`.
[[gnu::always_inline]] inline void forward_substitute(const float* a, std::int64_t chunk,
                                                      std::int64_t len, float* u, std::int64_t dv) {
  for (std::int64_t t = 1; t < len; ++t) {
    float* ut = u + t * dv;
    for (std::int64_t s2 = 0; s2 < t; ++s2) {
      const float ats = a[t * chunk + s2];
      const float* us = u + s2 * dv;
      for (std::int64_t j = 0; j < dv; ++j) ut[j] -= ats * us[j];
    }
  }
}

// o_t += sum_{s <= t} w_ts u_s; output rows `o_stride` floats apart.
[[gnu::always_inline]] inline void add_lower_products(const float* w, std::int64_t chunk,
                                                      std::int64_t len, const float* u,
                                                      std::int64_t dv, float* o,
                                                      std::int64_t o_stride) {
  for (std::int64_t t = 0; t < len; ++t) {
    float* ot = o + t * o_stride;
    for (std::int64_t s2 = 0; s2 <= t; ++s2) {
      const float wts = w[t * chunk + s2];
      const float* us = u + s2 * dv;
      for (std::int64_t j = 0; j < dv; ++j) ot[j] += wts * us[j];
    }
  }
}

// The state at the chunk's end: S = diag(row_decay) S + sum_t kw[:, t] u_t^T, kw: [k_dim][chunk]
// (the keys with their decay to the chunk's end folded in).
[[gnu::always_inline]] inline void update_state(float* st, std::int64_t dk, std::int64_t dv,
                                                const float* row_decay, const float* kw,
                                                std::int64_t chunk, std::int64_t len,
                                                const float* u) {
  for (std::int64_t i = 0; i < dk; ++i) {
    float* si = st + i * dv;
    const float d = row_decay[i];
    for (std::int64_t j = 0; j < dv; ++j) si[j] *= d;
    for (std::int64_t t = 0; t < len; ++t) {
      const float ki = kw[i * chunk + t];
      const float* ut = u + t * dv;
      for (std::int64_t j = 0; j < dv; ++j) si[j] += ki * ut[j];
    }
  }
}

// Within a chunk of L tokens from state S0, with G_t the running sum of g (Gamma_t = e^G_t):
//   S_t = Gamma_t S0 + sum_{s<=t} (Gamma_t / Gamma_s) k_s u_s^T,
//   u_t = beta_t (v_t - Gamma_t S0^T k_t - sum_{s<t} (Gamma_t / Gamma_s) (k_s . k_t) u_s),
// i.e. (I + A) U = diag(beta) (V - diag(Gamma) K S0) with A strictly lower triangular
// (A_ts = beta_t e^{G_t - G_s} k_t . k_s), solved by forward substitution (the UT transform);
//   o_t = Gamma_t S0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s,
//   S_L = Gamma_L S0 + sum_s e^{G_L - G_s} k_s u_s^T.
// The state is touched three times per chunk (K S0, Q S0, the update) instead of twice per token.
MIXKV_KERNEL_CLONES
void gdn_chunked_loops(const GdnSpec& spec, const layout::LayerGeometry& layer,
                       std::span<std::byte> cache, std::span<const StateSequence> batch,
                       const GdnInputs& in, std::int64_t chunk, std::span<float> out) {
  const std::int64_t hv = spec.num_v_heads, hk = spec.num_k_heads, dk = spec.k_dim, dv = spec.v_dim;
  const std::int64_t per_k = hv / hk;
  const auto sz = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  std::vector<float> state(sz(spec.place.elements));
  std::vector<float> cum(sz(chunk)), gamma_rows(sz(dk));
  std::vector<float> a(sz(chunk * chunk)), qk(sz(chunk * chunk));
  std::vector<float> u(sz(chunk * dv)), sq(sz(chunk * dv));
  std::vector<float> k_t(sz(dk * chunk)), q_t(sz(dk * chunk)), kw(sz(dk * chunk));
  std::int64_t row0 = 0;
  for (const StateSequence& s : batch) {
    load(spec.place, layer, cache, s.in_slot, state.data());
    for (std::int64_t h = 0; h < hv; ++h) {
      float* st = state.data() + h * dk * dv;
      const std::int64_t kh = h / per_k;
      auto q_of = [&](std::int64_t r) { return in.q.data() + (r * hk + kh) * dk; };
      auto k_of = [&](std::int64_t r) { return in.k.data() + (r * hk + kh) * dk; };
      for (std::int64_t c0 = 0; c0 < s.num_tokens; c0 += chunk) {
        const std::int64_t len = std::min(chunk, s.num_tokens - c0);
        const std::int64_t r0 = row0 + c0;
        float g = 0;
        for (std::int64_t t = 0; t < len; ++t) cum[t] = g += in.g[(r0 + t) * hv + h];
        for (std::int64_t t = 0; t < len; ++t) {
          const float* kt = k_of(r0 + t);
          const float* qt = q_of(r0 + t);
          for (std::int64_t i = 0; i < dk; ++i) {
            k_t[i * chunk + t] = kt[i];
            q_t[i * chunk + t] = qt[i];
          }
        }
        // Gram matrices within the chunk, lower triangle: k_t . k_s and q_t . k_s, then gated.
        std::fill_n(a.begin(), len * chunk, 0.0f);
        std::fill_n(qk.begin(), len * chunk, 0.0f);
        for (std::int64_t t = 0; t < len; ++t) {
          const float* kt = k_of(r0 + t);
          const float* qt = q_of(r0 + t);
          float* at = a.data() + t * chunk;
          float* qkt = qk.data() + t * chunk;
          for (std::int64_t i = 0; i < dk; ++i) {
            const float* col = k_t.data() + i * chunk;
            const float ki = kt[i], qi = qt[i];
            for (std::int64_t s2 = 0; s2 <= t; ++s2) {
              at[s2] += ki * col[s2];
              qkt[s2] += qi * col[s2];
            }
          }
          const float beta = in.beta[(r0 + t) * hv + h];
          for (std::int64_t s2 = 0; s2 <= t; ++s2) {
            const float e = std::exp(cum[t] - cum[s2]);
            at[s2] *= beta * e;
            qkt[s2] *= spec.scale * e;
          }
        }
        state_products(st, dk, dv, k_t.data(), q_t.data(), chunk, len, u.data(), sq.data());
        // Right-hand side, then U = (I + A)^{-1} R.
        for (std::int64_t t = 0; t < len; ++t) {
          const float* v = in.v.data() + ((r0 + t) * hv + h) * dv;
          const float gamma = std::exp(cum[t]);
          const float beta = in.beta[(r0 + t) * hv + h];
          float* ut = u.data() + t * dv;
          for (std::int64_t j = 0; j < dv; ++j) ut[j] = beta * (v[j] - gamma * ut[j]);
        }
        forward_substitute(a.data(), chunk, len, u.data(), dv);
        // Outputs.
        float* o = out.data() + (r0 * hv + h) * dv;
        for (std::int64_t t = 0; t < len; ++t) {
          const float gamma = std::exp(cum[t]) * spec.scale;
          const float* sqt = sq.data() + t * dv;
          float* ot = o + t * hv * dv;
          for (std::int64_t j = 0; j < dv; ++j) ot[j] = gamma * sqt[j];
        }
        add_lower_products(qk.data(), chunk, len, u.data(), dv, o, hv * dv);
        // The state at the chunk's end.
        const float last = cum[len - 1];
        std::fill(gamma_rows.begin(), gamma_rows.end(), std::exp(last));
        for (std::int64_t t = 0; t < len; ++t) {
          const float to_end = std::exp(last - cum[t]);
          for (std::int64_t i = 0; i < dk; ++i) kw[i * chunk + t] = to_end * k_t[i * chunk + t];
        }
        update_state(st, dk, dv, gamma_rows.data(), kw.data(), chunk, len, u.data());
      }
    }
    store(spec.place, layer, cache, s.out_slots[0], state.data());
    row0 += s.num_tokens;
  }
}

// KDA's chunk: the same solve with a decay per key channel, so every gated product is a sum over
// channels, A_ts = beta_t sum_i k_t[i] k_s[i] e^{G_t[i] - G_s[i]} (likewise q_t . k_s), and
// Gamma_t is the vector e^{G_t}. GDN's factored form e^{G_t} e^{-G_s} overflows once a channel
// has decayed by more than e^-88 within the chunk (Kimi Linear's gate, -exp(A_log) softplus(x), has
// no lower bound), so the keys are carried instead: W[:, s] = k_s decayed to the current token,
// multiplied by e^{g_t} as each token t comes (every factor <= 1; an underflow to 0 is the true
// value's rounding). Row t of A and of Q.K are then plain products with W, and after the chunk's
// last token W holds the keys decayed to its end, which the state update takes. One exp per channel
// and token, as in the step.
MIXKV_KERNEL_CLONES
void kda_chunked_loops(const KdaSpec& spec, const layout::LayerGeometry& layer,
                       std::span<std::byte> cache, std::span<const StateSequence> batch,
                       const KdaInputs& in, std::int64_t chunk, std::span<float> out) {
  const std::int64_t hv = spec.num_v_heads, hk = spec.num_k_heads, dk = spec.k_dim, dv = spec.v_dim;
  const std::int64_t per_k = hv / hk;
  const auto sz = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  std::vector<float> state(sz(spec.place.elements));
  std::vector<float> decay(sz(dk)), gamma(sz(dk));
  std::vector<float> a(sz(chunk * chunk)), qk(sz(chunk * chunk));
  std::vector<float> u(sz(chunk * dv)), sq(sz(chunk * dv));
  std::vector<float> w(sz(dk * chunk)), k_g(sz(dk * chunk)), q_g(sz(dk * chunk));
  std::int64_t row0 = 0;
  for (const StateSequence& s : batch) {
    load(spec.place, layer, cache, s.in_slot, state.data());
    for (std::int64_t h = 0; h < hv; ++h) {
      float* st = state.data() + h * dk * dv;
      const std::int64_t kh = h / per_k;
      for (std::int64_t c0 = 0; c0 < s.num_tokens; c0 += chunk) {
        const std::int64_t len = std::min(chunk, s.num_tokens - c0);
        const std::int64_t r0 = row0 + c0;
        std::fill(gamma.begin(), gamma.end(), 1.0f);
        for (std::int64_t t = 0; t < len; ++t) {
          const float* g = in.g.data() + ((r0 + t) * hv + h) * dk;
          const float* kt = in.k.data() + ((r0 + t) * hk + kh) * dk;
          const float* qt = in.q.data() + ((r0 + t) * hk + kh) * dk;
          for (std::int64_t i = 0; i < dk; ++i) decay[i] = std::exp(g[i]);
          float* at = a.data() + t * chunk;
          float* qkt = qk.data() + t * chunk;
          std::fill_n(at, t + 1, 0.0f);
          std::fill_n(qkt, t + 1, 0.0f);
          for (std::int64_t i = 0; i < dk; ++i) {
            float* wi = w.data() + i * chunk;
            const float di = decay[i], ki = kt[i], qi = qt[i];
            for (std::int64_t s2 = 0; s2 < t; ++s2) {
              const float ws = wi[s2] * di;
              wi[s2] = ws;
              at[s2] += ki * ws;
              qkt[s2] += qi * ws;
            }
            wi[t] = ki;
            qkt[t] += qi * ki;
            gamma[i] *= di;
            k_g[i * chunk + t] = gamma[i] * ki;
            q_g[i * chunk + t] = gamma[i] * spec.scale * qi;
          }
          const float beta = in.beta[(r0 + t) * hv + h];
          for (std::int64_t s2 = 0; s2 < t; ++s2) at[s2] *= beta;
          for (std::int64_t s2 = 0; s2 <= t; ++s2) qkt[s2] *= spec.scale;
        }
        state_products(st, dk, dv, k_g.data(), q_g.data(), chunk, len, u.data(), sq.data());
        for (std::int64_t t = 0; t < len; ++t) {
          const float* v = in.v.data() + ((r0 + t) * hv + h) * dv;
          const float beta = in.beta[(r0 + t) * hv + h];
          float* ut = u.data() + t * dv;
          for (std::int64_t j = 0; j < dv; ++j) ut[j] = beta * (v[j] - ut[j]);
        }
        forward_substitute(a.data(), chunk, len, u.data(), dv);
        float* o = out.data() + (r0 * hv + h) * dv;
        for (std::int64_t t = 0; t < len; ++t) {
          std::copy_n(sq.data() + t * dv, dv, o + t * hv * dv);
        }
        add_lower_products(qk.data(), chunk, len, u.data(), dv, o, hv * dv);
        update_state(st, dk, dv, gamma.data(), w.data(), chunk, len, u.data());
      }
    }
    store(spec.place, layer, cache, s.out_slots[0], state.data());
    row0 += s.num_tokens;
  }
}

MIXKV_KERNEL_CLONES
void mamba2_loops(const Mamba2Spec& spec, const layout::LayerGeometry& layer,
                  std::span<std::byte> cache, std::span<const StateSequence> batch,
                  const Mamba2Inputs& in, std::span<float> out) {
  const std::int64_t nh = spec.heads, p_n = spec.head_dim, n_n = spec.state_size,
                     groups = spec.groups;
  const std::int64_t per_group = nh / groups;
  std::vector<float> state(static_cast<std::size_t>(spec.place.elements));
  std::int64_t row0 = 0;
  for (const StateSequence& s : batch) {
    load(spec.place, layer, cache, s.in_slot, state.data());
    for (std::int64_t t = 0; t < s.num_tokens; ++t) {
      const std::int64_t row = row0 + t;
      for (std::int64_t h = 0; h < nh; ++h) {
        const float dt = softplus(in.dt[row * nh + h] + in.dt_bias[h]);
        const float da = std::exp(dt * in.a[h]);
        const float* b = in.b.data() + (row * groups + h / per_group) * n_n;
        const float* c = in.c.data() + (row * groups + h / per_group) * n_n;
        const float* x = in.x.data() + (row * nh + h) * p_n;
        float* y = out.data() + (row * nh + h) * p_n;
        for (std::int64_t p = 0; p < p_n; ++p) {
          float* sp = state.data() + (h * p_n + p) * n_n;
          const float dx = dt * x[p];
          // The sum over the state runs in kLanes interleaved partial sums (a fixed order, so
          // still deterministic) that the compiler can keep in one vector register.
          float lanes[kLanes] = {};
          std::int64_t n = 0;
          for (; n + kLanes <= n_n; n += kLanes) {
            for (std::int64_t l = 0; l < kLanes; ++l) {
              sp[n + l] = da * sp[n + l] + dx * b[n + l];
              lanes[l] += c[n + l] * sp[n + l];
            }
          }
          for (; n < n_n; ++n) {
            sp[n] = da * sp[n] + dx * b[n];
            lanes[0] += c[n] * sp[n];
          }
          float acc = 0;
          for (float l : lanes) acc += l;
          y[p] = acc + in.d[h] * x[p];
        }
      }
      store_after(spec.place, layer, cache, s, t, state.data());
    }
    row0 += s.num_tokens;
  }
}

}  // namespace

GdnLayerSpec gdn_layer_spec(const model::LayerDesc& layer, int num_spec_tokens) {
  require(layer.kind == model::LayerKind::kGdn, layer, "is not a Gated DeltaNet layer");
  const std::vector<StateTensorPlace> placed = places(layer);
  GdnLayerSpec s;
  s.conv = conv_spec(layer, num_spec_tokens, placed);
  std::size_t i = 0;
  const model::StateTensor& t = tensor_named(layer, "temporal", 3, &i);
  s.gdn.num_v_heads = t.shape[0];
  s.gdn.k_dim = t.shape[1];
  s.gdn.v_dim = t.shape[2];
  s.gdn.num_k_heads = layer.num_q_heads;
  // Qwen3-Next's layer leaves the scale to the kernel, whose default is k_dim^-1/2
  // (flash-linear-attention's chunk_gated_delta_rule).
  s.gdn.scale = 1.0f / std::sqrt(static_cast<float>(s.gdn.k_dim));
  s.gdn.place = placed[i];
  require(layer.num_kv_heads == s.gdn.num_v_heads && layer.num_q_heads > 0 &&
              s.gdn.num_v_heads % layer.num_q_heads == 0,
          layer,
          fmt::format("temporal state has {} value heads, but the layer has {} key / {} value "
                      "heads; value heads must match and be a multiple of key heads",
                      s.gdn.num_v_heads, layer.num_q_heads, layer.num_kv_heads));
  require(
      s.conv.channels == 2 * s.gdn.num_k_heads * s.gdn.k_dim + s.gdn.num_v_heads * s.gdn.v_dim,
      layer,
      fmt::format("conv state has {} channels, expected q, k and v: 2 x {} x {} + {} x {}",
                  s.conv.channels, s.gdn.num_k_heads, s.gdn.k_dim, s.gdn.num_v_heads, s.gdn.v_dim));
  return s;
}

KdaLayerSpec kda_layer_spec(const model::LayerDesc& layer, int num_spec_tokens) {
  require(layer.kind == model::LayerKind::kKda, layer, "is not a Kimi Delta Attention layer");
  const std::vector<StateTensorPlace> placed = places(layer);
  KdaLayerSpec s;
  s.q_conv = conv_spec(layer, num_spec_tokens, placed, "q_conv");
  s.k_conv = conv_spec(layer, num_spec_tokens, placed, "k_conv");
  s.v_conv = conv_spec(layer, num_spec_tokens, placed, "v_conv");
  std::size_t i = 0;
  const model::StateTensor& t = tensor_named(layer, "recurrent", 3, &i);
  s.kda.num_v_heads = t.shape[0];
  s.kda.k_dim = t.shape[1];
  s.kda.v_dim = t.shape[2];
  s.kda.num_k_heads = layer.num_q_heads;
  // Kimi Linear's layer passes no scale, so the kernel's default k_dim^-1/2 applies
  // (flash-linear-attention's chunk_kda).
  s.kda.scale = 1.0f / std::sqrt(static_cast<float>(s.kda.k_dim));
  s.kda.place = placed[i];
  require(layer.num_kv_heads == s.kda.num_v_heads && layer.num_q_heads > 0 &&
              s.kda.num_v_heads % layer.num_q_heads == 0,
          layer,
          fmt::format("recurrent state has {} value heads, but the layer has {} key / {} value "
                      "heads; value heads must match and be a multiple of key heads",
                      s.kda.num_v_heads, layer.num_q_heads, layer.num_kv_heads));
  const std::int64_t qk = s.kda.num_k_heads * s.kda.k_dim, v = s.kda.num_v_heads * s.kda.v_dim;
  require(s.q_conv.channels == qk && s.k_conv.channels == qk && s.v_conv.channels == v &&
              s.q_conv.kernel == s.k_conv.kernel && s.q_conv.kernel == s.v_conv.kernel,
          layer,
          fmt::format("conv states of {}/{}/{} channels (width {}/{}/{}) do not match {} x {} "
                      "queries and keys and {} x {} values of one width",
                      s.q_conv.channels, s.k_conv.channels, s.v_conv.channels, s.q_conv.kernel,
                      s.k_conv.kernel, s.v_conv.kernel, s.kda.num_k_heads, s.kda.k_dim,
                      s.kda.num_v_heads, s.kda.v_dim));
  return s;
}

Mamba2LayerSpec mamba2_layer_spec(const model::LayerDesc& layer, int num_spec_tokens) {
  require(layer.kind == model::LayerKind::kMamba2, layer, "is not a Mamba2 layer");
  const std::vector<StateTensorPlace> placed = places(layer);
  Mamba2LayerSpec s;
  s.conv = conv_spec(layer, num_spec_tokens, placed);
  std::size_t i = 0;
  const model::StateTensor& t = tensor_named(layer, "ssm", 3, &i);
  s.ssm.heads = t.shape[0];
  s.ssm.head_dim = t.shape[1];
  s.ssm.state_size = t.shape[2];
  s.ssm.place = placed[i];
  // The conv runs over x (heads x head_dim) and B, C (groups x state_size each).
  const std::int64_t bc = s.conv.channels - s.ssm.heads * s.ssm.head_dim;
  require(s.ssm.state_size > 0 && bc > 0 && bc % (2 * s.ssm.state_size) == 0, layer,
          fmt::format("conv state has {} channels, expected {} x {} plus B and C groups of {}",
                      s.conv.channels, s.ssm.heads, s.ssm.head_dim, s.ssm.state_size));
  s.ssm.groups = bc / (2 * s.ssm.state_size);
  require(s.ssm.heads % s.ssm.groups == 0, layer,
          fmt::format("{} heads do not split into {} B/C groups", s.ssm.heads, s.ssm.groups));
  return s;
}

std::vector<float> read_state(const StateTensorPlace& place, const layout::LayerGeometry& layer,
                              std::span<const std::byte> cache, std::int64_t slot) {
  check_cache_dtype(place.dtype, where(layer));
  std::vector<float> out(static_cast<std::size_t>(place.elements));
  load(place, layer, cache, slot, out.data());
  return out;
}

void write_state(const StateTensorPlace& place, const layout::LayerGeometry& layer,
                 std::span<std::byte> cache, std::int64_t slot, std::span<const float> values) {
  check_cache_dtype(place.dtype, where(layer));
  check_size(layer, "state values", values.size(), place.elements);
  store(place, layer, cache, slot, values.data());
}

void conv_update(const ConvSpec& spec, const layout::LayerGeometry& layer,
                 std::span<std::byte> cache, std::span<const StateSequence> batch,
                 const ConvInputs& in, std::span<float> out) {
  check_cache_dtype(spec.place.dtype, where(layer));
  if (spec.kernel < 1 || spec.channels < 1 || spec.rows < spec.kernel - 1) {
    throw_invalid(fmt::format("{}: conv state of {} rows cannot feed a width-{} kernel",
                              where(layer), spec.rows, spec.kernel));
  }
  check_size(layer, "the conv spec's state", static_cast<std::size_t>(spec.place.elements),
             spec.rows * spec.channels);
  const std::int64_t tokens = check_batch(spec.place, layer, cache.size(), batch, false);
  const std::int64_t c_n = spec.channels, k_n = spec.kernel;
  check_size(layer, "conv x", in.x.size(), tokens * c_n);
  check_size(layer, "conv weight", in.weight.size(), c_n * k_n);
  if (!in.bias.empty()) check_size(layer, "conv bias", in.bias.size(), c_n);
  check_size(layer, "conv out", out.size(), tokens * c_n);

  conv_loops(spec, layer, cache, batch, in, out);
}

void gdn_step(const GdnSpec& spec, const layout::LayerGeometry& layer, std::span<std::byte> cache,
              std::span<const StateSequence> batch, const GdnInputs& in, std::span<float> out) {
  check_cache_dtype(spec.place.dtype, where(layer));
  check_delta_rule(spec, layer, "GDN");
  const std::int64_t tokens = check_batch(spec.place, layer, cache.size(), batch, false);
  check_gdn_inputs(spec, layer, in, tokens, out.size());
  gdn_step_loops(spec, layer, cache, batch, in, out);
}

void gdn_chunked_prefill(const GdnSpec& spec, const layout::LayerGeometry& layer,
                         std::span<std::byte> cache, std::span<const StateSequence> batch,
                         const GdnInputs& in, std::int64_t chunk, std::span<float> out) {
  check_cache_dtype(spec.place.dtype, where(layer));
  check_delta_rule(spec, layer, "GDN");
  check_chunk(layer, chunk);
  const std::int64_t tokens = check_batch(spec.place, layer, cache.size(), batch, true);
  check_gdn_inputs(spec, layer, in, tokens, out.size());
  gdn_chunked_loops(spec, layer, cache, batch, in, chunk, out);
}

void kda_step(const KdaSpec& spec, const layout::LayerGeometry& layer, std::span<std::byte> cache,
              std::span<const StateSequence> batch, const KdaInputs& in, std::span<float> out) {
  check_cache_dtype(spec.place.dtype, where(layer));
  check_delta_rule(spec, layer, "KDA");
  const std::int64_t tokens = check_batch(spec.place, layer, cache.size(), batch, false);
  check_kda_inputs(spec, layer, in, tokens, out.size());
  kda_step_loops(spec, layer, cache, batch, in, out);
}

void kda_chunked_prefill(const KdaSpec& spec, const layout::LayerGeometry& layer,
                         std::span<std::byte> cache, std::span<const StateSequence> batch,
                         const KdaInputs& in, std::int64_t chunk, std::span<float> out) {
  check_cache_dtype(spec.place.dtype, where(layer));
  check_delta_rule(spec, layer, "KDA");
  check_chunk(layer, chunk);
  const std::int64_t tokens = check_batch(spec.place, layer, cache.size(), batch, true);
  check_kda_inputs(spec, layer, in, tokens, out.size());
  kda_chunked_loops(spec, layer, cache, batch, in, chunk, out);
}

void kda_gate(std::int64_t heads, std::int64_t k_dim, std::span<const float> raw,
              std::span<const float> a_log, std::span<const float> dt_bias, std::span<float> g) {
  const std::int64_t width = heads * k_dim;
  if (heads < 1 || k_dim < 1 || raw.size() % static_cast<std::size_t>(width) != 0 ||
      g.size() != raw.size() || a_log.size() != static_cast<std::size_t>(heads) ||
      (!dt_bias.empty() && dt_bias.size() != static_cast<std::size_t>(width))) {
    throw_invalid(fmt::format(
        "KDA gate: {} raw / {} out values, {} A_log and {} dt_bias values do not fit {} heads "
        "x {} channels per token",
        raw.size(), g.size(), a_log.size(), dt_bias.size(), heads, k_dim));
  }
  for (std::size_t r = 0; r < raw.size(); r += static_cast<std::size_t>(width)) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const float a = std::exp(a_log[static_cast<std::size_t>(h)]);
      for (std::int64_t i = 0; i < k_dim; ++i) {
        const std::size_t c = static_cast<std::size_t>(h * k_dim + i);
        const float x = raw[r + c] + (dt_bias.empty() ? 0.0f : dt_bias[c]);
        g[r + c] = -a * softplus(x);
      }
    }
  }
}

void mamba2_step(const Mamba2Spec& spec, const layout::LayerGeometry& layer,
                 std::span<std::byte> cache, std::span<const StateSequence> batch,
                 const Mamba2Inputs& in, std::span<float> out) {
  check_cache_dtype(spec.place.dtype, where(layer));
  const std::int64_t nh = spec.heads, p_n = spec.head_dim, n_n = spec.state_size,
                     groups = spec.groups;
  if (nh < 1 || p_n < 1 || n_n < 1 || groups < 1 || nh % groups != 0) {
    throw_invalid(fmt::format("{}: Mamba2 heads {} x {} (state {}) do not split into {} groups",
                              where(layer), nh, p_n, n_n, groups));
  }
  check_size(layer, "the Mamba2 spec's ssm state", static_cast<std::size_t>(spec.place.elements),
             nh * p_n * n_n);
  const std::int64_t tokens = check_batch(spec.place, layer, cache.size(), batch, false);
  check_size(layer, "x", in.x.size(), tokens * nh * p_n);
  check_size(layer, "dt", in.dt.size(), tokens * nh);
  check_size(layer, "B", in.b.size(), tokens * groups * n_n);
  check_size(layer, "C", in.c.size(), tokens * groups * n_n);
  check_size(layer, "A", in.a.size(), nh);
  check_size(layer, "D", in.d.size(), nh);
  check_size(layer, "dt_bias", in.dt_bias.size(), nh);
  check_size(layer, "out", out.size(), tokens * nh * p_n);
  mamba2_loops(spec, layer, cache, batch, in, out);
}

}  // namespace mixkv::kernels
