// Every class of bad input a user can feed mixkv: each must end in a mixkv::Error with the right
// code whose message names where the problem is (file, field, layer or option) and what would fix
// it. Nothing here may crash, overflow or escape as another exception type.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "mixkv/core/dtype.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model_json.hpp"
#include "test_support.hpp"

namespace mixkv::model {
namespace {

using nlohmann::json;
using testing::describe_builtin;
using testing::describe_text;
using testing::expect_error;

constexpr ErrorCode kInvalid = ErrorCode::kInvalidInput;
constexpr ErrorCode kUnsupported = ErrorCode::kUnsupported;

// A small valid Llama config; each test breaks one thing in it.
json llama() {
  return json::parse(R"({
    "model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096, "torch_dtype": "bfloat16"})");
}

// A small valid Nemotron-H config (Mamba2 + attention).
json nemotron() {
  return json::parse(R"({
    "model_type": "nemotron_h", "num_hidden_layers": 4, "hybrid_override_pattern": "M*M-",
    "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128,
    "hidden_size": 4096, "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128,
    "n_groups": 8, "conv_kernel": 4})");
}

// A small valid DeepSeek (MLA) config.
json deepseek() {
  return json::parse(R"({
    "model_type": "deepseek_v3", "num_hidden_layers": 2, "num_attention_heads": 128,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128})");
}

ModelDesc describe_json(const json& config, const DescribeOptions& options = {}) {
  return describe_text(config.dump(), options);
}

DescribeOptions with_tp(int tp) {
  DescribeOptions o;
  o.tp = tp;
  return o;
}

// The native model file of a built-in, as `mixkv describe --json` would print it.
json native_of(std::string_view builtin_name) { return to_json(describe_builtin(builtin_name)); }

ModelDesc describe_native(const json& doc) {
  return describe(parse_model_source("model", "model.mixkv.json", doc.dump()), std::nullopt, {});
}

// ---------------------------------------------------------------------------------------------
// Missing fields

TEST(BadConfig, MissingHeadCountNamesTheField) {
  json c = llama();
  c.erase("num_attention_heads");
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_attention_heads'", "is missing", "add it"});
}

TEST(BadConfig, NullFieldCountsAsMissing) {
  json c = llama();
  c["num_hidden_layers"] = nullptr;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_hidden_layers'", "is missing", "add it"});
}

TEST(BadConfig, MissingModelTypeNamesTheField) {
  json c = llama();
  c.erase("model_type");
  expect_error([&] { describe_json(c); }, kInvalid, {"test.json", "'model_type'", "is missing"});
}

TEST(BadConfig, MissingHeadDimAndHiddenSizeNamesHiddenSize) {
  json c = llama();
  c.erase("head_dim");
  c.erase("hidden_size");
  expect_error([&] { describe_json(c); }, kInvalid, {"test.json", "'hidden_size'", "is missing"});
}

TEST(BadConfig, HiddenSizeNotDivisibleByHeadsAsksForHeadDim) {
  json c = llama();
  c.erase("head_dim");
  c["hidden_size"] = 4000;
  c["num_attention_heads"] = 48;
  c["num_key_value_heads"] = 8;
  expect_error(
      [&] { describe_json(c); }, kInvalid,
      {"test.json", "'hidden_size'", "not a multiple of num_attention_heads", "add head_dim"});
}

TEST(BadConfig, SlidingLayerWithoutWindowNamesSlidingWindow) {
  json c = llama();
  c["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'sliding_window'", "is missing"});
}

TEST(BadConfig, MissingNestedFieldNamesItsPath) {
  json c;
  c["model_type"] = "gemma3";
  c["text_config"] = llama();
  c["text_config"]["model_type"] = "gemma3_text";
  c["text_config"].erase("num_attention_heads");
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'text_config.num_attention_heads'", "is missing"});
}

TEST(BadConfig, MissingGatedDeltaNetFieldNamesTheField) {
  json c = json::parse(load_model_source("qwen3-next-80b-a3b").doc->dump());
  c.erase("linear_num_value_heads");
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'linear_num_value_heads'", "is missing"});
}

TEST(BadConfig, MissingMambaFieldNamesTheField) {
  json c = nemotron();
  c.erase("ssm_state_size");
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'ssm_state_size'", "is missing"});
}

TEST(BadConfig, MissingKimiLinearSectionNamesTheField) {
  json c = json::parse(load_model_source("kimi-linear-48b").doc->dump());
  c.erase("linear_attn_config");
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'linear_attn_config'", "is missing"});
}

TEST(BadConfig, GraniteHybridWithoutLayerTypesSaysOneTypePerLayer) {
  json c = json::parse(load_model_source("granite-4.0-h-small").doc->dump());
  c.erase("layer_types");
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'layer_types'", "is missing", "one type per layer"});
}

TEST(BadConfig, DflashDrafterWithoutBlockSizeNamesTheField) {
  json d = json::parse(load_model_source("dflash-qwen3-8b-b16").doc->dump());
  d.erase("block_size");
  if (d.contains("dflash_config")) d["dflash_config"].erase("block_size");
  const ModelSource draft = parse_model_source("drafter", "drafter.json", d.dump());
  expect_error([&] { describe(load_model_source("qwen3-8b"), draft, {}); }, kInvalid,
               {"drafter.json", "'block_size'", "is missing", "block size"});
}

