// Weight-streaming matrix products with Highway. This file is compiled once per instruction set
// (foreach_target.h re-includes it); matmul() checks its arguments once and runs the best copy
// the CPU has (HWY_DYNAMIC_DISPATCH).
//
// The reduction order (docs/kernels.md): y[i][r] keeps one vector accumulator; for j = 0, N, 2N,
// ... over W's columns (N = the target's float lanes) it does acc = x[i][j..j+N) * w[r][j..j+N)
// + acc (one fused multiply-add), then sums the lanes with Highway's SumOfLanes. Nothing in that
// chain depends on how many rows of x there are, which rows of W sit in the same register tile,
// or which thread runs them; both ways of reading W (decoded in registers, or decoded once into
// a small scratch chunk and then reused for several rows of x) feed it the same floats, and
// column chunks only pause the chain (the accumulator goes to memory and comes back unchanged).
#include "mixkv/kernels/matmul.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <vector>

#include "kernels/bf16_pairs.hpp"
#include "kernels/element_load.hpp"
#include "kernels/line_aligned.hpp"
#include "kernels/prefetch.hpp"
#include "mixkv/kernels/convert.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers after foreach_target.h, as its documentation requires.
#include <hwy/highway.h>

#include "kernels/simd_decode-inl.h"

#ifndef MIXKV_KERNELS_MATMUL_SHARED_
#define MIXKV_KERNELS_MATMUL_SHARED_
namespace mixkv::kernels::detail {

// Rows of W in one register tile: each decoded W vector meets up to kMaxX rows of x, each x
// vector up to kTileW rows of W.
constexpr std::int64_t kTileW = 4;
// Columns decoded at once into scratch when W is reused for several register tiles of x rows.
constexpr std::int64_t kChunkCols = 512;

// The rows of x as ggml quantises activations for its block-format dot products (its
// vec_dot_type: q8_1 for q4_1 weights, q8_0 for q4_0 and q8_0 weights), 32 elements per block:
// d = amax / 127 rounded to fp16, q = x * (127 / amax) rounded to the nearest integer (ties to
// even), and for q8_1 s = d * sum q rounded to fp16 (d before its rounding). Scales are kept
// decoded. Filled once per call by quantize_x, before any task runs, so every path and thread
// reads the same codes.
struct QuantizedX {
  std::int64_t blocks = 0;    // per row
  LineVector<std::int8_t> q;  // [n][blocks * 32]
  LineVector<float> d;        // [n][blocks]
  LineVector<float> s;        // [n][blocks], q8_1 only
  // For the AVX-512 VNNI path: each block's codes as quarters [0..15, 0..15, 16..31, 16..31]
  // ([n][blocks][64]), and the accumulator's start per lane, -8 (q4_0) or -128 (q8_0) times
  // the sum of the lane's four codes ([n][blocks][16] in the same layout; not for q4_1).
  LineVector<std::int8_t> x64;
  LineVector<std::int32_t> c64;
  // The kBlockSum order's q8_0 / q4_0 weights: each block's sum of codes ([n][blocks]).
  LineVector<std::int32_t> sum;
  // For the AVX2 packed path (ptile256): the same codes and scales with the rows of each group
  // (row_group_size) interleaved per block, so one pointer and constant offsets reach every row
  // of the group (the group from row i0, m rows: codes at (i0 blocks + b m + i) 32, the scales
  // and sums at i0 blocks + b m + i). Empty elsewhere.
  LineVector<std::int8_t> grouped_q;
  LineVector<float> grouped_d, grouped_s;
  LineVector<std::int32_t> grouped_sum;
  // For the AMX-INT8 path (matmul_amx.hpp, int8_panels): per group of up to 8 rows (m rows,
  // from row 8g at byte 8g * pairs * 128), per pair q of blocks, a tile of 2m rows of 64 codes:
  // row h m + i holds x row 8g + i's codes of block 2q + h in bytes 32h .. 32h + 31, zeros
  // elsewhere (and for a missing last block).
  LineVector<std::int8_t> a16;
};

// The kBlockSum order of bfloat16 weights reads x rounded to bf16 (float_to_bf16), once per call,
// by pairs of columns. VDPBF16PS reads the codes: pairs[i * count + q] holds row i's codes of
// column 2 q (low half) and 2 q + 1 (high half; zero past the last column). The float lanes read
// the same values as floats, in the order they add them: terms[2 (i * count + q)] is column
// 2 q + 1, terms[2 (i * count + q) + 1] column 2 q. A call fills the one its path reads.
struct Bf16X {
  std::int64_t count = 0;  // pairs a row
  LineVector<std::uint32_t> pairs;
  LineVector<float> terms;
};

// The kBlockSum order of bfloat16 weights reads W in panels of this many rows (pack_weight's
// layout, or packed on the fly a panel at a time): per pair q of columns, 32 words, word j
// holding row j's codes of columns 2 q (low half) and 2 q + 1 (high half), zeros past the last
// row and column. Two 512-bit vectors a step, so 8 rows of x take 16 accumulators.
constexpr std::int64_t kBf16PanelRows = 32;

// Panel p of a bfloat16 weight of rows x cols (rows of 2 cols bytes at w) into `out`
// (kBf16PanelRows words per pair of columns).
inline void pack_bf16_panel(const std::byte* w, std::int64_t rows, std::int64_t cols,
                            std::int64_t p, std::uint32_t* out) {
  const std::int64_t pairs = (cols + 1) / 2;
  std::fill_n(out, pairs * kBf16PanelRows, 0u);
  for (std::int64_t j = 0; j < kBf16PanelRows && p * kBf16PanelRows + j < rows; ++j) {
    const std::byte* row = w + (p * kBf16PanelRows + j) * cols * 2;
    for (std::int64_t q = 0; q < cols / 2; ++q)
      std::memcpy(out + q * kBf16PanelRows + j, row + 4 * q, 4);  // little-endian: 2 q low
    if (cols % 2 != 0) {
      std::uint16_t last = 0;
      std::memcpy(&last, row + 2 * (cols - 1), 2);
      out[(pairs - 1) * kBf16PanelRows + j] = last;
    }
  }
}

// kBlockSum's packed layout (pack_weight): panels of this many W rows, one VNNI lane each.
constexpr std::int64_t kPanelRows = 16;

// The AVX2 packed path takes the rows of x in row_groups groups of at most group_rows, as even
// as they divide (16 q4 rows as 8 + 8): group g has row_group_size rows. q4 keeps one 16-bit
// sum per x row live, q8_0 two (its low and high nibbles), in 16 vector registers.
constexpr std::int64_t kMaxGroupRows = 8;
constexpr std::int64_t group_rows(WeightType t) { return t == WeightType::kQ8_0 ? 5 : 8; }
constexpr std::int64_t row_groups(WeightType t, std::int64_t n) {
  return (n + group_rows(t) - 1) / group_rows(t);
}
constexpr std::int64_t row_group_size(WeightType t, std::int64_t n, std::int64_t g) {
  return n / row_groups(t, n) + (g < n % row_groups(t, n) ? 1 : 0);
}

// One panel of pack_weight's layout for a block format: first every block's scales (`header`
// bytes: the 16 rows' fp16 d, q4_1 then their 16 m), then every block's codes (`codes` bytes),
// so the codes of consecutive blocks are contiguous (an AMX B tile of two blocks is one load).
struct PanelFormat {
  std::int64_t header = 0, codes = 0;
  std::int64_t bytes(std::int64_t blocks) const { return blocks * (header + codes); }
  std::int64_t codes_at(std::int64_t blocks, std::int64_t b) const {
    return blocks * header + b * codes;
  }
};
constexpr PanelFormat panel_format(WeightType t) {
  return t == WeightType::kQ8_0   ? PanelFormat{32, 512}
         : t == WeightType::kQ4_0 ? PanelFormat{32, 256}
                                  : PanelFormat{64, 256};
}
// The integer sums' start, times x's code sum: the packed codes are unsigned (q8_0 plus 128,
// q4_0 as stored, 8 above its values).
constexpr int panel_factor(WeightType t) {
  return t == WeightType::kQ8_0 ? -128 : t == WeightType::kQ4_0 ? -8 : 0;
}

// The software prefetch of a tile of kG packed panels (consecutive in memory, each its headers
// then its codes, all read front to back together): per block of the tile, one block's lines of
// each panel, about 8 KiB ahead in all (fewer panels, each further ahead: the memory's latency
// needs that much in flight at every row count). A position past its panel's end is asked for
// in the same panel of the next tile, where the stream goes on. (Counted within the panel alone,
// a tile of short panels, SmolLM2's 576 columns of 18 blocks, asked again for lines it was
// already loading, and the next tile's first lines came unasked: docs/kernels.md.)
template <PanelFormat kF, int kG>
class PanelPrefetch {
 public:
  // blocks >= 1 (check_shape refuses empty rows).
  explicit PanelPrefetch(std::int64_t blocks) : stride_(kG * kF.bytes(blocks)), blocks_(blocks) {
    block_ = kAheadBlocks;
    while (block_ >= blocks_) {
      block_ -= blocks_;
      skip_ += stride_;
    }
  }
  // The lines ahead of the current block of the tile's panel that starts at `panel`.
  void ask(const std::byte* panel) const {
    const std::byte* base = panel + skip_;
    prefetch_l2(base + block_ * kF.header);
    const std::byte* codes = base + kF.codes_at(blocks_, block_);
    for (std::int64_t o = 0; o < kF.codes; o += 64) prefetch_l2(codes + o);
  }
  // On to the next block.
  void next() {
    if (++block_ == blocks_) {
      block_ = 0;
      skip_ += stride_;
    }
  }

 private:
  static constexpr std::int64_t kAheadBlocks = std::max<std::int64_t>(1, 8192 / kG / kF.codes);
  std::int64_t stride_;  // bytes from a panel to the same panel of the next tile
  std::int64_t blocks_;
  std::int64_t block_ = 0;  // the block asked for, within its panel
  std::int64_t skip_ = 0;   // bytes from the tile's panel to the one holding it
};

// Everything one matmul call fixes; checked before any task runs.
struct MatmulCall {
  WeightType type = WeightType::kFloat32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_bytes = 0;
  const std::byte* w = nullptr;
  const float* x = nullptr;  // [n, x_stride]; columns cols .. x_stride are zero
  std::int64_t x_stride = 0;
  std::int64_t n = 0;
  float* y = nullptr;              // [n, rows]
  const QuantizedX* qx = nullptr;  // the block formats: x quantised (x itself is not read)
  bool vnni = false;               // the CPU has AVX512-VNNI and tests have not switched it off
  ReductionOrder order = ReductionOrder::kGgml;  // WeightView::order, where it applies
  const std::byte* packed = nullptr;             // kBlockSum: pack_weight's copy of W, or null
  const Bf16X* bx = nullptr;  // bfloat16 weights in the kBlockSum order: x as bf16 codes
  bool bf16_dots = false;     // ... on AVX512-BF16's VDPBF16PS (the CPU has it, not switched off)
};

// quantize_x for one block of 32 (QuantizedX says what it stores). The steps are ggml's (its
// AVX2 quantize_row_q8_0 / _q8_1, which llama.cpp's x86 builds run): the scale divides the
// absolute maximum by 127, the codes multiply by 127 / amax (not by 1 / d), and rounding is to
// the nearest integer with ties to even. Non-finite x (ggml leaves them undefined) give a
// non-finite d, so the outputs they touch are not finite either, and codes stay in range.
inline void quantize_block(const float* x, std::int8_t* q, float* d, float* s) {
  float amax = 0.0f;
  bool finite = true;
  for (int e = 0; e < 32; ++e) {
    finite = finite && std::isfinite(x[e]);
    amax = std::max(amax, std::fabs(x[e]));
  }
  const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
  const float inverse = finite && amax != 0.0f ? 127.0f / amax : 0.0f;
  std::int32_t sum = 0;
  for (int e = 0; e < 32; ++e) {
    const float v = std::nearbyint(x[e] * inverse);
    q[e] = static_cast<std::int8_t>(finite ? std::clamp(v, -127.0f, 127.0f) : 0.0f);
    sum += q[e];
  }
  *d = fp16_to_float(float_to_fp16(scale));
  if (s != nullptr) *s = fp16_to_float(float_to_fp16(scale * static_cast<float>(sum)));
}

}  // namespace mixkv::kernels::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace mixkv::kernels::detail::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Rows of x per register tile: kMaxX x kTileW accumulators, kTileW W vectors and one x vector
// must fit the register file (32 vectors on AVX-512, 16 elsewhere).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kMaxX = 4;
// Up to this many rows of x, W is decoded in registers (4 x 4 or 8 x 2 accumulators).
constexpr int kMaxRegX = 8;
#else
constexpr int kMaxX = 2;
constexpr int kMaxRegX = 2;
#endif

constexpr std::int64_t kBlock = 32;

// An fp16 scale broadcast to a vector (F16C where the target has it: no trip through the scalar
// integer unit per block).
HWY_INLINE VF fp16_splat(const std::byte* p) {
  const DF df;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  const hn::Rebind<std::uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::BitCast(dh, hn::Set(d16, load_u16(p))));
#else
  return hn::Set(df, fp16_bits_to_float(load_u16(p)));
#endif
}

// x rounded to the nearest fp16 (ties to even) and back: float_to_fp16 and fp16_to_float's bits
// for every finite and infinite x (F16C's conversions, one instruction each, where the target has
// them; the scalar pair elsewhere). quantize_x's scales, one per block of 32 activations.
HWY_INLINE float round_to_fp16(float x) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
  return fp16_to_float(float_to_fp16(x));
#endif
}

// Vectors per block of 32 elements (the block formats need N <= 32, so a vector never leaves its
// block; every x86 and NEON target has N <= 16).
constexpr std::int64_t kVecs = kBlock / static_cast<std::int64_t>(hn::MaxLanes(DF()));
static_assert(kVecs >= 1 && kVecs * static_cast<std::int64_t>(hn::MaxLanes(DF())) == kBlock);

// Elements 32 b .. 32 b + 32 of a W row as kVecs vectors. The block formats decode exactly as
// ggml defines them; q8_0 and q4_0 values are exact in float (an fp16 scale times a small
// integer), q4_1 rounds q * d + m once (a fused multiply-add where the target has one). Each
// block's scales are decoded once for its vectors.
template <WeightType kT>
HWY_INLINE void load_block(const std::byte* row, std::int64_t b, VF* out) {
  const DF df;
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(DF()));
  if constexpr (kT == WeightType::kFloat32 || kT == WeightType::kBfloat16 ||
                kT == WeightType::kFloat16) {
    constexpr DType dt = kT == WeightType::kFloat32    ? DType::kFloat32
                         : kT == WeightType::kBfloat16 ? DType::kBfloat16
                                                       : DType::kFloat16;
    for (std::int64_t v = 0; v < kVecs; ++v) out[v] = decode<dt>(row, b * kBlock + v * n, 1.0f);
  } else if constexpr (kT == WeightType::kQ8_0) {
    const std::byte* block = row + b * 34;
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<std::int8_t, DF> d8;
    const VF d = fp16_splat(block);
    const auto* qs = reinterpret_cast<const std::int8_t*>(block + 2);
    for (std::int64_t v = 0; v < kVecs; ++v)
      out[v] = hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, qs + v * n))), d);
  } else {
    constexpr std::int64_t kHeader = kT == WeightType::kQ4_0 ? 2 : 4;
    const std::byte* block = row + b * (kHeader + 16);
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<std::uint8_t, DF> d8;
    const auto* qs = reinterpret_cast<const std::uint8_t*>(block + kHeader);
    const VF d = fp16_splat(block);
    [[maybe_unused]] const VF m = kT == WeightType::kQ4_1 ? fp16_splat(block + 2) : hn::Zero(df);
    for (std::int64_t v = 0; v < kVecs; ++v) {
      // Elements 0..15 are the low nibbles of bytes 0..15, elements 16..31 their high nibbles.
      const std::int64_t o = v * n;
      const auto bytes = hn::PromoteTo(di, hn::LoadU(d8, qs + (o & 15)));
      const VF q =
          hn::ConvertTo(df, o < 16 ? hn::And(bytes, hn::Set(di, 15)) : hn::ShiftRight<4>(bytes));
      if constexpr (kT == WeightType::kQ4_0) {
        out[v] = hn::Mul(hn::Sub(q, hn::Set(df, 8.0f)), d);
      } else {
        out[v] = hn::MulAdd(q, d, m);
      }
    }
  }
}

