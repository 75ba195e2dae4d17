#include "mixkv/kernels/attention_kernel.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "kernels/attention_amx.hpp"
#include "kernels/attention_simd.hpp"
#include "kernels/bf16_pairs.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/convert.hpp"

namespace mixkv::kernels {
namespace {

using detail::key_range;
using detail::KeyRange;
using detail::PageLayout;

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
    // The kernel multiplies the scale by 2^8 once (e4m3 is read as value / 256, simd_decode-inl.h):
    // bounded far below where that could overflow (an fp8 scale is about amax / 448).
    if (s > 0x1p64f) {
      throw_invalid(fmt::format(
          "{}: KV scale {} is above 2^64; fp8 scales are about the tensor's max |value| / 448",
          where, s));
    }
  }
}

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
  p.v_offset = layer.v_offset;
  const std::int64_t k_bytes = k_row_elements(spec) * p.elem;
  const std::int64_t v_bytes = v_row_elements(spec) * p.elem;
  if (layer.k_token_bytes != k_bytes || layer.v_token_bytes != v_bytes) {
    throw_invalid(fmt::format(
        "{}: its geometry stores {} K and {} V bytes per token, but {} heads of {}/{} {} values "
        "need {} and {}; the geometry was made for another layer or dtype",
        where, layer.k_token_bytes, layer.v_token_bytes, spec.params.num_kv_heads, spec.head_size,
        spec.head_size_v, to_string(p.dtype), k_bytes, v_bytes));
  }
  if (p.kernel_tokens <= 0 || p.stride <= 0 || p.offset < 0 || p.v_offset < 0) {
    throw_invalid(fmt::format(
        "{}: kernel page of {} tokens, stride {} B, offset {} B, V offset {} B is not a page "
        "geometry",
        where, p.kernel_tokens, p.stride, p.offset, p.v_offset));
  }
  // The geometry's strides (NHD: a token's rows side by side; HND: a head's), from its own head
  // count, which must be the spec's (MLA's latent is one head).
  const std::int64_t heads = spec.mla ? 1 : spec.params.num_kv_heads;
  if (layer.num_kv_heads != heads) {
    throw_invalid(fmt::format(
        "{}: its geometry splits a token into {} KV heads, but the layer has {}; the geometry "
        "was made for another layer",
        where, layer.num_kv_heads, heads));
  }
  p.k_row_stride = layer.k_row_stride();
  p.v_row_stride = layer.v_row_stride();
  p.k_head_stride = layer.k_head_stride();
  p.v_head_stride = layer.v_head_stride();
  p.span_bytes = std::max(p.kernel_tokens * k_bytes, p.v_offset + p.kernel_tokens * v_bytes);
  return p;
}

// Throws unless every byte the kernel may touch in `page` lies inside a cache of `size` bytes.
void check_page(const PageLayout& p, std::int64_t page, std::int64_t size, const std::string& who) {
  if (page < 0 || page > (size - p.offset - p.span_bytes) / p.stride ||
      size < p.offset + p.span_bytes) {
    throw_invalid(fmt::format(
        "{}: kernel page {} (stride {} B, offset {} B) lies outside the {}-byte cache tensor", who,
        page, p.stride, p.offset, size));
  }
}

// The tasks of one call and the split blocks their partials go to.
struct TaskPlan {
  std::vector<detail::AttendTask> tasks;
  std::vector<detail::SplitBlock> splits;
  std::vector<float> partials;
};

