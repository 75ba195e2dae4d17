// SmolLM2-135M-Instruct through the runner, straight from its memory-mapped GGUF: the logits of
// one step over many tokens are those of one-token steps, bit for bit, and the top-1 token after
// every position of the recorded chats agrees with llama.cpp's but on near-ties
// (tests/tokenizer/data/ smollm2-llamacpp-reference.json, scripts/record-llamacpp-reference.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "runner/smollm2_runner.hpp"

namespace mixkv::runner {
namespace {

using testing::first_blocks;
using testing::llamacpp_reference;
using testing::smollm2_runner;

// This process's resident memory as Linux reports it (anonymous: the packed copies; file: the
// mapped GGUF's resident pages).
std::string resident_memory() {
  std::ifstream in("/proc/self/status");
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.starts_with("VmRSS") || line.starts_with("RssAnon") || line.starts_with("RssFile")) {
      out += " " + line;
    }
  }
  return out;
}

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

// In both reduction orders of the Q4_1 / Q8_0 products (RunnerOptions::weight_order); the
// blocksum order packs the weights at load, and its logits differ from the ggml order's only in
// float rounding.
TEST(SmolLm2Runner, OneStepOverManyTokensGivesTheLogitsOfOneTokenSteps) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const std::vector<TokenId> tokens = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198};
  std::vector<float> ggml;
  for (const auto order : {kernels::ReductionOrder::kGgml, kernels::ReductionOrder::kBlockSum}) {
    RunnerOptions o;
    o.weight_order = order;
    ModelRunner runner = smollm2_runner(path, o);
    EXPECT_EQ(runner.vocab_size(), 49152);
    std::cout << fmt::format("{} order, after loading:{}\n", kernels::to_string(order),
                             resident_memory());
    const std::vector<float> batched = logits_in_chunks(runner, tokens, tokens.size());
    const std::vector<float> stepped = logits_in_chunks(runner, tokens, 1);
    std::cout << fmt::format("{} order, after 20 forwards:{}\n", kernels::to_string(order),
                             resident_memory());
    ASSERT_EQ(batched.size(), tokens.size() * 49152u);
    ASSERT_EQ(batched.size(), stepped.size());
    EXPECT_EQ(std::memcmp(batched.data(), stepped.data(), batched.size() * sizeof(float)), 0)
        << kernels::to_string(order);
    if (order == kernels::ReductionOrder::kGgml) {
      ggml = batched;
      continue;
    }
    // The 8-bit codes of the next layer's input move with the last bits of this one's output,
    // so the logits drift by more than one product's rounding: bounded on average.
    double diff = 0, mag = 0;
    for (std::size_t i = 0; i < ggml.size(); ++i) {
      diff += std::abs(static_cast<double>(batched[i]) - ggml[i]);
      mag += std::abs(static_cast<double>(ggml[i]));
    }
    std::cout << fmt::format(
        "blocksum vs ggml order: mean |logit difference| {:.4f}, mean |logit| {:.3f}\n",
        diff / static_cast<double>(ggml.size()), mag / static_cast<double>(ggml.size()));
    EXPECT_GT(diff, 0.0) << "the orders round differently";
    EXPECT_LT(diff, 0.05 * mag) << "but compute the same product";
  }
}

// The bf16-pair attention order (RunnerOptions::attention_order, over a bfloat16 cache): one step
// over many tokens still gives the logits of one-token steps bit for bit, and the logits stay
// within rounding of the float order's over the same cache. The f16 cache the model asks for by
// default cannot take the order: loading names the layer and the fix.
TEST(SmolLm2Runner, TheBf16PairAttentionOrderKeepsOneStepEqualToOneTokenSteps) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const std::vector<TokenId> tokens = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198};
  std::vector<float> by_order[2];
  for (const auto order : {kernels::AttentionOrder::kFloat, kernels::AttentionOrder::kBf16Pairs}) {
    RunnerOptions o;
    o.weight_order = kernels::ReductionOrder::kBlockSum;
    o.kv_dtype = DType::kBfloat16;
    o.attention_order = order;
    ModelRunner runner = smollm2_runner(path, o);
    const std::vector<float> batched = logits_in_chunks(runner, tokens, tokens.size());
    const std::vector<float> stepped = logits_in_chunks(runner, tokens, 3);
    ASSERT_EQ(batched.size(), stepped.size());
    EXPECT_EQ(std::memcmp(batched.data(), stepped.data(), batched.size() * sizeof(float)), 0)
        << kernels::to_string(order);
    by_order[order == kernels::AttentionOrder::kBf16Pairs] = batched;
  }
  double diff = 0, mag = 0;
  for (std::size_t i = 0; i < by_order[0].size(); ++i) {
    diff += std::abs(static_cast<double>(by_order[1][i]) - by_order[0][i]);
    mag += std::abs(static_cast<double>(by_order[0][i]));
  }
  EXPECT_GT(diff, 0.0) << "the orders round differently";
  EXPECT_LT(diff, 0.05 * mag) << "but compute the same attention";

  RunnerOptions f16;
  f16.attention_order = kernels::AttentionOrder::kBf16Pairs;
  try {
    smollm2_runner(path, f16);
    ADD_FAILURE() << "an f16 cache took the bf16-pair order";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer layers.0: the bf16-pairs attention order needs a "
                                         "bfloat16 or fp8_e4m3 cache (got float16)"),
              std::string::npos)
        << e.what();
  }
}

