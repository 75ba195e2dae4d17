#include "mixkv/model/model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "config_reader.hpp"
#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/enum_names.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::model {
namespace {

constexpr std::array kLayerKinds = {
    Named<LayerKind>{"full", LayerKind::kFull},
    Named<LayerKind>{"sliding", LayerKind::kSliding},
    Named<LayerKind>{"chunked", LayerKind::kChunked},
    Named<LayerKind>{"mla", LayerKind::kMla},
    Named<LayerKind>{"gdn", LayerKind::kGdn},
    Named<LayerKind>{"kda", LayerKind::kKda},
    Named<LayerKind>{"mamba2", LayerKind::kMamba2},
    Named<LayerKind>{"mamba1", LayerKind::kMamba1},
    Named<LayerKind>{"lightning", LayerKind::kLightning},
};
constexpr std::array kOwners = {Named<Owner>{"target", Owner::kTarget},
                                Named<Owner>{"draft", Owner::kDraft}};
constexpr std::array kDraftKinds = {
    Named<DraftKind>{"eagle", DraftKind::kEagle}, Named<DraftKind>{"eagle3", DraftKind::kEagle3},
    Named<DraftKind>{"mtp", DraftKind::kMtp},     Named<DraftKind>{"dflash", DraftKind::kDflash},
    Named<DraftKind>{"model", DraftKind::kModel}, Named<DraftKind>{"self", DraftKind::kSelf},
};

void check(bool ok, const LayerDesc& layer, std::string_view field, const std::string& problem) {
  if (!ok) {
    throw_invalid(fmt::format("layer {} ({}): {} {}", layer.name.empty() ? "<unnamed>" : layer.name,
                              to_string(layer.kind), field, problem));
  }
}

void validate_layer(const LayerDesc& l) {
  check(!l.name.empty(), l, "name", "is empty; give every layer a unique name");
  check(l.index >= 0, l, "index", fmt::format("is {}, expected >= 0", l.index));
  check(std::isfinite(l.scale) && l.scale > 0, l, "scale",
        fmt::format("is {}, expected a positive number", l.scale));
  check(!l.soft_cap || (std::isfinite(*l.soft_cap) && *l.soft_cap > 0), l, "soft_cap",
        "must be a positive number or null");
  check(!l.window || *l.window > 0, l, "window", "must be a positive token count or null");
  check(!l.chunk || *l.chunk > 0, l, "chunk", "must be a positive token count or null");
  check(l.kind != LayerKind::kSliding || l.window.has_value(), l, "window",
        "is missing; a sliding layer needs its window size");
  check(l.kind == LayerKind::kSliding || !l.window.has_value(), l, "window",
        "is set on a layer that is not sliding; drop it or make the layer 'sliding'");
  check(l.kind != LayerKind::kChunked || l.chunk.has_value(), l, "chunk",
        "is missing; a chunked layer needs its chunk size");
  check(l.kind == LayerKind::kChunked || !l.chunk.has_value(), l, "chunk",
        "is set on a layer that is not chunked; drop it or make the layer 'chunked'");
  if (is_attention(l.kind)) {
    check(l.num_q_heads > 0, l, "num_q_heads",
          fmt::format("is {}, expected a positive count", l.num_q_heads));
    check(l.num_kv_heads > 0, l, "num_kv_heads",
          fmt::format("is {}, expected a positive count", l.num_kv_heads));
    check(l.head_size > 0, l, "head_size",
          fmt::format("is {}, expected a positive size", l.head_size));
    check(l.head_size_v > 0, l, "head_size_v",
          fmt::format("is {}, expected a positive size", l.head_size_v));
    check(l.num_q_heads % l.num_kv_heads == 0, l, "num_q_heads",
          fmt::format("({}) is not a multiple of num_kv_heads ({}); each KV head serves a whole "
                      "group of query heads",
                      l.num_q_heads, l.num_kv_heads));
    check(l.kind != LayerKind::kMla || l.num_kv_heads == 1, l, "num_kv_heads",
          "must be 1 for an MLA layer (it caches one latent vector per token)");
    check(l.kind != LayerKind::kMla || l.head_size_v <= l.head_size, l, "head_size_v",
          "must not exceed head_size for an MLA layer (the value is part of the latent)");
    check(
        !l.indexer || l.kind == LayerKind::kMla, l, "indexer",
        "is set on a layer that is not 'mla'; a DSA indexer key cache is planned as an MLA-shaped "
        "layer");
    check(l.state.empty(), l, "state",
          "is given for an attention layer; only recurrent layers have state");
    kv_bytes_per_token(l);  // throws on overflow
  } else {
    check(l.num_q_heads >= 0 && l.num_kv_heads >= 0 && l.head_size >= 0 && l.head_size_v >= 0, l,
          "head counts", "must not be negative");
    check(!l.indexer, l, "indexer", "is set on a recurrent layer; only an 'mla' layer can be one");
    check(!l.state.empty(), l, "state", "is empty; a recurrent layer needs its state tensors");
    for (const auto& t : l.state) {
      check(!t.name.empty(), l, "state name", "is empty");
      check(!t.shape.empty(), l, fmt::format("state '{}' shape", t.name), "is empty");
      for (auto dim : t.shape) {
        check(dim > 0, l, fmt::format("state '{}' shape", t.name),
              fmt::format("has dimension {}, expected > 0", dim));
        // The model-file reader accepts no larger number; describing such a state would print a
        // file that cannot be read back.
        check(dim <= kMaxConfigInt, l, fmt::format("state '{}' shape", t.name),
              fmt::format("has dimension {}, larger than mixkv accepts ({}); check the sizes it "
                          "is made of",
                          dim, kMaxConfigInt));
      }
    }
    state_bytes(l);  // throws on overflow
  }
}

}  // namespace

