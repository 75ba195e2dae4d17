// tiny-mamba (Nemotron-H blocks: Mamba2, attention without RoPE, relu² MLP): its blocks run
// through the plan with Nemotron-H's weight names, one Mamba2 block equals HF's formulas written
// out in double, and what the runner does not compute is refused by name. Speculation, rollback,
// prefix hits and preemption are in recurrent_targets_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "engine/engine_test_support.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/kernels/recurrent_kernel.hpp"

namespace mixkv::engine {
namespace {

ModelRunner make_mamba(const RunnerOptions& o = {}) {
  return testing::tiny_runner("tiny-mamba", o);
}

TEST(TinyMamba, RunsMamba2LayersThroughTheCachePlanWithNemotronHWeightNames) {
  ModelRunner runner = make_mamba({.num_spec_tokens = 2});
  int mamba = 0, attention = 0;
  for (const layout::LayerGeometry& g : runner.geometry().layers) {
    (g.recurrent ? mamba : attention) += 1;
  }
  EXPECT_EQ(mamba, 4);
  EXPECT_EQ(attention, 2);  // the "-" blocks hold no cache
  const auto spec = kernels::mamba2_layer_spec(runner.desc().layers[0], 2);
  EXPECT_EQ(spec.conv.rows, 5);  // conv 4 - 1 + 2 speculative rows
  EXPECT_EQ(spec.conv.channels, 64 + 2 * 2 * 16);
  EXPECT_EQ(spec.ssm.groups, 2);
  const auto shapes = weight_shapes(runner.config(), runner.desc());
  const std::map<std::string, std::vector<std::int64_t>> named(shapes.begin(), shapes.end());
  EXPECT_EQ(named.at("backbone.embeddings.weight"), (std::vector<std::int64_t>{260, 64}));
  EXPECT_EQ(named.at("backbone.layers.0.mixer.in_proj.weight"),
            (std::vector<std::int64_t>{64 + 128 + 8, 64}));  // z, x B C, dt
  EXPECT_EQ(named.at("backbone.layers.0.mixer.conv1d.weight"),
            (std::vector<std::int64_t>{128, 1, 4}));
  EXPECT_EQ(named.at("backbone.layers.0.mixer.norm.weight"), (std::vector<std::int64_t>{64}));
  EXPECT_EQ(named.count("backbone.layers.0.mixer.D"), 1u);
  EXPECT_EQ(named.count("backbone.layers.1.mixer.up_proj.weight"), 1u);
  EXPECT_EQ(named.count("backbone.layers.1.mixer.gate_proj.weight"), 0u);  // relu², no gate
  EXPECT_EQ(named.count("backbone.layers.3.mixer.q_proj.weight"), 1u);
  EXPECT_EQ(named.count("backbone.norm_f.weight"), 1u);
}

// One Mamba2 block against HF's formulas written out in double, token by token over the whole
// history: in_proj split [z; x, B, C; dt], the causal conv (weight[c][K-1] on the newest token)
// with bias and SiLU, dt = softplus(dt + dt_bias), A = -exp(A_log), head h reading B/C group
// h / (heads / groups), the D skip, y * SiLU(z) normalised per group, out_proj, residual.
TEST(TinyMamba, Mamba2BlockMatchesHfFormulasWrittenOutInDouble) {
  const model::ModelSource src = model::parse_model_source("m", "one Mamba2 block", R"({
    "model_type": "nemotron_h", "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "hybrid_override_pattern": "M", "num_attention_heads": 2,
    "mamba_num_heads": 4, "mamba_head_dim": 4, "ssm_state_size": 8, "n_groups": 2,
    "conv_kernel": 3, "vocab_size": 40, "max_position_embeddings": 256,
    "layer_norm_epsilon": 1e-5, "torch_dtype": "float32"})");
  const model::Architecture config = model::read_architecture(src);
  const weights::TensorMap w = generate_weights(config, model::describe(src, std::nullopt, {}), 21);
  ModelRunner runner(src, w);
  const std::vector<TokenId> tokens = {3, 17, 5, 5, 39, 0, 22, 8, 13, 31};
  cache::KvCacheManager m(runner.plan(), 0);
  m.add_request(cache::RequestId{0}, tokens);
  ASSERT_EQ(m.admit(cache::RequestId{0}, 0), 0);
  SequenceInput in;
  in.tokens = tokens;
  for (std::size_t g = 0; g < runner.plan().groups.size(); ++g) {
    in.block_tables.push_back(m.block_table(cache::RequestId{0}, static_cast<int>(g)));
  }
  const ForwardOutput got = runner.forward(std::span(&in, 1));

