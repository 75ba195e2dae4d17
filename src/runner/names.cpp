#include "runner/names.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <span>

#include "mixkv/core/error.hpp"
#include "mixkv/weights/dequantize.hpp"

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
  static const NameTable t{"llama", "model.layers.{}.", kLlamaModel, kLlamaLayer, "blk.{}.", true};
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

WeightSource::WeightSource(const NameTable& names, WeightStore store, std::string origin,
                           WeightNaming naming)
    : names_(names), store_(store), origin_(std::move(origin)), naming_(naming) {}

namespace {

std::string_view spelling(const TensorName& n, WeightNaming naming, std::string_view family) {
  if (naming == WeightNaming::kHuggingFace) return n.hf;
  if (n.gguf.empty()) {
    throw_unsupported(fmt::format("{} tensor {} has no GGUF name in mixkv's table", family, n.hf));
  }
  return n.gguf;
}

}  // namespace

namespace {

// The mapped file's pages of a tensor that now lives packed: the products read the copy, so the
// original need not stay resident (a tied embedding's lookups fault back only the rows they
// read from the file). Only for a file mapping: on a caller's own memory MADV_DONTNEED would
// drop the bytes themselves. (MADV_PAGEOUT, which would be safe everywhere, left the pages
// resident on the development VM.)
void release_pages(std::span<const std::byte> bytes) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(bytes.data()) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(bytes.data()) + bytes.size()) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

std::string WeightSource::layer_prefix(int index) const {
  return fmt::format(fmt::runtime(naming_ == WeightNaming::kGguf ? names_.gguf_layer_prefix
                                                                 : names_.hf_layer_prefix),
                     index);
}

std::string WeightSource::name_of(std::string_view prefix, Role role) const {
  return fmt::format("{}{}", prefix, spelling(names_.find(role), naming_, names_.family));
}

std::vector<float> WeightSource::model(Role role, std::vector<std::int64_t> shape) {
  return values(name_of("", role), std::move(shape));
}
std::vector<float> WeightSource::layer(std::string_view prefix, Role role,
                                       std::vector<std::int64_t> shape) {
  return values(name_of(prefix, role), std::move(shape));
}
Matrix WeightSource::model_matrix(Role role, std::int64_t rows, std::int64_t cols) {
  return matrix(name_of("", role), rows, cols);
}
Matrix WeightSource::layer_matrix(std::string_view prefix, Role role, std::int64_t rows,
                                  std::int64_t cols) {
  return matrix(name_of(prefix, role), rows, cols);
}
std::vector<float> WeightSource::head(std::string_view prefix, Role role,
                                      std::vector<std::int64_t> shape) {
  return values(fmt::format("{}{}", prefix, draft_head_names().find(role).hf), std::move(shape));
}
Matrix WeightSource::head_matrix(std::string_view prefix, Role role, std::int64_t rows,
                                 std::int64_t cols) {
  return matrix(fmt::format("{}{}", prefix, draft_head_names().find(role).hf), rows, cols);
}

const weights::GgufTensor* WeightSource::find(const std::string& name,
                                              const std::vector<std::int64_t>& shape,
                                              const weights::Tensor** tensor) {
  requested_.emplace_back(name, shape);
  *tensor = nullptr;
  const std::vector<std::int64_t>* found = nullptr;
  const weights::GgufTensor* g = nullptr;
  if (store_.gguf != nullptr) {
    g = store_.gguf->find_tensor(name);
    if (g != nullptr) found = &g->shape;
  } else if (store_.tensors != nullptr) {
    const auto it = store_.tensors->find(name);
    if (it != store_.tensors->end()) *tensor = &it->second, found = &it->second.shape;
  } else {
    return nullptr;  // listing shapes
  }
  if (found == nullptr) {
    throw_invalid(fmt::format("{}: weight {} (shape [{}]) is missing from the checkpoint", origin_,
                              name, fmt::join(shape, ", ")));
  }
  if (*found != shape) {
    throw_invalid(fmt::format("{}: weight {} has shape [{}], the config needs [{}]", origin_, name,
                              fmt::join(*found, ", "), fmt::join(shape, ", ")));
  }
  if (g != nullptr && !weights::can_dequantize(g->type)) {
    throw_unsupported(fmt::format("{}: weight {} is stored as {}, a type mixkv does not decode",
                                  origin_, name, weights::to_string(g->type)));
  }
  return g;
}

std::vector<float> WeightSource::values(const std::string& name, std::vector<std::int64_t> shape) {
  const weights::Tensor* t = nullptr;
  if (const weights::GgufTensor* g = find(name, shape, &t)) return weights::dequantize(*g);
  return t != nullptr ? t->values : std::vector<float>{};
}

Matrix WeightSource::matrix(const std::string& name, std::int64_t rows, std::int64_t cols) {
  const weights::Tensor* t = nullptr;
  const weights::GgufTensor* g = find(name, {rows, cols}, &t);
  Matrix m;
  m.view.rows = rows;
  m.view.cols = cols;
  const auto kernel_type = g != nullptr
                               ? kernels::weight_type_from_ggml(static_cast<std::uint32_t>(g->type))
                               : std::nullopt;
  if (kernel_type) {
    m.view.dtype = *kernel_type;  // in place, in the mapping
    m.view.data = g->bytes.data();
    if (order_ == kernels::ReductionOrder::kBlockSum &&
        kernels::weight_order_applies(*kernel_type)) {
      m.view.order = order_;
      if (kernels::matmul_reads_packed(*kernel_type)) {  // where the products read the copy
        m.packed = std::make_shared<const kernels::PackedWeight>(kernels::pack_weight(m.view));
        m.view.packed = m.packed->data();
        if (store_.gguf->mapped()) release_pages(g->bytes);
      }
    }
    return m;
  }
  // Float tensors, and GGUF types the kernels do not read (Q5_0, Q8_1, ...), as float32 copies.
  if (g == nullptr && t == nullptr) return m;
  auto owned = std::make_shared<const std::vector<float>>(g != nullptr ? weights::dequantize(*g)
                                                                       : t->values);
  m.view.dtype = kernels::WeightType::kFloat32;
  m.view.data = reinterpret_cast<const std::byte*>(owned->data());
  m.owned = std::move(owned);
  return m;
}

}  // namespace mixkv::runner
