// matmul on Intel AMX (Advanced Matrix Extensions: TDPBF16PS, 16 x 16 x 32 bf16 products into
// float tiles), for CPUs that have it and an OS that grants the tile state. Included once, by
// matmul.cpp (outside Highway's per-target copies); uses MatmulCall from there.
//
// Why: a product over n rows of x costs n multiply-adds per weight element. AVX-512's float
// fused multiply-adds make 8 rows cost 2-3x one row on this class of CPU (the FMA units, not
// memory, are then the limit); one AMX instruction does 8192 of them, so up to 16 rows of x
// cost about what one does, and W is still read once.
//
// Exactness: x is split into three bf16 terms, x = hi + mid + lo (truncations of 8 significant
// bits each, so the split is exact for every finite float whose last term is a normal bf16, i.e.
// |x| >= 2^-110 or so; smaller terms are flushed by AMX), and each term meets the weight's bf16
// values, whose products are exact in float. Order of every output (docs/kernels.md): over
// k-steps of 32 columns in order, three tile products per step (hi, mid, lo) in that order, each
// adding its 32 products to the float accumulator in the hardware's fixed order. No step depends
// on how many rows of x there are (each output column of a tile meets only its own x row), which
// rows share a tile, or on threads. bf16 weights only (see handles()).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXKV_MATMUL_AMX 1
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/amx_support.hpp"

namespace mixkv::kernels::detail::amx {

// 16 rows of x at most per group of tiles; more groups meet each W panel again from the cache.
constexpr int kTileRows = 16;
constexpr std::int64_t kStep = 32;  // columns per tile product (bf16 pairs x 16)
constexpr int kTerms = 3;
// Rows of x per pass over W (4 groups of tiles).
constexpr std::int64_t kPassRows = 64;

using amx_support::TileConfig;

// Whether matmul takes the AMX path: the CPU and OS allow it (probed once), and tests have not
// switched it off to check the other paths on an AMX machine.
inline std::atomic<bool>& switched_on() {
  static std::atomic<bool> on{true};
  return on;
}

inline bool available() {
  return amx_support::tiles_usable() && switched_on().load(std::memory_order_relaxed);
}

// bf16 weights only: the block formats would need their per-block scales applied between tile
// products, one tile store per block, which serialises the tiles (measured 10x slower than
// AVX-512 for one row; docs/kernels.md).
inline bool handles(WeightType t) { return t == WeightType::kBfloat16; }

// x in tile form: per group of up to 16 rows, per k-step, per term, a B tile of 16 pair rows x
// `m` columns (bf16 pair x[2p], x[2p + 1] of row i at [p][i]).
struct XTiles {
  std::int64_t groups = 0, steps = 0;
  std::vector<std::uint32_t> b;  // [group][step][term][16][m_g], groups of 16 rows
  std::int64_t m(std::int64_t g, std::int64_t n) const {
    return std::min<std::int64_t>(kTileRows, n - g * kTileRows);
  }
  std::size_t b_at(std::int64_t g, std::int64_t s, int t) const {
    // Every group but the last is full, so its offset is a product.
    return static_cast<std::size_t>((g * steps * kTerms + s * kTerms + t) * kTileRows * kTileRows);
  }
};

// The top halves of 16 floats' bits (each float is a bf16 there).
MIXKV_AMX_TARGET inline void store_halves(__m512 f, std::uint16_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f), 16)));
}

// The three terms of 16 floats, as bf16 (hi, mid, lo).
MIXKV_AMX_TARGET inline void split16(const float* x, std::uint16_t* hi, std::uint16_t* mid,
                                     std::uint16_t* lo) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m512 v = _mm512_loadu_ps(x);
  const __m512 h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), top));
  const __m512 r = _mm512_sub_ps(v, h);
  const __m512 m = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r), top));
  const __m512 l = _mm512_sub_ps(r, m);
  store_halves(h, hi);
  store_halves(m, mid);
  store_halves(l, lo);
}

