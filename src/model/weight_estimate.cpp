// Weight bytes from config shapes. Counts the matrices that dominate a checkpoint: embeddings and
// LM heads, attention / MLA / linear-attention / Mamba projections, dense MLPs and MoE experts
// (routed, shared, router). Norms, biases and small per-head vectors are left out: together they
// are far below 1% of any supported model. Shapes follow HF transformers' modeling code of each
// family; the built-ins land within a few percent of their published parameter counts
// (tests/model/model_facts_test.cpp).
#include "weight_estimate.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::model {
namespace {

constexpr std::string_view kWhat = "the weight estimate";

std::int64_t mul(std::initializer_list<std::int64_t> factors) {
  return checked_product(factors, kWhat);
}
std::int64_t add(std::int64_t a, std::int64_t b) { return checked_add(a, b, kWhat); }

// Parameters by how a checkpoint stores them: quantization schemes treat the three differently
// (gpt-oss keeps embeddings and attention in bf16 but experts in mxfp4; DeepSeek's fp8 covers the
// decoder projections but not the embeddings).
struct Params {
  std::int64_t embed = 0;   // token embeddings and LM heads
  std::int64_t dense = 0;   // every other projection: attention, recurrent mixers, dense MLPs,
                            // shared experts, routers
  std::int64_t expert = 0;  // routed MoE experts

  void add_all(const Params& o) {
    embed = add(embed, o.embed);
    dense = add(dense, o.dense);
    expert = add(expert, o.expert);
  }
  std::int64_t total() const { return add(add(embed, dense), expert); }
};

ConfigReader language_model(const ConfigReader& root) {
  const std::optional<ConfigReader> text = root.optional_child("text_config");
  return text ? *text : root;
}

// Gated MLPs (SwiGLU, GeGLU) have gate, up and down matrices; relu2 MLPs (Nemotron-H) only up
// and down.
std::int64_t mlp_matrices(const ConfigReader& lm) {
  for (std::string_view key : {"mlp_hidden_act", "hidden_act", "hidden_activation"}) {
    if (lm.has(key)) return lm.string(key) == "relu2" ? 2 : 3;
  }
  return 3;
}

// How a model's MLPs are laid out: which layers route to experts and how wide everything is.
class MlpLayout {
 public:
  MlpLayout(const ConfigReader& lm, std::int64_t hidden) : lm_(lm), hidden_(hidden) {
    matrices_ = mlp_matrices(lm);
    for (std::string_view key : {"n_routed_experts", "num_experts", "num_local_experts"}) {
      if (lm.has(key)) {
        experts_ = lm.non_negative_int(key);
        break;
      }
    }
    if (experts_ == 0) return;
    expert_width_ = lm.has("moe_intermediate_size") ? lm.positive_int("moe_intermediate_size")
                                                    : lm.positive_int("intermediate_size");
    // Shared experts are spelled four ways; the Qwen form is one expert of its own width with
    // a scalar gate.
    if (lm.has("shared_expert_intermediate_size")) {
      shared_width_ = lm.non_negative_int("shared_expert_intermediate_size");
      shared_gate_ = shared_width_ > 0;
    } else if (lm.has("moe_shared_expert_intermediate_size")) {
      shared_width_ = lm.non_negative_int("moe_shared_expert_intermediate_size");
    } else if (lm.has("shared_intermediate_size")) {
      shared_width_ = lm.non_negative_int("shared_intermediate_size");
    } else {
      for (std::string_view key : {"n_shared_experts", "num_shared_experts"}) {
        if (lm.has(key)) {
          shared_width_ = mul({lm.non_negative_int(key), expert_width_});
          break;
        }
      }
    }
    if (lm.has("mlp_only_layers")) {
      for (auto i : lm.int_list("mlp_only_layers")) mlp_only_.insert(i);
    }
  }

