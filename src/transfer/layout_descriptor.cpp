#include "mixkv/transfer/layout_descriptor.hpp"

#include <limits>
#include <map>
#include <set>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include "mixkv/core/error.hpp"
#include "mixkv/core/json_int.hpp"
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

namespace {

// The layer of the unsharded description (TP 1) named like `l`, or null without one.
const model::LayerDesc* unsharded_layer(const DescriptorOptions& options,
                                        const model::LayerDesc& l) {
  if (!options.unsharded) return nullptr;
  for (const auto& ul : options.unsharded->layers) {
    if (ul.name == l.name) return &ul;
  }
  throw_invalid(fmt::format("layer {} is missing from the unsharded model description", l.name));
}

std::int64_t shape_dim(const model::StateTensor& t, std::size_t dim) {
  return dim < t.shape.size() ? t.shape[dim] : 0;
}

// How TP splits state tensor `t` of recurrent layer `l` (one rank's description; `whole` the same
// layer at TP 1, or null). The same rules as model::finalize_layer's, which shards the layers:
// heads and their conv channels split evenly; a Mamba2 layer's single B/C group is replicated.
// Leaves the split unknown (-1) where the shapes do not follow those rules.
void describe_split(const model::LayerDesc& l, const model::LayerDesc* whole, int tp,
                    const model::StateTensor& t, StateTensorLayout& out) {
  using model::LayerKind;
  const bool conv = t.name.ends_with("conv");
  std::vector<StateSegment> segments;
  if (!conv) {
    segments = {
        {shape_dim(t, 0), false}};  // temporal / ssm / recurrent / kv: heads (or inner) first
  } else if (l.kind == LayerKind::kGdn) {
    // The conv runs over q, k and v concatenated; each splits by its heads.
    const std::int64_t qk = std::int64_t{l.num_q_heads} * l.head_size;
    segments = {{qk, false}, {qk, false}, {std::int64_t{l.num_kv_heads} * l.head_size_v, false}};
  } else if (l.kind == LayerKind::kMamba2) {
    // x (the heads), then B and C: n_groups x state each, split with the heads or, a single group,
    // replicated on every rank.
    const std::int64_t inner = std::int64_t{l.num_kv_heads} * l.head_size;
    const std::int64_t bc = (shape_dim(t, 1) - inner) / 2;
    bool replicated = false;
    if (whole && tp > 1) {
      const std::int64_t whole_inner = std::int64_t{whole->num_kv_heads} * whole->head_size;
      for (const auto& wt : whole->state) {
        if (wt.name == t.name) replicated = (shape_dim(wt, 1) - whole_inner) / 2 == bc;
      }
    }
    segments = {{inner, false}, {bc, replicated}, {bc, replicated}};
  } else {
    segments = {{shape_dim(t, 1), false}};  // KDA's q/k/v convs, Mamba1's: one run of channels
  }
  const int dim = conv ? 1 : 0;
  std::int64_t sum = 0;
  for (const auto& s : segments) {
    if (s.size <= 0) return;
    sum += s.size;
  }
  if (t.shape.size() <= static_cast<std::size_t>(dim) ||
      sum != t.shape[static_cast<std::size_t>(dim)])
    return;
  out.split_dim = dim;
  out.segments = std::move(segments);
}

}  // namespace

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
        if (const model::LayerDesc* u = unsharded_layer(options, l)) total = u->num_kv_heads;
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
    out.kv_layout = g.kv_layout;
    out.state_bytes = g.state_bytes;
    const model::LayerDesc* whole = l.state.empty() ? nullptr : unsharded_layer(options, l);
    for (const auto& s : l.state) {
      StateTensorLayout t;
      t.name = s.name;
      t.shape = s.shape;
      t.dtype = std::string(to_string(s.dtype));
      describe_split(l, whole, desc.tp, s, t);
      out.state.push_back(std::move(t));
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
                      {"kv_layout", attn::to_string(l.kv_layout)},
                      {"state_bytes", l.state_bytes}};
    lj["state"] = nlohmann::json::array();
    for (const auto& s : l.state) {
      nlohmann::json segments = nlohmann::json::array();
      for (const auto& g : s.segments) {
        segments.push_back({{"size", g.size}, {"replicated", g.replicated}});
      }
      lj["state"].push_back({{"name", s.name},
                             {"shape", s.shape},
                             {"dtype", s.dtype},
                             {"split_dim", s.split_dim},
                             {"segments", std::move(segments)}});
    }
    j["layers"].push_back(std::move(lj));
  }
  return j;
}

