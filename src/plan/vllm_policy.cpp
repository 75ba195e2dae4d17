// --policy vllm: vLLM's planner (shared/design/vllm-reference.md §2, §3 and §5.2) with the source
// write-ups' change: hybrid alignment counts the drafter's KV bytes per token, so a drafter with a
// larger page sets the common page and every recurrent page is padded up to it.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "layout.hpp"
#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::plan {
namespace {

bool is_attention(const LayerSpec& s) { return s.behaviour != Behaviour::kRecurrent; }

// The cache-format identity vLLM buckets layers by (its KVCacheSpec value).
struct SpecKey {
  Behaviour behaviour;
  model::LayerKind kind;
  std::int64_t bytes_per_token, state_bytes, window, chunk, block, page;
  auto operator<=>(const SpecKey&) const = default;
};

struct VllmLayer {
  const LayerSpec* spec;
  const model::LayerDesc* desc;
  backend::KernelPageRule rule;
  std::int64_t block = 0;
  std::int64_t real_page = 0;
  std::int64_t page = 0;

  SpecKey key() const {
    return {spec->behaviour,
            spec->kind == model::LayerKind::kMla ? model::LayerKind::kMla : model::LayerKind::kFull,
            spec->bytes_per_token,
            spec->state_bytes,
            spec->window.value_or(0),
            spec->chunk.value_or(0),
            is_attention(*spec) ? block : 0,
            page};
  }
};

std::string pct(double v) { return fmt::format("{:.2f}%", v); }

}  // namespace

