// The real SmolLM2-135M-Instruct Q4_1 GGUF: its header, metadata and tensors as llama.cpp's
// converter wrote them, its ModelDesc through the llama family path, and the CLI on it.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "cli_test_support.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/weights/dequantize.hpp"
#include "mixkv/weights/gguf.hpp"
#include "mixkv/weights/gguf_model.hpp"
#include "test_support.hpp"
#include "weights/gguf_builder.hpp"
#include "weights/smollm2.hpp"

namespace mixkv::weights {
namespace {

using testing::expect_error;

TEST(SmolLm2Gguf, HeaderMetadataAndTensors) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.file_size(), 98362432u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges")->size(), 48900u);
  ASSERT_EQ(f.tensors().size(), 272u);
  std::map<GgmlType, int> types;
  for (const GgufTensor& t : f.tensors()) ++types[t.type];
  EXPECT_EQ(types[GgmlType::kQ4_1], 210);              // 7 projections x 30 layers
  EXPECT_EQ(types[GgmlType::kF32], 61);                // 2 norms x 30 layers + output_norm
  EXPECT_EQ(types[GgmlType::kQ8_0], 1);                // token_embd
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied to the embedding
  const GgufTensor& embd = f.tensor("token_embd.weight");
  EXPECT_EQ(embd.shape, (std::vector<std::int64_t>{49152, 576}));
  EXPECT_EQ(embd.bytes.size(), 49152u * 576 / 32 * 34);
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").shape, (std::vector<std::int64_t>{192, 576}));
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").shape, (std::vector<std::int64_t>{576, 1536}));
  const GgufTensor& last = f.tensors().back();
  EXPECT_LE(f.data_offset() + last.offset + last.bytes.size(), f.file_size());
}

TEST(SmolLm2Gguf, EveryTensorDequantisesToFiniteValues) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  // One row of each tensor (the whole file would take seconds under the sanitizers).
  for (const GgufTensor& t : f.tensors()) {
    const std::int64_t row = t.row_elements();
    const std::int64_t row_bytes = ggml_bytes(t.type, row);
    std::vector<float> y(static_cast<std::size_t>(row));
    dequantize(t.type, t.bytes.subspan(t.bytes.size() - row_bytes), y);
    for (float v : y) ASSERT_TRUE(std::isfinite(v)) << t.name;
  }
  // RMS-norm weights hover around 1; embeddings are small.
  std::vector<float> norm = dequantize(f.tensor("output_norm.weight"));
  double mean = 0;
  for (float v : norm) mean += v / norm.size();
  EXPECT_GT(mean, 0.2);
  EXPECT_LT(mean, 5.0);
}

TEST(SmolLm2Gguf, ConfigAndModelDescFollowTheLlamaKeys) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const GgufFile f = GgufFile::open(path);
  const nlohmann::json c = weights::hf_config_from_gguf(f);
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 576);
  EXPECT_EQ(c["intermediate_size"], 1536);
  EXPECT_EQ(c["num_hidden_layers"], 30);
  EXPECT_EQ(c["num_attention_heads"], 9);
  EXPECT_EQ(c["num_key_value_heads"], 3);
  EXPECT_EQ(c["max_position_embeddings"], 8192);
  EXPECT_EQ(c["rope_theta"], 100000.0);
  EXPECT_NEAR(c["rms_norm_eps"].get<double>(), 1e-5, 1e-12);
  EXPECT_EQ(c["vocab_size"], 49152);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_FALSE(c.contains("rope_scaling"));

  for (const std::string& ref : {path, std::string("smollm2-135m")}) {
    const model::ModelDesc desc = weights::describe_refs(ref, std::nullopt, {});
    ASSERT_EQ(desc.layers.size(), 30u);
    for (const auto& l : desc.layers) {
      EXPECT_EQ(l.kind, model::LayerKind::kFull);
      EXPECT_EQ(l.num_q_heads, 9);
      EXPECT_EQ(l.num_kv_heads, 3);
      EXPECT_EQ(l.head_size, 64);
      EXPECT_DOUBLE_EQ(l.scale, 0.125);
    }
    EXPECT_EQ(desc.facts.vocab_size, 49152);
    EXPECT_EQ(desc.facts.hidden_size, 576);
    EXPECT_EQ(desc.facts.max_position_embeddings, 8192);
  }
}

TEST(SmolLm2Gguf, DescribeAndPlanCommandsTakeTheFile) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const auto described = testing::run_cli("describe", {"smollm2-135m"});
  ASSERT_EQ(described.status, 0) << described.err;
  EXPECT_NE(described.out.find("0-29"), std::string::npos) << described.out;
  const auto planned = testing::run_cli("plan", {path, "--memory", "1GiB"});
  ASSERT_EQ(planned.status, 0) << planned.err;
  // 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes = 23040 B per token.
  EXPECT_NE(planned.out.find("concurrency at 2500 tokens"), std::string::npos) << planned.out;
}

TEST(GgufModel, OtherArchitecturesAndMissingKeysAreClearErrors) {
  testing::GgufBuilder b;
  b.str("general.architecture", "mamba");
  std::vector<std::byte> bytes = b.build();
  expect_error([&] { weights::hf_config_from_gguf(GgufFile::parse(bytes, "m.gguf")); },
               ErrorCode::kUnsupported, {"m.gguf", "'mamba'"});
  testing::GgufBuilder l;
  l.str("general.architecture", "llama");
  l.u32("llama.embedding_length", 64);
  bytes = l.build();
  expect_error([&] { weights::hf_config_from_gguf(GgufFile::parse(bytes, "l.gguf")); },
               ErrorCode::kInvalidInput, {"l.gguf", "llama.feed_forward_length", "missing"});
}

TEST(GgufModel, RopeScalingKeysBecomeRopeScaling) {
  testing::GgufBuilder b;
  b.str("general.architecture", "llama");
  for (auto [k, v] : {std::pair{"embedding_length", 64u},
                      {"feed_forward_length", 128u},
                      {"block_count", 2u},
                      {"attention.head_count", 4u},
                      {"context_length", 4096u}}) {
    b.u32(std::string("llama.") + k, v);
  }
  b.str("llama.rope.scaling.type", "yarn");
  b.f32("llama.rope.scaling.factor", 4.0f);
  b.u32("llama.rope.scaling.original_context_length", 1024);
  const std::vector<std::byte> bytes = b.build();
  const nlohmann::json c = weights::hf_config_from_gguf(GgufFile::parse(bytes, "r.gguf"));
  EXPECT_EQ(c["rope_scaling"]["rope_type"], "yarn");
  EXPECT_EQ(c["rope_scaling"]["factor"], 4.0);
  EXPECT_EQ(c["rope_scaling"]["original_max_position_embeddings"], 1024);
  EXPECT_EQ(c["num_key_value_heads"], 4);  // defaults to the query heads
}

TEST(FetchedModels, AMissingFileSaysToRunMakeDeps) {
  const char* old = std::getenv("MIXKV_MODEL_DIR");
  const std::string saved = old ? old : "";
  setenv("MIXKV_MODEL_DIR", "/nonexistent-mixkv-models", 1);
  expect_error([] { weights::describe_refs("smollm2-135m", std::nullopt, {}); },
               ErrorCode::kInvalidInput,
               {"smollm2-135m", "make deps", "/nonexistent-mixkv-models"});
  if (old) {
    setenv("MIXKV_MODEL_DIR", saved.c_str(), 1);
  } else {
    unsetenv("MIXKV_MODEL_DIR");
  }
}

}  // namespace
}  // namespace mixkv::weights
