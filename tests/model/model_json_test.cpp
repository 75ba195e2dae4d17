// The describe JSON contract and the native model file: same document, round trip exact.
#include <gtest/gtest.h>

#include "mixkv/builtin/builtin_models.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model_json.hpp"
#include "test_support.hpp"

namespace mixkv::model {
namespace {

using nlohmann::json;
using testing::describe_builtin;

ModelDesc round_trip(const ModelDesc& desc, const DescribeOptions& options = {}) {
  const std::string text = to_json(desc).dump(2);
  return describe(parse_model_source("file", "model.json", text), std::nullopt, options);
}

TEST(ModelJson, ContractKeysArePresentWithTheirTypes) {
  const json j = to_json(describe_builtin("qwen3-next-80b-a3b"));
  for (const char* key : {"model", "draft", "tp", "num_spec_tokens", "layers"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["model"], "qwen3-next-80b-a3b");
  EXPECT_TRUE(j["draft"].is_null());
  EXPECT_EQ(j["tp"], 1);
  EXPECT_EQ(j["num_spec_tokens"], 0);
  ASSERT_EQ(j["layers"].size(), 48u);
  const json& gdn = j["layers"][0];
  const json& full = j["layers"][3];
  for (const char* key :
       {"name", "owner", "index", "kind", "num_q_heads", "num_kv_heads", "head_size", "head_size_v",
        "window", "chunk", "soft_cap", "scale", "sinks", "causal", "kv_dtype", "state"}) {
    EXPECT_TRUE(full.contains(key)) << key;
  }
  EXPECT_EQ(full["owner"], "target");
  EXPECT_EQ(full["kind"], "full");
  EXPECT_EQ(full["index"], 3);
  EXPECT_TRUE(full["window"].is_null());
  EXPECT_TRUE(full["soft_cap"].is_null());
  EXPECT_TRUE(full["state"].is_array() && full["state"].empty());
  EXPECT_EQ(full["kv_dtype"], "bfloat16");
  EXPECT_EQ(gdn["kind"], "gdn");
  EXPECT_EQ(gdn["state"][0], (json{{"name", "conv"}, {"shape", {3, 8192}}, {"dtype", "bfloat16"}}));
  EXPECT_EQ(gdn["state"][1],
            (json{{"name", "temporal"}, {"shape", {32, 128, 128}}, {"dtype", "bfloat16"}}));
}

TEST(ModelJson, DrafterFieldsAreReported) {
  const json j = to_json(describe_builtin("qwen3.5-27b", "dflash-qwen3.5-27b"));
  EXPECT_EQ(j["draft"], "dflash-qwen3.5-27b");
  EXPECT_EQ(j["num_spec_tokens"], 15);
  const json& last = j["layers"].back();
  EXPECT_EQ(last["owner"], "draft");
  EXPECT_EQ(last["causal"], false);
  EXPECT_EQ(j["draft_info"]["kind"], "dflash");
  EXPECT_EQ(j["draft_info"]["block_size"], 16);
}

TEST(ModelJson, EveryBuiltinPairRoundTripsThroughTheNativeFile) {
  std::vector<std::pair<std::string, std::optional<std::string>>> cases;
  for (const auto& m : builtin::builtin_models()) {
    if (m.role == builtin::Role::kTarget) cases.emplace_back(std::string(m.name), std::nullopt);
    for (auto target : m.targets) cases.emplace_back(std::string(target), std::string(m.name));
  }
  cases.emplace_back("deepseek-v3", std::string(kMtpDraft));
  for (const auto& [target, draft] : cases) {
    for (int tp : {1, 2}) {
      DescribeOptions options;
      options.tp = tp;
      std::optional<std::string_view> draft_ref;
      if (draft) draft_ref = *draft;
      const ModelDesc desc = describe_refs(target, draft_ref, options);
      EXPECT_EQ(round_trip(desc), desc)
          << target << " + " << draft.value_or("none") << " tp " << tp;
    }
  }
}

TEST(ModelJson, SyntheticNativeFileDescribesAnyMix) {
  const char* text = R"({"model": "synthetic", "layers": [
      {"name": "a", "owner": "target", "index": 0, "kind": "chunked", "num_q_heads": 8, "num_kv_heads": 1,
       "head_size": 64, "chunk": 4096, "kv_dtype": "fp8"},
      {"name": "b", "owner": "target", "index": 1, "kind": "mamba2", "num_q_heads": 0, "num_kv_heads": 0,
       "head_size": 0, "state": [{"name": "conv", "shape": [3, 512], "dtype": "bfloat16"},
                                 {"name": "ssm", "shape": [8, 64, 16], "dtype": "float32"}]},
      {"name": "c", "owner": "draft", "index": 0, "kind": "full", "num_q_heads": 8, "num_kv_heads": 8,
       "head_size": 128, "head_size_v": 64, "causal": false, "sinks": true, "soft_cap": 30.0}]})";
  const ModelDesc d =
      describe(parse_model_source("synthetic", "synthetic.json", text), std::nullopt, {});
  ASSERT_EQ(d.layers.size(), 3u);
  EXPECT_EQ(d.layers[0].kind, LayerKind::kChunked);
  EXPECT_EQ(d.layers[0].kv_dtype, DType::kFp8E4m3);
  EXPECT_DOUBLE_EQ(d.layers[0].scale, 0.125);  // default head_size^-0.5
  EXPECT_EQ(state_bytes(d.layers[1]), 3 * 512 * 2 + 8 * 64 * 16 * 4);
  EXPECT_EQ(d.layers[2].owner, Owner::kDraft);
  EXPECT_EQ(kv_bytes_per_token(d.layers[2]), 8 * (128 + 64) * 2);
  EXPECT_EQ(round_trip(d), d);
}

TEST(ModelJson, NativeFileTakesDtypeOptionsButNotResharding) {
  const ModelDesc desc = describe_builtin("qwen3-next-80b-a3b");
  DescribeOptions options;
  options.kv_dtype = DType::kFp8E4m3;
  options.ssm_dtype = DType::kFloat32;
  const ModelDesc changed = round_trip(desc, options);
  EXPECT_EQ(changed.layers[3].kv_dtype, DType::kFp8E4m3);
  EXPECT_EQ(changed.layers[0].state[1].dtype, DType::kFloat32);
  EXPECT_EQ(changed.layers[0].state[0].dtype, DType::kBfloat16);

  DescribeOptions reshard;
  reshard.tp = 2;
  testing::expect_error([&] { round_trip(desc, reshard); }, ErrorCode::kInvalidInput,
                        {"model.json", "already per-rank for tp 1", "--tp 2"});
}

}  // namespace
}  // namespace mixkv::model
