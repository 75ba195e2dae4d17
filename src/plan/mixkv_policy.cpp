// --policy mixkv: one pool of equal blocks of B bytes; each KV-cache group lays its layers side
// by side inside a block, with its own tokens per block, so no layer is padded to another's page
// and no group needs padding layers. The search picks B and the layers per group that serve the
// most requests of the workload's length. docs/planning.md explains the model and its limits.
#include <algorithm>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "layout.hpp"
#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::plan {
namespace {

// Layers that can share a block table: same growth, same bytes, same kernel rule.
struct LayerClass {
  Behaviour behaviour = Behaviour::kAllTokens;
  std::int64_t bytes_per_token = 0;
  std::int64_t state_bytes = 0;
  backend::KernelPageRule rule;
  std::vector<const LayerSpec*> layers;
  bool attention() const { return behaviour != Behaviour::kRecurrent; }
};

struct BlockChoice {
  std::int64_t block = 0;   // tokens per manager block
  std::int64_t kernel = 0;  // tokens per kernel page
};

// How one class is split at a given B.
struct ClassChoice {
  std::int64_t per_group = 0;  // layers per group
  std::int64_t groups = 0;
  BlockChoice block;
  std::int64_t blocks = 0;  // per request at the plan's request length
};

// The largest block of `bytes_per_block_token`-byte tokens that fits B and that the kernel rule
// can split into uniformly strided kernel pages: kernel page k of a layer sits at k * (B / r)
// with r kernel pages per block, so B must be a multiple of r.
std::optional<BlockChoice> best_block(std::int64_t unit, std::int64_t bytes_per_block_token,
                                      const backend::KernelPageRule& rule,
                                      std::optional<std::int64_t> user_block) {
  const std::int64_t max_tokens = unit / bytes_per_block_token;
  if (user_block) {
    if (*user_block > max_tokens) return std::nullopt;
    auto kernel = backend::select_kernel_page(rule, *user_block);
    if (!kernel || unit % (*user_block / *kernel) != 0) return std::nullopt;
    return BlockChoice{*user_block, *kernel};
  }
  if (rule.multiple_of > 0) {
    const std::int64_t block = max_tokens / rule.multiple_of * rule.multiple_of;
    if (block == 0) return std::nullopt;
    return BlockChoice{block, block};
  }
  std::optional<BlockChoice> best;
  for (std::int64_t kernel : rule.sizes) {
    for (std::int64_t r = max_tokens / kernel; r >= 1; --r) {
      if (unit % r != 0) continue;
      if (!best || r * kernel > best->block) best = BlockChoice{r * kernel, kernel};
      break;
    }
  }
  return best;
}

std::optional<ClassChoice> choose_attention(const LayerClass& c, std::int64_t unit,
                                            std::int64_t request_len, int spec_tokens,
                                            std::optional<std::int64_t> user_block) {
  std::optional<ClassChoice> best;
  const auto n = static_cast<std::int64_t>(c.layers.size());
  for (std::int64_t per_group = 1; per_group <= n; ++per_group) {
    auto block = best_block(unit, per_group * c.bytes_per_token, c.rule, user_block);
    if (!block) break;  // more layers per group only shrink the block
    const std::int64_t groups = ceil_div(n, per_group);
    const std::int64_t blocks =
        groups * blocks_for(*c.layers[0], block->block, request_len, spec_tokens);
    if (!best || blocks <= best->blocks) best = ClassChoice{per_group, groups, *block, blocks};
  }
  return best;
}

std::optional<ClassChoice> choose_recurrent(const LayerClass& c, std::int64_t unit,
                                            int spec_tokens) {
  const auto n = static_cast<std::int64_t>(c.layers.size());
  const std::int64_t per_group = std::min(n, unit / c.state_bytes);
  if (per_group == 0) return std::nullopt;
  const std::int64_t groups = ceil_div(n, per_group);
  return ClassChoice{per_group, groups, {}, groups * (1 + spec_tokens)};
}

struct Candidate {
  std::int64_t unit = 0;
  std::vector<ClassChoice> choices;
  std::int64_t blocks = 0;  // per request at the request length
  double score = 0;         // requests served
  bool fits_max_len = false;
};

std::optional<Candidate> evaluate(const std::vector<LayerClass>& classes, std::int64_t unit,
                                  const PlanOptions& o, int spec_tokens) {
  Candidate cand;
  cand.unit = unit;
  std::int64_t blocks_at_max = 0;
  for (const auto& c : classes) {
    auto choice = c.attention()
                      ? choose_attention(c, unit, o.request_len, spec_tokens, o.block_size)
                      : choose_recurrent(c, unit, spec_tokens);
    if (!choice) return std::nullopt;
    cand.blocks += choice->blocks;
    blocks_at_max += c.attention() ? choice->groups * blocks_for(*c.layers[0], choice->block.block,
                                                                 o.max_model_len, spec_tokens)
                                   : choice->blocks;
    cand.choices.push_back(*choice);
  }
  const std::int64_t num_blocks = o.memory_bytes / unit;
  cand.fits_max_len = blocks_at_max <= num_blocks;
  cand.score = double(num_blocks) / double(cand.blocks);
  return cand;
}

std::vector<LayerClass> classify(const model::ModelDesc& desc, const PlanOptions& options,
                                 const std::vector<LayerSpec>& specs) {
  const backend::ModelTraits traits = backend::model_traits(desc);
  std::vector<LayerClass> classes;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const LayerSpec& s = specs[i];
    backend::KernelPageRule rule;
    if (s.behaviour != Behaviour::kRecurrent)
      rule = backend::kernel_page_rule(options.backend, desc.layers[i], traits);
    auto same = [&](const LayerClass& c) {
      const LayerSpec& f = *c.layers[0];
      return c.behaviour == s.behaviour && c.bytes_per_token == s.bytes_per_token &&
             c.state_bytes == s.state_bytes && f.window == s.window && f.chunk == s.chunk &&
             c.rule == rule;
    };
    auto it = std::find_if(classes.begin(), classes.end(), same);
    if (it == classes.end()) {
      classes.push_back(LayerClass{s.behaviour, s.bytes_per_token, s.state_bytes, rule, {}});
      it = std::prev(classes.end());
    }
    it->layers.push_back(&s);
  }
  return classes;
}

