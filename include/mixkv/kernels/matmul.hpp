// Weight-streaming matrix products for decode, speculative verify and small prefill chunks:
// Y = X * W^T for a few float32 token rows X against a weight W stored in a float or ggml block
// format, dequantised in registers. W is read once for all rows; its rows are spread over a
// ThreadPool. Every output is reduced in an order fixed by W's shape alone. docs/kernels.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "mixkv/kernels/thread_pool.hpp"

namespace mixkv::kernels {

// How a weight is stored, row by row (each row of `cols` elements is contiguous; rows follow each
// other without padding). The block formats are ggml's (GGUF files), little-endian:
//   q8_0: per 32 elements, fp16 scale d, then 32 int8 q;        value = q * d
//   q4_0: per 32 elements, fp16 d, then 16 bytes of nibbles;     value = (q - 8) * d
//   q4_1: per 32 elements, fp16 d, fp16 m, then 16 bytes;        value = q * d + m
// A nibble byte i holds element i in its low four bits and element i + 16 in its high four.
enum class WeightType { kFloat32, kBfloat16, kFloat16, kQ8_0, kQ4_0, kQ4_1 };

// "float32", "bfloat16", "float16", "q8_0", "q4_0", "q4_1".
std::string_view to_string(WeightType type);

// The type of a ggml tensor type id as GGUF stores it (0 f32, 1 f16, 2 q4_0, 3 q4_1, 8 q8_0,
// 30 bf16); nullopt for the ids these kernels do not read (k-quants, i-quants, ...).
std::optional<WeightType> weight_type_from_ggml(std::uint32_t ggml_type);

// Elements per block (32 for the block formats, 1 for float types): `cols` must be a multiple.
std::int64_t weight_block_elements(WeightType type);

// Bytes of a [rows, cols] weight. Throws Error (bad input) for non-positive sizes, cols that are
// not a multiple of the block, or an overflow.
std::int64_t weight_bytes(WeightType type, std::int64_t rows, std::int64_t cols);

// How the block formats (q8_0, q4_0, q4_1) and bfloat16 reduce each output. Every order gives
// the same bits for 1 row and n rows (docs/kernels.md, "Reduction order"). The block formats
// read x quantised the same way in both (ggml's q8_0 / q8_1 codes and scales), and give the same
// bits on every instruction set in both:
// - kGgml: ggml's float steps (eight float chains per output, fed per block), llama.cpp's bits.
// - kBlockSum: one exact integer sum I_b per (x row, W row, block) and one float chain over the
//   blocks in order, y = fma(d_w * d_x, I_b, y) (q4_1 then y = fma(m_w, s_x, y)): about a fifth
//   of the vector work per row, so n rows cost little more than one.
// bfloat16:
// - kGgml: x in float32, each instruction set's float order (as float32 and float16 weights).
// - kBlockSum: x rounded to bf16 once (as ggml's own bf16 dot products read it), one float chain
//   per output over the pairs of columns in order, each pair adding the odd column's product,
//   then the even one's (AVX512-BF16's VDPBF16PS with W's rows across the lanes): half the
//   instructions of float x per row and no sum across lanes, so 8 rows cost little more than
//   one; the same bits on every instruction set (on x86; subnormals flushed to zero, as
//   VDPBF16PS does). x's rounding costs accuracy: about 2^-9 of each product.
// A property of the weight, fixed by the model (never chosen by the row count); float32 and
// float16 ignore it (weight_order_applies).
enum class ReductionOrder { kGgml, kBlockSum };

// "ggml", "blocksum".
std::string_view to_string(ReductionOrder order);

// Whether a weight of `type` reads WeightView::order: the block formats and bfloat16.
bool weight_order_applies(WeightType type);

// A weight the caller owns (typically a view into a memory-mapped GGUF/safetensors file):
// `rows` outputs of `cols` inputs, weight_bytes(dtype, rows, cols) bytes at `data` (any
// alignment).
struct WeightView {
  WeightType dtype = WeightType::kFloat32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const std::byte* data = nullptr;
  ReductionOrder order = ReductionOrder::kGgml;
  // Optional, kBlockSum only: pack_weight's copy of this weight, which the AVX-512 VNNI path (the
  // block formats: 16 W rows side by side per block) or every path (bfloat16: 32 rows side by
  // side per pair of columns) then reads instead of `data`. Paths that cannot use it read `data`
  // (bfloat16 packs a panel at a time from it); the bits are the same either way.
  const std::byte* packed = nullptr;
};

// A weight laid out for the kBlockSum order, made once (at load). bfloat16: see pack_weight.
// A block format, for the VNNI and AMX-INT8 paths: per panel of 16 W rows (the last one padded with
// zero rows), first every block's scales (the 16 rows' fp16 d, q4_1 then their 16 m), then every
// block's codes as vectors of 16 lanes, lane j holding four bytes of row j (q8_0: codes 4k..4k+3
// plus 128, k = 0..7; q4_0/q4_1: bytes 4v..4v+3 of the row's block, i.e. codes 4v.. in the low and
// 16 + 4v.. in the high nibbles, v = 0..3). About the bytes of the original (plus the padding
// rows): once packed, a caller that only multiplies may let the original's pages go.
class PackedWeight {
 public:
  PackedWeight() = default;
  const std::byte* data() const { return data_.get(); }
  std::int64_t bytes() const { return bytes_; }

