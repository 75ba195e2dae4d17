#include "mixkv/tokenizer/bpe_tokenizer.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <queue>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "mixkv/weights/gguf.hpp"

namespace mixkv::tokenizer {
namespace {

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100 onwards, in byte order. Each entry is the UTF-8 of that character.
struct ByteLevel {
  std::array<std::string, 256> encode;
  std::unordered_map<std::uint32_t, unsigned char> decode;  // code point -> byte

  ByteLevel() {
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const std::uint32_t cp = printable ? b : next++;
      append_utf8(encode[b], cp);
      decode[cp] = static_cast<unsigned char>(b);
    }
  }
};

const ByteLevel& byte_level() {
  static const ByteLevel table;
  return table;
}

// Decodes one UTF-8 character of a (valid) byte-level token spelling; returns its length.
int next_code_point(std::string_view s, std::size_t i, std::uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + n > s.size()) n = 1;
  cp = n == 1 ? c : c & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return n;
}

int utf8_length(unsigned char lead) {
  return lead < 0x80           ? 1
         : (lead >> 5) == 0x6  ? 2
         : (lead >> 4) == 0xE  ? 3
         : (lead >> 3) == 0x1E ? 4
                               : 1;
}

// Markers that end a turn in the chat formats mixkv knows, beside the vocabulary's EOS (the same
// idea as llama.cpp's end-of-generation set).
constexpr std::array<std::string_view, 6> kEndOfTurn = {
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>"};

}  // namespace

BpeTokenizer::BpeTokenizer(BpeVocab vocab, std::string origin)
    : vocab_(std::move(vocab)), origin_(std::move(origin)), pre_(vocab_.pre) {
  const auto n = static_cast<std::int64_t>(vocab_.tokens.size());
  if (n == 0 || n > (std::int64_t{1} << 30)) {
    throw_invalid(
        fmt::format("{}: tokenizer.ggml.tokens has {} tokens; expected 1 to 2^30", origin_, n));
  }
  if (vocab_.kinds.empty()) vocab_.kinds.assign(vocab_.tokens.size(), TokenKind::kNormal);
  if (vocab_.kinds.size() != vocab_.tokens.size()) {
    throw_invalid(fmt::format("{}: tokenizer.ggml.token_type has {} entries for {} tokens", origin_,
                              vocab_.kinds.size(), n));
  }
  auto check_special = [&](const std::optional<TokenId>& id, std::string_view key) {
    if (id && (*id < 0 || *id >= n)) {
      throw_invalid(fmt::format("{}: tokenizer.ggml.{} is {}, outside the vocabulary of {} tokens",
                                origin_, key, *id, n));
    }
  };
  check_special(vocab_.special.bos, "bos_token_id");
  check_special(vocab_.special.eos, "eos_token_id");
  check_special(vocab_.special.pad, "padding_token_id");
  check_special(vocab_.special.unk, "unknown_token_id");

  ids_.reserve(vocab_.tokens.size());
  for (TokenId id = 0; id < n; ++id)
    ids_[vocab_.tokens[id]] = id;  // a repeated spelling: last wins
  ranks_.reserve(vocab_.merges.size());
  for (std::size_t i = 0; i < vocab_.merges.size(); ++i) {
    const std::string& m = vocab_.merges[i];
    // The separator is the first space after the first character ("Ġ Ġ" merges two spaces).
    const std::size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= m.size()) {
      throw_invalid(
          fmt::format("{}: tokenizer.ggml.merges[{}] is '{}', not two parts separated "
                      "by a space",
                      origin_, i, m));
    }
    ranks_.emplace(m, static_cast<int>(i));  // a repeated merge keeps its first (best) rank
  }
  for (TokenId id = 0; id < n; ++id) {
    const TokenKind k = vocab_.kinds[id];
    if ((k == TokenKind::kControl || k == TokenKind::kUserDefined || k == TokenKind::kUnknown) &&
        !vocab_.tokens[id].empty()) {
      special_tokens_.push_back(id);
    }
    if (k == TokenKind::kControl &&
        std::find(kEndOfTurn.begin(), kEndOfTurn.end(), vocab_.tokens[id]) != kEndOfTurn.end()) {
      end_of_generation_.push_back(id);
    }
  }
  if (vocab_.special.eos) end_of_generation_.push_back(*vocab_.special.eos);
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](TokenId a, TokenId b) {
    return vocab_.tokens[a].size() > vocab_.tokens[b].size();
  });
}