  // Whether decoder layer `i` routes to experts, by whichever rule the family's config states:
  // DeepSeek / GLM / Kimi first_k_dense_replace (+ moe_layer_freq), Qwen decoder_sparse_step and
  // mlp_only_layers, Jamba expert_layer_period / offset; otherwise every layer (gpt-oss, Mixtral,
  // Granite).
  bool is_moe(std::int64_t i) const {
    if (experts_ == 0 || mlp_only_.contains(i)) return false;
    if (lm_.has("first_k_dense_replace")) {
      if (i < lm_.non_negative_int("first_k_dense_replace")) return false;
      return i % lm_.optional_positive_int("moe_layer_freq").value_or(1) == 0;
    }
    if (lm_.has("decoder_sparse_step"))
      return (i + 1) % lm_.positive_int("decoder_sparse_step") == 0;
    if (lm_.has("expert_layer_period")) {
      const std::int64_t offset =
          lm_.has("expert_layer_offset") ? lm_.non_negative_int("expert_layer_offset") : 0;
      return i % lm_.positive_int("expert_layer_period") == offset;
    }
    return true;
  }

  Params dense() const {
    return {0, mul({matrices_, hidden_, lm_.positive_int("intermediate_size")}), 0};
  }

  Params moe() const {
    Params p;
    p.expert = mul({experts_, matrices_, hidden_, expert_width_});
    // The router, the shared experts and (Qwen) their gate.
    p.dense = add(mul({hidden_, experts_}), mul({matrices_, hidden_, shared_width_}));
    if (shared_gate_) p.dense = add(p.dense, hidden_);
    return p;
  }

  Params for_layer(std::int64_t i) const { return is_moe(i) ? moe() : dense(); }