// Splits the batch into tasks: each request's queries in blocks of kQueryBlock (fixed by the
// request alone) and, when a pool has several workers and the batch is small, a block's context
// chunks into pieces (whole rows of K/V read front to back, the order the hardware prefetcher
// follows), then its query heads into ranges (whole KV heads where possible, so each K/V row is
// still read once), so that even one decode request keeps every worker busy. None of it changes
// a bit: the chunks and the order their partials are folded in are fixed (attention_simd.hpp).
TaskPlan make_tasks(const AttentionSpec& spec, std::span<const PagedSequence> batch, int workers) {
  const attn::AttentionParams& params = spec.params;
  const std::int64_t hq = params.num_q_heads;
  const std::int64_t hkv = params.num_kv_heads;
  std::int64_t blocks = 0;
  for (const PagedSequence& seq : batch)
    blocks += (seq.num_queries + detail::kQueryBlock - 1) / detail::kQueryBlock;
  // Several tasks per worker let the dynamic hand-out even out requests of different lengths
  // and workers that other processes slow down; context pieces are cheap (one partial per
  // chunk), head ranges shorten each task's slice of a row, so they come second.
  const std::int64_t wanted_ctx = workers > 1 ? 4 * std::int64_t{workers} : 1;
  const std::int64_t wanted = workers > 1 ? 2 * std::int64_t{workers} : 1;
  const std::int64_t pf = detail::partial_floats(spec.head_size_v);
  TaskPlan plan;
  std::vector<std::size_t> split_of;  // per task: index into plan.splits + 1, or 0
  std::int64_t row0 = 0;
  for (const PagedSequence& seq : batch) {
    const std::int64_t first_pos = seq.kv_len - seq.num_queries;
    for (std::int64_t q = 0; q < seq.num_queries; q += detail::kQueryBlock) {
      const std::int64_t qe = std::min(seq.num_queries, q + detail::kQueryBlock);
      const std::int64_t c0 =
          key_range(params, first_pos + q, seq.kv_len).lo / detail::kSplitTokens;
      const std::int64_t c1 =
          key_range(params, first_pos + qe - 1, seq.kv_len).hi / detail::kSplitTokens + 1;
      const std::int64_t pieces = std::min(c1 - c0, (wanted_ctx + blocks - 1) / blocks);
      const std::int64_t head_chunks =
          std::clamp<std::int64_t>(((wanted + blocks - 1) / blocks + pieces - 1) / pieces, 1, hq);
      const std::int64_t heads_per_task = head_chunks <= hkv
                                              ? (hkv + head_chunks - 1) / head_chunks * (hq / hkv)
                                              : (hq + head_chunks - 1) / head_chunks;
      // Few heads over one chunk (a verify's k + 1 rows over a short context: 3 KV heads on 2
      // workers) leave a worker idle for a third of the call: split the block's rows too.
      const std::int64_t tasks = pieces * ((hq + heads_per_task - 1) / heads_per_task);
      const std::int64_t row_parts =
          std::clamp<std::int64_t>(((wanted + blocks - 1) / blocks + tasks - 1) / tasks, 1, qe - q);
      std::size_t split = 0;
      if (pieces > 1) {
        detail::SplitBlock b;
        b.seq = &seq;
        b.row0 = row0;
        b.q_begin = q;
        b.q_end = qe;
        b.chunk_first = c0;
        b.chunks = c1 - c0;
        plan.splits.push_back(b);
        split = plan.splits.size();
      }
      for (std::int64_t piece = 0; piece < pieces; ++piece) {
        for (std::int64_t part = 0; part < row_parts; ++part) {
          for (std::int64_t h = 0; h < hq; h += heads_per_task) {
            detail::AttendTask t;
            t.seq = &seq;
            t.row0 = row0;
            t.q_begin = q + (qe - q) * part / row_parts;
            t.q_end = q + (qe - q) * (part + 1) / row_parts;
            t.h_begin = h;
            t.h_end = std::min(hq, h + heads_per_task);
            t.chunk_begin = c0 + (c1 - c0) * piece / pieces;
            t.chunk_end = c0 + (c1 - c0) * (piece + 1) / pieces;
            plan.tasks.push_back(t);
            split_of.push_back(split);
          }
        }
      }
    }
    row0 += seq.num_queries;
  }
  std::int64_t floats = 0;
  for (const detail::SplitBlock& b : plan.splits)
    floats += b.chunks * (b.q_end - b.q_begin) * hq * pf;
  plan.partials.resize(static_cast<std::size_t>(floats));
  std::int64_t at = 0;
  for (detail::SplitBlock& b : plan.splits) {
    b.partials = plan.partials.data() + at;
    at += b.chunks * (b.q_end - b.q_begin) * hq * pf;
  }
  for (std::size_t i = 0; i < plan.tasks.size(); ++i) {
    if (split_of[i] != 0) plan.tasks[i].split = &plan.splits[split_of[i] - 1];
  }
  return plan;
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
  if (spec.order == AttentionOrder::kBf16Pairs &&
      ((p.kv_dtype != DType::kBfloat16 && p.kv_dtype != DType::kFp8E4m3) || spec.mla ||
       spec.head_size % 32 != 0 || spec.head_size_v % 32 != 0 || spec.head_size > 512 ||
       spec.head_size_v > 512)) {
    throw_invalid(fmt::format(
        "{}: the bf16-pairs attention order needs a bfloat16 or fp8_e4m3 cache (got {}), no MLA "
        "(got {}) and head sizes that are multiples of 32 up to 512 (got {} and {}); use the "
        "float order for this layer, or a bfloat16 or fp8_e4m3 cache",
        where, to_string(p.kv_dtype), spec.mla ? "MLA" : "none", spec.head_size, spec.head_size_v));
  }
}

std::string_view to_string(AttentionOrder order) {
  return order == AttentionOrder::kBf16Pairs ? "bf16-pairs" : "float";
}

