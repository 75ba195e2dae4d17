#include "mixkv/engine/model_runner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "mixkv/core/error.hpp"
#include "model/config_reader.hpp"

namespace mixkv::engine {
namespace {

// The language-model part of a config: `text_config` when there is one (multimodal wrappers).
model::ConfigReader language_model(const model::ConfigReader& root) {
  if (auto text = root.optional_child("text_config")) return *text;
  return root;
}

std::string layer_prefix(int index) { return fmt::format("model.layers.{}.", index); }

// Y[t, o] = sum_i W[o, i] X[t, i] for `tokens` rows of X. Each dot product has one fixed order:
// eight interleaved partial sums (lane j takes i = j mod 8), folded pairwise at the end. That
// order depends only on `in`, never on how many tokens share the call, so a token's result is
// bit-identical alone or in any batch (this file is built with -ffp-contract=off so the compiler
// cannot fuse some multiply-adds and not others). Sharing each weight row across four tokens
// measured slower on the tiny models (their weights sit in L2; the loop is compute bound), so
// the cost is linear in tokens: see docs/engine.md on what speculation can gain on a CPU.
float dot(const float* row, const float* x, std::int64_t in) {
  constexpr std::int64_t kLanes = 8;
  const std::int64_t body = in / kLanes * kLanes;
  float lane[kLanes] = {};
  for (std::int64_t i = 0; i < body; i += kLanes) {
    for (std::int64_t j = 0; j < kLanes; ++j) lane[j] += row[i + j] * x[i + j];
  }
  for (std::int64_t i = body; i < in; ++i) lane[i - body] += row[i] * x[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

void matmul(const std::vector<float>& w, const float* x, std::int64_t tokens, std::int64_t in,
            std::int64_t out, float* y) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t o = 0; o < out; ++o) y[t * out + o] = dot(w.data() + o * in, x + t * in, in);
  }
}

void rms_norm(const float* x, const std::vector<float>& w, std::int64_t n, double eps, float* y) {
  float ss = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[static_cast<std::size_t>(i)];
}

// Rotary embedding, the rotate-half (GPT-NeoX / HF Llama) form: dimension i pairs with
// i + d/2 and turns by position * theta^(-2i/d).
void rope(float* x, std::int64_t heads, std::int64_t d, std::int64_t position, double theta) {
  const std::int64_t half = d / 2;
  for (std::int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) *
                         std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const auto c = static_cast<float>(std::cos(angle));
    const auto s = static_cast<float>(std::sin(angle));
    for (std::int64_t h = 0; h < heads; ++h) {
      float* v = x + h * d;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

// What nemotron_h and gemma2 configs add (TransformerConfig); refuses, naming the field, what the
// runner does not compute (biases, MoE blocks, other activations).
void read_family_fields(const model::ConfigReader& c, TransformerConfig& t) {
  const auto require_string = [&](std::string_view key, std::string_view want) {
    if (auto v = c.optional_string(key); v && *v != want) {
      throw_unsupported(
          fmt::format("{} is '{}'; the reference runner computes {} only", c.where(key), *v, want));
    }
  };
  if (t.model_type == "nemotron_h") {
    t.block_pattern = c.string("hybrid_override_pattern");
    t.rms_norm_eps = c.optional_positive_number("layer_norm_epsilon").value_or(t.rms_norm_eps);
    t.conv_bias = c.optional_bool("use_conv_bias").value_or(true);
    if (auto hd = c.optional_positive_int("attention_head_dim")) t.head_dim = *hd;
    for (std::string_view key : {"use_bias", "attention_bias", "mlp_bias"}) {
      if (c.optional_bool(key).value_or(false)) {
        throw_unsupported(fmt::format(
            "{} is true; the reference runner reads no projection biases (conv1d's aside)",
            c.where(key)));
      }
    }
    if (const auto e = t.block_pattern.find_first_not_of("M*-"); e != std::string::npos) {
      throw_unsupported(fmt::format(
          "{}: block {} is '{}'; the reference runner serves M (Mamba2), * (attention) and "
          "- (MLP) blocks, not mixture-of-experts ones",
          c.where("hybrid_override_pattern"), e, t.block_pattern[e]));
    }
    require_string("mamba_hidden_act", "silu");
    require_string("mlp_hidden_act", "relu2");
  } else if (t.model_type.starts_with("gemma3")) {
    throw_unsupported(fmt::format(
        "{} is '{}'; the reference runner computes Gemma 2's layer, not Gemma 3's (q/k norms, "
        "local RoPE base)",
        c.where("model_type"), t.model_type));
  } else if (t.model_type == "gemma2") {
    t.final_logit_softcap = c.optional_positive_number("final_logit_softcapping");
    require_string("hidden_activation", "gelu_pytorch_tanh");
  }
}

bool is_nemotron(const TransformerConfig& c) { return c.model_type == "nemotron_h"; }
bool is_gemma(const TransformerConfig& c) { return c.model_type == "gemma2"; }
std::string embed_name(const TransformerConfig& c) {
  return is_nemotron(c) ? "backbone.embeddings.weight" : "model.embed_tokens.weight";
}
std::string final_norm_name(const TransformerConfig& c) {
  return is_nemotron(c) ? "backbone.norm_f.weight" : "model.norm.weight";
}

}  // namespace

TransformerConfig read_transformer_config(const model::ModelSource& source) {
  const model::ConfigReader root(*source.doc, source.origin);
  const model::ConfigReader c = language_model(root);
  TransformerConfig t;
  t.hidden_size = c.positive_int("hidden_size");
  t.intermediate_size = c.positive_int("intermediate_size");
  t.vocab_size = c.positive_int("vocab_size");
  t.num_layers = c.positive_int("num_hidden_layers");
  t.num_q_heads = c.positive_int("num_attention_heads");
  t.num_kv_heads = c.optional_positive_int("num_key_value_heads").value_or(t.num_q_heads);
  t.head_dim = c.optional_positive_int("head_dim").value_or(t.hidden_size / t.num_q_heads);
  t.rms_norm_eps = c.optional_positive_number("rms_norm_eps").value_or(1e-5);
  t.rope_theta = c.optional_positive_number("rope_theta").value_or(10000.0);
  t.tie_word_embeddings = c.optional_bool("tie_word_embeddings").value_or(false);
  if (t.head_dim % 2 != 0) c.fail("head_dim", "must be even for rotary embeddings");
  t.model_type =
      c.optional_string("model_type").value_or(root.optional_string("model_type").value_or(""));
  read_family_fields(c, t);
  return t;
}

namespace {

weights::TensorMap random_tensors(
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& shapes,
    std::uint64_t seed) {
  weights::TensorMap out;
  std::mt19937_64 rng(seed);
  for (const auto& [name, shape] : shapes) {
    weights::Tensor t;
    t.shape = shape;
    t.values.resize(static_cast<std::size_t>(t.numel()));
    const bool norm = name.ends_with("norm.weight") || name.ends_with("norm_f.weight");
    const bool sinks = name.ends_with("sinks");
    // Uniform with the variance of Kaiming-style init (1/fan_in); embeddings of unit scale so
    // the tiny model's greedy continuation depends on its input.
    const double fan_in = static_cast<double>(shape.back());
    const double bound = name.find("embed") != std::string::npos ? 1.0 : std::sqrt(3.0 / fan_in);
    std::uniform_real_distribution<double> dist(-bound, bound);
    std::uniform_real_distribution<double> near_one(0.8, 1.2);
    std::uniform_real_distribution<double> sink(-1.0, 1.0);
    for (float& v : t.values) {
      v = static_cast<float>(norm ? near_one(rng) : sinks ? sink(rng) : dist(rng));
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

void add_attention_shapes(std::vector<std::pair<std::string, std::vector<std::int64_t>>>& out,
                          const std::string& p, const model::LayerDesc& l, std::int64_t h,
                          std::int64_t q, std::int64_t kv, bool qk_norm) {
  out.push_back({p + "self_attn.q_proj.weight", {q, h}});
  out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
  out.push_back({p + "self_attn.v_proj.weight", {std::int64_t{l.num_kv_heads} * l.head_size_v, h}});
  out.push_back({p + "self_attn.o_proj.weight", {h, std::int64_t{l.num_q_heads} * l.head_size_v}});
  if (l.sinks) out.push_back({p + "self_attn.sinks", {l.num_q_heads}});
  if (qk_norm) {
    out.push_back({p + "self_attn.q_norm.weight", {l.head_size}});
    out.push_back({p + "self_attn.k_norm.weight", {l.head_size}});
  }
}

// Weights some families add to a Llama-style layer.
struct LayerExtras {
  bool qk_norm = false;  // Qwen3 (DFlash drafters): per-head q_norm and k_norm
  bool gemma = false;    // Gemma 2: pre- and post-feed-forward norms
};

void add_layer_shapes(std::vector<std::pair<std::string, std::vector<std::int64_t>>>& out,
                      const std::string& p, const model::LayerDesc& l, std::int64_t h,
                      std::int64_t inter, int num_spec_tokens, LayerExtras extras = {}) {
  const std::int64_t q = std::int64_t{l.num_q_heads} * l.head_size;
  const std::int64_t kv = std::int64_t{l.num_kv_heads} * l.head_size;
  out.push_back({p + "input_layernorm.weight", {h}});
  if (l.kind == model::LayerKind::kGdn) {
    // Qwen3-Next's Gated DeltaNet (HF Qwen3NextGatedDeltaNet): q, k, v, z and b, a projections,
    // a depthwise conv over q, k, v, per-head gated RMSNorm, output projection.
    const kernels::GdnLayerSpec g = kernels::gdn_layer_spec(l, num_spec_tokens);
    const std::int64_t key = g.gdn.num_k_heads * g.gdn.k_dim;
    const std::int64_t value = g.gdn.num_v_heads * g.gdn.v_dim;
    out.push_back({p + "linear_attn.in_proj_qkvz.weight", {2 * key + 2 * value, h}});
    out.push_back({p + "linear_attn.in_proj_ba.weight", {2 * g.gdn.num_v_heads, h}});
    out.push_back({p + "linear_attn.conv1d.weight", {g.conv.channels, 1, g.conv.kernel}});
    out.push_back({p + "linear_attn.dt_bias", {g.gdn.num_v_heads}});
    out.push_back({p + "linear_attn.A_log", {g.gdn.num_v_heads}});
    out.push_back({p + "linear_attn.norm.weight", {g.gdn.v_dim}});
    out.push_back({p + "linear_attn.out_proj.weight", {h, value}});
  } else {
    add_attention_shapes(out, p, l, h, q, kv, extras.qk_norm);
  }
  out.push_back({p + "post_attention_layernorm.weight", {h}});
  if (extras.gemma) {
    out.push_back({p + "pre_feedforward_layernorm.weight", {h}});
    out.push_back({p + "post_feedforward_layernorm.weight", {h}});
  }
  out.push_back({p + "mlp.gate_proj.weight", {inter, h}});
  out.push_back({p + "mlp.up_proj.weight", {inter, h}});
  out.push_back({p + "mlp.down_proj.weight", {h, inter}});
}
// Nemotron-H's blocks (HF NemotronHBlock): backbone.layers.{i}.norm and one mixer, a Mamba2
// mixer (NemotronHMamba2Mixer), attention without RoPE, or an MLP (up, relu², down).
void add_nemotron_shapes(std::vector<std::pair<std::string, std::vector<std::int64_t>>>& out,
                         const TransformerConfig& c, const model::ModelDesc& desc) {
  const std::int64_t h = c.hidden_size;
  for (std::size_t i = 0; i < c.block_pattern.size(); ++i) {
    const std::string p = fmt::format("backbone.layers.{}.", i);
    const std::string name = fmt::format("layers.{}", i);
    const auto l = std::find_if(desc.layers.begin(), desc.layers.end(),
                                [&](const model::LayerDesc& d) { return d.name == name; });
    out.push_back({p + "norm.weight", {h}});
    const char kind = c.block_pattern[i];
    if (kind == '-') {
      out.push_back({p + "mixer.up_proj.weight", {c.intermediate_size, h}});
      out.push_back({p + "mixer.down_proj.weight", {h, c.intermediate_size}});
      continue;
    }
    if (l == desc.layers.end()) {
      throw_invalid(
          fmt::format("block {} ('{}') of hybrid_override_pattern has no layer {}", i, kind, name));
    }
    if (kind == '*') {
      const std::int64_t q = std::int64_t{l->num_q_heads} * l->head_size;
      const std::int64_t kv = std::int64_t{l->num_kv_heads} * l->head_size;
      out.push_back({p + "mixer.q_proj.weight", {q, h}});
      out.push_back({p + "mixer.k_proj.weight", {kv, h}});
      out.push_back(
          {p + "mixer.v_proj.weight", {std::int64_t{l->num_kv_heads} * l->head_size_v, h}});
      out.push_back(
          {p + "mixer.o_proj.weight", {h, std::int64_t{l->num_q_heads} * l->head_size_v}});
      continue;
    }
    const kernels::Mamba2LayerSpec m = kernels::mamba2_layer_spec(*l, desc.num_spec_tokens);
    const std::int64_t inner = m.ssm.heads * m.ssm.head_dim;
    const std::int64_t conv = m.conv.channels;  // x, B, C
    out.push_back({p + "mixer.in_proj.weight", {inner + conv + m.ssm.heads, h}});
    out.push_back({p + "mixer.conv1d.weight", {conv, 1, m.conv.kernel}});
    if (c.conv_bias) out.push_back({p + "mixer.conv1d.bias", {conv}});
    out.push_back({p + "mixer.dt_bias", {m.ssm.heads}});
    out.push_back({p + "mixer.A_log", {m.ssm.heads}});
    out.push_back({p + "mixer.D", {m.ssm.heads}});
    out.push_back({p + "mixer.norm.weight", {inner}});
    out.push_back({p + "mixer.out_proj.weight", {h, inner}});
  }
}

// Checkpoint prefix of a layer: "model.layers.3." for the target, "draft.layers.0." for a drafter.
std::string weight_prefix(const model::LayerDesc& l) {
  return l.owner == model::Owner::kTarget ? layer_prefix(l.index) : l.name + ".";
}

bool is_dflash(const model::ModelDesc& desc) {
  return desc.draft_info && desc.draft_info->kind == model::DraftKind::kDflash;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<std::int64_t>>> weight_shapes(
    const TransformerConfig& c, const model::ModelDesc& desc) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({embed_name(c), {c.vocab_size, c.hidden_size}});
  for (const model::LayerDesc& l : desc.layers) {
    if (l.owner == model::Owner::kTarget && !is_nemotron(c)) {
      add_layer_shapes(out, weight_prefix(l), l, c.hidden_size, c.intermediate_size,
                       desc.num_spec_tokens, {.gemma = is_gemma(c)});
    }
  }
  if (is_nemotron(c)) add_nemotron_shapes(out, c, desc);
  out.push_back({final_norm_name(c), {c.hidden_size}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return out;
}

weights::TensorMap generate_weights(const TransformerConfig& config, const model::ModelDesc& desc,
                                    std::uint64_t seed) {
  return random_tensors(weight_shapes(config, desc), seed);
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> draft_weight_shapes(
    const TransformerConfig& draft, const model::ModelDesc& desc) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  const std::int64_t h = draft.hidden_size;
  const bool mtp = desc.draft_info && desc.draft_info->kind == model::DraftKind::kMtp;
  const bool dflash = is_dflash(desc);
  const std::string p = mtp ? "mtp." : "draft.";
  // DFlash projects the concatenated outputs of its target layers; EAGLE and MTP a token's
  // embedding beside one hidden state.
  const auto fc_in =
      dflash ? static_cast<std::int64_t>(desc.draft_info->target_layer_ids.size()) * h : 2 * h;
  out.push_back({p + "fc.weight", {h, fc_in}});
  if (mtp) {
    out.push_back({p + "pre_fc_norm_embedding.weight", {h}});
    out.push_back({p + "pre_fc_norm_hidden.weight", {h}});
  }
  if (dflash) out.push_back({p + "hidden_norm.weight", {h}});
  for (const model::LayerDesc& l : desc.layers) {
    if (l.owner == model::Owner::kDraft) {
      add_layer_shapes(out, weight_prefix(l), l, h, draft.intermediate_size, desc.num_spec_tokens,
                       {.qk_norm = dflash});
    }
  }
  out.push_back({p + "norm.weight", {h}});
  return out;
}

weights::TensorMap generate_draft_weights(const TransformerConfig& draft,
                                          const model::ModelDesc& desc, std::uint64_t seed) {
  return random_tensors(draft_weight_shapes(draft, desc), seed);
}

weights::TensorMap as_draft_weights(weights::TensorMap checkpoint, const std::string& origin) {
  weights::TensorMap out;
  while (!checkpoint.empty()) {
    auto node = checkpoint.extract(checkpoint.begin());
    if (node.key().starts_with("draft.")) {
      throw_invalid(fmt::format(
          "{}: tensor {} already carries the draft. prefix; a drafter checkpoint names its "
          "tensors as the drafter model does (fc.weight, layers.0...)",
          origin, node.key()));
    }
    node.key() = "draft." + node.key();
    out.insert(std::move(node));
  }
  return out;
}

ModelRunner::ModelRunner(const model::ModelSource& config, const weights::TensorMap& weights,
                         const RunnerOptions& options)
    : config_(read_transformer_config(config)) {
  model::DescribeOptions dopt;
  std::optional<TransformerConfig> draft_config;
  // Recurrent layers' conv states keep num_spec_tokens extra rows, with or without a drafter.
  dopt.num_spec_tokens = options.num_spec_tokens;
  dopt.ssm_dtype = options.ssm_dtype;
  if (options.draft) {
    draft_config = read_transformer_config(*options.draft);
    // The drafter's cache in its own dtype (its config's torch_dtype), not the target's.
    const model::ConfigReader draft_root(*options.draft->doc, options.draft->origin);
    if (auto dtype = draft_root.optional_string("torch_dtype")) {
      dopt.draft_kv_dtype = parse_dtype(*dtype);
      if (!dopt.draft_kv_dtype) draft_root.fail("torch_dtype", "is not a dtype mixkv knows");
    }
    if (draft_config->hidden_size != config_.hidden_size ||
        draft_config->vocab_size != config_.vocab_size) {
      throw_invalid(fmt::format(
          "{}: the drafter's hidden_size {} and vocab_size {} must equal the target's ({} and {}): "
          "it reads the target's hidden states and shares its embedding and LM head",
          options.draft->origin, draft_config->hidden_size, draft_config->vocab_size,
          config_.hidden_size, config_.vocab_size));
    }
  }
  if (options.mtp) {
    if (options.draft) {
      throw_invalid(fmt::format("{}: give either a drafter model or the MTP layers, not both",
                                config.origin));
    }
    // The MTP layers are the target's: its config, dtype and weights.
    draft_config = config_;
    desc_ = model::describe_mtp(config, dopt);
  } else {
    desc_ = model::describe(config, options.draft, dopt);
  }
  desc_.num_spec_tokens = options.num_spec_tokens;
  if (desc_.draft_info && desc_.draft_info->kind != model::DraftKind::kEagle &&
      desc_.draft_info->kind != model::DraftKind::kMtp && !is_dflash(desc_)) {
    throw_unsupported(fmt::format(
        "{}: a {} drafter; the runner serves EAGLE-style chain drafters, MTP layers and DFlash "
        "block drafters",
        options.draft ? options.draft->origin : config.origin,
        model::to_string(desc_.draft_info->kind)));
  }
  if (is_dflash(desc_)) read_dflash_config(*options.draft, options.num_spec_tokens);
  for (const model::LayerDesc& l : desc_.layers) {
    const bool target = l.owner == model::Owner::kTarget;
    const std::string& origin = target || !options.draft ? config.origin : options.draft->origin;
    const bool gdn = l.kind == model::LayerKind::kGdn && target;
    const bool mamba = l.kind == model::LayerKind::kMamba2 && target && is_nemotron(config_);
    if (l.kind != model::LayerKind::kFull && l.kind != model::LayerKind::kSliding && !gdn &&
        !mamba) {
      throw_unsupported(
          fmt::format("{}: layer {} is {}; the reference runner serves full and sliding attention, "
                      "(target) Gated DeltaNet layers and the Mamba2 layers of nemotron_h",
                      origin, l.name, model::to_string(l.kind)));
    }
  }
  plan::PlanOptions popt;
  popt.policy = options.policy;
  popt.backend = backend::Backend::kCpu;
  popt.memory_bytes = options.memory_bytes;
  popt.block_size = options.block_size;
  popt.max_model_len = options.max_model_len;
  popt.request_len = std::min<std::int64_t>(
      512, options.max_model_len > 0 ? options.max_model_len
                                     : desc_.facts.max_position_embeddings.value_or(512));
  plan_ = plan::make_plan(desc_, popt);
  groups_ = attn::build_attention_groups(desc_, plan_);
  geometry_ = layout::make_geometry(desc_, plan_, groups_);
  for (const plan::Tensor& t : plan_.tensors) {
    tensors_.emplace_back(static_cast<std::size_t>(t.bytes), std::byte{0});
  }

  // Weights: each one present with the expected shape.
  std::map<std::string, std::vector<std::int64_t>, std::less<>> shapes;
  for (auto& [name, shape] : weight_shapes(config_, desc_)) shapes.emplace(name, shape);
  if (draft_config) {
    for (auto& [name, shape] : draft_weight_shapes(*draft_config, desc_))
      shapes.emplace(name, shape);
  }
  auto get = [&](const std::string& name) -> std::vector<float> {
    const std::vector<std::int64_t>& shape = shapes.at(name);
    const auto it = weights.find(name);
    if (it == weights.end()) {
      throw_invalid(fmt::format("{}: weight {} (shape [{}]) is missing from the checkpoint",
                                config.origin, name, fmt::join(shape, ", ")));
    }
    if (it->second.shape != shape) {
      throw_invalid(fmt::format("{}: weight {} has shape [{}], the config needs [{}]",
                                config.origin, name, fmt::join(it->second.shape, ", "),
                                fmt::join(shape, ", ")));
    }
    return it->second.values;
  };

  embed_ = get(embed_name(config_));
  final_norm_ = get(final_norm_name(config_));
  lm_head_ = config_.tie_word_embeddings ? embed_ : get("lm_head.weight");
  if (draft_config) {
    const std::string p = options.mtp ? "mtp." : "draft.";
    draft_fc_ = get(p + "fc.weight");
    draft_norm_ = get(p + "norm.weight");
    if (is_dflash(desc_)) dflash_hidden_norm_ = get(p + "hidden_norm.weight");
    draft_eps_ = draft_config->rms_norm_eps;
    if (options.mtp) {
      mtp_norm_embedding_ = get(p + "pre_fc_norm_embedding.weight");
      mtp_norm_hidden_ = get(p + "pre_fc_norm_hidden.weight");
    }
  }
  for (const model::LayerDesc& l : desc_.layers) {
    const bool target = l.owner == model::Owner::kTarget;
    if (target && is_nemotron(config_)) continue;  // load_nemotron_blocks, below
    const TransformerConfig& c = target ? config_ : *draft_config;
    Layer layer;
    layer.intermediate = c.intermediate_size;
    layer.rms_norm_eps = c.rms_norm_eps;
    layer.rope_theta = c.rope_theta;
    layer.name = l.name;
    layer.geometry = geometry_.layer(l.name);
    const std::string p = weight_prefix(l);
    layer.input_norm = get(p + "input_layernorm.weight");
    if (l.kind == model::LayerKind::kGdn) {
      layer.gdn = true;
      layer.gdn_spec = kernels::gdn_layer_spec(l, desc_.num_spec_tokens);
      layer.in_qkvz = get(p + "linear_attn.in_proj_qkvz.weight");
      layer.in_ba = get(p + "linear_attn.in_proj_ba.weight");
      layer.conv_w = get(p + "linear_attn.conv1d.weight");
      layer.dt_bias = get(p + "linear_attn.dt_bias");
      layer.a_neg = get(p + "linear_attn.A_log");
      for (float& a : layer.a_neg) a = -std::exp(a);
      layer.gdn_norm = get(p + "linear_attn.norm.weight");
      layer.out_proj = get(p + "linear_attn.out_proj.weight");
    } else {
      const auto& group = groups_.at(static_cast<std::size_t>(layer.geometry.attention_group));
      layer.spec = kernels::attention_spec(attn::kernel_params(group, l), l);
      layer.wq = get(p + "self_attn.q_proj.weight");
      layer.wk = get(p + "self_attn.k_proj.weight");
      layer.wv = get(p + "self_attn.v_proj.weight");
      layer.wo = get(p + "self_attn.o_proj.weight");
      if (l.sinks) layer.sinks = get(p + "self_attn.sinks");
      if (!target && is_dflash(desc_)) {
        layer.q_norm = get(p + "self_attn.q_norm.weight");
        layer.k_norm = get(p + "self_attn.k_norm.weight");
      }
    }
    layer.post_norm = get(p + "post_attention_layernorm.weight");
    if (target && is_gemma(config_)) {
      // Gemma 2: post_attention_layernorm normalises the attention output; the MLP reads
      // pre_feedforward_layernorm and its output goes through post_feedforward_layernorm.
      layer.mixer_out_norm = std::move(layer.post_norm);
      layer.post_norm = get(p + "pre_feedforward_layernorm.weight");
      layer.mlp_out_norm = get(p + "post_feedforward_layernorm.weight");
      layer.activation = Layer::Activation::kGeluTanhGated;
      // Gemma2RMSNorm multiplies by 1 + w (in float, as here).
      for (auto* w :
           {&layer.input_norm, &layer.post_norm, &layer.mixer_out_norm, &layer.mlp_out_norm}) {
        for (float& v : *w) v += 1.0f;
      }
    }
    layer.gate = get(p + "mlp.gate_proj.weight");
    layer.up = get(p + "mlp.up_proj.weight");
    layer.down = get(p + "mlp.down_proj.weight");
    (target ? layers_ : draft_layers_).push_back(std::move(layer));
  }
  if (is_nemotron(config_)) load_nemotron_blocks(get);
  if (is_gemma(config_)) {
    for (float& v : final_norm_) v += 1.0f;
    // Gemma2Model scales embeddings by sqrt(hidden_size) (HF rounds the factor to the model's
    // dtype; the runner computes in float32, where 8 for tiny-gemma is exact).
    embed_scale_ = std::sqrt(static_cast<float>(config_.hidden_size));
  }
}

const kernels::AttentionSpec& ModelRunner::attention_spec(std::string_view name) const {
  for (const Layer& l : layers_) {
    if (l.name == name && !l.gdn && !l.mamba && !l.mlp_only) return l.spec;
  }
  throw_invalid(fmt::format("attention_spec: {} is not an attention layer of the target", name));
}

// Nemotron-H's blocks in hybrid_override_pattern order (add_nemotron_shapes gives the names):
// each block is its norm, then one mixer or an MLP, then the residual.
void ModelRunner::load_nemotron_blocks(
    const std::function<std::vector<float>(const std::string&)>& get) {
  for (std::size_t i = 0; i < config_.block_pattern.size(); ++i) {
    const char kind = config_.block_pattern[i];
    const std::string p = fmt::format("backbone.layers.{}.", i);
    Layer layer;
    layer.name = fmt::format("layers.{}", i);
    layer.rms_norm_eps = config_.rms_norm_eps;
    layer.intermediate = config_.intermediate_size;
    layer.activation = Layer::Activation::kRelu2;
    layer.has_mlp = false;
    layer.rope = false;  // NemotronHAttention applies no positional embedding
    layer.input_norm = get(p + "norm.weight");
    if (kind == '-') {
      layer.mlp_only = true;
      layer.has_mlp = true;
      layer.post_norm = layer.input_norm;
      layer.up = get(p + "mixer.up_proj.weight");
      layer.down = get(p + "mixer.down_proj.weight");
      layers_.push_back(std::move(layer));
      continue;
    }
    const auto l = std::find_if(desc_.layers.begin(), desc_.layers.end(),
                                [&](const model::LayerDesc& d) { return d.name == layer.name; });
    layer.geometry = geometry_.layer(layer.name);
    if (kind == '*') {
      const auto& group = groups_.at(static_cast<std::size_t>(layer.geometry.attention_group));
      layer.spec = kernels::attention_spec(attn::kernel_params(group, *l), *l);
      layer.wq = get(p + "mixer.q_proj.weight");
      layer.wk = get(p + "mixer.k_proj.weight");
      layer.wv = get(p + "mixer.v_proj.weight");
      layer.wo = get(p + "mixer.o_proj.weight");
    } else {
      layer.mamba = true;
      layer.mamba_spec = kernels::mamba2_layer_spec(*l, desc_.num_spec_tokens);
      layer.in_proj = get(p + "mixer.in_proj.weight");
      layer.conv_w = get(p + "mixer.conv1d.weight");
      if (config_.conv_bias) layer.conv_bias = get(p + "mixer.conv1d.bias");
      layer.dt_bias = get(p + "mixer.dt_bias");
      layer.a_neg = get(p + "mixer.A_log");
      for (float& a : layer.a_neg) a = -std::exp(a);
      layer.d_skip = get(p + "mixer.D");
      layer.mamba_norm = get(p + "mixer.norm.weight");
      layer.out_proj = get(p + "mixer.out_proj.weight");
    }
    layers_.push_back(std::move(layer));
  }
}

// DFlash's own fields (z-lab's config: `block_size` and `dflash_config` with `target_layer_ids`
// and `mask_token_id`; describe has read the first two).
void ModelRunner::read_dflash_config(const model::ModelSource& draft, int num_spec_tokens) {
  const model::ConfigReader root(*draft.doc, draft.origin);
  const std::optional<model::ConfigReader> dflash = root.optional_child("dflash_config");
  const model::ConfigReader& fields = dflash && dflash->has("mask_token_id") ? *dflash : root;
  const model::DraftInfo& info = *desc_.draft_info;
  block_size_ = info.block_size.value_or(0);
  if (info.target_layer_ids.empty()) {
    (dflash ? *dflash : root)
        .fail("target_layer_ids",
              "is missing or empty; a DFlash drafter reads the hidden states of these target "
              "layers");
  }
  // describe() has checked that each names a target layer.
  dflash_layer_ids_ = info.target_layer_ids;
  if (!fields.has("mask_token_id")) {
    fields.fail("mask_token_id", "is missing; a DFlash drafter fills its block with this token");
  }
  const std::int64_t mask = fields.non_negative_int("mask_token_id");
  if (mask >= config_.vocab_size) {
    fields.fail("mask_token_id", fmt::format("is {}, outside the target's vocabulary of {}", mask,
                                             config_.vocab_size));
  }
  mask_token_ = static_cast<TokenId>(mask);
  if (num_spec_tokens > block_size_ - 1) {
    throw_invalid(fmt::format(
        "{}: {} speculative tokens do not fit a DFlash block of {} (the anchor and at most {} "
        "drafts); use --num-spec-tokens {} or less",
        draft.origin, num_spec_tokens, block_size_, block_size_ - 1, block_size_ - 1));
  }
}

namespace {

void check_feature_count(std::string_view what, std::int64_t tokens, std::int64_t width,
                         std::span<const float> features) {
  if (static_cast<std::int64_t>(features.size()) != tokens * width) {
    throw_invalid(fmt::format("{}: {} tokens need {} feature values, got {}", what, tokens,
                              tokens * width, features.size()));
  }
}

}  // namespace

std::span<const std::byte> ModelRunner::cache_tensor(int tensor) const {
  return tensors_.at(static_cast<std::size_t>(tensor));
}

void ModelRunner::check_batch(std::span<const SequenceInput> batch,
                              std::vector<std::int64_t>& positions, std::vector<float>& x) const {
  const std::int64_t h = config_.hidden_size;
  const std::int64_t vocab = config_.vocab_size;
  for (std::size_t r = 0; r < batch.size(); ++r) {
    const SequenceInput& s = batch[r];
    if (s.block_tables.size() != plan_.groups.size()) {
      throw_invalid(
          fmt::format("forward: request {} has {} block tables, the plan {} KV-cache "
                      "groups",
                      r, s.block_tables.size(), plan_.groups.size()));
    }
    if (s.start < 0) throw_invalid(fmt::format("forward: request {} starts at {}", r, s.start));
    for (std::size_t i = 0; i < s.tokens.size(); ++i) {
      const TokenId t = s.tokens[i];
      if (t < 0 || t >= vocab) {
        throw_invalid(
            fmt::format("forward: token id {} is outside the vocabulary of {}", t, vocab));
      }
      x.insert(x.end(), embed_.begin() + t * h, embed_.begin() + (t + 1) * h);
      positions.push_back(s.start + static_cast<std::int64_t>(i));
    }
  }
}

ForwardOutput ModelRunner::forward(std::span<const SequenceInput> batch) {
  std::vector<std::int64_t> positions;
  std::vector<float> x;
  check_batch(batch, positions, x);
  if (embed_scale_ != 1.0f) {
    for (float& v : x) v *= embed_scale_;
  }
  std::vector<float> captured;
  run_layers(layers_, batch, positions, x, dflash_layer_ids_, &captured);
  ForwardOutput out = head(std::move(x), final_norm_, config_.rms_norm_eps);
  out.layer_hidden = std::move(captured);
  return out;
}

std::int64_t ModelRunner::draft_feature_width() const {
  return has_block_drafter()
             ? static_cast<std::int64_t>(dflash_layer_ids_.size()) * config_.hidden_size
             : config_.hidden_size;
}

std::span<const float> ModelRunner::draft_features(const ForwardOutput& out) const {
  return has_block_drafter() ? out.layer_hidden : out.hidden;
}

void ModelRunner::draft_context(std::span<const SequenceInput> batch,
                                std::span<const float> features) {
  if (!has_block_drafter()) throw_invalid("draft_context: the runner has no DFlash drafter");
  std::vector<std::int64_t> positions;
  std::vector<float> unused;
  check_batch(batch, positions, unused);
  const std::int64_t h = config_.hidden_size;
  const std::int64_t width = draft_feature_width();
  const auto total = static_cast<std::int64_t>(positions.size());
  check_feature_count("draft_context", total, width, features);
  // The context features: fc over the chosen layers' states, then hidden_norm. Unlike block
  // tokens they enter each layer's k_proj and v_proj without the layer's input norm.
  std::vector<float> context(static_cast<std::size_t>(total * h));
  matmul(draft_fc_, features.data(), total, width, h, context.data());
  for (std::int64_t t = 0; t < total; ++t) {
    rms_norm(context.data() + t * h, dflash_hidden_norm_, h, draft_eps_, context.data() + t * h);
  }
  std::vector<float> k, v;
  for (const Layer& layer : draft_layers_) {
    project_kv(layer, context, positions, k, v);
    write_layer_kv(layer, batch, k, v);
  }
}

ForwardOutput ModelRunner::block_draft(std::span<const SequenceInput> batch) {
  if (!has_block_drafter()) throw_invalid("block_draft: the runner has no DFlash drafter");
  std::vector<std::int64_t> positions;
  std::vector<float> x;
  check_batch(batch, positions, x);
  for (std::size_t r = 0; r < batch.size(); ++r) {
    const auto n = static_cast<std::int64_t>(batch[r].tokens.size());
    if (n > block_size_) {
      throw_invalid(
          fmt::format("block_draft: request {} gives a block of {} tokens; the drafter's "
                      "block_size is {}",
                      r, n, block_size_));
    }
  }
  run_layers(draft_layers_, batch, positions, x);
  return head(std::move(x), draft_norm_, draft_eps_);
}

ForwardOutput ModelRunner::draft_forward(std::span<const SequenceInput> batch,
                                         std::span<const float> features) {
  if (!has_drafter() || has_block_drafter()) {
    throw_invalid(
        "draft_forward: the runner has no EAGLE-style or MTP drafter (a DFlash drafter runs "
        "through draft_context and block_draft)");
  }
  std::vector<std::int64_t> positions;
  std::vector<float> embedded;
  check_batch(batch, positions, embedded);
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(positions.size());
  check_feature_count("draft_forward", total, h, features);
  // EAGLE's input: [embedding of the token; hidden state that predicted it] projected to hidden.
  // MTP (DeepSeek-V3, Qwen3-Next) RMS-normalises each half first.
  std::vector<float> both(static_cast<std::size_t>(total * 2 * h));
  for (std::int64_t t = 0; t < total; ++t) {
    float* row = both.data() + t * 2 * h;
    std::copy_n(embedded.begin() + t * h, h, row);
    std::copy_n(features.begin() + t * h, h, row + h);
    if (!mtp_norm_embedding_.empty()) {
      rms_norm(row, mtp_norm_embedding_, h, draft_eps_, row);
      rms_norm(row + h, mtp_norm_hidden_, h, draft_eps_, row + h);
    }
  }
  std::vector<float> x(static_cast<std::size_t>(total * h));
  matmul(draft_fc_, both.data(), total, 2 * h, h, x.data());
  run_layers(draft_layers_, batch, positions, x);
  return head(std::move(x), draft_norm_, draft_eps_);
}

ForwardOutput ModelRunner::head(std::vector<float> x, const std::vector<float>& norm,
                                double eps) const {
  const std::int64_t h = config_.hidden_size;
  const std::int64_t vocab = config_.vocab_size;
  const auto total = static_cast<std::int64_t>(x.size()) / h;
  std::vector<float> normed(x.size());
  for (std::int64_t t = 0; t < total; ++t) {
    rms_norm(x.data() + t * h, norm, h, eps, normed.data() + t * h);
  }
  ForwardOutput out;
  out.logits.resize(static_cast<std::size_t>(total * vocab));
  matmul(lm_head_, normed.data(), total, h, vocab, out.logits.data());
  if (config_.final_logit_softcap) {
    const auto cap = static_cast<float>(*config_.final_logit_softcap);
    for (float& v : out.logits) v = std::tanh(v / cap) * cap;
  }
  out.hidden = std::move(x);
  return out;
}

namespace {

// The mixer's output `mixed` joins the residual stream (Gemma 2 normalises it first); then
// RMSNorm, the MLP (SwiGLU; Gemma 2's GELU-tanh gate; Nemotron-H's relu² without gate; none in a
// Nemotron-H mixer block), residual.
template <typename Layer>
void mlp(const Layer& layer, std::vector<float>& x, std::vector<float>& mixed,
         std::vector<float>& normed) {
  const auto h = static_cast<std::int64_t>(layer.input_norm.size());
  const std::int64_t inter = layer.intermediate;
  const auto total = static_cast<std::int64_t>(x.size()) / h;
  const double eps = layer.rms_norm_eps;
  for (std::int64_t t = 0; t < total; ++t) {
    float* xt = x.data() + t * h;
    float* mt = mixed.data() + t * h;
    if (!layer.mixer_out_norm.empty()) rms_norm(mt, layer.mixer_out_norm, h, eps, mt);
    for (std::int64_t i = 0; i < h; ++i) xt[i] += mt[i];
    if (layer.has_mlp) rms_norm(xt, layer.post_norm, h, eps, normed.data() + t * h);
  }
  if (!layer.has_mlp) return;
  using Act = typename Layer::Activation;
  std::vector<float> up(static_cast<std::size_t>(total * inter));
  matmul(layer.up, normed.data(), total, h, inter, up.data());
  if (layer.activation == Act::kRelu2) {
    for (float& u : up) u = u > 0.0f ? u * u : 0.0f;
  } else {
    std::vector<float> gate(up.size());
    matmul(layer.gate, normed.data(), total, h, inter, gate.data());
    for (std::size_t i = 0; i < gate.size(); ++i) {
      const float g = gate[i];
      if (layer.activation == Act::kGeluTanhGated) {
        // PyTorch's gelu(approximate="tanh").
        constexpr float kSqrt2OverPi = 0.7978845608028654f;
        up[i] *= 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
      } else {
        up[i] *= g / (1.0f + std::exp(-g));  // SiLU(gate) * up
      }
    }
  }
  matmul(layer.down, up.data(), total, inter, h, mixed.data());
  for (std::int64_t t = 0; t < total; ++t) {
    float* mt = mixed.data() + t * h;
    if (!layer.mlp_out_norm.empty()) rms_norm(mt, layer.mlp_out_norm, h, eps, mt);
  }
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += mixed[i];
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

std::vector<std::int64_t> block_ids(std::span<const cache::BlockId> table) {
  std::vector<std::int64_t> blocks(table.size());
  std::transform(table.begin(), table.end(), blocks.begin(),
                 [](cache::BlockId b) { return std::int64_t{b.value()}; });
  return blocks;
}

// RMSNorm of each `d`-wide head of `v` with the same weights (Qwen3's q_norm and k_norm).
void norm_heads(float* v, std::int64_t heads, std::int64_t d, const std::vector<float>& w,
                double eps) {
  for (std::int64_t hh = 0; hh < heads; ++hh) rms_norm(v + hh * d, w, d, eps, v + hh * d);
}

// PyTorch's softplus (threshold 20: the identity above it).
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

// Scales each `d`-wide head of `v` to unit L2 norm, as flash-linear-attention's l2norm
// (x / sqrt(sum x^2 + 1e-6)) that Qwen3-Next applies to q and k.
void l2_normalise(float* v, std::int64_t heads, std::int64_t d) {
  for (std::int64_t hh = 0; hh < heads; ++hh) {
    float* x = v + hh * d;
    float ss = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss + 1e-6f);
    for (std::int64_t i = 0; i < d; ++i) x[i] *= inv;
  }
}

}  // namespace

// The state discipline every recurrent layer shares. Per request: check its state blocks, copy
// a prefix hit's state into the live slot, zero the live state before position 0 (the block may
// hold an old request's). Per token, in batch order: `step(row, seq)` runs the layer's kernels
// on one token, reading the state after the previous token (table[0] for the first, or in a
// prefill) and storing this token's into table[i] (decode and verify steps, `checkpoints`) or
// back into table[0]. The state after the manager's snapshot position is copied into the
// snapshot block.
void ModelRunner::step_recurrent(
    const Layer& layer, std::span<const SequenceInput> batch,
    const std::function<void(std::int64_t, const kernels::StateSequence&)>& step) {
  const layout::LayerGeometry& geo = layer.geometry;
  std::span<std::byte> tensor = tensors_.at(static_cast<std::size_t>(geo.tensor));
  const auto group = static_cast<std::size_t>(geo.kv_cache_group);
  // The layer's state in block b (its tensors are one contiguous run there: docs/kernels.md).
  auto state_of = [&](cache::BlockId b) {
    const std::int64_t at = geo.offset + std::int64_t{b.value()} * geo.kernel_page_stride;
    if (b.is_null() || at < 0 || at + geo.state_bytes > static_cast<std::int64_t>(tensor.size())) {
      throw_invalid(fmt::format("layer {}: state block {} is null or outside the cache tensor",
                                layer.name, b.value()));
    }
    return tensor.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(geo.state_bytes));
  };
  auto copy_state = [&](cache::BlockId from, cache::BlockId to) {
    const std::span<std::byte> src = state_of(from);
    std::memmove(state_of(to).data(), src.data(), src.size());
  };
  std::int64_t row = 0;
  for (std::size_t r = 0; r < batch.size(); ++r) {
    const SequenceInput& s = batch[r];
    const std::span<const cache::BlockId> table = s.block_tables.at(group);
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    const std::int64_t needed = s.checkpoints ? n : 1;
    if (n > 0 && (static_cast<std::int64_t>(table.size()) < needed || table[0].is_null())) {
      throw_invalid(fmt::format(
          "forward: request {} gives layer {} (KV-cache group {}) {} state blocks; {} tokens {} "
          "need {}",
          r, layer.name, group, table.size(), n,
          s.checkpoints ? "with checkpoints" : "of a prefill", needed));
    }
    cache::RecurrentStep snapshot;
    if (group < s.recurrent.size()) snapshot = s.recurrent[group];
    if (!snapshot.restore_from.is_null() && n > 0) copy_state(snapshot.restore_from, table[0]);
    if (s.start == 0 && n > 0) std::ranges::fill(state_of(table[0]), std::byte{0});
    const std::int64_t snap = snapshot.snapshot.is_null() ? 0 : snapshot.snapshot_at - s.start;
    for (std::int64_t i = 0; i < n; ++i, ++row) {
      const auto at = static_cast<std::size_t>(i);
      const std::int64_t in = (s.checkpoints && i > 0 ? table[at - 1] : table[0]).value();
      const std::int64_t out_slot = (s.checkpoints ? table[at] : table[0]).value();
      step(row, kernels::StateSequence{in, 1, std::span(&out_slot, 1)});
      if (i + 1 == snap) {
        copy_state(cache::BlockId(static_cast<std::int32_t>(out_slot)), snapshot.snapshot);
      }
    }
  }
}

// A Gated DeltaNet layer's mixer over the batch (Qwen3-Next's layout and formulas; HF
// Qwen3NextGatedDeltaNet). The conv and the delta rule run one token per kernel call, the state
// stored to the cache after every token: a token's output and state are then the same bytes
// whether it came in a prefill chunk, alone, or inside a verify block, for any state dtype (one
// call over several tokens would keep the state in float between them and round it only at the
// end). The chunked prefill kernel is not used for the same reason; docs/engine.md.
void ModelRunner::run_gdn(const Layer& layer, std::span<const SequenceInput> batch,
                          const std::vector<float>& normed, std::vector<float>& out) {
  const kernels::GdnSpec& g = layer.gdn_spec.gdn;
  const kernels::ConvSpec& cs = layer.gdn_spec.conv;
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(normed.size()) / h;
  const std::int64_t hk = g.num_k_heads, hv = g.num_v_heads, dk = g.k_dim, dv = g.v_dim;
  const std::int64_t per = hv / hk;  // value heads per key head
  const std::int64_t key = hk * dk, value = hv * dv;
  const std::int64_t width = 2 * key + 2 * value;
  const std::int64_t channels = cs.channels;  // 2 key + value

  std::vector<float> qkvz(static_cast<std::size_t>(total * width));
  std::vector<float> ba(static_cast<std::size_t>(total * 2 * hv));
  matmul(layer.in_qkvz, normed.data(), total, h, width, qkvz.data());
  matmul(layer.in_ba, normed.data(), total, h, 2 * hv, ba.data());
  // Rows are grouped per key head j: [q_j (dk), k_j (dk), v_j (per dv), z_j (per dv)] and
  // [b_j (per), a_j (per)]; the conv reads [all q; all k; all v].
  std::vector<float> mixed(static_cast<std::size_t>(total * channels));
  std::vector<float> z(static_cast<std::size_t>(total * value));
  std::vector<float> beta(static_cast<std::size_t>(total * hv));
  std::vector<float> decay(beta.size());
  for (std::int64_t t = 0; t < total; ++t) {
    const float* src = qkvz.data() + t * width;
    float* m = mixed.data() + t * channels;
    for (std::int64_t j = 0; j < hk; ++j) {
      const float* grp = src + j * (2 * dk + 2 * per * dv);
      std::copy_n(grp, dk, m + j * dk);
      std::copy_n(grp + dk, dk, m + key + j * dk);
      std::copy_n(grp + 2 * dk, per * dv, m + 2 * key + j * per * dv);
      std::copy_n(grp + 2 * dk + per * dv, per * dv, z.data() + t * value + j * per * dv);
      for (std::int64_t i = 0; i < per; ++i) {
        const std::int64_t head = j * per + i;
        const float b = ba[static_cast<std::size_t>(t * 2 * hv + j * 2 * per + i)];
        const float a = ba[static_cast<std::size_t>(t * 2 * hv + j * 2 * per + per + i)];
        beta[static_cast<std::size_t>(t * hv + head)] = 1.0f / (1.0f + std::exp(-b));
        decay[static_cast<std::size_t>(t * hv + head)] =
            layer.a_neg[static_cast<std::size_t>(head)] *
            softplus(a + layer.dt_bias[static_cast<std::size_t>(head)]);
      }
    }
  }

  const layout::LayerGeometry& geo = layer.geometry;
  std::span<std::byte> tensor = tensors_.at(static_cast<std::size_t>(geo.tensor));
  std::vector<float> conv_out(mixed.size());
  std::vector<float> o(static_cast<std::size_t>(total * value));
  step_recurrent(layer, batch, [&](std::int64_t row, const kernels::StateSequence& seq) {
    const auto rows_of = [&](const std::vector<float>& v, std::int64_t w) {
      return std::span<const float>(v).subspan(static_cast<std::size_t>(row * w),
                                               static_cast<std::size_t>(w));
    };
    std::span<float> c_out = std::span(conv_out).subspan(static_cast<std::size_t>(row * channels),
                                                         static_cast<std::size_t>(channels));
    // Conv and delta rule each read their own tensor of the input slot and write it into the
    // output slot.
    kernels::conv_update(cs, geo, tensor, std::span(&seq, 1),
                         {rows_of(mixed, channels), layer.conv_w, {}}, c_out);
    l2_normalise(c_out.data(), hk, dk);
    l2_normalise(c_out.data() + key, hk, dk);
    kernels::gdn_step(
        g, geo, tensor, std::span(&seq, 1),
        {c_out.subspan(0, static_cast<std::size_t>(key)),
         c_out.subspan(static_cast<std::size_t>(key), static_cast<std::size_t>(key)),
         c_out.subspan(static_cast<std::size_t>(2 * key), static_cast<std::size_t>(value)),
         rows_of(decay, hv), rows_of(beta, hv)},
        std::span(o).subspan(static_cast<std::size_t>(row * value),
                             static_cast<std::size_t>(value)));
  });

  // Gated RMSNorm per value head (Qwen3NextRMSNormGated): norm(o) * w * SiLU(z); out_proj.
  const double eps = layer.rms_norm_eps;
  for (std::int64_t t = 0; t < total; ++t) {
    for (std::int64_t head = 0; head < hv; ++head) {
      float* oh = o.data() + t * value + head * dv;
      rms_norm(oh, layer.gdn_norm, dv, eps, oh);
      const float* zh = z.data() + t * value + head * dv;
      for (std::int64_t i = 0; i < dv; ++i) oh[i] *= silu(zh[i]);
    }
  }
  matmul(layer.out_proj, o.data(), total, value, h, out.data());
}

// A layer's K and V rows for `normed` inputs at `positions`: projections, k_norm, RoPE.
void ModelRunner::project_kv(const Layer& layer, std::span<const float> normed,
                             std::span<const std::int64_t> positions, std::vector<float>& k,
                             std::vector<float>& v) const {
  const kernels::AttentionSpec& spec = layer.spec;
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(positions.size());
  const std::int64_t kw = kernels::k_row_elements(spec);
  const std::int64_t vw = kernels::v_row_elements(spec);
  k.assign(static_cast<std::size_t>(total * kw), 0.0f);
  v.assign(static_cast<std::size_t>(total * vw), 0.0f);
  matmul(layer.wk, normed.data(), total, h, kw, k.data());
  matmul(layer.wv, normed.data(), total, h, vw, v.data());
  for (std::int64_t t = 0; t < total; ++t) {
    float* kt = k.data() + t * kw;
    if (!layer.k_norm.empty()) {
      norm_heads(kt, spec.params.num_kv_heads, spec.head_size, layer.k_norm, layer.rms_norm_eps);
    }
    if (layer.rope) {
      rope(kt, spec.params.num_kv_heads, spec.head_size, positions[static_cast<std::size_t>(t)],
           layer.rope_theta);
    }
  }
}

// Writes the batch's K/V rows into the layer's cache through each request's slot mapping.
void ModelRunner::write_layer_kv(const Layer& layer, std::span<const SequenceInput> batch,
                                 std::span<const float> k, std::span<const float> v) {
  const kernels::AttentionSpec& spec = layer.spec;
  const layout::LayerGeometry& geo = layer.geometry;
  std::span<std::byte> tensor = tensors_.at(static_cast<std::size_t>(geo.tensor));
  const std::int64_t kw = kernels::k_row_elements(spec);
  const std::int64_t vw = kernels::v_row_elements(spec);
  std::int64_t row = 0;
  for (const SequenceInput& s : batch) {
    const std::vector<std::int64_t> blocks =
        block_ids(s.block_tables.at(static_cast<std::size_t>(geo.kv_cache_group)));
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    const auto slots = kernels::slot_mapping(geo, blocks, s.start, n);
    kernels::write_kv(
        spec, geo, {}, tensor, slots,
        k.subspan(static_cast<std::size_t>(row * kw), static_cast<std::size_t>(n * kw)),
        v.subspan(static_cast<std::size_t>(row * vw), static_cast<std::size_t>(n * vw)));
    row += n;
  }
}

void ModelRunner::run_layers(const std::vector<Layer>& layers, std::span<const SequenceInput> batch,
                             const std::vector<std::int64_t>& positions, std::vector<float>& x,
                             std::span<const int> capture, std::vector<float>* captured) {
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(positions.size());
  const auto rows = [](std::int64_t n, std::int64_t width) {
    return std::vector<float>(static_cast<std::size_t>(n * width));
  };
  std::vector<float> normed = rows(total, h);
  std::vector<float> tmp = rows(total, h);
  if (captured != nullptr)
    captured->assign(static_cast<std::size_t>(total * h) * capture.size(), 0);
  // HF's hidden_states[id + 1]: the residual stream after layer `id`, into column block j.
  const auto capture_after = [&](std::size_t index) {
    if (captured == nullptr) return;
    const auto width = static_cast<std::int64_t>(capture.size()) * h;
    for (std::size_t j = 0; j < capture.size(); ++j) {
      if (capture[j] != static_cast<int>(index)) continue;
      for (std::int64_t t = 0; t < total; ++t) {
        std::copy_n(x.begin() + t * h, h,
                    captured->begin() + t * width + static_cast<std::int64_t>(j) * h);
      }
    }
  };
  for (std::size_t index = 0; index < layers.size(); ++index) {
    const Layer& layer = layers[index];
    const double eps = layer.rms_norm_eps;
    if (layer.mlp_only) {  // a Nemotron-H MLP block: its norm, the MLP, the residual
      std::ranges::fill(tmp, 0.0f);
      mlp(layer, x, tmp, normed);
      capture_after(index);
      continue;
    }
    for (std::int64_t t = 0; t < total; ++t) {
      rms_norm(x.data() + t * h, layer.input_norm, h, eps, normed.data() + t * h);
    }
    if (layer.mamba || layer.gdn) {
      if (layer.mamba) {
        run_mamba2(layer, batch, normed, tmp);
      } else {
        run_gdn(layer, batch, normed, tmp);
      }
      mlp(layer, x, tmp, normed);
      capture_after(index);
      continue;
    }
    const kernels::AttentionSpec& spec = layer.spec;
    const std::int64_t hq = spec.params.num_q_heads;
    const std::int64_t qw = hq * spec.head_size;
    std::vector<float> q = rows(total, qw), k, v;
    matmul(layer.wq, normed.data(), total, h, qw, q.data());
    for (std::int64_t t = 0; t < total; ++t) {
      float* qt = q.data() + t * qw;
      if (!layer.q_norm.empty()) norm_heads(qt, hq, spec.head_size, layer.q_norm, eps);
      if (layer.rope) {
        rope(qt, hq, spec.head_size, positions[static_cast<std::size_t>(t)], layer.rope_theta);
      }
    }
    project_kv(layer, normed, positions, k, v);
    write_layer_kv(layer, batch, k, v);

    // The attention metadata of the layer's group. Causal: one query per kernel sequence (its
    // own position + 1 keys; docs/engine.md, determinism). Non-causal (a DFlash block): each
    // request's block is one sequence whose every query sees all keys up to the block's end.
    const layout::LayerGeometry& geo = layer.geometry;
    std::span<std::byte> tensor = tensors_.at(static_cast<std::size_t>(geo.tensor));
    std::vector<std::vector<std::int64_t>> pages;
    std::vector<kernels::PagedSequence> seqs;
    for (const SequenceInput& s : batch) {
      pages.push_back(layout::kernel_block_table(
          geo, block_ids(s.block_tables.at(static_cast<std::size_t>(geo.kv_cache_group)))));
    }
    std::int64_t row = 0;
    for (std::size_t r = 0; r < batch.size(); ++r) {
      const auto n = static_cast<std::int64_t>(batch[r].tokens.size());
      if (!spec.params.causal) {
        if (n > 0) seqs.push_back({pages[r], batch[r].start + n, n});
        row += n;
        continue;
      }
      for (std::int64_t i = 0; i < n; ++i, ++row) {
        seqs.push_back({pages[r], positions[static_cast<std::size_t>(row)] + 1, 1});
      }
    }
    const std::int64_t ow = hq * spec.head_size_v;
    std::vector<float> attn = rows(total, ow);
    kernels::paged_attention(spec, geo, {tensor, seqs, q, layer.sinks, {}}, attn);

    matmul(layer.wo, attn.data(), total, ow, h, tmp.data());
    mlp(layer, x, tmp, normed);
    capture_after(index);
  }
}

// A Mamba2 mixer over the batch (HF NemotronHMamba2Mixer): in_proj to [z; x, B, C; dt]; the
// depthwise causal conv with SiLU over x, B, C; the SSM step (dt = softplus(dt + dt_bias),
// A = -exp(A_log), D skip); y * SiLU(z) RMS-normalised per group of heads (n_groups) times
// norm.weight; out_proj. State discipline as run_gdn's: one kernel call per token and state
// tensor, checkpoints to table[i], restore and snapshot per the manager's RecurrentStep.
void ModelRunner::run_mamba2(const Layer& layer, std::span<const SequenceInput> batch,
                             const std::vector<float>& normed, std::vector<float>& out) {
  const kernels::Mamba2Spec& m = layer.mamba_spec.ssm;
  const kernels::ConvSpec& cs = layer.mamba_spec.conv;
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(normed.size()) / h;
  const std::int64_t inner = m.heads * m.head_dim;
  const std::int64_t bc = m.groups * m.state_size;
  const std::int64_t channels = cs.channels;  // inner + 2 bc
  const std::int64_t width = inner + channels + m.heads;
  std::vector<float> proj(static_cast<std::size_t>(total * width));
  matmul(layer.in_proj, normed.data(), total, h, width, proj.data());

  const layout::LayerGeometry& geo = layer.geometry;
  std::span<std::byte> tensor = tensors_.at(static_cast<std::size_t>(geo.tensor));
  std::vector<float> conv_out(static_cast<std::size_t>(channels));
  std::vector<float> y(static_cast<std::size_t>(total * inner));
  step_recurrent(layer, batch, [&](std::int64_t row, const kernels::StateSequence& seq) {
    const std::span<const float> p = std::span<const float>(proj).subspan(
        static_cast<std::size_t>(row * width), static_cast<std::size_t>(width));
    const auto part = [](std::span<const float> v, std::int64_t from, std::int64_t count) {
      return v.subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(count));
    };
    kernels::conv_update(cs, geo, tensor, std::span(&seq, 1),
                         {part(p, inner, channels), layer.conv_w, layer.conv_bias}, conv_out);
    const std::span<const float> c(conv_out);
    kernels::mamba2_step(m, geo, tensor, std::span(&seq, 1),
                         {part(c, 0, inner), part(p, inner + channels, m.heads), part(c, inner, bc),
                          part(c, inner + bc, bc), layer.a_neg, layer.d_skip, layer.dt_bias},
                         std::span(y).subspan(static_cast<std::size_t>(row * inner),
                                              static_cast<std::size_t>(inner)));
  });

  // Gated RMSNorm (MambaRMSNormGated, gate applied before the norm): per group of
  // inner / n_groups channels.
  const std::int64_t per_group = inner / m.groups;
  for (std::int64_t t = 0; t < total; ++t) {
    float* yt = y.data() + t * inner;
    const float* z = proj.data() + t * width;
    for (std::int64_t i = 0; i < inner; ++i) yt[i] *= silu(z[i]);
    for (std::int64_t g = 0; g < m.groups; ++g) {
      float* v = yt + g * per_group;
      float ss = 0.0f;
      for (std::int64_t i = 0; i < per_group; ++i) ss += v[i] * v[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(per_group) +
                                         static_cast<float>(layer.rms_norm_eps));
      const float* w = layer.mamba_norm.data() + g * per_group;
      for (std::int64_t i = 0; i < per_group; ++i) v[i] = v[i] * inv * w[i];
    }
  }
  matmul(layer.out_proj, y.data(), total, inner, h, out.data());
}

TokenId argmax(std::span<const float> logits) {
  if (logits.empty()) throw_invalid("argmax of no logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<TokenId>(best);
}

}  // namespace mixkv::engine
