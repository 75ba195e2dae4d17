// Chat templates: ChatML rendering, recognition by fingerprint, and the errors around them.
#include "mixkv/tokenizer/chat_template.hpp"

#include <gtest/gtest.h>

#include "mixkv/weights/gguf.hpp"
#include "test_support.hpp"
#include "weights/gguf_builder.hpp"
#include "weights/smollm2.hpp"

namespace mixkv::tokenizer {
namespace {

using testing::expect_error;

// The classic ChatML template of many HuggingFace tokenizer configs.
constexpr std::string_view kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' "
    "}}{% endif %}";

TEST(ChatTemplate, ChatmlRendersEachMessageAndTheGenerationPrompt) {
  const ChatTemplate* t = find_chat_template("chatml");
  ASSERT_NE(t, nullptr);
  const std::vector<ChatMessage> m = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
  EXPECT_EQ(t->render(m, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->render(m, false).substr(0, 13), "<|im_start|>u");
  EXPECT_EQ(t->render({}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplate, SmolLm2AddsItsDefaultSystemMessageOnlyWithoutOne) {
  const ChatTemplate* t = find_chat_template("smollm2");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->render(std::vector<ChatMessage>{{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->render(std::vector<ChatMessage>{{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, RecognisedByFingerprintWhateverTheWhitespace) {
  EXPECT_EQ(detect_chat_template(kChatml, "t").name, "chatml");
  std::string spaced(kChatml);
  spaced.replace(spaced.find(" + "), 3, " \n\t +   ");  // a run of whitespace where one was
  EXPECT_EQ(fingerprint(spaced), fingerprint(kChatml));
  EXPECT_EQ(detect_chat_template("  " + spaced + "\n", "t").name, "chatml");
}

TEST(ChatTemplate, AnUnknownTemplateIsAnErrorNamingItAndTheChoices) {
  expect_error([] { detect_chat_template("{{ bos_token }}{% for m in messages %}", "x.gguf"); },
               ErrorCode::kUnsupported,
               {"x.gguf", "{{ bos_token }}", "--chat-template", "chatml", "smollm2"});
  testing::GgufBuilder b;
  const std::vector<std::byte> bytes = b.build();
  const weights::GgufFile f = weights::GgufFile::parse(bytes, "y.gguf");
  expect_error([&] { chat_template_for(f); }, ErrorCode::kInvalidInput,
               {"y.gguf", "no tokenizer.chat_template"});
  EXPECT_EQ(chat_template_for(f, "chatml").name, "chatml");
  expect_error([&] { chat_template_for(f, "zephyr"); }, ErrorCode::kInvalidInput,
               {"'zephyr'", "chatml"});
  EXPECT_EQ(find_chat_template("zephyr"), nullptr);
}

TEST(ChatTemplate, TheSmolLm2FileCarriesTheSmolLm2Template) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const weights::GgufFile f = weights::GgufFile::open(path);
  EXPECT_EQ(chat_template_for(f).name, "smollm2");
}

}  // namespace
}  // namespace mixkv::tokenizer
