// The pre-tokenizer splits, worked out by hand from the regexes.
#include "mixkv/tokenizer/pre_tokenizer.hpp"

#include <gtest/gtest.h>

#include <random>

#include "test_support.hpp"

namespace mixkv::tokenizer {
namespace {

using Pieces = std::vector<std::string_view>;

TEST(PreTokenizer, SmolLmSplitsDigitsThenWords) {
  const PreTokenizer p("smollm");
  EXPECT_EQ(p.split("Hello world 123 I'm  ok\n\n"),
            (Pieces{"Hello", " world", " ", "1", "2", "3", " I", "'m", " ", " ok", "\n\n"}));
  EXPECT_EQ(p.split("café 你好!!"), (Pieces{"café", " 你好", "!!"}));
  EXPECT_EQ(p.split("x½y"), (Pieces{"x", "½", "y"}));  // ½ is a number (No)
  EXPECT_EQ(p.split(""), Pieces{});
}

TEST(PreTokenizer, Gpt2KeepsDigitRunsAndTheTextBetweenMatches) {
  const PreTokenizer p("gpt2");
  EXPECT_EQ(p.split("ab 123 4"), (Pieces{"ab", " 123", " 4"}));
  // A newline before a letter is matched by no alternative: it stays a piece of its own.
  EXPECT_EQ(p.split("a\nb"), (Pieces{"a", "\n", "b"}));
  EXPECT_EQ(p.split("a \tb"), (Pieces{"a", " ", "\t", "b"}));
}

TEST(PreTokenizer, PiecesAlwaysConcatenateToTheInput) {
  const PreTokenizer p("smollm");
  std::mt19937 rng(9);
  for (int i = 0; i < 300; ++i) {
    std::string text(rng() % 32, '\0');
    for (char& c : text) c = char(rng() % 256);  // mostly invalid UTF-8
    std::string joined;
    for (auto piece : p.split(text)) {
      EXPECT_FALSE(piece.empty());
      joined += piece;
    }
    EXPECT_EQ(joined, text);
  }
}

TEST(PreTokenizer, UnknownNamesListTheKnownOnes) {
  testing::expect_error([] { PreTokenizer p("nope"); }, ErrorCode::kUnsupported,
                        {"'nope'", "gpt2", "smollm"});
}

}  // namespace
}  // namespace mixkv::tokenizer
