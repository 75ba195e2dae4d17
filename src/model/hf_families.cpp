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
  out.mtp_steps = num_mtp;
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

// Mamba2 keeps its SSM state in float32 unless the config says otherwise: HF's Mamba2 mixers, vLLM
// and TensorRT-LLM all do, since the recurrence accumulates over the whole context.
std::optional<DType> read_mamba2_ssm_dtype(const ConfigReader& c) {
  for (std::string_view key : {"mamba_ssm_cache_dtype", "mamba_ssm_dtype"}) {
    if (c.has(key)) return read_ssm_dtype(c);
  }
  return DType::kFloat32;
}

// Nemotron-H block layout as one character per block (M = Mamba2, * = attention, - = MLP, E = MoE),
// from `pattern_key` (a string) or `list_key` (HF's newer list form, with legacy or new names).
std::string nemotron_blocks(const ConfigReader& c, std::string_view pattern_key,
                            std::string_view list_key) {
  if (c.has(pattern_key)) return c.string(pattern_key);
  if (!c.has(list_key)) return "";
  static const std::map<std::string, char, std::less<>> kNames = {
      {"mamba", 'M'},     {"linear_attention", 'M'},
      {"attention", '*'}, {"full_attention", '*'},
      {"mlp", '-'},       {"moe", 'E'}};
  std::string out;
  const auto types = c.string_list(list_key);
  for (std::size_t i = 0; i < types.size(); ++i) {
    auto it = kNames.find(types[i]);
    if (it == kNames.end()) {
      c.fail(list_key, fmt::format("has unknown block type '{}' at position {}; use mamba, "
                                   "attention, mlp or moe (or linear_attention, full_attention)",
                                   types[i], i));
    }
    out += it->second;
  }
  return out;
}

// Nemotron-H: one character per block of hybrid_override_pattern (or one entry of
// layers_block_type): M = Mamba2, * = attention, - = MLP, E = MoE (the last two hold no cache).
// MTP: num_nextn_predict_layers steps, each the blocks of mtp_hybrid_override_pattern (or
// mtp_layers_block_type; HF's default is attention + MoE), numbered after the decoder's.
FamilyLayers describe_nemotron_h(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_mamba2_ssm_dtype(c);
  const std::string pattern = nemotron_blocks(c, "hybrid_override_pattern", "layers_block_type");
  if (pattern.empty()) {
    c.fail("hybrid_override_pattern",
           "is missing (and so is layers_block_type); a nemotron_h config lists its blocks in one "
           "of them");
  }
  const std::string_view pattern_key =
      c.has("hybrid_override_pattern") ? "hybrid_override_pattern" : "layers_block_type";
  // HF derives the layer count from layers_block_type; an older config also states it.
  const std::int64_t num_layers = c.has("num_hidden_layers")
                                      ? c.positive_int("num_hidden_layers")
                                      : static_cast<std::int64_t>(pattern.size());
  if (static_cast<std::int64_t>(pattern.size()) != num_layers) {
    const bool text = pattern_key == "hybrid_override_pattern";
    c.fail(pattern_key, fmt::format("has {} {} but num_hidden_layers is {}; give one {} per layer",
                                    pattern.size(), text ? "characters" : "entries", num_layers,
                                    text ? "character" : "entry"));
  }
  out.num_hidden_layers = num_layers;
  out.block_pattern = pattern;
  std::optional<AttentionShape> shape;
  std::optional<Mamba2Params> mamba;
  auto add_block = [&](char block, int index, std::string_view key,
                       std::vector<LayerTemplate>& into) {
    switch (block) {
      case '*':
        if (!shape)
          shape = read_attention_shape(
              c, c.has("attention_head_dim") ? "attention_head_dim" : "head_dim");
        into.push_back(attention_layer(index, LayerKind::kFull, *shape, out.model_dtype));
        break;
      case 'M':
        if (!mamba) {
          mamba = Mamba2Params{c.positive_int("mamba_num_heads"), c.positive_int("mamba_head_dim"),
                               c.positive_int("ssm_state_size"), c.positive_int("n_groups"),
                               c.positive_int("conv_kernel")};
        }
        into.push_back(recurrent_layer(index, LayerKind::kMamba2, *mamba, out.model_dtype));
        break;
      case '-':
      case 'E':
        break;
      default:
        c.fail(key, fmt::format("has unknown character '{}' at layer {}; use M (Mamba2), * "
                                "(attention), - (MLP) or E (MoE)",
                                block, index));
    }
  };
  for (std::int64_t i = 0; i < num_layers; ++i) {
    add_block(pattern[i], static_cast<int>(i), pattern_key, out.layers);
  }
  const std::int64_t steps = mtp_layer_count(c);
  if (steps > 0) {
    std::string mtp = nemotron_blocks(c, "mtp_hybrid_override_pattern", "mtp_layers_block_type");
    if (mtp.empty()) mtp = "*E";  // HF NemotronHConfig's default mtp_layers_block_type
    const std::string_view mtp_key = c.has("mtp_hybrid_override_pattern")
                                         ? "mtp_hybrid_override_pattern"
                                         : "mtp_layers_block_type";
    for (std::int64_t j = 0; j < steps; ++j) {
      for (std::size_t b = 0; b < mtp.size(); ++b) {
        const auto before = out.mtp_layers.size();
        add_block(mtp[b],
                  static_cast<int>(num_layers + j * static_cast<std::int64_t>(mtp.size()) + b),
                  mtp_key, out.mtp_layers);
        if (out.mtp_layers.size() == before) continue;
        LayerTemplate& t = out.mtp_layers.back();
        t.desc.owner = Owner::kDraft;
        t.desc.name = fmt::format("mtp.layers.{}", out.mtp_layers.size() - 1);
      }
    }
    if (out.mtp_layers.empty()) {
      c.fail(mtp_key, fmt::format("('{}') holds no attention or Mamba block, so the MTP layers "
                                  "would have no cache and nothing to draft with",
                                  mtp));
    }
    out.mtp_steps = steps;
  }
  return out;
}