void BpeTokenizer::check_id(TokenId id) const {
  if (id < 0 || id >= vocab_size()) {
    throw_invalid(fmt::format("token id {} is outside the vocabulary of {} ({} tokens)", id,
                              origin_, vocab_size()));
  }
}

TokenKind BpeTokenizer::kind(TokenId id) const {
  check_id(id);
  return vocab_.kinds[id];
}

bool BpeTokenizer::is_end_of_generation(TokenId id) const {
  return std::find(end_of_generation_.begin(), end_of_generation_.end(), id) !=
         end_of_generation_.end();
}

std::optional<TokenId> BpeTokenizer::find_token(std::string_view text) const {
  auto it = ids_.find(std::string(text));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::string BpeTokenizer::token_bytes(TokenId id, bool special) const {
  check_id(id);
  const std::string& text = vocab_.tokens[id];
  switch (vocab_.kinds[id]) {
    case TokenKind::kNormal:
    case TokenKind::kByte:
      break;
    case TokenKind::kUserDefined:
      return text;  // written as it is, never byte-level encoded
    default:
      return special ? text : std::string();
  }
  std::string out;
  const ByteLevel& bl = byte_level();
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t cp = 0;
    const int n = next_code_point(text, i, cp);
    auto it = bl.decode.find(cp);
    if (it != bl.decode.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(text, i, n);  // not a byte-level character: keep it as written
    }
    i += n;
  }
  return out;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  const ByteLevel& bl = byte_level();
  std::string encoded;
  for (char c : word) encoded += bl.encode[static_cast<unsigned char>(c)];

  // Symbols: one byte-level character each, linked so merges can remove the right neighbour.
  struct Symbol {
    std::size_t begin, len;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  for (std::size_t i = 0; i < encoded.size();) {
    const std::size_t n = std::min<std::size_t>(utf8_length(static_cast<unsigned char>(encoded[i])),
                                                encoded.size() - i);
    symbols.push_back({i, n, int(symbols.size()) - 1, int(symbols.size()) + 1});
    i += n;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Bigram {
    int rank;
    int left, right;
    std::size_t len;  // of the merged text, to skip pairs a merge has made stale
    bool operator<(const Bigram& o) const {  // priority_queue pops the largest: invert
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Bigram> queue;
  std::string key;
  auto add_bigram = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    key.assign(encoded, l.begin, l.len);
    key.push_back(' ');
    key.append(encoded, r.begin, r.len);
    auto it = ranks_.find(key);
    if (it != ranks_.end()) queue.push({it->second, left, right, l.len + r.len});
  };
  for (std::size_t i = 1; i < symbols.size(); ++i) add_bigram(int(i) - 1, int(i));

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    // Stale when either side has been merged away or grown since the pair was queued.
    if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    add_bigram(l.prev, b.left);
    add_bigram(b.left, l.next);
  }

  for (int i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string piece = encoded.substr(s.begin, s.len);
    if (auto it = ids_.find(piece); it != ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not in the vocabulary: one token per byte-level character (byte fallback).
    for (std::size_t k = 0; k < piece.size();) {
      const std::size_t n = std::min<std::size_t>(utf8_length(static_cast<unsigned char>(piece[k])),
                                                  piece.size() - k);
      if (auto it = ids_.find(piece.substr(k, n)); it != ids_.end()) {
        out.push_back(it->second);
      } else if (vocab_.special.unk) {
        out.push_back(*vocab_.special.unk);
      } else {
        throw_invalid(
            fmt::format("{}: the vocabulary has no token for byte-level character "
                        "'{}' and no unknown token",
                        origin_, piece.substr(k, n)));
      }
      k += n;
    }
  }
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<TokenId>& out) const {
  for (std::string_view word : pre_.split(text)) encode_word(word, out);
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text,
                                          const EncodeOptions& options) const {
  // Fragments of the text: raw text still to tokenize, or a special token already found.
  struct Fragment {
    std::string_view text;  // empty for a token
    TokenId token = -1;
  };
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({text});
  for (TokenId id : special_tokens_) {
    const TokenKind k = vocab_.kinds[id];
    if (!options.parse_special && k != TokenKind::kUserDefined) continue;
    const std::string& needle = vocab_.tokens[id];
    std::vector<Fragment> next;
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (std::size_t at; (at = rest.find(needle)) != std::string_view::npos;) {
        if (at > 0) next.push_back({rest.substr(0, at)});
        next.push_back({{}, id});
        rest.remove_prefix(at + needle.size());
      }
      if (!rest.empty()) next.push_back({rest});
    }
    fragments = std::move(next);
  }

  std::vector<TokenId> out;
  if (options.add_special && vocab_.add_bos && vocab_.special.bos)
    out.push_back(*vocab_.special.bos);
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
    } else {
      encode_text(f.text, out);
    }
  }
  if (options.add_special && vocab_.add_eos && vocab_.special.eos)
    out.push_back(*vocab_.special.eos);
  return out;
}

