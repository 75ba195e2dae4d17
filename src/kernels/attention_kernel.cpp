#include "mixkv/attention_kernel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "kernels/element_load.hpp"
#include "mixkv/error.hpp"
#include "mixkv/kernels_convert.hpp"

namespace mixkv::kernels {
namespace {

// Queries processed together share each K/V tile they read (prefill); the tile bounds the
// float scratch rows converted from the cache at once.
constexpr std::int64_t kQueryBlock = 16;
constexpr std::int64_t kTileTokens = 16;

bool is_fp8(DType dtype) { return dtype == DType::kFp8E4m3 || dtype == DType::kFp8E5m2; }

void check_scales(const AttentionSpec& spec, KvScales scales, const std::string& where) {
  for (float s : {scales.k, scales.v}) {
    if (!(std::isfinite(s) && s > 0)) {
      throw_invalid(fmt::format("{}: KV scale {} is not a positive finite number", where, s));
    }
    if (!is_fp8(spec.params.kv_dtype) && s != 1.0f) {
      throw_invalid(fmt::format(
          "{}: a {} cache takes no KV scale (got {}); per-tensor scales are for fp8 caches", where,
          to_string(spec.params.kv_dtype), s));
    }
  }
}

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

PageLayout page_layout(const AttentionSpec& spec, const layout::LayerGeometry& layer) {
  const std::string where = fmt::format("layer {}", layer.layer);
  validate(spec, where);
  if (layer.recurrent) {
    throw_invalid(fmt::format("{} is recurrent: it has no K/V pages to attend over", where));
  }
  PageLayout p;
  p.dtype = spec.params.kv_dtype;
  p.elem = element_bytes(p.dtype);
  p.kernel_tokens = layer.kernel_tokens;
  p.stride = layer.kernel_page_stride;
  p.offset = layer.offset;
  p.k_token_bytes = layer.k_token_bytes;
  p.v_token_bytes = layer.v_token_bytes;
  p.v_offset = layer.v_offset;
  const std::int64_t k_bytes = k_row_elements(spec) * p.elem;
  const std::int64_t v_bytes = v_row_elements(spec) * p.elem;
  if (p.k_token_bytes != k_bytes || p.v_token_bytes != v_bytes) {
    throw_invalid(fmt::format(
        "{}: its geometry stores {} K and {} V bytes per token, but {} heads of {}/{} {} values "
        "need {} and {}; the geometry was made for another layer or dtype",
        where, p.k_token_bytes, p.v_token_bytes, spec.params.num_kv_heads, spec.head_size,
        spec.head_size_v, to_string(p.dtype), k_bytes, v_bytes));
  }
  if (p.kernel_tokens <= 0 || p.stride <= 0 || p.offset < 0 || p.v_offset < 0) {
    throw_invalid(fmt::format(
        "{}: kernel page of {} tokens, stride {} B, offset {} B, V offset {} B is not a page "
        "geometry",
        where, p.kernel_tokens, p.stride, p.offset, p.v_offset));
  }
  return p;
}

// Throws unless every byte the kernel may touch in `page` lies inside a cache of `size` bytes.
void check_page(const PageLayout& p, std::int64_t page, std::int64_t size, const std::string& who) {
  if (page < 0 || page > (size - p.offset - p.span_bytes()) / p.stride ||
      size < p.offset + p.span_bytes()) {
    throw_invalid(fmt::format(
        "{}: kernel page {} (stride {} B, offset {} B) lies outside the {}-byte cache tensor", who,
        page, p.stride, p.offset, size));
  }
}

inline float dot(const float* a, const float* b, std::int64_t n) {
  // Independent partial sums: the compiler keeps them in vector lanes (two registers' worth, so
  // consecutive multiply-adds do not wait on each other).
  float part[16] = {};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) part[j] += a[i + j] * b[i + j];
  }
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 8; ++j) part[j] += part[j + 8];
  return s + ((part[0] + part[4]) + (part[1] + part[5])) +
         ((part[2] + part[6]) + (part[3] + part[7]));
}

inline void prefetch(const std::byte* bytes, std::int64_t count) {
  for (std::int64_t i = 0; i < count; i += 64) __builtin_prefetch(bytes + i);
}