// Granite 4.0 hybrid: layer_types of "mamba" (Mamba2) and "attention"; the attention scale is
// the config's attention_multiplier.
FamilyLayers describe_granite_hybrid(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_mamba2_ssm_dtype(c);
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

// The key cache of a DeepSeek-V3.2 lightning indexer beside MLA layer `of`: per token one fp8 key
// of index_head_dim plus one float32 scale per 128 elements (vLLM's DeepseekV32IndexerCache sizes
// it as index_head_dim + index_head_dim / 128 * 4 bytes, 132 for V3.2), one "head" shared by the
// index_n_heads query heads. Its own layer spec, named "<of>.indexer", at the same layer index.
LayerTemplate indexer_layer(const ConfigReader& c, const LayerTemplate& of) {
  constexpr std::int64_t kQuantBlock = 128;  // vLLM's indexer fp8 quantisation block
  const std::int64_t dim = c.positive_int("index_head_dim");
  if (dim % kQuantBlock != 0) {
    c.fail("index_head_dim",
           fmt::format("({}) is not a multiple of {}, the block the indexer's fp8 keys are scaled "
                       "in; fix the value",
                       dim, kQuantBlock));
  }
  LayerTemplate t;
  t.desc.name = of.desc.name + ".indexer";
  t.desc.owner = of.desc.owner;
  t.desc.index = of.desc.index;
  t.desc.kind = LayerKind::kMla;
  t.desc.indexer = true;
  t.desc.num_q_heads = static_cast<int>(c.positive_int("index_n_heads"));
  t.desc.num_kv_heads = 1;
  t.desc.head_size = static_cast<int>(dim + dim / kQuantBlock * 4);
  t.desc.head_size_v = static_cast<int>(dim);
  t.desc.scale = 1.0 / std::sqrt(static_cast<double>(dim));
  t.desc.kv_dtype = DType::kFp8E4m3;
  return t;
}

// DeepSeek-V2/V3 and the families built on its layer (Kimi-K2, GLM-4.7-Flash): MLA in every
// layer, plus MTP layers. DeepSeek-V3.2 adds the DSA indexer's key cache to each of them.
FamilyLayers describe_deepseek(const ConfigReader& c, const ConfigReader& root, bool dsa) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  for (std::int64_t i = 0; i < num_layers; ++i) {
    out.layers.push_back(mla_layer(c, static_cast<int>(i), out.model_dtype));
    if (dsa) out.layers.push_back(indexer_layer(c, out.layers.back()));
  }
  add_mtp_layers(out, mtp_layer_count(c), mla_layer(c, 0, out.model_dtype));
  if (dsa) {
    std::vector<LayerTemplate> with_indexers;
    for (auto& t : out.mtp_layers) {
      with_indexers.push_back(t);
      with_indexers.push_back(indexer_layer(c, t));
    }
    out.mtp_layers = std::move(with_indexers);
  }
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

// Llama 4: chunked local attention (attention_chunk_size) on the RoPE layers and global attention
// on the NoPE ones. HF's Llama4TextConfig lists the RoPE layers in no_rope_layers (1 = RoPE), by
// default every layer but each no_rope_layer_interval-th, and derives layer_types from it.
FamilyLayers describe_llama4(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const AttentionShape shape = read_attention_shape(c);
  const bool chunked = c.has("attention_chunk_size");
  std::vector<std::int64_t> rope;
  if (c.has("no_rope_layers") && !c.raw("no_rope_layers").empty()) {
    rope = c.int_list("no_rope_layers");
    if (static_cast<std::int64_t>(rope.size()) != num_layers) {
      c.fail("no_rope_layers", fmt::format("has {} entries but num_hidden_layers is {}; give one "
                                           "per layer (1 = RoPE, chunked; 0 = NoPE, global)",
                                           rope.size(), num_layers));
    }
  } else {
    const std::int64_t interval = c.positive_int("no_rope_layer_interval");
    for (std::int64_t i = 0; i < num_layers; ++i) rope.push_back((i + 1) % interval != 0 ? 1 : 0);
  }
  auto kinds = read_layer_kinds(c, num_layers, kStandardKinds, [&](std::int64_t i) {
    return chunked && rope[i] != 0 ? LayerKind::kChunked : LayerKind::kFull;
  });
  for (std::int64_t i = 0; i < num_layers; ++i) {
    LayerTemplate t = attention_layer(static_cast<int>(i), kinds[i], shape, out.model_dtype);
    if (kinds[i] == LayerKind::kChunked) t.desc.chunk = c.positive_int("attention_chunk_size");
    if (kinds[i] == LayerKind::kSliding) t.desc.window = c.positive_int("sliding_window");
    out.layers.push_back(std::move(t));
  }
  return out;
}

// Falcon-H1: every decoder layer runs attention and a Mamba2 mixer side by side, so each layer
// index holds two cache specs, "layers.N.attn" and "layers.N.mamba". The Mamba2 inner width is
// mamba_d_ssm (mamba_expand x hidden_size when null) and mamba_d_head "auto" divides it by the
// heads, as HF's FalconH1Config does.
FamilyLayers describe_falcon_h1(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_mamba2_ssm_dtype(c);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const AttentionShape shape = read_attention_shape(c);
  const std::int64_t heads = c.positive_int("mamba_n_heads");
  const std::int64_t inner = c.has("mamba_d_ssm")
                                 ? c.positive_int("mamba_d_ssm")
                                 : c.positive_int("mamba_expand") * c.positive_int("hidden_size");
  std::int64_t head_dim = 0;
  if (c.has("mamba_d_head") && c.raw("mamba_d_head").is_string()) {
    if (c.string("mamba_d_head") != "auto") {
      c.fail("mamba_d_head", "must be a positive integer or \"auto\"");
    }
    if (inner % heads != 0) {
      c.fail("mamba_n_heads", fmt::format("({}) does not divide the Mamba2 width ({}); with "
                                          "mamba_d_head \"auto\" each head takes an equal share",
                                          heads, inner));
    }
    head_dim = inner / heads;
  } else {
    head_dim = c.positive_int("mamba_d_head");
  }
  if (head_dim * heads != inner) {
    c.fail("mamba_d_head", fmt::format("({}) times mamba_n_heads ({}) is not the Mamba2 width ({}, "
                                       "mamba_d_ssm or mamba_expand x hidden_size)",
                                       head_dim, heads, inner));
  }
  const Mamba2Params mamba{heads, head_dim, c.positive_int("mamba_d_state"),
                           c.positive_int("mamba_n_groups"), c.positive_int("mamba_d_conv")};
  for (std::int64_t i = 0; i < num_layers; ++i) {
    LayerTemplate a =
        attention_layer(static_cast<int>(i), LayerKind::kFull, shape, out.model_dtype);
    a.desc.name = fmt::format("layers.{}.attn", i);
    out.layers.push_back(std::move(a));
    LayerTemplate m =
        recurrent_layer(static_cast<int>(i), LayerKind::kMamba2, mamba, out.model_dtype);
    m.desc.name = fmt::format("layers.{}.mamba", i);
    out.layers.push_back(std::move(m));
  }
  return out;
}

// MiniMax-Text-01 / M1 / M2: per layer, lightning (linear) attention with one head_dim x head_dim
// state per head, or softmax attention. attn_type_list (0 lightning, 1 softmax) or HF's
// layer_types says which; without either every layer is softmax attention, as vLLM reads it.
FamilyLayers describe_minimax(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  out.ssm_dtype = read_ssm_dtype(c);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const AttentionShape shape = read_attention_shape(c);
  std::vector<LayerKind> kinds;
  if (c.has("attn_type_list")) {
    const auto types = c.int_list("attn_type_list");
    if (static_cast<std::int64_t>(types.size()) != num_layers) {
      c.fail("attn_type_list", fmt::format("has {} entries but num_hidden_layers is {}; give one "
                                           "per layer (0 lightning, 1 softmax attention)",
                                           types.size(), num_layers));
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (types[i] > 1) {
        c.fail("attn_type_list", fmt::format("has {} at layer {}; use 0 (lightning attention) or "
                                             "1 (softmax attention)",
                                             types[i], i));
      }
      kinds.push_back(types[i] == 1 ? LayerKind::kFull : LayerKind::kLightning);
    }
  } else {
    const KindMap names = {{"full_attention", LayerKind::kFull},
                           {"linear_attention", LayerKind::kLightning}};
    kinds = read_layer_kinds(c, num_layers, names, [](std::int64_t) { return LayerKind::kFull; });
  }
  const LightningParams lightning{shape.q_heads, shape.head_size};
  for (std::int64_t i = 0; i < num_layers; ++i) {
    if (kinds[i] == LayerKind::kLightning) {
      out.layers.push_back(
          recurrent_layer(static_cast<int>(i), LayerKind::kLightning, lightning, out.model_dtype));
    } else {
      out.layers.push_back(
          attention_layer(static_cast<int>(i), LayerKind::kFull, shape, out.model_dtype));
    }
  }
  return out;
}

// HunYuan (Hunyuan-A13B, Hunyuan-Large, the dense Hunyuan-7B): GQA layers whose head size is
// head_dim or attention_head_dim. With cross-layer attention (use_cla) only every
// cla_share_factor-th layer computes K/V; the others read it (vLLM hunyuan_v1), so they hold no
// cache of their own.
FamilyLayers describe_hunyuan(const ConfigReader& c, const ConfigReader& root) {
  FamilyLayers out;
  out.model_dtype = read_model_dtype(c, root);
  const std::int64_t num_layers = c.positive_int("num_hidden_layers");
  const AttentionShape shape =
      read_attention_shape(c, c.has("head_dim") ? "head_dim" : "attention_head_dim");
  const bool cla = c.optional_bool("use_cla").value_or(false);
  const std::int64_t share = cla ? c.positive_int("cla_share_factor") : 1;
  for (std::int64_t i = 0; i < num_layers; ++i) {
    if (i % share != 0) continue;
    out.layers.push_back(
        attention_layer(static_cast<int>(i), LayerKind::kFull, shape, out.model_dtype));
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
    const auto deepseek = [](bool dsa) {
      return [dsa](const ConfigReader& c, const ConfigReader& root) {
        return describe_deepseek(c, root, dsa);
      };
    };
    (*t)["llama"] = plain(llama);
    (*t)["mistral"] = plain(mistral);
    (*t)["mixtral"] = plain(mistral);
    (*t)["ministral3"] = plain(mistral);  // Ministral 3 / Mistral 3 text_config
    (*t)["phi3"] = plain(mistral);        // Phi-3 / 3.5 / 4-mini: sliding_window on every layer
    (*t)["qwen2"] = plain(qwen);
    (*t)["qwen2_moe"] = plain(qwen);
    (*t)["qwen3"] = plain(qwen);
    (*t)["qwen3_moe"] = plain(qwen);
    (*t)["qwen3_vl"] = plain(qwen);
    (*t)["qwen3_vl_text"] = plain(qwen);
    (*t)["qwen3_vl_moe"] = plain(qwen);
    (*t)["qwen3_vl_moe_text"] = plain(qwen);
    (*t)["mimo"] = with_mtp(qwen);  // MiMo: Qwen2 layers plus num_nextn_predict_layers MTP layers
    (*t)["gemma2"] = plain(gemma2);
    (*t)["gemma3"] = plain(gemma3);
    (*t)["gemma3_text"] = plain(gemma3);
    (*t)["gpt_oss"] = plain(gpt_oss);
    (*t)["glm4_moe"] = with_mtp(llama);
    (*t)["llama4"] = describe_llama4;
    (*t)["llama4_text"] = describe_llama4;
    (*t)["hunyuan"] = describe_hunyuan;
    (*t)["hunyuan_v1_moe"] = describe_hunyuan;
    (*t)["hunyuan_v1_dense"] = describe_hunyuan;
    (*t)["minimax"] = describe_minimax;
    (*t)["minimax_m1"] = describe_minimax;
    (*t)["minimax_m2"] = describe_minimax;
    (*t)["qwen3_next"] = describe_qwen_gdn;
    (*t)["qwen3_5"] = describe_qwen_gdn;
    (*t)["qwen3_5_text"] = describe_qwen_gdn;
    (*t)["qwen3_5_moe"] = describe_qwen_gdn;
    (*t)["qwen3_5_moe_text"] = describe_qwen_gdn;
    (*t)["nemotron_h"] = describe_nemotron_h;
    (*t)["granitemoehybrid"] = describe_granite_hybrid;
    (*t)["falcon_h1"] = describe_falcon_h1;
    (*t)["jamba"] = describe_jamba;
    (*t)["deepseek_v2"] = deepseek(false);
    (*t)["deepseek_v3"] = deepseek(false);
    (*t)["kimi_k2"] = deepseek(false);        // Kimi-K2: DeepSeek-V3's layers under its own name
    (*t)["glm4_moe_lite"] = deepseek(false);  // GLM-4.7-Flash: MLA
    (*t)["deepseek_v32"] = deepseek(true);    // MLA plus the DSA indexer's key cache
    (*t)["kimi_linear"] = describe_kimi_linear;
    return t;
  }();
  return *table;
}

// HF configuration-class defaults of the keys that decide the cache, for families whose real
// configs rely on them. Sources: transformers' Gemma3TextConfig, Llama4TextConfig, Phi3Config,
// Ministral3Config, FalconH1Config and NemotronHConfig (main branch, read for this table). Only
// keys mixkv reads are listed; for Nemotron-H the attention shape is left to the config (the
// checkpoints state it, and the reference runner's tiny configs derive head_dim from hidden_size).
struct FamilyDefaults {
  std::string_view json;  // the defaults, as an object
  // (legacy key, key): HF's constructor moves a legacy spelling onto the key before defaults apply.
  std::vector<std::pair<std::string_view, std::string_view>> aliases;
};

const std::map<std::string, FamilyDefaults, std::less<>>& family_defaults() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, FamilyDefaults, std::less<>>;
    const FamilyDefaults gemma3{R"({"vocab_size": 262208, "hidden_size": 2304,
        "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
        "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6})",
                                {}};
    const FamilyDefaults llama4{R"({"vocab_size": 202048, "hidden_size": 5120,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_hidden_layers": 48,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 131072, "num_local_experts": 16, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1, "no_rope_layer_interval": 4,
        "attention_chunk_size": 8192})",
                                {}};
    (*t)["gemma3"] = gemma3;
    (*t)["gemma3_text"] = gemma3;
    (*t)["llama4"] = llama4;
    (*t)["llama4_text"] = llama4;
    (*t)["phi3"] = {R"({"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 4096})",
                    {}};
    (*t)["ministral3"] = {R"({"vocab_size": 131072, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 34, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 262144})",
                          {}};
    (*t)["falcon_h1"] = {R"({"vocab_size": 128000, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 8192, "mamba_d_ssm": 1024,
        "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256,
        "mamba_d_conv": 4, "mamba_expand": 2})",
                         {}};
    (*t)["nemotron_h"] = {R"({"ssm_state_size": 128, "mamba_num_heads": 128,
        "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4, "expand": 2,
        "mamba_ssm_cache_dtype": "float32", "mlp_hidden_act": "relu2"})",
                          {{"mamba_n_groups", "n_groups"},
                           {"mamba_d_conv", "conv_kernel"},
                           {"mamba_expand", "expand"}}};
    return t;
  }();
  return *table;
}

}  // namespace

