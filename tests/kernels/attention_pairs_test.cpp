// AttentionOrder::kBf16Pairs (bf16 caches): q and the softmax weights rounded to bf16, every
// product exact, summed in pairs as VDPBF16PS sums them. Every row of a verify bit-identical to its
// own decode, for 1 and 2 threads, for paged against contiguous pages; VDPBF16PS and the ordinary
// instructions giving the same bits where the CPU has both; within the order's tolerance of the
// dense double reference; and a clear error where the layer cannot take the order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels_test_support.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/simd_targets.hpp"
#include "mixkv/kernels/thread_pool.hpp"

namespace mixkv::kernels {
namespace attention_pairs_test {  // named: its helpers meet other files' in a unity batch
namespace {

using testing::Layer;
using testing::same_bits;

AttentionSpec pairs_spec(int q_heads, int kv_heads, int head_size, DType cache = DType::kBfloat16) {
  AttentionSpec s;
  s.params.kv_dtype = cache;
  s.params.num_q_heads = q_heads;
  s.params.num_kv_heads = kv_heads;
  s.head_size = head_size;
  s.head_size_v = head_size;
  s.params.scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  s.order = AttentionOrder::kBf16Pairs;
  return s;
}

using testing::attend;

// Whether to run with VDPBF16PS (where the CPU has it) and without.
std::vector<bool> dots_settings() {
  set_attention_bf16_dots(true);
  if (attention_uses_bf16_dots()) return {true, false};
  return {false};
}

struct Variant {
  std::string name;
  AttentionSpec spec;
  int window;  // -1: none
  bool cap, sinks, causal;
  float magnitude;  // of K and V
  std::int64_t kv_len;
};

// On every instruction set: each row of a 17-row verify equals its own decode, the last 1, 5 and 16
// rows as a verify equal the same rows of the whole, on no pool and on two workers; paged and
// contiguous pages give the same bits; a 5-row verify is within the order's tolerance of the dense
// double reference. Shapes: 4 query heads of 128 per KV head (Llama), 3 of 64 (SmolLM2), MHA of 96
// (an odd count of 32 elements); odd context lengths and a window that starts mid-pair.
TEST(AttentionPairs, VerifyRowsMatchTheirDecodesAndTheReference) {
  const std::vector<Variant> variants = {
      {"GQA 4 x 128, plain", pairs_spec(8, 2, 128), -1, false, false, true, 1.0f, 1040},
      {"GQA 3 x 64, window 701, cap, sinks", pairs_spec(9, 3, 64), 701, true, true, true, 1.0f,
       1043},
      {"MHA of 96, non-causal, values of 300", pairs_spec(2, 2, 96), -1, false, true, false, 300.0f,
       333},
      {"fp8 e4m3, GQA 4 x 128", pairs_spec(8, 2, 128, DType::kFp8E4m3), -1, false, false, true,
       1.0f, 1040},
      {"fp8 e4m3, GQA 3 x 64, window 701, cap, sinks, values of 300",
       pairs_spec(9, 3, 64, DType::kFp8E4m3), 701, true, true, true, 300.0f, 1043},
  };
  int targets = 0;
  for_each_simd_target([&](const std::string& target) {
    ++targets;
    for (const bool dots : dots_settings()) {
      set_attention_bf16_dots(dots);
      for (const Variant& v : variants) {
        AttentionSpec spec = v.spec;
        spec.params.window_left = v.window;
        if (v.cap) spec.params.soft_cap = 10.0;
        spec.params.sinks = v.sinks;
        spec.params.causal = v.causal;
        testing::check_verify_rows(
            spec, v.kv_len, v.magnitude, 51,
            target + ", " + v.name + (dots ? ", VDPBF16PS" : ", ordinary instructions"));
      }
    }
  });
  set_attention_bf16_dots(true);
  EXPECT_GE(targets, 1);
}

// VDPBF16PS and the ordinary instructions give the same bits (where the CPU has the former); the
// order differs from the float order only in rounding (within the order's tolerance of each
// other, not the same bits: the order really changed).
TEST(AttentionPairs, DotsGiveTheOrdinaryInstructionsBitsAndDifferFromFloatOnlyInRounding) {
  AttentionSpec spec = pairs_spec(16, 4, 128);
  Layer l = testing::make_layer(spec, 40, 16, "pairs");
  std::mt19937_64 rng(53);
  std::vector<std::int64_t> blocks(40);
  std::iota(blocks.begin(), blocks.end(), 0);
  const auto r = testing::make_request(spec, l.geometry, {}, l.cache, blocks, 631, 5, rng);
  std::vector<std::vector<float>> outs;
  for (const bool dots : dots_settings()) {
    set_attention_bf16_dots(dots);
    outs.push_back(attend(l, blocks, 631, 5, r.q, {}, nullptr));
  }
  set_attention_bf16_dots(true);
  if (outs.size() == 2) {
    EXPECT_TRUE(same_bits(outs[0], outs[1]));
  }
  Layer f = l;
  f.spec.order = AttentionOrder::kFloat;
  set_attention_amx(false);
  const auto plain = attend(f, blocks, 631, 5, r.q, {}, nullptr);
  set_attention_amx(true);
  EXPECT_FALSE(same_bits(outs[0], plain));
  double worst = 0;
  for (std::size_t i = 0; i < plain.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(outs[0][i] - plain[i])));
  EXPECT_LT(worst, 1e-2);
}

// Every e4m3 code is a bf16 value exactly, so an e4m3 cache gives the bits of a bf16 cache holding
// its values, on every instruction set and both paths: the widening maps each code to its value
// (subnormal codes too, which the task's DAZ would flush in a floating-point widening), and the
// cache's unit (values / 256) moves no bit.
TEST(AttentionPairs, AnE4m3CacheGivesTheBitsOfABf16CacheOfItsValues) {
  const AttentionSpec e4m3 = pairs_spec(16, 4, 128, DType::kFp8E4m3);
  const AttentionSpec bf16 = pairs_spec(16, 4, 128);
  std::vector<std::int64_t> blocks(40);
  std::iota(blocks.begin(), blocks.end(), 0);
  int targets = 0;
  for_each_simd_target([&](const std::string& target) {
    ++targets;
    Layer l8 = testing::make_layer(e4m3, 40, 16, "e4m3");
    Layer l16 = testing::make_layer(bf16, 40, 16, "bf16");
    std::mt19937_64 rng(59);
    const auto r = testing::make_request(e4m3, l8.geometry, {}, l8.cache, blocks, 631, 5, rng);
    const std::vector<float> k = testing::stored(DType::kFp8E4m3, r.k, 1.0f);
    const std::vector<float> v = testing::stored(DType::kFp8E4m3, r.v, 1.0f);
    const auto subnormal = [](float x) { return x != 0 && std::fabs(x) < 0x1p-6f; };
    ASSERT_GT(std::count_if(k.begin(), k.end(), subnormal), 0) << "no subnormal e4m3 code in K";
    write_kv(bf16, l16.geometry, {}, l16.cache, slot_mapping(l16.geometry, blocks, 0, 631), k, v);
    for (const bool dots : dots_settings()) {
      set_attention_bf16_dots(dots);
      const auto a = attend(l8, blocks, 631, 5, r.q, {}, nullptr);
      const auto b = attend(l16, blocks, 631, 5, r.q, {}, nullptr);
      EXPECT_TRUE(same_bits(a, b)) << target << (dots ? ", VDPBF16PS" : ", ordinary instructions");
    }
    set_attention_bf16_dots(true);
  });
  EXPECT_GE(targets, 1);
}

// A layer the order cannot serve is refused by name, with what would fix it.
TEST(AttentionPairs, NeedsABfloat16OrE4m3CacheNoMlaAndHeadsOf32) {
  AttentionSpec f16 = pairs_spec(8, 2, 128, DType::kFloat16);
  AttentionSpec e5m2 = pairs_spec(8, 2, 128, DType::kFp8E5m2);
  AttentionSpec odd = pairs_spec(8, 2, 72);
  AttentionSpec mla = pairs_spec(8, 1, 128);
  mla.mla = true;
  mla.head_size_v = 64;
  AttentionSpec wide = pairs_spec(8, 2, 544);  // a multiple of 32 beyond 512
  for (const AttentionSpec& s : {f16, e5m2, odd, mla, wide}) {
    try {
      validate(s, "layer 7");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find("layer 7: the bf16-pairs attention order needs"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("use the float order"), std::string::npos);
    }
  }
  EXPECT_EQ(parse_attention_order("bf16-pairs", "--attention-order"), AttentionOrder::kBf16Pairs);
  EXPECT_EQ(parse_attention_order("float", "--attention-order"), AttentionOrder::kFloat);
  EXPECT_THROW(parse_attention_order("bf16", "--attention-order"), Error);
  EXPECT_EQ(to_string(AttentionOrder::kBf16Pairs), "bf16-pairs");
}

}  // namespace
}  // namespace attention_pairs_test
}  // namespace mixkv::kernels