MIXKV_AMX_TARGET inline void prepare_x(const MatmulCall& c, XTiles& xt) {
  xt.steps = (c.cols + kStep - 1) / kStep;
  xt.groups = (c.n + kTileRows - 1) / kTileRows;
  xt.b.assign(static_cast<std::size_t>(xt.groups * xt.steps * kTerms * kTileRows * kTileRows), 0);
  // One row's terms, each a plane of steps * 32 halves (zero past cols); read as 32-bit words a
  // plane is the row's bf16 pairs.
  const std::int64_t plane = xt.steps * kStep;
  std::vector<std::uint16_t> terms(static_cast<std::size_t>(kTerms * plane));
  std::vector<float> last(16);
  for (std::int64_t i = 0; i < c.n; ++i) {
    const std::int64_t g = i / kTileRows, col = i % kTileRows, m = xt.m(g, c.n);
    const float* x = c.x + i * c.x_stride;
    std::fill(terms.begin(), terms.end(), std::uint16_t{0});
    std::uint16_t* hi = terms.data();
    std::int64_t k = 0;
    for (; k + 16 <= c.cols; k += 16) split16(x + k, hi + k, hi + plane + k, hi + 2 * plane + k);
    if (k < c.cols) {
      std::fill(last.begin(), last.end(), 0.0f);
      std::copy(x + k, x + c.cols, last.begin());
      split16(last.data(), hi + k, hi + plane + k, hi + 2 * plane + k);
    }
    for (int t = 0; t < kTerms; ++t) {
      std::uint32_t pairs[kTileRows];
      for (std::int64_t s = 0; s < xt.steps; ++s) {
        std::memcpy(pairs, hi + t * plane + s * kStep, sizeof pairs);
        std::uint32_t* tile = xt.b.data() + xt.b_at(g, s, t);
        for (std::int64_t p = 0; p < kTileRows; ++p) tile[p * m + col] = pairs[p];
      }
    }
  }
}

// Tiles: 0 the float outputs (a_rows x m), 1 the W panel (a_rows x 32 bf16), 2..4 the x terms
// hi, mid, lo (16 bf16 pairs x m).
MIXKV_AMX_TARGET inline void configure(std::int64_t m, std::int64_t a_rows) {
  TileConfig cfg;
  const auto cb = static_cast<std::uint16_t>(m * 4);
  const auto ar = static_cast<std::uint8_t>(a_rows);
  cfg.rows[0] = ar, cfg.colsb[0] = cb;
  cfg.rows[1] = ar, cfg.colsb[1] = 64;
  for (int t : {2, 3, 4}) cfg.rows[t] = kTileRows, cfg.colsb[t] = cb;
  _tile_loadconfig(&cfg);
}

// One panel of `a_rows` <= 16 W rows from n0 against x group g (m rows) over k-steps [s0, s1),
// its accumulator tile parked at `acc` (16 x 16 floats) in between; into y after the last step.
// The weight enters the A tile straight from memory; a partial
// last k-step (cols not a multiple of 32) goes through a zero-padded copy, so nothing past a row
// is multiplied. One panel at a time: 16 rows side by side stream from memory better than 32
// (measured: 32 rows cost 10-15% more per byte, 8 or 4 rows more still).
MIXKV_AMX_TARGET inline void panel(const MatmulCall& c, const XTiles& xt, std::int64_t g,
                                   std::int64_t n0, std::int64_t a_rows, std::int64_t s0,
                                   std::int64_t s1, float* acc) {
  const std::int64_t m = xt.m(g, c.n);
  const auto b_stride = static_cast<long>(m * 4);
  alignas(64) std::uint16_t tail[kTileRows][kStep];
  const std::byte* w = c.w + n0 * c.row_bytes;
  const std::int64_t full = c.cols / kStep;
  // Bytes ahead of the tile loads that each W row is asked for.
  constexpr std::int64_t kAhead = 512;
  if (s0 == 0) {
    _tile_zero(0);
  } else {  // the accumulator as the previous column chunk left it (exact: floats)
    _tile_loadd(0, acc, 64);
  }
  for (std::int64_t s = s0; s < s1; ++s) {
    _tile_loadd(2, xt.b.data() + xt.b_at(g, s, 0), b_stride);
    _tile_loadd(3, xt.b.data() + xt.b_at(g, s, 1), b_stride);
    _tile_loadd(4, xt.b.data() + xt.b_at(g, s, 2), b_stride);
    if (s < full) {
      for (std::int64_t r = 0; r < a_rows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * c.row_bytes + s * 64 + kAhead),
                     _MM_HINT_T0);
      }
      _tile_loadd(1, w + s * 64, static_cast<long>(c.row_bytes));
    } else {
      const std::int64_t left = c.cols - s * kStep;
      for (std::int64_t r = 0; r < a_rows; ++r) {
        std::fill(tail[r], tail[r] + kStep, std::uint16_t{0});
        std::memcpy(tail[r], w + r * c.row_bytes + s * 64, static_cast<std::size_t>(left * 2));
      }
      _tile_loadd(1, tail, 64);
    }
    _tile_dpbf16ps(0, 1, 2);
    _tile_dpbf16ps(0, 1, 3);
    _tile_dpbf16ps(0, 1, 4);
  }
  _tile_stored(0, acc, 64);
  if (s1 == xt.steps) {
    for (std::int64_t r = 0; r < a_rows; ++r) {
      for (std::int64_t i = 0; i < m; ++i)
        c.y[(g * kTileRows + i) * c.rows + n0 + r] = acc[r * kTileRows + i];
    }
  }
}