 private:
  friend PackedWeight pack_weight(const WeightView& w);
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::int64_t bytes_ = 0;
};

// Whether matmul reads a packed copy of a `type` weight in the kBlockSum order on this CPU
// (block formats on x86 with AVX2 or AVX-512: 16 W rows across the lanes of one 512-bit or two
// 256-bit vectors; bfloat16 everywhere); elsewhere the kernels read W's own layout and packing
// would not pay.
bool matmul_reads_packed(WeightType type);

// The kBlockSum layout of `w` (a q8_0, q4_0, q4_1 or bfloat16 weight; Error otherwise). Reads all
// of W. bfloat16: panels of 32 rows (the last one padded with zero rows), per pair of columns 32
// words, word j holding row j's codes of the even (low half) and odd column (high half; zero past
// an odd last column): 64 bytes a column per panel.
PackedWeight pack_weight(const WeightView& w);

// y[i][r] = sum over c of x[i][c] * W[r][c] for `x` of [n, w.cols] and `y` of [n, w.rows]
// (row-major, n = x.size() / w.cols >= 1). Each y[i][r] is reduced in an order fixed by w.cols
// and the instruction set alone: the same bits whatever n, whatever the other rows of x, and
// whatever the pool (nullptr: the calling thread). Throws Error (bad input) when the sizes do not
// match, naming `where` (e.g. the layer and tensor) in the message.
// The block formats (q8_0, q4_0, q4_1) quantise each row of x per 32 elements as ggml does
// (q8_0 for q8_0 and q4_0 weights, q8_1 for q4_1), take integer dots per block and reduce in
// w.order: with kGgml ggml's float steps in its order, so the result is the same bits on every
// instruction set and, for the same x, llama.cpp's; with kBlockSum mixkv's cheaper order, also
// the same bits on every instruction set (docs/kernels.md).
void matmul(const WeightView& w, std::span<const float> x, std::span<float> y,
            ThreadPool* pool = nullptr, std::string_view where = "matmul");

// One product of a matmul_many call: y = x * w^T, with y of [n, w.rows].
struct MatmulProduct {
  WeightView w;
  std::span<float> y;
  std::string_view where = "matmul";  // named in its errors
};

// Work on rows [r_begin, r_end) of every product's y (all n rows of x), run by the task that
// computed them (matmul_many).
using RowsEpilogue = std::function<void(std::int64_t r_begin, std::int64_t r_end)>;

// Several products of the same x (a layer's q, k and v projections; gate and up) in one parallel
// region: x is quantised once per weight type of the call, and the rows of all the weights are
// split across the pool together, so a decode step hands the pool one region instead of one per
// weight. Each y gets exactly the bits matmul(p.w, x, p.y) gives it. Every weight needs x's
// column count; throws Error (bad input) as matmul does, naming the product's `where`.
//
// With an `epilogue` (a gated MLP's activation over its gate and up), every weight needs the same
// row count: each task takes the same rows of every product, from a multiple of 64, and runs
// epilogue on them once they are done. The activation then needs no region of its own, and each
// thread reads the outputs it has just written rather than the other thread's.
void matmul_many(std::span<const MatmulProduct> products, std::span<const float> x,
                 ThreadPool* pool = nullptr, const RowsEpilogue& epilogue = {});

// Decodes row `row` of `w` into `out` (w.cols floats) with the same values the product uses
// (an embedding lookup, or a reference).
void dequantize_row(const WeightView& w, std::int64_t row, std::span<float> out);

// The instruction set matmul uses on this CPU (e.g. "AVX3"), chosen at run time.
const char* matmul_target();

// Whether matmul runs weights of `type` on AMX tiles here: bf16 (in the kGgml order), q8_0, q4_0
// and q4_1 do on CPUs with AMX-BF16 whose OS grants the tile state (Linux 5.16+), unless switched
// off. The AMX path
// has its own reduction order (docs/kernels.md), as each instruction set does.
bool matmul_uses_amx(WeightType type);

// Switches the block formats' AVX-512 VNNI dot products off (or back on) for the whole process:
// tests check the AVX-512 path without VNNI on a CPU that has it (both give the same bits);
// not meant to be flipped while products run.
void set_matmul_vnni(bool on);

// Switches bfloat16's kBlockSum products on AVX512-BF16's VDPBF16PS off (or back on) for the
// whole process: tests check the other paths against it on a CPU that has it (the same bits);
// not meant to be flipped while products run.
void set_matmul_bf16_dots(bool on);

// Switches the AMX path off (or back on) for the whole process: tests check the AVX paths on an
// AMX machine with it; not meant to be flipped while products run.
void set_matmul_amx(bool on);

}  // namespace mixkv::kernels