 private:
  const ConfigReader& lm_;
  std::int64_t hidden_;
  std::int64_t matrices_ = 3;
  std::int64_t experts_ = 0;
  std::int64_t expert_width_ = 0;
  std::int64_t shared_width_ = 0;
  bool shared_gate_ = false;
  std::set<std::int64_t> mlp_only_;
};

// Qwen3-Next always gates attention output through a second half of q_proj; Qwen3.5 says so with
// attn_output_gate.
bool gated_attention(const ConfigReader& lm, const std::string& model_type) {
  return lm.optional_bool("attn_output_gate").value_or(model_type == "qwen3_next");
}

// One layer's token mixer. `input` is the width its q/k/v projections read (2 x hidden for the
// first EAGLE-3 layer, which sees the token embedding beside the fused hidden state).
std::int64_t mixer_params(const ConfigReader& lm, const LayerTemplate& t, std::int64_t hidden,
                          std::int64_t input, bool gated_q) {
  const LayerDesc& d = t.desc;
  switch (d.kind) {
    case LayerKind::kFull:
    case LayerKind::kSliding:
    case LayerKind::kChunked: {
      const std::int64_t q = mul({d.num_q_heads, d.head_size, gated_q ? 2 : 1});
      const std::int64_t kv =
          add(mul({d.num_kv_heads, d.head_size}), mul({d.num_kv_heads, d.head_size_v}));
      return add(mul({input, add(q, kv)}), mul({d.num_q_heads, d.head_size_v, hidden}));
    }
    case LayerKind::kMla: {
      // q_a/q_b (or one q_proj without q_lora_rank), kv_a (latent + shared rope key), kv_b, o.
      const std::int64_t heads = d.num_q_heads;
      const std::int64_t nope = lm.positive_int("qk_nope_head_dim");
      const std::int64_t rope = lm.positive_int("qk_rope_head_dim");
      const std::int64_t v = lm.positive_int("v_head_dim");
      const std::int64_t kv_lora = d.head_size_v;
      std::int64_t q = mul({hidden, heads, nope + rope});
      if (auto q_lora = lm.optional_positive_int("q_lora_rank")) {
        q = add(mul({hidden, *q_lora}), mul({*q_lora, heads, nope + rope}));
      }
      std::int64_t p = add(q, mul({hidden, kv_lora + rope}));
      p = add(p, mul({kv_lora, heads, nope + v}));
      return add(p, mul({heads, v, hidden}));
    }
    case LayerKind::kGdn: {
      // in_proj_qkvz, in_proj_ba, conv1d over q/k/v, out_proj.
      const auto& g = std::get<GdnParams>(t.recurrent);
      const std::int64_t k = mul({g.num_k_heads, g.k_head_dim});
      const std::int64_t v = mul({g.num_v_heads, g.v_head_dim});
      std::int64_t p = mul({hidden, add(mul({2, k}), mul({2, v}))});
      p = add(p, mul({hidden, 2, g.num_v_heads}));
      p = add(p, mul({add(mul({2, k}), v), g.conv_kernel}));
      return add(p, mul({v, hidden}));
    }
    case LayerKind::kKda: {
      // q/k/v/o projections, low-rank forget and output gates (f_a/f_b, g_a/g_b), beta, 3 convs.
      const auto& k = std::get<KdaParams>(t.recurrent);
      const std::int64_t width = mul({k.num_heads, k.head_dim});
      std::int64_t p = mul({4, hidden, width});
      p = add(p, mul({2, add(mul({hidden, k.head_dim}), mul({k.head_dim, width}))}));
      p = add(p, mul({hidden, k.num_heads}));
      return add(p, mul({3, width, k.conv_kernel}));
    }
    case LayerKind::kMamba2: {
      // in_proj (z, x, B, C, dt), conv1d over x/B/C, out_proj.
      const auto& m = std::get<Mamba2Params>(t.recurrent);
      const std::int64_t inner = mul({m.num_heads, m.head_dim});
      const std::int64_t bc = mul({2, m.n_groups, m.state_size});
      std::int64_t p = mul({hidden, add(add(mul({2, inner}), bc), m.num_heads)});
      p = add(p, mul({add(inner, bc), m.conv_kernel}));
      return add(p, mul({inner, hidden}));
    }
    case LayerKind::kMamba1: {
      // in_proj (x, z), conv1d, x_proj (dt, B, C), dt_proj, A, out_proj.
      const auto& m = std::get<Mamba1Params>(t.recurrent);
      const std::int64_t dt_rank =
          lm.optional_positive_int("mamba_dt_rank").value_or(ceil_div(hidden, 16));
      std::int64_t p = mul({hidden, 2, m.intermediate});
      p = add(p, mul({m.intermediate, m.conv_kernel}));
      p = add(p, mul({m.intermediate, add(dt_rank, mul({2, m.state_size}))}));
      p = add(p, mul({dt_rank, m.intermediate}));
      p = add(p, mul({m.intermediate, m.state_size}));
      return add(p, mul({m.intermediate, hidden}));
    }
  }
  throw_internal("weight estimate: unknown layer kind");
}

std::int64_t hidden_of(const FamilyLayers& family, const ConfigReader& lm) {
  return family.hidden_size ? *family.hidden_size : lm.positive_int("hidden_size");
}

// Token embeddings plus the LM head, unless tied. HF's default for an absent key is the config
// class's: Gemma ties, the other supported families do not.
Params embedding_params(const ConfigReader& lm, const ConfigReader& root,
                        const FamilyLayers& family) {
  std::optional<bool> tie = lm.optional_bool("tie_word_embeddings");
  if (!tie) tie = root.optional_bool("tie_word_embeddings");
  const bool tied = tie.value_or(family.model_type.starts_with("gemma"));
  const std::int64_t vocab = family.vocab_size ? *family.vocab_size : lm.positive_int("vocab_size");
  return {mul({vocab, hidden_of(family, lm), tied ? 1 : 2}), 0, 0};
}

// All decoder layers of a model (not its MTP layers) plus its embeddings.
Params model_params(const ConfigReader& root, const FamilyLayers& family) {
  const ConfigReader lm = language_model(root);
  const std::int64_t hidden = hidden_of(family, lm);
  const bool gated_q = gated_attention(lm, family.model_type);
  const MlpLayout mlp(lm, hidden);
  std::map<std::int64_t, const LayerTemplate*> mixers;
  for (const auto& t : family.layers) mixers[t.desc.index] = &t;

  Params p = embedding_params(lm, root, family);
  if (family.model_type == "nemotron_h") {
    // Each block is one of mixer, MLP or MoE (hybrid_override_pattern), not a mixer + MLP pair.
    const std::string pattern = lm.string("hybrid_override_pattern");
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(pattern.size()); ++i) {
      if (auto it = mixers.find(i); it != mixers.end()) {
        p.dense = add(p.dense, mixer_params(lm, *it->second, hidden, hidden, gated_q));
      } else if (pattern[i] == 'E') {
        p.add_all(mlp.moe());
      } else {
        p.add_all(mlp.dense());
      }
    }
    return p;
  }
  for (std::int64_t i = 0; i < family.num_hidden_layers; ++i) {
    if (auto it = mixers.find(i); it != mixers.end()) {
      p.dense = add(p.dense, mixer_params(lm, *it->second, hidden, hidden, gated_q));
    }
    p.add_all(mlp.for_layer(i));
  }
  return p;
}