template <WeightType kT>
constexpr std::int64_t kBlockBytes = kT == WeightType::kQ8_0   ? 34
                                     : kT == WeightType::kQ4_0 ? 18
                                                               : 20;

DType float_dtype(WeightType type) {
  switch (type) {
    case WeightType::kBfloat16:
      return DType::kBfloat16;
    case WeightType::kFloat16:
      return DType::kFloat16;
    default:
      return DType::kFloat32;
  }
}

// Columns [c0, c1) of a W row into out (zero-padded to a whole vector): whole vectors through
// load_w, a float type's tail (cols not a multiple of N) element by element, exactly.
template <WeightType kT>
void decode_cols(const std::byte* row, std::int64_t c0, std::int64_t c1, float* out) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t j = c0;  // c0 is a multiple of the block
  for (; j + kBlock <= c1; j += kBlock) {
    VF w[kVecs];
    load_block<kT>(row, j / kBlock, w);
    for (std::int64_t v = 0; v < kVecs; ++v) hn::StoreU(w[v], df, out + (j - c0) + v * n);
  }
  if (j < c1) {  // float types only: a partial block, zero-padded to whole vectors
    std::fill(out + (j - c0), out + (j - c0) + kBlock, 0.0f);
    const std::int64_t elem = kT == WeightType::kFloat32 ? 4 : 2;
    load_row(float_dtype(kT), nullptr, row + j * elem, static_cast<std::size_t>(c1 - j), 1.0f,
             out + (j - c0));
  }
}

// Asks for W's bytes [offset, offset + bytes), clipped to the weight (never past its end).
HWY_INLINE void prefetch_w(const MatmulCall& c, std::int64_t offset, std::int64_t bytes) {
  const std::int64_t end = std::min(offset + bytes, c.rows * c.row_bytes);
  for (std::int64_t o = offset; o < end; o += 64) prefetch_l2(c.w + o);
}

// Rows of at most this many bytes are short: a register tile's rows, which follow each other in
// memory, end within a few KiB, so they are read as one stream (SmolLM2's rows of 576 and 1536
// columns: 1,152 and 3,072 bytes in bf16).
constexpr std::int64_t kShortRowBytes = 4096;
// How far ahead a tile of short rows asks for W, in bytes of that one stream.
constexpr std::int64_t kShortRowsAhead = 8192;

// The prefetch of a register tile of `rows` W rows from r0 that has read `done` bytes of each row
// and is about to read `next` more. Long rows: each row `ahead` bytes past its own position.
// Short rows: the tile's stream kShortRowsAhead past its position, as many bytes as it reads
// (asked for row by row, the lines `ahead` past a short row were the next row's, which the tile
// was already reading, and the next tile's lines came unasked: a bf16 1536 x 576 product, one
// row, took 88-98 us on 2 threads, 59-62 us as one stream; docs/kernels.md).
HWY_INLINE void prefetch_tile(const MatmulCall& c, std::int64_t r0, int rows, std::int64_t done,
                              std::int64_t next, std::int64_t ahead) {
  if (c.row_bytes <= kShortRowBytes) {
    prefetch_w(c, r0 * c.row_bytes + done * rows + kShortRowsAhead, next * rows);
    return;
  }
  for (int r = 0; r < rows; ++r) prefetch_w(c, (r0 + r) * c.row_bytes + done + ahead, next);
}

// Whether a register tile of `x_rows` x rows over a float weight (f32, bf16, f16) asks for W's
// lines itself. Not with one x row over long rows: that tile does little arithmetic per line and
// reads its W rows front to back, which the core's stream prefetchers follow; a prefetch beside
// every load cost a Zen 5 a third of a one-row bf16 or f16 product (4096 x 14336: 6.1-6.6 ->
// 4.1-4.2 ms on one thread, 3.3-3.6 -> 2.1-2.7 on two). More x rows and short rows (one stream
// across the tile's rows) still ask, and so do the block formats' tiles (q8_0's one-row product
// was 20% slower there without); docs/kernels-speed.md, "A Zen 5 sitting".
HWY_INLINE bool asks_for_float_w(const MatmulCall& c, int x_rows) {
  return x_rows > 1 || c.row_bytes <= kShortRowBytes;
}

// kX rows of x (from row i0) against kW rows of W (from row r0), W decoded in registers; the
// whole row in one pass (cols a multiple of the block).
template <WeightType kT, int kX, int kW>
HWY_NOINLINE void tile_registers(const MatmulCall& c, std::int64_t r0, std::int64_t i0) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const std::byte* wr[kW];
  for (int r = 0; r < kW; ++r) wr[r] = c.w + (r0 + r) * c.row_bytes;
  const float* xr[kX];
  for (int i = 0; i < kX; ++i) xr[i] = c.x + (i0 + i) * c.x_stride;
  VF acc[kX][kW];
  for (int i = 0; i < kX; ++i)
    for (int r = 0; r < kW; ++r) acc[i][r] = hn::Zero(df);
  // W arrives from memory: ask for it a little ahead of the loads (kPrefetch bytes per row).
  constexpr std::int64_t kPrefetch = 1024;
  const std::int64_t block_bytes = c.row_bytes / (c.cols / kBlock);
  const std::int64_t blocks = c.cols / kBlock;
  // The decoded block b of every W row meets every x row.
  const auto multiply = [&](std::int64_t b, const VF(&w)[kW][kVecs]) HWY_ATTR {
    for (std::int64_t v = 0; v < kVecs; ++v) {
      for (int i = 0; i < kX; ++i) {
        const VF xv = hn::LoadU(df, xr[i] + b * kBlock + v * n);
        for (int r = 0; r < kW; ++r) acc[i][r] = hn::MulAdd(xv, w[r][v], acc[i][r]);
      }
    }
  };
  constexpr bool kFloatW =
      kT == WeightType::kFloat32 || kT == WeightType::kBfloat16 || kT == WeightType::kFloat16;
  const bool ask = !kFloatW || asks_for_float_w(c, kX);
  for (std::int64_t b = 0; b < blocks; ++b) {
    if (ask) prefetch_tile(c, r0, kW, b * block_bytes, block_bytes, kPrefetch);
    VF w[kW][kVecs];
    for (int r = 0; r < kW; ++r) load_block<kT>(wr[r], b, w[r]);
    multiply(b, w);
  }
  for (int i = 0; i < kX; ++i)
    for (int r = 0; r < kW; ++r)
      c.y[(i0 + i) * c.rows + r0 + r] = hn::GetLane(hn::SumOfLanes(df, acc[i][r]));
}

// kX rows of x (from i0) against kW decoded W rows in scratch (`ws`, `ws_stride` floats apart)
// over `len` columns starting at c0; the accumulators of (i, r) live at acc + (r * n + i) * N.
template <int kX, int kW>
HWY_NOINLINE void tile_scratch(const MatmulCall& c, const float* ws, std::int64_t ws_stride,
                               std::int64_t c0, std::int64_t len, std::int64_t i0, float* acc_mem) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  const float* xr[kX];
  for (int i = 0; i < kX; ++i) xr[i] = c.x + (i0 + i) * c.x_stride + c0;
  VF acc[kX][kW];
  for (int i = 0; i < kX; ++i)
    for (int r = 0; r < kW; ++r) acc[i][r] = hn::LoadU(df, acc_mem + (r * c.n + i0 + i) * n);
  for (std::int64_t j = 0; j < len; j += n) {
    VF w[kW];
    for (int r = 0; r < kW; ++r) w[r] = hn::LoadU(df, ws + r * ws_stride + j);
    for (int i = 0; i < kX; ++i) {
      const VF xv = hn::LoadU(df, xr[i] + j);
      for (int r = 0; r < kW; ++r) acc[i][r] = hn::MulAdd(xv, w[r], acc[i][r]);
    }
  }
  for (int i = 0; i < kX; ++i)
    for (int r = 0; r < kW; ++r) hn::StoreU(acc[i][r], df, acc_mem + (r * c.n + i0 + i) * n);
}

// The x rows of one register tile, all of them (n <= kMaxRegX), against kW rows of W from r0.
template <WeightType kT, int kW, int kX = 1>
void registers_rows(const MatmulCall& c, std::int64_t r0) {
  // 4 x 4 accumulators at most with four W rows, 8 x 2 with two.
  constexpr int kLimit = kW == 4 ? std::min(4, kMaxRegX) : kMaxRegX;
  if constexpr (kX < kLimit) {
    if (c.n > kX) return registers_rows<kT, kW, kX + 1>(c, r0);
  }
  tile_registers<kT, kX, kW>(c, r0, 0);
}

template <int kW>
void scratch_rows(const MatmulCall& c, const float* ws, std::int64_t ws_stride, std::int64_t c0,
                  std::int64_t len, float* acc) {
  for (std::int64_t i0 = 0; i0 < c.n; i0 += kMaxX) {
    switch (std::min<std::int64_t>(kMaxX, c.n - i0)) {
      case 1:
        tile_scratch<1, kW>(c, ws, ws_stride, c0, len, i0, acc);
        break;
      case 2:
        if constexpr (kMaxX >= 2) tile_scratch<2, kW>(c, ws, ws_stride, c0, len, i0, acc);
        break;
      case 3:
        if constexpr (kMaxX >= 3) tile_scratch<3, kW>(c, ws, ws_stride, c0, len, i0, acc);
        break;
      default:
        if constexpr (kMaxX >= 4) tile_scratch<4, kW>(c, ws, ws_stride, c0, len, i0, acc);
        break;
    }
  }
}

template <WeightType kT>
void rows_task(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  const DF df;
  const auto n = static_cast<std::int64_t>(hn::Lanes(df));
  // One x tile and whole vectors per row: decode W in registers, it is used once.
  if (c.n <= kMaxRegX && c.cols % kBlock == 0) {
    std::int64_t r = r_begin;
    if (c.n <= 4) {
      for (; r + 4 <= r_end; r += 4) registers_rows<kT, 4>(c, r);
    } else {  // 5..8 rows of x: two W rows per tile keep the accumulators in registers
      for (; r + 2 <= r_end; r += 2) registers_rows<kT, 2>(c, r);
    }
    for (; r < r_end; ++r) registers_rows<kT, 1>(c, r);
    return;
  }
  // Several x tiles share each W tile: decode a chunk of it once into scratch.
  thread_local LineVector<float> ws, acc;
  const std::int64_t ws_stride = kChunkCols;
  if (static_cast<std::int64_t>(ws.size()) < kTileW * ws_stride)
    ws.resize(static_cast<std::size_t>(kTileW * ws_stride));
  const std::int64_t acc_size = kTileW * c.n * n;
  if (static_cast<std::int64_t>(acc.size()) < acc_size)
    acc.resize(static_cast<std::size_t>(acc_size));
  for (std::int64_t r0 = r_begin; r0 < r_end; r0 += kTileW) {
    const std::int64_t kw = std::min(kTileW, r_end - r0);
    std::fill(acc.begin(), acc.begin() + acc_size, 0.0f);
    for (std::int64_t c0 = 0; c0 < c.cols; c0 += kChunkCols) {
      const std::int64_t c1 = std::min(c.cols, c0 + kChunkCols);
      const std::int64_t len = (c1 - c0 + n - 1) / n * n;
      // The next chunk of these rows (the next tile's first chunk at the end of a row: rows
      // follow each other in memory) streams in while this one is used.
      const std::int64_t chunk_bytes = (c1 - c0) * c.row_bytes / c.cols;
      for (std::int64_t r = 0; r < kw; ++r) {
        const std::byte* row = c.w + (r0 + r) * c.row_bytes;
        prefetch_w(c,
                   c1 < c.cols ? (r0 + r) * c.row_bytes + c1 * c.row_bytes / c.cols
                               : (r0 + r + kw) * c.row_bytes,
                   chunk_bytes);
        decode_cols<kT>(row, c0, c1, ws.data() + r * ws_stride);
      }
      if (kw == kTileW) {
        scratch_rows<kTileW>(c, ws.data(), ws_stride, c0, len, acc.data());
      } else {
        for (std::int64_t r = 0; r < kw; ++r)
          scratch_rows<1>(c, ws.data() + r * ws_stride, ws_stride, c0, len,
                          acc.data() + r * c.n * n);
      }
    }
    for (std::int64_t r = 0; r < kw; ++r)
      for (std::int64_t i = 0; i < c.n; ++i)
        c.y[i * c.rows + r0 + r] =
            hn::GetLane(hn::SumOfLanes(df, hn::LoadU(df, acc.data() + (r * c.n + i) * n)));
  }
}

// ---- Block formats: integer dots against x quantised as ggml does (QuantizedX) ----
//
// The arithmetic of each output y[i][r] is that of ggml's CPU dot products as llama.cpp's x86
// builds with AVX2 run them (ggml_vec_dot_q4_1_q8_1 / _q4_0_q8_0 / _q8_0_q8_0 in
// ggml-cpu/arch/x86/quants.c, llama-cpp-python 0.3.16): per block b of 32 columns, eight
// integer sums of four consecutive products each (I_b,k over columns 32 b + 4 k .. + 3, exact in
// int32), then in float, for each k, acc_k = fma(D_b, I_b,k, acc_k) with D_b = d_w * d_x (one
// float product of the two decoded fp16 scales); q4_1 adds a ninth chain summs = fma(m_w, s_x,
// summs) (GCC contracts ggml's summs += m * s into a fused multiply-add). At the end
// y = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)) (+ summs).
// The integers are exact on every path, and the float steps are the same operations in the
// same order on every path, so every instruction set gives the same bits.

// Code e (0..31) of a weight block: q4_0 as q - 8, q8_0 signed, q4_1 as stored.
template <WeightType kT>
HWY_INLINE int weight_code(const std::byte* block, int e) {
  if constexpr (kT == WeightType::kQ8_0) {
    return static_cast<std::int8_t>(block[2 + e]);
  } else {
    constexpr int kHeader = kT == WeightType::kQ4_0 ? 2 : 4;
    const auto byte = static_cast<std::uint8_t>(block[kHeader + (e & 15)]);
    const int q = e < 16 ? byte & 15 : byte >> 4;
    return kT == WeightType::kQ4_0 ? q - 8 : q;
  }
}