// ---------------------------------------------------------------------------------------------
// Mistyped fields

TEST(BadConfig, StringWhereIntegerExpectedNamesTheType) {
  json c = llama();
  c["num_attention_heads"] = "32";
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_attention_heads'", "is a string", "expected an integer"});
}

TEST(BadConfig, BoolWhereIntegerExpectedNamesTheType) {
  json c = llama();
  c["num_key_value_heads"] = true;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_key_value_heads'", "is a boolean", "expected an integer"});
}

TEST(BadConfig, BoolWhereNumberExpectedNamesTheType) {
  json c = llama();
  c["model_type"] = "gemma2";
  c["sliding_window"] = 4096;
  c["attn_logit_softcapping"] = true;
  expect_error(
      [&] { describe_json(c); }, kInvalid,
      {"test.json", "'attn_logit_softcapping'", "is a boolean", "expected a positive number"});
}

TEST(BadConfig, ListWhereObjectExpectedNamesThePath) {
  json c = llama();
  c["text_config"] = json::array({1, 2});
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "text_config", "must be a JSON object", "found a list"});
}

TEST(BadConfig, ObjectWhereBoolExpectedNamesTheField) {
  json c = llama();
  c["model_type"] = "qwen3";
  c["sliding_window"] = 4096;
  c["use_sliding_window"] = json::object();
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'use_sliding_window'", "is an object", "expected true or false"});
}

TEST(BadConfig, FractionalCountIsNotAnInteger) {
  json c = llama();
  c["head_dim"] = 127.5;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'head_dim'", "127.5", "expected an integer"});
}

TEST(BadConfig, IntegralFloatIsAcceptedAsAnInteger) {
  // Some exporters write 128.0; that is not bad input.
  json c = llama();
  c["head_dim"] = 128.0;
  EXPECT_EQ(describe_json(c).layers.front().head_size, 128);
}

TEST(BadConfig, LayerTypesThatIsNotAListNamesTheField) {
  json c = llama();
  c["layer_types"] = "full_attention";
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'layer_types'", "is a string", "expected a list of strings"});
}

TEST(BadConfig, LayerTypesWithANumberNamesThePosition) {
  json c = llama();
  c["layer_types"] = {"full_attention", 7, "full_attention", "full_attention"};
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'layer_types'", "an integer at position 1", "expected a string"});
}

TEST(BadConfig, ModelTypeThatIsNotAStringNamesTheField) {
  json c = llama();
  c["model_type"] = 3;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'model_type'", "is an integer", "expected a string"});
}

TEST(BadConfig, TopLevelListIsNotAConfig) {
  expect_error([] { parse_model_source("m", "list.json", "[1, 2, 3]"); }, kInvalid,
               {"list.json", "expected a JSON object at the top level"});
}

// ---------------------------------------------------------------------------------------------
// Zero, negative and inconsistent head counts

TEST(BadConfig, ZeroQueryHeadsAsksForAPositiveCount) {
  json c = llama();
  c["num_attention_heads"] = 0;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_attention_heads'", "is 0", "expected an integer >= 1"});
}

TEST(BadConfig, NegativeKvHeadsAsksForAPositiveCount) {
  json c = llama();
  c["num_key_value_heads"] = -8;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_key_value_heads'", "is -8", "expected an integer >= 1"});
}

TEST(BadConfig, NegativeFloatHeadCountIsRejected) {
  json c = llama();
  c["num_attention_heads"] = -32.0;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_attention_heads'", "-32", "expected an integer >= 1"});
}

TEST(BadConfig, ZeroMambaHeadsAsksForAPositiveCount) {
  json c = nemotron();
  c["mamba_num_heads"] = 0;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'mamba_num_heads'", "is 0", "expected an integer >= 1"});
}

TEST(BadConfig, ZeroLayersAsksForAPositiveCount) {
  json c = llama();
  c["num_hidden_layers"] = 0;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_hidden_layers'", "is 0", "expected an integer >= 1"});
}

TEST(BadConfig, QueryHeadsNotAMultipleOfKvHeadsExplainsGrouping) {
  json c = llama();
  c["num_key_value_heads"] = 12;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_key_value_heads'",
                "(12) does not divide num_attention_heads (32)", "whole query groups"});
}

TEST(BadConfig, MoreKvHeadsThanQueryHeadsIsRejected) {
  json c = llama();
  c["num_key_value_heads"] = 64;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_key_value_heads'", "does not divide num_attention_heads"});
}

// ---------------------------------------------------------------------------------------------
// Layer types

TEST(BadConfig, UnknownLayerTypeListsTheAcceptedOnes) {
  json c = llama();
  c["layer_types"] = {"full_attention", "global_attention", "full_attention", "full_attention"};
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'layer_types'", "unknown type 'global_attention' at layer 1",
                "full_attention", "sliding_attention", "chunked_attention"});
}