BpeVocab bpe_vocab_from_gguf(const weights::GgufFile& file) {
  BpeVocab v;
  const std::vector<std::string>* tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (tokens == nullptr) {
    throw_invalid(
        fmt::format("{}: metadata 'tokenizer.ggml.tokens' is missing; the GGUF carries "
                    "no vocabulary",
                    file.origin()));
  }
  v.tokens = *tokens;
  if (auto types = file.get_int_array("tokenizer.ggml.token_type")) {
    v.kinds.reserve(types->size());
    for (std::size_t i = 0; i < types->size(); ++i) {
      const std::int64_t t = (*types)[i];
      if (t < 1 || t > 6) {
        throw_invalid(fmt::format("{}: tokenizer.ggml.token_type[{}] is {}; token types are 1 to 6",
                                  file.origin(), i, t));
      }
      v.kinds.push_back(static_cast<TokenKind>(t));
    }
  }
  if (const auto* merges = file.get_string_array("tokenizer.ggml.merges")) v.merges = *merges;
  v.pre = file.get_string("tokenizer.ggml.pre").value_or("gpt2");
  auto id = [&](std::string_view key) -> std::optional<TokenId> {
    const std::string k = fmt::format("tokenizer.ggml.{}", key);
    const auto value = file.get_int(k);
    if (!value) return std::nullopt;
    if (*value < 0 || *value > std::numeric_limits<TokenId>::max()) {
      throw_invalid(
          fmt::format("{}: metadata '{}' is {}, not a token id", file.origin(), k, *value));
    }
    return static_cast<TokenId>(*value);
  };
  v.special.bos = id("bos_token_id");
  v.special.eos = id("eos_token_id");
  v.special.pad = id("padding_token_id");
  v.special.unk = id("unknown_token_id");
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
  v.add_eos = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  return v;
}

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const weights::GgufFile& file) {
  const auto model = file.get_string("tokenizer.ggml.model");
  if (!model) {
    throw_invalid(
        fmt::format("{}: metadata 'tokenizer.ggml.model' is missing; the GGUF carries "
                    "no tokenizer",
                    file.origin()));
  }
  if (*model != "gpt2") {
    throw_unsupported(
        fmt::format("{}: tokenizer.ggml.model '{}' is not supported; mixkv reads "
                    "byte-level BPE ('gpt2')",
                    file.origin(), *model));
  }
  return std::make_unique<BpeTokenizer>(bpe_vocab_from_gguf(file), file.origin());
}

}  // namespace mixkv::tokenizer