HWY_INLINE float tree_sum8(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// One output, scalar (the baseline targets; also what the vector paths must equal).
template <WeightType kT>
float qdot_scalar(const MatmulCall& c, std::int64_t r, std::int64_t i) {
  const QuantizedX& qx = *c.qx;
  const std::byte* row = c.w + r * c.row_bytes;
  const std::int8_t* xq = qx.q.data() + i * qx.blocks * kBlock;
  const float* xd = qx.d.data() + i * qx.blocks;
  float acc[8] = {};
  float summs = 0.0f;
  for (std::int64_t b = 0; b < qx.blocks; ++b) {
    const std::byte* block = row + b * kBlockBytes<kT>;
    const float d = fp16_bits_to_float(load_u16(block)) * xd[b];
    for (int k = 0; k < 8; ++k) {
      std::int32_t sum = 0;
      for (int e = 4 * k; e < 4 * k + 4; ++e) sum += weight_code<kT>(block, e) * xq[b * kBlock + e];
      acc[k] = std::fma(d, static_cast<float>(sum), acc[k]);
    }
    if constexpr (kT == WeightType::kQ4_1) {
      summs = std::fma(fp16_bits_to_float(load_u16(block + 2)), qx.s[i * qx.blocks + b], summs);
    }
  }
  return kT == WeightType::kQ4_1 ? tree_sum8(acc) + summs : tree_sum8(acc);
}

// ---- The kBlockSum order (WeightView::order): per block b one exact integer sum I_b of the 32
// products, then y = fma(d_w * d_x, I_b, y) over the blocks in order (q4_1: then y = fma(m_w,
// s_x, y)), y starting at +0. Integers are exact on every path and the float steps are the same
// three (four) operations per block everywhere, so every path gives the same bits.
template <WeightType kT>
HWY_INLINE std::int32_t block_isum_scalar(const std::byte* block, const std::int8_t* xq) {
  std::int32_t sum = 0;
  for (int e = 0; e < 32; ++e) sum += weight_code<kT>(block, e) * xq[e];
  return sum;
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// AVX2 and AVX-512 targets: 256-bit integer dots (the eight sums of a block are the eight int32
// lanes of one vector), the float steps lane by lane as above.
#if HWY_TARGET <= HWY_AVX3
constexpr int kMaxQX = 4;  // x rows per tile (32 vector registers)
#else
constexpr int kMaxQX = 2;
#endif

HWY_INLINE float tree_sum8(__m256 v) {
  // (lane k + lane k + 4), then (0 + 2, 1 + 3), then their sum: tree_sum8's order.
  __m128 t = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}

// The 32 codes of a weight block as bytes (q4_1 unsigned 0..15; q4_0 and q8_0 signed).
template <WeightType kT>
HWY_INLINE __m256i block_codes(const std::byte* block) {
  if constexpr (kT == WeightType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  } else {
    constexpr int kHeader = kT == WeightType::kQ4_0 ? 2 : 4;
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kHeader));
    const __m256i both =
        _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    const __m256i q = _mm256_and_si256(both, _mm256_set1_epi8(15));
    return kT == WeightType::kQ4_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(8)) : q;
  }
}

// The eight sums of four products of a block (exact: pairs of products stay below 2^15 in the
// 16-bit step, as |w| <= 128 and |x| <= 127).
template <WeightType kT>
HWY_INLINE __m256i block_sums(__m256i w, __m256i x) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kT == WeightType::kQ4_1) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
  } else {  // signed x signed: |w| times x with w's sign
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                             ones);
  }
}

// I_b of one block (kBlockSum): block_sums' eight lanes added up (integers: any order is exact).
template <WeightType kT>
HWY_INLINE std::int32_t block_isum(const std::byte* block, const std::int8_t* xq) {
  const __m256i v = block_sums<kT>(block_codes<kT>(block),
                                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(t);
}

// kX rows of x (from i0) against kW rows of W (from r0), each whole row in one pass.
template <WeightType kT, int kX, int kW>
HWY_NOINLINE void qtile(const MatmulCall& c, std::int64_t r0, std::int64_t i0) {
  const QuantizedX& qx = *c.qx;
  const std::int64_t blocks = qx.blocks;
  const std::byte* wr[kW];
  for (int r = 0; r < kW; ++r) wr[r] = c.w + (r0 + r) * c.row_bytes;
  const std::int8_t* xq[kX];
  const float* xd[kX];
  [[maybe_unused]] const float* xs[kX];
  for (int i = 0; i < kX; ++i) {
    xq[i] = qx.q.data() + (i0 + i) * blocks * kBlock;
    xd[i] = qx.d.data() + (i0 + i) * blocks;
    if constexpr (kT == WeightType::kQ4_1) xs[i] = qx.s.data() + (i0 + i) * blocks;
  }
  __m256 acc[kX][kW];
  [[maybe_unused]] float summs[kX][kW];
  for (int i = 0; i < kX; ++i) {
    for (int r = 0; r < kW; ++r) {
      acc[i][r] = _mm256_setzero_ps();
      summs[i][r] = 0.0f;
    }
  }
  constexpr std::int64_t kPrefetch = 1024;  // bytes ahead of each long W row's loads
  for (std::int64_t b = 0; b < blocks; ++b) {
    __m256i w[kW];
    __m256 dw[kW];
    [[maybe_unused]] float mw[kW];
    prefetch_tile(c, r0, kW, b * kBlockBytes<kT>, kBlockBytes<kT>, kPrefetch);
    for (int r = 0; r < kW; ++r) {
      const std::byte* block = wr[r] + b * kBlockBytes<kT>;
      w[r] = block_codes<kT>(block);
      if constexpr (kT == WeightType::kQ4_1) {
        std::uint32_t dm;
        std::memcpy(&dm, block, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm)));
        dw[r] = _mm256_broadcastss_ps(f);
        mw[r] = _mm_cvtss_f32(_mm_movehdup_ps(f));
      } else {
        dw[r] = _mm256_set1_ps(fp16_bits_to_float(load_u16(block)));
      }
    }
    for (int i = 0; i < kX; ++i) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + b * kBlock));
      const __m256 dx = _mm256_broadcast_ss(xd[i] + b);
      for (int r = 0; r < kW; ++r) {
        const __m256 sums = _mm256_cvtepi32_ps(block_sums<kT>(w[r], xv));
        acc[i][r] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), sums, acc[i][r]);
        if constexpr (kT == WeightType::kQ4_1) summs[i][r] = std::fma(mw[r], xs[i][b], summs[i][r]);
      }
    }
  }
  for (int i = 0; i < kX; ++i) {
    for (int r = 0; r < kW; ++r) {
      float v = tree_sum8(acc[i][r]);
      if constexpr (kT == WeightType::kQ4_1) v += summs[i][r];
      c.y[(i0 + i) * c.rows + r0 + r] = v;
    }
  }
}

#if HWY_TARGET <= HWY_AVX3
// AVX-512 with VNNI (checked at run time: Highway's AVX3 target does not imply it). Two W rows
// per 512-bit register, its 128-bit quarters [row r codes 0..15 | row r + 1 codes 0..15 | row r
// 16..31 | row r + 1 16..31] against x laid out as [x 0..15 | x 0..15 | x 16..31 | x 16..31]
// (QuantizedX::x64): one VPDPBUSD gives both rows' eight sums (lanes 0..3 of quarters 0 and 2
// are row r's k = 0..3 and 4..7). Its first operand is unsigned, so q4_0 keeps its codes 0..15
// and q8_0 adds 128 to its codes, and the accumulator starts at -8 or -128 times the sums of
// x's groups of four (QuantizedX::c64): the same exact integers. The float steps are lane for
// lane those above; the last tree adds quarter 0 to quarter 2 (a_k + a_k+4), then as above.
// The target's own features too (HWY_TARGET_STR), so that clang inlines this namespace's helpers
// (prefetch_tile) into it.
#define MIXKV_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))

MIXKV_VNNI_ATTR HWY_INLINE float tree_sum_quarters(__m512 v, int row) {
  // Quarters 0 + 2 (row 0 of the pair) or 1 + 3 (row 1), then (0 + 2) + (1 + 3) of the four.
  const __m128 a = row == 0 ? _mm512_extractf32x4_ps(v, 0) : _mm512_extractf32x4_ps(v, 1);
  const __m128 b = row == 0 ? _mm512_extractf32x4_ps(v, 2) : _mm512_extractf32x4_ps(v, 3);
  __m128 t = _mm_add_ps(b, a);
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  t = _mm_add_ss(t, _mm_movehdup_ps(t));
  return _mm_cvtss_f32(t);
}

template <WeightType kT, int kX, int kP>
MIXKV_VNNI_ATTR HWY_NOINLINE void qtile_vnni(const MatmulCall& c, std::int64_t r0,
                                             std::int64_t i0) {
  const QuantizedX& qx = *c.qx;
  const std::int64_t blocks = qx.blocks;
  const std::int8_t* xq[kX];
  const float* xd[kX];
  [[maybe_unused]] const float* xs[kX];
  [[maybe_unused]] const std::int32_t* xc[kX];
  for (int i = 0; i < kX; ++i) {
    xq[i] = qx.x64.data() + (i0 + i) * blocks * 64;
    xd[i] = qx.d.data() + (i0 + i) * blocks;
    if constexpr (kT == WeightType::kQ4_1) xs[i] = qx.s.data() + (i0 + i) * blocks;
    if constexpr (kT != WeightType::kQ4_1) xc[i] = qx.c64.data() + (i0 + i) * blocks * 16;
  }
  __m512 acc[kX][kP];
  [[maybe_unused]] __m512 summs[kX][kP];
  for (int i = 0; i < kX; ++i) {
    for (int p = 0; p < kP; ++p) {
      acc[i][p] = _mm512_setzero_ps();
      summs[i][p] = _mm512_setzero_ps();
    }
  }
  // Lane l of a pair's scale vector takes row (l / 4) % 2 of the pair: its d at index 0 or 2 of
  // the converted [d_r, m_r, d_r+1, m_r+1] (q4_1) or [d_r, d_r+1] (others), m at 1 or 3.
  constexpr int kStride = kT == WeightType::kQ4_1 ? 2 : 1;
  const __m512i pick_d = _mm512_set_epi32(kStride, kStride, kStride, kStride, 0, 0, 0, 0, kStride,
                                          kStride, kStride, kStride, 0, 0, 0, 0);
  [[maybe_unused]] const __m512i pick_m = _mm512_add_epi32(pick_d, _mm512_set1_epi32(1));
  const __m512i low4 = _mm512_set1_epi8(15);
  constexpr std::int64_t kBB = kBlockBytes<kT>;
  constexpr std::int64_t kPrefetch = 1024;
  for (std::int64_t b = 0; b < blocks; ++b) {
    __m512i w[kP];
    __m512 dw[kP];
    [[maybe_unused]] __m512 mw[kP];
    prefetch_tile(c, r0, 2 * kP, b * kBB, kBB, kPrefetch);
    for (int p = 0; p < kP; ++p) {
      const std::byte* b0 = c.w + (r0 + 2 * p) * c.row_bytes + b * kBB;
      const std::byte* b1 = b0 + c.row_bytes;
      if constexpr (kT == WeightType::kQ8_0) {
        const __m256i lo = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 2))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + 2)), 1);
        const __m256i hi = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 18))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + 18)), 1);
        w[p] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                _mm512_set1_epi8(static_cast<char>(0x80)));
      } else {
        constexpr int kHeader = kT == WeightType::kQ4_0 ? 2 : 4;
        const __m256i both = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kHeader))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + kHeader)), 1);
        w[p] = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(both), _mm256_srli_epi16(both, 4), 1), low4);
      }
      __m128i h;
      if constexpr (kT == WeightType::kQ4_1) {
        std::uint32_t v0, v1;
        std::memcpy(&v0, b0, 4);
        std::memcpy(&v1, b1, 4);
        h = _mm_insert_epi32(_mm_cvtsi32_si128(static_cast<int>(v0)), static_cast<int>(v1), 1);
      } else {
        h = _mm_insert_epi16(_mm_cvtsi32_si128(load_u16(b0)), load_u16(b1), 1);
      }
      const __m512 f = _mm512_castps128_ps512(_mm_cvtph_ps(h));
      dw[p] = _mm512_permutexvar_ps(pick_d, f);
      if constexpr (kT == WeightType::kQ4_1) mw[p] = _mm512_permutexvar_ps(pick_m, f);
    }
    for (int i = 0; i < kX; ++i) {
      const __m512i xv = _mm512_loadu_si512(xq[i] + b * 64);
      const __m512 dx = _mm512_set1_ps(xd[i][b]);
      [[maybe_unused]] __m512 sx;
      [[maybe_unused]] __m512i start;
      if constexpr (kT == WeightType::kQ4_1) {
        sx = _mm512_set1_ps(xs[i][b]);
      } else {
        start = _mm512_loadu_si512(xc[i] + b * 16);
      }
      for (int p = 0; p < kP; ++p) {
        __m512i sums;
        if constexpr (kT == WeightType::kQ4_1) {
          sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[p], xv);
        } else {
          sums = _mm512_dpbusd_epi32(start, w[p], xv);
        }
        acc[i][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], dx), _mm512_cvtepi32_ps(sums), acc[i][p]);
        if constexpr (kT == WeightType::kQ4_1)
          summs[i][p] = _mm512_fmadd_ps(mw[p], sx, summs[i][p]);
      }
    }
  }
  for (int i = 0; i < kX; ++i) {
    for (int p = 0; p < kP; ++p) {
      for (int row = 0; row < 2; ++row) {
        float v = tree_sum_quarters(acc[i][p], row);
        if constexpr (kT == WeightType::kQ4_1) {
          v += _mm_cvtss_f32(row == 0 ? _mm512_castps512_ps128(summs[i][p])
                                      : _mm512_extractf32x4_ps(summs[i][p], 1));
        }
        c.y[(i0 + i) * c.rows + r0 + 2 * p + row] = v;
      }
    }
  }
}