// The target's own MTP layers: each is a decoder layer (with the MLP its index would have) plus
// the projection that fuses the previous hidden state with the next token's embedding (2H -> H).
// Embeddings and LM head are the target's.
Params mtp_params(const ConfigReader& root, const FamilyLayers& family) {
  const ConfigReader lm = language_model(root);
  const std::int64_t hidden = hidden_of(family, lm);
  const bool gated_q = gated_attention(lm, family.model_type);
  const MlpLayout mlp(lm, hidden);
  Params p;
  for (std::size_t j = 0; j < family.mtp_layers.size(); ++j) {
    p.dense = add(p.dense, mul({2, hidden, hidden}));
    p.dense = add(p.dense, mixer_params(lm, family.mtp_layers[j], hidden, hidden, gated_q));
    p.add_all(mlp.for_layer(add(family.num_hidden_layers, static_cast<std::int64_t>(j))));
  }
  return p;
}

// EAGLE, EAGLE-3 and DFlash heads: dense decoder layers (whatever MoE fields their borrowed config
// carries: SpecForge's gpt-oss EAGLE-3 head is a Llama layer) and an fc that folds target hidden
// states into the draft width. They read the target's embeddings and LM head, except that EAGLE
// heads with a draft_vocab_size bring their own reduced LM head.
Params head_drafter_params(const DrafterShape& d, std::int64_t target_hidden) {
  const ConfigReader lm = language_model(*d.config);
  const FamilyLayers& family = *d.family;
  const std::int64_t hidden = hidden_of(family, lm);
  const std::int64_t fed = lm.optional_positive_int("target_hidden_size").value_or(target_hidden);
  const std::int64_t dense_mlp =
      mul({mlp_matrices(lm), hidden, lm.positive_int("intermediate_size")});
  Params p;
  for (const auto& t : family.layers) {
    const bool first_eagle3 = d.kind == DraftKind::kEagle3 && &t == &family.layers.front();
    const std::int64_t input = first_eagle3 ? mul({2, hidden}) : hidden;
    p.dense = add(p.dense, mixer_params(lm, t, hidden, input, false));
    p.dense = add(p.dense, dense_mlp);
  }
  switch (d.kind) {
    case DraftKind::kEagle3:
      p.dense = add(p.dense, mul({3, fed, hidden}));
      break;
    case DraftKind::kEagle:
      p.dense = add(p.dense, mul({2, hidden, hidden}));
      break;
    case DraftKind::kDflash:
      p.dense = add(p.dense, mul({static_cast<std::int64_t>(d.num_target_layer_ids), fed, hidden}));
      break;
    default:
      break;
  }
  if (d.kind != DraftKind::kDflash) {
    if (auto draft_vocab = lm.optional_positive_int("draft_vocab_size")) {
      p.embed = mul({*draft_vocab, hidden});
    }
  }
  return p;
}

// Bits per parameter (x 32, so mxfp4's 4.25 stays an integer) for each class of Params.
struct Precision {
  std::int64_t embed_bits32 = 0;
  std::int64_t dense_bits32 = 0;
  std::int64_t expert_bits32 = 0;
  std::string text;
};

std::int64_t bits32(DType dtype) { return storage_bytes(dtype, 32) * 8; }

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

// From quantization_config when the checkpoint declares one, else the model dtype.
Precision read_precision(const ConfigReader& root, DType dtype) {
  const std::int64_t base = bits32(dtype);
  Precision p{base, base, base, std::string(to_string(dtype))};
  std::optional<ConfigReader> q = root.optional_child("quantization_config");
  if (!q) q = language_model(root).optional_child("quantization_config");
  if (!q) return p;
  const std::string method = lower(q->optional_string("quant_method").value_or("unknown"));
  const std::string algo = lower(q->optional_string("quant_algo").value_or(""));
  if (method == "fp8" || method == "fbgemm_fp8" || (method == "modelopt" && algo == "fp8")) {
    // Embeddings and LM head stay in the model dtype (DeepSeek-V3's fp8 checkpoint does).
    p.dense_bits32 = p.expert_bits32 = bits32(DType::kFp8E4m3);
    p.text = fmt::format("fp8 projections, {} embeddings", to_string(dtype));
  } else if (method == "mxfp4") {
    // gpt-oss: 4-bit experts with one 8-bit scale per 32 values; attention, router and
    // embeddings stay unquantized (its modules_to_not_convert).
    p.expert_bits32 = 4 * 32 + 8;
    p.text = fmt::format("{}, MoE experts mxfp4", to_string(dtype));
  } else if (method == "modelopt" && algo == "nvfp4") {
    p.dense_bits32 = p.expert_bits32 = bits32(DType::kNvfp4);
    p.text = fmt::format("nvfp4 projections, {} embeddings", to_string(dtype));
  } else if (q->has("bits")) {
    // GPTQ / AWQ style: integer weights of `bits`; group scales are left out.
    const std::int64_t bits = q->positive_int("bits");
    p.dense_bits32 = p.expert_bits32 = mul({bits, 32});
    p.text = fmt::format("{}-bit {} projections, {} embeddings", bits, method, to_string(dtype));
  } else {
    p.text = fmt::format("{} (quantization '{}' not modelled)", to_string(dtype), method);
  }
  return p;
}

