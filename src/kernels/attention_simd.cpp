// The inner loops of paged attention with Highway: this file is compiled once per instruction set
// (foreach_target.h re-includes it), and attend_task picks the best one the CPU has at run time
// (HWY_DYNAMIC_DISPATCH), so one binary runs on any x86-64 (and any CPU Highway knows).
#include "kernels/attention_simd.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/element_load.hpp"
#include "mixkv/kernels_convert.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers after foreach_target.h, as its documentation requires.
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace mixkv::kernels::detail::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

std::int64_t round_up(std::int64_t x, std::int64_t n) { return (x + n - 1) / n * n; }

// Decodes `rows` rows of `count` elements (`src_stride` bytes apart) into floats `dst_stride`
// apart. Bit-exact like kernels_convert: bf16 is a shift; fp16 and fp8 move exponent and
// mantissa into float position and rebias with one exact multiply by a power of two (normal and
// subnormal codes alike), then inf/NaN codes are patched in; fp8 then multiplies by its scale.
void convert_rows(DType dtype, const float* table, const std::byte* src, std::int64_t src_stride,
                  std::int64_t rows, std::int64_t count, float scale, float* dst,
                  std::int64_t dst_stride) {
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t elem = element_bytes(dtype);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* s = src + r * src_stride;
    float* o = dst + r * dst_stride;
    std::int64_t i = 0;
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(o, s, static_cast<std::size_t>(count) * sizeof(float));
        i = count;
        break;
      case DType::kBfloat16: {
        const hn::Rebind<std::uint16_t, DF> d16;
        for (; i + n <= count; i += n) {
          const auto u =
              hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(s) + i));
          hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(u)), df, o + i);
        }
        break;
      }
      case DType::kFloat16: {
        const hn::Rebind<std::uint16_t, DF> d16;
        for (; i + n <= count; i += n) {
          const auto u =
              hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(s) + i));
          const auto sign = hn::ShiftLeft<16>(hn::And(u, hn::Set(du, 0x8000u)));
          const auto em = hn::And(u, hn::Set(du, 0x7FFFu));
          const auto finite =
              hn::Mul(hn::BitCast(df, hn::ShiftLeft<13>(em)), hn::Set(df, 0x1p112f));
          const auto special =
              hn::BitCast(df, hn::Or(hn::Set(du, 0x7F800000u),
                                     hn::ShiftLeft<13>(hn::And(em, hn::Set(du, 0x3FFu)))));
          const auto is_special =
              hn::RebindMask(df, hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7BFF)));
          const auto v = hn::IfThenElse(is_special, special, finite);
          hn::StoreU(hn::BitCast(df, hn::Or(hn::BitCast(du, v), sign)), df, o + i);
        }
        break;
      }
      case DType::kFp8E4m3:
      case DType::kFp8E5m2: {
        const bool e4m3 = dtype == DType::kFp8E4m3;
        const hn::Rebind<std::uint8_t, DF> d8;
        const auto vscale = hn::Set(df, scale);
        for (; i + n <= count; i += n) {
          const auto u =
              hn::PromoteTo(du, hn::LoadU(d8, reinterpret_cast<const std::uint8_t*>(s) + i));
          const auto sign = hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)));
          const auto em = hn::And(u, hn::Set(du, 0x7Fu));
          hn::Vec<DF> v;
          if (e4m3) {
            // e4m3fn: no infinities, 0x7F is NaN.
            const auto finite =
                hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(em)), hn::Set(df, 0x1p120f));
            const auto is_nan = hn::RebindMask(df, hn::Eq(em, hn::Set(du, 0x7Fu)));
            v = hn::IfThenElse(is_nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()),
                               finite);
          } else {
            const auto finite =
                hn::Mul(hn::BitCast(df, hn::ShiftLeft<21>(em)), hn::Set(df, 0x1p112f));
            const auto special = hn::BitCast(
                df,
                hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<21>(hn::And(em, hn::Set(du, 3u)))));
            const auto is_special =
                hn::RebindMask(df, hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7B)));
            v = hn::IfThenElse(is_special, special, finite);
          }
          v = hn::BitCast(df, hn::Or(hn::BitCast(du, v), sign));
          hn::StoreU(hn::Mul(v, vscale), df, o + i);
        }
        break;
      }
      default:
        break;
    }
    // The tail (head sizes that are not a multiple of the vector) element by element.
    load_row(dtype, table, s + i * elem, static_cast<std::size_t>(count - i), scale, o + i);
  }
}

