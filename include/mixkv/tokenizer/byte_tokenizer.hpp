// The tiny models' vocabulary (src/engine/tiny_models.cpp): ids 0..255 are the bytes themselves,
// then BOS, EOS, PAD and UNK. Text round-trips byte for byte.
#pragma once

#include "mixkv/tokenizer/tokenizer.hpp"

namespace mixkv::tokenizer {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr TokenId kBos = 256;
  static constexpr TokenId kEos = 257;
  static constexpr TokenId kPad = 258;
  static constexpr TokenId kUnk = 259;
  static constexpr std::int64_t kVocabSize = 260;

  std::vector<TokenId> encode(std::string_view text,
                              const EncodeOptions& options = {}) const override;
  // Bytes as they are; the specials as "<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>" when `special`.
  std::string token_bytes(TokenId id, bool special = false) const override;
  std::int64_t vocab_size() const override { return kVocabSize; }
  const SpecialIds& special_ids() const override;
  TokenKind kind(TokenId id) const override;
  bool is_end_of_generation(TokenId id) const override { return id == kEos; }
};

}  // namespace mixkv::tokenizer
