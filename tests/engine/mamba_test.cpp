// tiny-mamba (Nemotron-H blocks: Mamba2, attention without RoPE, relu² MLP): speculative decoding
// gives exactly the tokens of plain decoding, and after any accept/reject sequence or prefix hit
// the live Mamba2 conv and SSM states and the attention pages equal, byte for byte, those of a
// run without speculation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "engine_test_support.hpp"
#include "mixkv/error.hpp"
#include "mixkv/generator.hpp"
#include "mixkv/recurrent_kernel.hpp"

namespace mixkv::engine {
namespace {

using testing::references;

ModelRunner make_mamba(const RunnerOptions& o = {}) {
  const TinyModel& m = *find_tiny_model("tiny-mamba");
  const model::ModelSource src = tiny_model_source(m);
  const auto desc = model::describe(src, std::nullopt, {});
  return ModelRunner(src, generate_weights(read_transformer_config(src), desc, m.seed), o);
}

// 16 prompts of 1 to 134 tokens, every other one starting with the same 64 tokens.
std::vector<std::vector<TokenId>> mixed_batch() {
  return testing::mixed_prompts(
      "A Mamba2 block keeps a conv and an SSM state; a prefix hit restores both of them.", 64, 5,
      3);
}

void expect_same_tokens(const GenerateReport& a, const GenerateReport& b, const char* what) {
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].tokens, b.requests[i].tokens) << what << ", request " << i;
  }
}

// A request's cache as the kernels see it: the live conv and SSM states of every Mamba2 layer
// (read_state), and the K/V bytes of every verified position of the attention layers.
struct Image {
  std::map<std::string, std::vector<float>> states;
  std::map<std::pair<std::string, std::int64_t>, std::vector<std::byte>> pages;
};

Image image_of(const ModelRunner& runner, const cache::KvCacheManager& m, cache::RequestId id) {
  Image image;
  for (const layout::LayerGeometry& g : runner.geometry().layers) {
    const auto table = m.block_table(id, g.kv_cache_group);
    const auto tensor = runner.cache_tensor(g.tensor);
    if (g.recurrent) {
      const auto& layers = runner.desc().layers;
      const auto it = std::find_if(layers.begin(), layers.end(),
                                   [&](const model::LayerDesc& l) { return l.name == g.layer; });
      const auto spec = kernels::mamba2_layer_spec(*it, runner.desc().num_spec_tokens);
      image.states[g.layer + ".conv"] =
          kernels::read_state(spec.conv.place, g, tensor, table[0].value());
      image.states[g.layer + ".ssm"] =
          kernels::read_state(spec.ssm.place, g, tensor, table[0].value());
      continue;
    }
    std::vector<std::int64_t> blocks;
    for (cache::BlockId b : table) blocks.push_back(b.value());
    for (std::int64_t p = 0; p < m.num_computed(id); ++p) {
      const layout::TokenLocation at = layout::locate_token(g, blocks, p);
      std::vector<std::byte> bytes(tensor.begin() + at.k_offset,
                                   tensor.begin() + at.k_offset + g.k_token_bytes);
      bytes.insert(bytes.end(), tensor.begin() + at.v_offset,
                   tensor.begin() + at.v_offset + g.v_token_bytes);
      image.pages[{g.layer, p}] = std::move(bytes);
    }
  }
  return image;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_image(const Image& want, const Image& got, const std::string& what) {
  ASSERT_EQ(want.states.size(), 8u) << what;  // 4 Mamba2 layers, conv and SSM states
  ASSERT_EQ(want.states.size(), got.states.size()) << what;
  for (const auto& [name, values] : want.states) {
    EXPECT_TRUE(same_bits(values, got.states.at(name))) << what << ": state " << name;
  }
  ASSERT_FALSE(want.pages.empty()) << what;
  EXPECT_EQ(want.pages.size(), got.pages.size()) << what;
  for (const auto& [key, bytes] : want.pages) {
    const auto it = got.pages.find(key);
    ASSERT_NE(it, got.pages.end()) << what << ": " << key.first << " position " << key.second;
    EXPECT_EQ(it->second, bytes) << what << ": " << key.first << " position " << key.second;
  }
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
  // The recurrence matters: the same last token after different histories gives other tokens.
  GenerateOptions o;
  o.max_tokens = 4;
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("xxxxxxxxz"),
                                                     encode_bytes("yyyyyyyyz")};
  const GenerateReport r = generate(runner, prompts, nullptr, o);
  EXPECT_NE(r.requests[0].tokens, r.requests[1].tokens);
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
  const TransformerConfig config = read_transformer_config(src);
  const TensorMap w = generate_weights(config, model::describe(src, std::nullopt, {}), 21);
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
      ModelRunner runner(src, {});
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

TEST(TinyMamba, SpeculationIsBitIdenticalToPlainDecodingAtBatchOne) {
  ModelRunner runner = make_mamba({.num_spec_tokens = 4});
  const std::vector<std::vector<TokenId>> prompts = {
      encode_bytes("Once upon a time, a selective state space met a paged cache.")};
  GenerateOptions o;
  o.max_tokens = 256;
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  ASSERT_EQ(plain.requests[0].tokens.size(), 256u);

  o.num_spec_tokens = 4;
  OracleDrafter oracle(references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, fast, "oracle");
  EXPECT_EQ(fast.requests[0].stats.acceptance_rate(), 1.0);
  EXPECT_EQ(fast.requests[0].stats.decode_steps, 51);  // 255 tokens in steps of 1 + 4

  RandomDrafter random(runner.vocab_size(), 5);
  const GenerateReport slow = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, slow, "random");
  EXPECT_LT(slow.requests[0].stats.acceptance_rate(), 0.05);
  EXPECT_GT(slow.requests[0].stats.drafted_tokens, 900);

  NgramDrafter ngram;
  const GenerateReport lookup = generate(runner, prompts, &ngram, o);
  expect_same_tokens(plain, lookup, "ngram");
  EXPECT_GT(lookup.requests[0].stats.drafted_tokens, 0);
}

