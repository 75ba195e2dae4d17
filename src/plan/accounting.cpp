// Concurrency, the physical limit and waste by source, computed the same way for every policy.
#include <algorithm>

#include <fmt/format.h>

#include "layout.hpp"
#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::plan {
namespace {

std::int64_t round_up(std::int64_t v, std::int64_t to) { return ceil_div(v, to) * to; }

// Adds one request's waste in `group` at `request_len` to `waste`.
void add_group_waste(const Layout& layout, const PlannedGroup& g, std::int64_t request_len,
                     int spec_tokens, Waste& waste) {
  const std::int64_t blocks = blocks_needed(g, request_len, spec_tokens);
  std::int64_t padded = 0, real = 0, per_token = 0;
  for (const auto& l : g.layers) {
    padded += l.padded_page;
    real += l.real_page;
    per_token += l.spec->bytes_per_token;
  }
  const std::int64_t empty_slots = layout.unit_bytes - padded;
  if (g.behaviour == Behaviour::kRecurrent) {
    waste.padding_layers += blocks * empty_slots;
    waste.padded_pages += padded - real;
    waste.checkpoints += (blocks - 1) * (padded - real);
    return;
  }
  waste.padding_layers += blocks * empty_slots;
  waste.padded_pages += blocks * (padded - real);
  const std::int64_t kept_raw = tokens_kept(*g.layers.front().spec, request_len, spec_tokens);
  const std::int64_t kept = round_up(kept_raw, kTokenGranularity);
  // A bounded window that starts mid-block holds one block beyond its span.
  const bool straddles = g.behaviour != Behaviour::kAllTokens && kept_raw < request_len &&
                         blocks == ceil_div(kept_raw, g.block_size) + 1;
  const std::int64_t data_blocks = straddles ? blocks - 1 : blocks;
  if (straddles) waste.sliding_extra_block += g.block_size * per_token;
  waste.block_tail += (data_blocks * g.block_size - kept) * per_token;
}

std::int64_t longest_request_that_fits(const Layout& layout, std::int64_t num_blocks,
                                       std::int64_t max_len, int spec_tokens) {
  if (blocks_per_request(layout, 1, spec_tokens) > num_blocks) return 0;
  std::int64_t lo = 1, hi = max_len;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (blocks_per_request(layout, mid, spec_tokens) <= num_blocks) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace

CachePlan finish_plan(const model::ModelDesc& desc, const PlanOptions& options, Layout layout) {
  CachePlan plan;
  plan.policy = options.policy;
  plan.backend = options.backend;
  plan.memory_bytes = options.memory_bytes;
  plan.max_model_len = options.max_model_len;
  plan.request_len = options.request_len;
  plan.num_spec_tokens = desc.num_spec_tokens;
  plan.block_unit_bytes = layout.unit_bytes;
  plan.warnings = std::move(layout.warnings);
  const int k = desc.num_spec_tokens;

  const std::int64_t num_blocks = options.memory_bytes / layout.unit_bytes;
  plan.pools.push_back(Pool{
      0, *std::max_element(layout.tensor_pages.begin(), layout.tensor_pages.end()), num_blocks});
  plan.pool_remainder_bytes = options.memory_bytes - num_blocks * layout.unit_bytes;

  const std::int64_t fits = longest_request_that_fits(layout, num_blocks, options.max_model_len, k);
  plan.max_model_len_that_fits = fits;
  if (fits < options.max_model_len) {
    const std::int64_t needed = checked_mul(blocks_per_request(layout, options.max_model_len, k),
                                            layout.unit_bytes, "bytes for one request");
    throw_invalid(fmt::format(
        "one request of max_model_len {} tokens needs {:.2f} GiB of KV cache under the {} "
        "policy, more than the {:.2f} GiB available; the longest request that fits is {} "
        "tokens: lower --max-model-len to it or give more memory",
        options.max_model_len, double(needed) / double(1 << 30), to_string(options.policy),
        double(options.memory_bytes) / double(1 << 30), fits));
  }

  // Tensors: slot i of each group lives in tensor `layer.tensor`.
  for (std::int64_t page : layout.tensor_pages) {
    plan.tensors.push_back(Tensor{0, checked_mul(page, num_blocks, "tensor bytes"), {}});
  }
  for (const auto& g : layout.groups) {
    for (const auto& l : g.layers) plan.tensors.at(l.tensor).shared_by.push_back(l.spec->layer);
  }

  std::int64_t allocated = 0;
  for (std::size_t i = 0; i < layout.groups.size(); ++i) {
    const PlannedGroup& g = layout.groups[i];
    KvCacheGroup out;
    out.id = static_cast<int>(i);
    out.behaviour = g.behaviour;
    out.kind = g.layers.front().spec->kind;
    out.window = g.layers.front().spec->window;
    out.chunk = g.layers.front().spec->chunk;
    const bool recurrent = g.behaviour == Behaviour::kRecurrent;
    out.block_size = recurrent ? options.max_model_len : g.block_size;
    out.kernel_block_size = recurrent ? out.block_size : g.kernel_block_size;
    for (const auto& l : g.layers) {
      out.layers.push_back(l.spec->layer);
      out.page_bytes = std::max(out.page_bytes, l.padded_page);
      out.real_page_bytes = std::max(out.real_page_bytes, l.real_page);
      out.placement.push_back(
          LayerPlacement{l.spec->layer, l.tensor, l.offset, l.real_page, l.kernel_stride});
    }
    out.blocks_per_request = blocks_needed(g, options.request_len, k);
    allocated += out.blocks_per_request * layout.unit_bytes;
    add_group_waste(layout, g, options.request_len, k, plan.waste_per_request);
    plan.groups.push_back(std::move(out));
  }

  Concurrency& c = plan.concurrency;
  c.request_len = options.request_len;
  c.blocks_per_request = blocks_per_request(layout, options.request_len, k);
  c.max_requests = c.blocks_per_request > 0 ? (num_blocks - 1) / c.blocks_per_request : 0;
  c.max_concurrency = double(num_blocks) / double(c.blocks_per_request);
  c.physical_bytes_per_request = physical_bytes_per_request(desc, options.request_len);
  c.physical_limit = double(options.memory_bytes) / double(c.physical_bytes_per_request);
  c.efficiency = c.max_concurrency / c.physical_limit;
  c.at_max_model_len =
      double(num_blocks) / double(blocks_per_request(layout, options.max_model_len, k));

  if (allocated != c.physical_bytes_per_request + plan.waste_per_request.total()) {
    throw_internal(fmt::format(
        "plan accounting is inconsistent: {} bytes allocated per request, {} physical + {} "
        "waste",
        allocated, c.physical_bytes_per_request, plan.waste_per_request.total()));
  }
  return plan;
}

}  // namespace mixkv::plan