// W rows [r0, r1) against every group of x rows, on the calling thread, panel by panel (a last
// partial panel with its own tile shape). One group: each panel runs its whole row. Several: the
// columns go in chunks whose x tiles, for every group, fit in L2 (~384 KiB), and each chunk meets
// every panel and group, the accumulator tiles parked in memory between chunks; so neither W nor
// x streams from memory more than once, and the order of every output is unchanged.
MIXKV_AMX_TARGET inline void run_rows(const MatmulCall& c, const XTiles& xt, std::int64_t r0,
                                      std::int64_t r1) {
  constexpr std::int64_t kChunkTileBytes = 384 * 1024;
  const std::int64_t step_bytes = kTerms * kTileRows * kTileRows * 4;
  const std::int64_t chunk =
      xt.groups == 1 ? xt.steps
                     : std::max<std::int64_t>(8, kChunkTileBytes / (step_bytes * xt.groups));
  const std::int64_t panels = (r1 - r0 + kTileRows - 1) / kTileRows;
  std::vector<float> acc(static_cast<std::size_t>(panels * xt.groups * kTileRows * kTileRows));
  std::int64_t shape_m = -1, shape_rows = -1;
  for (std::int64_t s0 = 0; s0 < xt.steps; s0 += chunk) {
    const std::int64_t s1 = std::min(xt.steps, s0 + chunk);
    for (std::int64_t p = 0; p < panels; ++p) {
      const std::int64_t n0 = r0 + p * kTileRows;
      const std::int64_t a_rows = std::min<std::int64_t>(kTileRows, r1 - n0);
      for (std::int64_t g = 0; g < xt.groups; ++g) {
        const std::int64_t m = xt.m(g, c.n);
        if (m != shape_m || a_rows != shape_rows) configure(m, a_rows);
        shape_m = m;
        shape_rows = a_rows;
        panel(c, xt, g, n0, a_rows, s0, s1,
              acc.data() + (p * xt.groups + g) * kTileRows * kTileRows);
      }
    }
  }
  _tile_release();
}

// ---- The block formats in the kBlockSum order on AMX-INT8 (TDPBSUD) ----
//
// The integer block sums I_b of up to 8 x rows against a panel of 16 W rows are one tile
// product per block: A = the x rows' 32 codes of block b (signed, straight from QuantizedX: the
// row stride is the x row), B = the panel's block in pack_weight's layout (8 rows of 64 bytes,
// row k holding each W row's codes 4k..4k+3, unsigned: q8_0 plus 128, q4 as stored, whose
// nibbles are first spread to bytes), C[i][j] = I for x row i and W row j, exact in int32 (plus
// the same -128 / -8 times x's code sum as the VNNI path). Row i of C is then the 16 lanes the
// VNNI path holds for x row i, and the float steps are the same ones lane for lane, so both
// paths give the same bits (whichever the row count picks).
//
// Software-pipelined by one block: the tiles go through memory twice (q4's spread bytes into
// the B tile, the C tile out to the float steps), and a load right after the store that feeds
// it waits for the store to drain (measured: half the kernel's time sat behind those two
// loads). So block b's tile products run while block b + 1's nibbles are spread and block
// b - 1's sums take their float steps, each from scratch written one block earlier.
#define MIXKV_AMX_INT8_TARGET \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

// CPUID leaf 7: AMX-TILE (EDX 24), AMX-INT8 (EDX 25), AVX-512 F/DQ/BW/VL; then the tile state.
inline bool probe_int8() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a < 7) return false;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  const bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
  const bool avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
  if (!tile || !int8 || !avx512) return false;
  constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kXtileData = 18;         // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

