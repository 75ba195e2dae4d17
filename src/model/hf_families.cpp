// HuggingFace config.json -> per-layer templates, one function per model family. Facts about each
// family's fields come from the HF transformers configuration classes and the checkpoints listed in
// shared/design/model-facts.md.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config_reader.hpp"
#include "layer_template.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::model {
namespace {

using KindMap = std::map<std::string, LayerKind, std::less<>>;

DType read_model_dtype(const ConfigReader& lm, const ConfigReader& root) {
  for (const ConfigReader* c : {&lm, &root}) {
    for (std::string_view key : {"torch_dtype", "dtype"}) {
      if (!c->has(key)) continue;
      std::string text = c->string(key);
      auto dtype = parse_dtype(text);
      if (!dtype) {
        c->fail(key,
                fmt::format("is '{}', not a dtype mixkv knows (bfloat16, float16, float32)", text));
      }
      return *dtype;
    }
  }
  return DType::kBfloat16;  // HF's default for the families supported here
}

struct AttentionShape {
  std::int64_t q_heads, kv_heads, head_size;
};

// num_attention_heads / num_key_value_heads / head_dim, with HF's defaults (kv = q for MHA configs,
// head_dim = hidden_size / heads).
AttentionShape read_attention_shape(const ConfigReader& c,
                                    std::string_view head_dim_key = "head_dim") {
  AttentionShape s{};
  s.q_heads = c.positive_int("num_attention_heads");
  s.kv_heads = c.optional_positive_int("num_key_value_heads").value_or(s.q_heads);
  if (auto hd = c.optional_positive_int(head_dim_key)) {
    s.head_size = *hd;
  } else {
    std::int64_t hidden = c.positive_int("hidden_size");
    if (hidden % s.q_heads != 0) {
      c.fail("hidden_size", fmt::format("({}) is not a multiple of num_attention_heads ({}) and no "
                                        "'{}' is given; add {}",
                                        hidden, s.q_heads, head_dim_key, head_dim_key));
    }
    s.head_size = hidden / s.q_heads;
  }
  if (s.q_heads % s.kv_heads != 0) {
    c.fail("num_key_value_heads",
           fmt::format("({}) does not divide num_attention_heads ({}); grouped-"
                       "query attention needs whole query groups per KV head",
                       s.kv_heads, s.q_heads));
  }
  return s;
}

LayerTemplate attention_layer(int index, LayerKind kind, const AttentionShape& s, DType dtype) {
  LayerTemplate t;
  t.desc.name = fmt::format("layers.{}", index);
  t.desc.index = index;
  t.desc.kind = kind;
  t.desc.num_q_heads = static_cast<int>(s.q_heads);
  t.desc.num_kv_heads = static_cast<int>(s.kv_heads);
  t.desc.head_size = static_cast<int>(s.head_size);
  t.desc.head_size_v = static_cast<int>(s.head_size);
  t.desc.scale = 1.0 / std::sqrt(static_cast<double>(s.head_size));
  t.desc.kv_dtype = dtype;
  return t;
}

LayerTemplate recurrent_layer(int index, LayerKind kind, RecurrentParams params, DType dtype) {
  LayerTemplate t;
  t.desc.name = fmt::format("layers.{}", index);
  t.desc.index = index;
  t.desc.kind = kind;
  t.desc.kv_dtype = dtype;
  t.recurrent = params;
  return t;
}

// Layer kinds from the list under `key` (layer_types unless a family names it otherwise) when
// present, else from `fallback(i)`.
std::vector<LayerKind> read_layer_kinds(const ConfigReader& c, std::int64_t num_layers,
                                        const KindMap& names,
                                        const std::function<LayerKind(std::int64_t)>& fallback,
                                        std::string_view key = "layer_types") {
  std::vector<LayerKind> kinds;
  if (c.has(key)) {
    auto types = c.string_list(key);
    if (static_cast<std::int64_t>(types.size()) != num_layers) {
      c.fail(key, fmt::format("has {} entries but num_hidden_layers is {}; give one type "
                              "per layer",
                              types.size(), num_layers));
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
      auto it = names.find(types[i]);
      if (it == names.end()) {
        std::vector<std::string> known;
        for (const auto& [name, kind] : names) known.push_back(name);
        c.fail(key, fmt::format("has unknown type '{}' at layer {}; this family accepts {}",
                                types[i], i, fmt::join(known, ", ")));
      }
      kinds.push_back(it->second);
    }
    return kinds;
  }
  for (std::int64_t i = 0; i < num_layers; ++i) kinds.push_back(fallback(i));
  return kinds;
}

const KindMap kStandardKinds = {{"full_attention", LayerKind::kFull},
                                {"sliding_attention", LayerKind::kSliding},
                                {"chunked_attention", LayerKind::kChunked}};

// Attention-only families: llama, mistral, qwen2/3, gemma2/3, gpt_oss, glm4_moe. What differs is
// the default layer pattern, the scale, soft cap and sinks.
struct AttentionFamily {
  std::function<LayerKind(const ConfigReader&, std::int64_t)> default_kind;
  bool scale_from_query_pre_attn_scalar = false;
  bool soft_cap = false;
  bool sinks = false;
};

FamilyLayers describe_attention_family(const ConfigReader& c, const ConfigReader& root,
                                       const AttentionFamily& family) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const AttentionShape shape = read_attention_shape(c);
  auto kinds = read_layer_kinds(c, num_layers, kStandardKinds,
                                [&](std::int64_t i) { return family.default_kind(c, i); });

