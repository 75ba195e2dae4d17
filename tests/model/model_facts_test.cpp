// Model facts: the target's raw numbers, the weight estimate the planner subtracts from device
// memory, and the drafter/target compatibility checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mixkv/builtin/builtin_models.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model_json.hpp"
#include "test_support.hpp"

namespace mixkv::model {
namespace {

using nlohmann::json;
using testing::describe_builtin;
using testing::expect_error;

// Parameters as weight_estimate states them ("estimate: 8.03e9 parameters ..."). The count is
// read from the text because quantized models' bytes are not a fixed multiple of it.
double estimated_parameters(const ModelFacts& facts) {
  double count = 0;
  if (std::sscanf(facts.weight_estimate.c_str(), "estimate: %lf parameters", &count) != 1) {
    ADD_FAILURE() << "unexpected weight_estimate: " << facts.weight_estimate;
  }
  return count;
}

ModelDesc with_tp(std::string_view target, std::optional<std::string_view> draft, int tp) {
  DescribeOptions options;
  options.tp = tp;
  return describe_builtin(target, draft, options);
}

ModelDesc describe_pair(std::string_view target, std::string_view draft_json) {
  return describe(load_model_source(target),
                  parse_model_source("draft.json", "draft.json", draft_json), {});
}

// ---------------------------------------------------------------------------------------------
// Facts read from the config

TEST(ModelFacts, Llama8bReportsItsConfigNumbers) {
  const ModelFacts f = describe_builtin("llama-3.1-8b").facts;
  EXPECT_EQ(f.max_position_embeddings, 131072);
  EXPECT_EQ(f.hidden_size, 4096);
  EXPECT_EQ(f.vocab_size, 128256);
  ASSERT_TRUE(f.weight_bytes.has_value());
  EXPECT_NE(f.weight_estimate.find("estimate"), std::string::npos) << f.weight_estimate;
  EXPECT_NE(f.weight_estimate.find("bfloat16"), std::string::npos) << f.weight_estimate;
  EXPECT_NE(f.weight_estimate.find("/ tp 1"), std::string::npos) << f.weight_estimate;
}

TEST(ModelFacts, NestedTextConfigIsRead) {
  // Qwen3.5 and Gemma 3 keep the language model under text_config.
  const ModelFacts qwen = describe_builtin("qwen3.5-27b").facts;
  EXPECT_EQ(qwen.hidden_size, 5120);
  EXPECT_EQ(qwen.vocab_size, 248320);
  EXPECT_EQ(qwen.max_position_embeddings, 262144);
  const ModelFacts gemma = describe_builtin("gemma-3-27b").facts;
  EXPECT_EQ(gemma.hidden_size, 5376);
  EXPECT_EQ(gemma.vocab_size, 262208);
  EXPECT_EQ(gemma.max_position_embeddings, 131072);
}

TEST(ModelFacts, KimiLinearContextComesFromModelMaxLength) {
  // Its config has no max_position_embeddings, only model_max_length.
  const ModelFacts f = describe_builtin("kimi-linear-48b").facts;
  EXPECT_EQ(f.max_position_embeddings, 1048576);
  EXPECT_EQ(f.hidden_size, 2304);
  EXPECT_EQ(f.vocab_size, 163840);
}

TEST(ModelFacts, DrafterDoesNotChangeTheTargetsNumbers) {
  const ModelFacts alone = describe_builtin("qwen3-8b").facts;
  const ModelFacts paired = describe_builtin("qwen3-8b", "dflash-qwen3-8b-b16").facts;
  EXPECT_EQ(paired.max_position_embeddings, alone.max_position_embeddings);
  EXPECT_EQ(paired.hidden_size, alone.hidden_size);
  EXPECT_EQ(paired.vocab_size, alone.vocab_size);
}

// ---------------------------------------------------------------------------------------------
// Weight estimate

TEST(WeightEstimate, Llama8bIsAboutEightBillionParameters) {
  // Untied embeddings + LM head, then per layer q/k/v/o (32 x 128 query, 8 x 128 KV) and a
  // SwiGLU MLP, in bf16.
  const std::int64_t embed = 2LL * 128256 * 4096;
  const std::int64_t attention = 4096LL * (4096 + 1024 + 1024) + 4096LL * 4096;
  const std::int64_t mlp = 3LL * 4096 * 14336;
  const std::int64_t params = embed + 32 * (attention + mlp);
  const ModelFacts f = describe_builtin("llama-3.1-8b").facts;
  EXPECT_EQ(f.weight_bytes, 2 * params);
  EXPECT_NEAR(estimated_parameters(f), 8.0e9, 0.05 * 8.0e9);
}

TEST(WeightEstimate, EveryBuiltinTargetIsWithinFifteenPercentOfItsPublishedCount) {
  // Published total parameters (text model only for multimodal checkpoints; DeepSeek-V3's 671B
  // excludes its MTP module, which a target described without --draft mtp does not count).
  const std::map<std::string, double, std::less<>> published = {
      {"llama-3.1-8b", 8.0e9},   {"llama-3.1-70b", 70.6e9},     {"qwen3-8b", 8.2e9},
      {"qwen3-32b", 32.8e9},     {"gemma-2-9b", 9.2e9},         {"gemma-3-27b", 27e9},
      {"gpt-oss-20b", 21e9},     {"gpt-oss-120b", 117e9},       {"qwen3-next-80b-a3b", 80e9},
      {"qwen3.5-27b", 27e9},     {"nemotron-h-8b", 8e9},        {"deepseek-v3", 671e9},
      {"kimi-linear-48b", 48e9}, {"glm-4.5-air", 106e9},        {"mistral-7b", 7.2e9},
      {"jamba-v0.1", 52e9},      {"granite-4.0-h-small", 32e9},
  };
  for (const auto& m : builtin::builtin_models()) {
    if (m.role != builtin::Role::kTarget) continue;
    auto it = published.find(m.name);
    if (it == published.end()) {
      ADD_FAILURE() << m.name << " has no published parameter count in this test; add one";
      continue;
    }
    const ModelFacts f = describe_builtin(m.name).facts;
    ASSERT_TRUE(f.weight_bytes.has_value()) << m.name << ": " << f.weight_estimate;
    EXPECT_NEAR(estimated_parameters(f), it->second, 0.15 * it->second)
        << m.name << ": " << f.weight_estimate;
  }
}

TEST(WeightEstimate, UnquantizedBytesAreTwoPerParameter) {
  for (std::string_view name : {"qwen3-next-80b-a3b", "kimi-linear-48b", "jamba-v0.1"}) {
    const ModelFacts f = describe_builtin(name).facts;
    ASSERT_TRUE(f.weight_bytes.has_value()) << name;
    EXPECT_NEAR(static_cast<double>(*f.weight_bytes), 2 * estimated_parameters(f),
                0.01 * static_cast<double>(*f.weight_bytes))
        << name;
  }
}

TEST(WeightEstimate, GptOssExpertsCountAtMxfp4) {
  // gpt-oss stores its experts in mxfp4 (4.25 bits with scales) and the rest in bf16: the 21B
  // model's checkpoint is about 13.8 GB.
  const ModelFacts f = describe_builtin("gpt-oss-20b").facts;
  ASSERT_TRUE(f.weight_bytes.has_value());
  EXPECT_GT(*f.weight_bytes, 12.5e9);
  EXPECT_LT(*f.weight_bytes, 14.5e9);
  EXPECT_NE(f.weight_estimate.find("mxfp4"), std::string::npos) << f.weight_estimate;
}

TEST(WeightEstimate, DeepseekFp8IsAboutOneBytePerParameter) {
  // Decoder projections in fp8, embeddings and LM head (1.85e9 parameters) in bf16.
  const ModelFacts f = describe_builtin("deepseek-v3").facts;
  ASSERT_TRUE(f.weight_bytes.has_value());
  const double params = estimated_parameters(f);
  EXPECT_GT(static_cast<double>(*f.weight_bytes), params);
  EXPECT_LT(static_cast<double>(*f.weight_bytes), params + 2.0e9);
  EXPECT_NE(f.weight_estimate.find("fp8"), std::string::npos) << f.weight_estimate;
}

TEST(WeightEstimate, TensorParallelDividesTheBytes) {
  const ModelFacts one = with_tp("llama-3.1-70b", std::nullopt, 1).facts;
  for (int tp : {2, 4, 8}) {
    const ModelFacts f = with_tp("llama-3.1-70b", std::nullopt, tp).facts;
    ASSERT_TRUE(f.weight_bytes.has_value());
    EXPECT_EQ(*f.weight_bytes, (*one.weight_bytes + tp - 1) / tp) << "tp " << tp;
    EXPECT_NE(f.weight_estimate.find(fmt::format("/ tp {}", tp)), std::string::npos)
        << f.weight_estimate;
  }
}

TEST(WeightEstimate, Eagle3HeadAddsItsLayerFcAndDraftVocabHead) {
  // One layer whose q/k/v read 2H (embedding + fused hidden), o, SwiGLU MLP, fc 3H -> H and its
  // own 32000-token LM head; the embeddings are the target's.
  const std::int64_t h = 4096;
  const std::int64_t head =
      2 * h * (4096 + 1024 + 1024) + h * 4096 + 3 * h * 14336 + 3 * h * h + 32000 * h;
  const ModelFacts alone = describe_builtin("llama-3.1-8b").facts;
  const ModelFacts paired = describe_builtin("llama-3.1-8b", "eagle3-llama-3.1-8b").facts;
  EXPECT_EQ(*paired.weight_bytes - *alone.weight_bytes, 2 * head);
  EXPECT_NE(paired.weight_estimate.find("eagle3 drafter"), std::string::npos)
      << paired.weight_estimate;
}

TEST(WeightEstimate, DflashDrafterAddsItsLayersAndFc) {
  // Five Qwen3 layers and fc 5 x H -> H (five tapped target layers); no embeddings or LM head.
  const std::int64_t h = 4096;
  const std::int64_t layer = h * (4096 + 1024 + 1024) + h * 4096 + 3 * h * 12288;
  const std::int64_t drafter = 5 * layer + 5 * h * h;
  const ModelFacts alone = describe_builtin("qwen3-8b").facts;
  const ModelFacts paired = describe_builtin("qwen3-8b", "dflash-qwen3-8b-b16").facts;
  EXPECT_EQ(*paired.weight_bytes - *alone.weight_bytes, 2 * drafter);
}

TEST(WeightEstimate, PlainDraftModelCountsAsAWholeModel) {
  const ModelFacts target = describe_builtin("qwen3-32b").facts;
  const ModelFacts draft = describe_builtin("qwen3-8b").facts;
  const ModelFacts paired = describe_builtin("qwen3-32b", "qwen3-8b").facts;
  EXPECT_EQ(*paired.weight_bytes, *target.weight_bytes + *draft.weight_bytes);
}

TEST(WeightEstimate, MtpLayersCountOnlyWhenTheyDraft) {
  // Serving engines skip MTP weights unless MTP drafts, so the plain target leaves them out.
  const ModelFacts alone = describe_builtin("deepseek-v3").facts;
  const ModelFacts mtp = describe_builtin("deepseek-v3", kMtpDraft).facts;
  ASSERT_TRUE(alone.weight_bytes && mtp.weight_bytes);
  // One MLA + MoE layer and its 2H -> H projection: about 11.6e9 fp8 parameters.
  EXPECT_NEAR(static_cast<double>(*mtp.weight_bytes - *alone.weight_bytes), 11.6e9, 0.5e9);
  EXPECT_NE(mtp.weight_estimate.find("MTP layers"), std::string::npos) << mtp.weight_estimate;
}

TEST(WeightEstimate, MissingFieldGivesNoEstimateButStillDescribes) {
  // The cache shapes need no intermediate_size; the estimate does.
  const ModelDesc d = testing::describe_text(R"({"model_type": "llama", "num_hidden_layers": 2,
      "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000})");
  EXPECT_EQ(d.layers.size(), 2u);
  EXPECT_EQ(d.facts.hidden_size, 256);
  EXPECT_FALSE(d.facts.weight_bytes.has_value());
  EXPECT_NE(d.facts.weight_estimate.find("no estimate"), std::string::npos)
      << d.facts.weight_estimate;
  EXPECT_NE(d.facts.weight_estimate.find("intermediate_size"), std::string::npos)
      << d.facts.weight_estimate;
}

TEST(WeightEstimate, OverflowGivesNoEstimateNotAWrappedValue) {
  // The MLP's 3 x hidden x intermediate_size, both at the largest config integer, does not fit
  // in 64 bits.
  const ModelDesc d = testing::describe_text(R"({"model_type": "llama", "num_hidden_layers": 1,
      "hidden_size": 2147483647, "num_attention_heads": 8, "head_dim": 128,
      "intermediate_size": 2147483647, "vocab_size": 1000})");
  EXPECT_FALSE(d.facts.weight_bytes.has_value());
  EXPECT_NE(d.facts.weight_estimate.find("overflows"), std::string::npos)
      << d.facts.weight_estimate;
}

// ---------------------------------------------------------------------------------------------
// Drafter / target compatibility

TEST(DrafterFit, EveryBuiltinDrafterPairsWithItsTargets) {
  for (const auto& m : builtin::builtin_models()) {
    for (auto target : m.targets) {
      ModelDesc d;
      EXPECT_NO_THROW(d = describe_builtin(target, m.name)) << target << " + " << m.name;
      EXPECT_TRUE(d.facts.weight_bytes.has_value()) << target << " + " << m.name;
    }
  }
}

TEST(DrafterFit, VocabMismatchNamesBothModelsAndValues) {
  expect_error([] { describe_builtin("qwen3-8b", "eagle3-llama-3.1-8b"); },
               ErrorCode::kInvalidInput,
               {"drafter eagle3-llama-3.1-8b: vocab_size 128256 differs from the target qwen3-8b's "
                "151936",
                "trained for another target"});
}

TEST(DrafterFit, PlainDraftModelVocabMustMatchToo) {
  expect_error([] { describe_builtin("llama-3.1-8b", "qwen3-8b"); }, ErrorCode::kInvalidInput,
               {"drafter qwen3-8b", "vocab_size 151936", "target llama-3.1-8b's 128256"});
}

TEST(DrafterFit, HiddenSizeMismatchNamesTheField) {
  // Same tokenizer, but the DFlash drafter reads 4096-wide hidden states and Qwen3-32B has 5120.
  expect_error([] { describe_builtin("qwen3-32b", "dflash-qwen3-8b-b16"); },
               ErrorCode::kInvalidInput,
               {"drafter dflash-qwen3-8b-b16", "hidden_size 4096", "target qwen3-32b's 5120"});
}

TEST(DrafterFit, PlainDraftModelMayBeNarrower) {
  EXPECT_NO_THROW(describe_builtin("qwen3-32b", "qwen3-8b"));
}

TEST(DrafterFit, Eagle3TargetHiddenSizeIsWhatMustMatch) {
  // An EAGLE-3 head narrower than its target states the width it reads as target_hidden_size.
  const std::string head = R"({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
      "num_hidden_layers": 1, "hidden_size": 2048, "num_attention_heads": 16,
      "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
      "draft_vocab_size": 32000, "target_hidden_size": )";
  const ModelDesc d = describe_pair("llama-3.1-8b", head + "4096}");
  EXPECT_TRUE(d.facts.weight_bytes.has_value());
  expect_error([&] { describe_pair("llama-3.1-8b", head + "5120}"); }, ErrorCode::kInvalidInput,
               {"drafter draft.json", "target_hidden_size 5120", "target llama-3.1-8b's 4096"});
}

