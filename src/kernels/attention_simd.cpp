// The inner loops of paged attention with Highway: this file is compiled once per instruction set
// (foreach_target.h re-includes it), and attend_task picks the best one the CPU has at run time
// (HWY_DYNAMIC_DISPATCH), so one binary runs on any x86-64 (and any CPU Highway knows).
#include "kernels/attention_simd.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "kernels/attention_amx.hpp"
#include "kernels/bf16_pairs.hpp"
#include "kernels/convert_simd.hpp"
#include "kernels/element_load.hpp"
#include "kernels/prefetch.hpp"
#include "mixkv/kernels/convert.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers after foreach_target.h, as its documentation requires.
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>
// The cache element decoding shared with the matrix products (per target).
#include "kernels/simd_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace mixkv::kernels::detail::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
// AVX-512: 32 vector registers (AVX2 has 16), so a loop may keep about twice as many sums live.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr bool kWideRegisterFile = true;
#else
constexpr bool kWideRegisterFile = false;
#endif

std::int64_t round_up(std::int64_t x, std::int64_t n) { return (x + n - 1) / n * n; }

// Decodes `rows` rows of `count` elements (`src_stride` bytes apart) into floats `dst_stride`
// apart, in units of code_unit (the scales are applied to the logits and outputs); the tail
// beyond whole vectors element by element.
template <DType kT>
void convert_rows_t(const float* table, const std::byte* src, std::int64_t src_stride,
                    std::int64_t rows, std::int64_t count, float* dst, std::int64_t dst_stride) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const std::int64_t elem = element_bytes(kT);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* row = src + r * src_stride;
    float* o = dst + r * dst_stride;
    std::int64_t i = 0;
    for (; i + 2 * n <= count; i += 2 * n) {
      hn::Vec<DF> lo, hi;
      decode_units2<kT>(row, i, lo, hi);
      hn::StoreU(lo, df, o + i);
      hn::StoreU(hi, df, o + i + n);
    }
    for (; i + n <= count; i += n) hn::StoreU(decode_units<kT>(row, i), df, o + i);
    load_row(kT, table, row + i * elem, static_cast<std::size_t>(count - i), code_unit(kT), o + i);
  }
}

void convert_rows(DType dtype, const float* table, const std::byte* src, std::int64_t src_stride,
                  std::int64_t rows, std::int64_t count, float* dst, std::int64_t dst_stride) {
  switch (dtype) {
    case DType::kFloat32:
      return convert_rows_t<DType::kFloat32>(table, src, src_stride, rows, count, dst, dst_stride);
    case DType::kBfloat16:
      return convert_rows_t<DType::kBfloat16>(table, src, src_stride, rows, count, dst, dst_stride);
    case DType::kFloat16:
      return convert_rows_t<DType::kFloat16>(table, src, src_stride, rows, count, dst, dst_stride);
    case DType::kFp8E4m3:
      return convert_rows_t<DType::kFp8E4m3>(table, src, src_stride, rows, count, dst, dst_stride);
    default:
      return convert_rows_t<DType::kFp8E5m2>(table, src, src_stride, rows, count, dst, dst_stride);
  }
}

// Rows of a tile as the loops below read them: converted float rows in scratch (prefill, odd
// head sizes), or the cache's own bytes decoded in registers (decode: each row is used once, so
// a round trip through memory would only cost).
struct FloatRows {
  static constexpr bool kPairs = false;
  const float* base;
  std::int64_t stride;  // floats
  HWY_INLINE hn::Vec<DF> load(std::int64_t t, std::int64_t j) const {
    return hn::LoadU(DF(), base + t * stride + j);
  }
  HWY_INLINE void load2(std::int64_t t, std::int64_t j, hn::Vec<DF>& lo, hn::Vec<DF>& hi) const {
    lo = load(t, j);
    hi = load(t, j + static_cast<std::int64_t>(hn::Lanes(DF())));
  }
};
// In units of code_unit, like convert_rows. kNanFree: the rows were checked to hold no e4m3 NaN
// code, so the paired widening skips its NaN test (the same bits for every other code).
template <DType kT, bool kNanFree = false>
struct CacheRows {
  static constexpr bool kPairs = kPairedDecode<kT>;
  const std::byte* base;
  std::int64_t stride;  // bytes
  HWY_INLINE hn::Vec<DF> load(std::int64_t t, std::int64_t j) const {
    return decode_units<kT>(base + t * stride, j);
  }
  HWY_INLINE void load2(std::int64_t t, std::int64_t j, hn::Vec<DF>& lo, hn::Vec<DF>& hi) const {
    decode_units2<kT, kNanFree>(base + t * stride, j, lo, hi);
  }
};

// Whether any of `rows` rows of `bytes` e4m3 codes (`stride` bytes apart) is a NaN (0x7F or
// 0xFF: the largest value of code & 0x7F), two instructions per 64 codes. Unused on the targets
// that widen e4m3 one vector at a time (clang says so; the fuzz build compiles only those).
[[maybe_unused]] HWY_INLINE bool any_e4m3_nan(const std::byte* base, std::int64_t stride,
                                              std::int64_t rows, std::int64_t bytes) {
  const hn::ScalableTag<std::uint8_t> d8;
  const auto n8 = static_cast<std::int64_t>(hn::Lanes(d8));
  const auto low7 = hn::Set(d8, std::uint8_t{0x7F});
  auto top = hn::Zero(d8);
  bool tail = false;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto* row = reinterpret_cast<const std::uint8_t*>(base + r * stride);
    std::int64_t i = 0;
    for (; i + n8 <= bytes; i += n8) top = hn::Max(top, hn::And(hn::LoadU(d8, row + i), low7));
    for (; i < bytes; ++i) tail = tail || (row[i] & 0x7F) == 0x7F;
  }
  return tail || !hn::AllFalse(d8, hn::Eq(top, low7));
}

// The two ways a tile's lanes are combined across (a score's sum, the softmax's max and sum).
struct LaneAdd {
  template <class V>
  HWY_INLINE V operator()(V x, V y) const {
    return hn::Add(x, y);
  }
};
struct LaneMax {
  template <class V>
  HWY_INLINE V operator()(V x, V y) const {
    return hn::Max(x, y);
  }
};

#if HWY_TARGET != HWY_SCALAR
// Combines the 128-bit blocks of v by `op`, halving the vector until one block is left.
template <class D, class V, class Op>
HWY_INLINE void combine_blocks(D d, V v, Op op, float* out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    combine_blocks(dh, op(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), op, out);
  } else {
    hn::StoreU(v, d, out);
  }
}