TEST(BadConfig, LayerTypeOfAnotherFamilyIsUnknown) {
  // linear_attention is a Qwen3-Next type; a Llama config cannot use it.
  json c = llama();
  c["layer_types"] = {"full_attention", "linear_attention", "full_attention", "full_attention"};
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "unknown type 'linear_attention'", "this family accepts"});
}

TEST(BadConfig, UnknownGatedDeltaNetLayerTypeListsTheAcceptedOnes) {
  json c = json::parse(load_model_source("qwen3-next-80b-a3b").doc->dump());
  std::vector<std::string> types(static_cast<std::size_t>(c["num_hidden_layers"].get<int>()),
                                 "linear_attention");
  types[2] = "sliding_attention";
  c["layer_types"] = types;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "unknown type 'sliding_attention' at layer 2", "full_attention",
                "linear_attention"});
}

TEST(BadConfig, LayerTypesShorterThanLayerCountSaysOnePerLayer) {
  json c = llama();
  c["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'layer_types'", "has 3 entries but num_hidden_layers is 4",
                "one type per layer"});
}

TEST(BadConfig, LayerTypesLongerThanLayerCountSaysOnePerLayer) {
  json c = llama();
  c["layer_types"] = json::array();
  for (int i = 0; i < 5; ++i) c["layer_types"].push_back("full_attention");
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "has 5 entries but num_hidden_layers is 4"});
}

TEST(BadConfig, HybridPatternOfWrongLengthSaysOneCharacterPerLayer) {
  json c = nemotron();
  c["hybrid_override_pattern"] = "M*M";
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'hybrid_override_pattern'",
                "has 3 characters but num_hidden_layers is 4", "one character per layer"});
}

TEST(BadConfig, HybridPatternWithUnknownCharacterListsTheKnownOnes) {
  json c = nemotron();
  c["hybrid_override_pattern"] = "M*X-";
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'hybrid_override_pattern'", "unknown character 'X' at layer 2",
                "M (Mamba2)", "* (attention)"});
}

TEST(BadConfig, KimiFullAttentionLayerOutOfRangeSaysIndicesAreOneBased) {
  json c = json::parse(load_model_source("kimi-linear-48b").doc->dump());
  c["linear_attn_config"]["full_attn_layers"] = {0};
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'linear_attn_config.full_attn_layers'", "names layer 0", "1-based"});
}

// ---------------------------------------------------------------------------------------------
// Tensor parallelism that does not fit

TEST(BadTensorParallel, QueryHeadsThatDoNotDivideNameLayerFieldAndFix) {
  expect_error(
      [] { describe_json(llama(), with_tp(3)); }, kInvalid,
      {"layers.0", "num_q_heads = 32", "--tp 3", "choose a tensor-parallel size that divides 32"});
}

TEST(BadTensorParallel, KvHeadsThatNeitherDivideNorReplicateNameTheFix) {
  json c = llama();
  c["num_attention_heads"] = 24;
  c["num_key_value_heads"] = 6;
  expect_error([&] { describe_json(c, with_tp(8)); }, kInvalid,
               {"layers.0", "6 KV heads cannot be replicated over --tp 8",
                "must be a multiple of the KV head count"});
}

TEST(BadTensorParallel, KvHeadsMoreThanRanksButNotDividingNameTheField) {
  json c = llama();
  c["num_attention_heads"] = 24;
  c["num_key_value_heads"] = 12;
  expect_error([&] { describe_json(c, with_tp(8)); }, kInvalid,
               {"layers.0", "num_kv_heads = 12", "--tp 8", "divides 12"});
}

TEST(BadTensorParallel, GatedDeltaNetHeadsThatDoNotDivideNameTheField) {
  // qwen3-next's first layer is Gated DeltaNet with 16 key heads.
  expect_error([] { describe_builtin("qwen3-next-80b-a3b", {}, with_tp(3)); }, kInvalid,
               {"layers.0 (gdn)", "linear_num_key_heads = 16", "--tp 3", "divides 16"});
}

TEST(BadTensorParallel, GatedDeltaNetValueHeadsThatDoNotDivideNameTheField) {
  json c = json::parse(load_model_source("qwen3-next-80b-a3b").doc->dump());
  c["linear_num_value_heads"] = 36;  // 16 key heads split over 8 ranks, 36 value heads do not
  expect_error([&] { describe_json(c, with_tp(8)); }, kInvalid,
               {"layers.0 (gdn)", "linear_num_value_heads = 36", "--tp 8"});
}

TEST(BadTensorParallel, MambaHeadsThatDoNotDivideNameTheField) {
  expect_error([] { describe_json(nemotron(), with_tp(3)); }, kInvalid,
               {"layers.0 (mamba2)", "mamba_num_heads = 128", "--tp 3", "divides 128"});
}

TEST(BadTensorParallel, MambaGroupsThatDoNotDivideSayOnlyOneGroupReplicates) {
  // 128 heads split over 16 ranks, but 8 groups can neither split nor (being > 1) replicate.
  expect_error(
      [] { describe_json(nemotron(), with_tp(16)); }, kInvalid,
      {"layers.0 (mamba2)", "n_groups = 8", "--tp 16", "only a single group can be replicated"});
}

