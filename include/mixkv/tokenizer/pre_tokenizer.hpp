// The split of text into words before BPE, as named by a GGUF's tokenizer.ggml.pre: a sequence
// of regexes (PCRE2, UTF + Unicode properties), each applied in turn to the pieces the previous
// one left. As in llama.cpp (src/llama-vocab.cpp, src/unicode.cpp), both the matches and the text
// between them become pieces, so no byte is ever dropped.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mixkv::tokenizer {

class PreTokenizer {
 public:
  // Throws Error (unsupported) naming `name` and the supported names when it is not one.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  const std::string& name() const { return name_; }
  // Splits `text` (any bytes; invalid UTF-8 is never matched and stays in the gaps) into pieces
  // whose concatenation is `text`. Thread-safe.
  std::vector<std::string_view> split(std::string_view text) const;

  // The tokenizer.ggml.pre names this build knows.
  static std::vector<std::string_view> names();

 private:
  struct Regex;
  std::string name_;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace mixkv::tokenizer