template <WeightType kT, int kP>
void qtile_vnni_rows(const MatmulCall& c, std::int64_t r0) {
  for (std::int64_t i0 = 0; i0 < c.n; i0 += 4) {
    switch (std::min<std::int64_t>(4, c.n - i0)) {
      case 1:
        qtile_vnni<kT, 1, kP>(c, r0, i0);
        break;
      case 2:
        qtile_vnni<kT, 2, kP>(c, r0, i0);
        break;
      case 3:
        qtile_vnni<kT, 3, kP>(c, r0, i0);
        break;
      default:
        qtile_vnni<kT, 4, kP>(c, r0, i0);
        break;
    }
  }
}
// kBlockSum on the packed layout (pack_weight): 16 W rows across the lanes of one register,
// so each VPDPBUSD adds four products for 16 outputs, x's four codes broadcast. kX rows of x
// (from i0) against kG panels of 16 W rows (from panel p0). Per block and output the integer
// sum starts at -8 (q4_0) or -128 (q8_0) times the sum of x's codes (the packed codes are
// unsigned: q4_0 as stored, q8_0 plus 128) and meets the 32 codes in 8 products, then
// y = fma(d_w * d_x, float(I), y) (q4_1: y = fma(m_w, s_x, y)) lane by lane, as
// block_isum_scalar's callers do.
template <WeightType kT, int kX, int kG>
MIXKV_VNNI_ATTR HWY_NOINLINE void ptile(const MatmulCall& c, std::int64_t p0, std::int64_t i0) {
  const QuantizedX& qx = *c.qx;
  const std::int64_t blocks = qx.blocks;
  constexpr PanelFormat kF = panel_format(kT);
  constexpr int kFactor = panel_factor(kT);
  const std::byte* pw[kG];  // the panels' scales
  const std::byte* pc[kG];  // their codes
  for (int g = 0; g < kG; ++g) {
    pw[g] = c.packed + (p0 + g) * kF.bytes(blocks);
    pc[g] = pw[g] + kF.codes_at(blocks, 0);
  }
  const std::int8_t* xq[kX];
  const float* xd[kX];
  [[maybe_unused]] const float* xs[kX];
  [[maybe_unused]] const std::int32_t* xsum[kX];
  for (int i = 0; i < kX; ++i) {
    xq[i] = qx.q.data() + (i0 + i) * blocks * kBlock;
    xd[i] = qx.d.data() + (i0 + i) * blocks;
    if constexpr (kT == WeightType::kQ4_1) xs[i] = qx.s.data() + (i0 + i) * blocks;
    if constexpr (kT != WeightType::kQ4_1) xsum[i] = qx.sum.data() + (i0 + i) * blocks;
  }
  // Unrolled here and at the stores: as loops over an addressable y, GCC zeroed it in memory at
  // every call (rep stos, 6% of the tile's time at SmolLM2's 576-wide rows).
  __m512 y[kX][kG];
#pragma GCC unroll 8
  for (int i = 0; i < kX; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < kG; ++g) y[i][g] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(15);
  // One or two x rows (a decode): q4's high nibbles meet x in place, as 16 times their codes
  // (`andnot`, no shift), in chains of their own, shifted back once per block (the sums of
  // 16 h x are multiples of 16, so exactly). The same integers, one operation fewer per W
  // vector, and twice the chains for the few outputs in flight: one row of 4096 x 14336 q4_1
  // took 1.19-1.21 ms against 1.25-1.26 on one thread, 1536 x 576 18.5-19.4 us against
  // 20.5-20.8 (Zen 5, four interleaved rounds). More rows have chains enough, and the shift and
  // add per output and block would cost more than the shifts saved.
  constexpr bool kSplitHigh = kT != WeightType::kQ8_0 && kX <= 2;
  PanelPrefetch<kF, kG> ahead(blocks);
  for (std::int64_t b = 0; b < blocks; ++b) {
    __m512 dw[kG];
    [[maybe_unused]] __m512 mw[kG];
    for (int g = 0; g < kG; ++g) {
      const std::byte* blk = pw[g] + b * kF.header;
      ahead.ask(pw[g]);
      dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
      if constexpr (kT == WeightType::kQ4_1)
        mw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    }
    ahead.next();
    __m512i sums[kX][kG];
    [[maybe_unused]] __m512i sums_hi[kX][kG];
    for (int i = 0; i < kX; ++i) {
      const __m512i start =
          kFactor == 0 ? _mm512_setzero_si512() : _mm512_set1_epi32(kFactor * xsum[i][b]);
      for (int g = 0; g < kG; ++g) sums[i][g] = start;
      if constexpr (kSplitHigh)
        for (int g = 0; g < kG; ++g) sums_hi[i][g] = _mm512_setzero_si512();
    }
    const auto x4 = [&](int i, std::int64_t e) {  // x codes e .. e + 3 of block b, broadcast
      std::int32_t v;
      std::memcpy(&v, xq[i] + b * kBlock + e, 4);
      return _mm512_set1_epi32(v);
    };
    for (int v = 0; v < (kT == WeightType::kQ8_0 ? 8 : 4); ++v) {
      for (int g = 0; g < kG; ++g) {
        const __m512i wv = _mm512_loadu_si512(pc[g] + b * kF.codes + 64 * v);
        if constexpr (kT == WeightType::kQ8_0) {
          for (int i = 0; i < kX; ++i)
            sums[i][g] = _mm512_dpbusd_epi32(sums[i][g], wv, x4(i, 4 * v));
        } else if constexpr (kSplitHigh) {
          const __m512i lo = _mm512_and_si512(wv, low4);
          const __m512i hi16 = _mm512_andnot_si512(low4, wv);
          for (int i = 0; i < kX; ++i) {
            sums[i][g] = _mm512_dpbusd_epi32(sums[i][g], lo, x4(i, 4 * v));
            sums_hi[i][g] = _mm512_dpbusd_epi32(sums_hi[i][g], hi16, x4(i, 16 + 4 * v));
          }
        } else {
          const __m512i lo = _mm512_and_si512(wv, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), low4);
          for (int i = 0; i < kX; ++i) {
            sums[i][g] = _mm512_dpbusd_epi32(sums[i][g], lo, x4(i, 4 * v));
            sums[i][g] = _mm512_dpbusd_epi32(sums[i][g], hi, x4(i, 16 + 4 * v));
          }
        }
      }
    }
    if constexpr (kSplitHigh) {
      for (int i = 0; i < kX; ++i)
        for (int g = 0; g < kG; ++g)
          sums[i][g] = _mm512_add_epi32(sums[i][g], _mm512_srai_epi32(sums_hi[i][g], 4));
    }
    for (int i = 0; i < kX; ++i) {
      const __m512 dx = _mm512_set1_ps(xd[i][b]);
      [[maybe_unused]] __m512 sx;
      if constexpr (kT == WeightType::kQ4_1) sx = _mm512_set1_ps(xs[i][b]);
      for (int g = 0; g < kG; ++g) {
        y[i][g] =
            _mm512_fmadd_ps(_mm512_mul_ps(dw[g], dx), _mm512_cvtepi32_ps(sums[i][g]), y[i][g]);
        if constexpr (kT == WeightType::kQ4_1) y[i][g] = _mm512_fmadd_ps(mw[g], sx, y[i][g]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kX; ++i) {
#pragma GCC unroll 4
    for (int g = 0; g < kG; ++g) {
      const std::int64_t r0 = (p0 + g) * kPanelRows;
      float* out = c.y + (i0 + i) * c.rows + r0;
      const std::int64_t left = c.rows - r0;
      if (left >= kPanelRows) {
        _mm512_storeu_ps(out, y[i][g]);
      } else {  // the last, partial panel: its padding rows are not outputs
        _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << left) - 1), y[i][g]);
      }
    }
  }
}

// Panels [p_begin, p_end) against the kX x rows from i0, kG panels per tile where they fit.
template <WeightType kT, int kX, int kG>
void ptile_panels(const MatmulCall& c, std::int64_t p_begin, std::int64_t p_end, std::int64_t i0) {
  std::int64_t p = p_begin;
  for (; p + kG <= p_end; p += kG) ptile<kT, kX, kG>(c, p, i0);
  for (; p < p_end; ++p) ptile<kT, kX, 1>(c, p, i0);
}

// Up to 8 rows of x: one tile of x, each panel streams once through registers; fewer x rows
// take more panels per tile (independent chains, registers to spare). More rows: packed_rows.
template <WeightType kT, int kX = 1>
void ptile_rows(const MatmulCall& c, std::int64_t p_begin, std::int64_t p_end, std::int64_t i0,
                bool one_panel) {
  if constexpr (kX < 8) {
    if (std::min<std::int64_t>(8, c.n - i0) > kX) {
      return ptile_rows<kT, kX + 1>(c, p_begin, p_end, i0, one_panel);
    }
  }
  constexpr int kG = kX <= 2 ? 4 : kX <= 4 ? 2 : 1;
  if (one_panel) {
    ptile_panels<kT, kX, 1>(c, p_begin, p_end, i0);
  } else {
    ptile_panels<kT, kX, kG>(c, p_begin, p_end, i0);
  }
}

// More than 8 rows of x: panel by panel, every group of 8 x rows meeting it while it is in L2.
// q4's short panels (two of them within 32 KiB, so in L1 for every group) go two at a time
// against 4 x rows instead: each x broadcast and nibble split serves two panels, 16 rows of
// SmolLM2's 1536 x 576 q4_1 took 44.8-45.5 us against 47.0-48.3 (one thread, Zen 5). q8_0's
// panels (no nibbles to split) ran 10% slower that way, and a long q4 row's pair (its panels
// from L2 four times) 3-8% slower: they keep the 8-row groups.
template <WeightType kT>
void packed_rows(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  const std::int64_t p_begin = r_begin / kPanelRows;
  const std::int64_t p_end = (r_end + kPanelRows - 1) / kPanelRows;
  if (c.n <= 8) return ptile_rows<kT>(c, p_begin, p_end, 0, false);
  std::int64_t p = p_begin;
  constexpr PanelFormat kF = panel_format(kT);
  if (kT != WeightType::kQ8_0 && 2 * kF.bytes(c.qx->blocks) <= 32 * 1024) {
    for (; p + 2 <= p_end; p += 2) {
      std::int64_t i0 = 0;
      for (; i0 + 4 <= c.n; i0 += 4) ptile<kT, 4, 2>(c, p, i0);
      if (i0 < c.n) ptile_rows<kT>(c, p, p + 2, i0, true);
    }
  }
  for (; p < p_end; ++p)
    for (std::int64_t i0 = 0; i0 < c.n; i0 += 8) ptile_rows<kT>(c, p, p + 1, i0, true);
}
#undef MIXKV_VNNI_ATTR
#endif

// Keeps a running sum in its register at this point. Without it GCC reassociates the exact
// 16-bit sums of ptile256 into products first, sums after, and spills every product to the
// stack (44 spills a block at 5 x rows: 5-8 rows took 1.3-1.6x as long).
HWY_INLINE void in_register(__m256i& v) { asm("" : "+x"(v)); }

// The packed layout (pack_weight) on 256-bit integer vectors, for CPUs without AVX512-VNNI
// (AVX2, and AVX-512 with VNNI switched off): a panel's 16 lanes are two halves of 8 W rows,
// and vpmaddubsw (unsigned x signed bytes, pairs added to 16 bits) then vpmaddwd by ones give
// each lane's integer sum. The codes meet x as nibbles (0..15), so that a whole block's sums stay
// exact in 16 bits (16 products of at most 15 x 127: 30,480 < 2^15) and take one vpmaddwd per
// block, not one per four codes: q4's nibbles are its codes (the low ones codes 4v.., the high
// ones 16 + 4v..); q8_0's packed code u = w + 128 is 16 h + l, both nibbles meeting the same x
// codes, so I = 16 H + L - 128 sum(x). Then ptile's float steps, lane by lane: the same bits.
//
// AVX2 has 16 vector registers: the float accumulators live in `acc` ([kX][16], L1), loaded and
// stored once per block and half, and a half's 16-bit sums are the only ones live, so 5-8 x rows
// share each load and unpacking of W's codes (with the accumulators in registers GCC spilled a
// tile of 3 x rows).
template <WeightType kT, int kX>
HWY_NOINLINE void ptile256(const MatmulCall& c, std::int64_t p, std::int64_t i0, float* acc) {
  const QuantizedX& qx = *c.qx;
  const std::int64_t blocks = qx.blocks;
  constexpr PanelFormat kF = panel_format(kT);
  constexpr int kFactor = panel_factor(kT);
  constexpr bool kQ8 = kT == WeightType::kQ8_0;
  constexpr int kCodeVecs = static_cast<int>(kF.codes / 64);  // 64-byte vectors per block
  const std::byte* pw = c.packed + p * kF.bytes(blocks);
  const std::byte* pc = pw + kF.codes_at(blocks, 0);
  // The group's codes and scales, interleaved per block (QuantizedX::grouped_q).
  const std::int8_t* xq = qx.grouped_q.data() + i0 * blocks * kBlock;
  const float* xd = qx.grouped_d.data() + i0 * blocks;
  [[maybe_unused]] const float* xs =
      kT == WeightType::kQ4_1 ? qx.grouped_s.data() + i0 * blocks : nullptr;
  [[maybe_unused]] const std::int32_t* xsum =
      kT != WeightType::kQ4_1 ? qx.grouped_sum.data() + i0 * blocks : nullptr;
  for (int i = 0; i < kX * 2; ++i) _mm256_store_ps(acc + 8 * i, _mm256_setzero_ps());
  const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  PanelPrefetch<kF, 1> ahead(blocks);  // one panel per tile
  for (std::int64_t b = 0; b < blocks; ++b, ahead.next()) {
    const std::byte* codes = pc + b * kF.codes;
    const std::byte* scales = pw + b * kF.header;
    ahead.ask(pw);
    const std::int8_t* xb = xq + b * kX * kBlock;
    const auto x4 = [&](int i, std::int64_t e) {  // x row i's codes e .. e + 3 of block b
      std::int32_t v;
      std::memcpy(&v, xb + i * kBlock + e, 4);
      return _mm256_set1_epi32(v);
    };
    for (int h = 0; h < 2; ++h) {  // the half's 8 W rows: bytes 32h .. 32h + 31 of each vector
      // 16-bit sums: q4 all codes, q8_0 the low nibbles (highs: its high nibbles).
      __m256i lows[kX];
      [[maybe_unused]] __m256i highs[kX];
      for (int i = 0; i < kX; ++i) {
        lows[i] = _mm256_setzero_si256();
        if constexpr (kQ8) highs[i] = _mm256_setzero_si256();
      }
      for (int v = 0; v < kCodeVecs; ++v) {
        const __m256i wv =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * v + 32 * h));
        const __m256i lo = _mm256_and_si256(wv, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), low4);
        for (int i = 0; i < kX; ++i) {
          if constexpr (kQ8) {
            const __m256i xv = x4(i, 4 * v);
            lows[i] = _mm256_add_epi16(lows[i], _mm256_maddubs_epi16(lo, xv));
            highs[i] = _mm256_add_epi16(highs[i], _mm256_maddubs_epi16(hi, xv));
            in_register(highs[i]);
          } else {
            lows[i] = _mm256_add_epi16(lows[i], _mm256_maddubs_epi16(lo, x4(i, 4 * v)));
            lows[i] = _mm256_add_epi16(lows[i], _mm256_maddubs_epi16(hi, x4(i, 16 + 4 * v)));
          }
          in_register(lows[i]);
        }
      }
      const __m256 dw =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * h)));
      [[maybe_unused]] __m256 mw;
      if constexpr (kT == WeightType::kQ4_1) {
        mw = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32 + 16 * h)));
      }
      for (int i = 0; i < kX; ++i) {
        __m256i sum = _mm256_madd_epi16(lows[i], ones);
        if constexpr (kQ8) {
          sum = _mm256_add_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(highs[i], ones), 4));
        }
        if constexpr (kFactor != 0) {
          sum = _mm256_add_epi32(sum, _mm256_set1_epi32(kFactor * xsum[b * kX + i]));
        }
        float* a = acc + 16 * i + 8 * h;
        __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd[b * kX + i])),
                                   _mm256_cvtepi32_ps(sum), _mm256_load_ps(a));
        if constexpr (kT == WeightType::kQ4_1) {
          y = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[b * kX + i]), y);
        }
        _mm256_store_ps(a, y);
      }
    }
  }
  // The last, partial panel's padding rows are not outputs.
  const std::int64_t r0 = p * kPanelRows;
  const std::int64_t left = std::min<std::int64_t>(kPanelRows, c.rows - r0);
  for (int i = 0; i < kX; ++i) std::copy_n(acc + 16 * i, left, c.y + (i0 + i) * c.rows + r0);
}

