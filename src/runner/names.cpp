#include "runner/names.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mixkv/core/error.hpp"

namespace mixkv::runner {
namespace {

// HuggingFace names are the transformers checkpoints'; GGUF names are llama.cpp's
// (src/llama-arch.cpp of ggml-org/llama.cpp), with the layer prefix "blk.{}.". Where llama.cpp's
// converter (convert_hf_to_gguf.py) changes a tensor's values, a GGUF loader must undo or skip
// what the runner does to the HF tensor: Llama's attn_q / attn_k rows are permuted for ggml's
// interleaved RoPE (the runner rotates halves, as HF does), Gemma's norms already hold 1 + w, and
// ssm_a holds -exp(A_log).
constexpr TensorName kLlamaModel[] = {
    {Role::kTokenEmbd, "model.embed_tokens.weight", "token_embd.weight"},
    {Role::kOutputNorm, "model.norm.weight", "output_norm.weight"},
    {Role::kOutput, "lm_head.weight", "output.weight"},
};

#define MIXKV_LLAMA_LAYER                                                   \
  {Role::kAttnNorm, "input_layernorm.weight", "attn_norm.weight"},          \
      {Role::kAttnQ, "self_attn.q_proj.weight", "attn_q.weight"},           \
      {Role::kAttnK, "self_attn.k_proj.weight", "attn_k.weight"},           \
      {Role::kAttnV, "self_attn.v_proj.weight", "attn_v.weight"},           \
      {Role::kAttnOutput, "self_attn.o_proj.weight", "attn_output.weight"}, \
      {Role::kAttnSinks, "self_attn.sinks", "attn_sinks.weight"},           \
      {Role::kAttnQNorm, "self_attn.q_norm.weight", "attn_q_norm.weight"},  \
      {Role::kAttnKNorm, "self_attn.k_norm.weight", "attn_k_norm.weight"},  \
      {Role::kFfnGate, "mlp.gate_proj.weight", "ffn_gate.weight"},          \
      {Role::kFfnUp, "mlp.up_proj.weight", "ffn_up.weight"}, {              \
    Role::kFfnDown, "mlp.down_proj.weight", "ffn_down.weight"               \
  }

constexpr TensorName kLlamaLayer[] = {
    MIXKV_LLAMA_LAYER,
    {Role::kFfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight"},
};

constexpr TensorName kQwen3NextLayer[] = {
    MIXKV_LLAMA_LAYER,
    {Role::kFfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight"},
    {Role::kSsmInQkvz, "linear_attn.in_proj_qkvz.weight", "ssm_in.weight"},
    {Role::kSsmInBa, "linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
    {Role::kSsmConv, "linear_attn.conv1d.weight", "ssm_conv1d.weight"},
    {Role::kSsmDtBias, "linear_attn.dt_bias", "ssm_dt.bias"},
    {Role::kSsmALog, "linear_attn.A_log", "ssm_a"},
    {Role::kSsmNorm, "linear_attn.norm.weight", "ssm_norm.weight"},
    {Role::kSsmOut, "linear_attn.out_proj.weight", "ssm_out.weight"},
};

// Gemma 2 normalises the attention output with post_attention_layernorm; the MLP's input norm is
// pre_feedforward_layernorm.
constexpr TensorName kGemma2Layer[] = {
    MIXKV_LLAMA_LAYER,
    {Role::kAttnPostNorm, "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {Role::kFfnNorm, "pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {Role::kFfnPostNorm, "post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};
#undef MIXKV_LLAMA_LAYER

// Nemotron-H (HF NemotronHForCausalLM): one mixer or MLP per block, all under `mixer.`.
constexpr TensorName kNemotronModel[] = {
    {Role::kTokenEmbd, "backbone.embeddings.weight", "token_embd.weight"},
    {Role::kOutputNorm, "backbone.norm_f.weight", "output_norm.weight"},
    {Role::kOutput, "lm_head.weight", "output.weight"},
};
constexpr TensorName kNemotronLayer[] = {
    {Role::kAttnNorm, "norm.weight", "attn_norm.weight"},
    {Role::kAttnQ, "mixer.q_proj.weight", "attn_q.weight"},
    {Role::kAttnK, "mixer.k_proj.weight", "attn_k.weight"},
    {Role::kAttnV, "mixer.v_proj.weight", "attn_v.weight"},
    {Role::kAttnOutput, "mixer.o_proj.weight", "attn_output.weight"},
    {Role::kFfnUp, "mixer.up_proj.weight", "ffn_up.weight"},
    {Role::kFfnDown, "mixer.down_proj.weight", "ffn_down.weight"},
    {Role::kSsmIn, "mixer.in_proj.weight", "ssm_in.weight"},
    {Role::kSsmConv, "mixer.conv1d.weight", "ssm_conv1d.weight"},
    {Role::kSsmConvBias, "mixer.conv1d.bias", "ssm_conv1d.bias"},
    {Role::kSsmDtBias, "mixer.dt_bias", "ssm_dt.bias"},
    {Role::kSsmALog, "mixer.A_log", "ssm_a"},
    {Role::kSsmD, "mixer.D", "ssm_d"},
    {Role::kSsmNorm, "mixer.norm.weight", "ssm_norm.weight"},
    {Role::kSsmOut, "mixer.out_proj.weight", "ssm_out.weight"},
};

// Drafter heads, under their prefix ("draft." or "mtp."): EAGLE's and DFlash's fc and norms,
// Qwen3-Next's MTP input norms.
constexpr TensorName kDraftHead[] = {
    {Role::kDraftFc, "fc.weight", ""},
    {Role::kDraftNorm, "norm.weight", ""},
    {Role::kDraftHiddenNorm, "hidden_norm.weight", ""},
    {Role::kMtpNormEmbedding, "pre_fc_norm_embedding.weight", ""},
    {Role::kMtpNormHidden, "pre_fc_norm_hidden.weight", ""},
};

}  // namespace

const TensorName& NameTable::find(Role role) const {
  for (const auto* part : {&model, &layer}) {
    for (const TensorName& n : *part) {
      if (n.role == role) return n;
    }
  }
  throw_internal(
      fmt::format("the {} name table has no tensor of role {}", family, static_cast<int>(role)));
}

const NameTable& llama_names() {
  static const NameTable t{"llama", "model.layers.{}.", kLlamaModel, kLlamaLayer};
  return t;
}
const NameTable& qwen3_next_names() {
  static const NameTable t{"qwen3_next", "model.layers.{}.", kLlamaModel, kQwen3NextLayer};
  return t;
}
const NameTable& gemma2_names() {
  static const NameTable t{"gemma2", "model.layers.{}.", kLlamaModel, kGemma2Layer};
  return t;
}
const NameTable& nemotron_h_names() {
  static const NameTable t{"nemotron_h", "backbone.layers.{}.", kNemotronModel, kNemotronLayer};
  return t;
}
const NameTable& draft_head_names() {
  static const NameTable t{"draft head", "", {}, kDraftHead};
  return t;
}

WeightSource::WeightSource(const NameTable& names, const weights::TensorMap* weights,
                           std::string origin, WeightNaming naming)
    : names_(names), weights_(weights), origin_(std::move(origin)), naming_(naming) {}

namespace {

std::string_view spelling(const TensorName& n, WeightNaming naming, std::string_view family) {
  if (naming == WeightNaming::kHuggingFace) return n.hf;
  if (n.gguf.empty()) {
    throw_unsupported(fmt::format("{} tensor {} has no GGUF name in mixkv's table", family, n.hf));
  }
  return n.gguf;
}

}  // namespace

std::string WeightSource::layer_prefix(int index) const {
  return fmt::format(fmt::runtime(naming_ == WeightNaming::kGguf ? names_.gguf_layer_prefix
                                                                 : names_.hf_layer_prefix),
                     index);
}

std::vector<float> WeightSource::model(Role role, std::vector<std::int64_t> shape) {
  return get(std::string(spelling(names_.find(role), naming_, names_.family)), std::move(shape));
}

std::vector<float> WeightSource::layer(std::string_view prefix, Role role,
                                       std::vector<std::int64_t> shape) {
  return get(fmt::format("{}{}", prefix, spelling(names_.find(role), naming_, names_.family)),
             std::move(shape));
}

std::vector<float> WeightSource::head(std::string_view prefix, Role role,
                                      std::vector<std::int64_t> shape) {
  return get(fmt::format("{}{}", prefix, draft_head_names().find(role).hf), std::move(shape));
}

std::vector<float> WeightSource::get(std::string name, std::vector<std::int64_t> shape) {
  requested_.emplace_back(name, shape);
  if (weights_ == nullptr) return {};
  const auto it = weights_->find(name);
  if (it == weights_->end()) {
    throw_invalid(fmt::format("{}: weight {} (shape [{}]) is missing from the checkpoint", origin_,
                              name, fmt::join(shape, ", ")));
  }
  if (it->second.shape != shape) {
    throw_invalid(fmt::format("{}: weight {} has shape [{}], the config needs [{}]", origin_, name,
                              fmt::join(it->second.shape, ", "), fmt::join(shape, ", ")));
  }
  return it->second.values;
}

}  // namespace mixkv::runner
