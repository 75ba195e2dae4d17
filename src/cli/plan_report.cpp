#include "plan_report.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "layer_table.hpp"

namespace mixkv::cli {
namespace {

std::string gib(std::int64_t bytes) {
  return fmt::format("{:.2f} GiB", double(bytes) / double(1 << 30));
}

std::string header(const model::ModelDesc& desc) {
  return fmt::format("{}{}  tp {}  speculative tokens {}\n", desc.model,
                     desc.draft ? fmt::format(" + draft {}", *desc.draft) : "", desc.tp,
                     desc.num_spec_tokens);
}

// Group rows: identical rows (same kind, block, page, blocks per request) folded.
std::string group_table(const model::ModelDesc& desc, const plan::CachePlan& plan) {
  std::map<std::string, int> index_of;
  for (const auto& l : desc.layers) index_of[l.name] = l.index;
  struct Row {
    std::string key;
    std::vector<std::string> layers;
    int groups = 0;
    const plan::KvCacheGroup* group;
  };
  std::vector<Row> rows;
  for (const auto& g : plan.groups) {
    std::string key =
        fmt::format("{}|{}|{}|{}|{}|{}|{}", model::to_string(g.kind), g.block_size, g.page_bytes,
                    g.real_page_bytes, g.kernel_block_size, g.layers.size(), g.blocks_per_request);
    auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.key == key; });
    if (it == rows.end()) {
      rows.push_back({key, {}, 0, &g});
      it = std::prev(rows.end());
    }
    ++it->groups;
    it->layers.insert(it->layers.end(), g.layers.begin(), g.layers.end());
  }
  auto line = [](auto&&... cols) {
    return fmt::format("  {:>6} {:<8} {:>7} {:>8} {:>7} {:>12} {:>12} {:>8}  {}\n", cols...);
  };
  std::string out =
      line("groups", "kind", "layers", "block", "kernel", "page B", "real B", "blk/req", "layers");
  for (const auto& r : rows) {
    const auto& g = *r.group;
    std::vector<int> target, draft;
    for (const auto& name : r.layers)
      (name.starts_with("layers.") ? target : draft).push_back(index_of[name]);
    std::sort(target.begin(), target.end());
    std::sort(draft.begin(), draft.end());
    std::string names;
    if (!target.empty()) names += "target " + compact_indices(target);
    if (!draft.empty())
      names += (names.empty() ? "" : "; ") + std::string("draft ") + compact_indices(draft);
    const bool recurrent = g.behaviour == plan::Behaviour::kRecurrent;
    out += line(r.groups, model::to_string(g.kind), g.layers.size(),
                recurrent ? "state" : fmt::format("{}", g.block_size),
                recurrent ? "-" : fmt::format("{}", g.kernel_block_size), g.page_bytes,
                g.real_page_bytes, g.blocks_per_request, names);
  }
  return out;
}

}  // namespace

std::string format_plan(const model::ModelDesc& desc, const plan::CachePlan& plan) {
  const auto& c = plan.concurrency;
  const auto& w = plan.waste_per_request;
  std::string out = header(desc);
  out += self_draft_note(desc);
  out += fmt::format("policy {}  backend {}  KV memory {} ({} B)  max model len {}\n",
                     plan::to_string(plan.policy), backend::to_string(plan.backend),
                     gib(plan.memory_bytes), plan.memory_bytes, plan.max_model_len);
  out += fmt::format("pool: {} blocks of {} B ({} tensor{} of {} B per block)\n",
                     plan.pools[0].num_blocks, plan.block_unit_bytes, plan.tensors.size(),
                     plan.tensors.size() == 1 ? "" : "s", plan.pools[0].page_bytes);
  out += fmt::format("KV-cache groups: {}\n", plan.groups.size());
  out += group_table(desc, plan);
  out += fmt::format(
      "concurrency at {} tokens: {} requests ({:.2f}x); physical limit {:.2f}x; efficiency "
      "{:.1f}%\n",
      c.request_len, c.max_requests, c.max_concurrency, c.physical_limit, 100.0 * c.efficiency);
  out += fmt::format("concurrency at max model len {}: {:.2f}x\n", plan.max_model_len,
                     c.at_max_model_len);
  out += fmt::format(
      "per request: {} B allocated = {} B physical + waste: padding layers {}, padded pages {}, "
      "block tail {}, "
      "sliding extra block {}, checkpoints {}\n",
      c.blocks_per_request * plan.block_unit_bytes, c.physical_bytes_per_request, w.padding_layers,
      w.padded_pages, w.block_tail, w.sliding_extra_block, w.checkpoints);
  for (const auto& warning : plan.warnings) out += "warning: " + warning + '\n';
  return out;
}