// across4's first steps: block b of the result holds block b of a0 .. a3 combined, lane x that of
// a_x, its lanes paired as (0 op 2) op (1 op 3).
template <class Op>
HWY_INLINE hn::Vec<DF> combine_in_blocks4(Op op, hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2,
                                          hn::Vec<DF> a3) {
  const DF df;
  const hn::Repartition<double, DF> dd;
  const auto t01 = op(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
  const auto t23 = op(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
  const auto x = hn::BitCast(dd, t01);
  const auto y = hn::BitCast(dd, t23);
  return op(hn::BitCast(df, hn::InterleaveLower(dd, x, y)),
            hn::BitCast(df, hn::InterleaveUpper(dd, x, y)));
}

HWY_INLINE hn::Vec<DF> block_sums4(hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2, hn::Vec<DF> a3) {
  return combine_in_blocks4(LaneAdd(), a0, a1, a2, a3);
}
#endif

// out[x] = the lanes of vector x combined by `op`, four vectors at once: lanes are paired inside
// each 128-bit block by interleaving (fewer shuffles than four separate reductions), then blocks
// are combined. A vector's result follows the same tree whatever the other three are, so a head's
// score (or softmax state) does not depend on the heads computed beside it (a lone head passes
// itself four times).
template <class Op>
HWY_INLINE void across4(Op op, hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2, hn::Vec<DF> a3,
                        float* out) {
#if HWY_TARGET == HWY_SCALAR
  (void)op;
  out[0] = hn::GetLane(a0), out[1] = hn::GetLane(a1), out[2] = hn::GetLane(a2);
  out[3] = hn::GetLane(a3);
#else
  combine_blocks(DF(), combine_in_blocks4(op, a0, a1, a2, a3), op, out);
#endif
}

// The sums of four vectors' lanes (across4).
HWY_INLINE void reduce4(hn::Vec<DF> a0, hn::Vec<DF> a1, hn::Vec<DF> a2, hn::Vec<DF> a3,
                        float* out) {
  across4(LaneAdd(), a0, a1, a2, a3, out);
}

// Keeps a loaded vector in its register where it stands. GCC otherwise folds the load of q into
// each of the two multiply-adds that use it (keys t and t + 1), so the q.k loop asked for 10
// loads every 8 multiply-adds: more than the multiply-adds' own cycles on a core that loads two
// vectors a cycle and runs two multiply-adds (Zen 5's 512-bit units; a Zen 3's 256-bit ones).
// With q held, 6 loads: on a Zen 5 one thread's 5-row verify at 8k took about 20% less.
template <class V>
HWY_INLINE void in_register(V& v) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

// q.k of `kHeads` query rows (1 to 4) against keys t and t + 1 (kKeys 2) or t alone, over `len`
// floats (a multiple of the vector; padding is zero). Scores go to out[head * kTileTokens + t].
// Each (head, key) sum runs over the row in one fixed order whichever variant computes it, so
// results do not depend on how heads are grouped (3 query heads per KV head, SmolLM2's, read each
// K row once for the three, not three times).
template <int kHeads, int kKeys, class Rows>
HWY_INLINE void dots(const float* const* q, const Rows& k, std::int64_t t, std::int64_t len,
                     float* out) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  auto b0 = hn::Zero(df), b1 = hn::Zero(df), b2 = hn::Zero(df), b3 = hn::Zero(df);
  // Elements j.. of key t (x) and key t + 1 (y, kKeys 2) into the sums.
  const auto step = [&](std::int64_t j, hn::Vec<DF> x, hn::Vec<DF> y) HWY_ATTR {
    auto q0 = hn::LoadU(df, q[0] + j);
    if constexpr (kKeys == 2) in_register(q0);
    a0 = hn::MulAdd(q0, x, a0);
    if constexpr (kKeys == 2) b0 = hn::MulAdd(q0, y, b0);
    if constexpr (kHeads >= 2) {
      auto q1 = hn::LoadU(df, q[1] + j);
      if constexpr (kKeys == 2) in_register(q1);
      a1 = hn::MulAdd(q1, x, a1);
      if constexpr (kKeys == 2) b1 = hn::MulAdd(q1, y, b1);
    }
    if constexpr (kHeads >= 3) {
      auto q2 = hn::LoadU(df, q[2] + j);
      if constexpr (kKeys == 2) in_register(q2);
      a2 = hn::MulAdd(q2, x, a2);
      if constexpr (kKeys == 2) b2 = hn::MulAdd(q2, y, b2);
    }
    if constexpr (kHeads >= 4) {
      auto q3 = hn::LoadU(df, q[3] + j);
      if constexpr (kKeys == 2) in_register(q3);
      a3 = hn::MulAdd(q3, x, a3);
      if constexpr (kKeys == 2) b3 = hn::MulAdd(q3, y, b3);
    }
  };
  std::int64_t j = 0;
  if constexpr (Rows::kPairs) {  // two vectors widened at once, used in the same order
    for (; j + 2 * n <= len; j += 2 * n) {
      hn::Vec<DF> x0, x1, y0, y1;
      k.load2(t, j, x0, x1);
      if constexpr (kKeys == 2) {
        k.load2(t + 1, j, y0, y1);
      } else {
        y0 = x0, y1 = x1;
      }
      step(j, x0, y0);
      step(j + n, x1, y1);
    }
  }
  for (; j < len; j += n) {
    const auto x = k.load(t, j);
    step(j, x, kKeys == 2 ? k.load(t + 1, j) : x);
  }
  // The store of head x's sums, for the heads there are.
  const auto store = [&](const float* r, std::int64_t key) {
    for (int x = 0; x < kHeads; ++x) out[x * kTileTokens + key] = r[x];
  };
  float r[4];
  reduce4(a0, a1, a2, a3, r);
  store(r, t);
  if constexpr (kKeys == 2) {
    reduce4(b0, b1, b2, b3, r);
    store(r, t + 1);
  }
}

// dots for `heads` (1 to 4) query rows.
template <int kKeys, class Rows>
HWY_INLINE void dots_heads(std::int64_t heads, const float* const* q, const Rows& k, std::int64_t t,
                           std::int64_t len, float* out) {
  switch (heads) {
    case 4:
      return dots<4, kKeys>(q, k, t, len, out);
    case 3:
      return dots<3, kKeys>(q, k, t, len, out);
    case 2:
      return dots<2, kKeys>(q, k, t, len, out);
    default:
      return dots<1, kKeys>(q, k, t, len, out);
  }
}

// The most query rows (heads) dots4 takes: its 4 x kHeads sums, a vector of q and four of K
// must fit the register file.
constexpr int kDots4MaxHeads = kWideRegisterFile ? 4 : 2;

// dots for kHeads query rows (1 to kDots4MaxHeads) against the four keys t .. t + 3 at once,
// each (head, key) sum the same chain and the same tree as in dots (the same bits).
// - On AVX-512, four keys give 12 chains for SmolLM2's 3 query heads a KV head, and their trees
//   share their last steps: each head's block sums (block_sums4 over its four keys) meet the
//   other heads' in whole-block shuffles, and one 128-bit store writes a head's four scores.
//   dots and reduce4 spent about as many instructions on a score's tree as on its products at
//   64-wide heads, with a scalar store per score.
// - Elsewhere, for one or two heads a KV head (MHA; GQA of 2): 4 or 8 chains where dots' two
//   keys give 2 or 4, fewer than the multiply-adds' latency times the units (AVX2's q.k of one
//   head waited on its two chains); a head's four sums are one reduce4, its four scores one store.
template <int kHeads, class Rows>
HWY_INLINE void dots4(const float* const* q, const Rows& k, std::int64_t t, std::int64_t len,
                      float* out) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  hn::Vec<DF> acc[kHeads][4];
  for (int x = 0; x < kHeads; ++x)
    for (int key = 0; key < 4; ++key) acc[x][key] = hn::Zero(df);
  const auto step = [&](std::int64_t j, const hn::Vec<DF>* kv) HWY_ATTR {
    for (int x = 0; x < kHeads; ++x) {
      auto qx = hn::LoadU(df, q[x] + j);
      in_register(qx);
      for (int key = 0; key < 4; ++key) acc[x][key] = hn::MulAdd(qx, kv[key], acc[x][key]);
    }
  };
  std::int64_t j = 0;
  if constexpr (Rows::kPairs) {  // two vectors widened at once, used in the same order
    for (; j + 2 * n <= len; j += 2 * n) {
      hn::Vec<DF> lo[4], hi[4];
      for (int key = 0; key < 4; ++key) k.load2(t + key, j, lo[key], hi[key]);
      step(j, lo);
      step(j + n, hi);
    }
  }
  for (; j < len; j += n) {
    hn::Vec<DF> kv[4];
    for (int key = 0; key < 4; ++key) kv[key] = k.load(t + key, j);
    step(j, kv);
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  hn::Vec<DF> u[4];
  for (int x = 0; x < 4; ++x) {
    const int h = x < kHeads ? x : kHeads - 1;  // a missing head repeats the last; not stored
    u[x] = block_sums4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
  }
  // Blocks (0 + 2) and (1 + 3) of heads 0 and 1 (2 and 3), then their sums: block x of z is
  // head x's four scores, each (s0 + s2) + (s1 + s3) over its block sums, as combine_blocks adds.
  const __m512 r01 =
      hn::Add(hn::ConcatLowerLower(df, u[1], u[0]), hn::ConcatUpperUpper(df, u[1], u[0])).raw;
  const __m512 r23 =
      hn::Add(hn::ConcatLowerLower(df, u[3], u[2]), hn::ConcatUpperUpper(df, u[3], u[2])).raw;
  const __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(r01, r23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(r01, r23, _MM_SHUFFLE(3, 1, 3, 1)));
  _mm_storeu_ps(out + t, _mm512_castps512_ps128(z));
  if constexpr (kHeads >= 2) _mm_storeu_ps(out + kTileTokens + t, _mm512_extractf32x4_ps(z, 1));
  if constexpr (kHeads >= 3) {
    _mm_storeu_ps(out + 2 * kTileTokens + t, _mm512_extractf32x4_ps(z, 2));
  }
  if constexpr (kHeads >= 4) {
    _mm_storeu_ps(out + 3 * kTileTokens + t, _mm512_extractf32x4_ps(z, 3));
  }
#else
  for (int x = 0; x < kHeads; ++x)
    reduce4(acc[x][0], acc[x][1], acc[x][2], acc[x][3], out + x * kTileTokens + t);
#endif
}

// dots4 for `heads` (1 to kDots4MaxHeads) query rows.
template <class Rows>
HWY_INLINE void dots4_heads(std::int64_t heads, const float* const* q, const Rows& k,
                            std::int64_t t, std::int64_t len, float* out) {
  if constexpr (kDots4MaxHeads == 4) {
    if (heads == 4) return dots4<4>(q, k, t, len, out);
    if (heads == 3) return dots4<3>(q, k, t, len, out);
  }
  if (heads == 2) return dots4<2>(q, k, t, len, out);
  return dots4<1>(q, k, t, len, out);
}

// The next tile's K and V rows of one KV head, asked for into L2 (prefetch_l2) a row at a time,
// K's while this tile's scores are computed (more_k, upto_k), V's while its weights meet V
// (more_v), so the requests spread over the whole tile as the kernel's own loads do. Asked for
// all at once (64 lines for a head of 128 in fp8), they filled the line-fill buffers and the core
// stalled on the prefetches; K's and V's rows together during the scores alone left the reads of
// p.V without requests beside them (docs/kernels.md, "Prefetch beside the work").
struct NextRows {
  const std::byte* k = nullptr;
  const std::byte* v = nullptr;
  std::int64_t rows = 0, k_stride = 0, v_stride = 0, k_bytes = 0, v_bytes = 0;
  std::int64_t k_done = 0, v_done = 0;
  HWY_INLINE void upto_k(std::int64_t r) {
    for (; k_done < std::min(r, rows); ++k_done)
      for (std::int64_t i = 0; i < k_bytes; i += 64) prefetch_l2(k + k_done * k_stride + i);
  }
  HWY_INLINE void upto_v(std::int64_t r) {
    for (; v_done < std::min(r, rows); ++v_done)
      for (std::int64_t i = 0; i < v_bytes; i += 64) prefetch_l2(v + v_done * v_stride + i);
  }
  HWY_INLINE void more_k() { upto_k(k_done + 1); }
  HWY_INLINE void more_v() { upto_v(v_done + 1); }
  // Both, up to row r (the AMX path, which asks between its phases).
  HWY_INLINE void upto(std::int64_t r) {
    upto_k(r);
    upto_v(r);
  }
  HWY_INLINE void more(std::int64_t r) { upto(std::max(k_done, v_done) + r); }
  HWY_INLINE void all() { upto(rows); }
};

// o = o * c + sum over t in [a, b] of p[t] * v[t], `len` floats (a multiple of
// the vector). Eight, four or one vector of o stay in registers over the whole tile; each lane
// sums the tokens in order, whatever the grouping (accumulate_heads below gives the same bits).
template <class Rows>
void accumulate(float* o, float c, const float* p, std::int64_t a, std::int64_t b, const Rows& v,
                std::int64_t len, NextRows* next) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const auto vc = hn::Set(df, c);
  const auto start = [&](std::int64_t j) { return hn::Mul(hn::LoadU(df, o + j), vc); };
  std::int64_t j = 0;
  for (; j + 8 * n <= len; j += 8 * n) {
    auto a0 = start(j), a1 = start(j + n), a2 = start(j + 2 * n), a3 = start(j + 3 * n);
    auto a4 = start(j + 4 * n), a5 = start(j + 5 * n), a6 = start(j + 6 * n), a7 = start(j + 7 * n);
    for (std::int64_t t = a; t <= b; ++t) {
      next->more_v();
      const auto w = hn::Set(df, p[t]);
      // Two vectors of the row at a time, each into its sums before the next two are read: with
      // all eight read first, AVX2's 16 registers could not hold them beside the 8 sums and the
      // weight, and one sum lived on the stack, its chain a store and a load longer a token.
      hn::Vec<DF> x, y;
      v.load2(t, j, x, y);
      a0 = hn::MulAdd(w, x, a0);
      a1 = hn::MulAdd(w, y, a1);
      v.load2(t, j + 2 * n, x, y);
      a2 = hn::MulAdd(w, x, a2);
      a3 = hn::MulAdd(w, y, a3);
      v.load2(t, j + 4 * n, x, y);
      a4 = hn::MulAdd(w, x, a4);
      a5 = hn::MulAdd(w, y, a5);
      v.load2(t, j + 6 * n, x, y);
      a6 = hn::MulAdd(w, x, a6);
      a7 = hn::MulAdd(w, y, a7);
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
  for (; j < len; j += n) {
    auto a0 = start(j);
    for (std::int64_t t = a; t <= b; ++t) a0 = hn::MulAdd(hn::Set(df, p[t]), v.load(t, j), a0);
    hn::StoreU(a0, df, o + j);
  }
}

// accumulate for kHeads (2 to 4) heads sharing each V row: every V vector is loaded (decoded)
// once for all of them. p[x] are head x's weights, kTileTokens apart.
template <int kHeads, class Rows>
void accumulate_heads(float* const* o, const float* c, const float* p, std::int64_t a,
                      std::int64_t b, const Rows& v, std::int64_t len, NextRows* next) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const auto start = [&](int x, std::int64_t j) {
    return hn::Mul(hn::LoadU(df, o[x] + j), hn::Set(df, c[x]));
  };
  // Heads beyond kHeads repeat the last one's weights; their sums are dropped (never stored).
  const float* p0 = p;
  const float* p1 = p + kTileTokens;
  const float* p2 = p + (kHeads > 2 ? 2 : 1) * kTileTokens;
  const float* p3 = p + (kHeads - 1) * kTileTokens;
  const int x2 = kHeads > 2 ? 2 : 1;
  const int x3 = kHeads - 1;
  std::int64_t j = 0;
  if constexpr (kWideRegisterFile || kHeads == 2) {
    // Four vectors of every head at once where the registers hold them (AVX-512; two heads on
    // AVX2): with two, 3 heads gave 6 chains of one multiply-add a token each, fewer than the
    // adds' latency times the units (SmolLM2's 64-wide heads), and two heads 4.
    for (; j + 4 * n <= len; j += 4 * n) {
      hn::Vec<DF> acc[4][4];
      for (int x = 0; x < kHeads; ++x)
        for (int e = 0; e < 4; ++e) acc[x][e] = start(x, j + e * n);
      // (AVX2 asks for the next tile's V rows a pass's share at a time, as below.)
      if constexpr (!kWideRegisterFile) next->upto_v(next->rows * (j + 4 * n) / len);
      for (std::int64_t t = a; t <= b; ++t) {
        if constexpr (kWideRegisterFile) next->more_v();
        hn::Vec<DF> y[4];
        v.load2(t, j, y[0], y[1]);
        v.load2(t, j + 2 * n, y[2], y[3]);
        for (int x = 0; x < kHeads; ++x) {
          const auto w = hn::Set(df, p[x * kTileTokens + t]);
          for (int e = 0; e < 4; ++e) acc[x][e] = hn::MulAdd(w, y[e], acc[x][e]);
        }
      }
      for (int x = 0; x < kHeads; ++x)
        for (int e = 0; e < 4; ++e) hn::StoreU(acc[x][e], df, o[x] + j + e * n);
    }
  }
  for (; j + 2 * n <= len; j += 2 * n) {
    auto a0 = start(0, j), b0 = start(0, j + n), a1 = start(1, j), b1 = start(1, j + n);
    auto a2 = start(x2, j), b2 = start(x2, j + n), a3 = start(x3, j), b3 = start(x3, j + n);
    // The next tile's V rows asked for a pass's share at a time, not a row a token: on AVX2's
    // 16-element passes the per-token check and call cost a third of the loop's instructions
    // (paged bf16 decode on a Zen 3 took 8-30% less; docs/kernels-speed.md, "A Zen 3 sitting").
    next->upto_v(next->rows * (j + 2 * n) / len);
    for (std::int64_t t = a; t <= b; ++t) {
      hn::Vec<DF> x, y;
      v.load2(t, j, x, y);
      const auto w0 = hn::Set(df, p0[t]), w1 = hn::Set(df, p1[t]);
      a0 = hn::MulAdd(w0, x, a0);
      b0 = hn::MulAdd(w0, y, b0);
      a1 = hn::MulAdd(w1, x, a1);
      b1 = hn::MulAdd(w1, y, b1);
      if constexpr (kHeads >= 3) {
        const auto w2 = hn::Set(df, p2[t]);
        a2 = hn::MulAdd(w2, x, a2);
        b2 = hn::MulAdd(w2, y, b2);
      }
      if constexpr (kHeads >= 4) {
        const auto w3 = hn::Set(df, p3[t]);
        a3 = hn::MulAdd(w3, x, a3);
        b3 = hn::MulAdd(w3, y, b3);
      }
    }
    hn::StoreU(a0, df, o[0] + j), hn::StoreU(b0, df, o[0] + j + n);
    hn::StoreU(a1, df, o[1] + j), hn::StoreU(b1, df, o[1] + j + n);
    if constexpr (kHeads >= 3) hn::StoreU(a2, df, o[2] + j), hn::StoreU(b2, df, o[2] + j + n);
    if constexpr (kHeads >= 4) hn::StoreU(a3, df, o[3] + j), hn::StoreU(b3, df, o[3] + j + n);
  }
  for (; j < len; j += n) {
    auto a0 = start(0, j), a1 = start(1, j), a2 = start(x2, j), a3 = start(x3, j);
    for (std::int64_t t = a; t <= b; ++t) {
      const auto x = v.load(t, j);
      a0 = hn::MulAdd(hn::Set(df, p0[t]), x, a0);
      a1 = hn::MulAdd(hn::Set(df, p1[t]), x, a1);
      if constexpr (kHeads >= 3) a2 = hn::MulAdd(hn::Set(df, p2[t]), x, a2);
      if constexpr (kHeads >= 4) a3 = hn::MulAdd(hn::Set(df, p3[t]), x, a3);
    }
    hn::StoreU(a0, df, o[0] + j);
    hn::StoreU(a1, df, o[1] + j);
    if constexpr (kHeads >= 3) hn::StoreU(a2, df, o[2] + j);
    if constexpr (kHeads >= 4) hn::StoreU(a3, df, o[3] + j);
  }
}

template <class V>
void grow(V& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
}

// What every tile of a task shares.
struct TaskState {
  const AttentionSpec* spec;
  const AttendTask* task;
  AttendScratch* s;
  std::int64_t first_pos, nq, nh, group, dp, dvp, tile_pad;
  float scale, cap;
  bool capped;
  NextRows* next;  // this head's rows of the next tile, to prefetch
};

// f(integral_constant<int, heads>) for a group of 1 to 4 heads.
template <class F>
HWY_INLINE void with_heads(std::int64_t heads, F&& f) {
  switch (heads) {
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    default:
      return f(std::integral_constant<int, 1>{});
  }
}

// The online-softmax step over tile keys [a, b] of kHeads (1 to 4) (query, head) states that see
// the same keys; state x's raw dots are at sc + x * stride, its running max and sum at *m[x] and
// *l[x]. Three phases, each over all the states (their chains overlap; each state's bits are its
// own whatever the others are):
// - the logits (scaled, capped, -inf outside [a, b]) in place, and each state's max of them;
// - the running max and sum updated, with in c[x] the factor the accumulator must be scaled by (1
//   exactly where the max holds, which scales to the same bits, so every step scales);
// - the weights into probs + x * stride (zero outside [a, b]), added to the sum.
// The states' maxima and sums are taken across their lanes together (across4) and the rescale's
// exponentials in one vector, not a libm exp (a call: every vector register clobbered) and two
// lane reductions a state (docs/kernels-speed.md, "The softmax across the heads").
template <int kHeads>
HWY_INLINE void softmax_tile(const TaskState& ts, float* sc, std::int64_t stride, std::int64_t a,
                             std::int64_t b, float* const* m, float* const* l, float* probs,
                             float* c) {
  static_assert(kHeads >= 1 && kHeads <= 4);
  const DF df;
  const hn::RebindToSigned<DF> di;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const auto neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  // Lanes t with a <= t <= b (signed Gt/Lt are what every target has).
  const auto va = hn::Set(di, static_cast<std::int32_t>(a - 1));
  const auto vb = hn::Set(di, static_cast<std::int32_t>(b + 1));
  const auto lane = hn::Iota(di, 0);
  // A missing state's vectors stay -inf (max) and zero (sum): combined, never stored.
  hn::Vec<DF> top[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
  for (std::int64_t j = 0; j < ts.tile_pad; j += n) {
    const auto idx = hn::Add(lane, hn::Set(di, static_cast<std::int32_t>(j)));
    const auto mask = hn::RebindMask(df, hn::And(hn::Gt(idx, va), hn::Lt(idx, vb)));
    for (int x = 0; x < kHeads; ++x) {
      float* row = sc + x * stride + j;
      auto v = hn::Mul(hn::LoadU(df, row), hn::Set(df, ts.scale));
      if (ts.capped) {
        const auto y = hn::Mul(v, hn::Set(df, 1.0f / ts.cap));
        // Highway's Tanh, like its Exp, does not pass NaN through; keep it.
        v = hn::Mul(hn::Set(df, ts.cap), hn::IfThenElse(hn::IsNaN(y), y, hn::Tanh(df, y)));
      }
      v = hn::IfThenElse(mask, v, neg_inf);
      hn::StoreU(v, df, row);
      top[x] = hn::Max(top[x], v);
    }
  }
  float tile_max[4];
  across4(LaneMax(), top[0], top[1], top[2], top[3], tile_max);

  // Without a branch: whether a tile raises the max is as good as random, and a mispredicted
  // jump threw away the work the core had run ahead on (about 6% of SmolLM2's one-row attention
  // on a Zen 5). A missing state's lanes hold zeros: a factor of 1, never stored.
  float mv[4] = {}, lv[4] = {}, cv[4];
  for (int x = 0; x < kHeads; ++x) mv[x] = *m[x], lv[x] = *l[x];
  const hn::CappedTag<float, 4> d4;
  for (std::size_t x = 0; x < 4; x += hn::Lanes(d4)) {
    const auto top_x = hn::LoadU(d4, tile_max + x);
    const auto old = hn::LoadU(d4, mv + x);
    const auto up = hn::Gt(top_x, old);
    const auto factor = hn::Exp(d4, hn::IfThenElseZero(up, hn::Sub(old, top_x)));
    hn::StoreU(factor, d4, cv + x);
    hn::StoreU(hn::Mul(hn::LoadU(d4, lv + x), factor), d4, lv + x);
    hn::StoreU(hn::IfThenElse(up, top_x, old), d4, mv + x);
  }

  hn::Vec<DF> total[4] = {hn::Zero(df), hn::Zero(df), hn::Zero(df), hn::Zero(df)};
  hn::Vec<DF> vm[kHeads];
  for (int x = 0; x < kHeads; ++x) vm[x] = hn::Set(df, mv[x]);
  for (std::int64_t j = 0; j < ts.tile_pad; j += n) {
    for (int x = 0; x < kHeads; ++x) {
      const auto y = hn::Sub(hn::LoadU(df, sc + x * stride + j), vm[x]);
      // Highway's Exp gives 0 for NaN; keep NaN so a bad logit shows in the output.
      const auto e = hn::IfThenElse(hn::IsNaN(y), y, hn::Exp(df, y));
      hn::StoreU(e, df, probs + x * stride + j);
      total[x] = hn::Add(total[x], e);
    }
  }
  float sums[4];
  across4(LaneAdd(), total[0], total[1], total[2], total[3], sums);
  for (int x = 0; x < kHeads; ++x) {
    *m[x] = mv[x];
    *l[x] = lv[x] + sums[x];
    c[x] = cv[x];
  }
}

// One tile of KV head hk (keys t0 .. t0 + tile - 1) for every query and head of the task; K rows
// `k` of `k_len` floats (a multiple of the vector), V rows `v` of `v_len`.
template <class KRows, class VRows>
void attend_tile(const TaskState& ts, const KRows& k, const VRows& v, std::int64_t k_len,
                 std::int64_t v_len, std::int64_t t0, std::int64_t tile, std::int64_t hk) {
  const AttendTask& task = *ts.task;
  AttendScratch& s = *ts.s;
  const attn::AttentionParams& params = ts.spec->params;
  const std::int64_t hb = std::max(task.h_begin, hk * ts.group);
  const std::int64_t he = std::min(task.h_end, (hk + 1) * ts.group);
  for (std::int64_t i = 0; i < ts.nq; ++i) {
    const KeyRange range = key_range(params, ts.first_pos + task.q_begin + i, task.seq->kv_len);
    const std::int64_t a = std::max(range.lo, t0) - t0;
    const std::int64_t b = std::min(range.hi, t0 + tile - 1) - t0;
    if (a > b) continue;
    for (std::int64_t h0 = hb, heads = 0; h0 < he; h0 += heads) {
      heads = std::min<std::int64_t>(4, he - h0);
      const std::int64_t state0 = i * ts.nh + h0 - task.h_begin;
      const float* q[4];
      for (int x = 0; x < heads; ++x) q[x] = s.q.data() + (state0 + x) * ts.dp;
      float* sc = s.scores.data();
      std::int64_t t = a;
      if (heads <= kDots4MaxHeads) {
        for (; t + 3 <= b; t += 4) {
          ts.next->upto_k(t + 4);
          dots4_heads(heads, q, k, t, k_len, sc);
        }
      }
      for (; t + 1 <= b; t += 2) {
        ts.next->upto_k(t + 2);
        dots_heads<2>(heads, q, k, t, k_len, sc);
      }
      if (t <= b) dots_heads<1>(heads, q, k, t, k_len, sc);
      ts.next->upto_k(ts.next->rows);
      float* o[4];
      float c[4];
      float* m[4];
      float* l[4];
      for (int x = 0; x < heads; ++x) {
        const auto st = static_cast<std::size_t>(state0 + x);
        m[x] = &s.max[st], l[x] = &s.sum[st];
        o[x] = s.acc.data() + (state0 + x) * ts.dvp;
      }
      with_heads(heads, [&](auto group) {
        softmax_tile<decltype(group)::value>(ts, sc, kTileTokens, a, b, m, l, s.probs.data(), c);
      });
      switch (heads) {
        case 4:
          accumulate_heads<4>(o, c, s.probs.data(), a, b, v, v_len, ts.next);
          break;
        case 3:
          accumulate_heads<3>(o, c, s.probs.data(), a, b, v, v_len, ts.next);
          break;
        case 2:
          accumulate_heads<2>(o, c, s.probs.data(), a, b, v, v_len, ts.next);
          break;
        default:
          accumulate(o[0], c[0], s.probs.data(), a, b, v, v_len, ts.next);
          break;
      }
    }
  }
  ts.next->all();
}

template <DType kT, bool kNanFree = false>
void attend_tile_cache(const TaskState& ts, const std::byte* k_src, const std::byte* v_src,
                       const PageLayout& p, std::int64_t t0, std::int64_t tile, std::int64_t hk) {
  const AttentionSpec& spec = *ts.spec;
  if constexpr (kT == DType::kFp8E4m3 && kPairedDecode<kT> && !kNanFree) {
    // e4m3's NaN test is a quarter of its widening; one pass over the tile's codes of the head
    // (in the cache by now, read again from L1 by the products) lets a tile without NaN, every
    // tile of a sane cache, skip it.
    const bool nan = any_e4m3_nan(k_src, p.k_row_stride, tile, spec.head_size) ||
                     (!spec.mla && any_e4m3_nan(v_src, p.v_row_stride, tile, spec.head_size_v));
    if (!nan) return attend_tile_cache<kT, true>(ts, k_src, v_src, p, t0, tile, hk);
  }
  const CacheRows<kT, kNanFree> k{k_src, p.k_row_stride};
  // MLA: the value is the latent's first dv elements.
  const CacheRows<kT, kNanFree> v = spec.mla ? k : CacheRows<kT, kNanFree>{v_src, p.v_row_stride};
  attend_tile(ts, k, v, spec.head_size, spec.head_size_v, t0, tile, hk);
}

// ---- AttentionOrder::kBf16Pairs (docs/kernels.md, "The bf16-pair attention order") ----------
// q.k: per (query row, head, key), two float chains over the head's element pairs (p = 0, 1, ...:
// elements 2p and 2p + 1): chain A takes the even p, chain B the odd p; each adds the product of
// element 2p + 1, then that of element 2p (q rounded to bf16 times K's codes: exact in float),
// each addition rounded; the score is A + B. p.V: the tile's softmax weights rounded to bf16;
// per pair of tile tokens (2m, 2m + 1), in order, each output element adds p[2m + 1] v[2m + 1],
// then p[2m] v[2m]. A token outside the query's keys (or past the tile) adds a zero weight times
// a zero row. The whole task runs with FTZ and DAZ (bf16_pairs.hpp): that is VDPBF16PS lane for
// lane (the keys of a tile across its lanes for q.k, the output elements for p.V), and the paths
// without it add the same products in the same order.

// e4m3 caches in the pair order: every e4m3 code is a bf16 value exactly (in units of
// code_unit: value / 256, from 2^-17 to 1.75, normal in bf16), so the order runs on the codes
// widened to bf16 as a tile is read, with the same arithmetic as a bf16 cache. The widening looks
// the magnitude up in a table of their bf16 codes and puts the sign back: no floating-point
// instruction on the cache's codes, so the task's FTZ and DAZ cannot touch e4m3's subnormals.

// The bf16 codes of e4m3's 128 magnitudes in units of code_unit (NaN for 0x7F), from `table`
// (fp8_table's values, which every path decodes by): exact, a float of at most 4 significant
// bits having a zero low half.
void e4m3_magnitudes_bf16(const float* table, std::uint16_t* out) {
  for (std::size_t em = 0; em < 128; ++em) {
    const float unit = table[em] * code_unit(DType::kFp8E4m3);
    std::uint32_t bits;
    std::memcpy(&bits, &unit, sizeof bits);
    out[em] = static_cast<std::uint16_t>(bits >> 16);
  }
}

HWY_INLINE std::uint16_t e4m3_bf16(const std::uint16_t* magnitudes, std::byte code) {
  const auto c = std::to_integer<unsigned>(code);
  return static_cast<std::uint16_t>(magnitudes[c & 0x7F] | ((c & 0x80) << 8));
}

// `rows` rows of `len` e4m3 codes (`stride` bytes apart) as bf16 codes, `len` a row in dst;
// `magnitudes` from e4m3_magnitudes_bf16, 64-byte aligned.
void widen_e4m3_rows(const std::uint16_t* magnitudes, const std::byte* src, std::int64_t stride,
                     std::int64_t rows, std::int64_t len, std::uint16_t* dst) {
  std::int64_t r = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // 32 codes at a time: the magnitude's 7 bits index two 64-entry halves of the table
  // (VPERMI2W), bit 6 picks the half, and the sign goes to bit 15.
  const __m512i t0 = _mm512_load_si512(magnitudes);
  const __m512i t1 = _mm512_load_si512(magnitudes + 32);
  const __m512i t2 = _mm512_load_si512(magnitudes + 64);
  const __m512i t3 = _mm512_load_si512(magnitudes + 96);
  const __m512i sign = _mm512_set1_epi16(static_cast<short>(0x8000));
  for (; r < rows; ++r) {
    const std::byte* row = src + r * stride;
    std::uint16_t* out = dst + r * len;
    std::int64_t j = 0;
    for (; j + 32 <= len; j += 32) {
      const __m512i c =
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + j)));
      const __m512i low = _mm512_permutex2var_epi16(t0, c, t1);
      const __m512i high = _mm512_permutex2var_epi16(t2, c, t3);
      const __m512i mag =
          _mm512_mask_blend_epi16(_mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40)), low, high);
      const __m512i w = _mm512_or_si512(mag, _mm512_and_si512(_mm512_slli_epi16(c, 8), sign));
      _mm512_storeu_si512(out + j, w);
    }
    for (; j < len; ++j) out[j] = e4m3_bf16(magnitudes, row[j]);
  }
