// SmolLM2-135M-Instruct through the runner, straight from its memory-mapped GGUF: the logits of
// one step over many tokens are those of one-token steps, bit for bit, and the top-1 token after
// every position of the recorded chats agrees with llama.cpp's but on near-ties
// (tests/tokenizer/data/ smollm2-llamacpp-reference.json, scripts/record-llamacpp-reference.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "runner/smollm2_runner.hpp"

namespace mixkv::runner {
namespace {

using testing::first_blocks;
using testing::llamacpp_reference;
using testing::smollm2_runner;

// Logits of `tokens` at positions [0, n), computed `chunk` tokens per forward.
std::vector<float> logits_in_chunks(ModelRunner& runner, std::span<const TokenId> tokens,
                                    std::size_t chunk) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::vector<cache::BlockId> blocks = first_blocks(n, runner.plan().groups[0].block_size);
  std::vector<float> out;
  for (std::size_t at = 0; at < tokens.size(); at += chunk) {
    SequenceInput in;
    in.tokens = tokens.subspan(at, std::min(chunk, tokens.size() - at));
    in.start = static_cast<std::int64_t>(at);
    in.block_tables = {blocks};
    const ForwardOutput f = runner.forward(std::span(&in, 1));
    out.insert(out.end(), f.logits.begin(), f.logits.end());
  }
  return out;
}

TEST(SmolLm2Runner, OneStepOverManyTokensGivesTheLogitsOfOneTokenSteps) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  ModelRunner runner = smollm2_runner(path);
  EXPECT_EQ(runner.vocab_size(), 49152);
  const std::vector<TokenId> tokens = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198};
  const std::vector<float> batched = logits_in_chunks(runner, tokens, tokens.size());
  const std::vector<float> stepped = logits_in_chunks(runner, tokens, 1);
  ASSERT_EQ(batched.size(), tokens.size() * 49152u);
  ASSERT_EQ(batched.size(), stepped.size());
  EXPECT_EQ(std::memcmp(batched.data(), stepped.data(), batched.size() * sizeof(float)), 0);
}

// llama.cpp's teacher-forced top-1 with one token per llama_decode call (teacher_forced_step_top1:
// the path its greedy decoding takes) against mixkv's, over every position of the 8 chats (prompt
// and llama.cpp's greedy continuation). For a GGUF file mixkv computes llama.cpp's numerics: its
// Q4_1 and Q8_0 products (x quantised to 8 bits as ggml does), its f16-cache attention, RoPE
// angles and SiLU (kernels/attention_ggml.hpp, docs/engine.md). Measured: 100% (1,248 of 1,248;
// 97.60% with mixkv's own attention, RoPE and SiLU). The test asks for issue 13's 98%, and that
// any disagreement is a near-tie for llama.cpp too (its top-1 minus top-2 logit under 0.5).
TEST(SmolLm2LongAgreement, TeacherForcedTopOneAgreesWithLlamaCppExceptOnNearTies) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  ModelRunner runner = smollm2_runner(path);
  const nlohmann::json ref = llamacpp_reference();
  std::int64_t positions = 0, agree = 0, agree_batched = 0;
  double max_margin = 0;  // llama.cpp's top-1 minus top-2 logit where the top-1s differ
  const std::size_t vocab = 49152;
  for (const auto& chat : ref["chats"]) {
    std::vector<TokenId> tokens = chat["prompt_ids"].get<std::vector<TokenId>>();
    const auto greedy = chat["greedy_ids"].get<std::vector<TokenId>>();
    tokens.insert(tokens.end(), greedy.begin(), greedy.end());
    const auto step_top1 = chat["teacher_forced_step_top1"].get<std::vector<TokenId>>();
    const auto batched_top1 = chat["teacher_forced_top1"].get<std::vector<TokenId>>();
    ASSERT_EQ(step_top1.size(), tokens.size());
    const std::vector<float> logits = logits_in_chunks(runner, tokens, 32);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const TokenId top = argmax(std::span(logits).subspan(i * vocab, vocab));
      agree += top == step_top1[i];
      if (top != step_top1[i]) {
        max_margin = std::max(max_margin, chat["teacher_forced_step_margin"][i].get<double>());
      }
      agree_batched += top == batched_top1[i];
      ++positions;
    }
  }
  const double rate = static_cast<double>(agree) / static_cast<double>(positions);
  std::cout << fmt::format(
      "teacher-forced top-1: {} of {} positions ({:.2f}%) agree with llama.cpp's one-token "
      "steps, {} ({:.2f}%) with its batched evaluation; llama.cpp's largest margin where they "
      "differ: {:.3f}\n",
      agree, positions, 100 * rate, agree_batched,
      100.0 * static_cast<double>(agree_batched) / static_cast<double>(positions), max_margin);
  EXPECT_GE(rate, 0.98);
  EXPECT_LT(max_margin, 0.5);
}

}  // namespace
}  // namespace mixkv::runner