// HND pages (RunnerOptions::kv_layout: a KV head's tokens side by side) hold the same tokens as
// NHD pages: the same logits bit for bit, in the default orders (llama.cpp's attention over the
// model's f16 cache) and in the bf16-pair order over a bf16 cache.
TEST(SmolLm2Runner, HndPagesGiveTheLogitsOfNhdPages) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const std::vector<TokenId> tokens = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198};
  RunnerOptions pairs;
  pairs.kv_dtype = DType::kBfloat16;
  pairs.attention_order = kernels::AttentionOrder::kBf16Pairs;
  for (RunnerOptions o : {RunnerOptions{}, pairs}) {
    std::vector<float> by_layout[2];
    for (const auto layout : {attn::KvLayout::kNHD, attn::KvLayout::kHND}) {
      o.kv_layout = layout;
      ModelRunner runner = smollm2_runner(path, o);
      by_layout[layout == attn::KvLayout::kHND] = logits_in_chunks(runner, tokens, 4);
    }
    ASSERT_EQ(by_layout[0].size(), tokens.size() * 49152u);
    EXPECT_EQ(by_layout[0], by_layout[1]) << kernels::to_string(o.attention_order);
  }
}

// llama.cpp's teacher-forced top-1 with one token per llama_decode call (teacher_forced_step_top1:
// the path its greedy decoding takes) against mixkv's, over every position of the 8 chats (prompt
// and llama.cpp's greedy continuation). For a GGUF file mixkv computes llama.cpp's numerics: its
// Q4_1 and Q8_0 products (x quantised to 8 bits as ggml does), its f16-cache attention, RoPE
// angles and SiLU (kernels/attention_ggml.hpp, docs/engine.md). Measured in ggml's order: 100%
// (1,248 of 1,248; 97.60% with mixkv's own attention, RoPE and SiLU). The test asks for issue 13's
// 98%, and that any disagreement is a near-tie for llama.cpp too (its top-1 minus top-2 logit
// under 0.5).
struct Agreement {
  double rate = 0;        // mixkv's top-1 = llama.cpp's one-token top-1
  double max_margin = 0;  // llama.cpp's top-1 minus top-2 logit where the top-1s differ
};

Agreement teacher_forced_agreement(const std::string& path, kernels::ReductionOrder order) {
  RunnerOptions o;
  o.weight_order = order;
  ModelRunner runner = smollm2_runner(path, o);
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
    EXPECT_EQ(step_top1.size(), tokens.size());
    if (step_top1.size() != tokens.size()) return {};
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
      "{} order: teacher-forced top-1: {} of {} positions ({:.2f}%) agree with llama.cpp's "
      "one-token steps, {} ({:.2f}%) with its batched evaluation; llama.cpp's largest margin "
      "where they differ: {:.3f}\n",
      kernels::to_string(order), agree, positions, 100 * rate, agree_batched,
      100.0 * static_cast<double>(agree_batched) / static_cast<double>(positions), max_margin);
  return {rate, max_margin};
}

TEST(SmolLm2LongAgreement, TeacherForcedTopOneAgreesWithLlamaCppExceptOnNearTies) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const Agreement a = teacher_forced_agreement(path, kernels::ReductionOrder::kGgml);
  EXPECT_GE(a.rate, 0.98);
  EXPECT_LT(a.max_margin, 0.5);
}

// The blocksum order rounds each product differently from llama.cpp (docs/kernels.md), and with
// it the runner takes mixkv's own attention, RoPE and SiLU (numerics_of in runner/llama.cpp), so
// more near-ties go the other way; the figures are printed for the choice of the engine's default.
TEST(SmolLm2LongAgreement, BlockSumOrderAgreesWithLlamaCppExceptOnNearTies) {
  MIXKV_SMOLLM2_OR_SKIP(path);
  const Agreement a = teacher_forced_agreement(path, kernels::ReductionOrder::kBlockSum);
  // Measured 96.79% (1,208 of 1,248; largest llama.cpp margin where they differ 0.253) both with
  // llama.cpp's attention numerics and with mixkv's; the ggml order gives 100%.
  EXPECT_GE(a.rate, 0.96);
  EXPECT_LT(a.max_margin, 0.5);
}

}  // namespace
}  // namespace mixkv::runner