inline bool int8_available() {
  static const bool ok = probe_int8();
  return ok && switched_on().load(std::memory_order_relaxed);
}

// x rows per group of tiles and panels per group (two tile products in flight per pair).
constexpr int kInt8Rows = 8;
constexpr int kInt8Panels = 2;

// Two tile sets, by pair parity (tile registers are not renamed: a tile written again waits for
// every reader of its last value, so pair q + 1's products would queue behind pair q's stores).
// One group of m x rows: tiles 0-1 and 2-3 C (2m x 16 int32), one per panel; 4 and 5 A (2m x 64
// codes); 6-7 B (16 x 64 bytes), one per panel (with one panel, 6 and 7 by parity). Two groups
// (m and m1 rows, one panel): C 0 and 2 for the first group, 1 and 3 for the second; A 4 and 5
// by group; B 6 and 7 by parity.
MIXKV_AMX_INT8_TARGET inline void configure_int8(std::int64_t m, std::int64_t m1 = 0) {
  TileConfig cfg;
  const auto rows = static_cast<std::uint8_t>(2 * m);
  const auto rows1 = static_cast<std::uint8_t>(2 * (m1 > 0 ? m1 : m));
  for (int t : {0, 2, 4}) cfg.rows[t] = rows, cfg.colsb[t] = 64;
  for (int t : {1, 3, 5}) cfg.rows[t] = rows1, cfg.colsb[t] = 64;
  for (int t : {6, 7}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// The two pairs in flight, by parity: each panel's C as stored (row h m + i: x row i, block
// 2q + h; column j: W row j), and its B tiles (the pair's codes as bytes).
struct Int8Scratch {
  alignas(64) std::int32_t c[2][kInt8Panels][2 * kInt8Rows][16];
  alignas(64) std::uint8_t b[2][kInt8Panels][16][64];
};
using Int8Sums = std::int32_t[kInt8Panels][2 * kInt8Rows][16];

// Rows 8h .. 8h + 7 of a B tile from one block's codes in a panel, asking for the bytes a
// little ahead: q8_0's copied, q4's nibbles spread to bytes (rows 0-3 the low nibbles, codes
// 4v..4v+3, rows 4-7 the high ones, codes 16 + 4v..).
template <WeightType kT>
MIXKV_AMX_INT8_TARGET inline void int8_b(const std::byte* codes, std::uint8_t (*out)[64]) {
  constexpr PanelFormat kF = panel_format(kT);
  constexpr std::int64_t kAhead = 4096;
  for (std::int64_t o = 0; o < kF.codes; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(codes + kAhead + o), _MM_HINT_T0);
  }
  if constexpr (kT == WeightType::kQ8_0) {
    for (int v = 0; v < 8; ++v) _mm512_store_si512(out[v], _mm512_loadu_si512(codes + 64 * v));
  } else {
    const __m512i low4 = _mm512_set1_epi8(15);
    for (int v = 0; v < 4; ++v) {
      const __m512i w = _mm512_loadu_si512(codes + 64 * v);
      _mm512_store_si512(out[v], _mm512_and_si512(w, low4));
      _mm512_store_si512(out[4 + v], _mm512_and_si512(_mm512_srli_epi16(w, 4), low4));
    }
  }
}

// The float steps of block b for kM x rows (from i0; C rows r0 + i) and kG panels (`pw`), lane
// j the panel's W row j: I = C (+ the start), y = fma(d_w * d_x, float(I), y), q4_1 then
// y = fma(m_w, s_x, y): the VNNI path's steps, lane for lane.
template <WeightType kT, int kM, int kG>
MIXKV_AMX_INT8_TARGET inline void int8_finish(const QuantizedX& qx,
                                              const std::byte* const (&pw)[kG], std::int64_t b,
                                              std::int64_t i0, const Int8Sums& sums, int r0,
                                              __m512 (&y)[kM][kG], int first = 0) {
  constexpr PanelFormat kF = panel_format(kT);
  constexpr int kFactor = panel_factor(kT);
  __m512 dw[kG];
  [[maybe_unused]] __m512 mw[kG];
  for (int g = 0; g < kG; ++g) {
    const std::byte* blk = pw[g] + b * kF.header;
    dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    if constexpr (kT == WeightType::kQ4_1) {
      mw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    }
  }
  for (int i = 0; i < kM; ++i) {
    const auto at = static_cast<std::size_t>((i0 + i) * qx.blocks + b);
    const __m512 dx = _mm512_set1_ps(qx.d[at]);
    [[maybe_unused]] __m512i start;
    [[maybe_unused]] __m512 sx;
    if constexpr (kFactor != 0) start = _mm512_set1_epi32(kFactor * qx.sum[at]);
    if constexpr (kT == WeightType::kQ4_1) sx = _mm512_set1_ps(qx.s[at]);
    for (int g = 0; g < kG; ++g) {
      __m512i sum = _mm512_load_si512(sums[first + g][r0 + i]);
      if constexpr (kFactor != 0) sum = _mm512_add_epi32(sum, start);
      y[i][g] = _mm512_fmadd_ps(_mm512_mul_ps(dw[g], dx), _mm512_cvtepi32_ps(sum), y[i][g]);
      if constexpr (kT == WeightType::kQ4_1) y[i][g] = _mm512_fmadd_ps(mw[g], sx, y[i][g]);
    }
  }
}

// TILESTORED of a C tile into 16 x 16 int32 sums, telling the compiler exactly which memory it
// writes: the intrinsic's "memory" clobber made it keep the float accumulators y in memory, a
// load and a store around every one of their steps.
#define MIXKV_TILE_STORE_SUMS(tile, sums)                                                       \
  __asm__ volatile("tilestored %%tmm" #tile ", (%1,%2,1)"                                       \
                   : "=m"(*reinterpret_cast<std::int32_t(*)[2 * kInt8Rows][16]>(&(sums)[0][0])) \
                   : "r"(&(sums)[0][0]), "r"(64L))

// kG (1 or 2) panels from p against kM <= 8 x rows from i0, every block, into y (a partial
// last panel's padding rows are not stored); with kM1 > 0 (kM = 8, one panel) also the kM1 x
// rows from i0 + 8, a second group meeting the same B tiles, so a panel's codes are spread to
// bytes and loaded once for 9-16 x rows. Blocks go in pairs: one tile product per panel, group
// and pair, A = QuantizedX::a16 (x row i's codes of block 2q + h in row h kM + i, columns
// 32h .. 32h + 31, zeros elsewhere), B = the pair's codes (rows 0-7 block 2q, 8-15 block
// 2q + 1), so C row h kM + i sums block 2q + h alone: a full-size tile product for 2 x 8 rows
// where one block would fill a quarter of one, and half the tile instructions. An odd last
// block leaves B's rows 8-15 as they were: A's zeros meet them. Tiles as configure_int8 sets.
template <WeightType kT, int kM, int kG, int kM1 = 0>
MIXKV_AMX_INT8_TARGET inline void int8_panels(const MatmulCall& c, std::int64_t p, std::int64_t i0,
                                              Int8Scratch& s) {
  constexpr PanelFormat kF = panel_format(kT);
  static_assert(kG == 1 || kG == 2);
  static_assert(kM1 == 0 || (kG == 1 && kM == kInt8Rows));
  const QuantizedX& qx = *c.qx;
  const std::int64_t blocks = qx.blocks, pairs = (blocks + 1) / 2;
  const std::byte* pw[kG];  // the panels' scales
  const std::byte* pc[kG];  // their codes
  for (int g = 0; g < kG; ++g) {
    pw[g] = c.packed + (p + g) * kF.bytes(blocks);
    pc[g] = pw[g] + kF.codes_at(blocks, 0);
  }
  const std::int8_t* xa = qx.a16.data() + i0 * pairs * 128;
  [[maybe_unused]] const std::int8_t* xa1 = qx.a16.data() + (i0 + kInt8Rows) * pairs * 128;
  constexpr int kRows1 = kM1 > 0 ? kM1 : 1;
  __m512 y[kM][kG], y1[kRows1][1];
  for (int i = 0; i < kM; ++i)
    for (int g = 0; g < kG; ++g) y[i][g] = _mm512_setzero_ps();
  for (int i = 0; i < kRows1; ++i) y1[i][0] = _mm512_setzero_ps();
  // Pair q's B tiles (q8_0's whole pairs straight from the panel, whose two blocks' codes are
  // the tile's 16 rows; the rest through s.b[set]); its float steps from s.c[set].
  const void* src[2][kG];
  const auto make_b = [&](std::int64_t q, int set) MIXKV_AMX_INT8_TARGET {
    for (int g = 0; g < kG; ++g) {
      const std::byte* codes = pc[g] + 2 * q * kF.codes;
      if (kT == WeightType::kQ8_0 && 2 * q + 1 < blocks) {
        for (std::int64_t o = 0; o < 2 * kF.codes; o += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(codes + 4096 + o), _MM_HINT_T0);
        }
        src[set][g] = codes;
        continue;
      }
      int8_b<kT>(codes, s.b[set][g]);
      if (2 * q + 1 < blocks) int8_b<kT>(codes + kF.codes, s.b[set][g] + 8);
      src[set][g] = s.b[set][g];
    }
  };
  const auto finish = [&](std::int64_t q, int set) MIXKV_AMX_INT8_TARGET {
    for (int h = 0; h < 2 && 2 * q + h < blocks; ++h) {
      int8_finish<kT, kM, kG>(qx, pw, 2 * q + h, i0, s.c[set], h * kM, y);
      if constexpr (kM1 > 0) {
        int8_finish<kT, kRows1, 1>(qx, pw, 2 * q + h, i0 + kInt8Rows, s.c[set], h * kM1, y1, 1);
      }
    }
  };
  make_b(0, 0);
  // Pair q on tile set `set` (tile numbers are literals in the instructions, hence a macro):
  // its products into scratch, then pair q + 1's B tiles made, then pair q - 1's float steps.
  // The asm tells the compiler that the tiles read the scratch (B's bytes are stored first).
#define MIXKV_INT8_PAIR(set, c0, c1, a, b0, b1)                               \
  do {                                                                        \
    __asm__ volatile("" : "+m"(s));                                           \
    if constexpr (kM1 > 0) {                                                  \
      _tile_loadd(4, xa + q * (2 * kM * 64), 64);                             \
      _tile_loadd(5, xa1 + q * (2 * kM1 * 64), 64);                           \
      _tile_loadd(b1, src[set][0], 64);                                       \
      _tile_zero(c0);                                                         \
      _tile_dpbsud(c0, 4, b1);                                                \
      _tile_zero(c1);                                                         \
      _tile_dpbsud(c1, 5, b1);                                                \
    } else {                                                                  \
      _tile_loadd(a, xa + q * (2 * kM * 64), 64);                             \
      _tile_loadd(b0, src[set][0], 64);                                       \
      _tile_zero(c0);                                                         \
      _tile_dpbsud(c0, a, b0);                                                \
      if constexpr (kG == 2) {                                                \
        _tile_loadd(b1, src[set][kG - 1], 64);                                \
        _tile_zero(c1);                                                       \
        _tile_dpbsud(c1, a, b1);                                              \
      }                                                                       \
    }                                                                         \
    MIXKV_TILE_STORE_SUMS(c0, s.c[set][0]);                                   \
    if constexpr (kG == 2 || kM1 > 0) MIXKV_TILE_STORE_SUMS(c1, s.c[set][1]); \
    if (q + 1 < pairs) make_b(q + 1, (set) ^ 1);                              \
    if (q > 0) finish(q - 1, (set) ^ 1);                                      \
  } while (false)
  // Set 0: C 0 (and 1), A 4, B 6 (and 7); set 1: C 2 (and 3), A 5, B 6 and 7 (two panels) or 7.
  // Two groups: C 0-1 / 2-3, A 4 and 5 by group, B 6 / 7 (the last argument) by set.
  for (std::int64_t q = 0; q < pairs; ++q) {
    if constexpr (kM1 > 0) {
      MIXKV_INT8_PAIR(0, 0, 1, 4, 6, 6);
    } else {
      MIXKV_INT8_PAIR(0, 0, 1, 4, 6, 7);
    }
    if (++q == pairs) break;
    if constexpr (kG == 2) {
      MIXKV_INT8_PAIR(1, 2, 3, 5, 6, 7);
    } else {
      MIXKV_INT8_PAIR(1, 2, 3, 5, 7, 7);
    }
  }
#undef MIXKV_INT8_PAIR
  finish(pairs - 1, static_cast<int>((pairs - 1) & 1));
  for (int g = 0; g < kG; ++g) {
    const std::int64_t r0 = (p + g) * kPanelRows, left = c.rows - r0;
    const auto store = [&](std::int64_t row, __m512 v) MIXKV_AMX_INT8_TARGET {
      float* out = c.y + row * c.rows + r0;
      if (left >= kPanelRows) {
        _mm512_storeu_ps(out, v);
      } else {
        _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << left) - 1), v);
      }
    };
    for (int i = 0; i < kM; ++i) store(i0 + i, y[i][g]);
    for (int i = 0; i < kM1; ++i) store(i0 + kInt8Rows + i, y1[i][0]);
  }
}
#undef MIXKV_TILE_STORE_SUMS