  std::optional<double> soft_cap;
  if (family.soft_cap) soft_cap = c.optional_positive_number("attn_logit_softcapping");
  std::optional<double> scale;
  if (family.scale_from_query_pre_attn_scalar && c.has("query_pre_attn_scalar")) {
    scale = 1.0 / std::sqrt(c.positive_number("query_pre_attn_scalar"));
  }
  for (std::int64_t i = 0; i < num_layers; ++i) {
    LayerTemplate t = attention_layer(static_cast<int>(i), kinds[i], shape, out.model_dtype);
    if (kinds[i] == LayerKind::kSliding) t.desc.window = c.positive_int("sliding_window");
    if (kinds[i] == LayerKind::kChunked) t.desc.chunk = c.positive_int("attention_chunk_size");
    t.desc.soft_cap = soft_cap;
    if (scale) t.desc.scale = *scale;
    t.desc.sinks = family.sinks;
    out.layers.push_back(std::move(t));
  }
  return out;
}

bool has_window(const ConfigReader& c) { return c.has("sliding_window"); }

// Qwen2/Qwen3: with use_sliding_window, layers from max_window_layers on use the window.
LayerKind qwen_default_kind(const ConfigReader& c, std::int64_t i) {
  bool use = c.optional_bool("use_sliding_window").value_or(false) && has_window(c);
  std::int64_t first = c.has("max_window_layers") ? c.non_negative_int("max_window_layers") : 0;
  return use && i >= first ? LayerKind::kSliding : LayerKind::kFull;
}

// MTP layers declared by the target, attached after its last layer (checkpoint index L + j).
void add_mtp_layers(FamilyLayers& out, std::int64_t num_mtp, const LayerTemplate& like) {
  const int base = static_cast<int>(out.layers.size() == 0 ? 0 : out.layers.back().desc.index + 1);
  for (std::int64_t j = 0; j < num_mtp; ++j) {
    LayerTemplate t = like;
    t.desc.owner = Owner::kDraft;
    t.desc.index = base + static_cast<int>(j);
    t.desc.name = fmt::format("mtp.layers.{}", j);
    out.mtp_layers.push_back(std::move(t));
  }
}

std::int64_t mtp_layer_count(const ConfigReader& c) {
  for (std::string_view key : {"num_nextn_predict_layers", "mtp_num_hidden_layers"}) {
    if (c.has(key)) return c.non_negative_int(key);
  }
  return 0;
}

// Qwen3-Next and Qwen3.5: Gated DeltaNet layers with a full-attention layer every
// full_attention_interval layers (at (i + 1) % interval == 0).
std::optional<DType> read_ssm_dtype(const ConfigReader& c);

