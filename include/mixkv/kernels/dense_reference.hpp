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

// The sum of term(0) .. term(n - 1) in double, as four interleaved partial sums: independent add
// chains, so a reference loop is not bound by the adder's latency (a serial sum took 4 cycles a
// term). It differs from the serial sum by double rounding only, far inside any float tolerance.
template <class Term>
double sum_terms(std::int64_t n, Term term) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += term(j);
    s1 += term(j + 1);
    s2 += term(j + 2);
    s3 += term(j + 3);
  }
  for (; j < n; ++j) s0 += term(j);
  return (s0 + s1) + (s2 + s3);
}

// Attention of one request with the masking, soft cap, sinks and scale of `spec` (see
// paged_attention); returns [num_queries, num_q_heads, head_size_v]. Throws Error on shapes that
// do not match the spec.
std::vector<double> dense_attention(const AttentionSpec& spec, const DenseSequence& seq,
                                    std::span<const float> sinks);

}  // namespace mixkv::kernels
