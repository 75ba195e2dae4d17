#include "mixkv/transfer/layout_descriptor.hpp"

#include <map>
#include <set>

#include <fmt/format.h>
#include <xxhash.h>

#include "mixkv/core/error.hpp"
#include "mixkv/core/json_optional.hpp"

namespace mixkv::transfer {

const LayerLayout* LayoutDescriptor::find_layer(const std::string& name) const {
  for (const auto& l : layers) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

std::string model_identity(const model::ModelDesc& desc) {
  std::string text = desc.model + '\n' + desc.draft.value_or("") + '\n';
  for (const auto& l : desc.layers) {
    text += fmt::format("{}|{}|{}\n", l.name, model::to_string(l.owner), model::to_string(l.kind));
  }
  return fmt::format("{:016x}", XXH3_64bits(text.data(), text.size()));
}

LayoutDescriptor make_descriptor(const model::ModelDesc& desc, const plan::CachePlan& plan,
                                 const layout::Geometry& geometry,
                                 const DescriptorOptions& options) {
  if (options.tp_rank < 0 || options.tp_rank >= desc.tp) {
    throw_invalid(fmt::format("TP rank {} is outside the model's TP size {}: ranks are 0..{}",
                              options.tp_rank, desc.tp, desc.tp - 1));
  }
  LayoutDescriptor d;
  d.model_id = model_identity(desc);
  d.model = desc.model;
  d.draft = desc.draft;
  d.tp_size = desc.tp;
  d.tp_rank = options.tp_rank;
  d.policy = std::string(plan::to_string(plan.policy));
  for (const auto& t : geometry.tensors) d.tensor_bytes.push_back(t.bytes);
  std::map<std::string, const model::LayerDesc*> by_name;
  for (const auto& l : desc.layers) by_name[l.name] = &l;
  for (const auto& g : plan.groups) {
    GroupLayout gl{g.id,
                   std::string(plan::to_string(g.behaviour)),
                   std::string(model::to_string(g.kind)),
                   g.block_size,
                   !g.layers.empty(),
                   g.layers};
    for (const auto& name : g.layers) {
      if (by_name.at(name)->owner != model::Owner::kDraft) gl.draft = false;
    }
    d.groups.push_back(std::move(gl));
  }
  for (const auto& g : geometry.layers) {
    const model::LayerDesc& l = *by_name.at(g.layer);
    LayerLayout out;
    out.name = l.name;
    out.owner = std::string(model::to_string(l.owner));
    out.kind = std::string(model::to_string(l.kind));
    out.recurrent = g.recurrent;
    out.kv_cache_group = g.kv_cache_group;
    out.head_size = l.head_size;
    out.head_size_v = l.head_size_v;
    out.dtype = std::string(to_string(l.kv_dtype));
    out.window = l.window;
    out.chunk = l.chunk;
    if (!g.recurrent) {
      if (l.kind == model::LayerKind::kMla) {
        out.total_kv_heads = 1;
        out.num_kv_heads = 1;
      } else {
        int total = l.num_kv_heads * desc.tp;
        if (options.unsharded) {
          const model::LayerDesc* u = nullptr;
          for (const auto& ul : options.unsharded->layers) {
            if (ul.name == l.name) u = &ul;
          }
          if (!u) {
            throw_invalid(
                fmt::format("layer {} is missing from the unsharded model description", l.name));
          }
          total = u->num_kv_heads;
        }
        out.total_kv_heads = total;
        out.num_kv_heads = l.num_kv_heads;
        // Replicated heads (TP > heads): rank r holds head r * heads / tp.
        out.kv_head_begin =
            static_cast<int>(static_cast<std::int64_t>(options.tp_rank) * total / desc.tp);
        if (total >= desc.tp && total / desc.tp != l.num_kv_heads) {
          throw_invalid(fmt::format(
              "layer {}: {} KV heads per rank, but {} heads over TP {} give {} per rank", l.name,
              l.num_kv_heads, total, desc.tp, total / desc.tp));
        }
      }
    }
    out.tensor = g.tensor;
    out.offset = g.offset;
    out.block_tokens = g.block_tokens;
    out.kernel_tokens = g.kernel_tokens;
    out.kernel_pages_per_block = g.kernel_pages_per_block;
    out.kernel_page_stride = g.kernel_page_stride;
    out.k_token_bytes = g.k_token_bytes;
    out.v_token_bytes = g.v_token_bytes;
    out.v_offset = g.v_offset;
    out.state_bytes = g.state_bytes;
    for (const auto& s : l.state) {
      out.state.push_back({s.name, s.shape, std::string(to_string(s.dtype))});
    }
    d.layers.push_back(std::move(out));
  }
  return d;
}

nlohmann::json to_json(const LayoutDescriptor& d) {
  nlohmann::json j;
  j["version"] = d.version;
  j["model_id"] = d.model_id;
  j["model"] = d.model;
  j["draft"] = json_or_null(d.draft);
  j["tp_size"] = d.tp_size;
  j["tp_rank"] = d.tp_rank;
  j["policy"] = d.policy;
  j["tensor_bytes"] = d.tensor_bytes;
  j["groups"] = nlohmann::json::array();
  for (const auto& g : d.groups) {
    j["groups"].push_back({{"id", g.id},
                           {"behaviour", g.behaviour},
                           {"kind", g.kind},
                           {"block_size", g.block_size},
                           {"draft", g.draft},
                           {"layers", g.layers}});
  }
  j["layers"] = nlohmann::json::array();
  for (const auto& l : d.layers) {
    nlohmann::json lj{{"name", l.name},
                      {"owner", l.owner},
                      {"kind", l.kind},
                      {"recurrent", l.recurrent},
                      {"kv_cache_group", l.kv_cache_group},
                      {"head_size", l.head_size},
                      {"head_size_v", l.head_size_v},
                      {"dtype", l.dtype},
                      {"total_kv_heads", l.total_kv_heads},
                      {"kv_head_begin", l.kv_head_begin},
                      {"num_kv_heads", l.num_kv_heads},
                      {"window", json_or_null(l.window)},
                      {"chunk", json_or_null(l.chunk)},
                      {"tensor", l.tensor},
                      {"offset", l.offset},
                      {"block_tokens", l.block_tokens},
                      {"kernel_tokens", l.kernel_tokens},
                      {"kernel_pages_per_block", l.kernel_pages_per_block},
                      {"kernel_page_stride", l.kernel_page_stride},
                      {"k_token_bytes", l.k_token_bytes},
                      {"v_token_bytes", l.v_token_bytes},
                      {"v_offset", l.v_offset},
                      {"state_bytes", l.state_bytes}};
    lj["state"] = nlohmann::json::array();
    for (const auto& s : l.state) {
      lj["state"].push_back({{"name", s.name}, {"shape", s.shape}, {"dtype", s.dtype}});
    }
    j["layers"].push_back(std::move(lj));
  }
  return j;
}

namespace {

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw_invalid(fmt::format("layout descriptor: {} has no key '{}'", where, key));
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw_invalid(fmt::format("layout descriptor: {}.{} has the wrong type ({})", where, key,
                              j.at(key).type_name()));
  }
}

template <typename T>
std::optional<T> get_optional(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return get<T>(j, key, where);
}

}  // namespace

