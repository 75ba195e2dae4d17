// Dense attention references: plain loops in double precision over contiguous logical sequences,
// written to be obviously correct rather than fast. The kernels' tests and `mixkv verify` compare
// paged kernels with these.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mixkv/kernels/attention_kernel.hpp"

namespace mixkv::kernels {

// One request laid out contiguously in logical token order.
struct DenseSequence {
  std::span<const float> k;  // [kv_len, num_kv_heads, head_size] (MLA: the latents)
  std::span<const float> v;  // [kv_len, num_kv_heads, head_size_v] (MLA: empty)
  std::span<const float> q;  // [num_queries, num_q_heads, head_size]
  std::int64_t kv_len = 0;
  std::int64_t num_queries = 1;  // the last num_queries positions
};

// Attention of one request with the masking, soft cap, sinks and scale of `spec` (see
// paged_attention); returns [num_queries, num_q_heads, head_size_v]. Throws Error on shapes that
// do not match the spec.
std::vector<double> dense_attention(const AttentionSpec& spec, const DenseSequence& seq,
                                    std::span<const float> sinks);

}  // namespace mixkv::kernels
