// The reference runner: tiny models through the describe path, weights from a seed or a
// safetensors checkpoint, and logits independent of batch composition and chunking.
#include "mixkv/runner/model_runner.hpp"
#include "engine/engine_test_support.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::engine {
namespace {

const TinyModel& swa() { return *find_tiny_model("tiny-swa"); }

ModelRunner make_runner(const TinyModel& m, const RunnerOptions& o = {}) {
  const model::ModelSource src = tiny_model_source(m);
  const auto config = model::read_architecture(src);
  const auto desc = model::describe(src, std::nullopt, {});
  return ModelRunner(src, generate_weights(config, desc, m.seed), o);
}

// A prompt of `n` bytes that differs per `salt`.
std::vector<TokenId> prompt(std::size_t n, int salt) {
  std::vector<TokenId> p;
  for (std::size_t i = 0; i < n; ++i) p.push_back(static_cast<TokenId>((i * 7 + salt * 13) % 256));
  return p;
}

// Runs every prompt through the manager in chunks of `chunk` tokens, all requests in each
// step's batch, and returns each prompt's logits rows.
std::vector<std::vector<float>> prefill_logits(ModelRunner& runner,
                                               const std::vector<std::vector<TokenId>>& prompts,
                                               std::int64_t chunk) {
  cache::KvCacheManager m(runner.plan(), 0);
  std::vector<std::vector<float>> out(prompts.size());
  std::vector<std::int64_t> done(prompts.size(), 0);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    m.add_request(cache::RequestId{static_cast<std::int64_t>(i)}, prompts[i]);
    EXPECT_EQ(m.admit(cache::RequestId{static_cast<std::int64_t>(i)}, 0), 0);
  }
  const auto v = static_cast<std::size_t>(runner.vocab_size());
  for (;;) {
    std::vector<SequenceInput> batch;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const auto left = static_cast<std::int64_t>(prompts[i].size()) - done[i];
      if (left == 0) continue;
      SequenceInput in;
      in.start = done[i];
      in.tokens = std::span<const TokenId>(prompts[i])
                      .subspan(static_cast<std::size_t>(done[i]),
                               static_cast<std::size_t>(std::min(chunk, left)));
      for (std::size_t g = 0; g < runner.plan().groups.size(); ++g)
        in.block_tables.push_back(
            m.block_table(cache::RequestId{static_cast<std::int64_t>(i)}, static_cast<int>(g)));
      batch.push_back(in);
      who.push_back(i);
    }
    if (batch.empty()) break;
    const ForwardOutput f = runner.forward(batch);
    std::size_t row = 0;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      const std::size_t i = who[b];
      const auto n = batch[b].tokens.size();
      out[i].insert(out[i].end(), f.logits.begin() + static_cast<std::ptrdiff_t>(row * v),
                    f.logits.begin() + static_cast<std::ptrdiff_t>((row + n) * v));
      row += n;
      m.commit(cache::RequestId{static_cast<std::int64_t>(i)}, static_cast<std::int64_t>(n), {});
      done[i] += static_cast<std::int64_t>(n);
    }
  }
  return out;
}

TEST(TinyModels, DescribeAndPlanThroughTheNormalPath) {
  const model::ModelDesc desc = model::describe(tiny_model_source(swa()), std::nullopt, {});
  ASSERT_EQ(desc.layers.size(), 4u);
  EXPECT_EQ(desc.layers[0].kind, model::LayerKind::kSliding);
  EXPECT_EQ(desc.layers[0].window, 32);
  EXPECT_TRUE(desc.layers[0].sinks);
  EXPECT_EQ(desc.layers[1].kind, model::LayerKind::kFull);
  EXPECT_EQ(desc.layers[1].num_kv_heads, 2);
  const auto hybrid =
      model::describe(tiny_model_source(*find_tiny_model("tiny-hybrid")), std::nullopt, {});
  int gdn = 0;
  for (const auto& l : hybrid.layers) gdn += l.kind == model::LayerKind::kGdn;
  EXPECT_EQ(gdn, 6);
  EXPECT_EQ(find_tiny_model("qwen3-8b"), nullptr);
}

