#include "mixkv/tokenizer/byte_tokenizer.hpp"

#include <array>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::tokenizer {
namespace {

constexpr std::array<std::string_view, 4> kSpecialText = {"<|bos|>", "<|eos|>", "<|pad|>",
                                                          "<|unk|>"};

void check(TokenId id) {
  if (id < 0 || id >= ByteTokenizer::kVocabSize) {
    throw_invalid(fmt::format("token id {} is outside the byte vocabulary (0..{})", id,
                              ByteTokenizer::kVocabSize - 1));
  }
}

}  // namespace

std::vector<TokenId> ByteTokenizer::encode(std::string_view text,
                                           const EncodeOptions& options) const {
  // The byte vocabulary has no text form for its specials, so parse_special has nothing to find,
  // and no BOS is asked for (the tiny models are trained on nothing): add_special adds none.
  (void)options;
  std::vector<TokenId> out;
  out.reserve(text.size());
  for (char c : text) out.push_back(static_cast<TokenId>(static_cast<unsigned char>(c)));
  return out;
}

std::string ByteTokenizer::token_bytes(TokenId id, bool special) const {
  check(id);
  if (id < 256) return std::string(1, static_cast<char>(static_cast<unsigned char>(id)));
  return special ? std::string(kSpecialText[static_cast<std::size_t>(id - kBos)]) : std::string();
}

const SpecialIds& ByteTokenizer::special_ids() const {
  static const SpecialIds ids{kBos, kEos, kPad, kUnk};
  return ids;
}

TokenKind ByteTokenizer::kind(TokenId id) const {
  check(id);
  if (id < 256) return TokenKind::kByte;
  return id == kUnk ? TokenKind::kUnknown : TokenKind::kControl;
}

}  // namespace mixkv::tokenizer