TEST(BadTensorParallel, MambaIntermediateThatDoesNotDivideNamesTheSize) {
  json c = json::parse(load_model_source("jamba-v0.1").doc->dump());
  c["hidden_size"] = 4095;  // mamba_expand 2 x 4095 = 8190, odd over --tp 4
  c["num_attention_heads"] = 32;
  c["head_dim"] = 128;
  expect_error([&] { describe_json(c, with_tp(4)); }, kInvalid,
               {"(mamba1)", "mamba intermediate size", "--tp 4"});
}

TEST(BadTensorParallel, KimiDeltaAttentionHeadsThatDoNotDivideNameTheField) {
  expect_error([] { describe_builtin("kimi-linear-48b", {}, with_tp(3)); }, kInvalid,
               {"layers.0 (kda)", "linear_attn_config.num_heads = 32", "--tp 3", "divides 32"});
}

// ---------------------------------------------------------------------------------------------
// Unknown model_type and dtypes

TEST(BadConfig, UnknownModelTypeIsUnsupportedAndListsSupportedTypes) {
  json c = llama();
  c["model_type"] = "falcon";
  expect_error([&] { describe_json(c); }, kUnsupported,
               {"test.json", "model_type 'falcon' is not supported", "llama", "qwen3_next",
                "nemotron_h", "deepseek_v3", "docs/model-file.md"});
}

TEST(BadConfig, UnknownNestedModelTypeIsUnsupported) {
  json c;
  c["model_type"] = "mystery_vl";
  c["text_config"] = llama();
  c["text_config"]["model_type"] = "mystery_text";
  expect_error([&] { describe_json(c); }, kUnsupported,
               {"test.json", "is not supported", "supported:"});
}

// Unknown dtypes are reported as kInvalidInput throughout (config fields, options, model files);
// the CLI exits 2 either way.
TEST(BadDtype, UnknownTorchDtypeNamesTheFieldAndKnownDtypes) {
  json c = llama();
  c["torch_dtype"] = "float8";
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'torch_dtype'", "'float8'", "bfloat16, float16, float32"});
}

TEST(BadDtype, UnknownSsmCacheDtypeNamesTheField) {
  json c = nemotron();
  c["mamba_ssm_cache_dtype"] = "int8";
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'mamba_ssm_cache_dtype'", "'int8'", "not a known dtype"});
}

TEST(BadDtype, ParseDtypeRejectsUnknownNames) {
  EXPECT_FALSE(parse_dtype("fp9").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
  EXPECT_FALSE(parse_dtype("bfloat16 ").has_value());
  EXPECT_FALSE(parse_dtype("int8").has_value());
  EXPECT_FALSE(parse_dtype("auto").has_value());  // "auto" is a CLI word, not a dtype
  EXPECT_TRUE(parse_dtype("BF16").has_value());
}

TEST(BadDtype, LayerOverrideWithUnknownDtypeListsTheKnownOnes) {
  expect_error([] { parse_layer_dtype_override("layers.0=fp9"); }, kInvalid,
               {"--layer-kv-dtype", "'layers.0=fp9'", "unknown dtype 'fp9'", "fp8_e4m3", "nvfp4"});
}

TEST(BadDtype, LayerOverrideWithoutEqualsShowsTheSyntax) {
  for (std::string_view text : {"layers.0", "=fp8", "layers.0=", ""}) {
    expect_error([&] { parse_layer_dtype_override(text); }, kInvalid,
                 {"--layer-kv-dtype", "is not NAME=DTYPE", "draft.layers.0=fp8"});
  }
}

TEST(BadDtype, NativeFileWithUnknownDtypeNamesTheLayerField) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][3]["kv_dtype"] = "fp9";
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'layers[3].kv_dtype'", "'fp9'", "use one of", "bfloat16"});
}

TEST(BadDtype, NativeFileWithUnknownStateDtypeNamesTheTensor) {
  json doc = native_of("nemotron-h-8b");
  doc["layers"][0]["state"][1]["dtype"] = "int4";
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "layers.0.state[1].dtype", "'int4'", "use one of"});
}

// ---------------------------------------------------------------------------------------------
// Truncated and invalid JSON

TEST(BadJson, TruncatedConfigNamesTheFileAndSuggestsTruncation) {
  const std::string text = llama().dump(2);
  expect_error([&] { parse_model_source("m", "cut.json", text.substr(0, text.size() / 2)); },
               kInvalid, {"cut.json", "invalid JSON at byte", "is it truncated?"});
}

TEST(BadJson, InvalidSyntaxNamesTheFileAndByte) {
  expect_error([] { parse_model_source("m", "bad.json", "{'model_type': 'llama'}"); }, kInvalid,
               {"bad.json", "invalid JSON at byte 2", "fix the file"});
}

TEST(BadJson, EmptyTextIsInvalidJson) {
  expect_error([] { parse_model_source("m", "empty.json", ""); }, kInvalid,
               {"empty.json", "invalid JSON"});
}

TEST(BadJson, TrailingGarbageIsInvalidJson) {
  expect_error([] { parse_model_source("m", "tail.json", R"({"a": 1} {"b": 2})"); }, kInvalid,
               {"tail.json", "invalid JSON"});
}