FamilyLayers describe_qwen_gdn(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_ssm_dtype(c);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const AttentionShape shape = read_attention_shape(c);
  const GdnParams gdn{
      c.positive_int("linear_num_key_heads"), c.positive_int("linear_num_value_heads"),
      c.positive_int("linear_key_head_dim"), c.positive_int("linear_value_head_dim"),
      c.positive_int("linear_conv_kernel_dim")};
  const KindMap names = {{"full_attention", LayerKind::kFull},
                         {"linear_attention", LayerKind::kGdn}};
  auto kinds = read_layer_kinds(c, num_layers, names, [&](std::int64_t i) {
    std::int64_t interval = c.positive_int("full_attention_interval");
    return (i + 1) % interval == 0 ? LayerKind::kFull : LayerKind::kGdn;
  });
  for (std::int64_t i = 0; i < num_layers; ++i) {
    if (kinds[i] == LayerKind::kGdn) {
      out.layers.push_back(
          recurrent_layer(static_cast<int>(i), LayerKind::kGdn, gdn, out.model_dtype));
    } else {
      out.layers.push_back(
          attention_layer(static_cast<int>(i), LayerKind::kFull, shape, out.model_dtype));
    }
  }
  add_mtp_layers(out, mtp_layer_count(c),
                 attention_layer(0, LayerKind::kFull, shape, out.model_dtype));
  return out;
}

// The recurrent-state dtype a config asks for: mamba_ssm_cache_dtype (Mamba hybrids) or
// mamba_ssm_dtype (Qwen3.5 asks for float32 temporal state this way).
std::optional<DType> read_ssm_dtype(const ConfigReader& c) {
  for (std::string_view key : {"mamba_ssm_cache_dtype", "mamba_ssm_dtype"}) {
    if (!c.has(key)) continue;
    std::string text = c.string(key);
    if (text == "auto") return std::nullopt;
    auto dtype = parse_dtype(text);
    if (!dtype) c.fail(key, fmt::format("is '{}', not a known dtype", text));
    return dtype;
  }
  return std::nullopt;
}

// Nemotron-H: one character per block of hybrid_override_pattern: M = Mamba2, * = attention,
// - = MLP, E = MoE (the last two hold no cache).
FamilyLayers describe_nemotron_h(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_ssm_dtype(c);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const std::string pattern = c.string("hybrid_override_pattern");
  if (static_cast<std::int64_t>(pattern.size()) != num_layers) {
    c.fail("hybrid_override_pattern",
           fmt::format("has {} characters but num_hidden_layers is {}; give "
                       "one character per layer",
                       pattern.size(), num_layers));
  }
  std::optional<AttentionShape> shape;
  std::optional<Mamba2Params> mamba;
  for (std::int64_t i = 0; i < num_layers; ++i) {
    switch (pattern[i]) {
      case '*':
        if (!shape)
          shape = read_attention_shape(
              c, c.has("attention_head_dim") ? "attention_head_dim" : "head_dim");
        out.layers.push_back(
            attention_layer(static_cast<int>(i), LayerKind::kFull, *shape, out.model_dtype));
        break;
      case 'M':
        if (!mamba) {
          mamba = Mamba2Params{c.positive_int("mamba_num_heads"), c.positive_int("mamba_head_dim"),
                               c.positive_int("ssm_state_size"), c.positive_int("n_groups"),
                               c.positive_int("conv_kernel")};
        }
        out.layers.push_back(
            recurrent_layer(static_cast<int>(i), LayerKind::kMamba2, *mamba, out.model_dtype));
        break;
      case '-':
      case 'E':
        break;
      default:
        c.fail("hybrid_override_pattern",
               fmt::format(
                   "has unknown character '{}' at layer {}; use M (Mamba2), * (attention), - (MLP) "
                   "or E (MoE)",
                   pattern[i], i));
    }
  }
  return out;
}

