// llama.cpp's attention numerics (kernels/attention_ggml.hpp): close to the dense reference, each
// query's bits fixed by its position alone (verify rows are decode rows, any batch and pool), and
// a clear refusal of what it does not serve. Its bit-exactness against llama.cpp itself is
// checked end to end by the SmolLM2 agreement tests (tests/runner/smollm2_test.cpp).
#include "mixkv/kernels/attention_ggml.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels_test_support.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/dense_reference.hpp"

namespace mixkv::kernels {
namespace {

// SmolLM2's attention: 9 query heads over 3 KV heads of 64, an f16 cache.
AttentionSpec smollm2_spec() {
  AttentionSpec spec;
  spec.params.kv_dtype = DType::kFloat16;
  spec.params.num_q_heads = 9;
  spec.params.num_kv_heads = 3;
  spec.params.scale = 0.125;
  spec.head_size = 64;
  spec.head_size_v = 64;
  return spec;
}

// Pages of 16 tokens, K then V, one manager block per kernel page; unwritten bytes 0xFF (NaN).
struct Cache {
  layout::LayerGeometry layer;
  std::vector<std::byte> bytes;
};
Cache make_cache(const AttentionSpec& spec, std::int64_t pages,
                 attn::KvLayout kv_layout = attn::KvLayout::kNHD) {
  Cache c;
  auto& l = c.layer;
  l.layer = "ggml";
  l.kernel_tokens = 16;
  l.block_tokens = 16;
  l.k_token_bytes = k_row_elements(spec) * 2;
  l.v_token_bytes = v_row_elements(spec) * 2;
  l.v_offset = l.kernel_tokens * l.k_token_bytes;
  l.kernel_page_bytes = l.kernel_tokens * (l.k_token_bytes + l.v_token_bytes);
  l.kernel_page_stride = l.kernel_page_bytes;
  l.kv_layout = kv_layout;
  l.num_kv_heads = spec.params.num_kv_heads;
  c.bytes.assign(static_cast<std::size_t>(pages * l.kernel_page_stride), std::byte{0xFF});
  return c;
}

// One request on blocks first..first+n of `kv_len` tokens with `num_queries` queries.
testing::Request request(const AttentionSpec& spec, Cache& c, std::int64_t first,
                         std::int64_t kv_len, std::int64_t num_queries, std::mt19937_64& rng) {
  std::vector<std::int64_t> blocks;
  for (std::int64_t b = 0; b * 16 < kv_len; ++b) blocks.push_back(first + b);
  return testing::make_request(spec, c.layer, {}, c.bytes, blocks, kv_len, num_queries, rng);
}

std::vector<float> attend(const AttentionSpec& spec, const Cache& c,
                          std::span<const PagedSequence> batch, std::span<const float> q,
                          ThreadPool* pool = nullptr) {
  std::int64_t rows = 0;
  for (const PagedSequence& s : batch) rows += s.num_queries;
  std::vector<float> out(static_cast<std::size_t>(rows * spec.params.num_q_heads * 64));
  ggml_attention(spec, c.layer, {c.bytes, batch, q, {}, {}, pool}, out);
  return out;
}

TEST(GgmlAttention, AgreesWithTheDenseReferenceAtEveryPaddingOfTheKeys) {
  const AttentionSpec spec = smollm2_spec();
  std::mt19937_64 rng(7);
  // Key counts around ggml's padding to 32 and its dot's blocks of 64.
  for (std::int64_t kv_len : {1, 2, 31, 32, 33, 63, 64, 65, 96, 97, 130}) {
    Cache c = make_cache(spec, 10);
    const testing::Request r = request(spec, c, 1, kv_len, 1, rng);
    const std::vector<std::int64_t> pages = layout::kernel_block_table(c.layer, r.blocks);
    const PagedSequence seq{pages, kv_len, 1};
    const std::vector<float> got = attend(spec, c, std::span(&seq, 1), r.q);
    const std::vector<float> k = testing::stored(DType::kFloat16, r.k, 1.0f);
    const std::vector<float> v = testing::stored(DType::kFloat16, r.v, 1.0f);
    const std::vector<double> want = dense_attention(spec, {k, v, r.q, kv_len, 1}, {});
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    // f16 queries and probabilities: a few parts in 10^4 of values of magnitude 1.
    EXPECT_LT(worst, 2e-3) << kv_len << " keys";
  }
}

TEST(GgmlAttention, AQueryGivesTheSameBitsAloneInAVerifyBlockAnyBatchAndPool) {
  const AttentionSpec spec = smollm2_spec();
  std::mt19937_64 rng(11);
  Cache c = make_cache(spec, 16);
  const testing::Request a = request(spec, c, 1, 70, 8, rng);  // queries at positions 62..69
  const testing::Request b = request(spec, c, 8, 30, 3, rng);
  const std::vector<std::int64_t> pa = layout::kernel_block_table(c.layer, a.blocks);
  const std::vector<std::int64_t> pb = layout::kernel_block_table(c.layer, b.blocks);
  const std::size_t qw = 9 * 64;
  std::vector<float> q = a.q;
  q.insert(q.end(), b.q.begin(), b.q.end());
  const std::vector<PagedSequence> batch = {{pa, 70, 8}, {pb, 30, 3}};
  const std::vector<float> together = attend(spec, c, batch, q);
  ThreadPool pool(3);
  EXPECT_EQ(attend(spec, c, batch, q, &pool), together);
  for (std::int64_t i = 0; i < 8; ++i) {  // each verify row as a decode step
    const PagedSequence one{pa, 63 + i, 1};
    const std::vector<float> alone =
        attend(spec, c, std::span(&one, 1), std::span<const float>(a.q).subspan(i * qw, qw));
    EXPECT_EQ(std::memcmp(alone.data(), together.data() + i * qw, qw * sizeof(float)), 0) << i;
  }
}

// HND pages (a KV head's tokens side by side) hold the same tokens: the same bits.
TEST(GgmlAttention, HndPagesGiveTheBitsOfNhdPages) {
  const AttentionSpec spec = smollm2_spec();
  std::mt19937_64 rng(13);
  Cache nhd = make_cache(spec, 12);
  Cache hnd = make_cache(spec, 12, attn::KvLayout::kHND);
  const testing::Request r = request(spec, nhd, 2, 150, 5, rng);
  const std::vector<std::int64_t> pages = layout::kernel_block_table(nhd.layer, r.blocks);
  write_kv(spec, hnd.layer, {}, hnd.bytes, slot_mapping(hnd.layer, r.blocks, 0, 150), r.k, r.v);
  const PagedSequence seq{pages, 150, 5};
  const std::vector<float> want = attend(spec, nhd, std::span(&seq, 1), r.q);
  EXPECT_EQ(attend(spec, hnd, std::span(&seq, 1), r.q), want);
  EXPECT_NE(hnd.bytes, nhd.bytes);  // the layouts differ, not only the names
}

TEST(GgmlAttention, TheBaselineAndTheAvx2CopiesGiveTheSameBits) {
  const AttentionSpec spec = smollm2_spec();
  std::mt19937_64 rng(5);
  Cache c = make_cache(spec, 16);
  const testing::Request a = request(spec, c, 1, 150, 4, rng);
  const std::vector<std::int64_t> pages = layout::kernel_block_table(c.layer, a.blocks);
  const PagedSequence seq{pages, 150, 4};
  std::vector<float> gate = testing::random_values(rng, 1536, 12.0f);
  std::vector<float> up_fast = testing::random_values(rng, 1536, 3.0f);
  std::vector<float> up_base = up_fast;
  const bool fast = set_ggml_avx2(true);
  const std::vector<float> with = attend(spec, c, std::span(&seq, 1), a.q);
  ggml_swiglu(gate, up_fast);
  set_ggml_avx2(false);
  const std::vector<float> without = attend(spec, c, std::span(&seq, 1), a.q);
  ggml_swiglu(gate, up_base);
  set_ggml_avx2(true);
  EXPECT_EQ(with, without) << (fast ? "AVX2" : "baseline only");
  EXPECT_EQ(up_fast, up_base);
}

// The AVX2 SwiGLU's vector exp hands a group of eight to the scalar steps when a lane leaves the
// range of its one-multiply scaling (|gate| past ~86, infinities, NaN): the bits stay the
// baseline's, both for the group and for its in-range neighbours.
TEST(GgmlAttention, TheAvx2SwigluKeepsTheBaselineBitsAtTheExpLimits) {
  std::mt19937_64 rng(9);
  std::vector<float> gate = testing::random_values(rng, 203, 20.0f);
  const float edges[] = {-88.0f,
                         -88.7f,
                         -89.0f,
                         86.6f,
                         87.4f,
                         88.0f,
                         104.0f,
                         -104.0f,
                         200.0f,
                         -200.0f,
                         0.0f,
                         -0.0f,
                         1e-30f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()};
  for (std::size_t e = 0; e < std::size(edges); ++e) gate[e * 12 + e % 8] = edges[e];
  std::vector<float> up_fast = testing::random_values(rng, gate.size(), 3.0f);
  std::vector<float> up_base = up_fast;
  const bool fast = set_ggml_avx2(true);
  ggml_swiglu(gate, up_fast);
  set_ggml_avx2(false);
  ggml_swiglu(gate, up_base);
  set_ggml_avx2(true);
  EXPECT_EQ(std::memcmp(up_fast.data(), up_base.data(), up_fast.size() * sizeof(float)), 0)
      << (fast ? "AVX2" : "baseline only");
}

TEST(GgmlAttention, RefusesACacheOrLayerItDoesNotServe) {
  AttentionSpec spec = smollm2_spec();
  EXPECT_TRUE(ggml_attention_serves(spec));
  spec.params.kv_dtype = DType::kBfloat16;
  EXPECT_FALSE(ggml_attention_serves(spec));
  Cache c = make_cache(smollm2_spec(), 2);
  try {
    attend(spec, c, {}, {});
    FAIL() << "a bf16 cache was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
  }
  spec = smollm2_spec();
  spec.params.window_left = 100;
  EXPECT_FALSE(ggml_attention_serves(spec));
}

TEST(GgmlAttention, RoundsToFp16AsTheConversionsDo) {
  std::vector<float> xs = {0.0f,     -0.0f,    1.0f,          65504.0f,      65519.99f,
                           65520.0f, 1e-8f,    2.9802322e-8f, 5.9604645e-8f, 6.1035156e-5f,
                           6.1e-5f,  -3.0e-5f, 1.0009766f,    1.0004883f,    1.0014648f};
  for (std::uint32_t b = 0; b < 0x47800000u; b += 4999) xs.push_back(std::bit_cast<float>(b));
  for (float x : xs) {
    for (float s : {x, -x}) {
      const float want = fp16_to_float(float_to_fp16(s));
      EXPECT_EQ(std::bit_cast<std::uint32_t>(fp16_round(s)), std::bit_cast<std::uint32_t>(want))
          << s;
    }
  }
  EXPECT_TRUE(std::isinf(fp16_round(1e6f)));
  EXPECT_TRUE(std::isnan(fp16_round(std::numeric_limits<float>::quiet_NaN())));
}

TEST(GgmlExp, FollowsExpWithinTwoUlpsAndItsLimits) {
  for (float x = -87.0f; x < 88.0f; x += 0.01337f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(ggml_expf(x) / want, 1.0, 2.5e-7) << x;
  }
  EXPECT_EQ(ggml_expf(0.0f), 1.0f);
  EXPECT_EQ(ggml_expf(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(ggml_expf(-300.0f), 0.0f);
  EXPECT_EQ(ggml_expf(300.0f), std::numeric_limits<float>::infinity());
  EXPECT_GT(ggml_expf(-100.0f), 0.0f);  // a subnormal, as _mm512_scalef_ps gives
  EXPECT_EQ(ggml_silu(0.0f), 0.0f);
  std::vector<float> gate, up;
  for (float x = -30.0f; x < 30.0f; x += 0.37f) {
    gate.push_back(x);
    up.push_back(0.5f - x / 7.0f);
  }
  std::vector<float> got = up;
  ggml_swiglu(gate, got);  // the row form, whichever instruction set it runs on
  for (std::size_t i = 0; i < up.size(); ++i) {
    const float want = up[i] * ggml_silu(gate[i]);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want)) << gate[i];
  }
  EXPECT_THROW(ggml_swiglu(gate, std::span(got).subspan(1)), Error);
  EXPECT_NEAR(ggml_silu(2.0f), 2.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

}  // namespace
}  // namespace mixkv::kernels
