// Streaming decode: characters split across tokens come out whole, bad bytes as U+FFFD.
#include <gtest/gtest.h>

#include "mixkv/core/error.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/tokenizer/byte_tokenizer.hpp"

namespace mixkv::tokenizer {
namespace {

std::string stream(const std::string& bytes) {
  const ByteTokenizer t;
  StreamDecoder d(t);
  std::string out;
  for (unsigned char c : bytes) out += d.push(TokenId(c));
  return out + d.finish();
}

TEST(StreamDecoder, HoldsBackAPartialCharacter) {
  const ByteTokenizer t;
  StreamDecoder d(t);
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x91), "");
  EXPECT_EQ(d.push(0x8B), "\xF0\x9F\x91\x8B");  // 👋
  EXPECT_EQ(d.push('a'), "a");
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");  // cut off: a replacement character
}

TEST(StreamDecoder, ReplacesBytesThatCanNeverFormACharacter) {
  EXPECT_EQ(stream("a\xFF"
                   "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(stream("\xC3(x"), "\xEF\xBF\xBD(x");  // a lead byte without continuation
  EXPECT_EQ(stream("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(stream("caf\xC3\xA9 \xE4\xBD\xA0"), "café 你");
}

TEST(ByteTokenizer, MatchesTheTinyModelsVocabulary) {
  const ByteTokenizer t;
  const std::string text = "hi\x01\xFF";
  EXPECT_EQ(t.encode(text), engine::encode_bytes(text));
  const std::vector<TokenId> ids = {'a', ByteTokenizer::kBos, ByteTokenizer::kEos,
                                    ByteTokenizer::kPad, ByteTokenizer::kUnk};
  EXPECT_EQ(t.decode(ids, true), engine::decode_bytes(ids));
  EXPECT_EQ(t.decode(ids), "a");
  EXPECT_EQ(ByteTokenizer::kBos, engine::kBosToken);
  EXPECT_EQ(ByteTokenizer::kVocabSize, engine::kByteVocabSize);
  EXPECT_TRUE(t.is_end_of_generation(ByteTokenizer::kEos));
  EXPECT_THROW(t.token_bytes(260), Error);
}

}  // namespace
}  // namespace mixkv::tokenizer