// Granite 4.0 hybrid: layer_types of "mamba" (Mamba2) and "attention"; the attention scale is
// the config's attention_multiplier.
FamilyLayers describe_granite_hybrid(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_ssm_dtype(c);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const KindMap names = {{"attention", LayerKind::kFull}, {"mamba", LayerKind::kMamba2}};
  if (!c.has("layer_types"))
    c.fail("layer_types", "is missing; granitemoehybrid configs list one type per layer");
  auto kinds =
      read_layer_kinds(c, num_layers, names, [](std::int64_t) { return LayerKind::kFull; });
  std::optional<AttentionShape> shape;
  std::optional<Mamba2Params> mamba;
  for (std::int64_t i = 0; i < num_layers; ++i) {
    if (kinds[i] == LayerKind::kFull) {
      if (!shape) shape = read_attention_shape(c);
      LayerTemplate t =
          attention_layer(static_cast<int>(i), LayerKind::kFull, *shape, out.model_dtype);
      if (c.has("attention_multiplier")) t.desc.scale = c.positive_number("attention_multiplier");
      out.layers.push_back(std::move(t));
    } else {
      if (!mamba) {
        mamba = Mamba2Params{c.positive_int("mamba_n_heads"), c.positive_int("mamba_d_head"),
                             c.positive_int("mamba_d_state"), c.positive_int("mamba_n_groups"),
                             c.positive_int("mamba_d_conv")};
      }
      out.layers.push_back(
          recurrent_layer(static_cast<int>(i), LayerKind::kMamba2, *mamba, out.model_dtype));
    }
  }
  return out;
}

// Jamba: attention at i % attn_layer_period == attn_layer_offset, Mamba (v1) elsewhere.
FamilyLayers describe_jamba(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_ssm_dtype(c);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const KindMap names = {{"attention", LayerKind::kFull}, {"mamba", LayerKind::kMamba1}};
  std::vector<LayerKind> kinds;
  if (c.has("layers_block_type")) {
    kinds = read_layer_kinds(c, num_layers, names, nullptr, "layers_block_type");
  } else {
    std::int64_t period = c.positive_int("attn_layer_period");
    std::int64_t offset = c.non_negative_int("attn_layer_offset");
    if (offset >= period) {
      c.fail("attn_layer_offset",
             fmt::format("({}) must be smaller than attn_layer_period ({})", offset, period));
    }
    for (std::int64_t i = 0; i < num_layers; ++i) {
      kinds.push_back(i % period == offset ? LayerKind::kFull : LayerKind::kMamba1);
    }
  }
  std::optional<AttentionShape> shape;
  std::optional<Mamba1Params> mamba;
  for (std::int64_t i = 0; i < num_layers; ++i) {
    if (kinds[i] == LayerKind::kFull) {
      if (!shape) shape = read_attention_shape(c);
      out.layers.push_back(
          attention_layer(static_cast<int>(i), LayerKind::kFull, *shape, out.model_dtype));
    } else {
      if (!mamba) {
        std::int64_t expand = c.positive_int("mamba_expand");
        std::int64_t hidden = c.positive_int("hidden_size");
        mamba = Mamba1Params{expand * hidden, c.positive_int("mamba_d_state"),
                             c.positive_int("mamba_d_conv")};
      }
      out.layers.push_back(
          recurrent_layer(static_cast<int>(i), LayerKind::kMamba1, *mamba, out.model_dtype));
    }
  }
  return out;
}

// yarn's attention-temperature correction, as DeepSeek applies it to the softmax scale.
double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

LayerTemplate mla_layer(const ConfigReader& c, int index, DType dtype) {
  const std::int64_t q_heads = c.positive_int("num_attention_heads");
  const std::int64_t kv_lora = c.positive_int("kv_lora_rank");
  const std::int64_t rope = c.positive_int("qk_rope_head_dim");
  const std::int64_t nope = c.positive_int("qk_nope_head_dim");
  // The cached latent is kv_lora + rope wide; it must fit LayerDesc's int like any other size.
  if (kv_lora + rope > kMaxConfigInt) {
    c.fail("kv_lora_rank", fmt::format("({}) plus qk_rope_head_dim ({}) is larger than mixkv "
                                       "accepts ({}); fix the values",
                                       kv_lora, rope, kMaxConfigInt));
  }
  LayerTemplate t;
  t.desc.name = fmt::format("layers.{}", index);
  t.desc.index = index;
  t.desc.kind = LayerKind::kMla;
  t.desc.num_q_heads = static_cast<int>(q_heads);
  t.desc.num_kv_heads = 1;
  t.desc.head_size = static_cast<int>(kv_lora + rope);
  t.desc.head_size_v = static_cast<int>(kv_lora);
  double scale = 1.0 / std::sqrt(static_cast<double>(nope + rope));
  if (auto rs = c.optional_child("rope_scaling")) {
    if (rs->has("mscale_all_dim") && rs->has("factor")) {
      const auto& m = rs->raw("mscale_all_dim");
      double mscale_all_dim =
          m.is_boolean() ? (m.get<bool>() ? 1.0 : 0.0) : rs->positive_number("mscale_all_dim");
      double ms = yarn_mscale(rs->positive_number("factor"), mscale_all_dim);
      scale *= ms * ms;
    }
  }
  t.desc.scale = scale;
  t.desc.kv_dtype = dtype;
  return t;
}