TEST(BadJson, InvalidUtf8IsInvalidJson) {
  expect_error([] { parse_model_source("m", "utf.json", "{\"model_type\": \"ll\xff\xfe\"}"); },
               kInvalid, {"utf.json", "invalid JSON"});
}

TEST(BadJson, TruncatedNativeFileNamesTheFile) {
  const std::string text = native_of("gpt-oss-20b").dump();
  expect_error(
      [&] { parse_model_source("m", "model.mixkv.json", text.substr(0, text.size() - 3)); },
      kInvalid, {"model.mixkv.json", "invalid JSON", "is it truncated?"});
}

// ---------------------------------------------------------------------------------------------
// Absurdly large numbers: an Error naming the field, never a wrapped value or an overflow.

TEST(BadNumber, HeadCountOf1e30IsNotAnInteger) {
  json c = llama();
  c["num_attention_heads"] = 1e30;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_attention_heads'", "1e+30", "expected an integer"});
}

TEST(BadNumber, HeadCountOf2To62IsLargerThanAccepted) {
  json c = llama();
  c["num_attention_heads"] = std::int64_t{1} << 62;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_attention_heads'", "4611686018427387904",
                "larger than mixkv accepts", "fix the value"});
}

TEST(BadNumber, UnsignedMaxIsLargerThanAccepted) {
  json c = llama();
  c["head_dim"] = std::numeric_limits<std::uint64_t>::max();
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'head_dim'", "18446744073709551615", "larger than mixkv accepts"});
}

TEST(BadNumber, Int64MinIsRejected) {
  json c = llama();
  c["num_key_value_heads"] = std::numeric_limits<std::int64_t>::min();
  expect_error(
      [&] { describe_json(c); }, kInvalid,
      {"test.json", "'num_key_value_heads'", "-9223372036854775808", "expected an integer >= 1"});
}

TEST(BadNumber, OverflowingLiteralInTextIsRejected) {
  std::string text = llama().dump();
  text.replace(text.find("\"head_dim\":128"), 14, "\"head_dim\":1e400");
  expect_error([&] { describe_text(text); }, kInvalid, {"test.json", "invalid JSON", "too large"});
}

TEST(BadNumber, HeadCountJustAboveIntRangeIsRejectedNotWrapped) {
  // 2^31 does not fit the int fields of a LayerDesc; it must be refused as too large rather than
  // wrapped to -2^31 and reported as a negative count.
  json c = llama();
  c["num_attention_heads"] = std::int64_t{1} << 31;
  c["num_key_value_heads"] = std::int64_t{1} << 31;
  try {
    describe_json(c);
    ADD_FAILURE() << "2^31 heads were accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.code(), kInvalid);
    EXPECT_NE(message.find("'num_attention_heads'"), std::string::npos) << message;
    EXPECT_NE(message.find("larger than mixkv accepts"), std::string::npos) << message;
    EXPECT_EQ(message.find("-2147483648"), std::string::npos) << message;
  }
}

TEST(BadNumber, MlaLatentWiderThanIntRangeIsRejectedNotWrapped) {
  json c = deepseek();
  c["kv_lora_rank"] = 2147483647;
  c["qk_rope_head_dim"] = 2147483647;
  try {
    describe_json(c);
    ADD_FAILURE() << "a latent of 2^32 - 2 elements was accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.code(), kInvalid);
    EXPECT_NE(message.find("test.json"), std::string::npos) << message;
    EXPECT_NE(message.find("kv_lora_rank"), std::string::npos) << message;
    EXPECT_EQ(message.find("is -"), std::string::npos) << message;
  }
}

TEST(BadNumber, KvBytesThatOverflowInt64AreAnErrorNamingTheLayer) {
  // 2^30 KV heads x (2^31 - 1) head size x 4 bytes x (K and V) exceeds 2^63.
  json c = llama();
  c["num_attention_heads"] = std::int64_t{1} << 30;
  c["num_key_value_heads"] = std::int64_t{1} << 30;
  c["head_dim"] = 2147483647;
  c["torch_dtype"] = "float32";
  expect_error([&] { describe_json(c); }, kInvalid,
               {"layers.0", "overflows a 64-bit integer", "check the sizes"});
}

TEST(BadNumber, StateBytesThatOverflowInt64AreAnErrorNamingTheLayer) {
  json c = json::parse(load_model_source("jamba-v0.1").doc->dump());
  c["mamba_expand"] = 2147483647;
  c["hidden_size"] = 2147483647;
  c["mamba_d_state"] = 2147483647;
  try {
    describe_json(c);
    ADD_FAILURE() << "a Mamba state of ~2^93 elements was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), kInvalid);
  }
}

TEST(BadNumber, HugeLayerCountIsRefusedBeforeAllocating) {
  // Two billion layers would exhaust memory long before anything else could complain.
  json c = llama();
  c["num_hidden_layers"] = 2147483647;
  expect_error(
      [&] { describe_json(c); }, kInvalid,
      {"test.json", "'num_hidden_layers'", "is 2147483647", "more layers than mixkv accepts"});
}

