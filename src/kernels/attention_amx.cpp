// AMX tile products of paged attention (see attention_amx.hpp). A task's groups hold m <= 16
// columns each (query row x head, spread evenly over the groups). Tiles:
//   0/3  K^T of one k-step: 16 pairs of head elements x 16 keys (a 32-bit transpose of
//        the page's rows, made once per tile for all groups), by k-step parity; then V
//        slices (p.V)                                                                   16 x 64 B
//   1    a query term as A: m columns x 16 bf16 pairs                                   m x 64 B
//   2    scores, m columns x 16 keys: per k-step the hi, mid and lo terms, in order      m x 64 B
//   4    p as A: [hi | mid] of the 16 keys of each column                                m x 64 B
//   5    p as A: [lo | 0]                                                                m x 64 B
//   6/7  p.V of one 16-element V slice, fresh per tile                                   m x 64 B
// V is re-laid in VNNI pairs of keys with its 8 pair rows twice, so one product adds the hi and
// mid terms; then acc = fma(acc, rescale, slice) in float. Both products take the columns as
// the rows of A, so the scores come out [column][key] as the softmax reads them.
#include "kernels/attention_amx.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/amx_support.hpp"

#ifdef MIXKV_AMX
// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), a deliberate
// self-initialisation that its -Wuninitialized reports once they are inlined into these loops.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace mixkv::kernels::detail::attn_amx {

std::atomic<bool>& switched_on() {
  static std::atomic<bool> on{true};
  return on;
}

#ifdef MIXKV_AMX

bool usable() {
  return amx_support::tiles_usable() && switched_on().load(std::memory_order_relaxed);
}

bool takes(const AttentionSpec& spec, const PageLayout& page) {
  return spec.order == AttentionOrder::kFloat && spec.params.kv_dtype == DType::kBfloat16 &&
         !spec.mla && spec.head_size % kStep == 0 && spec.head_size_v % kStep == 0 &&
         spec.head_size <= 512 && spec.head_size_v <= 512 && page.kernel_tokens % kKeys == 0 &&
         usable();
}

// GCC 12 does not treat the tile loads and stores (nor LDTILECFG) as reading and writing the
// memory they are given, so it may drop or move vector stores into a buffer a tile then loads
// from (seen: a reused buffer read stale), or vector loads of what a tile stored: a compiler
// barrier that lets the buffer's address escape, between the two.
#define MIXKV_AMX_FENCE(p) __asm__ volatile("" : : "r"(p) : "memory")

namespace {

// The top halves of 16 floats' bits (each float is a bf16 there).
MIXKV_AMX_TARGET inline __m256i halves(__m512 f) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16));
}

// The three bf16 terms of 16 floats: two truncations to 8 significant bits and the remainder
// (exact for every float whose last term is a normal bf16; AMX flushes smaller terms).
MIXKV_AMX_TARGET inline void split16(__m512 v, __m256i& hi, __m256i& mid, __m256i& lo) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512 h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top));
  const __m512 r = _mm512_sub_ps(v, h);
  const __m512 m = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r), top));
  hi = halves(h);
  mid = halves(m);
  lo = halves(_mm512_sub_ps(r, m));
}