std::int64_t bytes_of(const Params& params, const Precision& precision) {
  // Each class is rounded up on its own, as it is stored in its own tensors.
  const auto one = [](std::int64_t n, std::int64_t bits32) {
    return ceil_div(mul({n, bits32}), 8 * 32);
  };
  return add(
      add(one(params.embed, precision.embed_bits32), one(params.dense, precision.dense_bits32)),
      one(params.expert, precision.expert_bits32));
}

std::string count_text(std::int64_t n) {
  return n >= 100'000'000 ? fmt::format("{:.2f}e9", static_cast<double>(n) / 1e9)
                          : fmt::format("{:.2f}e6", static_cast<double>(n) / 1e6);
}

struct Estimate {
  std::int64_t bytes_per_rank;
  std::string text;
};

Estimate estimate(const ConfigReader& target_root, const FamilyLayers& target,
                  const std::optional<DrafterShape>& draft, int tp) {
  const Params target_params = model_params(target_root, target);
  const Precision target_precision = read_precision(target_root, target.model_dtype);
  std::int64_t bytes = bytes_of(target_params, target_precision);
  std::int64_t total = target_params.total();
  std::string breakdown;
  std::string precision_text = target_precision.text;
  if (draft) {
    Params draft_params;
    Precision draft_precision = target_precision;  // MTP layers live in the target checkpoint
    std::string what = "MTP layers";
    if (draft->kind == DraftKind::kMtp) {
      draft_params = mtp_params(target_root, target);
    } else {
      // A drafter runs in the target's dtype (as serving engines load it) unless it is itself
      // quantized.
      draft_precision = read_precision(*draft->config, target.model_dtype);
      what = fmt::format("{} drafter", to_string(draft->kind));
      draft_params =
          draft->kind == DraftKind::kModel
              ? model_params(*draft->config, *draft->family)
              : head_drafter_params(*draft, hidden_of(target, language_model(target_root)));
    }
    bytes = add(bytes, bytes_of(draft_params, draft_precision));
    total = add(total, draft_params.total());
    breakdown = fmt::format(" (target {} + {} {})", count_text(target_params.total()), what,
                            count_text(draft_params.total()));
    if (draft_precision.text != target_precision.text) {
      precision_text += fmt::format("; drafter {}", draft_precision.text);
    }
  }
  return {ceil_div(bytes, tp),
          fmt::format("estimate: {} parameters from config shapes{}, {}, / tp {}",
                      count_text(total), breakdown, precision_text, tp)};
}

}  // namespace

ModelFacts model_facts(const ConfigReader& target_root, const FamilyLayers& target,
                       const std::optional<DrafterShape>& draft, int tp) {
  ModelFacts facts;
  facts.max_position_embeddings = target.max_position_embeddings;
  facts.hidden_size = target.hidden_size;
  facts.vocab_size = target.vocab_size;
  try {
    Estimate e = estimate(target_root, target, draft, tp);
    facts.weight_bytes = e.bytes_per_rank;
    facts.weight_estimate = std::move(e.text);
  } catch (const Error& e) {
    // The cache shapes do not depend on these fields, so a config that lacks them still
    // describes; the planner sees that the weights are unknown and why.
    facts.weight_estimate = fmt::format("no estimate: {}", e.what());
  }
  return facts;
}

}  // namespace mixkv::model