TEST(BadNumber, LayerCountAtTheLimitIsStillAccepted) {
  json c = llama();
  c["num_hidden_layers"] = 4096;
  EXPECT_EQ(describe_json(c).layers.size(), 4096u);
  c["num_hidden_layers"] = 4097;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "more layers than mixkv accepts (4096)"});
}

TEST(BadNumber, HugeMtpLayerCountIsRefusedBeforeAllocating) {
  json c = deepseek();
  c["num_nextn_predict_layers"] = 2147483647;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"test.json", "'num_nextn_predict_layers'", "more layers than mixkv accepts"});
}

TEST(BadNumber, StateDimensionBeyondIntRangeIsRejected) {
  // 16 key heads x 2^30 wide make a conv state row of 2^35 channels: it fits 64-bit byte counts,
  // but a model file stating it could not be read back, so describe must refuse it too.
  json c = json::parse(load_model_source("qwen3-next-80b-a3b").doc->dump());
  c["linear_key_head_dim"] = 1 << 30;
  expect_error([&] { describe_json(c); }, kInvalid,
               {"layers.0 (gdn)", "state 'conv' shape", "larger than mixkv accepts"});
}

TEST(BadNumber, HugeWindowIsRejected) {
  json c = llama();
  c["model_type"] = "mistral";
  c["sliding_window"] = 1e19;
  expect_error([&] { describe_json(c); }, kInvalid, {"test.json", "'sliding_window'"});
}

// ---------------------------------------------------------------------------------------------
// Options: --layer-kv-dtype, --tp, --num-spec-tokens

TEST(BadOption, LayerOverrideMatchingNoLayerShowsLayerNames) {
  DescribeOptions o;
  o.layer_kv_dtypes.push_back(parse_layer_dtype_override("draft.*=fp8"));
  expect_error([&] { describe_builtin("llama-3.1-8b", {}, o); }, kInvalid,
               {"--layer-kv-dtype 'draft.*=fp8_e4m3'", "matches no attention layer",
                "layers.0, layers.1", "globs such as"});
}

TEST(BadOption, LayerOverrideMatchingOnlyRecurrentLayersIsRejected) {
  // layers.0 of qwen3-next is Gated DeltaNet; it has no KV cache to retype.
  DescribeOptions o;
  o.layer_kv_dtypes.push_back(parse_layer_dtype_override("layers.0=fp8"));
  expect_error([&] { describe_builtin("qwen3-next-80b-a3b", {}, o); }, kInvalid,
               {"'layers.0=fp8_e4m3'", "matches no attention layer", "layers.3"});
}

TEST(BadOption, TpOutOfRangeGivesTheRange) {
  for (int tp :
       {0, -1, -8, 1025, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()}) {
    expect_error([&] { describe_builtin("llama-3.1-8b", {}, with_tp(tp)); }, kInvalid,
                 {"--tp", fmt::format("is {}", tp), "expected 1..1024"});
  }
}

TEST(BadOption, NumSpecTokensOutOfRangeGivesTheRange) {
  for (int n : {-1, 1025, std::numeric_limits<int>::max(), std::numeric_limits<int>::min()}) {
    DescribeOptions o;
    o.num_spec_tokens = n;
    expect_error([&] { describe_builtin("qwen3.5-27b", "dflash-qwen3.5-27b", o); }, kInvalid,
                 {"--num-spec-tokens", fmt::format("is {}", n), "expected 0..1024"});
  }
}

TEST(BadOption, TpOnANativeFileOfAnotherTpSaysToDescribeTheSource) {
  const json doc = native_of("llama-3.1-8b");
  const ModelSource src = parse_model_source("m", "model.mixkv.json", doc.dump());
  expect_error(
      [&] { describe(src, std::nullopt, with_tp(2)); }, kInvalid,
      {"model.mixkv.json", "already per-rank for tp 1", "--tp 2", "describe the source config"});
}

TEST(BadOption, MtpDraftForAModelWithoutMtpLayersNamesTheFields) {
  expect_error([] { describe_builtin("llama-3.1-8b", kMtpDraft); }, kInvalid,
               {"built-in llama-3.1-8b", "declares no MTP layers", "num_nextn_predict_layers"});
}

TEST(BadOption, DrafterForAShallowerTargetNamesTheLayer) {
  // dflash-qwen3.5-27b taps target layer 61; qwen3-8b has 36 layers.
  expect_error([] { describe_builtin("qwen3-8b", "dflash-qwen3.5-27b"); }, kInvalid,
               {"drafter dflash-qwen3.5-27b", "target_layer_ids names layer", "has 36 layers",
                "trained for another target"});
}

// ---------------------------------------------------------------------------------------------
// Native model files with bad fields

TEST(BadModelFile, NegativeHeadsNameTheLayerField) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][2]["num_q_heads"] = -4;
  expect_error(
      [&] { describe_native(doc); }, kInvalid,
      {"model.mixkv.json", "'layers[2].num_q_heads'", "is -4", "expected an integer >= 0"});
}

TEST(BadModelFile, ZeroHeadsOnAnAttentionLayerNameTheFileAndLayer) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][2]["num_kv_heads"] = 0;
  expect_error(
      [&] { describe_native(doc); }, kInvalid,
      {"model.mixkv.json", "layers.2", "num_kv_heads", "is 0", "expected a positive count"});
}

