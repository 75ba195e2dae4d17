#include "mixkv/tokenizer/tokenizer.hpp"

namespace mixkv::tokenizer {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence a lead byte starts, or 0 for a byte that cannot start one.
int sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `s` (of the lead's length, or a prefix of it) is a valid start of a character: the
// continuation bytes, and the narrower second-byte ranges that exclude overlong forms, surrogates
// and code points above U+10FFFF.
bool valid_prefix(std::string_view s) {
  const auto lead = static_cast<unsigned char>(s[0]);
  for (std::size_t i = 1; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    unsigned char lo = 0x80, hi = 0xBF;
    if (i == 1) {
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    }
    if (c < lo || c > hi) return false;
  }
  return true;
}

}  // namespace

std::string Tokenizer::decode(std::span<const TokenId> ids, bool special) const {
  std::string out;
  for (TokenId id : ids) out += token_bytes(id, special);
  return out;
}

std::string StreamDecoder::push(TokenId id) {
  pending_ += tokenizer_->token_bytes(id, special_);
  std::string out;
  std::size_t i = 0;
  while (i < pending_.size()) {
    const int n = sequence_length(static_cast<unsigned char>(pending_[i]));
    if (n == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    const std::string_view seq = std::string_view(pending_).substr(i, n);
    if (!valid_prefix(seq)) {
      out += kReplacement;  // the lead byte alone; what follows is looked at afresh
      ++i;
      continue;
    }
    if (seq.size() < static_cast<std::size_t>(n)) break;  // wait for the rest of the character
    out += seq;
    i += n;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  if (!pending_.empty()) out = kReplacement;
  pending_.clear();
  return out;
}

}  // namespace mixkv::tokenizer
