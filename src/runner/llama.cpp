// The Llama family (also gpt-oss, Qwen2/3, Mistral; and the drafters' layers): per layer an
// RMSNorm, attention with RoPE (sinks where the layer has them), an RMSNorm and a SwiGLU MLP.
#include <fmt/format.h>

#include <algorithm>

#include "mixkv/core/error.hpp"
#include "mixkv/kernels/attention_ggml.hpp"
#include "runner/family.hpp"

namespace mixkv::runner {

layout::LayerGeometry Assembler::layer_geometry(const std::string& name) const {
  return geometry != nullptr ? geometry->layer(name) : layout::LayerGeometry{};
}

kernels::AttentionSpec Assembler::attention_spec(const model::LayerDesc& l) const {
  if (groups == nullptr) return {};
  const layout::LayerGeometry g = geometry->layer(l.name);
  const auto& group = groups->at(static_cast<std::size_t>(g.attention_group));
  return kernels::attention_spec(attn::kernel_params(group, l), l, attention_order);
}

const model::LayerDesc& Assembler::layer(const std::string& name) const {
  const auto l = std::find_if(desc.layers.begin(), desc.layers.end(),
                              [&](const model::LayerDesc& d) { return d.name == name; });
  if (l == desc.layers.end()) throw_internal(fmt::format("no layer {} in the description", name));
  return *l;
}

std::unique_ptr<Attention> attention_mixer(Assembler& a, const model::LayerDesc& l,
                                           const std::string& p, LlamaLayerOptions options) {
  const std::int64_t h = a.arch.hidden_size;
  const std::int64_t q = std::int64_t{l.num_q_heads} * l.head_size;
  const std::int64_t kv = std::int64_t{l.num_kv_heads} * l.head_size;
  WeightSource& w = a.weights;
  Attention::Weights aw;
  aw.q = w.layer_matrix(p, Role::kAttnQ, q, h);
  aw.k = w.layer_matrix(p, Role::kAttnK, kv, h);
  aw.v = w.layer_matrix(p, Role::kAttnV, std::int64_t{l.num_kv_heads} * l.head_size_v, h);
  aw.o = w.layer_matrix(p, Role::kAttnOutput, h, std::int64_t{l.num_q_heads} * l.head_size_v);
  if (l.sinks) aw.sinks = w.layer(p, Role::kAttnSinks, {l.num_q_heads});
  if (options.qk_norm) {
    aw.q_norm = w.layer(p, Role::kAttnQNorm, {l.head_size});
    aw.k_norm = w.layer(p, Role::kAttnKNorm, {l.head_size});
  }
  using Rope = Attention::Rope;
  const bool pairs = w.naming() == WeightNaming::kGguf && w.names().gguf_rope_pairs;
  const Rope rope = !options.rope ? Rope::kNone : pairs ? Rope::kPairs : Rope::kHalves;
  return std::make_unique<Attention>(l.name, a.attention_spec(l), a.layer_geometry(l.name),
                                     std::move(aw), rope, a.arch.rope_theta, a.arch.rms_norm_eps,
                                     numerics_of(a, l));
}

// llama.cpp is the reference for a GGUF file read in its reduction order (kGgml): its numerics
// wherever its attention kernel can serve the layer's cache (an f16 cache, llama.cpp's own
// default), so the run is bit-exact with llama.cpp. The kBlockSum order's products already differ
// from llama.cpp's in the last bits, so keeping llama.cpp's attention (one task per query row and
// KV head, re-decoding the f16 cache for every row) would buy no bits and cost the multi-row
// steps of speculative verify and batching their speed: that order, and every other case, gets
// mixkv's numerics (paged_attention reads each page once per KV head for all rows; docs/engine.md).
Numerics numerics_of(const Assembler& a, const model::LayerDesc& l) {
  const bool ggml_bits = a.weights.naming() == WeightNaming::kGguf &&
                         a.weights.weight_order() == kernels::ReductionOrder::kGgml;
  return ggml_bits && kernels::ggml_attention_serves(a.attention_spec(l)) ? Numerics::kGgml
                                                                          : Numerics::kMixkv;
}

std::unique_ptr<Mlp> gated_mlp(Assembler& a, const std::string& p, Mlp::Activation act) {
  const std::int64_t h = a.arch.hidden_size;
  const std::int64_t inter = a.arch.intermediate_size;
  auto mlp = std::make_unique<Mlp>();
  mlp->activation = act;
  mlp->intermediate = inter;
  mlp->gate = a.weights.layer_matrix(p, Role::kFfnGate, inter, h);
  mlp->up = a.weights.layer_matrix(p, Role::kFfnUp, inter, h);
  mlp->down = a.weights.layer_matrix(p, Role::kFfnDown, h, inter);
  return mlp;
}

Block llama_layer(Assembler& a, const model::LayerDesc& l, const std::string& p,
                  LlamaLayerOptions options) {
  const std::int64_t h = a.arch.hidden_size;
  Block b;
  b.name = l.name;
  b.eps = a.arch.rms_norm_eps;
  b.mixer_norm = a.weights.layer(p, Role::kAttnNorm, {h});
  b.mixer = attention_mixer(a, l, p, options);
  b.mlp_norm = a.weights.layer(p, Role::kFfnNorm, {h});
  b.mlp = gated_mlp(a, p, Mlp::Activation::kSwiGlu);
  b.mlp->numerics = numerics_of(a, l);
  return b;
}

void build_llama(Assembler& a, Network& net) {
  build_model(a, net, [&] {
    for (const model::LayerDesc& l : a.desc.layers) {
      if (l.owner != model::Owner::kTarget) continue;
      net.blocks.push_back(llama_layer(a, l, a.weights.layer_prefix(l.index)));
    }
  });
}

Family family_of(const model::Architecture& arch) {
  const std::string& t = arch.model_type;
  if (t == "nemotron_h") return {nemotron_h_names(), build_nemotron_h};
  if (t == "gemma2") return {gemma2_names(), build_gemma2};
  if (t.starts_with("qwen3_next") || t.starts_with("qwen3_5")) {
    return {qwen3_next_names(), build_qwen3_next};
  }
  return {llama_names(), build_llama};
}

}  // namespace mixkv::runner