inline void axpy(float alpha, const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

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

// The inner loops, compiled for the baseline and for AVX2+FMA and AVX-512 machines; the loader
// picks one at start-up (GCC function multiversioning), so one binary runs on any x86-64.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MIXKV_KERNEL_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define MIXKV_KERNEL_CLONES
#endif

MIXKV_KERNEL_CLONES
void attend(const AttentionSpec& spec, const PageLayout& p, const AttentionInputs& inputs,
            std::span<float> out) {
  const attn::AttentionParams& params = spec.params;
  const std::int64_t hq = params.num_q_heads;
  const std::int64_t hkv = params.num_kv_heads;
  const std::int64_t group = hq / hkv;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;
  const float* table = detail::fp8_table(p.dtype);
  const auto scale = static_cast<float>(params.scale);
  const bool capped = params.soft_cap.has_value();
  const float cap = capped ? static_cast<float>(*params.soft_cap) : 1.0f;
  const float inv_cap = 1.0f / cap;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::byte* cache = inputs.cache.data();

  // A tile's K and V rows (all KV heads) are converted at once: the cache is read front to back
  // in whole rows, which the hardware prefetcher follows.
  const std::int64_t k_row = hkv * d;
  const std::int64_t v_row = spec.mla ? 0 : hkv * dv;
  std::vector<float> kbuf(static_cast<std::size_t>(kTileTokens * k_row));
  std::vector<float> vbuf(static_cast<std::size_t>(kTileTokens * v_row));
  std::vector<float> scores(static_cast<std::size_t>(kTileTokens));
  std::vector<float> row_max(static_cast<std::size_t>(kQueryBlock * hq));
  std::vector<float> row_sum(row_max.size());
  std::vector<float> acc(static_cast<std::size_t>(kQueryBlock * hq * dv));

  std::int64_t q_row0 = 0;  // first query row of the current request
  for (const PagedSequence& seq : inputs.batch) {
    const std::int64_t first_pos = seq.kv_len - seq.num_queries;
    for (std::int64_t qb = 0; qb < seq.num_queries; qb += kQueryBlock) {
      const std::int64_t qe = std::min(seq.num_queries, qb + kQueryBlock);
      // Online-softmax state; a sink starts it as one extra logit with a zero value.
      for (std::int64_t i = 0; i < (qe - qb) * hq; ++i) {
        const bool sink = params.sinks;
        row_max[static_cast<std::size_t>(i)] =
            sink ? inputs.sinks[static_cast<std::size_t>(i % hq)] : neg_inf;
        row_sum[static_cast<std::size_t>(i)] = sink ? 1.0f : 0.0f;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      // Ranges move right with the position, so the block's keys are [lo of first, hi of last].
      const std::int64_t lo_all = key_range(params, first_pos + qb, seq.kv_len).lo;
      const std::int64_t hi_all = key_range(params, first_pos + qe - 1, seq.kv_len).hi;
      for (std::int64_t t0 = lo_all; t0 <= hi_all;) {
        const std::int64_t in_page = t0 % p.kernel_tokens;
        const std::int64_t tile =
            std::min({kTileTokens, p.kernel_tokens - in_page, hi_all + 1 - t0});
        const std::int64_t page = seq.kernel_pages[static_cast<std::size_t>(t0 / p.kernel_tokens)];
        const std::byte* base = cache + p.offset + page * p.stride;
        const std::byte* k_src = base + in_page * p.k_token_bytes;
        const std::byte* v_src = base + p.v_offset + in_page * p.v_token_bytes;
        if (t0 + tile <= hi_all) {
          // The next tile may sit on another page anywhere in the tensor: ask for it now, so its
          // bytes arrive while this one is computed.
          const std::int64_t next = t0 + tile;
          const std::byte* next_base =
              cache + p.offset +
              seq.kernel_pages[static_cast<std::size_t>(next / p.kernel_tokens)] * p.stride;
          const std::int64_t next_in = next % p.kernel_tokens;
          const std::int64_t next_tile =
              std::min({kTileTokens, p.kernel_tokens - next_in, hi_all + 1 - next});
          prefetch(next_base + next_in * p.k_token_bytes, next_tile * p.k_token_bytes);
          prefetch(next_base + p.v_offset + next_in * p.v_token_bytes, next_tile * p.v_token_bytes);
        }
        detail::load_row(p.dtype, table, k_src, static_cast<std::size_t>(tile * k_row),
                         inputs.scales.k, kbuf.data());
        detail::load_row(p.dtype, table, v_src, static_cast<std::size_t>(tile * v_row),
                         inputs.scales.v, vbuf.data());
        for (std::int64_t hk = 0; hk < hkv; ++hk) {
          const float* k_rows = kbuf.data() + hk * d;
          // MLA: the value is the latent's first dv elements.
          const float* v_rows = spec.mla ? kbuf.data() : vbuf.data() + hk * dv;
          const std::int64_t v_stride = spec.mla ? k_row : v_row;
          for (std::int64_t i = qb; i < qe; ++i) {
            const KeyRange range = key_range(params, first_pos + i, seq.kv_len);
            const std::int64_t a = std::max(range.lo, t0) - t0;
            const std::int64_t b = std::min(range.hi, t0 + tile - 1) - t0;
            if (a > b) continue;
            for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
              const float* q = inputs.queries.data() + ((q_row0 + i) * hq + h) * d;
              const std::size_t state = static_cast<std::size_t>((i - qb) * hq + h);
              float* o = acc.data() + static_cast<std::int64_t>(state) * dv;
              float tile_max = neg_inf;
              for (std::int64_t t = a; t <= b; ++t) {
                float s = scale * dot(q, k_rows + t * k_row, d);
                if (capped) s = cap * std::tanh(s * inv_cap);
                scores[static_cast<std::size_t>(t)] = s;
                tile_max = std::max(tile_max, s);
              }
              float& m = row_max[state];
              float& l = row_sum[state];
              if (tile_max > m) {
                const float c = std::exp(m - tile_max);
                l *= c;
                for (std::int64_t e = 0; e < dv; ++e) o[e] *= c;
                m = tile_max;
              }
              for (std::int64_t t = a; t <= b; ++t) {
                const float w = std::exp(scores[static_cast<std::size_t>(t)] - m);
                l += w;
                axpy(w, v_rows + t * v_stride, o, dv);
              }
            }
          }
        }
        t0 += tile;
      }
      for (std::int64_t i = qb; i < qe; ++i) {
        for (std::int64_t h = 0; h < hq; ++h) {
          const std::size_t state = static_cast<std::size_t>((i - qb) * hq + h);
          const float inv = 1.0f / row_sum[state];
          const float* o = acc.data() + static_cast<std::int64_t>(state) * dv;
          float* dst = out.data() + ((q_row0 + i) * hq + h) * dv;
          for (std::int64_t e = 0; e < dv; ++e) dst[e] = o[e] * inv;
        }
      }
    }
    q_row0 += seq.num_queries;
  }
}

}  // namespace