template <WeightType kT, int kM = 1>
MIXKV_AMX_INT8_TARGET inline void int8_group(const MatmulCall& c, std::int64_t p, int panels,
                                             std::int64_t i0, std::int64_t m, Int8Scratch& s) {
  if constexpr (kM < kInt8Rows) {
    if (m > kM) return int8_group<kT, kM + 1>(c, p, panels, i0, m, s);
  }
  if (panels == kInt8Panels) {
    int8_panels<kT, kM, kInt8Panels>(c, p, i0, s);
  } else {
    int8_panels<kT, kM, 1>(c, p, i0, s);
  }
}

// One panel against 8 + m1 x rows from i0 (1 <= m1 <= 8).
template <WeightType kT, int kM1 = 1>
MIXKV_AMX_INT8_TARGET inline void int8_two_groups(const MatmulCall& c, std::int64_t p,
                                                  std::int64_t i0, std::int64_t m1,
                                                  Int8Scratch& s) {
  if constexpr (kM1 < kInt8Rows) {
    if (m1 > kM1) return int8_two_groups<kT, kM1 + 1>(c, p, i0, m1, s);
  }
  int8_panels<kT, kInt8Rows, 1, kM1>(c, p, i0, s);
}

// W rows [r0, r1) (whole panels but the last) against every x row. Up to 8 x rows: two panels
// at a time (one at a time for the last one or two). More: panel by panel, every 16 x rows (two
// groups of 8 sharing the panel's B tiles; a last 1-8 as one group) meeting it while it is in
// cache.
template <WeightType kT>
MIXKV_AMX_INT8_TARGET inline void int8_rows_of(const MatmulCall& c, std::int64_t r0,
                                               std::int64_t r1) {
  Int8Scratch s{};  // zeros: an odd last block's B rows 8-15 are read before any pair wrote them
  std::int64_t shape = -1;  // the rows of the configured tiles' groups: 1-8 one, 9-16 two
  const auto shape_for = [&](std::int64_t m) MIXKV_AMX_INT8_TARGET {
    if (m == shape) return;
    if (m > kInt8Rows) {
      configure_int8(kInt8Rows, m - kInt8Rows);
    } else {
      configure_int8(m);
    }
    shape = m;
  };
  const std::int64_t p_end = (r1 + kPanelRows - 1) / kPanelRows;
  for (std::int64_t p = r0 / kPanelRows; p < p_end;) {
    if (c.n <= kInt8Rows) {
      const int panels = p + kInt8Panels <= p_end ? kInt8Panels : 1;
      shape_for(c.n);
      int8_group<kT>(c, p, panels, 0, c.n, s);
      p += panels;
      continue;
    }
    for (std::int64_t i0 = 0; i0 < c.n; i0 += 2 * kInt8Rows) {
      const std::int64_t m = std::min<std::int64_t>(2 * kInt8Rows, c.n - i0);
      shape_for(m);
      if (m > kInt8Rows) {
        int8_two_groups<kT>(c, p, i0, m - kInt8Rows, s);
      } else {
        int8_group<kT>(c, p, 1, i0, m, s);
      }
    }
    ++p;
  }
  _tile_release();
}

inline void int8_rows(const MatmulCall& c, std::int64_t r0, std::int64_t r1) {
  switch (c.type) {
    case WeightType::kQ8_0:
      return int8_rows_of<WeightType::kQ8_0>(c, r0, r1);
    case WeightType::kQ4_0:
      return int8_rows_of<WeightType::kQ4_0>(c, r0, r1);
    default:
      return int8_rows_of<WeightType::kQ4_1>(c, r0, r1);
  }
}

}  // namespace mixkv::kernels::detail::amx
#endif
