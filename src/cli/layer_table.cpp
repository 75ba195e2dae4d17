#include "layer_table.hpp"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace mixkv::cli {
namespace {

// Two layers fold into one row when they differ only in name and index.
model::LayerDesc fold_key(model::LayerDesc layer) {
  layer.name.clear();
  layer.index = 0;
  return layer;
}

std::string heads(const model::LayerDesc& l) {
  if (l.kind == model::LayerKind::kMamba1) return "-";
  return fmt::format("{}/{}", l.num_q_heads, l.num_kv_heads);
}

std::string head_sizes(const model::LayerDesc& l) {
  if (l.kind == model::LayerKind::kMamba1) return "-";
  return l.head_size == l.head_size_v ? fmt::format("{}", l.head_size)
                                      : fmt::format("{}/{}", l.head_size, l.head_size_v);
}

std::string extent(const model::LayerDesc& l) {
  if (l.window) return fmt::format("w={}", *l.window);
  if (l.chunk) return fmt::format("c={}", *l.chunk);
  return "-";
}

std::string state_text(const model::LayerDesc& l) {
  std::vector<std::string> parts;
  for (const auto& t : l.state) {
    parts.push_back(fmt::format("{}({}) {}", t.name, fmt::join(t.shape, ","), to_string(t.dtype)));
  }
  return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, " "));
}

std::string bytes_text(const model::LayerDesc& l) {
  return model::is_attention(l.kind) ? fmt::format("{} B/tok", model::kv_bytes_per_token(l))
                                     : fmt::format("{} B/seq", model::state_bytes(l));
}

}  // namespace

namespace {

// "a..b step s" when `v` (sorted, at least three long) is an arithmetic progression with a gap.
std::optional<std::string> progression(const std::vector<int>& v) {
  if (v.size() < 3 || v[1] - v[0] < 2) return std::nullopt;
  const int step = v[1] - v[0];
  for (std::size_t i = 1; i < v.size(); ++i) {
    if (v[i] - v[i - 1] != step) return std::nullopt;
  }
  return fmt::format("{}..{} step {}", v.front(), v.back(), step);
}

std::vector<std::string> runs_of(const std::vector<int>& v) {
  std::vector<std::string> runs;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    runs.push_back(i == j ? fmt::format("{}", v[i]) : fmt::format("{}-{}", v[i], v[j]));
    i = j + 1;
  }
  return runs;
}

}  // namespace

// Every form printed here is exact: a progression, a list of runs, a range minus a progression
// (Gemma 3's local layers: "0-61 except 5..59 step 6"), or, when nothing short is true, the first
// runs and the last with the number of runs left out spelled out, never an ellipsis that reads
// as "and so on".
std::string compact_indices(const std::vector<int>& v) {
  if (v.empty()) return "-";
  if (auto p = progression(v)) return *p;
  const std::vector<std::string> runs = runs_of(v);
  constexpr std::size_t kMaxRuns = 4;
  if (runs.size() <= kMaxRuns) return fmt::format("{}", fmt::join(runs, ","));
  std::vector<int> missing;
  for (std::size_t i = 1; i < v.size(); ++i) {
    for (int k = v[i - 1] + 1; k < v[i]; ++k) missing.push_back(k);
  }
  const std::string range = fmt::format("{}-{}", v.front(), v.back());
  if (auto p = progression(missing)) return fmt::format("{} except {}", range, *p);
  const std::string all = fmt::format("{}", fmt::join(runs, ","));
  constexpr std::size_t kMaxChars = 40;
  if (all.size() <= kMaxChars) return all;
  constexpr std::size_t kShown = 3;
  return fmt::format("{},(+{} more),{}", fmt::join(runs.begin(), runs.begin() + kShown, ","),
                     runs.size() - kShown - 1, runs.back());
}

std::string self_draft_note(const model::ModelDesc& desc) {
  if (!desc.draft_info || desc.draft_info->kind != model::DraftKind::kSelf) return {};
  const int last = desc.draft_info->shared_target_layers - 1;
  return fmt::format(
      "self drafter: target layers.0..layers.{} then the target's final norm and LM head; its KV "
      "is those layers' own cache (shared, 0 extra bytes per token)\n",
      last);
}

std::string format_layer_table(const model::ModelDesc& desc) {
  struct Row {
    model::LayerDesc key;
    std::vector<int> indices;
  };
  std::vector<Row> rows;
  for (const auto& layer : desc.layers) {
    auto key = fold_key(layer);
    auto it = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.key == key; });
    if (it == rows.end()) {
      rows.push_back({key, {layer.index}});
    } else {
      it->indices.push_back(layer.index);
    }
  }

  std::string out = fmt::format("{}{}  tp {}  speculative tokens {}\n", desc.model,
                                desc.draft ? fmt::format(" + draft {}", *desc.draft) : "", desc.tp,
                                desc.num_spec_tokens);
  if (desc.draft_info) {
    out += fmt::format("draft kind {}", to_string(desc.draft_info->kind));
    if (desc.draft_info->block_size)
      out += fmt::format(", block size {}", *desc.draft_info->block_size);
    if (!desc.draft_info->target_layer_ids.empty()) {
      out +=
          fmt::format(", target layers [{}]", fmt::join(desc.draft_info->target_layer_ids, ", "));
    }
    out += '\n';
  }
  out += self_draft_note(desc);
  const auto line = [](auto&&... cols) {
    return fmt::format(
        "{:<7} {:<26} {:>3}  {:<9} {:>7} {:>7} {:>7} {:>5} {:>8} {:<5} {:<6} {:<9} {:>12}  {}\n",
        cols...);
  };
  out += line("owner", "layers", "n", "kind", "q/kv", "head", "extent", "cap", "scale", "sinks",
              "causal", "dtype", "cache", "state");
  for (const auto& r : rows) {
    const auto& l = r.key;
    // A DSA indexer's key cache is planned as an MLA layer; the table says what it is.
    const std::string_view kind = l.indexer ? "indexer" : to_string(l.kind);
    out += line(to_string(l.owner), compact_indices(r.indices), r.indices.size(), kind, heads(l),
                head_sizes(l), extent(l), l.soft_cap ? fmt::format("{:g}", *l.soft_cap) : "-",
                fmt::format("{:.5g}", l.scale), l.sinks ? "yes" : "no", l.causal ? "yes" : "no",
                to_string(l.kv_dtype), bytes_text(l), state_text(l));
  }
  return out;
}

}  // namespace mixkv::cli