// Block sizes worth trying: B made of whole recurrent states, then nudged so that some attention
// group's block is an exact multiple of its kernel grain; for attention-only models, B made of
// whole grain-sized attention blocks.
std::set<std::int64_t> candidate_units(const std::vector<LayerClass>& classes, const PlanOptions& o,
                                       std::int64_t vllm_hint) {
  std::set<std::int64_t> out;
  std::int64_t largest_state = 0;
  for (const auto& c : classes) largest_state = std::max(largest_state, c.state_bytes);
  auto add = [&](std::int64_t unit) {
    if (unit >= largest_state && unit > 0 && unit <= o.memory_bytes / 2) out.insert(unit);
  };
  if (vllm_hint > 0) add(vllm_hint);
  auto grain = [&](const LayerClass& c) { return o.block_size.value_or(c.rule.grain()); };
  constexpr std::int64_t kAlign = 4096;
  constexpr std::int64_t kMaxGrainsPerBlock = 64;
  if (largest_state > 0) {
    for (const auto& r : classes) {
      if (r.attention()) continue;
      for (std::int64_t states = 1; states <= static_cast<std::int64_t>(r.layers.size());
           ++states) {
        const std::int64_t base = states * r.state_bytes;
        add(base);
        add(ceil_div(base, kAlign) * kAlign);
        for (const auto& a : classes) {
          if (!a.attention()) continue;
          for (std::int64_t k = 1; k <= static_cast<std::int64_t>(a.layers.size()); ++k) {
            const std::int64_t quantum = k * a.bytes_per_token * grain(a);
            add(ceil_div(base, quantum) * quantum);
          }
        }
      }
    }
    return out;
  }
  for (const auto& a : classes) {
    for (std::int64_t k = 1; k <= static_cast<std::int64_t>(a.layers.size()); ++k) {
      for (std::int64_t grains = 1; grains <= kMaxGrainsPerBlock; ++grains) {
        add(k * a.bytes_per_token * grain(a) * grains);
      }
    }
  }
  return out;
}

}  // namespace

