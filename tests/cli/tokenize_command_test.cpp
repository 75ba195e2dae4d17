// `mixkv tokenize` and `mixkv detokenize` on SmolLM2 and on a tiny model's byte vocabulary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_test_support.hpp"
#include "weights/smollm2.hpp"

namespace mixkv::cli {
namespace {

using testing::run_cli;

TEST(TokenizeCommand, PrintsIdsAndJson) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  auto r = run_cli("tokenize", {"smollm2-135m", "Hello, world!"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "19556 28 905 17\n");
  r = run_cli("tokenize", {path, "<|im_start|>user", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "{\"ids\":[1,4093],\"pieces\":[\"<|im_start|>\",\"user\"]}\n");
  r = run_cli("tokenize", {path, "<|im_start|>", "--no-parse-special"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out, "1\n");  // the marker as plain text: several ordinary tokens
}

TEST(DetokenizeCommand, PrintsTextWithOrWithoutSpecialTokens) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  auto r = run_cli("detokenize", {"smollm2-135m", "1", "4093", "198", "19556", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>user\nHello<|im_end|>\n");
  r = run_cli("detokenize", {"smollm2-135m", "1", "4093", "198", "19556", "2", "--skip-special"});
  EXPECT_EQ(r.out, "user\nHello\n");
  r = run_cli("detokenize", {"smollm2-135m", "49152"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("outside"), std::string::npos) << r.err;
}

TEST(TokenizeCommand, TinyModelsUseTheirByteVocabulary) {
  auto r = run_cli("tokenize", {"tiny-swa", "hi"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "104 105\n");
  r = run_cli("detokenize", {"tiny-swa", "104", "105", "257"});
  EXPECT_EQ(r.out, "hi<|eos|>\n");
}

TEST(TokenizeCommand, UnknownModelsAreBadInput) {
  auto r = run_cli("tokenize", {"no-such-model", "x"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no-such-model"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace mixkv::cli

namespace mixkv::cli {
namespace {

TEST(ModelsCommand, ListsTheFetchedModels) {
  const auto r = testing::run_cli("models", {"--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  bool found = false;
  for (const auto& m : nlohmann::json::parse(r.out)) {
    if (m["name"] == "smollm2-135m") {
      found = true;
      EXPECT_EQ(m["file"], "SmolLM2-135M-Instruct.Q4_1.gguf");
      EXPECT_EQ(m["fetched"], testing::smollm2_path().has_value());
    }
  }
  EXPECT_TRUE(found) << r.out;
}

}  // namespace
}  // namespace mixkv::cli