std::string format_plan_comparison(const model::ModelDesc& desc, const plan::CachePlan& vllm,
                                   const plan::CachePlan& mixkv) {
  std::string out = header(desc);
  out += fmt::format("backend {}  KV memory {}  request length {}  max model len {}\n",
                     backend::to_string(vllm.backend), gib(vllm.memory_bytes), vllm.request_len,
                     vllm.max_model_len);
  auto row = [](std::string_view what, auto a, auto b, std::string ratio) {
    return fmt::format("  {:<34} {:>16} {:>16} {:>9}\n", what, a, b, ratio);
  };
  auto ratio = [](double a, double b) {
    return a > 0 ? fmt::format("{:.2f}x", b / a) : std::string("-");
  };
  const auto& cv = vllm.concurrency;
  const auto& cm = mixkv.concurrency;
  out += row("", "vllm", "mixkv", "mixkv/vllm");
  out += row("requests at request length", cv.max_requests, cm.max_requests,
             ratio(double(cv.max_requests), double(cm.max_requests)));
  out += row("concurrency at request length", fmt::format("{:.2f}x", cv.max_concurrency),
             fmt::format("{:.2f}x", cm.max_concurrency),
             ratio(cv.max_concurrency, cm.max_concurrency));
  out += row("efficiency vs physical limit", fmt::format("{:.1f}%", 100 * cv.efficiency),
             fmt::format("{:.1f}%", 100 * cm.efficiency), "");
  out += row("concurrency at max model len", fmt::format("{:.2f}x", cv.at_max_model_len),
             fmt::format("{:.2f}x", cm.at_max_model_len),
             ratio(cv.at_max_model_len, cm.at_max_model_len));
  out += row("KV-cache groups", vllm.groups.size(), mixkv.groups.size(), "");
  out += row("block unit (B)", vllm.block_unit_bytes, mixkv.block_unit_bytes, "");
  out += row("blocks per request", cv.blocks_per_request, cm.blocks_per_request, "");
  out += row("waste per request (B)", vllm.waste_per_request.total(),
             mixkv.waste_per_request.total(), "");
  out += fmt::format("physical limit: {:.2f} requests of {} tokens ({} B each)\n",
                     cv.physical_limit, cv.request_len, cv.physical_bytes_per_request);
  for (const auto& warning : vllm.warnings) out += "vllm warning: " + warning + '\n';
  for (const auto& warning : mixkv.warnings) out += "mixkv warning: " + warning + '\n';
  return out;
}

std::string format_attention_groups(const std::vector<attn::AttentionGroup>& groups) {
  std::string out = fmt::format("attention groups: {}\n", groups.size());
  for (const auto& g : groups) {
    const auto& p = g.params;
    out += fmt::format(
        "  #{} kv-group {} {} layers ({}{}), kernel page {}, {} {}, window_left {}, soft cap {}, "
        "scale {:.5g}, "
        "sinks {}, {}, {}/{} heads, {}\n    why: {}\n",
        g.id, g.kv_cache_group, g.layers.size(), g.layers.front(),
        g.layers.size() > 1 ? ", ..." : "", g.kernel_block_size, to_string(p.kv_dtype),
        attn::to_string(g.layout), p.window_left,
        p.soft_cap ? fmt::format("{:g}", *p.soft_cap) : "none", p.scale, p.sinks ? "yes" : "no",
        p.causal ? "causal" : "non-causal", p.num_q_heads, p.num_kv_heads, g.kernel_path,
        g.split_reason);
  }
  return out;
}

}  // namespace mixkv::cli