// ptile256's instance for a group of `group` rows, 1 to group_rows(kT).
template <WeightType kT, int kX = 1>
void ptile256_group(const MatmulCall& c, std::int64_t p, std::int64_t i0, std::int64_t group,
                    float* acc) {
  static_assert(group_rows(kT) <= kMaxGroupRows);
  if constexpr (kX < group_rows(kT)) {
    if (group > kX) return ptile256_group<kT, kX + 1>(c, p, i0, group, acc);
  }
  ptile256<kT, kX>(c, p, i0, acc);
}

// Panels covering W rows [r_begin, r_end), each meeting the rows of x in groups (row_groups:
// q4 up to 8, q8_0 up to 5, as even as they divide) while it is in L1: one pass for a k = 4
// verify. Before the sums were pinned (in_register) 8 q4 rows in one group were ~10% slower
// than 4 + 4; pinned, 16 rows as 8 + 8 measured 0.74-1.03x 4 x 4 (docs/kernels.md). q8_0 took
// 11% less at 5 rows in one group than as 3 + 2.
template <WeightType kT>
void packed_rows256(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  alignas(32) float acc[kMaxGroupRows * kPanelRows];
  const std::int64_t p_end = (r_end + kPanelRows - 1) / kPanelRows;
  for (std::int64_t p = r_begin / kPanelRows; p < p_end; ++p) {
    for (std::int64_t g = 0, i0 = 0; g < row_groups(kT, c.n); ++g) {
      const std::int64_t group = row_group_size(kT, c.n, g);
      ptile256_group<kT>(c, p, i0, group, acc);
      i0 += group;
    }
  }
}

template <WeightType kT, int kW>
void qtile_rows(const MatmulCall& c, std::int64_t r0) {
  for (std::int64_t i0 = 0; i0 < c.n; i0 += kMaxQX) {
    switch (std::min<std::int64_t>(kMaxQX, c.n - i0)) {
      case 1:
        qtile<kT, 1, kW>(c, r0, i0);
        break;
      case 2:
        qtile<kT, 2, kW>(c, r0, i0);
        break;
      case 3:
        if constexpr (kMaxQX >= 3) qtile<kT, 3, kW>(c, r0, i0);
        break;
      default:
        if constexpr (kMaxQX >= 4) qtile<kT, 4, kW>(c, r0, i0);
        break;
    }
  }
}

// W rows [r_begin, r_end): four at a time for one row of x (four independent chains), two when
// several x rows share each block (their accumulators fill the registers); every x tile of a
// W tile reads that tile again from the cache, so W streams from memory once.
template <WeightType kT>
void qrows_task(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  std::int64_t r = r_begin;
#if HWY_TARGET <= HWY_AVX3
  if (c.vnni) {
    for (; r + 4 <= r_end; r += 4) qtile_vnni_rows<kT, 2>(c, r);
    for (; r + 2 <= r_end; r += 2) qtile_vnni_rows<kT, 1>(c, r);
  }
#endif
  if (c.n == 1) {
    for (; r + 4 <= r_end; r += 4) qtile_rows<kT, 4>(c, r);
  } else {
    for (; r + 2 <= r_end; r += 2) qtile_rows<kT, 2>(c, r);
  }
  for (; r < r_end; ++r) qtile_rows<kT, 1>(c, r);
}
#else
template <WeightType kT>
void qrows_task(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  for (std::int64_t r = r_begin; r < r_end; ++r)
    for (std::int64_t i = 0; i < c.n; ++i) c.y[i * c.rows + r] = qdot_scalar<kT>(c, r, i);
}

template <WeightType kT>
HWY_INLINE std::int32_t block_isum(const std::byte* block, const std::int8_t* xq) {
  return block_isum_scalar<kT>(block, xq);
}
#endif

// One output in the kBlockSum order from W's own layout (every target; the packed VNNI path
// must equal it).
template <WeightType kT>
float bdot(const MatmulCall& c, std::int64_t r, std::int64_t i) {
  const QuantizedX& qx = *c.qx;
  const std::byte* row = c.w + r * c.row_bytes;
  const std::int8_t* xq = qx.q.data() + i * qx.blocks * kBlock;
  const float* xd = qx.d.data() + i * qx.blocks;
  float y = 0.0f;
  for (std::int64_t b = 0; b < qx.blocks; ++b) {
    const std::byte* block = row + b * kBlockBytes<kT>;
    const float d = fp16_bits_to_float(load_u16(block)) * xd[b];
    y = std::fma(d, static_cast<float>(block_isum<kT>(block, xq + b * kBlock)), y);
    if constexpr (kT == WeightType::kQ4_1) {
      y = std::fma(fp16_bits_to_float(load_u16(block + 2)), qx.s[i * qx.blocks + b], y);
    }
  }
  return y;
}

template <WeightType kT>
void brows_task(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (c.vnni && c.packed != nullptr) return packed_rows<kT>(c, r_begin, r_end);
#endif
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if (c.packed != nullptr) return packed_rows256<kT>(c, r_begin, r_end);
#endif
  for (std::int64_t r = r_begin; r < r_end; ++r)
    for (std::int64_t i = 0; i < c.n; ++i) c.y[i * c.rows + r] = bdot<kT>(c, r, i);
}

// ---- bfloat16 weights in the kBlockSum order: x as bf16 pairs (Bf16X), W in panels ----
// y[i][r] is one float chain, +0 at first: per pair q of columns in order, it adds the product of
// column 2 q + 1 (x's code times W's: exact in float), rounding, then that of column 2 q,
// rounding; a column past the row's end counts as zeros. That is AVX512-BF16's VDPBF16PS with x's
// pair broadcast and W's rows across the lanes (lane j of a panel holds row j's pair): one
// instruction per 16 W rows and column pair, and no sum across lanes at the end. The other paths
// add the same two exact products with fused multiply-adds. VDPBF16PS treats subnormal inputs as
// zero and flushes subnormal results to zero whatever the MXCSR says, so on x86 every path runs
// the whole order in that mode (FTZ and DAZ), and all give the same bits.
//
// Why lanes over W rows (since 2026-12-07; before, lanes over columns and a tree at the end):
// x's pair per step is 4 bytes a row, so 8 rows of x stay in L1 whatever the row length, and a
// panel is one stream through memory; lanes over columns read 64 bytes of every x row per step,
// which for 8 rows of 14,336 columns (224 KiB) came from L2 and needed column chunks with
// accumulators parked between them (docs/kernels.md, "bfloat16 in panels").

// Rows of x per panel tile in float lanes: 4 on 16-lane vectors (8 chains), 3 on 8 lanes (12), 2
// where a panel takes 8 vectors or more.
constexpr int kBf16FloatX = hn::MaxLanes(hn::CappedTag<float, 16>()) >= 16  ? 4
                            : hn::MaxLanes(hn::CappedTag<float, 16>()) == 8 ? 3
                                                                            : 2;

// Vector registers of the target: AVX-512's 32, else (AVX2, SSE, the emulated targets) 16.
constexpr int kVectorRegisters = HWY_TARGET <= HWY_AVX3 ? 32 : 16;

// Column pairs of a panel per chunk where more than one tile of x rows reads it: 16 KiB of W.
constexpr std::int64_t kBf16ChunkPairs = 128;

// Outputs y[i][32 p .. 32 p + 32) (fewer in the last panel) from a panel tile's 32 lanes.
HWY_INLINE void store_panel_row(const MatmulCall& c, std::int64_t p, std::int64_t i,
                                const float* lanes) {
  const std::int64_t r0 = p * kBf16PanelRows;
  const std::int64_t left = std::min(kBf16PanelRows, c.rows - r0);
  std::copy_n(lanes, left, c.y + i * c.rows + r0);
}

// acc + x w rounded once, as VDPBF16PS adds each product. Without fused multiply-adds
// (Highway's scalar and SSE targets) a product of bf16 values below float's normal range would
// be flushed before the addition: the sum goes through double there instead. The product is
// exact in double, and the sum either is too or lies far closer to its larger term than to a
// midpoint between floats, so rounding to float gives the one rounding of the fused step.
template <class D, class V>
HWY_INLINE V fused_step(D d, V x, V w, V acc) {
#if HWY_NATIVE_FMA
  (void)d;
  return hn::MulAdd(x, w, acc);
#else
  constexpr std::size_t kLanes = hn::MaxLanes(D());
  float xs[kLanes], ws[kLanes], sums[kLanes];
  hn::StoreU(x, d, xs);
  hn::StoreU(w, d, ws);
  hn::StoreU(acc, d, sums);
  for (std::size_t l = 0; l < hn::Lanes(d); ++l) {
    sums[l] = static_cast<float>(static_cast<double>(sums[l]) +
                                 static_cast<double>(xs[l]) * static_cast<double>(ws[l]));
  }
  return hn::LoadU(d, sums);
#endif
}

// A pointer the compiler cannot see through here, so that loads through it are not merged with
// earlier ones (GCC otherwise holds every broadcast of x in a register across a step's vectors
// and spills accumulators to the stack instead).
template <class T>
HWY_INLINE const T* reloaded(const T* p) {
#if defined(__GNUC__)
  asm volatile("" : "+r"(p));
#endif
  return p;
}

// kX rows of x (from i0) against one panel's column pairs [q0, q1) in float lanes: every target.
// The chains start at zero at pair 0 and wait in `park` (row i's kBf16PanelRows lanes at
// park + i kBf16PanelRows) between the calls of one panel; the call that ends the row writes
// them to y. `ahead` > 0: the panel's lines that many pairs on are asked for (into L2).
//
// Per W vector the tile widens W's two columns once, then multiplies them by each row's two
// terms. Where the tile's chains leave too few registers to hold those terms (AVX2's 3 rows x 4
// vectors: 12 chains of two dependent multiply-adds a step, enough to cover their latency on two
// units, where 2 rows left 8), it takes them as broadcast loads again for each vector.
template <int kX>
HWY_NOINLINE void bf16_panel_floats(const MatmulCall& c, const std::uint32_t* panel, std::int64_t p,
                                    std::int64_t i0, std::int64_t q0, std::int64_t q1,
                                    std::int64_t ahead, float* park) {
  using D = hn::CappedTag<float, 16>;
  const D df;
  const hn::RebindToUnsigned<D> du;
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(D()));
  constexpr std::int64_t kSub = kBf16PanelRows / n;  // vectors per panel
  static_assert(kSub * n == kBf16PanelRows);
  constexpr bool kHoldX = kX * (kSub + 2) + 3 <= kVectorRegisters;
  const Bf16X& bx = *c.bx;
  const float* x[kX];
  for (int i = 0; i < kX; ++i) x[i] = bx.terms.data() + 2 * (i0 + i) * bx.count;
  hn::Vec<D> acc[kX][kSub];
  for (int i = 0; i < kX; ++i) {
    for (std::int64_t v = 0; v < kSub; ++v) {
      acc[i][v] = q0 == 0 ? hn::Zero(df) : hn::LoadU(df, park + i * kBf16PanelRows + v * n);
    }
  }
  const auto high = hn::Set(du, 0xFFFF0000u);
  for (std::int64_t q = q0; q < q1; ++q) {
    if (ahead > 0) {
      prefetch_l2(panel + (q + ahead) * kBf16PanelRows);
      prefetch_l2(panel + (q + ahead) * kBf16PanelRows + 16);
    }
    for (std::int64_t v = 0; v < kSub; ++v) {
      const auto u = hn::LoadU(du, panel + q * kBf16PanelRows + v * n);
      const auto wo = hn::BitCast(df, hn::And(u, high));
      const auto we = hn::BitCast(df, hn::ShiftLeft<16>(u));
      for (int i = 0; i < kX; ++i) {
        const float* terms = kHoldX ? x[i] + 2 * q : reloaded(x[i] + 2 * q);
        acc[i][v] = fused_step(df, hn::Set(df, terms[0]), wo, acc[i][v]);
        acc[i][v] = fused_step(df, hn::Set(df, terms[1]), we, acc[i][v]);
      }
    }
  }
  for (int i = 0; i < kX; ++i) {
    float* lanes = park + i * kBf16PanelRows;
    for (std::int64_t v = 0; v < kSub; ++v) hn::StoreU(acc[i][v], df, lanes + v * n);
    if (q1 == bx.count) store_panel_row(c, p, i0 + i, lanes);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// The same on VDPBF16PS (checked at run time: Highway's AVX3 target does not imply AVX512-BF16).
// The target's own features too (HWY_TARGET_STR): the tile inlines this namespace's helpers,
// which clang allows only into a function with all of their features.
#define MIXKV_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// 32 bf16 codes as VDPBF16PS's operand type (a vector cast: no instruction).
MIXKV_BF16_ATTR HWY_INLINE __m512bh as_bf16_pairs(__m512i v) {
  return (__m512bh)v;  // NOLINT(google-readability-casting): GCC's vector cast
}

// Rows of x per panel tile on VDPBF16PS: 8 (16 accumulators).
constexpr int kBf16DotsX = 8;

// The panel's lines asked for this many steps (4 KiB) ahead: the hardware prefetchers alone
// left 8 rows of x waiting for W (4096 x 14336 on one Zen 5 core: 4.4-4.5 ms, 3.5-3.7 asking 32
// steps ahead, 3.7-3.9 at 16; one row 2.9-3.0 ms either way; docs/kernels.md).
constexpr std::int64_t kBf16AheadSteps = 32;

template <int kX>
MIXKV_BF16_ATTR HWY_NOINLINE void bf16_panel_dots(const MatmulCall& c, const std::uint32_t* panel,
                                                  std::int64_t p, std::int64_t i0) {
  static_assert(kBf16PanelRows == 32);
  const Bf16X& bx = *c.bx;
  const std::uint32_t* x[kX];
  for (int i = 0; i < kX; ++i) x[i] = bx.pairs.data() + (i0 + i) * bx.count;
  __m512 acc[kX][2];
  for (int i = 0; i < kX; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (std::int64_t q = 0; q < bx.count; ++q) {
    prefetch_l2(panel + (q + kBf16AheadSteps) * kBf16PanelRows);
    prefetch_l2(panel + (q + kBf16AheadSteps) * kBf16PanelRows + 16);
    const __m512i w0 = _mm512_loadu_si512(panel + q * kBf16PanelRows);
    const __m512i w1 = _mm512_loadu_si512(panel + q * kBf16PanelRows + 16);
    for (int i = 0; i < kX; ++i) {
      const __m512i xq = _mm512_set1_epi32(static_cast<int>(x[i][q]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], as_bf16_pairs(xq), as_bf16_pairs(w0));
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], as_bf16_pairs(xq), as_bf16_pairs(w1));
    }
  }
  for (int i = 0; i < kX; ++i) {
    float lanes[kBf16PanelRows];
    _mm512_storeu_ps(lanes, acc[i][0]);
    _mm512_storeu_ps(lanes + 16, acc[i][1]);
    store_panel_row(c, p, i0 + i, lanes);
  }
}
#undef MIXKV_BF16_ATTR
#endif

// f(integral_constant<int, m>) for the row count m of an x tile, 1 <= m <= kMax.
template <int kMax, int kX = 1, class F>
HWY_INLINE void with_x_rows(std::int64_t m, F&& f) {
  if constexpr (kX < kMax) {
    if (m > kX) return with_x_rows<kMax, kX + 1>(m, f);
  }
  f(std::integral_constant<int, kX>{});
}

