// The hot loops of paged attention (attention_simd.cpp, compiled once per instruction set by
// Highway and chosen at run time) and what they need from the checked call: the page layout and
// one work item. attention_kernel.cpp checks everything first, then hands out work items.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mixkv/kernels/attention_kernel.hpp"

namespace mixkv::kernels::detail {

// The layer's bytes as the kernel sees them, checked against the spec once per call.
struct PageLayout {
  DType dtype = DType::kBfloat16;
  std::int64_t elem = 0;
  std::int64_t kernel_tokens = 0;
  std::int64_t stride = 0;
  std::int64_t offset = 0;
  std::int64_t k_token_bytes = 0;
  std::int64_t v_token_bytes = 0;
  std::int64_t v_offset = 0;
  // Bytes of a page the kernel may touch, from the page's base.
  std::int64_t span_bytes() const {
    return std::max(kernel_tokens * k_token_bytes, v_offset + kernel_tokens * v_token_bytes);
  }
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
// Tokens converted from the cache at once (never across a kernel page).
constexpr std::int64_t kTileTokens = 16;

// Everything fixed for one paged_attention call.
struct AttendCall {
  const AttentionSpec* spec = nullptr;
  PageLayout page;
  const std::byte* cache = nullptr;
  const float* queries = nullptr;
  const float* sinks = nullptr;
  KvScales scales;
  float* out = nullptr;
};

// One task: queries [q_begin, q_end) of a request (at most kQueryBlock) and query heads
// [h_begin, h_end). Every output (query, head) is computed inside one task, in an order that
// depends on the request, the query block and the call only, so results do not depend on how
// heads are split into tasks, on the thread count, or on the rest of the batch.
struct AttendTask {
  const PagedSequence* seq = nullptr;
  std::int64_t row0 = 0;  // the request's first query row in queries/out
  std::int64_t q_begin = 0;
  std::int64_t q_end = 0;
  std::int64_t h_begin = 0;
  std::int64_t h_end = 0;
};

// Per-worker buffers, grown as needed and reused across tasks.
struct AttendScratch {
  std::vector<float> q, k, v, scores, probs, max, sum, acc;
};

// Runs one task with the best instruction set this CPU has.
void attend_task(const AttendCall& call, const AttendTask& task, AttendScratch& scratch);

// The instruction set attend_task uses on this CPU (e.g. "AVX3"), for benchmarks and docs.
const char* attend_target();

}  // namespace mixkv::kernels::detail
