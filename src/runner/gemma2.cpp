// Gemma 2 (HF Gemma2DecoderLayer): Llama's layer plus a norm on the attention output and one on
// the MLP output, RMSNorms multiplying by 1 + w, a GELU-tanh gated MLP, embeddings scaled by
// sqrt(hidden) and final_logit_softcapping on the logits. The attention soft cap, window and
// query_pre_attn_scalar come through the plan's kernel spec.
#include <cmath>

#include "runner/family.hpp"

namespace mixkv::runner {
namespace {

// Gemma2RMSNorm multiplies by 1 + w (in float, as here).
std::vector<float> plus_one(std::vector<float> w) {
  for (float& v : w) v += 1.0f;
  return w;
}

}  // namespace

void build_gemma2(Assembler& a, Network& net) {
  const std::int64_t h = a.arch.hidden_size;
  WeightSource& w = a.weights;
  build_model(a, net, [&] {
    for (const model::LayerDesc& l : a.desc.layers) {
      if (l.owner != model::Owner::kTarget) continue;
      const std::string p = w.layer_prefix(l.index);
      Block b;
      b.name = l.name;
      b.eps = a.arch.rms_norm_eps;
      b.mixer_norm = plus_one(w.layer(p, Role::kAttnNorm, {h}));
      b.mixer = attention_mixer(a, l, p, {});
      b.mixer_out_norm = plus_one(w.layer(p, Role::kAttnPostNorm, {h}));
      b.mlp_norm = plus_one(w.layer(p, Role::kFfnNorm, {h}));
      b.mlp_out_norm = plus_one(w.layer(p, Role::kFfnPostNorm, {h}));
      b.mlp = gated_mlp(a, p, Mlp::Activation::kGeluTanhGated);
      net.blocks.push_back(std::move(b));
    }
  });
  net.final_norm = plus_one(std::move(net.final_norm));
  // Gemma2Model scales embeddings by sqrt(hidden_size) (HF rounds the factor to the model's
  // dtype; the runner computes in float32, where 8 for tiny-gemma is exact).
  net.embed_scale = std::sqrt(static_cast<float>(h));
  net.final_logit_softcap = a.arch.final_logit_softcap;
}

}  // namespace mixkv::runner
