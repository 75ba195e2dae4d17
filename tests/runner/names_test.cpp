// One name table per family: the same family code lists HuggingFace and GGUF (llama.cpp) names,
// one per tensor, with the same shapes in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/kernels/matmul.hpp"
#include "mixkv/model/architecture.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/weights/gguf.hpp"
#include "runner/names.hpp"
#include "weights/gguf_builder.hpp"

namespace mixkv::runner {
namespace {

struct Listed {
  WeightShapes hf, gguf;
};

Listed listed(std::string_view tiny) {
  const model::ModelSource src = engine::tiny_model_source(*engine::find_tiny_model(tiny));
  const model::Architecture arch = model::read_architecture(src);
  const model::ModelDesc desc = model::describe(src, std::nullopt, {});
  return {weight_shapes(arch, desc), weight_shapes(arch, desc, WeightNaming::kGguf)};
}

bool has(const WeightShapes& w, const std::string& name) {
  return std::any_of(w.begin(), w.end(), [&](const auto& e) { return e.first == name; });
}

TEST(NameTables, EachFamilyListsHfAndGgufNamesOfTheSameShapesOnce) {
  for (std::string_view tiny : {"tiny-swa", "tiny-hybrid", "tiny-mamba", "tiny-gemma"}) {
    const Listed l = listed(tiny);
    ASSERT_EQ(l.hf.size(), l.gguf.size()) << tiny;
    std::set<std::string> hf, gguf;
    for (std::size_t i = 0; i < l.hf.size(); ++i) {
      EXPECT_EQ(l.hf[i].second, l.gguf[i].second) << tiny << " " << l.hf[i].first;
      hf.insert(l.hf[i].first);
      gguf.insert(l.gguf[i].first);
    }
    EXPECT_EQ(hf.size(), l.hf.size()) << tiny << ": a name listed twice";
    EXPECT_EQ(gguf.size(), l.gguf.size()) << tiny << ": a GGUF name listed twice";
    EXPECT_EQ(l.gguf.front().first, "token_embd.weight") << tiny;
    EXPECT_TRUE(has(l.gguf, "output_norm.weight")) << tiny;
  }
  const Listed swa = listed("tiny-swa");
  EXPECT_TRUE(has(swa.hf, "model.layers.0.self_attn.q_proj.weight"));
  for (const char* n : {"blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                        "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                        "blk.0.attn_sinks.weight", "blk.3.ffn_norm.weight", "blk.3.ffn_gate.weight",
                        "blk.3.ffn_up.weight", "blk.3.ffn_down.weight"}) {
    EXPECT_TRUE(has(swa.gguf, n)) << n;
  }
  const Listed gemma = listed("tiny-gemma");
  EXPECT_TRUE(has(gemma.gguf, "blk.0.post_attention_norm.weight"));
  EXPECT_TRUE(has(gemma.gguf, "blk.0.post_ffw_norm.weight"));
  EXPECT_TRUE(has(gemma.hf, "model.layers.0.pre_feedforward_layernorm.weight"));
  const Listed mamba = listed("tiny-mamba");
  EXPECT_TRUE(has(mamba.hf, "backbone.layers.0.mixer.in_proj.weight"));
  for (const char* n : {"blk.0.ssm_in.weight", "blk.0.ssm_conv1d.weight", "blk.0.ssm_conv1d.bias",
                        "blk.0.ssm_dt.bias", "blk.0.ssm_a", "blk.0.ssm_d", "blk.0.ssm_norm.weight",
                        "blk.0.ssm_out.weight"}) {
    EXPECT_TRUE(has(mamba.gguf, n)) << n;
  }
  const Listed hybrid = listed("tiny-hybrid");
  EXPECT_TRUE(has(hybrid.hf, "model.layers.0.linear_attn.in_proj_qkvz.weight"));
  EXPECT_TRUE(has(hybrid.gguf, "blk.0.ssm_ba.weight"));
}

// --weight-order blocksum reaches every GGUF matrix whose type reads an order: bf16 (packed into
// panels of 32 rows, x rounded to bf16 in the products) and the block formats (packed where this
// CPU's path reads the packed layout); float32 matrices keep the default. The ggml order leaves
// them all alone.
TEST(WeightSource, BlocksumOrderReachesTheBf16AndBlockMatricesOfAGguf) {
  mixkv::testing::GgufBuilder b;
  b.str("general.architecture", "llama");
  const auto zeros = [](std::int64_t n) {
    return std::vector<std::byte>(static_cast<std::size_t>(n));
  };
  b.tensor("blk.0.attn_q.weight", {64, 32}, 30,
           zeros(kernels::weight_bytes(kernels::WeightType::kBfloat16, 32, 64)));
  b.tensor("blk.0.attn_k.weight", {64, 32}, 8,
           zeros(kernels::weight_bytes(kernels::WeightType::kQ8_0, 32, 64)));
  b.tensor("blk.0.attn_v.weight", {64, 32}, 0,
           zeros(kernels::weight_bytes(kernels::WeightType::kFloat32, 32, 64)));
  const std::vector<std::byte> bytes = b.build();
  const weights::GgufFile file = weights::GgufFile::parse(bytes, "test.gguf");
  for (const auto order : {kernels::ReductionOrder::kGgml, kernels::ReductionOrder::kBlockSum}) {
    WeightSource source(llama_names(), {nullptr, &file}, "test.gguf", WeightNaming::kGguf);
    source.set_weight_order(order);
    const std::string prefix = source.layer_prefix(0);
    const Matrix q = source.layer_matrix(prefix, Role::kAttnQ, 32, 64);
    const Matrix k = source.layer_matrix(prefix, Role::kAttnK, 32, 64);
    const Matrix v = source.layer_matrix(prefix, Role::kAttnV, 32, 64);
    EXPECT_EQ(q.view.dtype, kernels::WeightType::kBfloat16);
    EXPECT_EQ(q.view.order, order);
    EXPECT_EQ(q.packed != nullptr, order == kernels::ReductionOrder::kBlockSum);
    EXPECT_EQ(k.view.dtype, kernels::WeightType::kQ8_0);
    EXPECT_EQ(k.view.order, order);
    const bool packs = order == kernels::ReductionOrder::kBlockSum &&
                       kernels::matmul_reads_packed(kernels::WeightType::kQ8_0);
    EXPECT_EQ(k.packed != nullptr, packs);
    EXPECT_EQ(v.view.dtype, kernels::WeightType::kFloat32);
    EXPECT_EQ(v.view.order, kernels::ReductionOrder::kGgml);
  }
}

}  // namespace
}  // namespace mixkv::runner
