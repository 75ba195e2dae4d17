// SmolLM2's tokenizer against llama.cpp: ids identical on the whole recorded corpus (with and
// without special-token parsing), the chat prompts rendered exactly as Jinja renders the file's
// template, and their ids identical too. The reference is recorded by
// scripts/record-llamacpp-reference.sh (llama-cpp-python); CI only reads it.
#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "mixkv/weights/gguf.hpp"
#include "test_support.hpp"
#include "weights/smollm2.hpp"

namespace mixkv::tokenizer {
namespace {

nlohmann::json reference() {
  std::ifstream in(MIXKV_SOURCE_DIR "/tests/tokenizer/data/smollm2-llamacpp-reference.json");
  EXPECT_TRUE(in) << "the committed llama.cpp reference is missing";
  return nlohmann::json::parse(in);
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += c < 0x20 ? fmt::format("\\x{:02x}", c) : std::string(1, char(c));
  return out;
}

std::vector<TokenId> ids_of(const nlohmann::json& j) { return j.get<std::vector<TokenId>>(); }

TEST(SmolLm2Reference, RecordedFromTheFileMakeDepsFetches) {
  const nlohmann::json ref = reference();
  std::ifstream sums(MIXKV_SOURCE_DIR "/deps/models.sha256");
  std::string line, sha;
  while (std::getline(sums, line)) {
    if (line.find("SmolLM2-135M-Instruct.Q4_1.gguf") != std::string::npos) sha = line.substr(0, 64);
  }
  EXPECT_EQ(ref["model_sha256"], sha);
  EXPECT_GE(ref["corpus"].size(), 50u);
  EXPECT_EQ(ref["chats"].size(), 8u);
}

TEST(SmolLm2Reference, TokenIdsMatchLlamaCppOnTheWholeCorpus) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const auto tok = tokenizer_from_gguf(weights::GgufFile::open(path));
  const nlohmann::json ref = reference();
  int checked = 0;
  for (const auto& entry : ref["corpus"]) {
    const std::string text = entry["text"];
    EXPECT_EQ(tok->encode(text, {.parse_special = true}), ids_of(entry["ids_special"]))
        << "parse_special, text: " << printable(text);
    EXPECT_EQ(tok->encode(text, {.parse_special = false}), ids_of(entry["ids_plain"]))
        << "plain, text: " << printable(text);
    EXPECT_EQ(tok->decode(ids_of(entry["ids_special"]), true), text);
    EXPECT_EQ(tok->decode(ids_of(entry["ids_plain"])), text);
    ++checked;
  }
  EXPECT_EQ(checked, int(ref["corpus"].size()));
  // SmolLM2 asks for no BOS (tokenizer.ggml.add_bos_token is false), as llama.cpp found.
  EXPECT_EQ(ref["add_special_adds_bos"], false);
  EXPECT_EQ(tok->encode("Hello", {.add_special = true}), tok->encode("Hello"));
  EXPECT_EQ(tok->special_ids().bos, ref["bos_id"].get<TokenId>());
  EXPECT_EQ(tok->special_ids().eos, ref["eos_id"].get<TokenId>());
}

TEST(SmolLm2Reference, ChatPromptsRenderAndTokenizeAsLlamaCppDid) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const weights::GgufFile file = weights::GgufFile::open(path);
  const auto tok = tokenizer_from_gguf(file);
  const ChatTemplate& tmpl = chat_template_for(file);
  const nlohmann::json ref = reference();  // held: a loop over a temporary's member dangles
  for (const auto& chat : ref["chats"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : chat["messages"]) messages.push_back({m["role"], m["content"]});
    const std::string prompt = tmpl.render(messages, true);
    EXPECT_EQ(prompt, chat["prompt"].get<std::string>());
    EXPECT_EQ(tok->encode(prompt), ids_of(chat["prompt_ids"])) << printable(prompt);
    // The continuation ends at EOS (<|im_end|>) or after 128 tokens.
    const std::vector<TokenId> greedy = ids_of(chat["greedy_ids"]);
    ASSERT_FALSE(greedy.empty());
    EXPECT_TRUE(greedy.size() == 128u || tok->is_end_of_generation(greedy.back()));
    EXPECT_EQ(chat["teacher_forced_top1"].size(), chat["prompt_ids"].size() + greedy.size());
  }
}

}  // namespace
}  // namespace mixkv::tokenizer