std::string_view to_string(LayerKind kind) { return name_of(kLayerKinds, kind); }
std::string_view to_string(Owner owner) { return name_of(kOwners, owner); }
std::string_view to_string(DraftKind kind) { return name_of(kDraftKinds, kind); }
std::optional<LayerKind> parse_layer_kind(std::string_view text) {
  return value_of(kLayerKinds, text);
}
std::optional<Owner> parse_owner(std::string_view text) { return value_of(kOwners, text); }
std::optional<DraftKind> parse_draft_kind(std::string_view text) {
  return value_of(kDraftKinds, text);
}

bool is_recurrent(LayerKind kind) {
  return kind == LayerKind::kGdn || kind == LayerKind::kKda || kind == LayerKind::kMamba2 ||
         kind == LayerKind::kMamba1 || kind == LayerKind::kLightning;
}
bool is_attention(LayerKind kind) { return !is_recurrent(kind); }

std::int64_t kv_bytes_per_token(const LayerDesc& layer) {
  if (!is_attention(layer.kind)) return 0;
  const std::string what = fmt::format("KV bytes per token of layer {}", layer.name);
  if (layer.kind == LayerKind::kMla) return storage_bytes(layer.kv_dtype, layer.head_size);
  // K and V are stored as separate tensors, so each is rounded to whole bytes on its own.
  std::int64_t k =
      storage_bytes(layer.kv_dtype, checked_mul(layer.num_kv_heads, layer.head_size, what));
  std::int64_t v =
      storage_bytes(layer.kv_dtype, checked_mul(layer.num_kv_heads, layer.head_size_v, what));
  return checked_add(k, v, what);
}

std::int64_t state_bytes(const LayerDesc& layer) {
  const std::string what = fmt::format("state bytes of layer {}", layer.name);
  std::int64_t total = 0;
  for (const auto& tensor : layer.state) {
    std::int64_t elements = 1;
    for (auto dim : tensor.shape) elements = checked_mul(elements, dim, what);
    total = checked_add(total, storage_bytes(tensor.dtype, elements), what);
  }
  return total;
}

void validate(const ModelDesc& desc) {
  // Names first: every later message quotes them.
  const auto check_name = [&](std::string_view what, const std::string& name) {
    if (printable(name) != name) {
      throw_invalid(
          fmt::format("model {}: {} \"{}\" holds control characters; names must be "
                      "printable text",
                      printable(desc.model), what, printable(name)));
    }
  };
  check_name("model name", desc.model);
  if (desc.draft) check_name("draft name", *desc.draft);
  for (const auto& layer : desc.layers) {
    check_name("layer name", layer.name);
    for (const auto& t : layer.state)
      check_name(fmt::format("layer {} state name", layer.name), t.name);
  }
  if (desc.tp < 1 || desc.tp > kMaxTp) {
    throw_invalid(fmt::format("model {}: tp is {}, expected 1 to {}", desc.model, desc.tp, kMaxTp));
  }
  if (desc.num_spec_tokens < 0 || desc.num_spec_tokens > kMaxSpecTokens) {
    throw_invalid(
        fmt::format("model {}: num_spec_tokens is {}, expected 0 to {} (the bound of "
                    "--num-spec-tokens)",
                    desc.model, desc.num_spec_tokens, kMaxSpecTokens));
  }
  if (desc.layers.empty()) throw_invalid(fmt::format("model {}: it has no layers", desc.model));
  std::set<std::string> names;
  bool any_draft = false;
  for (const auto& layer : desc.layers) {
    validate_layer(layer);
    if (!names.insert(layer.name).second) {
      throw_invalid(fmt::format("model {}: layer name '{}' appears twice; names must be unique",
                                desc.model, layer.name));
    }
    any_draft = any_draft || layer.owner == Owner::kDraft;
  }
  const bool self_draft = desc.draft_info && desc.draft_info->kind == DraftKind::kSelf;
  if (!any_draft && desc.draft_info && !self_draft) {
    throw_invalid(fmt::format(
        "model {}: draft information is given but no layer is owned by the draft", desc.model));
  }
  if (self_draft) {
    // The shared layers are the target's own: it owns them all, and the drafter owns none.
    const auto target_layers =
        std::count_if(desc.layers.begin(), desc.layers.end(),
                      [](const auto& l) { return l.owner == Owner::kTarget; });
    const int shared = desc.draft_info->shared_target_layers;
    if (any_draft || shared < 1 || shared >= target_layers) {
      throw_invalid(fmt::format(
          "model {}: a self-speculative drafter shares the target's first {} layers and owns "
          "none; it needs 1 to {} shared layers (the target has {}) and no draft layer",
          desc.model, shared, target_layers - 1, target_layers));
    }
  } else if (desc.draft_info && desc.draft_info->shared_target_layers != 0) {
    throw_invalid(
        fmt::format("model {}: shared_target_layers is for a self drafter only", desc.model));
  }
}

}  // namespace mixkv::model
