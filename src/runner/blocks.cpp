#include "runner/blocks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mixkv/core/error.hpp"
#include "mixkv/kernels/activation.hpp"
#include "mixkv/kernels/attention_ggml.hpp"
#include "runner/ops.hpp"

namespace mixkv::runner {
namespace {

std::span<std::byte> tensor_of(const Step& step, const layout::LayerGeometry& geo) {
  return step.tensors->at(static_cast<std::size_t>(geo.tensor));
}

// `buffer` resized to n rows of `width` (its old values stay where they are: every user
// overwrites all of it), as a span.
std::span<float> reuse(std::vector<float>& buffer, std::int64_t n, std::int64_t width) {
  buffer.resize(static_cast<std::size_t>(n * width));
  return buffer;
}

// Below these sizes a parallel region costs more than it saves (a region's hand-off and close
// take ~1-2 us): rows of the per-row norms and residuals (one 576-wide RMSNorm, its double sum
// one add after another, ~1 us).
constexpr std::int64_t kRowGrain = 2;
// Rows of an attention layer's q and K norms, RoPE and cache write (~0.6 us a SmolLM2 row).
constexpr std::int64_t kCacheRowGrain = 4;

}  // namespace

Attention::Attention(std::string name, kernels::AttentionSpec spec, layout::LayerGeometry geometry,
                     Weights w, Rope rope, double rope_theta, double eps, Numerics numerics)
    : name_(std::move(name)),
      spec_(spec),
      geometry_(std::move(geometry)),
      w_(std::move(w)),
      rope_(rope),
      rope_theta_(rope_theta),
      eps_(eps),
      numerics_(numerics) {}

ops::RopeMode Attention::rope_mode() const {
  if (rope_ == Rope::kHalves) return ops::RopeMode::kHalves;
  return numerics_ == Numerics::kGgml ? ops::RopeMode::kPairsGgml : ops::RopeMode::kPairs;
}

const float* Attention::rope_angles(std::span<const std::int64_t> positions,
                                    Scratch::RopeAngles& cache) const {
  if (rope_ == Rope::kNone) return nullptr;
  const ops::RopeMode mode = rope_mode();
  const std::int64_t d = spec_.head_size;
  if (cache.mode != mode || cache.d != d || cache.theta != rope_theta_ ||
      !std::ranges::equal(cache.positions, positions)) {
    cache.mode = mode;
    cache.d = d;
    cache.theta = rope_theta_;
    cache.positions.assign(positions.begin(), positions.end());
    cache.cs.resize(positions.size() * static_cast<std::size_t>(d));
    for (std::size_t t = 0; t < positions.size(); ++t) {
      ops::rope_angles(mode, d, positions[t], rope_theta_,
                       cache.cs.data() + t * static_cast<std::size_t>(d));
    }
  }
  return cache.cs.data();
}

void Attention::project_kv(std::span<const float> normed, std::span<const std::int64_t> positions,
                           kernels::ThreadPool* pool, std::vector<float>& k,
                           std::vector<float>& v) const {
  const auto total = static_cast<std::int64_t>(positions.size());
  k.resize(static_cast<std::size_t>(total * kernels::k_row_elements(spec_)));
  v.resize(static_cast<std::size_t>(total * kernels::v_row_elements(spec_)));
  ops::matmul_many({{&w_.k, k.data()}, {&w_.v, v.data()}}, normed.data(), total, pool);
  Scratch::RopeAngles angles;
  norm_and_rotate(k, spec_.params.num_kv_heads, w_.k_norm, rope_angles(positions, angles), 0,
                  total);
}

// The per-head norm (where the layer has one) and RoPE over rows [from, to) of q or K, `heads`
// heads a row. Each row is its own: no split of the rows touches its bits.
void Attention::norm_and_rotate(std::span<float> rows, std::int64_t heads,
                                const std::vector<float>& norm, const float* angles,
                                std::int64_t from, std::int64_t to) const {
  const std::int64_t d = spec_.head_size;
  for (std::int64_t t = from; t < to; ++t) {
    float* row = rows.data() + t * heads * d;
    if (!norm.empty()) ops::norm_heads(row, heads, d, norm, eps_);
    if (angles != nullptr) ops::rope_rotate(rope_mode(), row, heads, d, angles + t * d);
  }
}

// Each row's slot in the layer's cache, through its request's slot mapping.
void Attention::cache_slots(const Step& step, std::vector<std::int64_t>& slots) const {
  slots.clear();
  for (const SequenceInput& s : step.batch) {
    const std::vector<std::int64_t> blocks =
        ops::block_ids(s.block_tables.at(static_cast<std::size_t>(geometry_.kv_cache_group)));
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    const std::vector<std::int64_t> mine = kernels::slot_mapping(geometry_, blocks, s.start, n);
    slots.insert(slots.end(), mine.begin(), mine.end());
  }
}

// The batch's K/V rows into the layer's cache, in one kernel call (each call checks the layer
// and its pages once).
void Attention::write_kv(const Step& step, std::span<const float> k,
                         std::span<const float> v) const {
  std::vector<std::int64_t> slots;
  cache_slots(step, slots);
  kernels::write_kv(spec_, geometry_, {}, tensor_of(step, geometry_), slots, k, v);
}

void Attention::run(const Step& step, std::span<const float> normed, std::span<float> out) const {
  const std::int64_t total = step.rows();
  const std::int64_t hq = spec_.params.num_q_heads;
  const std::int64_t qw = hq * spec_.head_size;
  Scratch local;
  Scratch& scratch = step.scratch != nullptr ? *step.scratch : local;
  // q, k and v in one region over x quantised once.
  const std::span<float> q = reuse(scratch.q, total, qw);
  std::vector<float>& k = scratch.k;
  std::vector<float>& v = scratch.v;
  reuse(k, total, kernels::k_row_elements(spec_));
  reuse(v, total, kernels::v_row_elements(spec_));
  ops::matmul_many({{&w_.q, q.data()}, {&w_.k, k.data()}, {&w_.v, v.data()}}, normed.data(), total,
                   step.pool);
  // Per row: q's and K's norms and RoPE, then the row's K and V into the cache. Rows split across
  // the pool when there are enough of them (at 16 rows this stretch took ~10 us of a SmolLM2
  // layer on one thread while the other waited); each row's bits are its own.
  const float* angles = rope_angles(step.positions, scratch.rope);
  cache_slots(step, scratch.slots);
  const std::span<const std::int64_t> slots = scratch.slots;
  std::span<std::byte> tensor = tensor_of(step, geometry_);
  const std::int64_t kw = kernels::k_row_elements(spec_);
  const std::int64_t vw = kernels::v_row_elements(spec_);
  ops::for_chunks(step.pool, total, kCacheRowGrain, [&](std::int64_t from, std::int64_t to) {
    norm_and_rotate(q, hq, w_.q_norm, angles, from, to);
    norm_and_rotate(k, spec_.params.num_kv_heads, w_.k_norm, angles, from, to);
    const auto rows = static_cast<std::size_t>(to - from);
    const auto at = static_cast<std::size_t>(from);
    kernels::write_kv(spec_, geometry_, {}, tensor, slots.subspan(at, rows),
                      std::span<const float>(k).subspan(at * kw, rows * kw),
                      std::span<const float>(v).subspan(at * vw, rows * vw));
  });

  // The attention metadata of the layer's group: each request's rows are one kernel sequence
  // of n queries at positions [start, start + n), so a verify's or a prefill chunk's rows read
  // each K/V tile once. Causal, each row is bit-identical to its own one-query decode (the
  // kernel tiles a row's keys by its own position: docs/kernels.md, multi-row attention).
  // Non-causal (a DFlash block): every query sees all keys up to the block's end.
  std::vector<std::vector<std::int64_t>> pages;
  std::vector<kernels::PagedSequence>& seqs = scratch.seqs;
  seqs.clear();
  for (const SequenceInput& s : step.batch) {
    pages.push_back(layout::kernel_block_table(
        geometry_,
        ops::block_ids(s.block_tables.at(static_cast<std::size_t>(geometry_.kv_cache_group)))));
  }
  for (std::size_t r = 0; r < step.batch.size(); ++r) {
    const auto n = static_cast<std::int64_t>(step.batch[r].tokens.size());
    if (n > 0) seqs.push_back({pages[r], step.batch[r].start + n, n});
  }
  const std::int64_t ow = hq * spec_.head_size_v;
  const std::span<float> attn = reuse(scratch.attn, total, ow);
  const kernels::AttentionInputs inputs{tensor, seqs, q, w_.sinks, {}, step.pool};
  if (numerics_ == Numerics::kGgml) {
    kernels::ggml_attention(spec_, geometry_, inputs, attn);
  } else {
    kernels::paged_attention(spec_, geometry_, inputs, attn);
  }
  ops::matmul(w_.o, attn.data(), total, out.data(), step.pool);
}

void step_recurrent(const std::string& layer, const layout::LayerGeometry& geo, const Step& step,
                    const std::function<void(std::int64_t, const kernels::StateSequence&)>& fn) {
  std::span<std::byte> tensor = tensor_of(step, geo);
  const auto group = static_cast<std::size_t>(geo.kv_cache_group);
  // The layer's state in block b (its tensors are one contiguous run there: docs/kernels.md).
  auto state_of = [&](cache::BlockId b) {
    const std::int64_t at = geo.offset + std::int64_t{b.value()} * geo.kernel_page_stride;
    if (b.is_null() || at < 0 || at + geo.state_bytes > static_cast<std::int64_t>(tensor.size())) {
      throw_invalid(fmt::format("layer {}: state block {} is null or outside the cache tensor",
                                layer, b.value()));
    }
    return tensor.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(geo.state_bytes));
  };
  auto copy_state = [&](cache::BlockId from, cache::BlockId to) {
    const std::span<std::byte> src = state_of(from);
    std::memmove(state_of(to).data(), src.data(), src.size());
  };
  std::int64_t row = 0;
  for (std::size_t r = 0; r < step.batch.size(); ++r) {
    const SequenceInput& s = step.batch[r];
    const std::span<const cache::BlockId> table = s.block_tables.at(group);
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    const std::int64_t needed = s.checkpoints ? n : 1;
    if (n > 0 && (static_cast<std::int64_t>(table.size()) < needed || table[0].is_null())) {
      throw_invalid(fmt::format(
          "forward: request {} gives layer {} (KV-cache group {}) {} state blocks; {} tokens {} "
          "need {}",
          r, layer, group, table.size(), n, s.checkpoints ? "with checkpoints" : "of a prefill",
          needed));
    }
    cache::RecurrentStep snapshot;
    if (group < s.recurrent.size()) snapshot = s.recurrent[group];
    if (!snapshot.restore_from.is_null() && n > 0) copy_state(snapshot.restore_from, table[0]);
    if (s.start == 0 && n > 0) std::ranges::fill(state_of(table[0]), std::byte{0});
    const std::int64_t snap = snapshot.snapshot.is_null() ? 0 : snapshot.snapshot_at - s.start;
    for (std::int64_t i = 0; i < n; ++i, ++row) {
      const auto at = static_cast<std::size_t>(i);
      const std::int64_t in = (s.checkpoints && i > 0 ? table[at - 1] : table[0]).value();
      const std::int64_t out_slot = (s.checkpoints ? table[at] : table[0]).value();
      fn(row, kernels::StateSequence{in, 1, std::span(&out_slot, 1)});
      if (i + 1 == snap) {
        copy_state(cache::BlockId(static_cast<std::int32_t>(out_slot)), snapshot.snapshot);
      }
    }
  }
}