#endif
  for (; r < rows; ++r)
    for (std::int64_t j = 0; j < len; ++j)
      dst[r * len + j] = e4m3_bf16(magnitudes, src[r * stride + j]);
}

// Heads of up to 512 elements (validate): the row a pair's missing token reads.
alignas(64) constexpr std::uint16_t kZeroRow[512] = {};

using DP = hn::CappedTag<float, 16>;  // the order's 16 lanes, in one or more vectors

// A float whose bits are `bits` (a bf16 code in the top half).
HWY_INLINE float float_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The 16 weights of a tile rounded to bf16 (float_to_bf16's bits: to nearest even, a NaN kept
// quiet) and paired: pairs[m] holds weight 2m in its low half, 2m + 1 in its high half.
HWY_INLINE void round_pairs(const float* probs, std::uint32_t* pairs) {
  const DP df;
  const hn::RebindToUnsigned<DP> du;
  const hn::Rebind<std::uint16_t, DP> d16;
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(DP()));
  std::uint16_t codes[kTileTokens];
  for (std::int64_t j = 0; j < kTileTokens; j += n) {
    const auto v = hn::LoadU(df, probs + j);
    const auto u = hn::BitCast(du, v);
    const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)), odd));
    const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
    const auto code = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
    hn::StoreU(hn::TruncateTo(d16, code), d16, codes + j);
  }
  std::memcpy(pairs, codes, sizeof codes);
}