AttentionOrder parse_attention_order(std::string_view text, const std::string& where) {
  if (text == "float") return AttentionOrder::kFloat;
  if (text == "bf16-pairs") return AttentionOrder::kBf16Pairs;
  throw_invalid(fmt::format("{}: unknown attention order '{}' (float or bf16-pairs)", where, text));
}

AttentionSpec attention_spec(const attn::AttentionParams& params, const model::LayerDesc& layer,
                             AttentionOrder order) {
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
  spec.order = order;
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
  // A token is written in pieces of whole heads that lie side by side: all of them at once in
  // NHD, one at a time in HND.
  const auto heads = static_cast<std::size_t>(spec.mla ? 1 : spec.params.num_kv_heads);
  const bool adjacent =
      p.k_head_stride * static_cast<std::int64_t>(heads) == p.k_row_stride || heads == 1;
  const std::size_t pieces = adjacent ? 1 : heads;
  const std::size_t k_piece = k_row / pieces;
  const std::size_t v_piece = v_row / pieces;
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
    for (std::size_t h = 0; h < pieces; ++h) {
      const auto k_at = static_cast<std::size_t>(base + in_page * p.k_row_stride +
                                                 static_cast<std::int64_t>(h) * p.k_head_stride);
      encode_row(p.dtype, k.subspan(i * k_row + h * k_piece, k_piece), scales.k,
                 cache.subspan(k_at, k_piece * static_cast<std::size_t>(p.elem)));
      if (v_row > 0) {
        const auto v_at = static_cast<std::size_t>(base + p.v_offset + in_page * p.v_row_stride +
                                                   static_cast<std::int64_t>(h) * p.v_head_stride);
        encode_row(p.dtype, v.subspan(i * v_row + h * v_piece, v_piece), scales.v,
                   cache.subspan(v_at, v_piece * static_cast<std::size_t>(p.elem)));
      }
    }
  }
}

std::string simd_target() { return detail::attend_target(); }

bool attention_uses_amx(const AttentionSpec& spec, const layout::LayerGeometry& layer) {
  return detail::attn_amx::takes(spec, page_layout(spec, layer));
}

void set_attention_amx(bool on) {
  detail::attn_amx::switched_on().store(on, std::memory_order_relaxed);
}

namespace {
std::atomic<bool>& bf16_dots_switched_on() {
  static std::atomic<bool> on{true};
  return on;
}
}  // namespace

bool attention_uses_bf16_dots() {
  return detail::avx512_bf16_cpu() && detail::attend_has_bf16_dots() &&
         bf16_dots_switched_on().load(std::memory_order_relaxed);
}

void set_attention_bf16_dots(bool on) {
  bf16_dots_switched_on().store(on, std::memory_order_relaxed);
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

  detail::AttendCall call;
  call.spec = &spec;
  call.page = p;
  call.cache = inputs.cache.data();
  call.queries = inputs.queries.data();
  call.sinks = inputs.sinks.data();
  call.scales = inputs.scales;
  call.out = out.data();
  call.amx = detail::attn_amx::takes(spec, p);
  call.bf16_dots = spec.order == AttentionOrder::kBf16Pairs && attention_uses_bf16_dots();
  const int workers = inputs.pool != nullptr ? inputs.pool->size() : 1;
  const TaskPlan plan = make_tasks(spec, inputs.batch, workers);
  std::vector<detail::AttendScratch> scratch(static_cast<std::size_t>(workers));
  const auto run = [&](std::int64_t i, int worker) {
    detail::attend_task(call, plan.tasks[static_cast<std::size_t>(i)],
                        scratch[static_cast<std::size_t>(worker)]);
  };
  // Split blocks fold their chunks' partials once every piece is done, a KV head's query heads
  // per task.
  const std::int64_t group = hq / params.num_kv_heads;
  const std::int64_t reduce_heads = std::max<std::int64_t>(group, 1);
  const std::int64_t per_split = (hq + reduce_heads - 1) / reduce_heads;
  const auto reduce = [&](std::int64_t i, int) {
    const detail::SplitBlock& b = plan.splits[static_cast<std::size_t>(i / per_split)];
    const std::int64_t h = i % per_split * reduce_heads;
    detail::reduce_partials(call, b, h, std::min(hq, h + reduce_heads));
  };
  const auto reductions = static_cast<std::int64_t>(plan.splits.size()) * per_split;
  if (inputs.pool != nullptr) {
    inputs.pool->parallel_for(static_cast<std::int64_t>(plan.tasks.size()), run);
    if (reductions > 0) inputs.pool->parallel_for(reductions, reduce);
  } else {
    for (std::size_t i = 0; i < plan.tasks.size(); ++i) run(static_cast<std::int64_t>(i), 0);
    for (std::int64_t i = 0; i < reductions; ++i) reduce(i, 0);
  }
}

}  // namespace mixkv::kernels