GatedDeltaNet::GatedDeltaNet(std::string name, kernels::GdnLayerSpec spec,
                             layout::LayerGeometry geometry, Weights w, double eps)
    : name_(std::move(name)),
      spec_(spec),
      geometry_(std::move(geometry)),
      w_(std::move(w)),
      eps_(eps) {}

// Qwen3-Next's layout and formulas. The conv and the delta rule run one token per kernel call,
// the state stored to the cache after every token: a token's output and state are then the same
// bytes whether it came in a prefill chunk, alone, or inside a verify block, for any state dtype
// (one call over several tokens would keep the state in float between them and round it only at
// the end). The chunked prefill kernel is not used for the same reason; docs/engine.md.
void GatedDeltaNet::run(const Step& step, std::span<const float> normed,
                        std::span<float> out) const {
  const kernels::GdnSpec& g = spec_.gdn;
  const kernels::ConvSpec& cs = spec_.conv;
  const std::int64_t total = step.rows();
  const std::int64_t hk = g.num_k_heads, hv = g.num_v_heads, dk = g.k_dim, dv = g.v_dim;
  const std::int64_t per = hv / hk;  // value heads per key head
  const std::int64_t key = hk * dk, value = hv * dv;
  const std::int64_t width = 2 * key + 2 * value;
  const std::int64_t channels = cs.channels;  // 2 key + value

  std::vector<float> qkvz(static_cast<std::size_t>(total * width));
  std::vector<float> ba(static_cast<std::size_t>(total * 2 * hv));
  ops::matmul_many({{&w_.in_qkvz, qkvz.data()}, {&w_.in_ba, ba.data()}}, normed.data(), total,
                   step.pool);
  // Rows are grouped per key head j: [q_j (dk), k_j (dk), v_j (per dv), z_j (per dv)] and
  // [b_j (per), a_j (per)]; the conv reads [all q; all k; all v].
  std::vector<float> mixed(static_cast<std::size_t>(total * channels));
  std::vector<float> z(static_cast<std::size_t>(total * value));
  std::vector<float> beta(static_cast<std::size_t>(total * hv));
  std::vector<float> decay(beta.size());
  for (std::int64_t t = 0; t < total; ++t) {
    const float* src = qkvz.data() + t * width;
    float* m = mixed.data() + t * channels;
    for (std::int64_t j = 0; j < hk; ++j) {
      const float* grp = src + j * (2 * dk + 2 * per * dv);
      std::copy_n(grp, dk, m + j * dk);
      std::copy_n(grp + dk, dk, m + key + j * dk);
      std::copy_n(grp + 2 * dk, per * dv, m + 2 * key + j * per * dv);
      std::copy_n(grp + 2 * dk + per * dv, per * dv, z.data() + t * value + j * per * dv);
      for (std::int64_t i = 0; i < per; ++i) {
        const std::int64_t head = j * per + i;
        const float b = ba[static_cast<std::size_t>(t * 2 * hv + j * 2 * per + i)];
        const float a = ba[static_cast<std::size_t>(t * 2 * hv + j * 2 * per + per + i)];
        beta[static_cast<std::size_t>(t * hv + head)] = 1.0f / (1.0f + std::exp(-b));
        decay[static_cast<std::size_t>(t * hv + head)] =
            w_.a_neg[static_cast<std::size_t>(head)] *
            ops::softplus(a + w_.dt_bias[static_cast<std::size_t>(head)]);
      }
    }
  }

  std::span<std::byte> tensor = tensor_of(step, geometry_);
  std::vector<float> conv_out(mixed.size());
  std::vector<float> o(static_cast<std::size_t>(total * value));
  step_recurrent(name_, geometry_, step, [&](std::int64_t row, const kernels::StateSequence& seq) {
    const auto rows_of = [&](const std::vector<float>& v, std::int64_t w) {
      return std::span<const float>(v).subspan(static_cast<std::size_t>(row * w),
                                               static_cast<std::size_t>(w));
    };
    std::span<float> c_out = std::span(conv_out).subspan(static_cast<std::size_t>(row * channels),
                                                         static_cast<std::size_t>(channels));
    // Conv and delta rule each read their own tensor of the input slot and write it into the
    // output slot.
    kernels::conv_update(cs, geometry_, tensor, std::span(&seq, 1),
                         {rows_of(mixed, channels), w_.conv, {}}, c_out);
    ops::l2_normalise(c_out.data(), hk, dk);
    ops::l2_normalise(c_out.data() + key, hk, dk);
    kernels::gdn_step(
        g, geometry_, tensor, std::span(&seq, 1),
        {c_out.subspan(0, static_cast<std::size_t>(key)),
         c_out.subspan(static_cast<std::size_t>(key), static_cast<std::size_t>(key)),
         c_out.subspan(static_cast<std::size_t>(2 * key), static_cast<std::size_t>(value)),
         rows_of(decay, hv), rows_of(beta, hv)},
        std::span(o).subspan(static_cast<std::size_t>(row * value),
                             static_cast<std::size_t>(value)));
  });

  // Gated RMSNorm per value head (Qwen3NextRMSNormGated): norm(o) * w * SiLU(z); out_proj.
  for (std::int64_t t = 0; t < total; ++t) {
    for (std::int64_t head = 0; head < hv; ++head) {
      float* oh = o.data() + t * value + head * dv;
      ops::rms_norm(oh, w_.norm, dv, eps_, oh);
      const float* zh = z.data() + t * value + head * dv;
      for (std::int64_t i = 0; i < dv; ++i) oh[i] *= kernels::silu(zh[i]);
    }
  }
  ops::matmul(w_.out, o.data(), total, out.data(), step.pool);
}