void validate(const AttentionSpec& spec, const std::string& where) {
  const auto& p = spec.params;
  check_cache_dtype(p.kv_dtype, where);
  if (p.num_q_heads <= 0 || p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) {
    throw_invalid(fmt::format("{}: {} query heads cannot share {} KV heads evenly", where,
                              p.num_q_heads, p.num_kv_heads));
  }
  if (spec.head_size <= 0 || spec.head_size_v <= 0) {
    throw_invalid(fmt::format("{}: head sizes {} (K) and {} (V) must be positive", where,
                              spec.head_size, spec.head_size_v));
  }
  if (spec.mla && (p.num_kv_heads != 1 || spec.head_size_v > spec.head_size)) {
    throw_invalid(fmt::format(
        "{}: an MLA layer caches one latent (1 KV head, got {}) whose first head_size_v ({}) "
        "elements are the value, so head_size_v may not exceed head_size ({})",
        where, p.num_kv_heads, spec.head_size_v, spec.head_size));
  }
  if (!(std::isfinite(p.scale)) || (p.soft_cap && !(*p.soft_cap > 0))) {
    throw_invalid(fmt::format("{}: scale {} and soft cap {} must be finite, the cap positive",
                              where, p.scale, p.soft_cap ? *p.soft_cap : 0.0));
  }
}

AttentionSpec attention_spec(const attn::AttentionParams& params, const model::LayerDesc& layer) {
  const std::string where = fmt::format("layer {}", layer.name);
  if (model::is_recurrent(layer.kind)) {
    throw_invalid(fmt::format("{} is a {} layer: it has no attention kernel", where,
                              model::to_string(layer.kind)));
  }
  if (layer.kind == model::LayerKind::kChunked) {
    throw_unsupported(
        fmt::format("{}: chunked-local attention is not served by the CPU kernels yet", where));
  }
  AttentionSpec spec;
  spec.params = params;
  spec.params.num_q_heads = layer.num_q_heads;
  spec.params.num_kv_heads = layer.num_kv_heads;
  spec.head_size = layer.head_size;
  spec.head_size_v = layer.head_size_v;
  spec.mla = layer.kind == model::LayerKind::kMla;
  validate(spec, where);
  return spec;
}

std::int64_t k_row_elements(const AttentionSpec& spec) {
  return std::int64_t{spec.params.num_kv_heads} * spec.head_size;
}
std::int64_t v_row_elements(const AttentionSpec& spec) {
  return spec.mla ? 0 : std::int64_t{spec.params.num_kv_heads} * spec.head_size_v;
}

