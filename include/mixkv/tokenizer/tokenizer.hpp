// Text to token ids and back, one interface for every vocabulary mixkv runs: the byte vocabulary
// of the tiny models and byte-level BPE read from a GGUF (tokenizer.ggml.*). Decoding is exact:
// the bytes of the tokens, concatenated; StreamDecoder turns a token stream into text without
// splitting a UTF-8 character that spans tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mixkv::weights {
class GgufFile;
}

namespace mixkv::tokenizer {

using TokenId = std::int32_t;

// GGUF's tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenKind : std::uint8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // BOS, EOS, chat markers: matched in the input only with parse_special
  kUserDefined = 4,  // always matched in the input, decoded as their text
  kUnused = 5,
  kByte = 6,
};

struct SpecialIds {
  std::optional<TokenId> bos, eos, pad, unk;
  bool operator==(const SpecialIds&) const = default;
};

struct EncodeOptions {
  // Add the BOS (and EOS) the vocabulary asks for (tokenizer.ggml.add_bos_token / add_eos_token),
  // as llama.cpp's add_special does.
  bool add_special = false;
  // Control tokens written in the text (e.g. "<|im_start|>") become those tokens; otherwise they
  // are ordinary text. User-defined tokens are matched either way.
  bool parse_special = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<TokenId> encode(std::string_view text,
                                      const EncodeOptions& options = {}) const = 0;
  // The bytes `id` stands for. Control (and unknown/unused) tokens give their text only when
  // `special` is set, else nothing, so a reply decodes without its end-of-turn marker. Throws
  // Error (invalid input) for an id outside the vocabulary.
  virtual std::string token_bytes(TokenId id, bool special = false) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  virtual const SpecialIds& special_ids() const = 0;
  virtual TokenKind kind(TokenId id) const = 0;
  // Tokens that end a generated turn: EOS and the end-of-turn markers of the vocabulary.
  virtual bool is_end_of_generation(TokenId id) const = 0;

  // The concatenated bytes of `ids` (may be invalid UTF-8 when cut inside a character).
  std::string decode(std::span<const TokenId> ids, bool special = false) const;
};

// Turns token ids into text as they arrive: holds back the bytes of a UTF-8 character until it is
// complete; bytes that can never form a character come out as U+FFFD, as do the pending bytes
// at finish().
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool special = false)
      : tokenizer_(&tokenizer), special_(special) {}
  std::string push(TokenId id);  // the text that became complete with this token
  std::string finish();          // whatever is still pending

 private:
  const Tokenizer* tokenizer_;
  bool special_;
  std::string pending_;
};

// The tokenizer a GGUF describes (tokenizer.ggml.model "gpt2": byte-level BPE). Throws Error
// (unsupported) naming the model for another tokenizer kind, (invalid input) naming the key for
// missing or inconsistent tokenizer data.
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const weights::GgufFile& file);

}  // namespace mixkv::tokenizer