Layout vllm_layout(const model::ModelDesc& desc, const PlanOptions& options,
                   const std::vector<LayerSpec>& specs) {
  Layout layout;
  const backend::ModelTraits traits = backend::model_traits(desc);
  std::vector<VllmLayer> layers;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    VllmLayer l{&specs[i], &desc.layers[i], {}, 0, 0, 0};
    if (is_attention(specs[i]))
      l.rule = backend::kernel_page_rule(options.backend, desc.layers[i], traits);
    layers.push_back(std::move(l));
  }
  // vLLM aligns with the target model's attention shape: the first target attention layer, or
  // the first drafter one when the target has none.
  const VllmLayer* first_attention = nullptr;
  for (const auto& l : layers) {
    if (is_attention(*l.spec) &&
        (first_attention == nullptr || (first_attention->desc->owner == model::Owner::kDraft &&
                                        l.desc->owner == model::Owner::kTarget))) {
      first_attention = &l;
    }
  }
  const bool any_recurrent = std::any_of(layers.begin(), layers.end(),
                                         [](const VllmLayer& l) { return !is_attention(*l.spec); });

  // Phase 1: the user's block size, else the backend's preferred one (16 where accepted).
  std::int64_t block = 16;
  if (options.block_size) {
    block = *options.block_size;
  } else if (first_attention != nullptr && !first_attention->rule.accepts(16)) {
    block = first_attention->rule.grain();
  }

  // Phase 2: hybrid alignment. The attention block grows until a target attention page holds a
  // recurrent state; then the largest attention page (the drafter's, if it has more KV per token)
  // is the common page and every recurrent page is padded to it.
  std::int64_t recurrent_page = 0;
  if (any_recurrent && first_attention != nullptr) {
    std::int64_t state = 0;
    for (const auto& l : layers) state = std::max(state, l.spec->state_bytes);
    const std::int64_t per_token = first_attention->spec->bytes_per_token;
    const std::int64_t align = std::max(first_attention->rule.grain(), block);
    const std::int64_t attn_block =
        align * ceil_div(state, checked_mul(align, per_token, "alignment"));
    if (block < attn_block) {
      block = attn_block;
      layout.warnings.push_back(
          fmt::format("attention block size set to {} tokens so an attention page ({} B) holds a "
                      "recurrent state ({} B)",
                      block, block * per_token, state));
    }
    const VllmLayer* largest = first_attention;
    for (const auto& l : layers) {
      if (is_attention(*l.spec) && l.spec->bytes_per_token > largest->spec->bytes_per_token)
        largest = &l;
    }
    recurrent_page = checked_mul(block, largest->spec->bytes_per_token, "common page");
    if (recurrent_page != state) {
      const double factor = double(recurrent_page) / double(state);
      layout.warnings.push_back(fmt::format(
          "recurrent state pages padded from {} B to {} B ({} padding, factor {:.2f}x){}", state,
          recurrent_page, pct(100.0 * (factor - 1.0)), factor,
          largest->desc->owner == model::Owner::kDraft
              ? fmt::format(": the common page is set by drafter layer {} ({} B per token)",
                            largest->spec->layer, largest->spec->bytes_per_token)
              : ""));
    }
  }
  for (auto& l : layers) {
    if (is_attention(*l.spec)) {
      l.block = block;
      l.real_page = l.page = checked_mul(block, l.spec->bytes_per_token, "page bytes");
    } else {
      l.real_page = l.spec->state_bytes;
      l.page = std::max(l.spec->state_bytes, recurrent_page);
    }
  }

  auto bucket = [&]() {
    std::vector<std::vector<VllmLayer*>> buckets;
    std::map<SpecKey, std::size_t> index;
    for (auto& l : layers) {
      auto [it, inserted] = index.emplace(l.key(), buckets.size());
      if (inserted) buckets.emplace_back();
      buckets[it->second].push_back(&l);
    }
    return buckets;
  };
  std::vector<std::vector<VllmLayer*>> buckets = bucket();

  // One type of layer with one block size but different pages: one group, a tensor per layer.
  const bool uniform_type = buckets.size() > 1 && !any_recurrent &&
                            std::all_of(layers.begin(), layers.end(), [&](const VllmLayer& l) {
                              return l.spec->behaviour == layers[0].spec->behaviour &&
                                     l.spec->window == layers[0].spec->window &&
                                     l.spec->chunk == layers[0].spec->chunk;
                            });
  std::vector<std::vector<VllmLayer*>> groups;
  if (buckets.size() == 1 || uniform_type) {
    groups.emplace_back();
    for (auto& l : layers) groups[0].push_back(&l);
    for (std::size_t i = 0; i < layers.size(); ++i) layout.tensor_pages.push_back(layers[i].page);
  } else {
    // Unify pages: smaller attention pages take proportionally more tokens per block.
    const VllmLayer* largest =
        &*std::max_element(layers.begin(), layers.end(),
                           [](const VllmLayer& a, const VllmLayer& b) { return a.page < b.page; });
    const std::int64_t page = largest->page;
    for (auto& l : layers) {
      if (l.page == page) continue;
      if (!is_attention(*l.spec) || page % l.page != 0) {
        throw_invalid(fmt::format(
            "--policy vllm: the page of layer {} ({} B) does not divide the page of layer {} ({} "
            "B), so block sizes cannot unify them; try --policy mixkv",
            l.spec->layer, l.page, largest->spec->layer, page));
      }
      l.block *= page / l.page;
      l.real_page = l.page = page;
    }
    buckets = bucket();
    std::size_t min_n = buckets[0].size(), max_n = buckets[0].size();
    for (const auto& b : buckets) {
      min_n = std::min(min_n, b.size());
      max_n = std::max(max_n, b.size());
    }
    // One layer more in one type (a drafter's) should not halve every group: within 1.5x, use max.
    const std::size_t group_size = 2 * max_n < 3 * min_n ? max_n : min_n;
    for (const auto& b : buckets) {
      const std::size_t num_groups =
          ceil_div(static_cast<std::int64_t>(b.size()), static_cast<std::int64_t>(group_size));
      for (std::size_t g = 0; g < num_groups; ++g) {
        groups.emplace_back();
        for (std::size_t i = g; i < b.size(); i += num_groups)
          groups.back().push_back(b[i]);  // strided
      }
      if (b.size() % group_size != 0) {
        const std::size_t pad = group_size - b.size() % group_size;
        layout.warnings.push_back(fmt::format(
            "{} padding layers for the {} {} layers (up to {} of their KV cache)", pad, b.size(),
            to_string(b[0]->spec->kind), pct(100.0 * double(pad) / double(b.size()))));
      }
    }
    layout.tensor_pages.assign(group_size, page);
  }
  for (auto p : layout.tensor_pages)
    layout.unit_bytes = checked_add(layout.unit_bytes, p, "block unit bytes");

  const bool one_tensor_per_layer =
      layout.tensor_pages.size() == layers.size() && groups.size() == 1;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    PlannedGroup g;
    const VllmLayer& first = *groups[gi].front();
    g.behaviour = first.spec->behaviour;
    g.block_size = first.block;
    g.kernel_block_size = first.block;
    if (is_attention(*first.spec)) {
      auto kernel = backend::select_kernel_page(first.rule, first.block);
      if (!kernel) {
        throw_invalid(fmt::format(
            "--policy vllm: no kernel page of {} ({}) divides the {}-token manager block of "
            "group {} (layers {}...); choose another --block-size or backend",
            first.rule.serving_kernel,
            first.rule.multiple_of > 0 ? fmt::format("multiples of {}", first.rule.multiple_of)
                                       : fmt::format("{}", fmt::join(first.rule.sizes, "/")),
            first.block, gi, first.spec->layer));
      }
      g.kernel_block_size = *kernel;
    }
    for (std::size_t j = 0; j < groups[gi].size(); ++j) {
      const VllmLayer& l = *groups[gi][j];
      PlannedLayer p;
      p.spec = l.spec;
      p.real_page = is_attention(*l.spec) ? checked_mul(l.block, l.spec->bytes_per_token, "page")
                                          : l.spec->state_bytes;
      p.padded_page = l.page;
      p.tensor = one_tensor_per_layer ? static_cast<int>(&l - layers.data()) : static_cast<int>(j);
      p.offset = 0;
      p.kernel_stride = is_attention(*l.spec) ? l.page / (l.block / g.kernel_block_size) : l.page;
      g.layers.push_back(p);
    }
    layout.groups.push_back(std::move(g));
  }
  return layout;
}

}  // namespace mixkv::plan
