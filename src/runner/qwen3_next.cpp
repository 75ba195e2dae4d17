// Qwen3-Next (and Qwen3.5): Llama's attention layers beside Gated DeltaNet layers, each followed
// by the same RMSNorm and SwiGLU MLP (the tiny model keeps a dense MLP where Qwen3-Next has
// experts; docs/engine.md).
#include <cmath>

#include "runner/family.hpp"

namespace mixkv::runner {
namespace {

// HF Qwen3NextGatedDeltaNet: q, k, v, z and b, a projections, a depthwise conv over q, k, v,
// per-head gated RMSNorm, output projection.
Block gdn_layer(Assembler& a, const model::LayerDesc& l, const std::string& p) {
  const std::int64_t h = a.arch.hidden_size;
  const kernels::GdnLayerSpec g = kernels::gdn_layer_spec(l, a.desc.num_spec_tokens);
  const std::int64_t key = g.gdn.num_k_heads * g.gdn.k_dim;
  const std::int64_t value = g.gdn.num_v_heads * g.gdn.v_dim;
  WeightSource& w = a.weights;
  Block b;
  b.name = l.name;
  b.eps = a.arch.rms_norm_eps;
  b.mixer_norm = w.layer(p, Role::kAttnNorm, {h});
  GatedDeltaNet::Weights gw;
  gw.in_qkvz = w.layer_matrix(p, Role::kSsmInQkvz, 2 * key + 2 * value, h);
  gw.in_ba = w.layer_matrix(p, Role::kSsmInBa, 2 * g.gdn.num_v_heads, h);
  gw.conv = w.layer(p, Role::kSsmConv, {g.conv.channels, 1, g.conv.kernel});
  gw.dt_bias = w.layer(p, Role::kSsmDtBias, {g.gdn.num_v_heads});
  gw.a_neg = w.layer(p, Role::kSsmALog, {g.gdn.num_v_heads});
  for (float& v : gw.a_neg) v = -std::exp(v);
  gw.norm = w.layer(p, Role::kSsmNorm, {g.gdn.v_dim});
  gw.out = w.layer_matrix(p, Role::kSsmOut, h, value);
  b.mixer = std::make_unique<GatedDeltaNet>(l.name, g, a.layer_geometry(l.name), std::move(gw),
                                            a.arch.rms_norm_eps);
  b.mlp_norm = w.layer(p, Role::kFfnNorm, {h});
  b.mlp = gated_mlp(a, p, Mlp::Activation::kSwiGlu);
  return b;
}

}  // namespace

void build_qwen3_next(Assembler& a, Network& net) {
  build_model(a, net, [&] {
    for (const model::LayerDesc& l : a.desc.layers) {
      if (l.owner != model::Owner::kTarget) continue;
      const std::string p = a.weights.layer_prefix(l.index);
      net.blocks.push_back(l.kind == model::LayerKind::kGdn ? gdn_layer(a, l, p)
                                                            : llama_layer(a, l, p));
    }
  });
}

}  // namespace mixkv::runner