TEST(BadModelFile, UnknownKindListsTheKinds) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][0]["kind"] = "linear";
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'layers[0].kind'", "'linear'", "full, sliding, chunked, mla"});
}

TEST(BadModelFile, UnknownOwnerListsTheOwners) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][0]["owner"] = "drafter";
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'layers[0].owner'", "'drafter'", "target, draft"});
}

TEST(BadModelFile, SlidingLayerWithoutWindowAsksForIt) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][1]["kind"] = "sliding";
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "layers.1 (sliding)", "window",
                "a sliding layer needs its window size"});
}

TEST(BadModelFile, WindowOnAFullLayerSaysToDropIt) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][1]["window"] = 4096;
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "layers.1 (full)", "window", "drop it"});
}

TEST(BadModelFile, DuplicateLayerNamesAreRejected) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][5]["name"] = "layers.4";
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'layers.4' appears twice", "must be unique"});
}

TEST(BadModelFile, RecurrentLayerWithoutStateAsksForIt) {
  json doc = native_of("qwen3-next-80b-a3b");
  doc["layers"][0]["state"] = json::array();
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "layers.0 (gdn)", "state", "needs its state tensors"});
}

TEST(BadModelFile, RecurrentLayerWithStateKeyMissingAsksForIt) {
  json doc = native_of("nemotron-h-8b");
  doc["layers"][0].erase("state");
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "layers.0 (mamba2)", "needs its state tensors"});
}

TEST(BadModelFile, StateWithZeroDimensionNamesTheTensor) {
  json doc = native_of("nemotron-h-8b");
  doc["layers"][0]["state"][0]["shape"][1] = 0;
  expect_error(
      [&] { describe_native(doc); }, kInvalid,
      {"model.mixkv.json", "layers.0", "state 'conv' shape", "dimension 0", "expected > 0"});
}

TEST(BadModelFile, StateOnAnAttentionLayerIsRejected) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][0]["state"] =
      json::array({{{"name", "conv"}, {"shape", {3, 4}}, {"dtype", "bfloat16"}}});
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "layers.0", "only recurrent layers have state"});
}

TEST(BadModelFile, StateThatIsNotAListShowsItsShape) {
  json doc = native_of("nemotron-h-8b");
  doc["layers"][0]["state"] = json::object();
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'layers[0].state'", "must be a list of {name, shape, dtype}"});
}

TEST(BadModelFile, WrongFormatVersionNamesTheSupportedOne) {
  json doc = native_of("llama-3.1-8b");
  doc["format"] = "mixkv-model/9";
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'format'", "'mixkv-model/9'", "mixkv-model/1"});
}

TEST(BadModelFile, LayersThatAreNotAListAreRejected) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"] = json::object();
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'layers'", "must be a list of layer objects"});
}

TEST(BadModelFile, NoLayersAtAllIsRejected) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"] = json::array();
  expect_error([&] { describe_native(doc); }, kInvalid, {"model.mixkv.json", "no layers"});
}

TEST(BadModelFile, BlockSizeBelowTwoIsRejected) {
  json doc = to_json(describe_builtin("qwen3.5-27b", "dflash-qwen3.5-27b"));
  doc["draft_info"]["block_size"] = 1;
  expect_error([&] { describe_native(doc); }, kInvalid,
               {"model.mixkv.json", "'draft_info.block_size'", "is 1", ">= 2"});
}

TEST(BadModelFile, HeadCountAboveIntRangeIsRejectedNotWrapped) {
  json doc = native_of("llama-3.1-8b");
  doc["layers"][0]["num_q_heads"] = std::int64_t{1} << 31;
  try {
    describe_native(doc);
    ADD_FAILURE() << "2^31 query heads were accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'layers[0].num_q_heads'"), std::string::npos) << message;
    EXPECT_EQ(message.find("-2147483648"), std::string::npos) << message;
  }
}

// ---------------------------------------------------------------------------------------------
// Model references

TEST(BadReference, UnknownModelPointsAtTheModelList) {
  expect_error([] { load_model_source("no-such-model-42"); }, kInvalid,
               {"unknown model 'no-such-model-42'", "built-in model", "`mixkv models`",
                "file or directory"});
}

TEST(BadReference, UnknownDrafterIsReportedToo) {
  expect_error([] { describe_builtin("llama-3.1-8b", "no-such-drafter"); }, kInvalid,
               {"unknown model 'no-such-drafter'"});
}

// A scratch directory removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    path_ = std::filesystem::temp_directory_path() /
            fmt::format("mixkv-bad-input-{}-{}", ::testing::UnitTest::GetInstance()->random_seed(),
                        reinterpret_cast<std::uintptr_t>(this));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    const auto file = path_ / name;
    std::ofstream(file, std::ios::binary) << text;
    return file.string();
  }

 private:
  std::filesystem::path path_;
};

TEST(BadReference, DirectoryWithoutConfigSaysSo) {
  ScratchDir dir;
  expect_error([&] { load_model_source(dir.path().string()); }, kInvalid,
               {dir.path().string(), "without a config.json", "point at the config file"});
}