TEST(TinyModels, ByteVocabularyRoundTripsText) {
  const std::string text = "héllo, world\n\x01\xff";
  EXPECT_EQ(decode_bytes(encode_bytes(text)), text);
  const std::vector<TokenId> specials = {kBosToken, 'a', kEosToken, 999};
  EXPECT_EQ(decode_bytes(specials), "<|bos|>a<|eos|><|999|>");
}

TEST(ModelRunner, Mamba2LayersOutsideNemotronHAndMamba1LayersAreRefusedNamingTheLayer) {
  // tiny-hybrid's Gated DeltaNet and tiny-mamba's (nemotron_h) Mamba2 layers run
  // (hybrid_test.cpp, mamba_test.cpp); granitemoehybrid's block layout is not built.
  EXPECT_TRUE(find_tiny_model("tiny-hybrid")->missing.empty());
  EXPECT_TRUE(find_tiny_model("tiny-mamba")->missing.empty());
  const model::ModelSource src = model::parse_model_source("mamba", "test granitemoehybrid", R"({
    "model_type": "granitemoehybrid", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "layer_types": ["mamba", "attention"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16,
    "mamba_n_groups": 1, "mamba_d_conv": 4, "vocab_size": 260, "max_position_embeddings": 512,
    "torch_dtype": "float32"})");
  try {
    ModelRunner runner(src, weights::TensorMap{});
    FAIL() << "a Mamba2 layer ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("layers.0 is mamba2"), std::string::npos) << e.what();
  }
  // Mamba1 (Jamba) layers stay refused too.
  const model::ModelSource jamba = model::parse_model_source("jamba", "test jamba", R"({
    "model_type": "jamba", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "layers_block_type": ["attention", "mamba"], "num_attention_heads": 4,
    "num_key_value_heads": 2, "mamba_expand": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
    "vocab_size": 260, "max_position_embeddings": 512, "torch_dtype": "float32"})");
  try {
    ModelRunner runner(jamba, weights::TensorMap{});
    FAIL() << "a Mamba1 layer ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("layers.1 is mamba1"), std::string::npos) << e.what();
  }
}

TEST(ModelRunner, GeneratedWeightsAreDeterministicPerSeed) {
  const model::ModelSource src = tiny_model_source(swa());
  const auto config = model::read_architecture(src);
  const auto desc = model::describe(src, std::nullopt, {});
  EXPECT_EQ(generate_weights(config, desc, 7), generate_weights(config, desc, 7));
  EXPECT_NE(generate_weights(config, desc, 7), generate_weights(config, desc, 8));
  EXPECT_EQ(generate_weights(config, desc, 7).count("model.layers.0.self_attn.sinks"), 1u);
}

TEST(ModelRunner, LogitsDoNotDependOnBatchCompositionOrChunking) {
  ModelRunner runner = make_runner(swa());
  // Longer than the 32-token window, and a shared prefix.
  const std::vector<TokenId> a = prompt(90, 1);
  std::vector<TokenId> b = prompt(50, 2);
  std::vector<TokenId> c(a.begin(), a.begin() + 40);
  c.push_back(7);
  const auto alone = prefill_logits(runner, {a}, 1000);
  const auto together = prefill_logits(runner, {b, a, c}, 13);
  const auto token_by_token = prefill_logits(runner, {a}, 1);
  ASSERT_EQ(alone[0].size(), 90u * 260u);
  EXPECT_EQ(together[1], alone[0]);  // bit-identical
  EXPECT_EQ(token_by_token[0], alone[0]);
  // The shared prefix gives the same logits at the shared positions.
  EXPECT_TRUE(std::equal(together[2].begin(), together[2].begin() + 40 * 260, alone[0].begin()));
  // And the window matters: a prompt differing only before the window still changes logits
  // through the full layers, so the model is not trivially position-blind.
  std::vector<TokenId> a2 = a;
  a2[0] = (a2[0] + 1) % 256;
  const auto other = prefill_logits(runner, {a2}, 1000);
  EXPECT_NE(std::vector<float>(other[0].end() - 260, other[0].end()),
            std::vector<float>(alone[0].end() - 260, alone[0].end()));
}