namespace {

// `v` as exactly a T (a boolean, an integer that T holds, a string, an array of those; a JSON
// value: an array, whose elements the caller reads), or false: a peer's 4294967297 is not
// tensor 1, nor 1.5 a head size of 1.
template <typename T>
bool read_exactly(const nlohmann::json& v, T& out) {
  if constexpr (std::is_same_v<T, nlohmann::json>) {
    if (!v.is_array()) return false;
    out = v;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return false;
    out = v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const std::optional<std::int64_t> x = json_int64(v);
    if (!x || *x < std::numeric_limits<T>::min() || *x > std::numeric_limits<T>::max()) {
      return false;
    }
    out = static_cast<T>(*x);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return false;
    out = v.get<std::string>();
  } else {  // a std::vector
    if (!v.is_array()) return false;
    out.clear();
    for (const auto& e : v) {
      typename T::value_type x{};
      if (!read_exactly(e, x)) return false;
      out.push_back(std::move(x));
    }
  }
  return true;
}

template <typename T>
T get(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw_invalid(fmt::format("layout descriptor: {} has no key '{}'", where, key));
  }
  T out{};
  if (!read_exactly(j.at(key), out)) {
    std::string shown = j.at(key).dump();
    if (shown.size() > 40) shown = shown.substr(0, 40) + "...";
    throw_invalid(fmt::format("layout descriptor: {}.{} has the wrong type or range ({} {})", where,
                              key, j.at(key).type_name(), shown));
  }
  return out;
}

template <typename T>
std::optional<T> get_optional(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return get<T>(j, key, where);
}

StateTensorLayout state_from_json(const nlohmann::json& sj, const std::string& w) {
  StateTensorLayout t;
  t.name = get<std::string>(sj, "name", w);
  t.shape = get<std::vector<std::int64_t>>(sj, "shape", w);
  t.dtype = get<std::string>(sj, "dtype", w);
  t.split_dim = get<int>(sj, "split_dim", w);
  for (const auto& gj : get<nlohmann::json>(sj, "segments", w)) {
    t.segments.push_back({get<std::int64_t>(gj, "size", w + " segment"),
                          get<bool>(gj, "replicated", w + " segment")});
  }
  // Shapes and segments become offsets and lengths of runs: each must be in range here.
  bool bad = t.shape.empty() || !parse_dtype(t.dtype) || t.split_dim < -1 ||
             t.split_dim >= static_cast<int>(t.shape.size()) ||
             (t.split_dim < 0) != t.segments.empty();
  std::int64_t elements = 1;
  for (std::int64_t d : t.shape) {
    if (d <= 0 || d > (std::int64_t{1} << 40) / elements) bad = true;
    if (!bad) elements *= d;
  }
  std::int64_t sum = 0;
  for (const auto& g : t.segments) {
    // The sum stays at most 2^41: it must come to a dimension of at most 2^40.
    if (g.size <= 0 || g.size > (std::int64_t{1} << 40) || sum > (std::int64_t{1} << 40)) {
      bad = true;
      break;
    }
    sum += g.size;
  }
  if (!bad && t.split_dim >= 0 && sum != t.shape[static_cast<std::size_t>(t.split_dim)]) bad = true;
  if (bad)
    throw_invalid(fmt::format("layout descriptor: {} '{}' has an inconsistent shape", w, t.name));
  return t;
}

}  // namespace

std::int64_t element_count(const StateTensorLayout& t) {
  std::int64_t n = 1;
  for (std::int64_t d : t.shape) n *= d;
  return n;
}