// q.k of `heads` query rows (1 or 4) against one or two key rows, `len` floats each (a multiple
// of the vector; the padding is zero). Each (head, key) sum runs over the row in one fixed order
// whichever variant computes it, so results do not depend on how heads are grouped.
template <int kHeads, int kKeys>
HWY_INLINE void dots(const float* const* q, const float* k0, const float* k1, std::int64_t len,
                     float* out0, float* out1) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  auto b0 = hn::Zero(df), b1 = hn::Zero(df), b2 = hn::Zero(df), b3 = hn::Zero(df);
  for (std::int64_t j = 0; j < len; j += n) {
    const auto x = hn::LoadU(df, k0 + j);
    const auto q0 = hn::LoadU(df, q[0] + j);
    a0 = hn::MulAdd(q0, x, a0);
    if constexpr (kHeads == 4) {
      const auto q1 = hn::LoadU(df, q[1] + j);
      const auto q2 = hn::LoadU(df, q[2] + j);
      const auto q3 = hn::LoadU(df, q[3] + j);
      a1 = hn::MulAdd(q1, x, a1);
      a2 = hn::MulAdd(q2, x, a2);
      a3 = hn::MulAdd(q3, x, a3);
      if constexpr (kKeys == 2) {
        const auto y = hn::LoadU(df, k1 + j);
        b0 = hn::MulAdd(q0, y, b0);
        b1 = hn::MulAdd(q1, y, b1);
        b2 = hn::MulAdd(q2, y, b2);
        b3 = hn::MulAdd(q3, y, b3);
      }
    } else if constexpr (kKeys == 2) {
      b0 = hn::MulAdd(q0, hn::LoadU(df, k1 + j), b0);
    }
  }
  const auto sum = [&](decltype(a0) v) { return hn::GetLane(hn::SumOfLanes(df, v)); };
  out0[0] = sum(a0);
  if constexpr (kKeys == 2) out1[0] = sum(b0);
  if constexpr (kHeads == 4) {
    out0[kTileTokens] = sum(a1);
    out0[2 * kTileTokens] = sum(a2);
    out0[3 * kTileTokens] = sum(a3);
    if constexpr (kKeys == 2) {
      out1[kTileTokens] = sum(b1);
      out1[2 * kTileTokens] = sum(b2);
      out1[3 * kTileTokens] = sum(b3);
    }
  }
}