// ---------------------------------------------------------------------------------------------
// The native model file

ModelDesc facts_round_trip(const ModelDesc& desc) {
  return describe(parse_model_source("file", "model.json", to_json(desc).dump(2)), std::nullopt,
                  {});
}

TEST(ModelFactsJson, FactsAreWrittenWithTheirTypes) {
  const json j = to_json(with_tp("qwen3.5-27b", "dflash-qwen3.5-27b", 2));
  ASSERT_TRUE(j.contains("facts"));
  const json& f = j["facts"];
  EXPECT_EQ(f["max_position_embeddings"], 262144);
  EXPECT_EQ(f["hidden_size"], 5120);
  EXPECT_EQ(f["vocab_size"], 248320);
  ASSERT_TRUE(f["weight_bytes"].is_number_integer());
  EXPECT_GT(f["weight_bytes"].get<std::int64_t>(), std::int64_t{1} << 31);  // beyond config ints
  ASSERT_TRUE(f["weight_estimate"].is_string());
  EXPECT_NE(f["weight_estimate"].get<std::string>().find("/ tp 2"), std::string::npos);
}

TEST(ModelFactsJson, FactsRoundTripThroughTheNativeFile) {
  for (auto [target, draft] :
       {std::pair<const char*, const char*>{"qwen3.5-27b", "dflash-qwen3.5-27b"},
        {"gpt-oss-120b", nullptr},
        {"deepseek-v3", "mtp"}}) {
    std::optional<std::string_view> draft_ref;
    if (draft) draft_ref = draft;
    const ModelDesc desc = with_tp(target, draft_ref, 2);
    const ModelDesc back = facts_round_trip(desc);
    EXPECT_EQ(back.facts, desc.facts) << target;
    EXPECT_EQ(back, desc) << target;
  }
}

TEST(ModelFactsJson, FactsAreOptionalWhenReading) {
  json doc = to_json(describe_builtin("llama-3.1-8b"));
  doc.erase("facts");
  EXPECT_EQ(facts_round_trip(model_desc_from_json(doc, "model.json")).facts, ModelFacts{});
  doc["facts"] = {{"weight_bytes", nullptr}, {"hidden_size", 4096}};
  const ModelFacts f = model_desc_from_json(doc, "model.json").facts;
  EXPECT_FALSE(f.weight_bytes.has_value());
  EXPECT_EQ(f.hidden_size, 4096);
  EXPECT_FALSE(f.vocab_size.has_value());
  EXPECT_EQ(f.weight_estimate, "");
}

TEST(ModelFactsJson, NegativeWeightBytesNameTheField) {
  json doc = to_json(describe_builtin("llama-3.1-8b"));
  doc["facts"]["weight_bytes"] = -5;
  expect_error([&] { model_desc_from_json(doc, "model.json"); }, ErrorCode::kInvalidInput,
               {"model.json", "'facts.weight_bytes'", "-5"});
}

}  // namespace
}  // namespace mixkv::model