LayoutDescriptor descriptor_from_json(const nlohmann::json& j) {
  LayoutDescriptor d;
  d.version = get<int>(j, "version", "descriptor");
  if (d.version != kDescriptorVersion) {
    throw_invalid(fmt::format("layout descriptor version {} is not this build's version {}",
                              d.version, kDescriptorVersion));
  }
  d.model_id = get<std::string>(j, "model_id", "descriptor");
  d.model = get<std::string>(j, "model", "descriptor");
  d.draft = get_optional<std::string>(j, "draft", "descriptor");
  d.tp_size = get<int>(j, "tp_size", "descriptor");
  d.tp_rank = get<int>(j, "tp_rank", "descriptor");
  if (d.tp_size < 1 || d.tp_size > model::kMaxTp || d.tp_rank < 0 || d.tp_rank >= d.tp_size) {
    throw_invalid(fmt::format("layout descriptor: TP rank {} of size {} is out of range", d.tp_rank,
                              d.tp_size));
  }
  d.policy = get<std::string>(j, "policy", "descriptor");
  d.tensor_bytes = get<std::vector<std::int64_t>>(j, "tensor_bytes", "descriptor");
  for (const auto& gj : get<nlohmann::json>(j, "groups", "descriptor")) {
    GroupLayout g;
    g.id = get<int>(gj, "id", "group");
    const std::string w = fmt::format("group {}", g.id);
    g.behaviour = get<std::string>(gj, "behaviour", w);
    g.kind = get<std::string>(gj, "kind", w);
    g.block_size = get<std::int64_t>(gj, "block_size", w);
    g.draft = get<bool>(gj, "draft", w);
    g.layers = get<std::vector<std::string>>(gj, "layers", w);
    d.groups.push_back(std::move(g));
  }
  for (const auto& lj : get<nlohmann::json>(j, "layers", "descriptor")) {
    LayerLayout l;
    l.name = get<std::string>(lj, "name", "layer");
    const std::string w = "layer " + printable(l.name);
    l.owner = get<std::string>(lj, "owner", w);
    l.kind = get<std::string>(lj, "kind", w);
    l.recurrent = get<bool>(lj, "recurrent", w);
    l.kv_cache_group = get<int>(lj, "kv_cache_group", w);
    l.head_size = get<int>(lj, "head_size", w);
    l.head_size_v = get<int>(lj, "head_size_v", w);
    l.dtype = get<std::string>(lj, "dtype", w);
    l.total_kv_heads = get<int>(lj, "total_kv_heads", w);
    l.kv_head_begin = get<int>(lj, "kv_head_begin", w);
    l.num_kv_heads = get<int>(lj, "num_kv_heads", w);
    l.window = get_optional<std::int64_t>(lj, "window", w);
    l.chunk = get_optional<std::int64_t>(lj, "chunk", w);
    l.tensor = get<int>(lj, "tensor", w);
    l.offset = get<std::int64_t>(lj, "offset", w);
    l.block_tokens = get<std::int64_t>(lj, "block_tokens", w);
    l.kernel_tokens = get<std::int64_t>(lj, "kernel_tokens", w);
    l.kernel_pages_per_block = get<std::int64_t>(lj, "kernel_pages_per_block", w);
    l.kernel_page_stride = get<std::int64_t>(lj, "kernel_page_stride", w);
    l.k_token_bytes = get<std::int64_t>(lj, "k_token_bytes", w);
    l.v_token_bytes = get<std::int64_t>(lj, "v_token_bytes", w);
    l.v_offset = get<std::int64_t>(lj, "v_offset", w);
    l.state_bytes = get<std::int64_t>(lj, "state_bytes", w);
    for (const auto& sj : get<nlohmann::json>(lj, "state", w)) {
      l.state.push_back({get<std::string>(sj, "name", w + " state"),
                         get<std::vector<std::int64_t>>(sj, "shape", w + " state"),
                         get<std::string>(sj, "dtype", w + " state")});
    }
    // Every number later used as a byte offset or count is checked here, once, so a peer's
    // descriptor cannot make the transfer read outside a tensor.
    const bool bad_tensor =
        l.tensor < 0 || static_cast<std::size_t>(l.tensor) >= d.tensor_bytes.size();
    const bool bad_numbers =
        l.offset < 0 || l.block_tokens < 0 || l.kernel_tokens < 0 || l.kernel_pages_per_block < 1 ||
        l.kernel_page_stride < 0 || l.k_token_bytes < 0 || l.v_token_bytes < 0 || l.v_offset < 0 ||
        l.state_bytes < 0 || l.num_kv_heads < 0 || l.total_kv_heads < 0 || l.kv_head_begin < 0 ||
        l.kv_head_begin + l.num_kv_heads > l.total_kv_heads ||
        (!l.recurrent &&
         (l.kernel_tokens == 0 || l.block_tokens != l.kernel_tokens * l.kernel_pages_per_block));
    if (bad_tensor || bad_numbers) {
      throw_invalid(fmt::format("layout descriptor: {} has an inconsistent geometry", w));
    }
    d.layers.push_back(std::move(l));
  }
  return d;
}