// K of a tile transposed: kt[p * 16 + t] = key t's elements 2p and 2p + 1 (its p-th 32 bits),
// zeros for t past the tile; `len` elements a key (a multiple of 32).
HWY_INLINE void transpose_keys(const std::byte* k, std::int64_t stride, std::int64_t tile,
                               std::int64_t len, std::uint32_t* kt) {
  const std::int64_t pairs = len / 2;
#if HWY_TARGET == HWY_AVX2
  // 8 x 8 blocks of 32-bit words: unpack 32 and 64 bits within 128-bit halves, then swap halves.
  // A word at a time, the transpose took more of a Zen 3's one-row decode than q.k and p.V.
  for (std::int64_t t0 = 0; t0 < kTileTokens; t0 += 8) {
    const std::byte* row[8];
    for (std::int64_t i = 0; i < 8; ++i) {
      row[i] = t0 + i < tile ? k + (t0 + i) * stride : reinterpret_cast<const std::byte*>(kZeroRow);
    }
    for (std::int64_t q0 = 0; q0 < pairs; q0 += 8) {
      __m256i r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[i] + 4 * q0));
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);          // words 0 and 4 of rows i..i + 3
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);      // 1 and 5
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);  // 2 and 6
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);  // 3 and 7
      }
      std::uint32_t* out = kt + q0 * kTileTokens + t0;
      for (int w = 0; w < 4; ++w) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + w * kTileTokens),
                            _mm256_permute2x128_si256(u[w], u[4 + w], 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (w + 4) * kTileTokens),
                            _mm256_permute2x128_si256(u[w], u[4 + w], 0x31));
      }
    }
  }
#else
  for (std::int64_t t = 0; t < kTileTokens; ++t) {
    for (std::int64_t q = 0; q < pairs; ++q) {
      std::uint32_t w = 0;
      if (t < tile) std::memcpy(&w, k + t * stride + 4 * q, 4);
      kt[q * kTileTokens + t] = w;
    }
  }
#endif
}

// The scores of kHeads query rows (bf16 codes) against the tile's keys (kt, transposed), `len`
// elements (a multiple of 32): sc[x * kTileTokens + t]. Every target, in float lanes.
template <int kHeads>
HWY_INLINE void pair_scores(const std::uint16_t* const* q, const std::uint32_t* kt,
                            std::int64_t len, float* sc, NextRows* next) {
  const DP df;
  const hn::RebindToUnsigned<DP> du;
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(DP()));
  constexpr std::int64_t kSub = 16 / n;
  const auto top = hn::Set(du, 0xFFFF0000u);
  hn::Vec<DP> chain[2][kHeads][kSub];
  for (auto& c : chain)
    for (int x = 0; x < kHeads; ++x)
      for (std::int64_t v = 0; v < kSub; ++v) c[x][v] = hn::Zero(df);
  for (std::int64_t p = 0; p < len / 2; ++p) {
    if (p % 2 == 0) next->more_k();
    auto& c = chain[p % 2];
    for (std::int64_t v = 0; v < kSub; ++v) {
      const auto w = hn::LoadU(du, kt + p * kTileTokens + v * n);
      const auto k_odd = hn::BitCast(df, hn::And(w, top));
      const auto k_even = hn::BitCast(df, hn::ShiftLeft<16>(w));
      for (int x = 0; x < kHeads; ++x) {
        const std::uint32_t qe = q[x][2 * p], qo = q[x][2 * p + 1];
        c[x][v] = hn::MulAdd(hn::Set(df, float_bits(qo << 16)), k_odd, c[x][v]);
        c[x][v] = hn::MulAdd(hn::Set(df, float_bits(qe << 16)), k_even, c[x][v]);
      }
    }
  }
  for (int x = 0; x < kHeads; ++x)
    for (std::int64_t v = 0; v < kSub; ++v)
      hn::StoreU(hn::Add(chain[0][x][v], chain[1][x][v]), df, sc + x * kTileTokens + v * n);
}

