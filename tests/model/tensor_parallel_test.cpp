// Tensor-parallel sharding rules, per layer kind.
#include <gtest/gtest.h>

#include "mixkv/model/describe.hpp"
#include "test_support.hpp"

namespace mixkv::model {
namespace {

using testing::describe_builtin;
using testing::layers_of;

DescribeOptions tp(int n) {
  DescribeOptions o;
  o.tp = n;
  return o;
}

TEST(TensorParallel, KvHeadsSplitWhenAtLeastTheRankCount) {
  const ModelDesc d = describe_builtin("llama-3.1-70b", {}, tp(4));
  EXPECT_EQ(d.layers.front().num_q_heads, 16);
  EXPECT_EQ(d.layers.front().num_kv_heads, 2);
}

TEST(TensorParallel, KvHeadsReplicatedWhenFewerThanRanks) {
  const ModelDesc d = describe_builtin("llama-3.1-70b", {}, tp(16));
  EXPECT_EQ(d.layers.front().num_q_heads, 4);
  EXPECT_EQ(d.layers.front().num_kv_heads, 1);
}

TEST(TensorParallel, QueryHeadsThatDoNotDivideAreAnError) {
  testing::expect_error([] { describe_builtin("qwen3.5-27b", {}, tp(16)); },
                        ErrorCode::kInvalidInput, {"layers.3", "num_q_heads = 24", "--tp 16"});
}

TEST(TensorParallel, KvHeadsThatCannotBeReplicatedAreAnError) {
  // 8 query heads over 8 ranks fit, but 3 KV heads can be neither split nor replicated.
  testing::expect_error(
      [] {
        testing::describe_text(
            R"({"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 24,
            "num_key_value_heads": 3, "head_dim": 64})",
            tp(8));
      },
      ErrorCode::kInvalidInput, {"3 KV heads", "--tp 8"});
}

TEST(TensorParallel, MlaShardsQueryHeadsAndKeepsOneLatent) {
  const ModelDesc d = describe_builtin("deepseek-v3", {}, tp(8));
  EXPECT_EQ(d.layers.front().num_q_heads, 16);
  EXPECT_EQ(d.layers.front().num_kv_heads, 1);
  EXPECT_EQ(d.layers.front().head_size, 576);
}

TEST(TensorParallel, Mamba2ShardsHeadsGroupsAndConvChannels) {
  const ModelDesc d = describe_builtin("nemotron-h-8b", {}, tp(4));
  const LayerDesc& m = *layers_of(d, LayerKind::kMamba2).front();
  // 8192 / 4 inner + 2 x (8 / 4) groups x 128
  EXPECT_EQ(m.state[0].shape, (std::vector<std::int64_t>{3, 2048 + 512}));
  EXPECT_EQ(m.state[1].shape, (std::vector<std::int64_t>{32, 64, 128}));
}

TEST(TensorParallel, SingleMamba2GroupIsReplicatedOnEveryRank) {
  const ModelDesc d = describe_builtin("granite-4.0-h-small", {}, tp(4));
  const LayerDesc& m = *layers_of(d, LayerKind::kMamba2).front();
  EXPECT_EQ(m.state[0].shape, (std::vector<std::int64_t>{3, 2048 + 256}));
}

TEST(TensorParallel, Mamba2GroupsThatDoNotSplitAreAnError) {
  testing::expect_error([] { describe_builtin("nemotron-h-8b", {}, tp(16)); },
                        ErrorCode::kInvalidInput, {"n_groups = 8", "--tp 16"});
}

TEST(TensorParallel, GdnHeadsThatDoNotDivideAreAnError) {
  // Qwen3-Next has 16 query heads, so tp 32 fails on the first attention layer or GDN layer.
  testing::expect_error([] { describe_builtin("qwen3-next-80b-a3b", {}, tp(32)); },
                        ErrorCode::kInvalidInput,
                        {"layers.0", "linear_num_key_heads = 16", "--tp 32"});
}

TEST(TensorParallel, KdaAndMamba1ShardTheirStates) {
  const ModelDesc kimi = describe_builtin("kimi-linear-48b", {}, tp(2));
  const LayerDesc& kda = *layers_of(kimi, LayerKind::kKda).front();
  EXPECT_EQ(kda.state[0].shape, (std::vector<std::int64_t>{3, 2048}));
  EXPECT_EQ(kda.state[3].shape, (std::vector<std::int64_t>{16, 128, 128}));
  const ModelDesc jamba = describe_builtin("jamba-v0.1", {}, tp(2));
  const LayerDesc& m1 = *layers_of(jamba, LayerKind::kMamba1).front();
  EXPECT_EQ(m1.state[0].shape, (std::vector<std::int64_t>{3, 4096}));
  EXPECT_EQ(m1.state[1].shape, (std::vector<std::int64_t>{4096, 16}));
}

TEST(TensorParallel, LayerCountDoesNotChange) {
  EXPECT_EQ(describe_builtin("gpt-oss-120b", {}, tp(8)).layers.size(), 36u);
}

}  // namespace
}  // namespace mixkv::model