// Transposes 16 x 16 32-bit words (rows `stride` bytes apart from `in`) into `out` (rows 64
// bytes apart).
MIXKV_AMX_TARGET inline void transpose16(const std::byte* in, std::int64_t stride, float* out) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * stride);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // u[4a + c]: column c of each 4-column block, rows 4a .. 4a + 3.
  for (int a = 0; a < 16; a += 4) {
    r[a] = _mm512_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[a + 1] = _mm512_shuffle_ps(t[a], t[a + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[a + 2] = _mm512_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[a + 3] = _mm512_shuffle_ps(t[a + 1], t[a + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    const __m512 w0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
    const __m512 v1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_storeu_ps(out + 16 * c, _mm512_shuffle_f32x4(v0, v1, 0x88));
    _mm512_storeu_ps(out + 16 * (4 + c), _mm512_shuffle_f32x4(w0, w1, 0x88));
    _mm512_storeu_ps(out + 16 * (8 + c), _mm512_shuffle_f32x4(v0, v1, 0xDD));
    _mm512_storeu_ps(out + 16 * (12 + c), _mm512_shuffle_f32x4(w0, w1, 0xDD));
  }
}

}  // namespace

MIXKV_AMX_TARGET void prepare_q(const float* const* rows, std::int64_t cols, std::int64_t m,
                                std::int64_t d, std::uint32_t* out) {
  (void)m;  // the rows of A are the columns: every group has room for 16
  const std::int64_t steps = d / kStep;
  std::fill(out, out + q_words(d), 0u);
  alignas(64) std::uint16_t terms[kTerms][kStep];
  for (std::int64_t c = 0; c < cols; ++c) {
    for (std::int64_t s = 0; s < steps; ++s) {
      for (std::int64_t half = 0; half < 2; ++half) {
        __m256i h, md, l;
        split16(_mm512_loadu_ps(rows[c] + s * kStep + half * 16), h, md, l);
        _mm256_store_si256(reinterpret_cast<__m256i*>(terms[0] + half * 16), h);
        _mm256_store_si256(reinterpret_cast<__m256i*>(terms[1] + half * 16), md);
        _mm256_store_si256(reinterpret_cast<__m256i*>(terms[2] + half * 16), l);
      }
      for (int t = 0; t < kTerms; ++t) {
        std::uint32_t pairs[16];
        std::memcpy(pairs, terms[t], sizeof pairs);
        std::memcpy(out + ((s * kTerms + t) * kCols + c) * 16, pairs, sizeof pairs);
      }
    }
  }
}

MIXKV_AMX_TARGET void configure(std::int64_t m) {
  amx_support::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = t == 0 || t == 3 ? 16 : static_cast<std::uint8_t>(m);
    cfg.colsb[t] = 64;
  }
  MIXKV_AMX_FENCE(&cfg);
  _tile_loadconfig(&cfg);
}

MIXKV_AMX_TARGET void release() { _tile_release(); }

namespace {

// The tile intrinsics take register numbers as literals (they are pasted into the assembly), so
// the two steps below are macros.
//
// One k-step s of q.k^T: the step's K^T (transpose_k) into tile KK, the three query terms
// through tile 1 into the score tile 2.
#define MIXKV_SCORE_STEP(KK, s)                            \
  do {                                                     \
    _tile_loadd(KK, kt + (s)*16 * 16, 64);                 \
    const std::uint32_t* qs = q + (s)*kTerms * 16 * kCols; \
    _tile_loadd(1, qs, 64);                                \
    _tile_dpbf16ps(2, 1, KK);                              \
    _tile_loadd(1, qs + 16 * kCols, 64);                   \
    _tile_dpbf16ps(2, 1, KK);                              \
    _tile_loadd(1, qs + 2 * 16 * kCols, 64);               \
    _tile_dpbf16ps(2, 1, KK);                              \
  } while (0)

// Slice c of p.V into tile O: [hi | mid] (tile 4) and [lo | 0] (tile 5) against V slice c
// (loaded into tile V), stored at out.
#define MIXKV_PV_SLICE(O, V, c, out)      \
  do {                                    \
    _tile_zero(O);                        \
    _tile_loadd(V, vt + (c)*16 * 16, 64); \
    _tile_dpbf16ps(O, 4, V);              \
    _tile_dpbf16ps(O, 5, V);              \
    _tile_stored(O, out, 64);             \
  } while (0)

}  // namespace

MIXKV_AMX_TARGET void transpose_k(const std::byte* k, std::int64_t k_stride, std::int64_t d,
                                  std::uint32_t* kt) {
  for (std::int64_t s = 0; s < d / kStep; ++s)
    transpose16(k + s * 64, k_stride, reinterpret_cast<float*>(kt + s * 16 * 16));
  MIXKV_AMX_FENCE(kt);
}

MIXKV_AMX_TARGET void scores(const std::uint32_t* q, std::int64_t m, std::int64_t d,
                             const std::uint32_t* kt, float* out) {
  (void)m;  // the configured rows of tiles 1 and 2
  MIXKV_AMX_FENCE(kt);
  _tile_zero(2);
  const std::int64_t steps = d / kStep;
  std::int64_t s = 0;
  for (; s + 2 <= steps; s += 2) {
    MIXKV_SCORE_STEP(0, s);
    MIXKV_SCORE_STEP(3, s + 1);
  }
  if (s < steps) MIXKV_SCORE_STEP(0, s);
  _tile_stored(2, out, 64);
  MIXKV_AMX_FENCE(out);
}

MIXKV_AMX_TARGET void relayout_v(const std::byte* v, std::int64_t v_stride, std::int64_t a,
                                 std::int64_t b, std::int64_t dv, std::uint32_t* vt) {
  // Word n of slice 2s (2s + 1) pairs element n (16 + n) of the two keys' 32-element segment s.
  alignas(64) static constexpr std::uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                        37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                        11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                        53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                        27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_idx = _mm512_load_si512(kLo);
  const __m512i hi_idx = _mm512_load_si512(kHi);
  const std::int64_t segments = dv / 32;
  for (std::int64_t p = 0; p < 8; ++p) {
    const std::int64_t t = 2 * p;
    const __mmask32 m0 = (t >= a && t <= b) ? ~__mmask32{0} : __mmask32{0};
    const __mmask32 m1 = (t + 1 >= a && t + 1 <= b) ? ~__mmask32{0} : __mmask32{0};
    const std::byte* r0 = v + t * v_stride;
    const std::byte* r1 = r0 + v_stride;
    for (std::int64_t s = 0; s < segments; ++s) {
      // A masked-off load reads nothing (no fault, no NaN): the key's row is zero.
      const __m512i x = _mm512_maskz_loadu_epi16(m0, r0 + s * 64);
      const __m512i y = _mm512_maskz_loadu_epi16(m1, r1 + s * 64);
      const __m512i lo = _mm512_permutex2var_epi16(x, lo_idx, y);
      const __m512i hi = _mm512_permutex2var_epi16(x, hi_idx, y);
      std::uint32_t* slice = vt + 2 * s * 16 * 16;
      _mm512_storeu_si512(slice + p * 16, lo);
      _mm512_storeu_si512(slice + (p + 8) * 16, lo);
      _mm512_storeu_si512(slice + 16 * 16 + p * 16, hi);
      _mm512_storeu_si512(slice + 16 * 16 + (p + 8) * 16, hi);
    }
  }
}

MIXKV_AMX_TARGET void pv(const float* probs, const float* rescale, std::int64_t cols,
                         std::int64_t m, const std::uint32_t* vt, std::int64_t dv, float* acc,
                         std::int64_t acc_stride) {
  // Only the m rows the tiles load are written (whole rows: no zeroing of the 2 KiB first).
  alignas(64) std::uint16_t hm[kCols][32];
  alignas(64) std::uint16_t lo[kCols][32];
  for (std::int64_t c = 0; c < m; ++c) {
    __m256i h = _mm256_setzero_si256(), md = h, l = h;
    if (c < cols) split16(_mm512_loadu_ps(probs + c * 16), h, md, l);
    _mm512_store_si512(hm[c], _mm512_inserti64x4(_mm512_castsi256_si512(h), md, 1));
    _mm512_store_si512(lo[c], _mm512_zextsi256_si512(l));
  }
  MIXKV_AMX_FENCE(hm);
  MIXKV_AMX_FENCE(lo);
  _tile_loadd(4, hm, 64);
  _tile_loadd(5, lo, 64);
  alignas(64) float o[2][16 * 16];
  const std::int64_t slices = dv / 16;
  for (std::int64_t c0 = 0; c0 < slices; c0 += 2) {
    const std::int64_t n = std::min<std::int64_t>(2, slices - c0);
    MIXKV_PV_SLICE(6, 0, c0, o[0]);
    if (n > 1) MIXKV_PV_SLICE(7, 3, c0 + 1, o[1]);
    MIXKV_AMX_FENCE(o);
    for (std::int64_t c = 0; c < cols; ++c) {
      const __m512 f = _mm512_set1_ps(rescale[c]);
      float* a = acc + c * acc_stride + c0 * 16;
      for (std::int64_t j = 0; j < n; ++j) {
        _mm512_storeu_ps(a + 16 * j, _mm512_fmadd_ps(_mm512_loadu_ps(a + 16 * j), f,
                                                     _mm512_load_ps(o[j] + 16 * c)));
      }
    }
  }
}

#else  // no AMX on this platform or compiler: the path is never taken.

bool usable() { return false; }
bool takes(const AttentionSpec&, const PageLayout&) { return false; }
void prepare_q(const float* const*, std::int64_t, std::int64_t, std::int64_t, std::uint32_t*) {}
void configure(std::int64_t) {}
void release() {}
void transpose_k(const std::byte*, std::int64_t, std::int64_t, std::uint32_t*) {}
void scores(const std::uint32_t*, std::int64_t, std::int64_t, const std::uint32_t*, float*) {}
void relayout_v(const std::byte*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                std::uint32_t*) {}
void pv(const float*, const float*, std::int64_t, std::int64_t, const std::uint32_t*, std::int64_t,
        float*, std::int64_t) {}

#endif

}  // namespace mixkv::kernels::detail::attn_amx