// o = o * c (when rescaling) + sum over t in [a, b] of p[t] * v[t], `len` floats per row. Eight,
// four or one vector of o at a time stay in registers over the whole tile; each lane sums the
// tokens in order, whatever the grouping.
void accumulate(float* o, bool rescale, float c, const float* p, std::int64_t a, std::int64_t b,
                const float* v, std::int64_t v_stride, std::int64_t len) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const auto vc = hn::Set(df, c);
  const auto start = [&](std::int64_t j) {
    const auto x = hn::LoadU(df, o + j);
    return rescale ? hn::Mul(x, vc) : x;
  };
  std::int64_t j = 0;
  for (; j + 8 * n <= len; j += 8 * n) {
    auto a0 = start(j), a1 = start(j + n), a2 = start(j + 2 * n), a3 = start(j + 3 * n);
    auto a4 = start(j + 4 * n), a5 = start(j + 5 * n), a6 = start(j + 6 * n), a7 = start(j + 7 * n);
    for (std::int64_t t = a; t <= b; ++t) {
      const auto w = hn::Set(df, p[t]);
      const float* row = v + t * v_stride + j;
      a0 = hn::MulAdd(w, hn::LoadU(df, row), a0);
      a1 = hn::MulAdd(w, hn::LoadU(df, row + n), a1);
      a2 = hn::MulAdd(w, hn::LoadU(df, row + 2 * n), a2);
      a3 = hn::MulAdd(w, hn::LoadU(df, row + 3 * n), a3);
      a4 = hn::MulAdd(w, hn::LoadU(df, row + 4 * n), a4);
      a5 = hn::MulAdd(w, hn::LoadU(df, row + 5 * n), a5);
      a6 = hn::MulAdd(w, hn::LoadU(df, row + 6 * n), a6);
      a7 = hn::MulAdd(w, hn::LoadU(df, row + 7 * n), a7);
    }
    hn::StoreU(a0, df, o + j);
    hn::StoreU(a1, df, o + j + n);
    hn::StoreU(a2, df, o + j + 2 * n);
    hn::StoreU(a3, df, o + j + 3 * n);
    hn::StoreU(a4, df, o + j + 4 * n);
    hn::StoreU(a5, df, o + j + 5 * n);
    hn::StoreU(a6, df, o + j + 6 * n);
    hn::StoreU(a7, df, o + j + 7 * n);
  }
  for (; j + 4 * n <= len; j += 4 * n) {
    auto a0 = start(j), a1 = start(j + n), a2 = start(j + 2 * n), a3 = start(j + 3 * n);
    for (std::int64_t t = a; t <= b; ++t) {
      const auto w = hn::Set(df, p[t]);
      const float* row = v + t * v_stride + j;
      a0 = hn::MulAdd(w, hn::LoadU(df, row), a0);
      a1 = hn::MulAdd(w, hn::LoadU(df, row + n), a1);
      a2 = hn::MulAdd(w, hn::LoadU(df, row + 2 * n), a2);
      a3 = hn::MulAdd(w, hn::LoadU(df, row + 3 * n), a3);
    }
    hn::StoreU(a0, df, o + j);
    hn::StoreU(a1, df, o + j + n);
    hn::StoreU(a2, df, o + j + 2 * n);
    hn::StoreU(a3, df, o + j + 3 * n);
  }
  for (; j < len; j += n) {
    auto a0 = start(j);
    for (std::int64_t t = a; t <= b; ++t)
      a0 = hn::MulAdd(hn::Set(df, p[t]), hn::LoadU(df, v + t * v_stride + j), a0);
    hn::StoreU(a0, df, o + j);
  }
}

void prefetch_rows(const std::byte* first, std::int64_t rows, std::int64_t stride,
                   std::int64_t bytes) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < bytes; i += 64) hwy::Prefetch(first + r * stride + i);
  }
}

template <class V>
void grow(V& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
}

}  // namespace

