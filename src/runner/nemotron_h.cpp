// Nemotron-H (HF NemotronHForCausalLM): one block per character of hybrid_override_pattern, each
// its RMSNorm, one mixer or MLP, and the residual: M a Mamba2 mixer, * attention without RoPE
// (NemotronHAttention takes no positional embedding), - an MLP (up, relu², down; no gate).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "mixkv/core/error.hpp"
#include "runner/family.hpp"

namespace mixkv::runner {
namespace {

std::unique_ptr<Mamba2> mamba2_mixer(Assembler& a, const model::LayerDesc& l,
                                     const std::string& p) {
  const std::int64_t h = a.arch.hidden_size;
  const kernels::Mamba2LayerSpec m = kernels::mamba2_layer_spec(l, a.desc.num_spec_tokens);
  const std::int64_t inner = m.ssm.heads * m.ssm.head_dim;
  const std::int64_t conv = m.conv.channels;  // x, B, C
  WeightSource& w = a.weights;
  Mamba2::Weights mw;
  mw.in_proj = w.layer_matrix(p, Role::kSsmIn, inner + conv + m.ssm.heads, h);
  mw.conv = w.layer(p, Role::kSsmConv, {conv, 1, m.conv.kernel});
  if (a.arch.conv_bias) mw.conv_bias = w.layer(p, Role::kSsmConvBias, {conv});
  mw.dt_bias = w.layer(p, Role::kSsmDtBias, {m.ssm.heads});
  mw.a_neg = w.layer(p, Role::kSsmALog, {m.ssm.heads});
  for (float& v : mw.a_neg) v = -std::exp(v);
  mw.d_skip = w.layer(p, Role::kSsmD, {m.ssm.heads});
  mw.norm = w.layer(p, Role::kSsmNorm, {inner});
  mw.out = w.layer_matrix(p, Role::kSsmOut, h, inner);
  return std::make_unique<Mamba2>(l.name, m, a.layer_geometry(l.name), std::move(mw),
                                  a.arch.rms_norm_eps);
}

}  // namespace

void build_nemotron_h(Assembler& a, Network& net) {
  const model::Architecture& c = a.arch;
  const std::int64_t h = c.hidden_size;
  WeightSource& w = a.weights;
  build_model(a, net, [&] {
    for (std::size_t i = 0; i < c.block_pattern.size(); ++i) {
      const std::string p = w.layer_prefix(static_cast<int>(i));
      const char kind = c.block_pattern[i];
      Block b;
      b.name = fmt::format("layers.{}", i);
      b.eps = c.rms_norm_eps;
      std::vector<float> norm = w.layer(p, Role::kAttnNorm, {h});
      if (kind == '-') {
        auto mlp = std::make_unique<Mlp>();
        mlp->activation = Mlp::Activation::kRelu2;
        mlp->intermediate = c.intermediate_size;
        mlp->up = w.layer_matrix(p, Role::kFfnUp, c.intermediate_size, h);
        mlp->down = w.layer_matrix(p, Role::kFfnDown, h, c.intermediate_size);
        b.mlp_norm = std::move(norm);
        b.mlp = std::move(mlp);
        net.blocks.push_back(std::move(b));
        continue;
      }
      const auto l = std::find_if(a.desc.layers.begin(), a.desc.layers.end(),
                                  [&](const model::LayerDesc& d) { return d.name == b.name; });
      if (l == a.desc.layers.end()) {
        throw_invalid(fmt::format("block {} ('{}') of hybrid_override_pattern has no layer {}", i,
                                  kind, b.name));
      }
      b.mixer_norm = std::move(norm);
      if (kind == '*') {
        b.mixer = attention_mixer(a, *l, p, {.rope = false});
      } else {
        b.mixer = mamba2_mixer(a, *l, p);
      }
      net.blocks.push_back(std::move(b));
    }
  });
}

}  // namespace mixkv::runner