  const auto at = [&](const std::string& name) { return w.at(name).values; };
  const std::string p = "backbone.layers.0.mixer.";
  const auto embed = at("backbone.embeddings.weight"), norm = at("backbone.layers.0.norm.weight");
  const auto in_proj = at(p + "in_proj.weight"), conv_w = at(p + "conv1d.weight"),
             conv_b = at(p + "conv1d.bias"), dt_bias = at(p + "dt_bias"), a_log = at(p + "A_log"),
             d = at(p + "D"), gnorm = at(p + "norm.weight"), out_proj = at(p + "out_proj.weight"),
             norm_f = at("backbone.norm_f.weight"), lm_head = at("lm_head.weight");
  constexpr std::int64_t kH = 16, kHeads = 4, kP = 4, kN = 8, kG = 2, kK = 3, kVocab = 40;
  constexpr std::int64_t kInner = kHeads * kP, kConv = kInner + 2 * kG * kN,
                         kWidth = kInner + kConv + kHeads;
  const auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  const auto rms = [](std::vector<double> v, const float* weight, double eps) {
    double ss = 0.0;
    for (double x : v) ss += x * x;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(v.size()) + eps);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] *= inv * weight[i];
    return v;
  };
  std::vector<std::vector<double>> history;  // x, B, C inputs of the conv
  std::vector<double> state(kHeads * kP * kN, 0.0);
  double worst = 0.0, scale = 0.0;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    std::vector<double> x(embed.begin() + tokens[t] * kH, embed.begin() + (tokens[t] + 1) * kH);
    const std::vector<double> normed = rms(x, norm.data(), 1e-5);
    std::vector<double> proj(kWidth, 0.0);
    for (std::int64_t o = 0; o < kWidth; ++o) {
      for (std::int64_t i = 0; i < kH; ++i) proj[o] += in_proj[o * kH + i] * normed[i];
    }
    history.emplace_back(proj.begin() + kInner, proj.begin() + kInner + kConv);
    std::vector<double> c(kConv);
    for (std::int64_t ch = 0; ch < kConv; ++ch) {
      double sum = conv_b[ch];
      for (std::int64_t k = 0; k < kK; ++k) {
        const auto back = static_cast<std::ptrdiff_t>(t) - (kK - 1) + k;
        if (back >= 0) sum += conv_w[ch * kK + k] * history[static_cast<std::size_t>(back)][ch];
      }
      c[ch] = silu(sum);
    }
    std::vector<double> y(kInner);
    for (std::int64_t h = 0; h < kHeads; ++h) {
      const std::int64_t g = h / (kHeads / kG);
      const double raw = proj[kInner + kConv + h] + dt_bias[h];
      const double dt = raw > 20.0 ? raw : std::log1p(std::exp(raw));
      const double decay = std::exp(dt * -std::exp(static_cast<double>(a_log[h])));
      for (std::int64_t pp = 0; pp < kP; ++pp) {
        const double xv = c[h * kP + pp];
        double sum = 0.0;
        for (std::int64_t n = 0; n < kN; ++n) {
          double& s = state[(h * kP + pp) * kN + n];
          s = decay * s + dt * xv * c[kInner + g * kN + n];
          sum += c[kInner + kG * kN + g * kN + n] * s;
        }
        y[h * kP + pp] = sum + d[h] * xv;
      }
    }
    for (std::int64_t i = 0; i < kInner; ++i) y[i] *= silu(proj[i]);
    const std::int64_t per = kInner / kG;
    for (std::int64_t g = 0; g < kG; ++g) {
      const auto part = rms(std::vector<double>(y.begin() + g * per, y.begin() + (g + 1) * per),
                            gnorm.data() + g * per, 1e-5);
      std::copy(part.begin(), part.end(), y.begin() + g * per);
    }
    for (std::int64_t o = 0; o < kH; ++o) {
      for (std::int64_t i = 0; i < kInner; ++i) x[o] += out_proj[o * kInner + i] * y[i];
    }
    const std::vector<double> final_normed = rms(x, norm_f.data(), 1e-5);
    for (std::int64_t v = 0; v < kVocab; ++v) {
      double logit = 0.0;
      for (std::int64_t i = 0; i < kH; ++i) logit += lm_head[v * kH + i] * final_normed[i];
      worst = std::max(worst, std::abs(logit - got.logits[t * kVocab + v]));
      scale = std::max(scale, std::abs(logit));
    }
  }
  EXPECT_GT(scale, 0.5);
  EXPECT_LT(worst, 1e-4 * scale);
}

TEST(TinyMamba, WhatTheRunnerDoesNotComputeIsRefusedByName) {
  const auto refused = [](const char* json, const char* needle) {
    const model::ModelSource src = model::parse_model_source("m", "test config", json);
    try {
      ModelRunner runner(src, weights::TensorMap{});
      ADD_FAILURE() << "ran: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Nemotron-H's mixture-of-experts blocks and projection biases.
  refused(R"({"model_type": "nemotron_h", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 3, "hybrid_override_pattern": "M*E", "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 16,
    "ssm_state_size": 16, "n_groups": 1, "conv_kernel": 4, "vocab_size": 260,
    "torch_dtype": "float32"})",
          "block 2 is 'E'");
  refused(R"({"model_type": "nemotron_h", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "hybrid_override_pattern": "M*", "num_attention_heads": 4,
    "head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16,
    "n_groups": 1, "conv_kernel": 4, "vocab_size": 260, "use_bias": true})",
          "'use_bias' is true");
}

}  // namespace
}  // namespace mixkv::engine