// A step of many requests with few rows each runs as one part per thread (every layer of a part
// on its thread alone, then the LM head together): each request's logits are still the bits of its
// prefill alone on one thread, for attention with sinks and windows, Gated DeltaNet and Mamba2
// states, and soft-capped logits; steps of chunks of 3 (9 requests: parts of 4 and 5), then of 1.
TEST(ModelRunner, ManyRequestsRunAsAPartPerThreadGiveEachRequestsBits) {
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 9; ++i) prompts.push_back(prompt(static_cast<std::size_t>(7 + 3 * i), i));
  for (const char* name : {"tiny-swa", "tiny-hybrid", "tiny-mamba", "tiny-gemma"}) {
    RunnerOptions one, two;
    one.threads = 1;
    two.threads = 2;
    ModelRunner alone = make_runner(*find_tiny_model(name), one);
    ModelRunner parts = make_runner(*find_tiny_model(name), two);
    for (const std::int64_t chunk : {3, 1}) {
      const auto together = prefill_logits(parts, prompts, chunk);
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(together[i], prefill_logits(alone, {prompts[i]}, 1000)[0])
            << name << ", request " << i << ", chunks of " << chunk;
      }
    }
  }
}

// A part may hold only requests without a token this step (the first request holds every row):
// it is skipped, and the other part's logits are the bits of the request alone.
TEST(ModelRunner, APartOfRequestsWithoutTokensIsSkipped) {
  RunnerOptions one, two;
  one.threads = 1;
  two.threads = 2;
  ModelRunner alone = make_runner(swa(), one), parts = make_runner(swa(), two);
  const std::vector<TokenId> p = prompt(6, 4);
  const auto run = [&](ModelRunner& runner, std::size_t requests) {
    cache::KvCacheManager m(runner.plan(), 0);
    std::vector<SequenceInput> batch;
    for (std::size_t i = 0; i < requests; ++i) {
      const cache::RequestId id{static_cast<std::int64_t>(i)};
      m.add_request(id, p);
      EXPECT_EQ(m.admit(id, 0), 0);
      SequenceInput in;
      if (i == 0) in.tokens = p;
      for (std::size_t g = 0; g < runner.plan().groups.size(); ++g)
        in.block_tables.push_back(m.block_table(id, static_cast<int>(g)));
      in.logits = runner::LogitRows::kAll;
      batch.push_back(in);
    }
    return runner.forward(batch).logits;
  };
  const std::vector<float> want = run(alone, 1);
  // Twice: the first step runs the batch together, the next as parts (forward() times both).
  EXPECT_EQ(run(parts, 9), want);
  EXPECT_EQ(run(parts, 9), want);
}

// The LM head runs only for the rows asked for (sched::logit_rows: a prompt's last row, decode
// rows), and those rows' logits are the bits every row's forward gives.
TEST(ModelRunner, LogitsOfChosenRowsOnlyAreTheSameBits) {
  ModelRunner runner = make_runner(swa());
  const std::vector<std::vector<TokenId>> prompts = {prompt(40, 1), prompt(9, 2), prompt(5, 3)};
  const auto run = [&](const std::vector<runner::LogitRows>& rows) {
    cache::KvCacheManager m(runner.plan(), 0);
    std::vector<SequenceInput> batch;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const cache::RequestId id{static_cast<std::int64_t>(i)};
      m.add_request(id, prompts[i]);
      EXPECT_EQ(m.admit(id, 0), 0);
      SequenceInput in;
      in.tokens = prompts[i];
      for (std::size_t g = 0; g < runner.plan().groups.size(); ++g)
        in.block_tables.push_back(m.block_table(id, static_cast<int>(g)));
      in.logits = rows[i];
      batch.push_back(in);
    }
    return runner.forward(batch);
  };
  using runner::LogitRows;
  const ForwardOutput all = run({LogitRows::kAll, LogitRows::kAll, LogitRows::kAll});
  const ForwardOutput some = run({LogitRows::kLast, LogitRows::kNone, LogitRows::kAll});
  const std::size_t v = 260;
  ASSERT_EQ(all.logits.size(), 54 * v);
  ASSERT_EQ(some.logits.size(), 6 * v);  // row 39 of the first prompt, the third's 5 rows
  EXPECT_TRUE(
      std::equal(some.logits.begin(), some.logits.begin() + v, all.logits.begin() + 39 * v));
  EXPECT_TRUE(std::equal(some.logits.begin() + v, some.logits.end(), all.logits.begin() + 49 * v));
  EXPECT_EQ(some.hidden, all.hidden);  // every row's hidden state, for the drafters
  const ForwardOutput none = run({LogitRows::kNone, LogitRows::kNone, LogitRows::kNone});
  EXPECT_TRUE(none.logits.empty());
}

