// The hot loops of paged attention (attention_simd.cpp, compiled once per instruction set by
// Highway and chosen at run time) and what they need from the checked call: the page layout and
// one work item. attention_kernel.cpp checks everything first, then hands out work items.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/line_aligned.hpp"
#include "mixkv/kernels/attention_kernel.hpp"

namespace mixkv::kernels::detail {

// The layer's bytes as the kernel sees them, checked against the spec once per call.
struct PageLayout {
  DType dtype = DType::kBfloat16;
  std::int64_t elem = 0;
  std::int64_t kernel_tokens = 0;
  std::int64_t stride = 0;
  std::int64_t offset = 0;
  // A KV head's rows: one token's to the next (row), one head's first to the next head's (head);
  // layout::LayerGeometry's NHD or HND strides.
  std::int64_t k_row_stride = 0;
  std::int64_t v_row_stride = 0;
  std::int64_t k_head_stride = 0;
  std::int64_t v_head_stride = 0;
  std::int64_t v_offset = 0;
  std::int64_t span_bytes = 0;  // of a page the kernel may touch, from the page's base
};

// Keys visible to the query at position `pos` of a sequence of `kv_len` tokens: [lo, hi].
struct KeyRange {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
};
inline KeyRange key_range(const attn::AttentionParams& params, std::int64_t pos,
                          std::int64_t kv_len) {
  KeyRange r;
  r.hi = params.causal ? pos : kv_len - 1;
  r.lo = params.window_left >= 0 ? std::max<std::int64_t>(0, pos - params.window_left) : 0;
  return r;
}

// Queries of a request processed together share each K/V tile they read.
constexpr std::int64_t kQueryBlock = 16;
// Tokens converted from the cache at once (never across a kernel page or a context chunk).
constexpr std::int64_t kTileTokens = 16;
// Flash-decoding: the context is cut into chunks of kSplitTokens positions, counted from the
// request's position 0, whatever the pages, queries, threads or batch. Each chunk's online
// softmax starts afresh; the chunks' partial (max, sum, acc) are folded left to right in chunk
// order (after a sink), in one task or, split over several, after all of them. So the chunks
// fix the arithmetic, and a split only decides where it runs.
constexpr std::int64_t kSplitTokens = 1024;

// Everything fixed for one paged_attention call.
struct AttendCall {
  const AttentionSpec* spec = nullptr;
  PageLayout page;
  const std::byte* cache = nullptr;
  const float* queries = nullptr;
  const float* sinks = nullptr;
  KvScales scales;
  float* out = nullptr;
  // The AMX tile path (attention_amx.hpp), chosen by the layer's shape and the CPU alone.
  bool amx = false;
  // AttentionOrder::kBf16Pairs on VDPBF16PS (else the same bits from ordinary instructions).
  bool bf16_dots = false;
};

// One query block of a request whose context chunks are computed by several tasks: each stores
// its chunks' partials here, and reduce_partials folds them once every task is done.
// partials: [chunk - chunk_first][query - q_begin][head] records of partial_floats(dv) floats.
struct SplitBlock {
  const PagedSequence* seq = nullptr;
  std::int64_t row0 = 0;
  std::int64_t q_begin = 0;
  std::int64_t q_end = 0;
  std::int64_t chunk_first = 0;
  std::int64_t chunks = 0;
  float* partials = nullptr;
};

// One task: queries [q_begin, q_end) of a request (at most kQueryBlock), query heads
// [h_begin, h_end) and the context chunks [chunk_begin, chunk_end) of the block's keys. Every
// (query, head, chunk) partial is computed inside one task, in an order that depends on the
// request, its position and the call only, so results do not depend on how heads or chunks are
// split into tasks, on the thread count, or on the rest of the batch. `split` null: the task
// covers all the block's chunks and writes outputs; else it stores partials into split->partials.
struct AttendTask {
  const PagedSequence* seq = nullptr;
  std::int64_t row0 = 0;  // the request's first query row in queries/out
  std::int64_t q_begin = 0;
  std::int64_t q_end = 0;
  std::int64_t h_begin = 0;
  std::int64_t h_end = 0;
  std::int64_t chunk_begin = 0;
  std::int64_t chunk_end = 0;
  const SplitBlock* split = nullptr;
};

// Per-worker buffers, grown as needed and reused across tasks. max/sum/acc: the current chunk's
// online softmax; run_*: the fold of the chunks so far.
struct AttendScratch {
  LineVector<float> q, k, v, scores, probs, max, sum, acc, run_max, run_sum, run_acc;
  // AMX path: per column (query row x head) slot its softmax state and accumulator; the
  // queries' and one tile's V in tile form.
  LineVector<float> amx_max, amx_sum, amx_acc, amx_scores, amx_probs;
  LineVector<std::uint32_t> amx_q, amx_v, amx_kt;
  LineVector<std::int64_t> amx_col0;  // per KV head of the task: its first slot
  // AttentionOrder::kBf16Pairs: the task's queries rounded to bf16 (as q); one tile's softmax
  // weights of up to 4 heads rounded to bf16 and paired by token (pair m of head x: tokens 2m
  // and 2m + 1 of the tile, the first in the low half).
  LineVector<std::uint16_t> q_bf16;
  LineVector<std::uint32_t> p_pairs;
  LineVector<std::uint32_t> k_pairs;         // one tile's K of a KV head, transposed (32-bit pairs)
  LineVector<std::uint32_t> v_pairs;         // its V, token pairs interleaved (interleave_values)
  LineVector<std::uint16_t> k_wide, v_wide;  // an e4m3 tile's K and V rows widened to bf16
};

// Runs one task with the best instruction set this CPU has.
void attend_task(const AttendCall& call, const AttendTask& task, AttendScratch& scratch);

// Folds a split block's partials (every task of it done) into its outputs, for heads
// [h_begin, h_end).
void reduce_partials(const AttendCall& call, const SplitBlock& block, std::int64_t h_begin,
                     std::int64_t h_end);

// Floats of one partial record (max, sum, acc padded to the vector) on this CPU's target.
std::int64_t partial_floats(std::int64_t head_size_v);

// The instruction set attend_task uses on this CPU (e.g. "AVX3"), for benchmarks and docs.
const char* attend_target();

// Whether that instruction set's build has the VDPBF16PS path of AttentionOrder::kBf16Pairs.
bool attend_has_bf16_dots();

}  // namespace mixkv::kernels::detail