// One pass of pair_accumulate in float lanes over elements j .. j + kVecs * n - 1: the
// accumulators stay in registers over the pairs.
template <int kHeads, int kVecs>
HWY_INLINE void pair_accumulate_floats(float* const* o, const float* c, const std::uint32_t* pw,
                                       std::int64_t m_lo, std::int64_t m_hi,
                                       const std::byte* const* rows, std::int64_t j) {
  const DP df;
  const hn::RebindToUnsigned<DP> du;
  const hn::Rebind<std::uint16_t, DP> d16;
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(DP()));
  const auto widen = [&](const std::byte* row, std::int64_t e) HWY_ATTR {
    const auto u =
        hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(row) + e));
    return hn::BitCast(df, hn::ShiftLeft<16>(u));
  };
  hn::Vec<DP> acc[kHeads][kVecs];
  for (int x = 0; x < kHeads; ++x) {
    for (int e = 0; e < kVecs; ++e)
      acc[x][e] = hn::Mul(hn::LoadU(df, o[x] + j + e * n), hn::Set(df, c[x]));
  }
  for (std::int64_t m = m_lo; m <= m_hi; ++m) {
    hn::Vec<DP> v_even[kVecs], v_odd[kVecs];
    for (int e = 0; e < kVecs; ++e) {
      v_even[e] = widen(rows[2 * m], j + e * n);
      v_odd[e] = widen(rows[2 * m + 1], j + e * n);
    }
    for (int x = 0; x < kHeads; ++x) {
      const std::uint32_t w = pw[x * kTileTokens + m];
      const auto w_odd = hn::Set(df, float_bits(w & 0xFFFF0000u));
      const auto w_even = hn::Set(df, float_bits(w << 16));
      for (int e = 0; e < kVecs; ++e) {
        acc[x][e] = hn::MulAdd(w_odd, v_odd[e], acc[x][e]);
        acc[x][e] = hn::MulAdd(w_even, v_even[e], acc[x][e]);
      }
    }
  }
  for (int x = 0; x < kHeads; ++x)
    for (int e = 0; e < kVecs; ++e) hn::StoreU(acc[x][e], df, o[x] + j + e * n);
}

// o[x] (element order) = o[x] * c[x], then the pairs m_lo..m_hi of head x's
// weights (pw[x * kTileTokens + m]) times the rows (rows[t]: token t's V row or kZeroRow). Up to
// 4 heads take two vectors a pass: 8 chains, as the multiply-adds' latency times their units
// asks (with one vector, a decode's 4 heads ran 4 chains: half the units' rate on AVX2).
template <int kHeads>
HWY_INLINE void pair_accumulate(float* const* o, const float* c, const std::uint32_t* pw,
                                std::int64_t m_lo, std::int64_t m_hi, const std::byte* const* rows,
                                std::int64_t len, NextRows* next) {
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(DP()));
  constexpr int kVecs = kHeads <= 4 ? 2 : 1;
  std::int64_t j = 0;
  // The next tile's V rows a pass's share at a time (as accumulate_heads asks).
  for (; j + kVecs * n <= len; j += kVecs * n) {
    next->upto_v(next->rows * (j + kVecs * n) / len);
    pair_accumulate_floats<kHeads, kVecs>(o, c, pw, m_lo, m_hi, rows, j);
  }
  for (; j < len; j += n) pair_accumulate_floats<kHeads, 1>(o, c, pw, m_lo, m_hi, rows, j);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// The same on VDPBF16PS (checked at run time: Highway's AVX3 target does not imply AVX512-BF16),
// with the target's own features (HWY_TARGET_STR) so this namespace's helpers inline.
#define MIXKV_ATTN_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#define MIXKV_ATTN_HAS_BF16_DOTS 1

MIXKV_ATTN_BF16_ATTR HWY_INLINE __m512bh attn_bf16_pairs(__m512i v) {
  return (__m512bh)v;  // NOLINT(google-readability-casting): GCC's vector cast
}

// transpose_keys on AVX-512: per 32 elements, the 16 keys' 64 bytes as a 16 x 16 transpose of
// 32-bit words (unpack 32 and 64 bits, then two rounds of 128-bit lane shuffles).
MIXKV_ATTN_BF16_ATTR HWY_NOINLINE void transpose_keys_dots(const std::byte* k, std::int64_t stride,
                                                           std::int64_t tile, std::int64_t len,
                                                           std::uint32_t* kt) {
  const std::int64_t blocks = len / 32;
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    __m512i r[16], t[16], u[16], v[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = i < tile ? _mm512_loadu_si512(k + i * stride + 64 * blk) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
      u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // u[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c.
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      v[c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);           // columns c, 8 + c: rows 0-7
      v[4 + c] = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);       // columns 4 + c, 12 + c
      v[8 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);  // rows 8-15
      v[12 + c] = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    }
    std::uint32_t* out = kt + blk * 16 * kTileTokens;
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      _mm512_storeu_si512(out + c * kTileTokens, _mm512_shuffle_i32x4(v[c], v[8 + c], 0x88));
      _mm512_storeu_si512(out + (c + 8) * kTileTokens, _mm512_shuffle_i32x4(v[c], v[8 + c], 0xDD));
    }
  }
}

// pair_scores on VDPBF16PS: one instruction per element pair adds it for 16 keys.
template <int kHeads>
MIXKV_ATTN_BF16_ATTR HWY_NOINLINE void pair_scores_dots(const std::uint16_t* const* q,
                                                        const std::uint32_t* kt, std::int64_t len,
                                                        float* sc, NextRows* next) {
  __m512 a[kHeads], b[kHeads];
#pragma GCC unroll 8
  for (int x = 0; x < kHeads; ++x) a[x] = b[x] = _mm512_setzero_ps();
  std::uint32_t q32[kHeads];
  for (std::int64_t p = 0; p < len / 2; p += 2) {
    next->more_k();
    const __m512bh k0 = attn_bf16_pairs(_mm512_loadu_si512(kt + p * kTileTokens));
    const __m512bh k1 = attn_bf16_pairs(_mm512_loadu_si512(kt + (p + 1) * kTileTokens));
#pragma GCC unroll 8
    for (int x = 0; x < kHeads; ++x) {
      // q's pair broadcast, as the operand VDPBF16PS could read broadcast from memory (GCC 12
      // still emits a separate VPBROADCASTD for it).
      std::memcpy(&q32[x], q[x] + 2 * p, 4);
      a[x] =
          _mm512_dpbf16_ps(a[x], k0, attn_bf16_pairs(_mm512_set1_epi32(static_cast<int>(q32[x]))));
      std::memcpy(&q32[x], q[x] + 2 * p + 2, 4);
      b[x] =
          _mm512_dpbf16_ps(b[x], k1, attn_bf16_pairs(_mm512_set1_epi32(static_cast<int>(q32[x]))));
    }
  }
#pragma GCC unroll 8
  for (int x = 0; x < kHeads; ++x)
    _mm512_storeu_ps(sc + x * kTileTokens, _mm512_add_ps(a[x], b[x]));
}

// A tile's V as the passes below read it, for the token pairs m_lo..m_hi (rows[t]: token t's row
// or the zero row), `len` elements a row: per pair m and 32 elements, VPUNPCKLWD then VPUNPCKHWD
// of tokens 2m and 2m + 1, at vt[(m * len / 32 + j / 32) * 32 ..]. Made once for all the groups of
// query rows that see the same keys of a tile, whose passes then read 4 KiB side by side and skip
// the unpacks, not a KV head's NHD rows a token apart (2 KiB for 8 KV heads of 128: its V lines
// and K lines fall on a few L1 sets) once a group. On a Zen 5, 5 verify rows at 8k took 4-10% less
// on one thread, 8 rows 11% less on two (docs/kernels.md, "Where a verify's time goes").
MIXKV_ATTN_BF16_ATTR HWY_NOINLINE void interleave_values(const std::byte* const* rows,
                                                         std::int64_t m_lo, std::int64_t m_hi,
                                                         std::int64_t len, std::uint32_t* vt) {
  const std::int64_t blocks = len / 32;
  for (std::int64_t m = m_lo; m <= m_hi; ++m) {
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const __m512i e = _mm512_loadu_si512(rows[2 * m] + 64 * blk);
      const __m512i f = _mm512_loadu_si512(rows[2 * m + 1] + 64 * blk);
      std::uint32_t* out = vt + (m * blocks + blk) * 32;
      _mm512_storeu_si512(out, _mm512_unpacklo_epi16(e, f));
      _mm512_storeu_si512(out + 16, _mm512_unpackhi_epi16(e, f));
    }
  }
}

// One pass of pair_accumulate on VDPBF16PS over elements j.. (kHalves x 32 of them): the
// accumulators stay in registers over the tile's pairs. V from the rows, or (kInterleaved) from
// interleave_values' vt, `len` elements a row.
template <int kHeads, int kHalves, bool kInterleaved>
MIXKV_ATTN_BF16_ATTR HWY_INLINE void pair_accumulate_pass(float* const* o, const float* c,
                                                          const std::uint32_t* pw,
                                                          std::int64_t m_lo, std::int64_t m_hi,
                                                          const std::byte* const* rows,
                                                          const std::uint32_t* vt, std::int64_t len,
                                                          std::int64_t j, NextRows* next) {
  constexpr int kVecs = 2 * kHalves;
  __m512 acc[kHeads][kVecs];
#pragma GCC unroll 8
  for (int x = 0; x < kHeads; ++x) {
#pragma GCC unroll 4
    for (int h = 0; h < kVecs; ++h) {
      acc[x][h] = _mm512_mul_ps(_mm512_loadu_ps(o[x] + j + 16 * h), _mm512_set1_ps(c[x]));
    }
  }
  for (std::int64_t m = m_lo; m <= m_hi; ++m) {
    next->more_v();
    __m512bh pv[kVecs];
#pragma GCC unroll 2
    for (int h = 0; h < kHalves; ++h) {
      if constexpr (kInterleaved) {
        const std::uint32_t* in = vt + (m * (len / 32) + j / 32 + h) * 32;
        pv[2 * h] = attn_bf16_pairs(_mm512_loadu_si512(in));
        pv[2 * h + 1] = attn_bf16_pairs(_mm512_loadu_si512(in + 16));
      } else {
        const __m512i e = _mm512_loadu_si512(rows[2 * m] + 2 * j + 64 * h);
        const __m512i f = _mm512_loadu_si512(rows[2 * m + 1] + 2 * j + 64 * h);
        pv[2 * h] = attn_bf16_pairs(_mm512_unpacklo_epi16(e, f));
        pv[2 * h + 1] = attn_bf16_pairs(_mm512_unpackhi_epi16(e, f));
      }
    }
#pragma GCC unroll 8
    for (int x = 0; x < kHeads; ++x) {
      const __m512bh w =
          attn_bf16_pairs(_mm512_set1_epi32(static_cast<int>(pw[x * kTileTokens + m])));
#pragma GCC unroll 4
      for (int h = 0; h < kVecs; ++h) acc[x][h] = _mm512_dpbf16_ps(acc[x][h], pv[h], w);
    }
  }
#pragma GCC unroll 8
  for (int x = 0; x < kHeads; ++x) {
#pragma GCC unroll 4
    for (int h = 0; h < kVecs; ++h) _mm512_storeu_ps(o[x] + j + 16 * h, acc[x][h]);
  }
}

template <int kHeads, bool kInterleaved>
MIXKV_ATTN_BF16_ATTR HWY_INLINE void pair_accumulate_passes(
    float* const* o, const float* c, const std::uint32_t* pw, std::int64_t m_lo, std::int64_t m_hi,
    const std::byte* const* rows, const std::uint32_t* vt, std::int64_t len, NextRows* next) {
  std::int64_t j = 0;
  if constexpr (kHeads <= 4) {
    for (; j + 64 <= len; j += 64)
      pair_accumulate_pass<kHeads, 2, kInterleaved>(o, c, pw, m_lo, m_hi, rows, vt, len, j, next);
  }
  for (; j < len; j += 32)
    pair_accumulate_pass<kHeads, 1, kInterleaved>(o, c, pw, m_lo, m_hi, rows, vt, len, j, next);
}