Mamba2::Mamba2(std::string name, kernels::Mamba2LayerSpec spec, layout::LayerGeometry geometry,
               Weights w, double eps)
    : name_(std::move(name)),
      spec_(spec),
      geometry_(std::move(geometry)),
      w_(std::move(w)),
      eps_(eps) {}

// in_proj to [z; x, B, C; dt]; the depthwise causal conv with SiLU over x, B, C; the SSM step
// (dt = softplus(dt + dt_bias), A = -exp(A_log), D skip); y * SiLU(z) RMS-normalised per group
// of heads (n_groups) times norm.weight; out_proj. State discipline as GatedDeltaNet's.
void Mamba2::run(const Step& step, std::span<const float> normed, std::span<float> out) const {
  const kernels::Mamba2Spec& m = spec_.ssm;
  const kernels::ConvSpec& cs = spec_.conv;
  const std::int64_t total = step.rows();
  const std::int64_t inner = m.heads * m.head_dim;
  const std::int64_t bc = m.groups * m.state_size;
  const std::int64_t channels = cs.channels;  // inner + 2 bc
  const std::int64_t width = inner + channels + m.heads;
  std::vector<float> proj(static_cast<std::size_t>(total * width));
  ops::matmul(w_.in_proj, normed.data(), total, proj.data(), step.pool);

  std::span<std::byte> tensor = tensor_of(step, geometry_);
  std::vector<float> conv_out(static_cast<std::size_t>(channels));
  std::vector<float> y(static_cast<std::size_t>(total * inner));
  step_recurrent(name_, geometry_, step, [&](std::int64_t row, const kernels::StateSequence& seq) {
    const std::span<const float> p = std::span<const float>(proj).subspan(
        static_cast<std::size_t>(row * width), static_cast<std::size_t>(width));
    const auto part = [](std::span<const float> v, std::int64_t from, std::int64_t count) {
      return v.subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(count));
    };
    kernels::conv_update(cs, geometry_, tensor, std::span(&seq, 1),
                         {part(p, inner, channels), w_.conv, w_.conv_bias}, conv_out);
    const std::span<const float> c(conv_out);
    kernels::mamba2_step(m, geometry_, tensor, std::span(&seq, 1),
                         {part(c, 0, inner), part(p, inner + channels, m.heads), part(c, inner, bc),
                          part(c, inner + bc, bc), w_.a_neg, w_.d_skip, w_.dt_bias},
                         std::span(y).subspan(static_cast<std::size_t>(row * inner),
                                              static_cast<std::size_t>(inner)));
  });

  // Gated RMSNorm (MambaRMSNormGated, gate applied before the norm): per group of
  // inner / n_groups channels.
  const std::int64_t per_group = inner / m.groups;
  for (std::int64_t t = 0; t < total; ++t) {
    float* yt = y.data() + t * inner;
    const float* z = proj.data() + t * width;
    for (std::int64_t i = 0; i < inner; ++i) yt[i] *= kernels::silu(z[i]);
    for (std::int64_t g = 0; g < m.groups; ++g) {
      float* v = yt + g * per_group;
      float ss = 0.0f;
      for (std::int64_t i = 0; i < per_group; ++i) ss += v[i] * v[i];
      const float inv =
          1.0f / std::sqrt(ss / static_cast<float>(per_group) + static_cast<float>(eps_));
      const float* w = w_.norm.data() + g * per_group;
      for (std::int64_t i = 0; i < per_group; ++i) v[i] = v[i] * inv * w[i];
    }
  }
  ops::matmul(w_.out, y.data(), total, out.data(), step.pool);
}

