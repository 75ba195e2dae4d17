// Byte-level BPE on a small hand-made vocabulary: merge order, byte fallback, special tokens,
// exact decoding, and bad vocabularies.
#include "mixkv/tokenizer/bpe_tokenizer.hpp"

#include <gtest/gtest.h>

#include <random>

#include "test_support.hpp"

namespace mixkv::tokenizer {
namespace {

using testing::expect_error;

// GPT-2's byte-to-character table, written out independently of the tokenizer's as the oracle.
std::string byte_char(unsigned b) {
  unsigned cp = b;
  if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    unsigned n = 0;
    for (unsigned x = 0; x < b; ++x) {
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Ids 0..255: the 256 byte characters; then merged tokens; then specials.
struct Vocab {
  BpeVocab v;
  TokenId id(std::string_view text) const {
    for (std::size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == text) return TokenId(i);
    }
    ADD_FAILURE() << "no token " << text;
    return -1;
  }
};

Vocab small_vocab() {
  Vocab s;
  for (unsigned b = 0; b < 256; ++b) s.v.tokens.push_back(byte_char(b));
  s.v.kinds.assign(256, TokenKind::kNormal);
  for (std::string t : {"ab", "abc",
                        "\xC4\xA0"
                        "a",
                        "aa", "\xC4\xA0\xC4\xA0"}) {  // Ġa, ĠĠ
    s.v.tokens.push_back(t);
    s.v.kinds.push_back(TokenKind::kNormal);
  }
  s.v.tokens.push_back("<s>");
  s.v.kinds.push_back(TokenKind::kControl);
  s.v.tokens.push_back("</s>");
  s.v.kinds.push_back(TokenKind::kControl);
  s.v.tokens.push_back("<user>");
  s.v.kinds.push_back(TokenKind::kUserDefined);
  s.v.merges = {"a b", "ab c", "\xC4\xA0 a", "a a", "b c", "\xC4\xA0 \xC4\xA0"};
  s.v.special.bos = s.id("<s>");
  s.v.special.eos = s.id("</s>");
  s.v.pre = "gpt2";
  return s;
}

TEST(BpeTokenizer, MergesLowestRankFirst) {
  const Vocab s = small_vocab();
  const BpeTokenizer t(s.v, "test");
  EXPECT_EQ(t.encode("abc"), (std::vector<TokenId>{s.id("abc")}));
  // " ab": (a b) has rank 0, (Ġ a) rank 2, so "ab" forms first and Ġ stays alone.
  EXPECT_EQ(t.encode(" ab"), (std::vector<TokenId>{s.id("\xC4\xA0"), s.id("ab")}));
  EXPECT_EQ(t.encode(" a"), (std::vector<TokenId>{s.id("\xC4\xA0"
                                                       "a")}));
  // Equal ranks: the leftmost pair merges first.
  EXPECT_EQ(t.encode("aaa"), (std::vector<TokenId>{s.id("aa"), s.id("a")}));
  EXPECT_EQ(t.encode("aaaa"), (std::vector<TokenId>{s.id("aa"), s.id("aa")}));
}

TEST(BpeTokenizer, FallsBackToBytesForMergesOutsideTheVocabulary) {
  const Vocab s = small_vocab();
  const BpeTokenizer t(s.v, "test");
  // "b c" is a merge but "bc" is no token: one token per byte.
  EXPECT_EQ(t.encode("bc"), (std::vector<TokenId>{'b', 'c'}));
}

TEST(BpeTokenizer, DecodingIsExactForAnyBytes) {
  const Vocab s = small_vocab();
  const BpeTokenizer t(s.v, "test");
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    std::string text(rng() % 24, '\0');
    for (char& c : text) c = char(rng() % 256);  // invalid UTF-8 included
    EXPECT_EQ(t.decode(t.encode(text, {.parse_special = false})), text);
  }
  EXPECT_EQ(t.decode(t.encode("  ab  abc\n\t x")), "  ab  abc\n\t x");
}

TEST(BpeTokenizer, SpecialTokensAreCutOutBeforeBpe) {
  const Vocab s = small_vocab();
  const BpeTokenizer t(s.v, "test");
  const TokenId bos = s.id("<s>"), eos = s.id("</s>"), user = s.id("<user>");
  EXPECT_EQ(t.encode("<s>ab</s>"), (std::vector<TokenId>{bos, s.id("ab"), eos}));
  EXPECT_EQ(t.encode("ab<s><s>"), (std::vector<TokenId>{s.id("ab"), bos, bos}));
  // Without parse_special, control tokens are text; user-defined tokens still match.
  const std::vector<TokenId> plain = t.encode("<s><user>", {.parse_special = false});
  EXPECT_EQ(plain.back(), user);
  EXPECT_EQ(plain.front(), TokenId('<'));
  EXPECT_EQ(t.decode(plain), "<s><user>");
  // Control tokens decode to nothing unless asked for; user-defined ones to their text.
  EXPECT_EQ(t.decode(std::vector<TokenId>{bos, s.id("ab"), user, eos}), "ab<user>");
  EXPECT_EQ(t.decode(std::vector<TokenId>{bos, s.id("ab"), eos}, true), "<s>ab</s>");
  EXPECT_TRUE(t.is_end_of_generation(eos));
  EXPECT_FALSE(t.is_end_of_generation(bos));
}

TEST(BpeTokenizer, AddSpecialAddsWhatTheVocabularyAsksFor) {
  Vocab s = small_vocab();
  s.v.add_bos = true;
  const BpeTokenizer t(s.v, "test");
  EXPECT_EQ(t.encode("ab", {.add_special = true}), (std::vector<TokenId>{s.id("<s>"), s.id("ab")}));
  EXPECT_EQ(t.encode("ab"), (std::vector<TokenId>{s.id("ab")}));
}

TEST(BpeTokenizer, BadVocabulariesAreClearErrors) {
  Vocab s = small_vocab();
  s.v.merges.push_back("nospace");
  expect_error([&] { BpeTokenizer(s.v, "v.gguf"); }, ErrorCode::kInvalidInput,
               {"v.gguf", "merges[6]", "nospace"});
  s = small_vocab();
  s.v.special.eos = 100000;
  expect_error([&] { BpeTokenizer(s.v, "v.gguf"); }, ErrorCode::kInvalidInput,
               {"eos_token_id", "100000"});
  s = small_vocab();
  s.v.kinds.pop_back();
  expect_error([&] { BpeTokenizer(s.v, "v.gguf"); }, ErrorCode::kInvalidInput, {"token_type"});
  s = small_vocab();
  s.v.pre = "klingon";
  expect_error([&] { BpeTokenizer(s.v, "v.gguf"); }, ErrorCode::kUnsupported,
               {"'klingon'", "smollm"});
  const BpeTokenizer t(small_vocab().v, "v.gguf");
  expect_error([&] { t.token_bytes(-1); }, ErrorCode::kInvalidInput, {"-1", "v.gguf"});
}

}  // namespace
}  // namespace mixkv::tokenizer