// pair_accumulate on VDPBF16PS, 64 elements a pass (32 for the last of an odd count of 32, and
// for 8 states: 16 accumulators either way). Each 32 elements of o stay in VPUNPCKLWD /
// VPUNPCKHWD's order (unpermute_pairs puts them back). vt: the tile's V from interleave_values,
// or null to read the rows.
template <int kHeads>
MIXKV_ATTN_BF16_ATTR HWY_NOINLINE void pair_accumulate_dots(
    float* const* o, const float* c, const std::uint32_t* pw, std::int64_t m_lo, std::int64_t m_hi,
    const std::byte* const* rows, const std::uint32_t* vt, std::int64_t len, NextRows* next) {
  if (vt != nullptr) {
    pair_accumulate_passes<kHeads, true>(o, c, pw, m_lo, m_hi, rows, vt, len, next);
  } else {
    pair_accumulate_passes<kHeads, false>(o, c, pw, m_lo, m_hi, rows, vt, len, next);
  }
}
#endif

// The dots path's accumulators back in element order: per 32, lane s of the first 16 holds
// element 8 (s / 4) + s % 4, of the second 16 element 8 (s / 4) + 4 + s % 4.
[[maybe_unused]] void unpermute_pairs(float* acc, std::int64_t len) {
  for (std::int64_t j = 0; j < len; j += 32) {
    float e[32];
    for (int s = 0; s < 32; ++s) e[8 * ((s % 16) / 4) + (s >= 16 ? 4 : 0) + s % 4] = acc[j + s];
    std::copy(e, e + 32, acc + j);
  }
}

// The scores of kHeads (query row, head) states (q: their bf16 codes) against the tile's keys:
// sc[x * kTileTokens + t].
template <bool kDots, int kHeads>
HWY_INLINE void pair_scores_of(const std::uint16_t* const* q, const std::uint32_t* kt,
                               std::int64_t d, float* sc, NextRows* next) {
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
  if constexpr (kDots) pair_scores_dots<kHeads>(q, kt, d, sc, next);
#endif
  if constexpr (!kDots) pair_scores<kHeads>(q, kt, d, sc, next);
}

// The rest of a tile for kHeads (query row, head) states (states[x], their scores in sc): the
// softmax step, the weights rounded to pairs, and p.V over the keys [a, b] (rows: token t's V
// row, or the zero row), which every state given shares.
template <bool kDots, int kHeads>
HWY_INLINE void pair_group(const TaskState& ts, float* sc, const std::byte* const* rows,
                           std::int64_t a, std::int64_t b, const std::int64_t* states,
                           [[maybe_unused]] const std::uint32_t* vt = nullptr) {
  AttendScratch& s = *ts.s;
  const std::int64_t dv = ts.spec->head_size_v;
  float* o[kHeads];
  float c[kHeads];
  std::uint32_t* pw = s.p_pairs.data();
  // The softmax a phase at a time over up to 4 states (one state after another: 5 verify rows at
  // 8k with the cache near took 7-8% longer on a Zen 5; docs/kernels.md).
  float* m[kHeads];
  float* l[kHeads];
  for (int x = 0; x < kHeads; ++x) {
    const auto st = static_cast<std::size_t>(states[x]);
    m[x] = &s.max[st], l[x] = &s.sum[st];
    o[x] = s.acc.data() + states[x] * ts.dvp;
  }
  constexpr int kGroup = kHeads < 4 ? kHeads : 4;
  static_assert(kHeads % kGroup == 0);
  for (int x = 0; x < kHeads; x += kGroup) {
    softmax_tile<kGroup>(ts, sc + x * kTileTokens, kTileTokens, a, b, m + x, l + x,
                         s.probs.data() + x * kTileTokens, c + x);
  }
  // Weights outside [a, b] are zeros already (softmax_tile).
  for (int x = 0; x < kHeads; ++x)
    round_pairs(s.probs.data() + x * kTileTokens, pw + x * kTileTokens);
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
  if constexpr (kDots) pair_accumulate_dots<kHeads>(o, c, pw, a / 2, b / 2, rows, vt, dv, ts.next);
#endif
  if constexpr (!kDots) pair_accumulate<kHeads>(o, c, pw, a / 2, b / 2, rows, dv, ts.next);
}

// One tile of KV head hk in the bf16-pair order, for every query and head of the task (the
// structure of attend_tile; q from s.q_bf16): K transposed once for all of them. Query rows go
// two at a time: their scores for a group of 4 heads are one call of 8 states (16 chains of
// VDPBF16PS, whose 6-cycle latency left one row's 8 chains waiting on each other); the bits are
// each state's own chains either way.
template <bool kDots>
HWY_INLINE void attend_tile_pairs(const TaskState& ts, const std::byte* k, const std::byte* v,
                                  const PageLayout& p, std::int64_t t0, std::int64_t tile,
                                  std::int64_t hk) {
  const AttendTask& task = *ts.task;
  AttendScratch& s = *ts.s;
  const std::int64_t d = ts.spec->head_size;
  std::uint32_t* kt = s.k_pairs.data();
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
  if constexpr (kDots) transpose_keys_dots(k, p.k_row_stride, tile, d, kt);
#endif
  if constexpr (!kDots) transpose_keys(k, p.k_row_stride, tile, d, kt);
  const std::int64_t hb = std::max(task.h_begin, hk * ts.group);
  const std::int64_t he = std::min(task.h_end, (hk + 1) * ts.group);
  // The tile's V interleaved for the keys [vt_a, vt_b] (empty: none yet), made by the first group
  // of rows that sees them together and read by every such group after it.
  [[maybe_unused]] std::int64_t vt_a = 1, vt_b = 0;
  [[maybe_unused]] const auto interleaved =
      [&]([[maybe_unused]] const std::byte* const* rows, [[maybe_unused]] std::int64_t a,
          [[maybe_unused]] std::int64_t b) -> const std::uint32_t* {
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
    if constexpr (kDots) {
      if (a != vt_a || b != vt_b) {
        interleave_values(rows, a / 2, b / 2, ts.spec->head_size_v, s.v_pairs.data());
        vt_a = a, vt_b = b;
      }
      return s.v_pairs.data();
    }
#endif
    return nullptr;
  };
  for (std::int64_t i0 = 0; i0 < ts.nq; i0 += 2) {
    const std::int64_t nr = std::min<std::int64_t>(2, ts.nq - i0);
    std::int64_t a[2] = {1, 1}, b[2] = {0, 0};  // an empty range unless the row sees the tile
    // Token t's V row where it is one of the row's keys, else zeros (pairs end by token 15).
    const std::byte* rows[2][kTileTokens];
    for (std::int64_t r = 0; r < nr; ++r) {
      const KeyRange range =
          key_range(ts.spec->params, ts.first_pos + task.q_begin + i0 + r, task.seq->kv_len);
      a[r] = std::max(range.lo, t0) - t0;
      b[r] = std::min(range.hi, t0 + tile - 1) - t0;
      for (std::int64_t t = 0; t < kTileTokens; ++t) {
        rows[r][t] = t >= a[r] && t <= b[r] ? v + t * p.v_row_stride
                                            : reinterpret_cast<const std::byte*>(kZeroRow);
      }
    }
    const bool both = nr == 2 && a[0] <= b[0] && a[1] <= b[1];
    for (std::int64_t h0 = hb, heads = 0; h0 < he; h0 += heads) {
      heads = std::min<std::int64_t>(4, he - h0);
      // Row r's head x: state states[4 r + x], q codes q[4 r + x], scores at sc + (4 r + x) 16.
      constexpr std::int64_t kRowScores = 4 * kTileTokens;
      float* sc = s.scores.data();
      const std::uint16_t* q[8];
      std::int64_t states[8];
      for (std::int64_t r = 0; r < nr; ++r) {
        for (std::int64_t x = 0; x < heads; ++x) {
          states[r * 4 + x] = (i0 + r) * ts.nh + h0 + x - task.h_begin;
          q[r * 4 + x] = s.q_bf16.data() + states[r * 4 + x] * d;
        }
      }
      with_heads(heads, [&](auto group) {
        constexpr int kHeads = decltype(group)::value;
        bool scored = false;
        if constexpr (kHeads == 4) {
          if (both) {
            if constexpr (kDots) {
              pair_scores_of<kDots, 8>(q, kt, d, sc, ts.next);
            } else {  // (8 states' 32 chains would not fit AVX2's 16 registers)
              pair_scores_of<kDots, 4>(q, kt, d, sc, ts.next);
              pair_scores_of<kDots, 4>(q + 4, kt, d, sc + kRowScores, ts.next);
            }
            if (a[0] == a[1] && b[0] == b[1]) {  // the same keys: one pass over V for both rows
              pair_group<kDots, 8>(ts, sc, rows[0], a[0], b[0], states,
                                   interleaved(rows[0], a[0], b[0]));
              return;
            }
            scored = true;
          }
        }
        for (std::int64_t r = 0; r < nr; ++r) {
          if (a[r] > b[r]) continue;
          if (!scored)
            pair_scores_of<kDots, kHeads>(q + r * 4, kt, d, sc + r * kRowScores, ts.next);
          // (One row alone, a decode, reads V once: interleaving it first would only cost.)
          pair_group<kDots, kHeads>(ts, sc + r * kRowScores, rows[r], a[r], b[r], states + r * 4,
                                    ts.nq > 1 ? interleaved(rows[r], a[r], b[r]) : nullptr);
        }
      });
    }
  }
  ts.next->all();
}

HWY_NOINLINE void attend_tile_pairs_float(const TaskState& ts, const std::byte* k,
                                          const std::byte* v, const PageLayout& p, std::int64_t t0,
                                          std::int64_t tile, std::int64_t hk) {
  attend_tile_pairs<false>(ts, k, v, p, t0, tile, hk);
}
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
HWY_NOINLINE void attend_tile_pairs_dots(const TaskState& ts, const std::byte* k,
                                         const std::byte* v, const PageLayout& p, std::int64_t t0,
                                         std::int64_t tile, std::int64_t hk) {
  attend_tile_pairs<true>(ts, k, v, p, t0, tile, hk);
}
#endif

// A softmax state (max, sum, acc of dvp floats) that the chunks of a context fold into, left to
// right. An empty state has sum 0 (a chunk that saw keys has sum >= 1, or NaN).
struct Partial {
  float max;
  float sum;
  const float* acc;
};

// The state a query's fold starts from: a sink's logit with a zero value, else empty.
HWY_INLINE void start_fold(const float* sinks, std::int64_t head, float& max, float& sum,
                           float* acc, std::int64_t dvp) {
  max = sinks != nullptr ? sinks[head] : -std::numeric_limits<float>::infinity();
  sum = sinks != nullptr ? 1.0f : 0.0f;
  std::fill(acc, acc + dvp, 0.0f);
}

// (max, sum, acc) <- the fold of itself with chunk `c`: both rescaled to the larger max, then
// added. Explicit fused multiply-adds, so inlining cannot change a bit (the same function runs in
// a task and in reduce_partials). A chunk that saw no key is skipped; a NaN max or sum poisons.
HWY_NOINLINE void fold(float& max, float& sum, float* acc, const Partial& c, std::int64_t dvp) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  if (c.sum == 0.0f) return;
  if (sum == 0.0f) {
    max = c.max;
    sum = c.sum;
    std::copy(c.acc, c.acc + dvp, acc);
    return;
  }
  float mine = 1.0f, theirs = 1.0f;
  if (c.max > max) {
    mine = std::exp(max - c.max);
    max = c.max;
  } else {
    theirs = std::exp(c.max - max);
  }
  sum = std::fma(c.sum, theirs, sum * mine);
  const auto vm = hn::Set(df, mine), vt = hn::Set(df, theirs);
  for (std::int64_t j = 0; j < dvp; j += n) {
    hn::StoreU(hn::MulAdd(hn::LoadU(df, c.acc + j), vt, hn::Mul(hn::LoadU(df, acc + j), vm)), df,
               acc + j);
  }
}

// What V's accumulated units are multiplied by (MLA: V is part of the latent, K's scale).
HWY_INLINE float v_factor(const AttentionSpec& spec, KvScales scales) {
  return (spec.mla ? scales.k : scales.v) / code_unit(spec.params.kv_dtype);
}