void apply_family_defaults(nlohmann::json& doc) {
  if (!doc.is_object()) return;
  auto text = doc.find("text_config");
  nlohmann::json& lm = text != doc.end() && text->is_object() ? *text : doc;
  std::string model_type;
  for (const nlohmann::json* c : {&lm, &doc}) {
    auto it = c->find("model_type");
    if (model_type.empty() && it != c->end() && it->is_string())
      model_type = it->get<std::string>();
  }
  auto it = family_defaults().find(model_type);
  if (it == family_defaults().end()) return;
  for (const auto& [legacy, key] : it->second.aliases) {
    auto from = lm.find(legacy);
    if (from != lm.end() && !lm.contains(key)) lm[std::string(key)] = *from;
  }
  // A key the config gives, null included, is the config's: null keeps its meaning ("none").
  const nlohmann::json defaults = nlohmann::json::parse(it->second.json);
  for (const auto& [key, value] : defaults.items()) {
    if (!lm.contains(key)) lm[key] = value;
  }
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const auto& [name, fn] : families()) out.push_back(name);
  return out;
}

FamilyLayers describe_family(const ConfigReader& root, std::optional<std::string_view> family) {
  // Multimodal wrappers (Gemma 3, Qwen3.5) nest the language model under text_config.
  const std::optional<ConfigReader> text = root.optional_child("text_config");
  const ConfigReader& lm = text ? *text : root;
  std::string model_type = family                 ? std::string(*family)
                           : lm.has("model_type") ? lm.string("model_type")
                                                  : root.string("model_type");
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
    // Infinity and NaN fall through to the typed reader, which names them.
    if (lm.has(key) && lm.raw(key).is_number() && std::isfinite(lm.raw(key).get<double>()) &&
        lm.raw(key).get<double>() > kMaxLayers) {
      lm.fail(key, fmt::format("is {}, more layers than mixkv accepts ({}); fix the value",
                               lm.raw(key).dump(), kMaxLayers));
    }
  }
  FamilyLayers out = it->second(lm, root);
  out.model_type = model_type;
  // A family that derives its layer count from a layer list (Nemotron-H) has set it already.
  if (out.num_hidden_layers == 0) out.num_hidden_layers = lm.positive_int("num_hidden_layers");
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