Layout mixkv_layout(const model::ModelDesc& desc, const PlanOptions& options,
                    const std::vector<LayerSpec>& specs, std::int64_t vllm_unit_hint) {
  const std::vector<LayerClass> classes = classify(desc, options, specs);
  std::vector<Candidate> candidates;
  double hint_score = 0;
  for (std::int64_t unit : candidate_units(classes, options, vllm_unit_hint)) {
    auto cand = evaluate(classes, unit, options, desc.num_spec_tokens);
    if (!cand) continue;
    if (unit == vllm_unit_hint && cand->fits_max_len) hint_score = cand->score;
    candidates.push_back(std::move(*cand));
  }
  if (candidates.empty()) {
    throw_invalid(fmt::format(
        "--policy mixkv: no block size fits {} B of memory for this model with the {} backend; "
        "give more memory (every group needs at least one block per request)",
        options.memory_bytes, backend::to_string(options.backend)));
  }
  // Plans that hold a max_model_len request first; then the most requests. Within kScoreTolerance
  // of the best, prefer fewer blocks per request: the block tables the manager and kernels walk
  // every step. Never below what vLLM's block unit gives, nor below 96% of the physical limit
  // when the best reaches it.
  constexpr double kScoreTolerance = 0.01;
  constexpr double kPhysicalFloor = 0.96;
  const double physical_limit =
      double(options.memory_bytes) / double(physical_bytes_per_request(desc, options.request_len));
  const bool any_fits = std::any_of(candidates.begin(), candidates.end(),
                                    [](const Candidate& c) { return c.fits_max_len; });
  double best_score = 0;
  for (const auto& c : candidates) {
    if (c.fits_max_len == any_fits) best_score = std::max(best_score, c.score);
  }
  const double threshold = std::max({best_score * (1 - kScoreTolerance), hint_score,
                                     std::min(best_score, kPhysicalFloor * physical_limit)});
  const Candidate* best = nullptr;
  for (const auto& c : candidates) {
    if (c.fits_max_len != any_fits || c.score < threshold) continue;
    auto key = [](const Candidate& x) { return std::tuple(-x.blocks, x.score); };
    if (best == nullptr || key(c) > key(*best)) best = &c;
  }

  Layout layout;
  layout.tensor_pages = {best->unit};
  layout.unit_bytes = best->unit;
  for (std::size_t ci = 0; ci < classes.size(); ++ci) {
    const LayerClass& c = classes[ci];
    const ClassChoice& choice = best->choices[ci];
    for (std::int64_t gi = 0; gi < choice.groups; ++gi) {
      PlannedGroup g;
      g.behaviour = c.behaviour;
      g.block_size = choice.block.block;
      g.kernel_block_size = choice.block.kernel;
      // Kernel pages of every layer interleave in r sub-rows of B / r bytes.
      const std::int64_t sub_rows = c.attention() ? choice.block.block / choice.block.kernel : 1;
      std::int64_t j = 0;
      for (std::size_t li = gi; li < c.layers.size();
           li += choice.groups, ++j) {  // strided, as vLLM
        PlannedLayer p;
        p.spec = c.layers[li];
        p.real_page = p.padded_page =
            c.attention() ? choice.block.block * c.bytes_per_token : c.state_bytes;
        p.tensor = 0;
        p.offset = c.attention() ? j * choice.block.kernel * c.bytes_per_token : j * c.state_bytes;
        p.kernel_stride = best->unit / sub_rows;
        g.layers.push_back(p);
      }
      layout.groups.push_back(std::move(g));
    }
  }
  return layout;
}

}  // namespace mixkv::plan
