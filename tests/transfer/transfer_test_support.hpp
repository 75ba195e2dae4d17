// Shared by the transfer tests: one instance's side of a transfer (model, plan, geometry,
// descriptor and its KV tensors in host memory) and a byte pattern that says, for every byte of
// a request's KV, which layer, head, token and byte it is, so a decode side can be checked
// against its own geometry without trusting the transfer plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"
#include "mixkv/transfer/layout_descriptor.hpp"
#include "mixkv/transfer/transfer_plan.hpp"

namespace mixkv::transfer::testing {

struct SideOptions {
  std::string model = "tiny-hybrid";
  std::optional<std::string> draft;
  int tp = 1;
  int tp_rank = 0;
  plan::Policy policy = plan::Policy::kMixkv;
  std::optional<std::int64_t> block_size;
  std::int64_t memory = std::int64_t{8} << 20;
  std::int64_t max_model_len = 4096;
  std::optional<DType> kv_dtype;
  backend::Backend backend = backend::Backend::kCpu;
  // A config.json text to describe instead of the tiny model's own (no drafter), named `model`.
  std::string config;
};

// Options for a side serving `model` (and `draft`), the rest as SideOptions has them.
inline SideOptions side(std::string model, std::optional<std::string> draft = {}) {
  SideOptions o;
  o.model = std::move(model);
  o.draft = std::move(draft);
  return o;
}

inline model::ModelDesc describe_tiny(const SideOptions& o, int tp) {
  const engine::TinyModel* m = engine::find_tiny_model(o.model);
  model::DescribeOptions d;
  d.tp = tp;
  d.kv_dtype = o.kv_dtype;
  if (!o.config.empty()) {
    return model::describe(model::parse_model_source(o.model, "test config", o.config), {}, d);
  }
  if (!m) {  // a built-in model
    std::optional<std::string_view> draft;
    if (o.draft) draft = *o.draft;
    return model::describe_refs(o.model, draft, d);
  }
  std::optional<model::ModelSource> draft;
  if (o.draft) {
    if (*o.draft == model::kMtpDraft) return model::describe_mtp(engine::tiny_model_source(*m), d);
    draft = engine::tiny_model_source(*engine::find_tiny_model(*o.draft));
  }
  return model::describe(engine::tiny_model_source(*m), draft, d);
}

struct Side {
  model::ModelDesc desc;
  plan::CachePlan plan;
  layout::Geometry geometry;
  LayoutDescriptor descriptor;
  std::vector<std::vector<std::byte>> storage;
  TensorSpans tensors() {
    TensorSpans out;
    for (auto& s : storage) out.emplace_back(s.data(), s.size());
    return out;
  }
};

inline Side make_side(const SideOptions& o) {
  Side s;
  s.desc = describe_tiny(o, o.tp);
  const model::ModelDesc unsharded = describe_tiny(o, 1);
  plan::PlanOptions p;
  p.policy = o.policy;
  p.backend = o.backend;
  p.memory_bytes = o.memory;
  p.block_size = o.block_size;
  p.max_model_len = o.max_model_len;
  p.request_len = 1024;
  s.plan = plan::make_plan(s.desc, p);
  const auto groups = attn::build_attention_groups(s.desc, s.plan);
  s.geometry = layout::make_geometry(s.desc, s.plan, groups);
  DescriptorOptions d;
  d.tp_rank = o.tp_rank;
  d.unsharded = &unsharded;
  s.descriptor = make_descriptor(s.desc, s.plan, s.geometry, d);
  for (const auto& t : s.geometry.tensors) {
    s.storage.emplace_back(static_cast<std::size_t>(t.bytes), std::byte{0xEE});
  }
  return s;
}

// Blocks for a request of `tokens` tokens: per group distinct ids, taken from `next` on (so two
// requests do not overlap), in a shuffled order so runs cross non-adjacent blocks.
inline RequestBlocks make_blocks(const Side& s, std::int64_t tokens, std::int64_t next = 1) {
  RequestBlocks b;
  for (const auto& g : s.plan.groups) {
    std::vector<std::int64_t> ids;
    const std::int64_t n =
        g.behaviour == plan::Behaviour::kRecurrent ? 1 : (tokens + g.block_size - 1) / g.block_size;
    for (std::int64_t i = 0; i < n; ++i)
      ids.push_back(next + (i * 7) % std::max<std::int64_t>(n, 1));
    // Distinct only when 7 and n are coprime; fall back to in order.
    std::vector<std::int64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = next + i;
    }
    next += n;
    b.groups.push_back(std::move(ids));
  }
  return b;
}

