#include "mixkv/model_runner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "mixkv/error.hpp"
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
  return t;
}

namespace {

TensorMap random_tensors(
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& shapes,
    std::uint64_t seed) {
  TensorMap out;
  std::mt19937_64 rng(seed);
  for (const auto& [name, shape] : shapes) {
    Tensor t;
    t.shape = shape;
    t.values.resize(static_cast<std::size_t>(t.numel()));
    const bool norm = name.ends_with("norm.weight");
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

void add_layer_shapes(std::vector<std::pair<std::string, std::vector<std::int64_t>>>& out,
                      const std::string& p, const model::LayerDesc& l, std::int64_t h,
                      std::int64_t inter) {
  const std::int64_t q = std::int64_t{l.num_q_heads} * l.head_size;
  const std::int64_t kv = std::int64_t{l.num_kv_heads} * l.head_size;
  out.push_back({p + "input_layernorm.weight", {h}});
  out.push_back({p + "self_attn.q_proj.weight", {q, h}});
  out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
  out.push_back({p + "self_attn.v_proj.weight", {std::int64_t{l.num_kv_heads} * l.head_size_v, h}});
  out.push_back({p + "self_attn.o_proj.weight", {h, std::int64_t{l.num_q_heads} * l.head_size_v}});
  if (l.sinks) out.push_back({p + "self_attn.sinks", {l.num_q_heads}});
  out.push_back({p + "post_attention_layernorm.weight", {h}});
  out.push_back({p + "mlp.gate_proj.weight", {inter, h}});
  out.push_back({p + "mlp.up_proj.weight", {inter, h}});
  out.push_back({p + "mlp.down_proj.weight", {h, inter}});
}

// Checkpoint prefix of a layer: "model.layers.3." for the target, "draft.layers.0." for a drafter.
std::string weight_prefix(const model::LayerDesc& l) {
  return l.owner == model::Owner::kTarget ? layer_prefix(l.index) : l.name + ".";
}

}  // namespace

std::vector<std::pair<std::string, std::vector<std::int64_t>>> weight_shapes(
    const TransformerConfig& c, const model::ModelDesc& desc) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (const model::LayerDesc& l : desc.layers) {
    if (l.owner == model::Owner::kTarget) {
      add_layer_shapes(out, weight_prefix(l), l, c.hidden_size, c.intermediate_size);
    }
  }
  out.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return out;
}

TensorMap generate_weights(const TransformerConfig& config, const model::ModelDesc& desc,
                           std::uint64_t seed) {
  return random_tensors(weight_shapes(config, desc), seed);
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> draft_weight_shapes(
    const TransformerConfig& draft, const model::ModelDesc& desc) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  const std::int64_t h = draft.hidden_size;
  out.push_back({"draft.fc.weight", {h, 2 * h}});
  for (const model::LayerDesc& l : desc.layers) {
    if (l.owner == model::Owner::kDraft) {
      add_layer_shapes(out, weight_prefix(l), l, h, draft.intermediate_size);
    }
  }
  out.push_back({"draft.norm.weight", {h}});
  return out;
}

TensorMap generate_draft_weights(const TransformerConfig& draft, const model::ModelDesc& desc,
                                 std::uint64_t seed) {
  return random_tensors(draft_weight_shapes(draft, desc), seed);
}

ModelRunner::ModelRunner(const model::ModelSource& config, const TensorMap& weights,
                         const RunnerOptions& options)
    : config_(read_transformer_config(config)) {
  model::DescribeOptions dopt;
  std::optional<TransformerConfig> draft_config;
  if (options.draft) {
    draft_config = read_transformer_config(*options.draft);
    dopt.num_spec_tokens = options.num_spec_tokens;
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
  desc_ = model::describe(config, options.draft, dopt);
  desc_.num_spec_tokens = options.num_spec_tokens;
  if (desc_.draft_info && desc_.draft_info->kind != model::DraftKind::kEagle) {
    throw_unsupported(fmt::format("{}: a {} drafter; the runner serves EAGLE-style chain drafters",
                                  options.draft->origin, model::to_string(desc_.draft_info->kind)));
  }
  for (const model::LayerDesc& l : desc_.layers) {
    const bool target = l.owner == model::Owner::kTarget;
    const std::string& origin = target ? config.origin : options.draft->origin;
    if (l.kind != model::LayerKind::kFull && l.kind != model::LayerKind::kSliding) {
      throw_unsupported(fmt::format(
          "{}: layer {} is {}; the reference runner serves full and sliding attention layers only "
          "(recurrent kernels are not part of mixkv yet)",
          origin, l.name, model::to_string(l.kind)));
    }
  }
  plan::PlanOptions popt;
  popt.policy = options.policy;
  popt.backend = attn::Backend::kCpu;
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
  auto get = [&](const std::string& name) {
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

  embed_ = get("model.embed_tokens.weight");
  final_norm_ = get("model.norm.weight");
  lm_head_ = config_.tie_word_embeddings ? embed_ : get("lm_head.weight");
  if (draft_config) {
    draft_fc_ = get("draft.fc.weight");
    draft_norm_ = get("draft.norm.weight");
    draft_eps_ = draft_config->rms_norm_eps;
  }
  for (const model::LayerDesc& l : desc_.layers) {
    const bool target = l.owner == model::Owner::kTarget;
    const TransformerConfig& c = target ? config_ : *draft_config;
    Layer layer;
    layer.intermediate = c.intermediate_size;
    layer.rms_norm_eps = c.rms_norm_eps;
    layer.rope_theta = c.rope_theta;
    layer.geometry = geometry_.layer(l.name);
    const auto& group = groups_.at(static_cast<std::size_t>(layer.geometry.attention_group));
    layer.spec = kernels::attention_spec(attn::kernel_params(group, l), l);
    const std::string p = weight_prefix(l);
    layer.input_norm = get(p + "input_layernorm.weight");
    layer.wq = get(p + "self_attn.q_proj.weight");
    layer.wk = get(p + "self_attn.k_proj.weight");
    layer.wv = get(p + "self_attn.v_proj.weight");
    layer.wo = get(p + "self_attn.o_proj.weight");
    if (l.sinks) layer.sinks = get(p + "self_attn.sinks");
    layer.post_norm = get(p + "post_attention_layernorm.weight");
    layer.gate = get(p + "mlp.gate_proj.weight");
    layer.up = get(p + "mlp.up_proj.weight");
    layer.down = get(p + "mlp.down_proj.weight");
    (target ? layers_ : draft_layers_).push_back(std::move(layer));
  }
}

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
  run_layers(layers_, batch, positions, x);
  return head(std::move(x), final_norm_, config_.rms_norm_eps);
}

ForwardOutput ModelRunner::draft_forward(std::span<const SequenceInput> batch,
                                         std::span<const float> features) {
  if (!has_drafter()) throw_invalid("draft_forward: the runner has no drafter");
  std::vector<std::int64_t> positions;
  std::vector<float> embedded;
  check_batch(batch, positions, embedded);
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(positions.size());
  if (static_cast<std::int64_t>(features.size()) != total * h) {
    throw_invalid(fmt::format("draft_forward: {} tokens need {} feature values, got {}", total,
                              total * h, features.size()));
  }
  // EAGLE's input: [embedding of the token; hidden state that predicted it] projected to hidden.
  std::vector<float> both(static_cast<std::size_t>(total * 2 * h));
  for (std::int64_t t = 0; t < total; ++t) {
    std::copy_n(embedded.begin() + t * h, h, both.begin() + t * 2 * h);
    std::copy_n(features.begin() + t * h, h, both.begin() + t * 2 * h + h);
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
  out.hidden = std::move(x);
  return out;
}

void ModelRunner::run_layers(const std::vector<Layer>& layers, std::span<const SequenceInput> batch,
                             const std::vector<std::int64_t>& positions, std::vector<float>& x) {
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(positions.size());
  const auto rows = [](std::int64_t n, std::int64_t width) {
    return std::vector<float>(static_cast<std::size_t>(n * width));
  };
  std::vector<float> normed = rows(total, h);
  std::vector<float> tmp = rows(total, h);
  for (const Layer& layer : layers) {
    const std::int64_t inter = layer.intermediate;
    const double eps = layer.rms_norm_eps;
    const kernels::AttentionSpec& spec = layer.spec;
    const std::int64_t hq = spec.params.num_q_heads;
    const std::int64_t qw = hq * spec.head_size;
    const std::int64_t kw = kernels::k_row_elements(spec);
    const std::int64_t vw = kernels::v_row_elements(spec);
    std::vector<float> q = rows(total, qw), k = rows(total, kw), v = rows(total, vw);
    for (std::int64_t t = 0; t < total; ++t) {
      rms_norm(x.data() + t * h, layer.input_norm, h, eps, normed.data() + t * h);
    }
    matmul(layer.wq, normed.data(), total, h, qw, q.data());
    matmul(layer.wk, normed.data(), total, h, kw, k.data());
    matmul(layer.wv, normed.data(), total, h, vw, v.data());
    for (std::int64_t t = 0; t < total; ++t) {
      const std::int64_t pos = positions[static_cast<std::size_t>(t)];
      rope(q.data() + t * qw, hq, spec.head_size, pos, layer.rope_theta);
      rope(k.data() + t * kw, spec.params.num_kv_heads, spec.head_size, pos, layer.rope_theta);
    }

    // K/V of every new token into the cache, then one query per kernel sequence.
    const layout::LayerGeometry& geo = layer.geometry;
    std::span<std::byte> tensor = tensors_.at(static_cast<std::size_t>(geo.tensor));
    std::vector<std::vector<std::int64_t>> pages;
    std::vector<kernels::PagedSequence> seqs;
    std::int64_t row = 0;
    for (const SequenceInput& s : batch) {
      const auto table = s.block_tables.at(static_cast<std::size_t>(geo.kv_cache_group));
      std::vector<std::int64_t> blocks(table.size());
      std::transform(table.begin(), table.end(), blocks.begin(),
                     [](cache::BlockId b) { return std::int64_t{b.value()}; });
      const auto n = static_cast<std::int64_t>(s.tokens.size());
      const auto slots = kernels::slot_mapping(geo, blocks, s.start, n);
      kernels::write_kv(spec, geo, {}, tensor, slots,
                        std::span<const float>(k).subspan(static_cast<std::size_t>(row * kw),
                                                          static_cast<std::size_t>(n * kw)),
                        std::span<const float>(v).subspan(static_cast<std::size_t>(row * vw),
                                                          static_cast<std::size_t>(n * vw)));
      pages.push_back(layout::kernel_block_table(geo, blocks));
      row += n;
    }
    row = 0;
    for (std::size_t r = 0; r < batch.size(); ++r) {
      for (std::size_t i = 0; i < batch[r].tokens.size(); ++i, ++row) {
        seqs.push_back({pages[r], positions[static_cast<std::size_t>(row)] + 1, 1});
      }
    }
    const std::int64_t ow = hq * spec.head_size_v;
    std::vector<float> attn = rows(total, ow);
    kernels::paged_attention(spec, geo, {tensor, seqs, q, layer.sinks, {}}, attn);

    matmul(layer.wo, attn.data(), total, ow, h, tmp.data());
    for (std::int64_t t = 0; t < total; ++t) {
      float* xt = x.data() + t * h;
      for (std::int64_t i = 0; i < h; ++i) xt[i] += tmp[static_cast<std::size_t>(t * h + i)];
      rms_norm(xt, layer.post_norm, h, eps, normed.data() + t * h);
    }
    std::vector<float> gate = rows(total, inter), up = rows(total, inter);
    matmul(layer.gate, normed.data(), total, h, inter, gate.data());
    matmul(layer.up, normed.data(), total, h, inter, up.data());
    for (std::size_t i = 0; i < gate.size(); ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];  // SiLU(gate) * up
    }
    matmul(layer.down, gate.data(), total, inter, h, tmp.data());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }
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