void Mlp::run(std::span<const float> normed, std::int64_t total, kernels::ThreadPool* pool,
              std::span<float> out, Scratch* scratch) const {
  Scratch local;
  Scratch& buffers = scratch != nullptr ? *scratch : local;
  const std::span<float> u = reuse(buffers.up, total, intermediate);
  const bool gated = activation != Activation::kRelu2;
  const std::span<float> g = gated ? reuse(buffers.gate, total, intermediate) : std::span<float>();
  const bool ggml = numerics == Numerics::kGgml;
  // The activation of columns [from, to) of every row, by the task that computed them (no
  // region of its own, and no thread reads the other's outputs); every element alone, so the
  // split does not touch the bits.
  const auto activate = [&](std::int64_t from, std::int64_t to) {
    const auto n = static_cast<std::size_t>(to - from);
    for (std::int64_t t = 0; t < total; ++t) {
      const auto at = static_cast<std::size_t>(t * intermediate + from);
      const std::span<float> ut = u.subspan(at, n);
      if (!gated) {
        for (float& v : ut) v = v > 0.0f ? v * v : 0.0f;
        continue;
      }
      const std::span<const float> gt = g.subspan(at, n);
      if (activation == Activation::kGeluTanhGated) {
        for (std::size_t i = 0; i < n; ++i) ut[i] *= ops::gelu_tanh(gt[i]);
      } else if (ggml) {
        kernels::ggml_swiglu(gt, ut);
      } else {
        kernels::silu_mul(gt, ut);
      }
    }
  };
  if (gated) {
    // gate and up in one region over x quantised once.
    ops::matmul_many({{&up, u.data()}, {&gate, g.data()}}, normed.data(), total, pool, activate);
  } else {
    ops::matmul_many({{&up, u.data()}}, normed.data(), total, pool, activate);
  }
  ops::matmul(down, u.data(), total, out.data(), pool);
}

