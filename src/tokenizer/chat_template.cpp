#include "mixkv/tokenizer/chat_template.hpp"

#include <array>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mixkv/core/error.hpp"
#include "mixkv/weights/gguf.hpp"

namespace mixkv::tokenizer {
namespace {

// The classic ChatML template (as in many HuggingFace tokenizer_config.json files, with '\n'
// written as escapes).
constexpr std::array<std::uint64_t, 1> kChatmlPrints = {0xa41d6bae9b9141bcULL};
// SmolLM2-135M/360M/1.7B-Instruct: ChatML that opens with a default system message.
constexpr std::array<std::uint64_t, 1> kSmolLm2Prints = {0x2d12679674acf708ULL};

constexpr std::array<ChatTemplate, 2> kTemplates{{
    {"chatml", "ChatML: <|im_start|>role ... <|im_end|> per message", "", kChatmlPrints},
    {"smollm2", "ChatML with SmolLM2's default system message",
     "You are a helpful AI assistant named SmolLM, trained by Hugging Face", kSmolLm2Prints},
}};

std::vector<std::string_view> names() {
  std::vector<std::string_view> out;
  for (const ChatTemplate& t : kTemplates) out.push_back(t.name);
  return out;
}

void chatml_turn(std::string& out, std::string_view role, std::string_view content) {
  out += "<|im_start|>";
  out += role;
  out += '\n';
  out += content;
  out += "<|im_end|>\n";
}

}  // namespace

std::string ChatTemplate::render(std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  std::string out;
  if (!default_system.empty() && !messages.empty() && messages.front().role != "system") {
    chatml_turn(out, "system", default_system);
  }
  for (const ChatMessage& m : messages) chatml_turn(out, m.role, m.content);
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::uint64_t fingerprint(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](unsigned char c) {
    h ^= c;
    h *= 0x100000001b3ULL;
  };
  bool pending_space = false;
  bool started = false;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isspace(c)) {
      pending_space = started;
      continue;
    }
    if (pending_space) mix(' ');
    pending_space = false;
    started = true;
    mix(c);
  }
  return h;
}

std::span<const ChatTemplate> chat_templates() { return kTemplates; }

const ChatTemplate* find_chat_template(std::string_view name) {
  for (const ChatTemplate& t : kTemplates) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const ChatTemplate& detect_chat_template(std::string_view text, std::string_view origin) {
  const std::uint64_t print = fingerprint(text);
  for (const ChatTemplate& t : kTemplates) {
    for (std::uint64_t p : t.fingerprints) {
      if (p == print) return t;
    }
  }
  std::string opening(text.substr(0, 60));
  for (char& c : opening) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  throw_unsupported(
      fmt::format("{}: the chat template (fingerprint {:016x}, starting \"{}{}\") "
                  "is not one mixkv recognises; choose one with --chat-template "
                  "NAME ({})",
                  origin, print, opening, text.size() > 60 ? "..." : "", fmt::join(names(), ", ")));
}

const ChatTemplate& chat_template_for(const weights::GgufFile& file,
                                      std::optional<std::string_view> name) {
  if (name) {
    if (const ChatTemplate* t = find_chat_template(*name)) return *t;
    throw_invalid(fmt::format("--chat-template '{}' is unknown; use one of {}", *name,
                              fmt::join(names(), ", ")));
  }
  const auto text = file.get_string("tokenizer.chat_template");
  if (!text) {
    throw_invalid(
        fmt::format("{}: the GGUF has no tokenizer.chat_template; choose one with "
                    "--chat-template NAME ({}) or use --raw",
                    file.origin(), fmt::join(names(), ", ")));
  }
  return detect_chat_template(*text, file.origin());
}

}  // namespace mixkv::tokenizer
