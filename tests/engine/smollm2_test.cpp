// SmolLM2-135M-Instruct through the scheduler: greedy replies against llama.cpp's recorded ones
// (tests/tokenizer/data/smollm2-llamacpp-reference.json), and speculation giving the plain tokens
// at batch 1 and 16. The SmolLm2Long* suites run in `make test` only (the sanitizer run skips
// them, see the Makefile); SmolLm2Speculation.Short* keeps a few steps under the sanitizers.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "engine_test_support.hpp"
#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "runner/smollm2_runner.hpp"

namespace mixkv::engine {
namespace {

using runner::testing::smollm2_runner;
using testing::expect_same_tokens;
using testing::references;

std::vector<TokenId> stop_ids(const tokenizer::Tokenizer& tok) {
  std::vector<TokenId> ids;
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_end_of_generation(id)) ids.push_back(id);
  }
  return ids;
}

// `n` chat prompts through the file's template: one of four questions, odd ones with a suffix
// repeated 1 to 3 times (mixed lengths; requests of one question share everything before it).
std::vector<std::vector<TokenId>> chat_prompts(const std::string& path, std::size_t n) {
  const weights::GgufFile file = weights::GgufFile::open(path);
  const auto tok = tokenizer::tokenizer_from_gguf(file);
  const tokenizer::ChatTemplate& tmpl = tokenizer::chat_template_for(file);
  const char* questions[] = {"What is the capital of France?", "Name three colours.",
                             "Write a haiku about rain.", "How do I sort a list in Python?"};
  std::vector<std::vector<TokenId>> out;
  for (std::size_t i = 0; i < n; ++i) {
    std::string q = questions[i % 4];
    for (std::size_t r = 0; i % 2 == 1 && r <= i % 3; ++r) q += fmt::format(" (take {})", i);
    const tokenizer::ChatMessage m{"user", q};
    out.push_back(tok->encode(tmpl.render(std::span(&m, 1), true)));
  }
  return out;
}

// Plain tokens, then the same requests with each drafter: identical, at batch 16 and batch 1.
void expect_speculation_gives_plain_tokens(const std::string& path, std::size_t n, int max_batch,
                                           std::int64_t tokens) {
  RunnerOptions ro;
  ro.num_spec_tokens = 4;
  ModelRunner runner = smollm2_runner(path, ro);
  const auto prompts = chat_prompts(path, n);
  const auto tok = tokenizer::tokenizer_from_gguf(weights::GgufFile::open(path));
  GenerateOptions o;
  o.max_tokens = tokens;
  o.max_batch = max_batch;
  o.stop_tokens = stop_ids(*tok);
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  OracleDrafter oracle(references(prompts, plain));
  NgramDrafter ngram;
  RandomDrafter random(runner.vocab_size(), 5);
  o.num_spec_tokens = 4;
  for (Drafter* d : std::initializer_list<Drafter*>{&oracle, &ngram, &random}) {
    const GenerateReport spec = generate(runner, prompts, d, o);
    expect_same_tokens(plain, spec, fmt::format("{} at batch {}", d->name(), max_batch));
  }
}

TEST(SmolLm2LongSpeculation, DraftersGiveThePlainTokensAtBatch16WithMixedPrompts) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  expect_speculation_gives_plain_tokens(path, 16, 16, 8);
}

TEST(SmolLm2LongSpeculation, DraftersGiveThePlainTokensAtBatch1) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  expect_speculation_gives_plain_tokens(path, 2, 1, 24);
}

TEST(SmolLm2Speculation, ShortBatchOfTwoGivesThePlainTokens) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  expect_speculation_gives_plain_tokens(path, 2, 2, 3);
}

}  // namespace
}  // namespace mixkv::engine