TEST(BadReference, FileWithInvalidJsonNamesThePath) {
  ScratchDir dir;
  const std::string path = dir.write("config.json", R"({"model_type": "llama",)");
  expect_error([&] { load_model_source(path); }, kInvalid, {path, "invalid JSON"});
  expect_error([&] { load_model_source(dir.path().string()); }, kInvalid, {path, "invalid JSON"});
}

// ---------------------------------------------------------------------------------------------
// The command line: bad input exits 2 with the message on stderr and nothing on stdout.

struct CliResult {
  int status = 0;
  std::string out;
  std::string err;
};

CliResult run_cli(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  const int status = cli::run(args, out, err);
  return {status, out.str(), err.str()};
}

void expect_usage_error(const std::vector<std::string>& args,
                        std::initializer_list<std::string_view> needles) {
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  for (auto needle : needles) {
    EXPECT_NE(r.err.find(needle), std::string::npos)
        << "stderr lacks '" << needle << "': " << r.err;
  }
}

TEST(BadCli, UnknownModelExitsTwoWithMessageOnStderr) {
  expect_usage_error({"describe", "no-such-model"},
                     {"mixkv: error:", "unknown model 'no-such-model'"});
}

TEST(BadCli, BadConfigFileExitsTwoNamingTheFile) {
  ScratchDir dir;
  json c = llama();
  c["num_key_value_heads"] = 12;
  const std::string path = dir.write("config.json", c.dump());
  expect_usage_error({"describe", path}, {path, "'num_key_value_heads'"});
}

TEST(BadCli, UnsupportedModelTypeExitsTwo) {
  ScratchDir dir;
  json c = llama();
  c["model_type"] = "falcon";
  const std::string path = dir.write("config.json", c.dump());
  expect_usage_error({"describe", path}, {"model_type 'falcon' is not supported"});
}

TEST(BadCli, TpThatDoesNotDivideExitsTwo) {
  expect_usage_error({"describe", "llama-3.1-8b", "--tp", "3"}, {"--tp 3", "num_q_heads"});
}

TEST(BadCli, TpOutOfRangeExitsTwo) {
  expect_usage_error({"describe", "llama-3.1-8b", "--tp", "0"}, {"--tp is 0", "1..1024"});
  expect_usage_error({"describe", "llama-3.1-8b", "--tp", "-4"}, {"--tp"});
  expect_usage_error({"describe", "llama-3.1-8b", "--tp", "99999999999"}, {"--tp"});
  expect_usage_error({"describe", "llama-3.1-8b", "--tp", "two"}, {"--tp"});
}

TEST(BadCli, NumSpecTokensOutOfRangeExitsTwo) {
  expect_usage_error(
      {"describe", "qwen3.5-27b", "--draft", "dflash-qwen3.5-27b", "--num-spec-tokens", "-1"},
      {"--num-spec-tokens is -1"});
  expect_usage_error(
      {"describe", "qwen3.5-27b", "--draft", "dflash-qwen3.5-27b", "--num-spec-tokens", "5000"},
      {"--num-spec-tokens is 5000"});
  expect_usage_error(
      {"describe", "qwen3.5-27b", "--draft", "dflash-qwen3.5-27b", "--num-spec-tokens", "1e99"},
      {"--num-spec-tokens"});
}

TEST(BadCli, UnknownKvDtypeExitsTwoListingDtypes) {
  expect_usage_error({"describe", "llama-3.1-8b", "--kv-dtype", "fp9"},
                     {"--kv-dtype 'fp9'", "fp8_e4m3"});
  expect_usage_error({"describe", "llama-3.1-8b", "--ssm-dtype", "int8"}, {"--ssm-dtype 'int8'"});
  expect_usage_error({"describe", "llama-3.1-8b", "--draft-kv-dtype", "int8"},
                     {"--draft-kv-dtype 'int8'"});
}

TEST(BadCli, LayerOverrideMatchingNothingExitsTwo) {
  expect_usage_error({"describe", "llama-3.1-8b", "--layer-kv-dtype", "draft.*=fp8"},
                     {"matches no attention layer"});
  expect_usage_error({"describe", "llama-3.1-8b", "--layer-kv-dtype", "layers.0"},
                     {"is not NAME=DTYPE"});
}

TEST(BadCli, UnknownOptionExitsTwo) {
  expect_usage_error({"describe", "llama-3.1-8b", "--frobnicate"},
                     {"--frobnicate", "mixkv --help"});
}

TEST(BadCli, UnknownSubcommandExitsTwo) { expect_usage_error({"frobnicate"}, {"mixkv --help"}); }

TEST(BadCli, MissingSubcommandExitsTwo) { expect_usage_error({}, {"subcommand"}); }

TEST(BadCli, MissingModelArgumentExitsTwo) { expect_usage_error({"describe"}, {"model"}); }

TEST(BadCli, HelpExitsZeroOnStdout) {
  const CliResult r = run_cli({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("describe"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(BadCli, DescribeHelpExitsZeroOnStdout) {
  const CliResult r = run_cli({"describe", "--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--tp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--kv-dtype"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

}  // namespace
}  // namespace mixkv::model
