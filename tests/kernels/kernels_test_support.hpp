// Shared by the kernel tests: random K/V/Q, writing requests through the slot mapping, and
// running the paged kernel against the dense reference (the comparison and its dtype-derived
// tolerances live in the library, mixkv/verify.hpp, which `mixkv verify` uses too).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/convert.hpp"
#include "mixkv/kernels/dense_reference.hpp"
#include "mixkv/kernels/thread_pool.hpp"
#include "mixkv/kernels/verify.hpp"

namespace mixkv::kernels::testing {

inline std::vector<float> random_values(std::mt19937_64& rng, std::size_t n, float magnitude) {
  std::uniform_real_distribution<float> dist(-magnitude, magnitude);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

// What the cache holds after a write of `values`: each element through the dtype and scale.
inline std::vector<float> stored(DType dtype, std::span<const float> values, float scale) {
  return stored_values(dtype, values, scale);
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

// A layer over `num_pages` kernel pages of `page_tokens` tokens, laid out like make_geometry's
// (NHD or HND, K then V in each page, uniform stride), every byte 0xFF (NaN in every dtype) until
// written, so a read of anything a test did not write shows up as NaN.
struct Layer {
  AttentionSpec spec;
  layout::LayerGeometry geometry;
  std::vector<std::byte> cache;
};

inline Layer make_layer(const AttentionSpec& spec, std::int64_t num_pages, std::int64_t page_tokens,
                        std::string name, attn::KvLayout kv_layout = attn::KvLayout::kNHD) {
  Layer l;
  l.spec = spec;
  auto& g = l.geometry;
  g.layer = std::move(name);
  g.kernel_tokens = page_tokens;
  g.block_tokens = page_tokens;
  const std::int64_t elem = element_bytes(spec.params.kv_dtype);
  g.k_token_bytes = k_row_elements(spec) * elem;
  g.v_token_bytes = v_row_elements(spec) * elem;
  g.kernel_page_bytes = g.kernel_tokens * (g.k_token_bytes + g.v_token_bytes);
  g.kernel_page_stride = g.kernel_page_bytes;
  g.v_offset = g.kernel_tokens * g.k_token_bytes;
  g.kv_layout = kv_layout;
  g.num_kv_heads = spec.mla ? 1 : spec.params.num_kv_heads;
  l.cache.assign(static_cast<std::size_t>(num_pages * g.kernel_page_stride), std::byte{0xFF});
  return l;
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using Comparison = kernels::Comparison;

// Runs the paged kernel over `requests` (block tables from `tables`, normally the requests' own
// blocks) and the dense reference per request (compare_with_reference in mixkv/verify.hpp, which
// explains the tolerances). `reference_spec` is the truth (the layer's own parameters); `spec`
// what the kernel is given.
inline Comparison run_and_compare(const AttentionSpec& spec, const AttentionSpec& reference_spec,
                                  const layout::LayerGeometry& layer, KvScales scales,
                                  std::span<const std::byte> cache,
                                  const std::vector<Request>& requests,
                                  const std::vector<std::vector<std::int64_t>>& tables,
                                  std::span<const float> sinks) {
  std::vector<std::vector<std::int64_t>> pages;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    pages.push_back(layout::kernel_block_table(layer, tables[i]));
  }
  std::vector<CheckedSequence> batch;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    batch.push_back({pages[i], r.kv_len, r.num_queries, r.k, r.v, r.q});
  }
  return compare_with_reference(spec, reference_spec, layer, scales, cache, batch, sinks);
}

inline Comparison run_and_compare(const AttentionSpec& spec, const layout::LayerGeometry& layer,
                                  KvScales scales, std::span<const std::byte> cache,
                                  const std::vector<Request>& requests,
                                  std::span<const float> sinks) {
  std::vector<std::vector<std::int64_t>> tables;
  for (const auto& r : requests) tables.push_back(r.blocks);
  return run_and_compare(spec, spec, layer, scales, cache, requests, tables, sinks);
}

// One paged_attention call over one request of `rows` query rows at the end of `kv_len` tokens.
inline std::vector<float> attend(const Layer& l, std::span<const std::int64_t> pages,
                                 std::int64_t kv_len, std::int64_t rows, std::span<const float> q,
                                 std::span<const float> sinks, ThreadPool* pool) {
  const std::vector<PagedSequence> batch = {{pages, kv_len, rows}};
  std::vector<float> out(static_cast<std::size_t>(rows * l.spec.params.num_q_heads) *
                         static_cast<std::size_t>(l.spec.head_size_v));
  AttentionInputs inputs{l.cache, batch, q, sinks, {}};
  inputs.pool = pool;
  paged_attention(l.spec, l.geometry, inputs, out);
  return out;
}

// A 17-row verify (two query blocks) at the end of `kv_len` random tokens of `spec`'s layer (K
// and V of `magnitude`): a 5-row verify is within the tolerance of the dense double reference;
// no pool and two workers, shuffled pages, HND pages and one contiguous page give the same bits;
// the last 1, 5 and 16 rows as a verify equal the same rows of the whole (causal), and each row
// alone equals its row of the verify. Failures name `name`.
inline void check_verify_rows(const AttentionSpec& spec, std::int64_t kv_len, float magnitude,
                              std::uint64_t seed, const std::string& name) {
  const std::int64_t hq = spec.params.num_q_heads;
  const std::int64_t pages = (kv_len + 15) / 16;
  Layer paged = make_layer(spec, pages + 2, 16, "verify");
  Layer contiguous = make_layer(spec, 1, pages * 16, "verify");
  Layer hnd = make_layer(spec, pages + 2, 16, "verify", attn::KvLayout::kHND);
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> blocks(static_cast<std::size_t>(pages + 2));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  blocks.resize(static_cast<std::size_t>(pages));
  const std::vector<float> sinks = spec.params.sinks
                                       ? random_values(rng, static_cast<std::size_t>(hq), 1.0f)
                                       : std::vector<float>{};
  const std::int64_t rows = 17;
  const Request r =
      make_request(spec, paged.geometry, {}, paged.cache, blocks, kv_len, rows, rng, magnitude);
  const std::vector<std::int64_t> one_page = {0};
  write_kv(spec, contiguous.geometry, {}, contiguous.cache,
           slot_mapping(contiguous.geometry, one_page, 0, kv_len), r.k, r.v);
  write_kv(spec, hnd.geometry, {}, hnd.cache, slot_mapping(hnd.geometry, blocks, 0, kv_len), r.k,
           r.v);

  const auto q_row = static_cast<std::size_t>(hq * spec.head_size);
  // Accuracy of a 5-row verify (the dense double reference is the slow part).
  Request last5 = r;
  last5.num_queries = 5;
  last5.q.assign(r.q.end() - static_cast<std::ptrdiff_t>(5 * q_row), r.q.end());
  const Comparison cmp = run_and_compare(spec, paged.geometry, {}, paged.cache, {last5}, sinks);
  EXPECT_TRUE(cmp.ok()) << name << ": " << cmp.to_string();

  ThreadPool two(2);
  const auto all = attend(paged, blocks, kv_len, rows, r.q, sinks, nullptr);
  EXPECT_TRUE(same_bits(attend(paged, blocks, kv_len, rows, r.q, sinks, &two), all)) << name;
  EXPECT_TRUE(same_bits(attend(contiguous, one_page, kv_len, rows, r.q, sinks, &two), all))
      << name << ": contiguous";
  EXPECT_TRUE(same_bits(attend(hnd, blocks, kv_len, rows, r.q, sinks, &two), all))
      << name << ": HND";
  const bool causal = spec.params.causal;
  for (std::int64_t n : {1, 5, 16}) {
    const std::int64_t first = rows - n;
    const std::span<const float> qn(r.q.data() + static_cast<std::size_t>(first) * q_row,
                                    static_cast<std::size_t>(n) * q_row);
    const auto block = attend(paged, blocks, kv_len, n, qn, sinks, &two);
    if (causal) {
      EXPECT_TRUE(same_bits(
          block, std::span<const float>(all).subspan(static_cast<std::size_t>(first) * q_row)))
          << name << ": last " << n << " rows";
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t kv = causal ? kv_len - n + i + 1 : kv_len;
      const auto alone = attend(paged, blocks, kv, 1, qn.subspan(i * q_row, q_row), sinks,
                                i % 2 == 0 ? &two : nullptr);
      EXPECT_TRUE(same_bits(alone, std::span<const float>(block).subspan(i * q_row, q_row)))
          << name << ": row " << i << " of " << n;
    }
  }
  for (float x : all) ASSERT_TRUE(std::isfinite(x)) << name;
}

}  // namespace mixkv::kernels::testing