std::vector<std::int64_t> slot_mapping(const layout::LayerGeometry& layer,
                                       std::span<const std::int64_t> blocks, std::int64_t first,
                                       std::int64_t count) {
  std::vector<std::int64_t> slots;
  slots.reserve(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  for (std::int64_t i = 0; i < count; ++i)
    slots.push_back(layout::locate_token(layer, blocks, first + i).slot);
  return slots;
}

void write_kv(const AttentionSpec& spec, const layout::LayerGeometry& layer, KvScales scales,
              std::span<std::byte> cache, std::span<const std::int64_t> slots,
              std::span<const float> k, std::span<const float> v) {
  const PageLayout p = page_layout(spec, layer);
  const std::string who = fmt::format("write_kv, layer {}", layer.layer);
  check_scales(spec, scales, who);
  const auto k_row = static_cast<std::size_t>(k_row_elements(spec));
  const auto v_row = static_cast<std::size_t>(v_row_elements(spec));
  if (k.size() != slots.size() * k_row || v.size() != slots.size() * v_row) {
    throw_invalid(fmt::format("{}: {} slots need {} K and {} V values, got {} and {}", who,
                              slots.size(), slots.size() * k_row, slots.size() * v_row, k.size(),
                              v.size()));
  }
  const auto size = static_cast<std::int64_t>(cache.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::int64_t slot = slots[i];
    if (slot < 0) throw_invalid(fmt::format("{}: slot {} is negative", who, slot));
    const std::int64_t page = slot / p.kernel_tokens;
    check_page(p, page, size, who);
    const std::int64_t in_page = slot % p.kernel_tokens;
    const std::int64_t base = p.offset + page * p.stride;
    const auto k_at = static_cast<std::size_t>(base + in_page * p.k_token_bytes);
    encode_row(p.dtype, k.subspan(i * k_row, k_row), scales.k,
               cache.subspan(k_at, static_cast<std::size_t>(p.k_token_bytes)));
    if (v_row > 0) {
      const auto v_at = static_cast<std::size_t>(base + p.v_offset + in_page * p.v_token_bytes);
      encode_row(p.dtype, v.subspan(i * v_row, v_row), scales.v,
                 cache.subspan(v_at, static_cast<std::size_t>(p.v_token_bytes)));
    }
  }
}

void paged_attention(const AttentionSpec& spec, const layout::LayerGeometry& layer,
                     const AttentionInputs& inputs, std::span<float> out) {
  const PageLayout p = page_layout(spec, layer);
  const std::string who = fmt::format("paged_attention, layer {}", layer.layer);
  check_scales(spec, inputs.scales, who);
  const attn::AttentionParams& params = spec.params;
  const std::int64_t hq = params.num_q_heads;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;

  // Shapes and bounds first, so the loops below need no checks.
  std::int64_t total_queries = 0;
  const auto size = static_cast<std::int64_t>(inputs.cache.size());
  for (std::size_t r = 0; r < inputs.batch.size(); ++r) {
    const PagedSequence& s = inputs.batch[r];
    if (s.num_queries < 1 || s.num_queries > s.kv_len) {
      throw_invalid(fmt::format("{}: request {} has {} queries over {} cached tokens", who, r,
                                s.num_queries, s.kv_len));
    }
    const std::int64_t pages_needed = (s.kv_len + p.kernel_tokens - 1) / p.kernel_tokens;
    if (pages_needed > static_cast<std::int64_t>(s.kernel_pages.size())) {
      throw_invalid(fmt::format("{}: request {} has {} tokens but {} kernel pages of {}", who, r,
                                s.kv_len, s.kernel_pages.size(), p.kernel_tokens));
    }
    const std::int64_t lo = key_range(params, s.kv_len - s.num_queries, s.kv_len).lo;
    for (std::int64_t i = lo / p.kernel_tokens; i < pages_needed; ++i)
      check_page(p, s.kernel_pages[static_cast<std::size_t>(i)], size, who);
    total_queries += s.num_queries;
  }
  if (inputs.queries.size() != static_cast<std::size_t>(total_queries * hq * d) ||
      out.size() != static_cast<std::size_t>(total_queries * hq * dv)) {
    throw_invalid(
        fmt::format("{}: {} queries of {} heads need {} query values and {} outputs, got {} and {}",
                    who, total_queries, hq, total_queries * hq * d, total_queries * hq * dv,
                    inputs.queries.size(), out.size()));
  }
  const std::size_t sinks_expected = params.sinks ? static_cast<std::size_t>(hq) : 0;
  if (inputs.sinks.size() != sinks_expected) {
    throw_invalid(
        fmt::format("{}: {} sink logits given, the layer takes {} (one per query head "
                    "with learned sinks, else none)",
                    who, inputs.sinks.size(), sinks_expected));
  }

  attend(spec, p, inputs, out);
}

}  // namespace mixkv::kernels
