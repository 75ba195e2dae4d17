// Byte-level BPE (GPT-2 style, tokenizer.ggml.model "gpt2"): every byte of the text is written as
// one printable character (GPT-2's byte-to-unicode table), the pre-tokenizer splits the text into
// words, and each word is merged pair by pair, lowest merge rank first (leftmost on ties), as
// llama.cpp's llm_tokenizer_bpe does. Special tokens are cut out of the text first, longest
// first. A merged piece the vocabulary lacks falls back to one token per byte.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "mixkv/tokenizer/pre_tokenizer.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"

namespace mixkv::tokenizer {

struct BpeVocab {
  std::vector<std::string> tokens;  // byte-level spelling of each token, by id
  std::vector<TokenKind> kinds;     // by id; empty means every token is normal
  std::vector<std::string> merges;  // "left right", highest priority first
  std::string pre = "gpt2";         // pre-tokenizer name (tokenizer.ggml.pre)
  SpecialIds special;
  bool add_bos = false;
  bool add_eos = false;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws Error (invalid input) for inconsistent data (naming `origin` and the field): special
  // ids outside the vocabulary, a merge that is not two parts, kinds of the wrong length.
  BpeTokenizer(BpeVocab vocab, std::string origin);

  std::vector<TokenId> encode(std::string_view text,
                              const EncodeOptions& options = {}) const override;
  std::string token_bytes(TokenId id, bool special = false) const override;
  std::int64_t vocab_size() const override { return std::int64_t(vocab_.tokens.size()); }
  const SpecialIds& special_ids() const override { return vocab_.special; }
  TokenKind kind(TokenId id) const override;
  bool is_end_of_generation(TokenId id) const override;

  // The id of a token spelled `text` (byte-level spelling), if any.
  std::optional<TokenId> find_token(std::string_view text) const;

 private:
  void check_id(TokenId id) const;
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;
  void encode_text(std::string_view text, std::vector<TokenId>& out) const;

  BpeVocab vocab_;
  std::string origin_;
  PreTokenizer pre_;
  std::unordered_map<std::string, TokenId> ids_;
  std::unordered_map<std::string, int> ranks_;  // "left right" -> rank
  std::vector<TokenId> special_tokens_;         // matched in the text, longest first
  std::vector<TokenId> end_of_generation_;
};

// The BpeVocab of a GGUF's tokenizer.ggml.* keys (tokens, token_type, merges, pre, bos/eos/
// unknown/padding ids, add_bos_token/add_eos_token). Throws Error naming the key at fault.
BpeVocab bpe_vocab_from_gguf(const weights::GgufFile& file);

}  // namespace mixkv::tokenizer