void AttendTaskImpl(const AttendCall& call, const AttendTask& task, AttendScratch& s) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const AttentionSpec& spec = *call.spec;
  const attn::AttentionParams& params = spec.params;
  const PageLayout& p = call.page;
  const PagedSequence& seq = *task.seq;
  const std::int64_t hq = params.num_q_heads;
  const std::int64_t group = hq / params.num_kv_heads;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;
  const std::int64_t dp = round_up(d, n);
  const std::int64_t dvp = round_up(dv, n);
  const std::int64_t tile_pad = round_up(kTileTokens, n);
  const std::int64_t nq = task.q_end - task.q_begin;
  const std::int64_t nh = task.h_end - task.h_begin;
  const std::int64_t hk_first = task.h_begin / group;
  const std::int64_t hk_last = (task.h_end - 1) / group;
  const float* table = fp8_table(p.dtype);
  const auto scale = static_cast<float>(params.scale);
  const bool capped = params.soft_cap.has_value();
  const float cap = capped ? static_cast<float>(*params.soft_cap) : 1.0f;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  grow(s.q, nq * nh * dp);
  grow(s.k, kTileTokens * dp);
  grow(s.v, spec.mla ? 0 : kTileTokens * dvp);
  grow(s.scores, 3 * kTileTokens + tile_pad);
  grow(s.probs, tile_pad);
  grow(s.max, nq * nh);
  grow(s.sum, nq * nh);
  grow(s.acc, nq * nh * dvp);
  // The padding lanes of K and Q rows must be zero: they enter every dot product.
  for (std::int64_t t = 0; t < kTileTokens; ++t)
    std::fill(s.k.begin() + t * dp + d, s.k.begin() + (t + 1) * dp, 0.0f);
  for (std::int64_t i = 0; i < nq; ++i) {
    for (std::int64_t h = 0; h < nh; ++h) {
      const float* src =
          call.queries + ((task.row0 + task.q_begin + i) * hq + task.h_begin + h) * d;
      float* dst = s.q.data() + (i * nh + h) * dp;
      std::copy(src, src + d, dst);
      std::fill(dst + d, dst + dp, 0.0f);
      // Online-softmax state; a sink starts it as one extra logit with a zero value.
      s.max[static_cast<std::size_t>(i * nh + h)] =
          params.sinks ? call.sinks[task.h_begin + h] : neg_inf;
      s.sum[static_cast<std::size_t>(i * nh + h)] = params.sinks ? 1.0f : 0.0f;
    }
  }
  std::fill(s.acc.begin(), s.acc.begin() + nq * nh * dvp, 0.0f);

  const std::int64_t first_pos = seq.kv_len - seq.num_queries;
  // Ranges move right with the position, so the block's keys are [lo of first, hi of last].
  const std::int64_t lo_all = key_range(params, first_pos + task.q_begin, seq.kv_len).lo;
  const std::int64_t hi_all = key_range(params, first_pos + task.q_end - 1, seq.kv_len).hi;
  // The bytes of a K (V) row this task reads: its KV heads only.
  const std::int64_t k_head_bytes = d * p.elem;
  const std::int64_t v_head_bytes = spec.mla ? 0 : dv * p.elem;
  const std::int64_t k_first = hk_first * k_head_bytes;
  const std::int64_t k_bytes = (hk_last + 1 - hk_first) * k_head_bytes;
  const std::int64_t v_first = hk_first * v_head_bytes;
  const std::int64_t v_bytes = (hk_last + 1 - hk_first) * v_head_bytes;
  const auto page_base = [&](std::int64_t t) {
    return call.cache + p.offset +
           seq.kernel_pages[static_cast<std::size_t>(t / p.kernel_tokens)] * p.stride;
  };
  const auto tile_at = [&](std::int64_t t) {
    return std::min({kTileTokens, p.kernel_tokens - t % p.kernel_tokens, hi_all + 1 - t});
  };
  const auto lane = hn::Iota(di, 0);

  for (std::int64_t t0 = lo_all; t0 <= hi_all;) {
    const std::int64_t in_page = t0 % p.kernel_tokens;
    const std::int64_t tile = tile_at(t0);
    const std::byte* base = page_base(t0);
    const std::byte* k_src = base + in_page * p.k_token_bytes;
    const std::byte* v_src = base + p.v_offset + in_page * p.v_token_bytes;
    if (t0 + tile <= hi_all) {
      // The next tile may sit on another page anywhere in the tensor: ask for it now, so its
      // bytes arrive while this one is computed.
      const std::int64_t next = t0 + tile;
      const std::byte* next_base = page_base(next);
      const std::int64_t next_in = next % p.kernel_tokens;
      const std::int64_t next_tile = tile_at(next);
      prefetch_rows(next_base + next_in * p.k_token_bytes + k_first, next_tile, p.k_token_bytes,
                    k_bytes);
      prefetch_rows(next_base + p.v_offset + next_in * p.v_token_bytes + v_first, next_tile,
                    p.v_token_bytes, v_bytes);
    }
    for (std::int64_t hk = hk_first; hk <= hk_last; ++hk) {
      convert_rows(p.dtype, table, k_src + hk * k_head_bytes, p.k_token_bytes, tile, d,
                   call.scales.k, s.k.data(), dp);
      // MLA: the value is the latent's first dv elements.
      const float* v_rows = s.k.data();
      std::int64_t v_stride = dp;
      if (!spec.mla) {
        convert_rows(p.dtype, table, v_src + hk * v_head_bytes, p.v_token_bytes, tile, dv,
                     call.scales.v, s.v.data(), dvp);
        v_rows = s.v.data();
        v_stride = dvp;
      }
      const std::int64_t hb = std::max(task.h_begin, hk * group);
      const std::int64_t he = std::min(task.h_end, (hk + 1) * group);
      for (std::int64_t i = 0; i < nq; ++i) {
        const KeyRange range = key_range(params, first_pos + task.q_begin + i, seq.kv_len);
        const std::int64_t a = std::max(range.lo, t0) - t0;
        const std::int64_t b = std::min(range.hi, t0 + tile - 1) - t0;
        if (a > b) continue;
        // Lanes t with a <= t <= b (signed Gt/Lt are what every target has).
        const auto va = hn::Set(di, static_cast<std::int32_t>(a - 1));
        const auto vb = hn::Set(di, static_cast<std::int32_t>(b + 1));
        for (std::int64_t h0 = hb, heads = 0; h0 < he; h0 += heads) {
          heads = he - h0 >= 4 ? 4 : 1;
          const float* q[4];
          for (int x = 0; x < heads; ++x) q[x] = s.q.data() + (i * nh + h0 - task.h_begin + x) * dp;
          float* sc = s.scores.data();
          std::int64_t t = a;
          for (; t + 1 <= b; t += 2) {
            const float* k0 = s.k.data() + t * dp;
            if (heads == 4)
              dots<4, 2>(q, k0, k0 + dp, dp, sc + t, sc + t + 1);
            else
              dots<1, 2>(q, k0, k0 + dp, dp, sc + t, sc + t + 1);
          }
          if (t <= b) {
            if (heads == 4)
              dots<4, 1>(q, s.k.data() + t * dp, nullptr, dp, sc + t, nullptr);
            else
              dots<1, 1>(q, s.k.data() + t * dp, nullptr, dp, sc + t, nullptr);
          }
          for (int x = 0; x < heads; ++x) {
            const std::int64_t state = i * nh + h0 - task.h_begin + x;
            float* row = sc + x * kTileTokens;
            // Logits of the tile (lanes outside [a, b] are not used).
            float tile_max = neg_inf;
            for (std::int64_t j = 0; j < tile_pad; j += n) {
              auto v = hn::Mul(hn::LoadU(df, row + j), hn::Set(df, scale));
              if (capped) {
                const auto y = hn::Mul(v, hn::Set(df, 1.0f / cap));
                const auto th = hn::Tanh(df, y);
                v = hn::Mul(hn::Set(df, cap), hn::IfThenElse(hn::IsNaN(y), y, th));
              }
              const auto idx = hn::Add(lane, hn::Set(di, static_cast<std::int32_t>(j)));
              const auto mask = hn::RebindMask(df, hn::And(hn::Gt(idx, va), hn::Lt(idx, vb)));
              v = hn::IfThenElse(mask, v, hn::Set(df, neg_inf));
              hn::StoreU(v, df, row + j);
              tile_max = std::max(tile_max, hn::GetLane(hn::MaxOfLanes(df, v)));
            }
            float& m = s.max[static_cast<std::size_t>(state)];
            float& l = s.sum[static_cast<std::size_t>(state)];
            bool rescale = false;
            float c = 1.0f;
            if (tile_max > m) {
              c = std::exp(m - tile_max);
              l *= c;
              m = tile_max;
              rescale = true;
            }
            auto total = hn::Zero(df);
            const auto vm = hn::Set(df, m);
            for (std::int64_t j = 0; j < tile_pad; j += n) {
              const auto x = hn::Sub(hn::LoadU(df, row + j), vm);
              // Highway's Exp gives 0 for NaN; keep NaN so a bad logit shows in the output.
              const auto e = hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(df, x));
              hn::StoreU(e, df, s.probs.data() + j);
              total = hn::Add(total, e);
            }
            l += hn::GetLane(hn::SumOfLanes(df, total));
            accumulate(s.acc.data() + state * dvp, rescale, c, s.probs.data(), a, b, v_rows,
                       v_stride, dvp);
          }
        }
      }
    }
    t0 += tile;
  }

  for (std::int64_t i = 0; i < nq; ++i) {
    for (std::int64_t h = 0; h < nh; ++h) {
      const std::int64_t state = i * nh + h;
      const float inv = 1.0f / s.sum[static_cast<std::size_t>(state)];
      const float* o = s.acc.data() + state * dvp;
      float* dst = call.out + ((task.row0 + task.q_begin + i) * hq + task.h_begin + h) * dv;
      std::int64_t e = 0;
      for (; e + n <= dv; e += n)
        hn::StoreU(hn::Mul(hn::LoadU(df, o + e), hn::Set(df, inv)), df, dst + e);
      for (; e < dv; ++e) dst[e] = o[e] * inv;
    }
  }
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace mixkv::kernels::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mixkv::kernels::detail {

HWY_EXPORT(AttendTaskImpl);
HWY_EXPORT(TargetNameImpl);

void attend_task(const AttendCall& call, const AttendTask& task, AttendScratch& scratch) {
  HWY_DYNAMIC_DISPATCH(AttendTaskImpl)(call, task, scratch);
}

const char* attend_target() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace mixkv::kernels::detail
#endif  // HWY_ONCE