// out = acc x (v_factor / sum) over the first dv elements: v_factor turns the accumulated
// units (code_unit) into values with V's per-tensor scale (exactly 1 for bf16, f16 and f32).
HWY_INLINE void finish(const float* acc, float sum, float v_factor, std::int64_t dv, float* dst) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const float inv = v_factor / sum;
  std::int64_t e = 0;
  for (; e + n <= dv; e += n)
    hn::StoreU(hn::Mul(hn::LoadU(df, acc + e), hn::Set(df, inv)), df, dst + e);
  for (; e < dv; ++e) dst[e] = acc[e] * inv;
}

}  // namespace

void AttendTaskImpl(const AttendCall& call, const AttendTask& task, AttendScratch& s) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const AttentionSpec& spec = *call.spec;
  const attn::AttentionParams& params = spec.params;
  const PageLayout& p = call.page;
  const PagedSequence& seq = *task.seq;
  const std::int64_t hq = params.num_q_heads;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;
  TaskState ts;
  ts.spec = &spec;
  ts.task = &task;
  ts.s = &s;
  ts.group = hq / params.num_kv_heads;
  ts.dp = round_up(d, n);
  ts.dvp = round_up(dv, n);
  ts.tile_pad = round_up(kTileTokens, n);
  ts.nq = task.q_end - task.q_begin;
  ts.nh = task.h_end - task.h_begin;
  // The cache is read in units of code_unit, unscaled: K's scale and unit meet the logit scale
  // here, once (exact factors of 1 for bf16, f16 and f32), V's in finish.
  ts.scale = static_cast<float>(params.scale) * (call.scales.k / code_unit(p.dtype));
  ts.capped = params.soft_cap.has_value();
  ts.cap = ts.capped ? static_cast<float>(*params.soft_cap) : 1.0f;
  ts.first_pos = seq.kv_len - seq.num_queries;
  NextRows next;
  ts.next = &next;
  const std::int64_t nq = ts.nq, nh = ts.nh, dp = ts.dp, dvp = ts.dvp;
  const std::int64_t hk_first = task.h_begin / ts.group;
  const std::int64_t hk_last = (task.h_end - 1) / ts.group;
  const float* table = fp8_table(p.dtype);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Decode reads each K/V row once: decode it in registers. 16- and 32-bit caches widen in an
  // instruction or two a vector, so several queries (a verify, a prefill block) re-read the
  // tile's rows from L1 that way too (converting the tile into scratch first cost 10-15% more at
  // 5 rows over 8k bf16 tokens); fp8's widening is dearer (~11 micro-ops per 32 codes), so its
  // queries share one conversion into scratch, as do odd head sizes, which need padding.
  const bool widens_cheaply =
      p.dtype == DType::kFloat32 || p.dtype == DType::kBfloat16 || p.dtype == DType::kFloat16;
  const bool in_registers = (nq == 1 || widens_cheaply) && d % n == 0 && dv % n == 0;
  const float* sinks = params.sinks ? call.sinks : nullptr;

  // The bf16-pair order's whole task runs with FTZ and DAZ (bf16_pairs.hpp), whichever path.
  const bool pairs = spec.order == AttentionOrder::kBf16Pairs;
  std::optional<FlushSubnormals> flush;
  if (pairs) {
    flush.emplace();
    grow(s.q_bf16, nq * nh * d);
    grow(s.p_pairs, 8 * kTileTokens);  // two query rows' states for a group of 4 heads
    grow(s.scores, 8 * kTileTokens);
    grow(s.probs, 8 * kTileTokens);
    grow(s.k_pairs, d / 2 * kTileTokens);
    grow(s.v_pairs, dv * kTileTokens / 2);
    if (p.dtype == DType::kFp8E4m3) {
      grow(s.k_wide, kTileTokens * d);
      grow(s.v_wide, kTileTokens * dv);
    }
  }
  // e4m3 in the pair order: a tile's rows widened to bf16, back to back (widen_e4m3_rows).
  PageLayout wide = p;
  wide.k_row_stride = 2 * d;
  wide.v_row_stride = 2 * dv;
  alignas(64) std::uint16_t e4m3_magnitudes[128];
  if (pairs && p.dtype == DType::kFp8E4m3) e4m3_magnitudes_bf16(table, e4m3_magnitudes);
  grow(s.q, nq * nh * dp);
  grow(s.k, kTileTokens * dp);
  grow(s.v, spec.mla ? 0 : kTileTokens * dvp);
  grow(s.scores, 3 * kTileTokens + ts.tile_pad);
  grow(s.probs, 3 * kTileTokens + ts.tile_pad);
  grow(s.max, nq * nh);
  grow(s.sum, nq * nh);
  grow(s.acc, nq * nh * dvp);
  grow(s.run_max, nq * nh);
  grow(s.run_sum, nq * nh);
  grow(s.run_acc, nq * nh * dvp);
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
      if (pairs) {  // float_to_bf16's bits, in vectors
        encode_bf16_row(src, static_cast<std::size_t>(d), s.q_bf16.data() + (i * nh + h) * d);
      }
      const std::int64_t state = i * nh + h;
      start_fold(sinks, task.h_begin + h, s.run_max[static_cast<std::size_t>(state)],
                 s.run_sum[static_cast<std::size_t>(state)], s.run_acc.data() + state * dvp, dvp);
    }
  }

  // AMX: the columns of KV head hk are (row i, head h) for the task's heads hb.. of hk, column
  // c = i * g + (h - hb), in groups of m <= 16 (as even as possible: 20 columns are 2 x 10);
  // column c has slot col0[hk] + c for its softmax state and accumulator. Which columns share a
  // group changes no bit of any of them (attention_amx.hpp).
  const auto amx_head = [&](std::int64_t hk, std::int64_t& hb, std::int64_t& g,
                            std::int64_t& groups, std::int64_t& m) {
    hb = std::max(task.h_begin, hk * ts.group);
    g = std::min(task.h_end, (hk + 1) * ts.group) - hb;
    groups = (nq * g + attn_amx::kCols - 1) / attn_amx::kCols;
    m = (nq * g + groups - 1) / groups;
  };
  std::int64_t amx_m = 0;  // the tile shape configured on this thread
  const std::int64_t q_words = attn_amx::q_words(d);
  if (call.amx) {
    s.amx_col0.resize(static_cast<std::size_t>(hk_last + 1 - hk_first));
    std::int64_t slots = 0;
    for (std::int64_t hk = hk_first; hk <= hk_last; ++hk) {
      std::int64_t hb, g, groups, m;
      amx_head(hk, hb, g, groups, m);
      s.amx_col0[static_cast<std::size_t>(hk - hk_first)] = slots;
      slots += groups * attn_amx::kCols;
    }
    grow(s.amx_max, slots);
    grow(s.amx_sum, slots);
    grow(s.amx_acc, slots * dv);
    grow(s.amx_q, slots / attn_amx::kCols * q_words);
    grow(s.amx_v, attn_amx::v_words(dv));
    grow(s.amx_kt, attn_amx::kt_words(d));
    grow(s.amx_scores, attn_amx::kCols * attn_amx::kKeys);
    grow(s.amx_probs, attn_amx::kCols * attn_amx::kKeys + attn_amx::kCols);
    const float* rows[attn_amx::kCols];
    for (std::int64_t hk = hk_first; hk <= hk_last; ++hk) {
      std::int64_t hb, g, groups, m;
      amx_head(hk, hb, g, groups, m);
      const std::int64_t col0 = s.amx_col0[static_cast<std::size_t>(hk - hk_first)];
      for (std::int64_t gi = 0; gi < groups; ++gi) {
        const std::int64_t cols = std::min(m, nq * g - gi * m);
        for (std::int64_t j = 0; j < cols; ++j) {
          const std::int64_t c = gi * m + j;
          rows[j] = s.q.data() + ((c / g) * nh + hb + c % g - task.h_begin) * dp;
        }
        attn_amx::prepare_q(rows, cols, m, d,
                            s.amx_q.data() + (col0 / attn_amx::kCols + gi) * q_words);
      }
    }
  }
  // One tile of KV head hk on the AMX path: q.k^T per group, the online softmax per column (the
  // same step as the other paths), then p.V into the columns' accumulators.
  const auto amx_tile = [&](std::int64_t hk, const std::byte* k_head, const std::byte* v_head,
                            std::int64_t t0, std::int64_t tile, std::int64_t vis_lo,
                            std::int64_t vis_hi) {
    std::int64_t hb, g, groups, m;
    amx_head(hk, hb, g, groups, m);
    const std::int64_t col0 = s.amx_col0[static_cast<std::size_t>(hk - hk_first)];
    if (m != amx_m) attn_amx::configure(m);
    amx_m = m;
    next.more(2);
    attn_amx::relayout_v(v_head, p.v_row_stride, std::max(vis_lo, t0) - t0,
                         std::min(vis_hi, t0 + tile - 1) - t0, dv, s.amx_v.data());
    next.more(2);
    attn_amx::transpose_k(k_head, p.k_row_stride, d, s.amx_kt.data());
    next.more(2);
    float* sc = s.amx_scores.data();
    float* pr = s.amx_probs.data();
    float* factors = pr + attn_amx::kCols * attn_amx::kKeys;
    for (std::int64_t gi = 0; gi < groups; ++gi) {
      const std::int64_t cols = std::min(m, nq * g - gi * m);
      attn_amx::scores(s.amx_q.data() + (col0 / attn_amx::kCols + gi) * q_words, m, d,
                       s.amx_kt.data(), sc);
      next.more(2);
      for (std::int64_t j = 0; j < cols; ++j) {
        next.more(1);
        const std::int64_t c = gi * m + j;
        float* prow = pr + j * attn_amx::kKeys;
        factors[j] = 1.0f;
        const KeyRange range = key_range(params, ts.first_pos + task.q_begin + c / g, seq.kv_len);
        const std::int64_t a = std::max(range.lo, t0) - t0;
        const std::int64_t b = std::min(range.hi, t0 + tile - 1) - t0;
        if (a > b) {  // a column that sees no key of the tile adds exact zeros
          std::fill(prow, prow + attn_amx::kKeys, 0.0f);
          continue;
        }
        const auto slot = static_cast<std::size_t>(col0 + c);
        float* column_max = &s.amx_max[slot];
        float* column_sum = &s.amx_sum[slot];
        softmax_tile<1>(ts, sc + j * attn_amx::kKeys, attn_amx::kKeys, a, b, &column_max,
                        &column_sum, prow, &factors[j]);
      }
      attn_amx::pv(pr, factors, cols, m, s.amx_v.data(), dv,
                   s.amx_acc.data() + (col0 + gi * m) * dv, dv);
    }
    next.all();
  };
  // The partial (max, sum, acc) of row i, head h for the chunk just done. The AMX accumulator
  // is made +0 where it is a zero: a column beside others adds their keys' 0 x V products, whose
  // sign may differ from a lone column's (every nonzero sum is the same).
  const auto partial_of = [&](std::int64_t i, std::int64_t h) {
    if (!call.amx) {
      const std::int64_t state = i * nh + h;
      const auto st = static_cast<std::size_t>(state);
      return Partial{s.max[st], s.sum[st], s.acc.data() + state * dvp};
    }
    const std::int64_t hk = (task.h_begin + h) / ts.group;
    std::int64_t hb, g, groups, m;
    amx_head(hk, hb, g, groups, m);
    const std::int64_t slot =
        s.amx_col0[static_cast<std::size_t>(hk - hk_first)] + i * g + task.h_begin + h - hb;
    float* acc = s.amx_acc.data() + slot * dv;
    for (std::int64_t e = 0; e < dv; e += n)
      hn::StoreU(hn::Add(hn::LoadU(df, acc + e), hn::Zero(df)), df, acc + e);
    const auto st = static_cast<std::size_t>(slot);
    return Partial{s.amx_max[st], s.amx_sum[st], acc};
  };

  // Ranges move right with the position, so the block's keys are [lo of first, hi of last].
  const std::int64_t lo_all = key_range(params, ts.first_pos + task.q_begin, seq.kv_len).lo;
  const std::int64_t hi_all = key_range(params, ts.first_pos + task.q_end - 1, seq.kv_len).hi;
  // The task's keys: its chunks' share of the block's.
  const std::int64_t task_lo = std::max(lo_all, task.chunk_begin * kSplitTokens);
  const std::int64_t task_hi = std::min(hi_all, task.chunk_end * kSplitTokens - 1);
  // The bytes of a KV head's K (V) row, and from one head's rows to the next's.
  const std::int64_t k_head_bytes = d * p.elem;
  const std::int64_t v_head_bytes = spec.mla ? 0 : dv * p.elem;
  const std::int64_t k_head_stride = p.k_head_stride;
  const std::int64_t v_head_stride = spec.mla ? 0 : p.v_head_stride;
  const auto page_base = [&](std::int64_t t) {
    return call.cache + p.offset +
           seq.kernel_pages[static_cast<std::size_t>(t / p.kernel_tokens)] * p.stride;
  };
  // Tiles lie on a grid fixed by positions alone: every kTileTokens tokens from the start of
  // each piece that kernel pages and context chunks cut the sequence into. A query's keys then
  // fall into the same tiles, at the same lanes, whichever other queries share its block and
  // wherever their windows start, so a row of a verify is bit-identical to the decode at its
  // position (the online softmax's grouping is the tiles, the fold's the chunks).
  const auto tile_at = [&](std::int64_t t, std::int64_t hi) {
    return std::min({kTileTokens, p.kernel_tokens - t % p.kernel_tokens,
                     kSplitTokens - t % kSplitTokens, hi + 1 - t});
  };

  for (std::int64_t c = task.chunk_begin; c < task.chunk_end; ++c) {
    const std::int64_t lo = std::max(task_lo, c * kSplitTokens);
    const std::int64_t hi = std::min(task_hi, (c + 1) * kSplitTokens - 1);
    if (call.amx) {
      std::fill(s.amx_max.begin(), s.amx_max.end(), neg_inf);
      std::fill(s.amx_sum.begin(), s.amx_sum.end(), 0.0f);
      std::fill(s.amx_acc.begin(), s.amx_acc.end(), 0.0f);
    } else {
      for (std::int64_t state = 0; state < nq * nh; ++state) {
        s.max[static_cast<std::size_t>(state)] = neg_inf;
        s.sum[static_cast<std::size_t>(state)] = 0.0f;
      }
      std::fill(s.acc.begin(), s.acc.begin() + nq * nh * dvp, 0.0f);
    }
    // The first tile may start before lo (inside lo's piece); keys before a query's range are
    // masked, never used.
    const std::int64_t piece = std::max(lo - lo % p.kernel_tokens, c * kSplitTokens);
    for (std::int64_t t0 = piece + (lo - piece) / kTileTokens * kTileTokens; t0 <= hi;) {
      const std::int64_t in_page = t0 % p.kernel_tokens;
      const std::int64_t tile = tile_at(t0, hi);
      const std::byte* base = page_base(t0);
      const std::byte* k_src = base + in_page * p.k_row_stride;
      const std::byte* v_src = base + p.v_offset + in_page * p.v_row_stride;
      // The next tile may sit on another page anywhere in the tensor: every path asks for it
      // while this tile is computed, head by head, a row or two at a time (NextRows). Bursts (a
      // whole tile's rows at once, 64 KiB for 8 KV heads of 128, or a head's at once) filled
      // the line-fill buffers and stalled the core until the lines came; on the AMX path they
      // cost more than no software prefetch at all (docs/kernels-speed.md, issue 14 figures).
      const std::byte* next_k = nullptr;
      const std::byte* next_v = nullptr;
      std::int64_t next_tile = 0;
      if (t0 + tile <= task_hi) {
        const std::int64_t next = t0 + tile;
        const std::byte* next_base = page_base(next);
        const std::int64_t next_in = next % p.kernel_tokens;
        next_tile = tile_at(next, task_hi);
        next_k = next_base + next_in * p.k_row_stride;
        next_v = next_base + p.v_offset + next_in * p.v_row_stride;
      }
      for (std::int64_t hk = hk_first; hk <= hk_last; ++hk) {
        const std::byte* k_head = k_src + hk * k_head_stride;
        const std::byte* v_head = v_src + hk * v_head_stride;
        if (next_k != nullptr) {
          next = NextRows{next_k + hk * k_head_stride,
                          next_v + hk * v_head_stride,
                          next_tile,
                          p.k_row_stride,
                          p.v_row_stride,
                          k_head_bytes,
                          v_head_bytes};
        } else {
          next = NextRows{};
        }
        if (call.amx) {
          amx_tile(hk, k_head, v_head, t0, tile, lo, hi);
          continue;
        }
        if (pairs) {
          const std::byte* k_rows = k_head;
          const std::byte* v_rows = v_head;
          const PageLayout* rows_layout = &p;
          if (p.dtype == DType::kFp8E4m3) {  // the tile's codes as bf16, once for every row
            widen_e4m3_rows(e4m3_magnitudes, k_head, p.k_row_stride, tile, d, s.k_wide.data());
            widen_e4m3_rows(e4m3_magnitudes, v_head, p.v_row_stride, tile, dv, s.v_wide.data());
            k_rows = reinterpret_cast<const std::byte*>(s.k_wide.data());
            v_rows = reinterpret_cast<const std::byte*>(s.v_wide.data());
            rows_layout = &wide;
          }
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
          if (call.bf16_dots) {
            attend_tile_pairs_dots(ts, k_rows, v_rows, *rows_layout, t0, tile, hk);
            continue;
          }
#endif
          attend_tile_pairs_float(ts, k_rows, v_rows, *rows_layout, t0, tile, hk);
          continue;
        }
        if (in_registers) {
          switch (p.dtype) {
            case DType::kFloat32:
              attend_tile_cache<DType::kFloat32>(ts, k_head, v_head, p, t0, tile, hk);
              break;
            case DType::kBfloat16:
              attend_tile_cache<DType::kBfloat16>(ts, k_head, v_head, p, t0, tile, hk);
              break;
            case DType::kFloat16:
              attend_tile_cache<DType::kFloat16>(ts, k_head, v_head, p, t0, tile, hk);
              break;
            case DType::kFp8E4m3:
              attend_tile_cache<DType::kFp8E4m3>(ts, k_head, v_head, p, t0, tile, hk);
              break;
            default:
              attend_tile_cache<DType::kFp8E5m2>(ts, k_head, v_head, p, t0, tile, hk);
              break;
          }
          continue;
        }
        convert_rows(p.dtype, table, k_head, p.k_row_stride, tile, d, s.k.data(), dp);
        // MLA: the value is the latent's first dv elements.
        FloatRows v{s.k.data(), dp};
        if (!spec.mla) {
          convert_rows(p.dtype, table, v_head, p.v_row_stride, tile, dv, s.v.data(), dvp);
          v = FloatRows{s.v.data(), dvp};
        }
        attend_tile(ts, FloatRows{s.k.data(), dp}, v, dp, dvp, t0, tile, hk);
      }
      t0 += tile;
    }
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
    if (pairs && call.bf16_dots) {
      for (std::int64_t state = 0; state < nq * nh; ++state)
        unpermute_pairs(s.acc.data() + state * dvp, dv);
    }
#endif
    // The chunk's partials: kept for reduce_partials, or folded here.
    for (std::int64_t i = 0; i < nq; ++i) {
      for (std::int64_t h = 0; h < nh; ++h) {
        const auto st = static_cast<std::size_t>(i * nh + h);
        const Partial part = partial_of(i, h);
        if (task.split != nullptr) {
          const SplitBlock& b = *task.split;
          float* rec =
              b.partials +
              (((c - b.chunk_first) * (b.q_end - b.q_begin) + task.q_begin - b.q_begin + i) * hq +
               task.h_begin + h) *
                  (dvp + 2);
          rec[0] = part.max;
          rec[1] = part.sum;
          std::copy(part.acc, part.acc + dvp, rec + 2);
        } else {
          fold(s.run_max[st], s.run_sum[st], s.run_acc.data() + (i * nh + h) * dvp, part, dvp);
        }
      }
    }
  }
  if (amx_m != 0) attn_amx::release();
  if (task.split != nullptr) return;

  for (std::int64_t i = 0; i < nq; ++i) {
    for (std::int64_t h = 0; h < nh; ++h) {
      const std::int64_t state = i * nh + h;
      finish(s.run_acc.data() + state * dvp, s.run_sum[static_cast<std::size_t>(state)],
             v_factor(spec, call.scales), dv,
             call.out + ((task.row0 + task.q_begin + i) * hq + task.h_begin + h) * dv);
    }
  }
}