FamilyLayers describe_deepseek(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  for (std::int64_t i = 0; i < num_layers; ++i)
    out.layers.push_back(mla_layer(c, static_cast<int>(i), out.model_dtype));
  add_mtp_layers(out, mtp_layer_count(c), mla_layer(c, 0, out.model_dtype));
  return out;
}

// Kimi-Linear: linear_attn_config lists the (1-based) MLA layers; the rest are KDA.
FamilyLayers describe_kimi_linear(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const ConfigReader lin = c.child("linear_attn_config");
  std::set<std::int64_t> full;
  for (std::int64_t one_based : lin.int_list("full_attn_layers")) {
    if (one_based < 1 || one_based > num_layers) {
      lin.fail("full_attn_layers",
               fmt::format("names layer {}, outside 1..{} (these indices are 1-based)", one_based,
                           num_layers));
    }
    full.insert(one_based - 1);
  }
  if (lin.has("kda_layers")) {
    for (std::int64_t one_based : lin.int_list("kda_layers")) {
      if (one_based < 1 || one_based > num_layers || full.contains(one_based - 1)) {
        lin.fail("kda_layers", fmt::format("names layer {}, which is outside 1..{} or also a full "
                                           "attention layer",
                                           one_based, num_layers));
      }
    }
  }
  const KdaParams kda{lin.positive_int("num_heads"), lin.positive_int("head_dim"),
                      lin.positive_int("short_conv_kernel_size")};
  for (std::int64_t i = 0; i < num_layers; ++i) {
    if (full.contains(i)) {
      out.layers.push_back(mla_layer(c, static_cast<int>(i), out.model_dtype));
    } else {
      out.layers.push_back(
          recurrent_layer(static_cast<int>(i), LayerKind::kKda, kda, out.model_dtype));
    }
  }
  return out;
}

using FamilyFn = std::function<FamilyLayers(const ConfigReader&, const ConfigReader&)>;

