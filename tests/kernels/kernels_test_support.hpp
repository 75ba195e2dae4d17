// Shared by the kernel tests: random K/V/Q, writing requests through the slot mapping, running
// the paged kernel and the dense reference, and tolerances derived from the cache dtype.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mixkv/attention_kernel.hpp"
#include "mixkv/dense_reference.hpp"
#include "mixkv/kernels_convert.hpp"

namespace mixkv::kernels::testing {

inline std::vector<float> random_values(std::mt19937_64& rng, std::size_t n, float magnitude) {
  std::uniform_real_distribution<float> dist(-magnitude, magnitude);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

// What the cache holds after a write of `values`: each element through the dtype and scale.
inline std::vector<float> stored(DType dtype, std::span<const float> values, float scale) {
  std::vector<std::byte> bytes(values.size() * static_cast<std::size_t>(element_bytes(dtype)));
  encode_row(dtype, values, scale, bytes);
  std::vector<float> back(values.size());
  decode_row(dtype, bytes, scale, back);
  return back;
}

// One request: its logical K/V (as written) and queries, and where it lives in the cache.
struct Request {
  std::vector<std::int64_t> blocks;  // manager blocks
  std::int64_t kv_len = 0;
  std::int64_t num_queries = 1;
  std::vector<float> k, v, q;
};

// Random K/V for `kv_len` tokens, written through the slot mapping in two pieces (the context,
// then the new tokens, as prefill then extend would) from position `first_written` on (the
// blocks before it may be freed: a sliding window), and random queries for the last
// `num_queries`.
inline Request make_request(const AttentionSpec& spec, const layout::LayerGeometry& layer,
                            KvScales scales, std::span<std::byte> cache,
                            std::vector<std::int64_t> blocks, std::int64_t kv_len,
                            std::int64_t num_queries, std::mt19937_64& rng, float magnitude = 1.0f,
                            std::int64_t first_written = 0) {
  Request r;
  r.blocks = std::move(blocks);
  r.kv_len = kv_len;
  r.num_queries = num_queries;
  const auto n = static_cast<std::size_t>(kv_len);
  r.k = random_values(rng, n * static_cast<std::size_t>(k_row_elements(spec)), magnitude);
  r.v = random_values(rng, n * static_cast<std::size_t>(v_row_elements(spec)), magnitude);
  r.q = random_values(
      rng, static_cast<std::size_t>(num_queries * spec.params.num_q_heads * spec.head_size), 1.0f);
  const std::int64_t split =
      std::uniform_int_distribution<std::int64_t>(first_written, kv_len)(rng);
  const auto kr = static_cast<std::size_t>(k_row_elements(spec));
  const auto vr = static_cast<std::size_t>(v_row_elements(spec));
  for (auto [first, count] :
       {std::pair{first_written, split - first_written}, std::pair{split, kv_len - split}}) {
    const auto slots = slot_mapping(layer, r.blocks, first, count);
    const auto f = static_cast<std::size_t>(first);
    const auto c = static_cast<std::size_t>(count);
    write_kv(spec, layer, scales, cache, slots, std::span<const float>(r.k).subspan(f * kr, c * kr),
             std::span<const float>(r.v).subspan(f * vr, c * vr));
  }
  return r;
}

struct Comparison {
  double max_error_stored = 0;    // kernel vs reference over the values the cache holds
  double tolerance_stored = 0;    // float arithmetic only
  double max_error_original = 0;  // kernel vs reference over the values before the cache
  double tolerance_original = 0;  // plus the dtype's rounding of K and V
  bool ok() const {
    return max_error_stored <= tolerance_stored && max_error_original <= tolerance_original;
  }
  std::string to_string() const {
    return "max error " + std::to_string(max_error_stored) + " (tolerance " +
           std::to_string(tolerance_stored) + ") over stored values, " +
           std::to_string(max_error_original) + " (tolerance " +
           std::to_string(tolerance_original) + ") over the originals";
  }
};

// Runs the paged kernel over `requests` (block tables from `tables`, normally the requests' own
// blocks) and the dense reference per request. `reference_spec` is the truth (the layer's own
// parameters); `spec` what the kernel is given.
//
// Tolerances. Float arithmetic: logits carry a relative error of a few float ulps of
// scale * sum|q||k|, the softmax sums a few ulps per halving of the key count; we allow
// 64 ulps of (1 + logit bound) times max|v|. Dtype: a stored K element differs from the
// original by at most rel*|k| + abs*scale_k, so a logit moves by at most
// delta = scale * sum_d |q_d| (rel |k_d| + abs scale_k); softmax weights then move by at most
// exp(2 delta) - 1 in total, and each V element by rel*|v| + abs*scale_v.
inline Comparison run_and_compare(const AttentionSpec& spec, const AttentionSpec& reference_spec,
                                  const layout::LayerGeometry& layer, KvScales scales,
                                  std::span<const std::byte> cache,
                                  const std::vector<Request>& requests,
                                  const std::vector<std::vector<std::int64_t>>& tables,
                                  std::span<const float> sinks) {
  const std::int64_t hq = spec.params.num_q_heads;
  const std::int64_t hkv = spec.params.num_kv_heads;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;
  std::vector<std::vector<std::int64_t>> pages;
  std::vector<PagedSequence> batch;
  std::vector<float> queries;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    pages.push_back(layout::kernel_block_table(layer, tables[i]));
    queries.insert(queries.end(), requests[i].q.begin(), requests[i].q.end());
  }
  for (std::size_t i = 0; i < requests.size(); ++i)
    batch.push_back({pages[i], requests[i].kv_len, requests[i].num_queries});
  std::vector<float> out(queries.size() / static_cast<std::size_t>(d) *
                         static_cast<std::size_t>(dv));
  paged_attention(spec, layer, AttentionInputs{cache, batch, queries, sinks, scales}, out);

  const DType dtype = reference_spec.params.kv_dtype;
  const RoundingBound rb = rounding_bound(dtype);
  const double eps = std::ldexp(1.0, -24);
  Comparison c;
  std::size_t row = 0;
  for (const Request& r : requests) {
    const std::vector<float> ks = stored(dtype, r.k, scales.k);
    const std::vector<float> vs = stored(dtype, r.v, scales.v);
    const DenseSequence original{r.k, r.v, r.q, r.kv_len, r.num_queries};
    const DenseSequence cached{ks, vs, r.q, r.kv_len, r.num_queries};
    const std::vector<double> want = dense_attention(reference_spec, original, sinks);
    const std::vector<double> want_stored = dense_attention(reference_spec, cached, sinks);

    // Bounds from the data: max |v|, max over query heads and keys of sum |q||k|.
    const std::vector<float>& values = reference_spec.mla ? r.k : r.v;
    double max_v = 0;
    for (float x : values) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
    double qk = 0, delta = 0;
    for (std::int64_t i = 0; i < r.num_queries; ++i) {
      for (std::int64_t h = 0; h < hq; ++h) {
        const float* q = r.q.data() + (i * hq + h) * d;
        const std::int64_t kh = h / (hq / hkv);
        for (std::int64_t t = 0; t < r.kv_len; ++t) {
          const float* k = r.k.data() + (t * hkv + kh) * d;
          double s = 0, e = 0;
          for (std::int64_t j = 0; j < d; ++j) {
            s += std::fabs(q[j] * k[j]);
            e += std::fabs(q[j]) * (rb.relative * std::fabs(k[j]) + rb.absolute * scales.k);
          }
          qk = std::max(qk, s);
          delta = std::max(delta, e);
        }
      }
    }
    const double scale = std::fabs(reference_spec.params.scale);
    const double arithmetic = 64 * eps * (1 + scale * qk) * max_v;
    const double weights = std::expm1(2 * scale * delta);
    const double max_v_stored = (1 + rb.relative) * max_v + rb.absolute * scales.v;
    const double rounding = weights * max_v_stored + rb.relative * max_v + rb.absolute * scales.v;
    c.tolerance_stored = std::max(c.tolerance_stored, arithmetic);
    c.tolerance_original = std::max(c.tolerance_original, arithmetic + rounding);
    for (std::size_t j = 0; j < want.size(); ++j) {
      const double got = out[row + j];
      // NaN (a read of poisoned bytes) must count as a failure.
      const double e1 = std::isfinite(got) ? std::fabs(got - want_stored[j]) : INFINITY;
      const double e2 = std::isfinite(got) ? std::fabs(got - want[j]) : INFINITY;
      c.max_error_stored = std::max(c.max_error_stored, e1);
      c.max_error_original = std::max(c.max_error_original, e2);
    }
    row += want.size();
  }
  return c;
}

inline Comparison run_and_compare(const AttentionSpec& spec, const layout::LayerGeometry& layer,
                                  KvScales scales, std::span<const std::byte> cache,
                                  const std::vector<Request>& requests,
                                  std::span<const float> sinks) {
  std::vector<std::vector<std::int64_t>> tables;
  for (const auto& r : requests) tables.push_back(r.blocks);
  return run_and_compare(spec, spec, layer, scales, cache, requests, tables, sinks);
}

}  // namespace mixkv::kernels::testing