// The pattern byte for (layer, global head, token, byte in the head, K or V / state byte).
inline std::byte pattern(std::uint64_t seed, std::size_t layer, std::int64_t head,
                         std::int64_t token, std::int64_t byte, int part) {
  std::uint64_t x = seed ^ (layer * 0x9E3779B97F4A7C15ull) ^
                    (static_cast<std::uint64_t>(head) * 0xC2B2AE3D27D4EB4Full) ^
                    (static_cast<std::uint64_t>(token) * 0x165667B19E3779F9ull) ^
                    (static_cast<std::uint64_t>(byte) * 0x27D4EB2F165667C5ull) ^
                    (static_cast<std::uint64_t>(part) << 61);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  // Never the untouched fill 0xEE, so touched() counts every written byte.
  return static_cast<std::byte>((x & 0xff) == 0xEE ? 0x11 : (x & 0xff));
}

// Visits every byte of a recurrent layer's state at `base`: f(offset, state tensor, index of its
// element in the whole model's tensor, byte in the element). The whole model's index comes from
// the descriptor's split (segments of the split dimension, rank r holding the r-th share of each,
// or all of a replicated one), so ranks of different TP sizes agree on it.
template <typename F>
void for_each_state_byte(const LayoutDescriptor& d, const LayerLayout& l, std::int64_t base,
                         F&& f) {
  std::int64_t off = base;
  for (std::size_t i = 0; i < l.state.size(); ++i) {
    const StateTensorLayout& t = l.state[i];
    const std::int64_t elements = element_count(t);
    const std::int64_t elem = state_tensor_bytes(t) / elements;
    const std::vector<std::int64_t> whole = whole_shape(t, d.tp_size);
    for (std::int64_t e = 0; e < elements; ++e) {
      // The element's coordinates, last dimension fastest, mapped to the whole tensor's.
      std::int64_t rest = e;
      std::int64_t index = 0;
      std::int64_t scale = 1;
      for (std::size_t k = t.shape.size(); k-- > 0;) {
        std::int64_t c = rest % t.shape[k];
        rest /= t.shape[k];
        if (static_cast<int>(k) == t.split_dim) {
          std::int64_t local = 0;
          std::int64_t global = 0;
          for (const StateSegment& s : t.segments) {
            if (c < local + s.size) {
              c = global + (s.replicated ? 0 : d.tp_rank * s.size) + (c - local);
              break;
            }
            local += s.size;
            global += s.replicated ? s.size : s.size * d.tp_size;
          }
        }
        index += c * scale;
        scale *= whole[k];
      }
      for (std::int64_t b = 0; b < elem; ++b) f(off + e * elem + b, i, index, b);
    }
    off += elements * elem;
  }
}