const std::map<std::string, FamilyFn, std::less<>>& families() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, FamilyFn, std::less<>>;
    auto plain = [](AttentionFamily f) {
      return [f](const ConfigReader& c, const ConfigReader& root) {
        return describe_attention_family(c, root, f);
      };
    };
    const AttentionFamily llama{[](const ConfigReader&, std::int64_t) { return LayerKind::kFull; }};
    const AttentionFamily mistral{[](const ConfigReader& c, std::int64_t) {
      return has_window(c) ? LayerKind::kSliding : LayerKind::kFull;
    }};
    const AttentionFamily qwen{qwen_default_kind};
    // Gemma 2 and gpt-oss alternate, sliding on even layers (when a window is configured).
    const auto alternate = [](const ConfigReader& c, std::int64_t i) {
      return i % 2 == 0 && has_window(c) ? LayerKind::kSliding : LayerKind::kFull;
    };
    const AttentionFamily gemma2{alternate, true, true, false};
    const AttentionFamily gemma3{
        [](const ConfigReader& c, std::int64_t i) {
          std::int64_t pattern = c.optional_positive_int("sliding_window_pattern").value_or(6);
          return (i + 1) % pattern == 0 || !has_window(c) ? LayerKind::kFull : LayerKind::kSliding;
        },
        true, true, false};
    const AttentionFamily gpt_oss{alternate, false, false, true};

    auto with_mtp = [](AttentionFamily f) {
      return [f](const ConfigReader& c, const ConfigReader& root) {
        FamilyLayers out = describe_attention_family(c, root, f);
        if (!out.layers.empty()) add_mtp_layers(out, mtp_layer_count(c), out.layers.front());
        if (!out.mtp_layers.empty()) {
          for (auto& t : out.mtp_layers) t.desc.kind = LayerKind::kFull, t.desc.window.reset();
        }
        return out;
      };
    };
    (*t)["llama"] = plain(llama);
    (*t)["mistral"] = plain(mistral);
    (*t)["mixtral"] = plain(mistral);
    (*t)["qwen2"] = plain(qwen);
    (*t)["qwen2_moe"] = plain(qwen);
    (*t)["qwen3"] = plain(qwen);
    (*t)["qwen3_moe"] = plain(qwen);
    (*t)["gemma2"] = plain(gemma2);
    (*t)["gemma3"] = plain(gemma3);
    (*t)["gemma3_text"] = plain(gemma3);
    (*t)["gpt_oss"] = plain(gpt_oss);
    (*t)["glm4_moe"] = with_mtp(llama);
    (*t)["qwen3_next"] = describe_qwen_gdn;
    (*t)["qwen3_5"] = describe_qwen_gdn;
    (*t)["qwen3_5_text"] = describe_qwen_gdn;
    (*t)["qwen3_5_moe"] = describe_qwen_gdn;
    (*t)["qwen3_5_moe_text"] = describe_qwen_gdn;
    (*t)["nemotron_h"] = describe_nemotron_h;
    (*t)["granitemoehybrid"] = describe_granite_hybrid;
    (*t)["jamba"] = describe_jamba;
    (*t)["deepseek_v2"] = describe_deepseek;
    (*t)["deepseek_v3"] = describe_deepseek;
    (*t)["kimi_linear"] = describe_kimi_linear;
    return t;
  }();
  return *table;
}

}  // namespace

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [name, fn] : families()) out.push_back(name);
  return out;
}

FamilyLayers describe_family(const ConfigReader& root) {
  // Multimodal wrappers (Gemma 3, Qwen3.5) nest the language model under text_config.
  const std::optional<ConfigReader> text = root.optional_child("text_config");
  const ConfigReader& lm = text ? *text : root;
  std::string model_type =
      lm.has("model_type") ? lm.string("model_type") : root.string("model_type");
  auto it = families().find(model_type);
  if (it == families().end() && text && root.has("model_type")) {
    model_type = root.string("model_type");
    it = families().find(model_type);
  }
  if (it == families().end()) {
    throw_unsupported(
        fmt::format("{}: model_type '{}' is not supported; supported: {} (or write a "
                    "native mixkv model file, see docs/model-file.md)",
                    root.origin(), model_type, fmt::join(supported_model_types(), ", ")));
  }
  // The family parsers build one entry per layer, so an absurd count would exhaust memory before
  // any other check could complain; refuse it first. Non-numbers get their typed error later.
  constexpr double kMaxLayers = 1 << 12;  // 30 times the deepest real model
  for (std::string_view key :
       {"num_hidden_layers", "num_nextn_predict_layers", "mtp_num_hidden_layers"}) {
    if (lm.has(key) && lm.raw(key).is_number() && lm.raw(key).get<double>() > kMaxLayers) {
      lm.fail(key, fmt::format("is {}, more layers than mixkv accepts ({}); fix the value",
                               lm.raw(key).dump(), kMaxLayers));
    }
  }
  FamilyLayers out = it->second(lm, root);
  out.model_type = model_type;
  out.num_hidden_layers = lm.positive_int("num_hidden_layers");
  // Multimodal wrappers may keep these beside text_config rather than in it.
  for (const ConfigReader* c : {&lm, &root}) {
    if (!out.hidden_size) out.hidden_size = c->optional_positive_int("hidden_size");
    if (!out.vocab_size) out.vocab_size = c->optional_positive_int("vocab_size");
    if (!out.max_position_embeddings) {
      out.max_position_embeddings = c->optional_positive_int("max_position_embeddings");
    }
  }
  // Kimi-Linear states its context length only as model_max_length.
  if (!out.max_position_embeddings) {
    out.max_position_embeddings = lm.optional_positive_int("model_max_length");
  }
  if (out.layers.empty()) {
    throw_invalid(
        fmt::format("{}: the config describes no layer that holds a cache", root.origin()));
  }
  return out;
}

}  // namespace mixkv::model
