// The AMX tile path of paged attention (bf16 caches, attention_uses_amx): chosen by the layer's
// shape and the CPU alone, bit-identical for every row of a verify against its own decode, for
// 1 and 2 threads, for a whole context against chunk pieces and for paged against contiguous
// pages, and within the float tolerance of the dense double reference. On a CPU without AMX the
// path is never taken and the checks that need it are skipped.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels_test_support.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/thread_pool.hpp"

namespace mixkv::kernels {
namespace attention_amx_test {  // named: its helpers meet other files' in a unity batch
namespace {

using testing::Layer;
using testing::same_bits;

Layer make_layer(const AttentionSpec& spec, std::int64_t num_pages, std::int64_t page_tokens) {
  return testing::make_layer(spec, num_pages, page_tokens, "amx");
}

// A Llama-style layer: 32 query heads over 8 KV heads of 128 (the benchmarks' shape).
AttentionSpec llama() {
  AttentionSpec s;
  s.params.kv_dtype = DType::kBfloat16;
  s.params.num_q_heads = 32;
  s.params.num_kv_heads = 8;
  s.head_size = 128;
  s.head_size_v = 128;
  s.params.scale = 1.0 / std::sqrt(128.0);
  return s;
}

using testing::attend;

TEST(AttentionAmx, TheLayerShapeAloneChoosesThePath) {
  set_attention_amx(true);
  const AttentionSpec base = llama();
  const bool usable = attention_uses_amx(base, make_layer(base, 1, 16).geometry);
  EXPECT_EQ(attention_uses_amx(base, make_layer(base, 1, 64).geometry), usable);
  AttentionSpec fp8 = base;
  fp8.params.kv_dtype = DType::kFp8E4m3;
  AttentionSpec odd = base;
  odd.head_size = odd.head_size_v = 72;
  AttentionSpec mla = base;
  mla.params.num_kv_heads = 1;
  mla.mla = true;
  mla.head_size_v = 64;
  for (const AttentionSpec& s : {fp8, odd, mla})
    EXPECT_FALSE(attention_uses_amx(s, make_layer(s, 1, 16).geometry));
  EXPECT_FALSE(attention_uses_amx(base, make_layer(base, 1, 40).geometry));  // pages of 40 keys
  set_attention_amx(false);
  EXPECT_FALSE(attention_uses_amx(base, make_layer(base, 1, 16).geometry));
  set_attention_amx(true);
}

struct Variant {
  std::string name;
  int window;  // -1: none
  bool cap, sinks, causal;
  float magnitude;  // of K and V
};

// Each row of verifies of 1..17 rows (one group of tiles and several) equals its own decode, on no
// pool and on two workers; paged and contiguous pages give the same bits; the outputs are
// within the float tolerance of the dense double reference.
TEST(AttentionAmx, VerifyRowsMatchTheirDecodesAndTheReference) {
  set_attention_amx(true);
  if (!attention_uses_amx(llama(), make_layer(llama(), 1, 16).geometry))
    GTEST_SKIP() << "no AMX-BF16 on this CPU";
  const std::vector<Variant> variants = {
      {"plain", -1, false, false, true, 1.0f},
      {"window 700, cap, sinks", 700, true, true, true, 1.0f},
      {"non-causal block, values of 300", -1, false, true, false, 300.0f},
  };
  for (const Variant& v : variants) {
    // Half the benchmark layer's heads (the sanitizer build runs this too); still 4 query heads
    // per KV head, so 5 rows are 20 columns: two groups of tiles. 1040 tokens: two chunks.
    AttentionSpec spec = llama();
    spec.params.num_q_heads = 16;
    spec.params.num_kv_heads = 4;
    spec.params.window_left = v.window;
    if (v.cap) spec.params.soft_cap = 10.0;
    spec.params.sinks = v.sinks;
    spec.params.causal = v.causal;
    testing::check_verify_rows(spec, 1040, v.magnitude, 41, v.name);
  }
}

// The AMX path and the float path agree to the float tolerance (each against the reference, and
// their outputs are not the same bits: the path really changed).
TEST(AttentionAmx, DiffersFromTheFloatPathOnlyInRounding) {
  set_attention_amx(true);
  const AttentionSpec spec = llama();
  Layer l = make_layer(spec, 40, 16);
  if (!attention_uses_amx(spec, l.geometry)) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  std::mt19937_64 rng(43);
  std::vector<std::int64_t> blocks(40);
  std::iota(blocks.begin(), blocks.end(), 0);
  const auto r = testing::make_request(spec, l.geometry, {}, l.cache, blocks, 630, 3, rng);
  const auto amx = attend(l, blocks, 630, 3, r.q, {}, nullptr);
  const testing::Comparison cmp = testing::run_and_compare(spec, l.geometry, {}, l.cache, {r}, {});
  set_attention_amx(false);
  const auto plain = attend(l, blocks, 630, 3, r.q, {}, nullptr);
  set_attention_amx(true);
  EXPECT_TRUE(cmp.ok()) << cmp.to_string();
  EXPECT_FALSE(same_bits(amx, plain));
  double worst = 0;
  for (std::size_t i = 0; i < amx.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(amx[i] - plain[i])));
  EXPECT_LT(worst, 1e-5);
}

}  // namespace
}  // namespace attention_amx_test
}  // namespace mixkv::kernels
