#include "mixkv/layout/geometry.hpp"

#include <map>

#include <fmt/format.h>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::layout {

const LayerGeometry& Geometry::layer(std::string_view name) const {
  for (const auto& l : layers) {
    if (l.layer == name) return l;
  }
  throw_invalid(fmt::format("no layer named '{}' in this geometry", name));
}

Geometry make_geometry(const model::ModelDesc& desc, const plan::CachePlan& plan,
                       const std::vector<attn::AttentionGroup>& groups) {
  Geometry geo;
  const std::int64_t num_blocks = plan.pools.at(0).num_blocks;
  for (const auto& t : plan.tensors) {
    geo.tensors.push_back(
        TensorGeometry{t.bytes, num_blocks, num_blocks > 0 ? t.bytes / num_blocks : 0});
  }
  std::map<std::string, std::pair<const plan::KvCacheGroup*, const plan::LayerPlacement*>> placed;
  for (const auto& g : plan.groups) {
    for (const auto& p : g.placement) placed[p.layer] = {&g, &p};
  }
  std::map<std::string, const attn::AttentionGroup*> attention_of;
  for (const auto& ag : groups) {
    for (const auto& name : ag.layers) attention_of[name] = &ag;
  }

  for (const auto& layer : desc.layers) {
    auto it = placed.find(layer.name);
    if (it == placed.end())
      throw_internal(fmt::format("layer {} is not placed by the plan", layer.name));
    const auto& [group, placement] = it->second;
    LayerGeometry g;
    g.layer = layer.name;
    g.kv_cache_group = group->id;
    g.tensor = placement->tensor;
    g.offset = placement->offset_bytes;
    const std::int64_t page_stride = geo.tensors.at(g.tensor).page_stride;
    if (group->behaviour == plan::Behaviour::kRecurrent) {
      g.recurrent = true;
      g.state_bytes = placement->bytes;
      g.kernel_page_stride = page_stride;
      g.kernel_page_bytes = placement->bytes;
    } else {
      const attn::AttentionGroup& ag = *attention_of.at(layer.name);
      g.attention_group = ag.id;
      g.block_tokens = group->block_size;
      g.kernel_tokens = ag.kernel_block_size;
      g.kernel_pages_per_block = g.block_tokens / g.kernel_tokens;
      const std::int64_t token_bytes = model::kv_bytes_per_token(layer);
      if (layer.kind == model::LayerKind::kMla) {
        g.k_token_bytes = token_bytes;
      } else {
        g.k_token_bytes = storage_bytes(
            layer.kv_dtype, checked_mul(layer.num_kv_heads, layer.head_size, "K bytes"));
        g.v_token_bytes = token_bytes - g.k_token_bytes;
      }
      g.kernel_page_bytes = g.kernel_tokens * token_bytes;
      g.v_offset = g.kernel_tokens * g.k_token_bytes;
      g.kv_layout = ag.layout;
      g.num_kv_heads = layer.kind == model::LayerKind::kMla ? 1 : layer.num_kv_heads;
      if (g.hnd() &&
          (g.k_token_bytes % g.num_kv_heads != 0 || g.v_token_bytes % g.num_kv_heads != 0)) {
        throw_invalid(fmt::format(
            "layer {}: its {} K and {} V bytes a token do not split into {} KV heads, as the {} "
            "layout of attention group {} needs; use a cache dtype whose blocks do not cross heads",
            layer.name, g.k_token_bytes, g.v_token_bytes, g.num_kv_heads, to_string(ag.layout),
            ag.id));
      }
      // A manager page splits into k kernel pages of one stride: the plan's own stride when it
      // cut the page for this kernel size (mixkv interleaves), else the page divided evenly.
      if (placement->kernel_page_stride_bytes * g.kernel_pages_per_block == page_stride &&
          placement->bytes / g.kernel_pages_per_block <= placement->kernel_page_stride_bytes &&
          ag.kernel_block_size == group->kernel_block_size) {
        g.kernel_page_stride = placement->kernel_page_stride_bytes;
      } else if (page_stride % g.kernel_pages_per_block == 0 && g.offset == 0) {
        g.kernel_page_stride = page_stride / g.kernel_pages_per_block;
      } else {
        throw_invalid(fmt::format(
            "layer {}: its {}-byte manager page does not split evenly into {} kernel pages of "
            "{} tokens ({}); padding must divide evenly and layers must not be interleaved "
            "differently",
            layer.name, page_stride, g.kernel_pages_per_block, g.kernel_tokens,
            g.offset != 0 ? "the layer is interleaved with others" : "uneven padding"));
      }
      if (g.kernel_page_bytes > g.kernel_page_stride) {
        throw_invalid(fmt::format("layer {}: a {}-byte kernel page does not fit its {}-byte stride",
                                  layer.name, g.kernel_page_bytes, g.kernel_page_stride));
      }
    }
    // Every piece of the layer stays inside its manager page.
    const std::int64_t last_end =
        g.offset + (g.kernel_pages_per_block - 1) * (g.recurrent ? 0 : g.kernel_page_stride) +
        g.kernel_page_bytes;
    if (last_end > page_stride) {
      throw_invalid(fmt::format("layer {}: its data ends at byte {} of a {}-byte manager page",
                                layer.name, last_end, page_stride));
    }
    geo.layers.push_back(std::move(g));
  }
  return geo;
}