TEST(TinyMamba, SpeculationAndPrefixHitsAreBitIdenticalInAMixedBatchOfSixteen) {
  ModelRunner runner = make_mamba({.num_spec_tokens = 3});
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = 256;
  o.max_batch = 16;
  o.prefill_chunk = 24;
  std::map<std::size_t, Image> plain_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    plain_images[i] = image_of(runner, m, id);
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.before_free = nullptr;

  o.num_spec_tokens = 3;
  OracleDrafter oracle(references(prompts, plain));
  expect_same_tokens(plain, generate(runner, prompts, &oracle, o), "oracle");
  NgramDrafter ngram;
  expect_same_tokens(plain, generate(runner, prompts, &ngram, o), "ngram");
  // Random drafts, nearly all rolled back: every request ends with the plain run's states and
  // pages.
  o.num_spec_tokens = 2;
  RandomDrafter random(runner.vocab_size(), 6);
  std::map<std::size_t, Image> random_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    random_images[i] = image_of(runner, m, id);
  };
  expect_same_tokens(plain, generate(runner, prompts, &random, o), "random");
  ASSERT_EQ(random_images.size(), 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    expect_same_image(plain_images.at(i), random_images.at(i), "random " + std::to_string(i));
  }

  // Five at a time: later requests restore the shared prefix's Mamba2 snapshots (and its
  // attention blocks), and end with the plain run's cache bytes too.
  o.num_spec_tokens = 3;
  o.max_batch = 5;
  std::map<std::size_t, Image> hit_images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t i) {
    hit_images[i] = image_of(runner, m, id);
  };
  const GenerateReport narrow = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, narrow, "five at a time");
  std::int64_t hits = 0;
  for (const auto& r : narrow.requests) hits += r.stats.prefix_hit_tokens;
  EXPECT_GE(hits, 3 * 64);
  ASSERT_EQ(hit_images.size(), 16u);
  for (std::size_t i = 0; i < 16; ++i) {
    expect_same_image(plain_images.at(i), hit_images.at(i), "hit " + std::to_string(i));
  }

  // Each request alone, another chunking, no prefix cache: the same tokens.
  o = {};
  o.max_tokens = 256;
  o.prefill_chunk = 7;
  o.prefix_caching = false;
  for (std::size_t i : {std::size_t{0}, std::size_t{9}}) {
    const std::vector<std::vector<TokenId>> one = {prompts[i]};
    EXPECT_EQ(generate(runner, one, nullptr, o).requests[0].tokens, plain.requests[i].tokens)
        << "request " << i;
  }
}