TEST(ModelRunner, SafetensorsCheckpointGivesTheSameLogitsAsGeneratedWeights) {
  // tiny-hybrid adds Qwen3-Next's linear_attn.* weights of its Gated DeltaNet layers, tiny-mamba
  // Nemotron-H's backbone.* names, tiny-gemma Gemma 2's extra norms.
  for (const char* name : {"tiny-swa", "tiny-hybrid", "tiny-mamba", "tiny-gemma"}) {
    const TinyModel& m = *find_tiny_model(name);
    const model::ModelSource src = tiny_model_source(m);
    const auto config = model::read_architecture(src);
    const auto desc = model::describe(src, std::nullopt, {});
    const weights::TensorMap weights = generate_weights(config, desc, m.seed);
    const auto dir = std::filesystem::temp_directory_path() /
                     ("mixkv_ckpt_" + std::string(name) + "_" +
                      std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    std::filesystem::create_directories(dir);
    weights::write_safetensors((dir / "model.safetensors").string(), weights);
    { std::ofstream(dir / "config.json") << m.config_json; }
    const model::ModelSource loaded = model::load_model_source(dir.string());
    ModelRunner from_file(loaded, weights::read_safetensors((dir / "model.safetensors").string()));
    ModelRunner generated(src, weights);
    const std::vector<TokenId> p = prompt(40, 3);
    EXPECT_EQ(prefill_logits(from_file, {p}, 16), prefill_logits(generated, {p}, 16)) << name;
    std::filesystem::remove_all(dir);
  }
}

TEST(ModelRunner, Mamba2AndSoftCappedLogitsDoNotDependOnBatchCompositionOrChunking) {
  for (const char* name : {"tiny-mamba", "tiny-gemma"}) {
    ModelRunner runner = make_runner(*find_tiny_model(name));
    const std::vector<TokenId> a = prompt(70, 1);  // beyond tiny-gemma's 32-token window
    std::vector<TokenId> b = prompt(30, 2);
    std::vector<TokenId> c(a.begin(), a.begin() + 40);
    c.push_back(7);
    const auto alone = prefill_logits(runner, {a}, 1000);
    const auto together = prefill_logits(runner, {b, a, c}, 13);
    const auto token_by_token = prefill_logits(runner, {a}, 1);
    ASSERT_EQ(alone[0].size(), 70u * 260u) << name;
    EXPECT_EQ(together[1], alone[0]) << name;  // bit-identical
    EXPECT_EQ(token_by_token[0], alone[0]) << name;
    EXPECT_TRUE(std::equal(together[2].begin(), together[2].begin() + 40 * 260, alone[0].begin()))
        << name;
  }
}

TEST(ModelRunner, SoftCapReachesTheAttentionKernel) {
  // The same weights with attn_logit_softcapping removed from tiny-gemma's config give other
  // logits; final_logit_softcapping keeps them within 30, and removing it gives larger ones.
  const TinyModel& m = *find_tiny_model("tiny-gemma");
  const model::ModelSource src = tiny_model_source(m);
  const auto weights = generate_weights(model::read_architecture(src),
                                        model::describe(src, std::nullopt, {}), m.seed);
  const auto without = [&](std::vector<std::string> keys) {
    nlohmann::json doc = nlohmann::json::parse(m.config_json);
    for (const auto& key : keys) doc.erase(key);
    return model::parse_model_source("tiny-gemma", "tiny-gemma without soft cap", doc.dump());
  };
  ModelRunner capped(src, weights);
  ModelRunner uncapped(without({"attn_logit_softcapping"}), weights);
  EXPECT_FALSE(uncapped.attention_spec("layers.0").params.soft_cap.has_value());
  const std::vector<TokenId> p = prompt(50, 4);
  const auto want = prefill_logits(capped, {p}, 16)[0];
  const auto got = prefill_logits(uncapped, {p}, 16)[0];
  ASSERT_EQ(want.size(), got.size());
  EXPECT_NE(want, got);
  float largest = 0.0f;
  for (float v : want) largest = std::max(largest, std::abs(v));
  EXPECT_LE(largest, 30.0f);
  ModelRunner raw(without({"attn_logit_softcapping", "final_logit_softcapping"}), weights);
  float raw_largest = 0.0f;
  const auto raw_logits = prefill_logits(raw, {p}, 16)[0];
  for (float v : raw_logits) raw_largest = std::max(raw_largest, std::abs(v));
  EXPECT_GT(raw_largest, largest);
}

TEST(ModelRunner, MissingOrMisshapenWeightsAreNamed) {
  const model::ModelSource src = tiny_model_source(swa());
  const auto config = model::read_architecture(src);
  const auto desc = model::describe(src, std::nullopt, {});
  weights::TensorMap w = generate_weights(config, desc, 1);
  w.erase("model.layers.2.mlp.up_proj.weight");
  try {
    ModelRunner r(src, w);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.mlp.up_proj.weight"), std::string::npos);
  }
  w = generate_weights(config, desc, 1);
  w["lm_head.weight"].shape = {64, 260};
  try {
    ModelRunner r(src, w);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight has shape [64, 260]"), std::string::npos)
        << e.what();
  }
}

TEST(ModelRunner, ArgmaxBreaksTiesTowardTheLowestId) {
  const std::vector<float> l = {0.0f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(argmax(l), 1);
}

// The vectorised argmax against the one-scan definition, on rows of every length up to 40 (the
// lane loop and its tail) with ties, NaNs, signed zeros and infinities.
TEST(ModelRunner, ArgmaxIsTheFirstLargestOfOneScan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> pool = {0.0f, -0.0f, 1.0f, 1.0f, -1.0f, 2.0f, nan, inf, -inf, 0.5f};
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const auto n = static_cast<std::size_t>(1 + trial % 40);
    std::vector<float> l(n);
    for (float& v : l) v = pool[rng() % pool.size()];
    std::size_t best = 0;
    for (std::size_t i = 1; i < n; ++i) {
      if (l[i] > l[best]) best = i;
    }
    ASSERT_EQ(argmax(l), static_cast<TokenId>(best)) << "trial " << trial;
  }
}

// The rows' argmax split across two threads: each row's argmax(), and a size that is no whole
// number of rows is refused.
TEST(ModelRunner, ArgmaxRowsIsEachRowsArgmaxOnAnyThread) {
  RunnerOptions o;
  o.threads = 2;
  ModelRunner runner = make_runner(swa(), o);
  const auto vocab = static_cast<std::size_t>(runner.vocab_size());
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<float> logits(7 * vocab);
  for (float& v : logits) v = value(rng);
  std::vector<TokenId> picks(7);
  runner.argmax_rows(logits, picks);
  for (std::size_t r = 0; r < picks.size(); ++r) {
    EXPECT_EQ(picks[r], argmax(std::span<const float>(logits).subspan(r * vocab, vocab))) << r;
  }
  EXPECT_THROW(runner.argmax_rows(std::span<const float>(logits).first(vocab + 1),
                                  std::span(picks).first(1)),
               Error);
}

}  // namespace
}  // namespace mixkv::engine
