// SmolLM2-135M-Instruct through the scheduler: greedy replies against llama.cpp's recorded ones
// (tests/tokenizer/data/smollm2-llamacpp-reference.json), and speculation giving the plain tokens
// at batch 1 and 16. The SmolLm2Long* suites run in `make test` only (the sanitizer run skips
// them, see the Makefile); SmolLm2Speculation keeps a few steps under the sanitizers.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "engine_test_support.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/spec/self_draft.hpp"
#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "runner/smollm2_runner.hpp"

namespace mixkv::engine {
namespace {

using runner::testing::llamacpp_reference;
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

// Greedy decoding amplifies every near-tie: the first token that differs changes the rest. Issue
// 13 asks for the first 32 tokens identical on 7 of 8 chats. mixkv follows llama.cpp's numerics
// for GGUF files (its quantised products, attention, RoPE and SiLU: docs/engine.md), so in ggml's
// order its logits are llama.cpp's bit for bit; measured: 8 of 8. What this test checks: where a
// reply differs, llama.cpp itself nearly tied there (top-1 minus top-2 logit, one token per call,
// under `bound`). Returns how many of the 8 chats agree on all 32 tokens.
int greedy_agreement(const std::string& path, kernels::ReductionOrder order, double bound) {
  RunnerOptions ro;
  ro.weight_order = order;
  ModelRunner runner = smollm2_runner(path, ro);
  const auto tok = tokenizer::tokenizer_from_gguf(weights::GgufFile::open(path));
  const nlohmann::json ref = llamacpp_reference();
  std::vector<std::vector<TokenId>> prompts, want;
  for (const auto& chat : ref["chats"]) {
    prompts.push_back(chat["prompt_ids"].get<std::vector<TokenId>>());
    auto g = chat["greedy_ids"].get<std::vector<TokenId>>();
    g.resize(std::min<std::size_t>(g.size(), 32));
    want.push_back(std::move(g));
  }
  GenerateOptions o;
  o.max_tokens = 32;
  o.max_batch = 8;
  o.stop_tokens = stop_ids(*tok);
  const GenerateReport got = generate(runner, prompts, nullptr, o);
  int identical = 0;
  std::string report;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<TokenId>& g = got.requests[i].tokens;
    std::size_t same = 0;
    while (same < std::min(g.size(), want[i].size()) && g[same] == want[i][same]) ++same;
    identical += g == want[i];
    report += fmt::format(" chat {}: {} of {} tokens agree before the first difference", i, same,
                          want[i].size());
    if (g != want[i]) {
      const std::size_t at = prompts[i].size() - 1 + same;  // the position that predicts it
      const double margin = ref["chats"][i]["teacher_forced_step_margin"][at].get<double>();
      report += fmt::format(" (llama.cpp's margin there {:.3f})", margin);
      EXPECT_LT(margin, bound) << "chat " << i << " differs from llama.cpp at token " << same;
    }
    report += ";";
  }
  std::cout << fmt::format(
      "{} order: first 32 greedy tokens identical to llama.cpp's on {} of 8 chats:{}\n",
      kernels::to_string(order), identical, report);
  return identical;
}

TEST(SmolLm2LongGreedy, RepliesFollowLlamaCppUpToANearTie) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  EXPECT_GE(greedy_agreement(path, kernels::ReductionOrder::kGgml, 0.5), 7);
}

// The blocksum order (docs/kernels.md) rounds the products otherwise than llama.cpp: the figure
// is printed for the choice of the engine's default.
TEST(SmolLm2LongGreedy, BlockSumOrderRepliesFollowLlamaCppUpToANearTie) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  EXPECT_GE(greedy_agreement(path, kernels::ReductionOrder::kBlockSum, 0.5), 1);
}

// Plain tokens, then the same requests with each drafter: identical, at batch 16 and batch 1.
void expect_speculation_gives_plain_tokens(const std::string& path, std::size_t n, int max_batch,
                                           std::int64_t tokens, bool oracle_only = false) {
  RunnerOptions ro;
  ro.num_spec_tokens = 4;
  ro.self_draft_layers = model::kDefaultSelfDraftLayers;  // plans nothing: plain runs alike
  ModelRunner runner = smollm2_runner(path, ro);
  auto prompts = chat_prompts(path, n);
  if (oracle_only) {  // a few tokens of each (the system message's start: a shared prefix)
    for (std::size_t i = 0; i < prompts.size(); ++i) prompts[i].resize(6 + i);
  }
  const auto tok = tokenizer::tokenizer_from_gguf(weights::GgufFile::open(path));
  GenerateOptions o;
  o.max_tokens = tokens;
  o.max_batch = max_batch;
  o.stop_tokens = stop_ids(*tok);
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  OracleDrafter oracle(references(prompts, plain));
  NgramDrafter ngram;
  RandomDrafter random(runner.vocab_size(), 5);
  spec::SelfDrafter self(runner);
  o.num_spec_tokens = 4;
  std::vector<Drafter*> drafters = {&oracle};
  if (!oracle_only) drafters.insert(drafters.end(), {&ngram, &random, &self});
  for (Drafter* d : drafters) {
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
  // Under the sanitizers a SmolLM2 token costs tenths of a second: two short requests, three
  // tokens, the oracle.
  expect_speculation_gives_plain_tokens(path, 2, 2, 3, true);
}

}  // namespace
}  // namespace mixkv::engine