// The panels holding W rows [r_begin, r_end) (r_begin a panel's first row), each against every
// row of x in tiles. A weight without pack_weight's copy is packed here a panel at a time, into
// the thread's buffer (64 bytes a column), so every path reads one layout and gives one result.
void bf16_pairs_task(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  const FlushSubnormals flush;
  const std::int64_t panel_words = c.bx->count * kBf16PanelRows;
  thread_local LineVector<std::uint32_t> unpacked;
  thread_local LineVector<float> parked;
  const std::int64_t p_end = (r_end + kBf16PanelRows - 1) / kBf16PanelRows;
  for (std::int64_t p = r_begin / kBf16PanelRows; p < p_end; ++p) {
    const std::uint32_t* panel = nullptr;
    if (c.packed != nullptr) {
      panel = reinterpret_cast<const std::uint32_t*>(c.packed) + p * panel_words;
    } else {
      unpacked.resize(static_cast<std::size_t>(panel_words));
      pack_bf16_panel(c.w, c.rows, c.cols, p, unpacked.data());
      panel = unpacked.data();
    }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if (c.bf16_dots) {
      for (std::int64_t i0 = 0; i0 < c.n; i0 += kBf16DotsX) {
        with_x_rows<kBf16DotsX>(std::min<std::int64_t>(kBf16DotsX, c.n - i0), [&](auto x_rows) {
          bf16_panel_dots<decltype(x_rows)::value>(c, panel, p, i0);
        });
      }
      continue;
    }
#endif
    // More than one tile: every tile takes a chunk of the panel's column pairs in turn, the
    // first from memory and the others from L1, while the first tile asks for the next chunk.
    // The memory is then read beside the whole chunk's work rather than the first tile's (one
    // tile at a time, the first read memory at its pace and the others re-read the panel from
    // L3: 5 and 8 rows of 4096 x 14336 took 1.1-1.2x as long on a Zen 3; docs/kernels.md).
    const std::int64_t chunk = c.n > kBf16FloatX ? kBf16ChunkPairs : c.bx->count;
    parked.resize(static_cast<std::size_t>(c.n * kBf16PanelRows));
    for (std::int64_t q0 = 0; q0 < c.bx->count; q0 += chunk) {
      const std::int64_t q1 = std::min(c.bx->count, q0 + chunk);
      for (std::int64_t i0 = 0; i0 < c.n; i0 += kBf16FloatX) {
        with_x_rows<kBf16FloatX>(std::min<std::int64_t>(kBf16FloatX, c.n - i0), [&](auto x_rows) {
          bf16_panel_floats<decltype(x_rows)::value>(c, panel, p, i0, q0, q1,
                                                     i0 == 0 && chunk < c.bx->count ? chunk : 0,
                                                     parked.data() + i0 * kBf16PanelRows);
        });
      }
    }
  }
}

template <WeightType kT>
void block_rows_task(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  if (c.order == ReductionOrder::kBlockSum) return brows_task<kT>(c, r_begin, r_end);
  qrows_task<kT>(c, r_begin, r_end);
}

}  // namespace

void MatmulRowsImpl(const MatmulCall& c, std::int64_t r_begin, std::int64_t r_end) {
  switch (c.type) {
    case WeightType::kFloat32:
      return rows_task<WeightType::kFloat32>(c, r_begin, r_end);
    case WeightType::kBfloat16:
      if (c.order == ReductionOrder::kBlockSum) return bf16_pairs_task(c, r_begin, r_end);
      return rows_task<WeightType::kBfloat16>(c, r_begin, r_end);
    case WeightType::kFloat16:
      return rows_task<WeightType::kFloat16>(c, r_begin, r_end);
    case WeightType::kQ8_0:
      return block_rows_task<WeightType::kQ8_0>(c, r_begin, r_end);
    case WeightType::kQ4_0:
      return block_rows_task<WeightType::kQ4_0>(c, r_begin, r_end);
    case WeightType::kQ4_1:
      return block_rows_task<WeightType::kQ4_1>(c, r_begin, r_end);
  }
}

// x's codes of one block of 32 (at xb): x * inverse rounded to the nearest integer (ties to
// even), clamped to [-127, 127], stored as int8 at q; returns their per-lane sums (small
// integers: exact in any order).
HWY_INLINE VF block_codes(const float* xb, VF inverse, std::int8_t* q) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::int8_t, DF> d8;
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(DF()));
  VF total = hn::Zero(df);
  for (std::int64_t k = 0; k < kVecs; ++k) {
    const VF r = hn::Min(
        hn::Max(hn::Round(hn::Mul(hn::LoadU(df, xb + k * n), inverse)), hn::Set(df, -127.0f)),
        hn::Set(df, 127.0f));
    total = hn::Add(total, r);
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, r)), d8, q + k * n);
  }
  return total;
}

// quantize_block for one block, in vectors: the same operations (the block's absolute maximum,
// amax / 127 and 127 / amax in float, block_codes) on each element, so the same codes and
// scales; a block holding a non-finite value takes quantize_block itself.
HWY_INLINE void quantize_one_block(const float* xb, std::int8_t* q, float* d, float* s) {
  const DF df;
  constexpr auto n = static_cast<std::int64_t>(hn::MaxLanes(DF()));
  auto finite = hn::IsFinite(hn::LoadU(df, xb));
  VF top = hn::Abs(hn::LoadU(df, xb));
  for (std::int64_t k = 1; k < kVecs; ++k) {
    const VF v = hn::LoadU(df, xb + k * n);
    finite = hn::And(finite, hn::IsFinite(v));
    top = hn::Max(top, hn::Abs(v));
  }
  if (!hn::AllTrue(df, finite)) return quantize_block(xb, q, d, s);
  const float amax = hn::GetLane(hn::MaxOfLanes(df, top));
  const float scale = amax / 127.0f;
  const VF total = block_codes(xb, hn::Set(df, amax != 0.0f ? 127.0f / amax : 0.0f), q);
  *d = round_to_fp16(scale);
  if (s != nullptr) *s = round_to_fp16(scale * hn::GetLane(hn::SumOfLanes(df, total)));
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Sixteen vectors of per-lane partials (vector g: block g's) to one vector whose lane g is the
// reduction of vector g's lanes by `op`: a max, or an add of small integers held as floats, both
// exact in any order. Halves, then 128-bit quarters, then lanes are combined pairwise (30
// shuffles for the 16, against ~8 instructions a vector for one at a time).
template <class Op>
HWY_INLINE __m512 reduce_lanes16(const __m512* v, Op op) {
  __m512 h[8], qr[4], p[2];
  for (int i = 0; i < 8; ++i) {  // [a's 8 | b's 8]
    h[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {  // quarters: blocks 4i .. 4i + 3, 4 lanes each
    qr[i] = op(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
               _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {  // inside each quarter: lanes (0, 2) and (1, 3) of two vectors
    p[i] = op(_mm512_unpacklo_ps(qr[2 * i], qr[2 * i + 1]),
              _mm512_unpackhi_ps(qr[2 * i], qr[2 * i + 1]));
  }
  const __m512 lanes =
      op(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(p[0]), _mm512_castps_pd(p[1]))),
         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(p[0]), _mm512_castps_pd(p[1]))));
  // Lane 4k + j now holds vector 4j + k's reduction: back to lane g for vector g.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, lanes);
}

// QuantizeBlocksImpl for 16 blocks of finite values (false, having written nothing, if one is
// not): the blocks' maxima and code sums reduced together, the scales divided and rounded to
// fp16 as vectors. Each block's values are quantize_block's.
HWY_INLINE bool quantize_16_blocks(const float* x, std::int8_t* q, float* d, float* s) {
  const DF df;
  __m512 part[16];
  auto finite = hn::Eq(hn::Zero(df), hn::Zero(df));
  for (int g = 0; g < 16; ++g) {
    const VF lo = hn::LoadU(df, x + 32 * g);
    const VF hi = hn::LoadU(df, x + 32 * g + 16);
    finite = hn::And(finite, hn::And(hn::IsFinite(lo), hn::IsFinite(hi)));
    part[g] = hn::Max(hn::Abs(lo), hn::Abs(hi)).raw;
  }
  if (!hn::AllTrue(df, finite)) return false;
  const VF amax{reduce_lanes16(part, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); })};
  const VF scale = hn::Div(amax, hn::Set(df, 127.0f));
  const VF inverse =
      hn::IfThenZeroElse(hn::Eq(amax, hn::Zero(df)), hn::Div(hn::Set(df, 127.0f), amax));
  alignas(64) float inv[16];
  hn::Store(inverse, df, inv);
  for (int g = 0; g < 16; ++g) {
    part[g] = block_codes(x + kBlock * g, hn::Set(df, inv[g]), q + kBlock * g).raw;
  }
  const auto fp16 = [](__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  };
  _mm512_storeu_ps(d, fp16(scale.raw));
  if (s != nullptr) {
    const __m512 sums =
        reduce_lanes16(part, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
    _mm512_storeu_ps(s, fp16(_mm512_mul_ps(scale.raw, sums)));
  }
  return true;
}
#endif

// quantize_block over `count` consecutive blocks of 32, in vectors (quantize_one_block; sixteen
// at a time where the target has quantize_16_blocks, a group holding a non-finite value one by
// one).
void QuantizeBlocksImpl(const float* x, std::int64_t count, std::int8_t* q, float* d, float* s) {
  const auto one = [&](std::int64_t b) {
    quantize_one_block(x + b * kBlock, q + b * kBlock, d + b, s != nullptr ? s + b : nullptr);
  };
  std::int64_t b = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  for (; b + 16 <= count; b += 16) {
    if (!quantize_16_blocks(x + b * kBlock, q + b * kBlock, d + b, s != nullptr ? s + b : nullptr))
      for (std::int64_t g = b; g < b + 16; ++g) one(g);
  }
#endif
  for (; b < count; ++b) one(b);
}

// Whether this target's packed blocksum products read QuantizedX's grouped copy (ptile256: AVX2,
// and AVX-512 with VNNI off); with VNNI, AVX-512 takes ptile, which reads x's codes from q.
bool ReadsGroupedXImpl(bool vnni) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return !vnni;
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  (void)vnni;
  return true;
#else
  (void)vnni;
  return false;
#endif
}

// Whether this target runs bfloat16's blocksum order on VDPBF16PS when the CPU may (AVX-512; the
// others take float lanes).
bool UsesBf16DotsImpl(bool bf16_dots) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return bf16_dots;
#else
  (void)bf16_dots;
  return false;
#endif
}

void DequantizeRowImpl(WeightType type, const std::byte* row, std::int64_t cols, float* out) {
  // decode_cols writes whole (zero-padded) blocks: through a buffer.
  std::vector<float> buffer(static_cast<std::size_t>((cols + kBlock - 1) / kBlock * kBlock));
  const auto run = [&](auto tag) {
    decode_cols<decltype(tag)::value>(row, 0, cols, buffer.data());
  };
  switch (type) {
    case WeightType::kFloat32:
      run(std::integral_constant<WeightType, WeightType::kFloat32>{});
      break;
    case WeightType::kBfloat16:
      run(std::integral_constant<WeightType, WeightType::kBfloat16>{});
      break;
    case WeightType::kFloat16:
      run(std::integral_constant<WeightType, WeightType::kFloat16>{});
      break;
    case WeightType::kQ8_0:
      run(std::integral_constant<WeightType, WeightType::kQ8_0>{});
      break;
    case WeightType::kQ4_0:
      run(std::integral_constant<WeightType, WeightType::kQ4_0>{});
      break;
    case WeightType::kQ4_1:
      run(std::integral_constant<WeightType, WeightType::kQ4_1>{});
      break;
  }
  std::copy_n(buffer.data(), cols, out);
}

std::int64_t FloatLanesImpl() { return static_cast<std::int64_t>(hn::Lanes(DF())); }

const char* MatmulTargetImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace mixkv::kernels::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <fmt/format.h>

#include <atomic>
#include <limits>

#include "kernels/convert_simd.hpp"
#include "kernels/matmul_amx.hpp"
#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/convert.hpp"

namespace mixkv::kernels {
namespace detail {

HWY_EXPORT(MatmulRowsImpl);
HWY_EXPORT(QuantizeBlocksImpl);
HWY_EXPORT(ReadsGroupedXImpl);
HWY_EXPORT(UsesBf16DotsImpl);
HWY_EXPORT(DequantizeRowImpl);
HWY_EXPORT(FloatLanesImpl);
HWY_EXPORT(MatmulTargetImpl);

}  // namespace detail

std::string_view to_string(WeightType type) {
  switch (type) {
    case WeightType::kFloat32:
      return "float32";
    case WeightType::kBfloat16:
      return "bfloat16";
    case WeightType::kFloat16:
      return "float16";
    case WeightType::kQ8_0:
      return "q8_0";
    case WeightType::kQ4_0:
      return "q4_0";
    case WeightType::kQ4_1:
      return "q4_1";
  }
  return "unknown";
}

std::string_view to_string(ReductionOrder order) {
  return order == ReductionOrder::kBlockSum ? "blocksum" : "ggml";
}

bool weight_order_applies(WeightType type) {
  return weight_block_elements(type) == 32 || type == WeightType::kBfloat16;
}

std::optional<WeightType> weight_type_from_ggml(std::uint32_t ggml_type) {
  // ggml's enum ggml_type (ggml.h): the values GGUF stores in each tensor's info.
  switch (ggml_type) {
    case 0:
      return WeightType::kFloat32;
    case 1:
      return WeightType::kFloat16;
    case 2:
      return WeightType::kQ4_0;
    case 3:
      return WeightType::kQ4_1;
    case 8:
      return WeightType::kQ8_0;
    case 30:
      return WeightType::kBfloat16;
    default:
      return std::nullopt;
  }
}

std::int64_t weight_block_elements(WeightType type) {
  switch (type) {
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
      return 32;
    default:
      return 1;
  }
}

namespace {

// Bytes of one block of weight_block_elements(type) elements.
std::int64_t block_bytes(WeightType type) {
  switch (type) {
    case WeightType::kFloat32:
      return 4;
    case WeightType::kBfloat16:
    case WeightType::kFloat16:
      return 2;
    case WeightType::kQ8_0:
      return 34;
    case WeightType::kQ4_0:
      return 18;
    case WeightType::kQ4_1:
      return 20;
  }
  return 0;
}

bool quantizes_x(WeightType type) { return weight_block_elements(type) == 32; }

// Whether pack_weight lays out a `type` weight (for the kBlockSum order).
bool packs(WeightType type) { return quantizes_x(type) || type == WeightType::kBfloat16; }

ReductionOrder order_of(const WeightView& w) {
  return weight_order_applies(w.dtype) ? w.order : ReductionOrder::kGgml;
}

// Whether the block formats' AVX-512 path may use VPDPBUSD: the CPU has AVX512-VNNI (probed
// once) and tests have not switched it off to check the path without it.
std::atomic<bool>& vnni_switched_on() {
  static std::atomic<bool> on{true};
  return on;
}

bool vnni_available() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool cpu = __builtin_cpu_supports("avx512vnni");
#else
  constexpr bool cpu = false;
#endif
  return cpu && vnni_switched_on().load(std::memory_order_relaxed);
}

// Whether bfloat16 weights in the kBlockSum order may use VDPBF16PS: the CPU has AVX512-BF16
// (CPUID leaf 7, sub-leaf 1, EAX bit 5) beside an OS-enabled AVX-512 (probed once), and tests
// have not switched it off to check the other paths.
std::atomic<bool>& bf16_dots_switched_on() {
  static std::atomic<bool> on{true};
  return on;
}

bool bf16_dots_available() {
  return detail::avx512_bf16_cpu() && bf16_dots_switched_on().load(std::memory_order_relaxed);
}

// The kBlockSum order's x for bfloat16 weights (Bf16X): n rows of cols floats, rounded in vectors
// (encode_bf16_row: float_to_bf16's bits), as codes for VDPBF16PS (`dots`) or as float terms.
void round_x_to_bf16(const float* x, std::int64_t n, std::int64_t cols, bool dots,
                     detail::Bf16X& bx) {
  bx.count = ceil_div(cols, 2);
  if (dots) {
    bx.pairs.resize(static_cast<std::size_t>(n * bx.count));
  } else {
    bx.terms.resize(static_cast<std::size_t>(2 * n * bx.count));
  }
  thread_local std::vector<std::uint16_t> row;
  row.assign(static_cast<std::size_t>(2 * bx.count), 0);  // a zero past an odd last column
  for (std::int64_t i = 0; i < n; ++i) {
    detail::encode_bf16_row(x + i * cols, static_cast<std::size_t>(cols), row.data());
    if (dots) {
      std::memcpy(bx.pairs.data() + i * bx.count, row.data(),
                  static_cast<std::size_t>(bx.count * 4));
      continue;
    }
    float* terms = bx.terms.data() + 2 * i * bx.count;
    for (std::int64_t q = 0; q < bx.count; ++q) {
      terms[2 * q] = std::bit_cast<float>(std::uint32_t{row[2 * q + 1]} << 16);
      terms[2 * q + 1] = std::bit_cast<float>(std::uint32_t{row[2 * q]} << 16);
    }
  }
}

void check_shape(WeightType type, std::int64_t rows, std::int64_t cols, std::string_view where) {
  if (rows <= 0 || cols <= 0) {
    throw_invalid(
        fmt::format("{}: a {} weight of {} x {} elements; rows and columns must be "
                    "positive",
                    where, to_string(type), rows, cols));
  }
  const std::int64_t block = weight_block_elements(type);
  if (cols % block != 0) {
    throw_invalid(
        fmt::format("{}: a {} weight stores rows in blocks of {} elements, but a row has "
                    "{}; use a float type for this tensor",
                    where, to_string(type), block, cols));
  }
}

}  // namespace