std::int64_t state_tensor_bytes(const StateTensorLayout& t) {
  const std::optional<DType> dtype = parse_dtype(t.dtype);
  if (!dtype) throw_invalid(fmt::format("state tensor '{}': unknown dtype {}", t.name, t.dtype));
  return storage_bytes(*dtype, element_count(t));
}

std::int64_t sum_state_bytes(const LayerLayout& l) {
  std::int64_t bytes = 0;
  for (const auto& t : l.state) bytes += state_tensor_bytes(t);
  return bytes;
}

std::vector<std::int64_t> whole_shape(const StateTensorLayout& t, int tp) {
  std::vector<std::int64_t> shape = t.shape;
  if (t.split_dim < 0) return shape;
  std::int64_t dim = 0;
  for (const auto& g : t.segments) dim += g.replicated ? g.size : g.size * tp;
  shape[static_cast<std::size_t>(t.split_dim)] = dim;
  return shape;
}

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
  for (std::size_t t = 0; t < d.tensor_bytes.size(); ++t) {
    if (d.tensor_bytes[t] < 0 || d.tensor_bytes[t] > kMaxTensorBytes) {
      throw_invalid(fmt::format("layout descriptor: tensor {} has {} bytes (0 to 2^50)", t,
                                d.tensor_bytes[t]));
    }
  }
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
    const auto kv_layout = get<std::string>(lj, "kv_layout", w);
    if (kv_layout != "NHD" && kv_layout != "HND") {
      throw_invalid(fmt::format("layout descriptor: {} has kv_layout '{}'; it is NHD or HND", w,
                                printable(kv_layout)));
    }
    l.kv_layout = kv_layout == "HND" ? attn::KvLayout::kHND : attn::KvLayout::kNHD;
    l.state_bytes = get<std::int64_t>(lj, "state_bytes", w);
    for (const auto& sj : get<nlohmann::json>(lj, "state", w)) {
      l.state.push_back(state_from_json(sj, w + " state"));
    }
    if (l.recurrent && sum_state_bytes(l) != l.state_bytes) {
      throw_invalid(
          fmt::format("layout descriptor: {}'s state tensors do not add up to its {} "
                      "state bytes",
                      w, l.state_bytes));
    }
    // Every number later used as a byte offset or count is checked here, once, so a peer's
    // descriptor cannot make the transfer read outside a tensor.
    // In an order that overflows nothing: the sums and products of a peer's numbers are formed
    // only once they are known to be non-negative, and the product with overflow checked.
    const bool bad_tensor =
        l.tensor < 0 || static_cast<std::size_t>(l.tensor) >= d.tensor_bytes.size();
    // Byte counts and offsets at most a tensor's bytes, token counts at most 2^31, so that the
    // plan's sums of them stay far from overflow (its products of a peer's block ids are
    // checked there).
    const auto bytes_ok = [](std::int64_t v) { return v >= 0 && v <= kMaxTensorBytes; };
    const auto tokens_ok = [](std::int64_t v) { return v >= 1 && v <= kMaxBlockTokens; };
    const bool bad_numbers =
        !bytes_ok(l.offset) || !bytes_ok(l.kernel_page_stride) || !bytes_ok(l.k_token_bytes) ||
        !bytes_ok(l.v_token_bytes) || !bytes_ok(l.v_offset) || !bytes_ok(l.state_bytes) ||
        l.block_tokens < 0 || l.kernel_tokens < 0 || !tokens_ok(l.kernel_pages_per_block) ||
        l.num_kv_heads < 0 || l.total_kv_heads < 0 || l.kv_head_begin < 0 ||
        l.kv_head_begin > l.total_kv_heads || l.num_kv_heads > l.total_kv_heads - l.kv_head_begin ||
        (!l.recurrent &&
         (!tokens_ok(l.kernel_tokens) || !tokens_ok(l.block_tokens) || l.num_kv_heads < 1 ||
          l.block_tokens / l.kernel_pages_per_block != l.kernel_tokens ||
          l.block_tokens % l.kernel_pages_per_block != 0 || (l.window && *l.window < 1) ||
          (l.chunk && *l.chunk < 1)));
    // HND strides are kernel_tokens head pieces: a page's K (V) half must stay a tensor's size.
    const auto half_ok = [&](std::int64_t token_bytes) {
      return token_bytes == 0 || l.kernel_tokens <= kMaxTensorBytes / token_bytes;
    };
    const bool bad_half = !bad_numbers && !l.recurrent && l.kv_layout == attn::KvLayout::kHND &&
                          (!half_ok(l.k_token_bytes) || !half_ok(l.v_token_bytes));
    if (bad_tensor || bad_numbers || bad_half) {
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

std::string shape_text(const StateTensorLayout& t, int tp) {
  return fmt::format("[{}] {}", fmt::join(whole_shape(t, tp), ", "), t.dtype);
}

// A recurrent layer's states: the same tensors, whole shapes and dtypes on both sides; at one TP
// size the same per-rank layout (moved whole), across TP sizes a known split (moved sliced).
void reconcile_states(const LayerLayout& pl, int ptp, const LayerLayout& dl, int dtp) {
  const std::string at = "layer " + pl.name + " ";
  if (pl.state.size() != dl.state.size()) {
    refuse(at + "state tensors", std::to_string(pl.state.size()), std::to_string(dl.state.size()),
           "the same layer keeps the same state tensors");
  }
  for (std::size_t i = 0; i < pl.state.size(); ++i) {
    const StateTensorLayout& a = pl.state[i];
    const StateTensorLayout& b = dl.state[i];
    const std::string field = at + "state tensor '" + a.name + "'";
    if (a.name != b.name)
      refuse(at + "state tensor " + std::to_string(i), a.name, b.name,
             "the same layer keeps the same state tensors");
    if (ptp != dtp && (a.split_dim < 0 || b.split_dim < 0)) {
      refuse("tp_size", std::to_string(ptp), std::to_string(dtp),
             field + " has no known TP split: serve both sides at one TP size");
    }
    if (ptp == dtp ? a != b : whole_shape(a, ptp) != whole_shape(b, dtp) || a.dtype != b.dtype) {
      refuse(field, shape_text(a, ptp), shape_text(b, dtp),
             "the conv and SSM layouts of the whole model must match");
    }
    if (ptp == dtp) continue;
    bool same_split = a.split_dim == b.split_dim && a.segments.size() == b.segments.size();
    for (std::size_t s = 0; same_split && s < a.segments.size(); ++s) {
      const auto whole = [](const StateSegment& g, int tp) {
        return g.replicated ? g.size : g.size * tp;
      };
      same_split = whole(a.segments[s], ptp) == whole(b.segments[s], dtp) &&
                   (ptp == 1 || dtp == 1 || a.segments[s].replicated == b.segments[s].replicated);
    }
    if (!same_split) {
      refuse(field + " TP split",
             fmt::format("dimension {}, {} segments", a.split_dim, a.segments.size()),
             fmt::format("dimension {}, {} segments", b.split_dim, b.segments.size()),
             "both sides must shard the state by the same heads");
    }
  }
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
      reconcile_states(pl, p.tp_size, *dl, d.tp_size);
      continue;
    }
    for (const LayerLayout* l : {&pl, dl}) {
      if (l->num_kv_heads > 0 &&
          (l->k_token_bytes % l->num_kv_heads != 0 || l->v_token_bytes % l->num_kv_heads != 0)) {
        throw_invalid(
            fmt::format("layer {}: {} K / {} V bytes per token do not split into {} heads", pl.name,
                        l->k_token_bytes, l->v_token_bytes, l->num_kv_heads));
      }
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
        fmt::format("TP {} (prefill) vs TP {} (decode): KV heads and recurrent heads sliced",
                    p.tp_size, d.tp_size));
  }
  if (p.policy != d.policy) {
    r.differences.push_back(fmt::format("policy {} (prefill) vs {} (decode)", p.policy, d.policy));
  }
  return r;
}

}  // namespace mixkv::transfer