// Visits every byte the request's KV of tokens [first, end) occupies on `s` through its own
// geometry (layout::locate_token), for the heads the side holds: f(offset_in_tensor, tensor,
// expected byte). Recurrent layers: their live state.
template <typename F>
void for_each_kv_byte(const Side& s, const RequestBlocks& blocks, std::int64_t first,
                      std::int64_t end, std::uint64_t seed, F&& f, bool whole_prompt = false) {
  for (std::size_t li = 0; li < s.geometry.layers.size(); ++li) {
    const layout::LayerGeometry& g = s.geometry.layers[li];
    const LayerLayout& l = s.descriptor.layers[li];
    const auto& ids = blocks.groups.at(static_cast<std::size_t>(g.kv_cache_group));
    if (g.recurrent) {
      for_each_state_byte(
          s.descriptor, l, g.offset + ids.at(0) * g.kernel_page_stride,
          [&](std::int64_t off, std::size_t tensor, std::int64_t index, std::int64_t byte) {
            f(g.tensor, off,
              pattern(seed, li, 1000 + static_cast<std::int64_t>(tensor), index, byte, 2));
          });
      continue;
    }
    std::int64_t from = first;
    if (l.window && !whole_prompt) from = std::max(from, end + 1 - *l.window);
    if (l.chunk && !whole_prompt) from = std::max(from, end / *l.chunk * *l.chunk);
    const std::int64_t kh = g.k_token_bytes / l.num_kv_heads;
    const std::int64_t vh = g.v_token_bytes / l.num_kv_heads;
    // Head h's piece: beside head h - 1's (NHD) or kernel_tokens pieces after it (HND).
    const std::int64_t k_stride = g.hnd() ? g.kernel_tokens * kh : kh;
    const std::int64_t v_stride = g.hnd() ? g.kernel_tokens * vh : vh;
    for (std::int64_t t = from; t < end; ++t) {
      const layout::TokenLocation loc = layout::locate_token(g, ids, t);
      for (int h = 0; h < l.num_kv_heads; ++h) {
        const std::int64_t head = l.kv_head_begin + h;
        for (std::int64_t i = 0; i < kh; ++i)
          f(g.tensor, loc.k_offset + h * k_stride + i, pattern(seed, li, head, t, i, 0));
        for (std::int64_t i = 0; i < vh; ++i)
          f(g.tensor, loc.v_offset + h * v_stride + i, pattern(seed, li, head, t, i, 1));
      }
    }
  }
}

// The prefill side after computing `end` tokens: every token's KV, windows ignored.
inline void fill(Side& s, const RequestBlocks& blocks, std::int64_t end, std::uint64_t seed) {
  for_each_kv_byte(
      s, blocks, 0, end, seed,
      [&](int t, std::int64_t off, std::byte v) {
        s.storage[static_cast<std::size_t>(t)][static_cast<std::size_t>(off)] = v;
      },
      true);
}

// Bytes of the side's KV for tokens [first, end) that differ from the pattern.
inline std::int64_t mismatches(const Side& s, const RequestBlocks& blocks, std::int64_t first,
                               std::int64_t end, std::uint64_t seed) {
  std::int64_t bad = 0;
  for_each_kv_byte(s, blocks, first, end, seed, [&](int t, std::int64_t off, std::byte v) {
    if (s.storage[static_cast<std::size_t>(t)][static_cast<std::size_t>(off)] != v) ++bad;
  });
  return bad;
}

// Bytes of the side's tensors that are no longer the initial 0xEE fill (what a transfer wrote).
inline std::int64_t touched(const Side& s) {
  std::int64_t n = 0;
  for (const auto& t : s.storage)
    n += std::count_if(t.begin(), t.end(), [](std::byte b) { return b != std::byte{0xEE}; });
  return n;
}

inline std::int64_t expected_bytes(const Side& s, const RequestBlocks& blocks, std::int64_t first,
                                   std::int64_t end) {
  std::int64_t n = 0;
  for_each_kv_byte(s, blocks, first, end, 0, [&](int, std::int64_t, std::byte) { ++n; });
  return n;
}

// The first of `plan`'s runs that does not lie inside both sides' tensors (as their descriptors
// give their sizes), described; empty when all do. Checked here, apart from plan_pull's own check,
// so that a fuzz input the plan lets through is judged by code the plan does not share.
inline std::string run_outside_tensors(const PullPlan& plan, const LayoutDescriptor& prefill,
                                       const LayoutDescriptor& decode) {
  const auto inside = [](const std::vector<std::int64_t>& sizes, int tensor, std::int64_t offset,
                         std::int64_t length) {
    return tensor >= 0 && static_cast<std::size_t>(tensor) < sizes.size() && offset >= 0 &&
           length >= 0 && offset <= sizes[static_cast<std::size_t>(tensor)] - length;
  };
  for (const CopyRun& r : plan.runs) {
    if (!inside(prefill.tensor_bytes, r.src_tensor, r.src_offset, r.length) ||
        !inside(decode.tensor_bytes, r.dst_tensor, r.dst_offset, r.length)) {
      return "a run outside a tensor: " + std::to_string(r.src_tensor) + "[" +
             std::to_string(r.src_offset) + ", +" + std::to_string(r.length) + ") -> " +
             std::to_string(r.dst_tensor) + "[" + std::to_string(r.dst_offset) + ")";
    }
  }
  return "";
}

}  // namespace mixkv::transfer::testing