TEST(TinyMamba, RollbackLeavesMamba2StatesAndPagesByteForByteAsPlainDecoding) {
  ModelRunner runner = make_mamba({.num_spec_tokens = 3});
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("rollback: every rejected draft"),
                                                     encode_bytes(std::string(45, 'w'))};
  GenerateOptions o;
  o.max_tokens = 80;
  std::vector<Image> images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    images.push_back(image_of(runner, m, id));
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 3;
  RandomDrafter random(runner.vocab_size(), 3);
  const GenerateReport spec = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, spec, "random");
  EXPECT_GT(spec.requests[0].stats.drafted_tokens, 200);
  OracleDrafter oracle(references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, fast, "oracle");
  ASSERT_EQ(images.size(), 6u);
  for (std::size_t i = 0; i < 2; ++i) {
    expect_same_image(images[i], images[i + 2], "random, request " + std::to_string(i));
    expect_same_image(images[i], images[i + 4], "oracle, request " + std::to_string(i));
  }
  // The states are not trivially equal: two requests end in different states.
  EXPECT_FALSE(same_bits(images[0].states.at("layers.0.ssm"), images[1].states.at("layers.0.ssm")));
  EXPECT_FALSE(
      same_bits(images[0].states.at("layers.0.conv"), images[1].states.at("layers.0.conv")));
}

TEST(TinyMamba, Bfloat16SsmStatesGiveTheSameTokensPlainAndSpeculative) {
  // One kernel call per token rounds the state to bf16 after every token, in a verify block as
  // in one-by-one decoding.
  ModelRunner runner = make_mamba({.num_spec_tokens = 3, .ssm_dtype = DType::kBfloat16});
  const model::LayerDesc& mamba = runner.desc().layers[0];
  ASSERT_EQ(mamba.state.back().name, "ssm");
  EXPECT_EQ(mamba.state.back().dtype, DType::kBfloat16);
  const std::vector<std::vector<TokenId>> prompts = {encode_bytes("bf16 SSM states, rounded")};
  GenerateOptions o;
  o.max_tokens = 128;
  std::vector<Image> images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    images.push_back(image_of(runner, m, id));
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 3;
  OracleDrafter oracle(references(prompts, plain));
  expect_same_tokens(plain, generate(runner, prompts, &oracle, o), "bf16, oracle");
  RandomDrafter random(runner.vocab_size(), 9);
  expect_same_tokens(plain, generate(runner, prompts, &random, o), "bf16, random");
  ASSERT_EQ(images.size(), 3u);
  expect_same_image(images[0], images[1], "bf16, oracle");
  expect_same_image(images[0], images[2], "bf16, random");
}

TEST(TinyMamba, PreemptionByRecomputeKeepsTheTokens) {
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = 64;
  o.max_batch = 16;
  ModelRunner roomy = make_mamba({.num_spec_tokens = 2});
  const GenerateReport want = generate(roomy, prompts, nullptr, o);
  ModelRunner tight =
      make_mamba({.memory_bytes = 384 << 10, .max_model_len = 256, .num_spec_tokens = 2});
  o.num_spec_tokens = 2;
  RandomDrafter random(tight.vocab_size(), 4);
  const GenerateReport got = generate(tight, prompts, &random, o);
  EXPECT_GT(got.preemptions, 0);
  expect_same_tokens(want, got, "preempted");
}

}  // namespace
}  // namespace mixkv::engine
