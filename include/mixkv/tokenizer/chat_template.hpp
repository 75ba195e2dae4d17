// Chat templates: how a list of messages becomes the prompt text a model was tuned on. mixkv does
// not run Jinja: it recognises the template a GGUF carries (tokenizer.chat_template) by the
// fingerprint of its whitespace-normalised text among the families it renders natively, and an
// unrecognised template is an error that names it and offers --chat-template NAME instead.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mixkv::weights {
class GgufFile;
}

namespace mixkv::tokenizer {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
  bool operator==(const ChatMessage&) const = default;
};

struct ChatTemplate {
  std::string_view name;         // what --chat-template takes
  std::string_view description;  // one line
  // ChatML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, "<|im_start|>assistant\n" as
  // the generation prompt. When set, a conversation that does not open with a system message
  // gets this one first (SmolLM2's template does so).
  std::string_view default_system;
  // Fingerprints (fingerprint()) of the template texts known to render exactly like this.
  std::span<const std::uint64_t> fingerprints;

  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
};

// FNV-1a 64 of `template_text` with every run of whitespace made one space and the ends trimmed.
std::uint64_t fingerprint(std::string_view template_text);

std::span<const ChatTemplate> chat_templates();
// The template called `name`, or nullptr.
const ChatTemplate* find_chat_template(std::string_view name);
// The template whose fingerprint matches `template_text`; Error (unsupported) naming its
// fingerprint, its opening and the names --chat-template takes when none does. `origin` names
// the file in the message.
const ChatTemplate& detect_chat_template(std::string_view template_text, std::string_view origin);
// The template for a GGUF: `name` when given (Error listing the names if unknown), else the one
// detect_chat_template finds for tokenizer.chat_template (Error when the file has none).
const ChatTemplate& chat_template_for(const weights::GgufFile& file,
                                      std::optional<std::string_view> name = std::nullopt);

}  // namespace mixkv::tokenizer