void ReducePartialsImpl(const AttendCall& call, const SplitBlock& b, std::int64_t h_begin,
                        std::int64_t h_end) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const AttentionSpec& spec = *call.spec;
  const std::int64_t hq = spec.params.num_q_heads;
  const std::int64_t dv = spec.head_size_v;
  const std::int64_t dvp = round_up(dv, n);
  const std::int64_t nq = b.q_end - b.q_begin;
  const float* sinks = spec.params.sinks ? call.sinks : nullptr;
  std::vector<float> acc(static_cast<std::size_t>(dvp));
  for (std::int64_t i = 0; i < nq; ++i) {
    for (std::int64_t h = h_begin; h < h_end; ++h) {
      float max = 0, sum = 0;
      start_fold(sinks, h, max, sum, acc.data(), dvp);
      for (std::int64_t c = 0; c < b.chunks; ++c) {
        const float* rec = b.partials + ((c * nq + i) * hq + h) * (dvp + 2);
        fold(max, sum, acc.data(), Partial{rec[0], rec[1], rec + 2}, dvp);
      }
      finish(acc.data(), sum, v_factor(spec, call.scales), dv,
             call.out + ((b.row0 + b.q_begin + i) * hq + h) * dv);
    }
  }
}

std::int64_t PartialFloatsImpl(std::int64_t head_size_v) {
  return round_up(head_size_v, static_cast<std::int64_t>(hn::Lanes(DF()))) + 2;
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

bool HasBf16DotsImpl() {
#ifdef MIXKV_ATTN_HAS_BF16_DOTS
  return true;
#else
  return false;
#endif
}
#undef MIXKV_ATTN_HAS_BF16_DOTS
#undef MIXKV_ATTN_BF16_ATTR

}  // namespace mixkv::kernels::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mixkv::kernels::detail {

HWY_EXPORT(AttendTaskImpl);
HWY_EXPORT(TargetNameImpl);
HWY_EXPORT(HasBf16DotsImpl);
HWY_EXPORT(ReducePartialsImpl);
HWY_EXPORT(PartialFloatsImpl);

void attend_task(const AttendCall& call, const AttendTask& task, AttendScratch& scratch) {
  HWY_DYNAMIC_DISPATCH(AttendTaskImpl)(call, task, scratch);
}

void reduce_partials(const AttendCall& call, const SplitBlock& block, std::int64_t h_begin,
                     std::int64_t h_end) {
  HWY_DYNAMIC_DISPATCH(ReducePartialsImpl)(call, block, h_begin, h_end);
}

std::int64_t partial_floats(std::int64_t head_size_v) {
  return HWY_DYNAMIC_DISPATCH(PartialFloatsImpl)(head_size_v);
}

const char* attend_target() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

bool attend_has_bf16_dots() { return HWY_DYNAMIC_DISPATCH(HasBf16DotsImpl)(); }

}  // namespace mixkv::kernels::detail
#endif  // HWY_ONCE