namespace {

[[noreturn]] void refuse(const std::string& field, const std::string& prefill,
                         const std::string& decode, const std::string& why) {
  throw_invalid(fmt::format("KV transfer refused: {} differs: prefill side {}, decode side {} ({})",
                            field, prefill, decode, why));
}

std::string opt(const std::optional<std::int64_t>& v) {
  return v ? std::to_string(*v) : std::string("none");
}

}  // namespace

Reconciliation reconcile(const LayoutDescriptor& p, const LayoutDescriptor& d) {
  Reconciliation r;
  if (p.version != d.version) {
    refuse("descriptor version", std::to_string(p.version), std::to_string(d.version),
           "both sides must run the same mixkv transfer protocol");
  }
  if (p.model_id != d.model_id) {
    refuse("model_id",
           fmt::format("{} ({}{})", p.model_id, p.model, p.draft ? " + " + *p.draft : ""),
           fmt::format("{} ({}{})", d.model_id, d.model, d.draft ? " + " + *d.draft : ""),
           "both sides must serve the same target and drafter");
  }
  if (p.layers.size() != d.layers.size()) {
    refuse("number of layers", std::to_string(p.layers.size()), std::to_string(d.layers.size()),
           "the same model has the same layers");
  }
  if (p.tp_size != d.tp_size) {
    for (const auto& pl : p.layers) {
      if (pl.recurrent) {
        refuse("tp_size", std::to_string(p.tp_size), std::to_string(d.tp_size),
               "recurrent states are not sliced across TP ranks (layer " + pl.name +
                   "): serve both sides at one TP size");
      }
    }
  }
  for (const auto& pl : p.layers) {
    const LayerLayout* dl = d.find_layer(pl.name);
    if (!dl) refuse("layer " + pl.name, "present", "missing", "the same model has the same layers");
    const std::string at = "layer " + pl.name + " ";
    auto same = [&](const char* field, const auto& a, const auto& b, const char* why) {
      if (a != b) refuse(at + field, fmt::format("{}", a), fmt::format("{}", b), why);
    };
    same("kind", pl.kind, dl->kind, "a layer's kind decides what its pages hold");
    same("dtype", pl.dtype, dl->dtype, "pages are moved as bytes, not converted");
    same("head_size", pl.head_size, dl->head_size, "a token's K/V width must match");
    same("head_size_v", pl.head_size_v, dl->head_size_v, "a token's V width must match");
    same("total_kv_heads", pl.total_kv_heads, dl->total_kv_heads,
         "the same model has the same heads");
    if (pl.window != dl->window) {
      refuse(at + "window", opt(pl.window), opt(dl->window), "the KV kept per request differs");
    }
    if (pl.chunk != dl->chunk) {
      refuse(at + "chunk", opt(pl.chunk), opt(dl->chunk), "the KV kept per request differs");
    }
    if (pl.recurrent) {
      same("state_bytes", pl.state_bytes, dl->state_bytes, "a recurrent state is moved whole");
      if (pl.state != dl->state) {
        refuse(at + "state tensors", "other shapes/dtypes", "other shapes/dtypes",
               "the conv and SSM layouts must match");
      }
      continue;
    }
    if (pl.num_kv_heads > 0 && pl.k_token_bytes % pl.num_kv_heads != 0) {
      throw_invalid(fmt::format("layer {}: {} K bytes per token do not split into {} heads",
                                pl.name, pl.k_token_bytes, pl.num_kv_heads));
    }
    const auto per_head = [](const LayerLayout& l, std::int64_t bytes) {
      return l.num_kv_heads > 0 ? bytes / l.num_kv_heads : 0;
    };
    same("K bytes per head", per_head(pl, pl.k_token_bytes), per_head(*dl, dl->k_token_bytes),
         "a head's K width must match");
    same("V bytes per head", per_head(pl, pl.v_token_bytes), per_head(*dl, dl->v_token_bytes),
         "a head's V width must match");
    if (pl.block_tokens != dl->block_tokens || pl.kernel_tokens != dl->kernel_tokens ||
        pl.kernel_page_stride != dl->kernel_page_stride) {
      r.differences.push_back(fmt::format(
          "layer {}: block {} / kernel page {} tokens / stride {} B (prefill) vs {} / {} / {} B "
          "(decode): moved token run by token run",
          pl.name, pl.block_tokens, pl.kernel_tokens, pl.kernel_page_stride, dl->block_tokens,
          dl->kernel_tokens, dl->kernel_page_stride));
    }
  }
  if (p.tp_size != d.tp_size) {
    r.differences.push_back(
        fmt::format("TP {} (prefill) vs TP {} (decode): KV heads sliced", p.tp_size, d.tp_size));
  }
  if (p.policy != d.policy) {
    r.differences.push_back(fmt::format("policy {} (prefill) vs {} (decode)", p.policy, d.policy));
  }
  return r;
}

}  // namespace mixkv::transfer
