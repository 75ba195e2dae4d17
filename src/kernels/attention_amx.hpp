// Paged attention's tile products on Intel AMX (AMX-BF16), for bf16 caches whose shapes suit the
// tiles (takes()): q.k^T and p.V of every query row and head of a KV head at once, 16 keys per
// tile. attention_simd.cpp runs the online softmax between the two products; this file (outside
// Highway: raw intrinsics under a function target attribute) holds only the tile work.
//
// Exactness: queries and softmax weights are split into three bf16 terms (hi + mid + lo, the
// split the bf16 weight products use), each meeting the cache's bf16 values, whose products are
// exact in float; every output column of a tile meets only its own query row, so neither the
// number of rows nor which rows share a tile changes its bits (docs/kernels.md, "AMX path").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/attention_simd.hpp"

namespace mixkv::kernels::detail::attn_amx {

// Columns (query row x head) of one group of tiles; more columns take several groups.
constexpr std::int64_t kCols = 16;
// Keys per tile (a kernel page must hold whole tiles).
constexpr std::int64_t kKeys = 16;
// Head elements per q.k tile product (32 bf16 = 16 pairs).
constexpr std::int64_t kStep = 32;
constexpr int kTerms = 3;

// Whether the CPU and OS run AMX tiles and tests have not switched the path off.
bool usable();
std::atomic<bool>& switched_on();

// Whether a call over this layer takes the AMX path: a bf16 cache (not MLA), head sizes that are
// multiples of 32, kernel pages of whole 16-key tiles, and usable(). Never the number of rows,
// requests or threads: a row of a verify must take its decode's path to keep its bits.
bool takes(const AttentionSpec& spec, const PageLayout& page);

// Words of one group's query tiles: per k-step and term an A tile of up to 16 columns x 16 bf16
// pairs.
inline std::int64_t q_words(std::int64_t d) { return d / kStep * kTerms * 16 * kCols; }
// Words of one tile's V in VNNI pairs: per 16 V elements, 8 key pairs x 16 pairs, twice.
inline std::int64_t v_words(std::int64_t dv) { return dv / 16 * 16 * 16; }

// Lays out `cols` <= m query rows of d floats (row c at rows[c]) as a group's A tiles (three
// bf16 terms per element); the other rows are zero.
void prepare_q(const float* const* rows, std::int64_t cols, std::int64_t m, std::int64_t d,
               std::uint32_t* out);

// Loads the tile configuration for groups of m <= 16 columns on this thread; release() frees
// the tile state at the end of a task.
void configure(std::int64_t m);
void release();

// Words of one tile's K^T: per k-step of 32 head elements, 16 pairs x 16 keys.
inline std::int64_t kt_words(std::int64_t d) { return d / kStep * 16 * 16; }

// The 16 K rows at `k` (k_stride bytes apart, d bf16 each) as K^T tiles in VNNI pairs of head
// elements, one per k-step (a 32-bit transpose): made once per tile and KV head, shared by its
// groups.
void transpose_k(const std::byte* k, std::int64_t k_stride, std::int64_t d, std::uint32_t* kt);

// Raw q.k of the 16 keys of `kt` (transpose_k) for a group's m columns (the configured m):
// out[col * 16 + key], m rows.
void scores(const std::uint32_t* q, std::int64_t m, std::int64_t d, const std::uint32_t* kt,
            float* out);

// The 16 V rows at `v` (v_stride bytes apart, dv bf16 each) in VNNI pairs of keys; keys outside
// [a, b] are zero (their bytes are not read: beyond the context they may be anything, NaN too).
void relayout_v(const std::byte* v, std::int64_t v_stride, std::int64_t a, std::int64_t b,
                std::int64_t dv, std::uint32_t* vt);

// acc[col] = fma(acc[col], rescale[col], probs[col] . V) for the `cols` <= m columns of a group
// (m: the configured rows): probs [cols][16] floats, acc rows of dv floats acc_stride floats
// apart.
void pv(const float* probs, const float* rescale, std::int64_t cols, std::int64_t m,
        const std::uint32_t* vt, std::int64_t dv, float* acc, std::int64_t acc_stride);

}  // namespace mixkv::kernels::detail::attn_amx