std::vector<std::int64_t> kernel_block_table(const LayerGeometry& layer,
                                             std::span<const std::int64_t> blocks) {
  std::vector<std::int64_t> out;
  out.reserve(blocks.size() * static_cast<std::size_t>(layer.kernel_pages_per_block));
  for (std::int64_t b : blocks) {
    for (std::int64_t j = 0; j < layer.kernel_pages_per_block; ++j)
      out.push_back(b * layer.kernel_pages_per_block + j);
  }
  return out;
}

TokenLocation locate_token(const LayerGeometry& layer, std::span<const std::int64_t> blocks,
                           std::int64_t position) {
  if (layer.recurrent)
    throw_invalid(fmt::format("layer {} is recurrent: it has no per-token slots", layer.layer));
  const std::int64_t block_index = position / layer.block_tokens;
  if (position < 0 || block_index >= static_cast<std::int64_t>(blocks.size())) {
    throw_invalid(fmt::format("token position {} is outside the request's {} blocks of {} tokens",
                              position, blocks.size(), layer.block_tokens));
  }
  const std::int64_t in_block = position % layer.block_tokens;
  // Checked: the geometry may be a transfer peer's (transfer::plan_pull), whose block ids and
  // strides are its own to send; a location past 2^63 is bad input, not a wrapped offset.
  constexpr std::string_view kWhat = "a token's location in the KV cache";
  const auto mul = [&](std::int64_t a, std::int64_t b) { return checked_mul(a, b, kWhat); };
  const auto add = [&](std::int64_t a, std::int64_t b) { return checked_add(a, b, kWhat); };
  TokenLocation loc;
  loc.kernel_page =
      add(mul(blocks[static_cast<std::size_t>(block_index)], layer.kernel_pages_per_block),
          in_block / layer.kernel_tokens);
  const std::int64_t in_page = in_block % layer.kernel_tokens;
  loc.slot = add(mul(loc.kernel_page, layer.kernel_tokens), in_page);
  const std::int64_t page_base = add(layer.offset, mul(loc.kernel_page, layer.kernel_page_stride));
  loc.k_offset = add(page_base, mul(in_page, layer.k_row_stride()));
  loc.v_offset = add(add(page_base, layer.v_offset), mul(in_page, layer.v_row_stride()));
  return loc;
}

std::vector<TransferDescriptor> transfer_descriptors(const LayerGeometry& layer,
                                                     std::span<const std::int64_t> blocks,
                                                     std::int64_t num_tokens) {
  std::vector<TransferDescriptor> out;
  if (layer.recurrent) {
    for (std::int64_t b : blocks) {
      out.push_back(
          {layer.tensor, layer.offset + b * layer.kernel_page_stride, layer.state_bytes, 1, 0});
    }
    return out;
  }
  if (num_tokens < 0 ||
      num_tokens > static_cast<std::int64_t>(blocks.size()) * layer.block_tokens) {
    throw_invalid(fmt::format("{} tokens do not fit the request's {} blocks of {} tokens",
                              num_tokens, blocks.size(), layer.block_tokens));
  }
  const std::vector<std::int64_t> pages = kernel_block_table(layer, blocks);
  const std::int64_t full_pages = num_tokens / layer.kernel_tokens;
  const std::int64_t rest = num_tokens % layer.kernel_tokens;
  // Runs of consecutive kernel pages (within a manager block they are) become one strided piece.
  for (std::int64_t i = 0; i < full_pages;) {
    std::int64_t j = i + 1;
    while (j < full_pages &&
           pages[static_cast<std::size_t>(j)] == pages[static_cast<std::size_t>(j - 1)] + 1)
      ++j;
    TransferDescriptor d{
        layer.tensor, layer.offset + pages[static_cast<std::size_t>(i)] * layer.kernel_page_stride,
        layer.kernel_page_bytes, j - i, layer.kernel_page_stride};
    if (d.count > 1 && d.stride == d.length) {
      d.length *= d.count;
      d.count = 1;
    }
    out.push_back(d);
    i = j;
  }
  if (rest > 0) {
    // The filled part of the last page: its first `rest` tokens, one piece (NHD) or one piece a
    // KV head (HND: each head's tokens start kernel_tokens head pieces apart).
    const std::int64_t base =
        layer.offset + pages[static_cast<std::size_t>(full_pages)] * layer.kernel_page_stride;
    const std::int64_t heads = layer.hnd() ? layer.num_kv_heads : 1;
    out.push_back({layer.tensor, base, rest * layer.k_token_bytes / heads, heads,
                   heads > 1 ? layer.k_head_stride() : 0});
    if (layer.v_token_bytes > 0) {
      out.push_back({layer.tensor, base + layer.v_offset, rest * layer.v_token_bytes / heads, heads,
                     heads > 1 ? layer.v_head_stride() : 0});
    }
  }
  return out;
}

}  // namespace mixkv::layout