void Block::run(const Step& step, std::vector<float>& x, std::vector<float>& normed,
                std::vector<float>& tmp) const {
  const std::int64_t h = step.hidden;
  const std::int64_t total = step.rows();
  // Per row: the mixer's or MLP's output rows in tmp (RMS-normed by `out_norm` where the block
  // has one) added into x, then x normed by `next_norm` into normed (none: no norm). The rows
  // split across the pool when there are enough of them; each row's bits are its own.
  const auto rows = [&](const std::vector<float>* out_norm, const std::vector<float>* next_norm) {
    ops::for_chunks(step.pool, total, kRowGrain, [&](std::int64_t from, std::int64_t to) {
      float* xs = x.data() + from * h;
      if (out_norm != nullptr) {
        float* ms = tmp.data() + from * h;
        if (!out_norm->empty()) ops::rms_norm_rows(ms, to - from, *out_norm, h, eps, ms);
        for (std::int64_t i = 0; i < (to - from) * h; ++i) xs[i] += ms[i];
      }
      if (next_norm != nullptr) {
        ops::rms_norm_rows(xs, to - from, *next_norm, h, eps, normed.data() + from * h);
      }
    });
  };
  if (mixer) {
    rows(nullptr, &mixer_norm);
    mixer->run(step, normed, tmp);
  }
  // The mixer's residual and the MLP's norm in one pass over the rows.
  if (mlp) {
    rows(mixer ? &mixer_out_norm : nullptr, &mlp_norm);
    mlp->run(normed, total, step.pool, tmp, step.scratch);
    rows(&mlp_out_norm, nullptr);
  } else if (mixer) {
    rows(&mixer_out_norm, nullptr);
  }
}

}  // namespace mixkv::runner