std::int64_t weight_bytes(WeightType type, std::int64_t rows, std::int64_t cols) {
  check_shape(type, rows, cols, "weight");
  return checked_product({rows, cols / weight_block_elements(type), block_bytes(type)},
                         "weight bytes");
}

void PackedWeight::Free::operator()(std::byte* p) const { std::free(p); }

bool matmul_reads_packed(WeightType type) {
  // bfloat16: every path reads its panels (packed on the fly without the copy). The block
  // formats: AVX-512 VNNI (ptile) or AVX2 (ptile256), Highway's AVX2 and AVX3 targets.
  if (type == WeightType::kBfloat16) return true;
  return quantizes_x(type) && std::string_view(matmul_target()).starts_with("AVX");
}

PackedWeight pack_weight(const WeightView& w) {
  check_shape(w.dtype, w.rows, w.cols, "pack_weight");
  if (!packs(w.dtype)) {
    throw_invalid(
        fmt::format("pack_weight: a {} weight; only q8_0, q4_0, q4_1 and bfloat16 are packed",
                    to_string(w.dtype)));
  }
  if (w.data == nullptr) throw_invalid("pack_weight: the weight has no data");
  const bool bf16 = w.dtype == WeightType::kBfloat16;
  const std::int64_t blocks = w.cols / 32, bb = block_bytes(w.dtype);
  const std::int64_t panels = ceil_div(w.rows, bf16 ? detail::kBf16PanelRows : detail::kPanelRows);
  const detail::PanelFormat f = detail::panel_format(w.dtype);
  const std::int64_t panel_bytes =
      bf16 ? checked_mul(ceil_div(w.cols, 2), 4 * detail::kBf16PanelRows, "pack_weight")
           : checked_mul(blocks, f.header + f.codes, "pack_weight");
  const std::int64_t bytes = checked_mul(panels, panel_bytes, "pack_weight");
  PackedWeight out;
  out.data_.reset(static_cast<std::byte*>(
      std::aligned_alloc(64, static_cast<std::size_t>(ceil_div(bytes, 64) * 64))));
  if (out.data_ == nullptr) throw std::bad_alloc();  // as a vector of that size would
  out.bytes_ = bytes;
  if (bf16) {  // the panels one after the other (detail::pack_bf16_panel)
    for (std::int64_t p = 0; p < panels; ++p) {
      detail::pack_bf16_panel(w.data, w.rows, w.cols, p,
                              reinterpret_cast<std::uint32_t*>(out.data_.get() + p * panel_bytes));
    }
    return out;
  }
  const std::int64_t row_bytes = blocks * bb;
  const bool q8 = w.dtype == WeightType::kQ8_0, q41 = w.dtype == WeightType::kQ4_1;
  const std::int64_t code_bytes = bb - (q41 ? 4 : 2);  // one row's codes of one block
  for (std::int64_t p = 0; p < panels; ++p) {
    std::byte* panel = out.data_.get() + p * f.bytes(blocks);
    // Padding rows: zero scales and codes (q8_0's codes 0 + 128).
    std::memset(panel, 0, static_cast<std::size_t>(f.bytes(blocks)));
    if (q8) {
      std::memset(panel + f.codes_at(blocks, 0), 0x80, static_cast<std::size_t>(blocks * f.codes));
    }
    for (std::int64_t b = 0; b < blocks; ++b) {
      std::byte* scales = panel + b * f.header;
      std::byte* dst = panel + f.codes_at(blocks, b);
      for (std::int64_t j = 0; j < detail::kPanelRows && p * detail::kPanelRows + j < w.rows; ++j) {
        const std::byte* src = w.data + (p * detail::kPanelRows + j) * row_bytes + b * bb;
        std::memcpy(scales + 2 * j, src, 2);
        if (q41) std::memcpy(scales + 32 + 2 * j, src + 2, 2);
        const std::byte* codes = src + (bb - code_bytes);
        // Vector v, lane j: four bytes of row j (q8_0 made unsigned by adding 128).
        for (std::int64_t v = 0; v < code_bytes / 4; ++v) {
          for (std::int64_t t = 0; t < 4; ++t) {
            const std::byte c = codes[4 * v + t];
            dst[64 * v + 4 * j + t] = q8 ? (c ^ std::byte{0x80}) : c;
          }
        }
      }
    }
  }
  return out;
}

namespace {

// n = rows of x, after checking one product's sizes (matmul's contract).
std::int64_t check_product(const WeightView& w, std::int64_t xs, std::size_t ys,
                           std::string_view where) {
  check_shape(w.dtype, w.rows, w.cols, where);
  checked_mul(weight_bytes(w.dtype, 1, w.cols), w.rows, where);
  if (w.data == nullptr) throw_invalid(fmt::format("{}: the weight has no data", where));
  if (xs == 0 || xs % w.cols != 0) {
    throw_invalid(fmt::format("{}: x holds {} floats, not a whole number (>= 1) of rows of {}",
                              where, xs, w.cols));
  }
  const std::int64_t n = xs / w.cols;
  if (static_cast<std::int64_t>(ys) != checked_mul(n, w.rows, where)) {
    throw_invalid(fmt::format("{}: y holds {} floats; {} rows of x against {} weight rows need {}",
                              where, ys, n, w.rows, n * w.rows));
  }
  return n;
}

// From this many blocks of x (a batch of 16 rows of 576: 288), the pool's workers quantise them
// in shares rather than waiting for the calling thread (~40 ns a block on a Zen 4 core, a
// region's hand-off 1-2 us). Each block's codes and scales are its own, so the bits are the same.
constexpr std::int64_t kParallelQuantizeBlocks = 128;

// quantize_x's parts. QuantizedX sized for n rows of cols floats of weights of `type` read in
// `order`, before any block is quantised.
void size_quantized_x(WeightType type, ReductionOrder order, std::int64_t n, std::int64_t cols,
                      detail::QuantizedX& qx) {
  const bool sums = type == WeightType::kQ4_1;
  qx.blocks = cols / 32;
  qx.q.resize(static_cast<std::size_t>(n * cols));
  qx.d.resize(static_cast<std::size_t>(n * qx.blocks));
  qx.s.resize(sums ? static_cast<std::size_t>(n * qx.blocks) : 0);
  // The blocksum order of q8_0 / q4_0 also needs each block's sum of codes (q4_1's is in s).
  qx.sum.resize(
      order == ReductionOrder::kBlockSum && !sums ? static_cast<std::size_t>(n * qx.blocks) : 0);
}

// Blocks [from, to) of x (counted over all its rows) into a sized QuantizedX, with their sums.
void quantize_x_blocks(const float* x, std::int64_t from, std::int64_t to, detail::QuantizedX& qx) {
  HWY_DYNAMIC_DISPATCH(detail::QuantizeBlocksImpl)
  (x + from * 32, to - from, qx.q.data() + from * 32, qx.d.data() + from,
   qx.s.empty() ? nullptr : qx.s.data() + from);
  for (std::int64_t b = from; b < std::min<std::int64_t>(to, std::ssize(qx.sum)); ++b) {
    std::int32_t sum = 0;
    for (std::int64_t e = 0; e < 32; ++e) sum += qx.q[static_cast<std::size_t>(32 * b + e)];
    qx.sum[static_cast<std::size_t>(b)] = sum;
  }
}

// Whether some path of this call reads copies of x's codes that finish_quantized_x lays out
// from all of its blocks (then x is quantised before the products' region, not inside it).
bool quantized_x_has_copies(ReductionOrder order, bool vnni, bool int8_tiles) {
  const bool block_sum = order == ReductionOrder::kBlockSum;
  return int8_tiles || (vnni && !block_sum) ||
         (block_sum && HWY_DYNAMIC_DISPATCH(detail::ReadsGroupedXImpl)(vnni));
}

void finish_quantized_x(WeightType type, ReductionOrder order, std::int64_t n, bool vnni,
                        bool int8_tiles, detail::QuantizedX& qx);

// The block formats' x (QuantizedX) for weights of `type` read in `order`: n rows of cols floats.
void quantize_x(WeightType type, ReductionOrder order, const float* x, std::int64_t n,
                std::int64_t cols, bool vnni, bool int8_tiles, ThreadPool* pool,
                detail::QuantizedX& qx) {
  size_quantized_x(type, order, n, cols, qx);
  const std::int64_t blocks = n * qx.blocks;
  if (pool != nullptr && pool->size() > 1 && blocks >= kParallelQuantizeBlocks) {
    const std::int64_t shares = pool->size();
    pool->parallel_for(shares, [&](std::int64_t i, int) {
      quantize_x_blocks(x, blocks * i / shares, blocks * (i + 1) / shares, qx);
    });
  } else {
    quantize_x_blocks(x, 0, blocks, qx);
  }
  finish_quantized_x(type, order, n, vnni, int8_tiles, qx);
}

// The copies of x's codes that some paths read, from all of its blocks (QuantizedX says which);
// with none to make, it only empties them.
void finish_quantized_x(WeightType type, ReductionOrder order, std::int64_t n, bool vnni,
                        bool int8_tiles, detail::QuantizedX& qx) {
  const bool sums = type == WeightType::kQ4_1;
  const bool block_sum = order == ReductionOrder::kBlockSum;
  // The AVX2 packed path's grouped copy (see QuantizedX), where the target the products dispatch
  // to reads it (tests run that path on AVX-512 machines too, by target or with VNNI off).
  const bool grouped = block_sum && HWY_DYNAMIC_DISPATCH(detail::ReadsGroupedXImpl)(vnni);
  qx.grouped_q.resize(grouped ? qx.q.size() : 0);
  qx.grouped_d.resize(grouped ? qx.d.size() : 0);
  qx.grouped_s.resize(grouped ? qx.s.size() : 0);
  qx.grouped_sum.resize(grouped ? qx.sum.size() : 0);
  for (std::int64_t g = 0, i0 = 0; grouped && g < detail::row_groups(type, n); ++g) {
    const std::int64_t m = detail::row_group_size(type, n, g);
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t b = 0; b < qx.blocks; ++b) {
        const auto from = static_cast<std::size_t>((i0 + i) * qx.blocks + b);
        const auto to = static_cast<std::size_t>(i0 * qx.blocks + b * m + i);
        std::memcpy(qx.grouped_q.data() + to * 32, qx.q.data() + from * 32, 32);
        qx.grouped_d[to] = qx.d[from];
        if (!qx.s.empty()) qx.grouped_s[to] = qx.s[from];
        if (!qx.sum.empty()) qx.grouped_sum[to] = qx.sum[from];
      }
    }
    i0 += m;
  }
  // The AMX-INT8 path's tiles of the same codes (see QuantizedX).
  const std::int64_t pairs = (qx.blocks + 1) / 2;
  qx.a16.assign(int8_tiles ? static_cast<std::size_t>(n * pairs * 128) : 0, 0);
  for (std::int64_t i = 0; int8_tiles && i < n; ++i) {
    const std::int64_t g0 = i / 8 * 8, m = std::min<std::int64_t>(8, n - g0);
    std::int8_t* group = qx.a16.data() + g0 * pairs * 128;
    for (std::int64_t b = 0; b < qx.blocks; ++b) {
      const std::int64_t h = b % 2;
      std::memcpy(group + (b / 2) * (2 * m * 64) + (h * m + i - g0) * 64 + 32 * h,
                  qx.q.data() + (i * qx.blocks + b) * 32, 32);
    }
  }
  // The VNNI path's layout of the same codes (see QuantizedX), where that path may run (the
  // ggml order's; the blocksum order broadcasts x's codes from q).
  vnni = vnni && !block_sum;
  qx.x64.resize(vnni ? static_cast<std::size_t>(n * qx.blocks * 64) : 0);
  qx.c64.resize(vnni && !sums ? static_cast<std::size_t>(n * qx.blocks * 16) : 0);
  const std::int32_t factor = type == WeightType::kQ4_0 ? -8 : -128;
  for (std::int64_t b = 0; vnni && b < n * qx.blocks; ++b) {
    const std::int8_t* q = qx.q.data() + b * 32;
    std::int8_t* out = qx.x64.data() + b * 64;
    for (int quarter = 0; quarter < 4; ++quarter) {
      std::memcpy(out + 16 * quarter, q + (quarter >= 2 ? 16 : 0), 16);
      if (sums) continue;
      for (int j = 0; j < 4; ++j) {
        const std::int8_t* g = q + (quarter >= 2 ? 16 : 0) + 4 * j;
        qx.c64[static_cast<std::size_t>(b * 16 + quarter * 4 + j)] =
            factor * (g[0] + g[1] + g[2] + g[3]);
      }
    }
  }
}

// Whether the packed blocksum order of a `type` weight takes AMX-INT8 tiles for n rows of x (the
// same bits as the VNNI path: the same integers, the same float steps; docs/kernels.md), from
// the row count where they were measured to cost less than the VNNI passes (W in L2, one
// thread: the tiles cost about the same for 1-8 rows, 1.6-2.4 ms per 4096 x 14336; VNNI grows
// by ~0.25 ms per row from 0.5 (q4_1) or 1.3 ms (q8_0)). At 5 rows (a k = 4 verify step) VNNI
// is still the cheaper one for q4_1: 1.5 ms there, and on SmolLM2-135M's weights (576 x 1536,
// 1536 x 576, 576 x 576) 5-8% below the tiles (minimum of 400 one-thread calls); the tiles
// lead from 7 rows (issue 15). q8_0, whose B tiles load straight from the packed codes (no
// nibbles to spread), takes them from 5 rows: on SmolLM2-135M's LM head (49152 x 576, L3-resident)
// 5 rows cost 2.5-2.7 ms on the tiles against 2.9-3.1 ms on VNNI, one thread (minimum of 30
// calls, interleaved); at 3-4 rows the two were level, and q4_1 at 5 rows still costs ~1.5x on
// the tiles.
bool int8_tiles_for(WeightType type, ReductionOrder order, std::int64_t n) {
#ifdef MIXKV_MATMUL_AMX
  const std::int64_t min_rows = type == WeightType::kQ8_0 ? 5 : 6;
  return order == ReductionOrder::kBlockSum && quantizes_x(type) && n >= min_rows &&
         detail::amx::int8_available();
#else
  (void)type, (void)order, (void)n;
  return false;
#endif
}

#ifdef MIXKV_MATMUL_AMX
// One product on AMX tiles. Passes of up to kPassRows rows of x (the tile form of x is 6 bytes
// per element, so a long prefill chunk stays bounded; rows are independent, so passes change no
// bits): x in tile form once per pass, then ranges of whole 16-row panels of W.
void run_amx(const detail::MatmulCall& c, ThreadPool* pool) {
  const int workers = pool != nullptr ? pool->size() : 1;
  const std::int64_t panels = ceil_div(c.rows, detail::amx::kTileRows);
  const std::int64_t tasks = workers > 1 ? std::min<std::int64_t>(panels, 4 * workers) : 1;
  detail::amx::XTiles xt;
  for (std::int64_t i0 = 0; i0 < c.n; i0 += detail::amx::kPassRows) {
    detail::MatmulCall part = c;
    part.x = c.x + i0 * c.x_stride;
    part.y = c.y + i0 * c.rows;
    part.n = std::min(detail::amx::kPassRows, c.n - i0);
    detail::amx::prepare_x(part, xt);
    const auto run = [&](std::int64_t t, int) {
      detail::amx::run_rows(part, xt, panels * t / tasks * detail::amx::kTileRows,
                            std::min(c.rows, panels * (t + 1) / tasks * detail::amx::kTileRows));
    };
    if (tasks > 1) {
      pool->parallel_for(tasks, run);
    } else {
      run(0, 0);
    }
  }
}
#endif

}  // namespace

void matmul(const WeightView& w, std::span<const float> x, std::span<float> y, ThreadPool* pool,
            std::string_view where) {
  const MatmulProduct product{w, y, where};
  matmul_many(std::span(&product, 1), x, pool);
}

void matmul_many(std::span<const MatmulProduct> products, std::span<const float> x,
                 ThreadPool* pool, const RowsEpilogue& epilogue) {
  if (products.empty()) return;
  const std::int64_t cols = products[0].w.cols;
  const auto xs = static_cast<std::int64_t>(x.size());
  std::int64_t n = 0;
  for (const MatmulProduct& p : products) {
    if (p.w.cols != cols) {
      throw_invalid(fmt::format(
          "{}: a weight of {} columns in one matmul_many call with {} ({} columns); products "
          "that share x need the same number of columns",
          p.where, p.w.cols, products[0].where, cols));
    }
    if (epilogue && p.w.rows != products[0].w.rows) {
      throw_invalid(fmt::format(
          "{}: a weight of {} rows in one matmul_many call with {} ({} rows) and an epilogue; "
          "products that share an epilogue need the same number of rows",
          p.where, p.w.rows, products[0].where, products[0].w.rows));
    }
    n = check_product(p.w, xs, p.y.size(), p.where);
    if (p.w.packed != nullptr && (p.w.order != ReductionOrder::kBlockSum || !packs(p.w.dtype))) {
      throw_invalid(fmt::format(
          "{}: a packed weight is for the blocksum order of a block format or bfloat16", p.where));
    }
  }
  // Rows of x padded with zeros to whole vectors, when W's rows do not fill them (float types).
  // Buffers are the calling thread's and keep their capacity: a decode step makes hundreds of
  // calls.
  const std::int64_t lanes = HWY_DYNAMIC_DISPATCH(detail::FloatLanesImpl)();
  thread_local detail::LineVector<float> padded;
  const float* xp = x.data();
  std::int64_t x_stride = cols;
  if (cols % lanes != 0) {
    x_stride = ceil_div(cols, lanes) * lanes;
    padded.assign(static_cast<std::size_t>(n * x_stride), 0.0f);
    for (std::int64_t i = 0; i < n; ++i)
      std::copy_n(x.data() + i * cols, cols, padded.data() + i * x_stride);
    xp = padded.data();
  }
  // The block formats read x quantised: once per weight type and order of the call, before any
  // task.
  const bool vnni = vnni_available();
  thread_local detail::QuantizedX quantized[6];  // q8_0, q4_0, q4_1; ggml's order, then blocksum
  bool done[6] = {false, false, false, false, false, false};
  // bfloat16 weights in the blocksum order read x as bf16 codes, rounded once per call.
  thread_local detail::Bf16X bf16_x;
  bool bf16_done = false;
  const bool bf16_dots = HWY_DYNAMIC_DISPATCH(detail::UsesBf16DotsImpl)(bf16_dots_available());
  const auto bf16_x_for = [&](const detail::MatmulCall& c) -> const detail::Bf16X* {
    if (c.type != WeightType::kBfloat16 || c.order != ReductionOrder::kBlockSum) return nullptr;
    if (!bf16_done) round_x_to_bf16(x.data(), n, cols, bf16_dots, bf16_x);
    bf16_done = true;
    return &bf16_x;
  };
  // Where the products read nothing of x but its blocks (no copies to lay out), the pool's
  // threads quantise it inside the products' own region, as its first phase: a batch's step then
  // hands the pool one region per product call instead of two. Each block's bits are its own.
  bool deferred[6] = {false, false, false, false, false, false};
  const auto quantized_for = [&](WeightType type, ReductionOrder order,
                                 bool in_region) -> const detail::QuantizedX* {
    if (!quantizes_x(type)) return nullptr;
    const int k = (type == WeightType::kQ8_0   ? 0
                   : type == WeightType::kQ4_0 ? 1
                                               : 2) +
                  (order == ReductionOrder::kBlockSum ? 3 : 0);
    detail::QuantizedX& qx = quantized[k];
    const bool int8_tiles = int8_tiles_for(type, order, n);
    if (!done[k] && in_region && pool != nullptr && pool->size() > 1 &&
        n * (cols / 32) >= kParallelQuantizeBlocks &&
        !quantized_x_has_copies(order, vnni, int8_tiles)) {
      size_quantized_x(type, order, n, cols, qx);
      finish_quantized_x(type, order, n, vnni, int8_tiles, qx);  // (no copies: empties them)
      deferred[k] = true;
    } else if (!done[k]) {
      quantize_x(type, order, x.data(), n, cols, vnni, int8_tiles, pool, qx);
    } else if (deferred[k] && !in_region) {  // a product outside the region reads it first
      quantize_x_blocks(x.data(), 0, n * qx.blocks, qx);
      deferred[k] = false;
    }
    done[k] = true;
    return &qx;
  };
  // A call's unit of work in W rows: a register tile, or for the packed blocksum layout one of
  // its panels (16 W rows; bfloat16 32, packed or not).
  const auto tile_rows = [](const detail::MatmulCall& c) {
    if (c.bx != nullptr) return detail::kBf16PanelRows;
    return c.packed != nullptr ? detail::kPanelRows : detail::kTileW;
  };
  const auto int8_tiles = [](const detail::MatmulCall& c) {
    return c.packed != nullptr && int8_tiles_for(c.type, c.order, c.n);
  };
  // One call per product; AMX products run on their own (their x has its own tile form), the
  // others in one parallel region below.
  thread_local std::vector<detail::MatmulCall> calls;
  thread_local std::vector<std::int64_t> first_tile;  // per call, then the total
  calls.clear();
  first_tile.clear();
  std::int64_t tiles = 0;
  for (const MatmulProduct& p : products) {
    detail::MatmulCall c;
    c.type = p.w.dtype;
    c.rows = p.w.rows;
    c.cols = cols;
    c.row_bytes = weight_bytes(p.w.dtype, 1, cols);
    c.w = p.w.data;
    c.x = xp;
    c.x_stride = x_stride;
    c.n = n;
    c.y = p.y.data();
    c.order = order_of(p.w);
    c.packed = p.w.packed;
    // (bfloat16's blocksum order is VDPBF16PS's, which AMX CPUs have: not the tiles' three terms.)
    bool on_amx = false;
#ifdef MIXKV_MATMUL_AMX
    on_amx = detail::amx::handles(c.type) && detail::amx::available() &&
             !(c.type == WeightType::kBfloat16 && c.order == ReductionOrder::kBlockSum);
#endif
    c.qx = quantized_for(p.w.dtype, c.order, !on_amx);
    c.vnni = vnni && c.qx != nullptr;
    c.bx = bf16_x_for(c);
    c.bf16_dots = bf16_dots && c.bx != nullptr;
#ifdef MIXKV_MATMUL_AMX
    if (on_amx) {
      run_amx(c, pool);
      continue;
    }
#endif
    calls.push_back(c);
    first_tile.push_back(tiles);
    tiles += ceil_div(c.rows, tile_rows(c));
  }
  first_tile.push_back(tiles);
  const int workers = pool != nullptr ? pool->size() : 1;
  // Rows [r_begin, r_end) of one call, whole tiles.
  const auto rows_of = [int8_tiles](const detail::MatmulCall& c, std::int64_t r_begin,
                                    std::int64_t r_end) {
#ifdef MIXKV_MATMUL_AMX
    if (int8_tiles(c)) return detail::amx::int8_rows(c, r_begin, r_end);
#else
    (void)int8_tiles;
#endif
    HWY_DYNAMIC_DISPATCH(detail::MatmulRowsImpl)(c, r_begin, r_end);
  };
  // The region's first phase: each deferred x in 2 shares per thread (one that joins late finds
  // fewer left); every thread then waits for all of them before its products. (The tasks run on
  // other threads too: they reach the caller's thread_local buffers through a pointer, not by
  // name.)
  std::int64_t shares = 0;
  for (int k = 0; k < 6; ++k) shares += deferred[k] ? 2 * workers : 0;
  detail::QuantizedX* const mine = quantized;
  const ThreadPool::Task quantize_share = [&, mine](std::int64_t i, int) {
    for (int k = 0; k < 6; ++k) {
      if (!deferred[k]) continue;
      if (i >= 2 * workers) {
        i -= 2 * workers;
        continue;
      }
      detail::QuantizedX& qx = mine[k];
      const std::int64_t blocks = n * qx.blocks, parts = 2 * workers;
      quantize_x_blocks(x.data(), blocks * i / parts, blocks * (i + 1) / parts, qx);
      return;
    }
  };
  if (epilogue) {
    // The same rows of every call per task, in units of whole tiles of every call and of 64
    // rows (an epilogue's vectors start where a row's would); the products on AMX tiles ran
    // whole above.
    std::int64_t unit = 64;
    for (const detail::MatmulCall& c : calls) unit = std::lcm(unit, tile_rows(c));
    const std::int64_t rows = products[0].w.rows;
    const std::int64_t units = ceil_div(rows, unit);
    const std::int64_t tasks = std::max<std::int64_t>(1, std::min<std::int64_t>(units, workers));
    const std::span<const detail::MatmulCall> list(calls);
    const auto run = [&](std::int64_t t, int) {
      const std::int64_t r_begin = std::min(rows, units * t / tasks * unit);
      const std::int64_t r_end = std::min(rows, units * (t + 1) / tasks * unit);
      if (r_begin >= r_end) return;
      for (const detail::MatmulCall& c : list) rows_of(c, r_begin, r_end);
      epilogue(r_begin, r_end);
    };
    if (pool != nullptr) {
      pool->parallel_for(shares, quantize_share, tasks, run);
    } else {
      run(0, 0);
    }
    return;
  }
  if (calls.empty()) return;  // (nothing was deferred: that takes a call in the region)
  // The register tiles of all the weights, one after the other, cut into one range of whole
  // tiles per worker. Each range is one stream through W: a range's start finds its first
  // panels cold (the hardware prefetcher and PanelPrefetch start over), and with four ranges per
  // worker, handed out dynamically, those starts cost SmolLM2 more than the hand-out ever saved
  // (a 5-row step 5-12% slower, a batch of 16 3-11%, on a 2-core Zen 4, busy or not:
  // docs/kernels.md). Any split gives the same bits (each output is computed inside one range,
  // in an order fixed by its W row alone). (The tasks run on other threads too: they see the
  // caller's thread_local buffers through these spans, not by name.)
  const std::span<const detail::MatmulCall> list(calls);
  const std::span<const std::int64_t> first(first_tile);
  const std::int64_t tasks = workers > 1 ? std::min<std::int64_t>(tiles, workers) : 1;
  const auto run = [list, first, tiles, tasks, tile_rows, rows_of](std::int64_t t, int) {
    const std::int64_t t0 = tiles * t / tasks, t1 = tiles * (t + 1) / tasks;
    for (std::size_t k = 0; k < list.size(); ++k) {
      const std::int64_t b = std::max(t0, first[k]), e = std::min(t1, first[k + 1]);
      if (b >= e) continue;
      const detail::MatmulCall& c = list[k];
      const std::int64_t tile = tile_rows(c);
      rows_of(c, (b - first[k]) * tile, std::min(c.rows, (e - first[k]) * tile));
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(shares, quantize_share, tasks, run);
  } else {
    run(0, 0);
  }
}

void dequantize_row(const WeightView& w, std::int64_t row, std::span<float> out) {
  check_shape(w.dtype, w.rows, w.cols, "dequantize_row");
  if (w.data == nullptr) throw_invalid("dequantize_row: the weight has no data");
  if (row < 0 || row >= w.rows) {
    throw_invalid(fmt::format("dequantize_row: row {} of a weight of {} rows", row, w.rows));
  }
  if (static_cast<std::int64_t>(out.size()) != w.cols) {
    throw_invalid(
        fmt::format("dequantize_row: out holds {} floats, a row has {}", out.size(), w.cols));
  }
  HWY_DYNAMIC_DISPATCH(detail::DequantizeRowImpl)
  (w.dtype, w.data + row * weight_bytes(w.dtype, 1, w.cols), w.cols, out.data());
}

const char* matmul_target() { return HWY_DYNAMIC_DISPATCH(detail::MatmulTargetImpl)(); }

bool matmul_uses_amx(WeightType type) {
#ifdef MIXKV_MATMUL_AMX
  return detail::amx::handles(type) && detail::amx::available();
#else
  (void)type;
  return false;
#endif
}

void set_matmul_vnni(bool on) { vnni_switched_on().store(on, std::memory_order_relaxed); }

void set_matmul_bf16_dots(bool on) { bf16_dots_switched_on().store(on, std::memory_order_relaxed); }

void set_matmul_amx(bool on) {
#ifdef MIXKV_MATMUL_AMX
  detail::amx::switched_on().store(on, std::memory_order_relaxed);
#else
  (void)on;
#endif
}

}  // namespace mixkv::kernels
#endif  // HWY_ONCE
