// Element conversion: known bit patterns, every code round-trips, rounding is to the nearest
// representable value with ties to even, fp8 saturates, nvfp4 is refused.
#include "mixkv/kernels/convert.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mixkv/kernels/simd_targets.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(Convert, Bf16KnownBitPatterns) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16(3.0e38f), 0x7F62);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);                 // tie, up to even
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the max
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(kNan))));
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_float(0x0001), 0x1p-133f);  // smallest subnormal
}

TEST(Convert, Fp16KnownBitPatterns) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);  // below the halfway point to 65536
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // halfway: ties to even overflow to inf
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);  // halfway to it: ties to even (zero)
  EXPECT_EQ(float_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_fp16(-kInf), 0xFC00);
  EXPECT_EQ(float_to_fp16(0.1f), 0x2E66);
  EXPECT_EQ(fp16_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x03FF), 0x3FFp-24f);
  EXPECT_EQ(fp16_to_float(0x7C00), kInf);
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(kNan))));
}

TEST(Convert, Fp8E4m3KnownBitPatterns) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_fp8_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(0x1p-9f), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_fp8_e4m3(0x1p-6f), 0x08);  // smallest normal
  EXPECT_EQ(float_to_fp8_e4m3(0.3f), 0x2A);     // 0.3125 is nearest
  // Saturating: beyond 448 (infinities too) clamps to the largest finite value.
  EXPECT_EQ(float_to_fp8_e4m3(1000.0f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(-kInf), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(kNan) & 0x7F, 0x7F);
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_to_float(0x78), 256.0f);  // exponent 15 is an ordinary binade in e4m3fn
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xFF)));
}

TEST(Convert, Fp8E5m2KnownBitPatterns) {
  EXPECT_EQ(float_to_fp8_e5m2(1.0f), 0x3C);
  EXPECT_EQ(float_to_fp8_e5m2(-1.5f), 0xBE);
  EXPECT_EQ(float_to_fp8_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(float_to_fp8_e5m2(1.0e6f), 0x7B);  // saturates
  EXPECT_EQ(float_to_fp8_e5m2(kInf), 0x7B);
  EXPECT_EQ(float_to_fp8_e5m2(0x1p-16f), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_fp8_e5m2(1.125f), 0x3C);    // tie between 1 and 1.25: even
  EXPECT_EQ(float_to_fp8_e5m2(1.375f), 0x3E);    // tie between 1.25 and 1.5: even
  EXPECT_EQ(fp8_e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(fp8_e5m2_to_float(0xFC), -kInf);
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7E)));
  EXPECT_EQ(fp8_e5m2_to_float(0x01), 0x1p-16f);
}

// Every finite code decodes to a value that encodes back to the same code.
TEST(Convert, EveryFiniteCodeRoundTrips) {
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const auto b = static_cast<std::uint16_t>(c);
    const float x = bf16_to_float(b);
    if (std::isfinite(x)) {
      EXPECT_EQ(float_to_bf16(x), b) << c;
    }
    const float h = fp16_to_float(b);
    if (std::isfinite(h)) {
      EXPECT_EQ(float_to_fp16(h), b) << c;
    }
  }
  for (std::uint32_t c = 0; c < 0x100; ++c) {
    const auto b = static_cast<std::uint8_t>(c);
    if (std::isfinite(fp8_e4m3_to_float(b))) {
      EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(b)), b) << c;
    }
    if (std::isfinite(fp8_e5m2_to_float(b))) {
      EXPECT_EQ(float_to_fp8_e5m2(fp8_e5m2_to_float(b)), b) << c;
    }
  }
}

// Encoding picks the nearest code (ties to an even code) for random floats, checked against a
// brute-force search over every code of the format.
template <typename Code>
void expect_nearest(float x, Code code, float (*decode)(Code), std::uint32_t codes,
                    float max_finite, bool saturating) {
  double best = INFINITY;
  for (std::uint32_t c = 0; c < codes; ++c) {
    const float y = decode(static_cast<Code>(c));
    if (std::isfinite(y)) best = std::min(best, std::fabs(static_cast<double>(y) - x));
  }
  const float got = decode(code);
  if (std::fabs(x) > max_finite && !std::isfinite(got)) {
    EXPECT_FALSE(saturating) << x;
    return;
  }
  EXPECT_EQ(std::fabs(static_cast<double>(got) - x), best) << x;
  if (std::fabs(static_cast<double>(got) - x) == best && best > 0) {
    // On a tie, the even code.
    const float other = static_cast<float>(2.0 * x - got);
    bool tie = false;
    for (std::uint32_t c = 0; c < codes && !tie; ++c)
      tie = decode(static_cast<Code>(c)) == other && other != got;
    if (tie) {
      EXPECT_EQ(code & 1, 0) << x;
    }
  }
}

TEST(Convert, RandomFloatsRoundToTheNearestCode) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int i = 0; i < 300; ++i) {
    const int e = std::uniform_int_distribution<int>(-20, 17)(rng);
    const float x = std::ldexp(mant(rng), e) * (i % 2 ? -1.0f : 1.0f);
    expect_nearest<std::uint8_t>(x, float_to_fp8_e4m3(x), fp8_e4m3_to_float, 256, 448.0f, true);
    expect_nearest<std::uint8_t>(x, float_to_fp8_e5m2(x), fp8_e5m2_to_float, 256, 57344.0f, true);
  }
  for (int i = 0; i < 40; ++i) {
    const int e = std::uniform_int_distribution<int>(-26, 16)(rng);
    const float x = std::ldexp(mant(rng), e);
    expect_nearest<std::uint16_t>(x, float_to_fp16(x), fp16_to_float, 0x10000, 65504.0f, false);
    expect_nearest<std::uint16_t>(x, float_to_bf16(x), bf16_to_float, 0x10000, 3.4e38f, false);
  }
}

// Every fp16 value class for the scalar encode and the row encoder on each instruction set: each
// code's value, the midpoint to the next code (a tie: the even one of the two), and the floats
// just below and above the midpoint, both signs; then NaNs (any payload: the canonical quiet
// code), infinities, float subnormals (to zero) and the largest floats (to infinity).
struct Fp16Case {
  float x;
  std::uint16_t code;
};

std::vector<Fp16Case> fp16_cases() {
  std::vector<Fp16Case> cases;
  for (std::uint32_t c = 0; c < 0x7C00; ++c) {
    const auto code = static_cast<std::uint16_t>(c);
    const auto next = static_cast<std::uint16_t>(c + 1);
    const float v = fp16_to_float(code);
    // The midpoint has 12 significant bits: exact in float (65520 above the largest code).
    const float mid = c == 0x7BFF ? 65520.0f : (v + fp16_to_float(next)) / 2;
    const auto even = static_cast<std::uint16_t>((c & 1u) != 0 ? next : code);
    for (const std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      const float s = sign != 0 ? -1.0f : 1.0f;
      const auto with = [&](std::uint16_t k) { return static_cast<std::uint16_t>(k | sign); };
      cases.push_back({s * v, with(code)});
      cases.push_back({s * mid, with(even)});
      cases.push_back({s * std::nextafter(mid, 0.0f), with(code)});
      cases.push_back({s * std::nextafter(mid, kInf), with(next)});
    }
  }
  for (const std::uint32_t bits : {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FFFFFFFu}) {
    cases.push_back({std::bit_cast<float>(bits), 0x7E00});
    cases.push_back({std::bit_cast<float>(bits | 0x80000000u), 0xFE00});
  }
  cases.push_back({kInf, 0x7C00});
  cases.push_back({-kInf, 0xFC00});
  cases.push_back({std::numeric_limits<float>::max(), 0x7C00});
  cases.push_back({-std::numeric_limits<float>::max(), 0xFC00});
  cases.push_back({std::numeric_limits<float>::denorm_min(), 0x0000});
  cases.push_back({-std::bit_cast<float>(0x007FFFFFu), 0x8000});
  return cases;
}

// encode_row's bytes for `xs` (at an even and an odd offset: the vector and the element loop).
std::vector<std::uint16_t> encoded_codes(DType dtype, const std::vector<float>& xs,
                                         std::size_t offset) {
  std::vector<std::byte> bytes(2 * xs.size() + offset);
  encode_row(dtype, xs, 1.0f, std::span<std::byte>(bytes).subspan(offset));
  std::vector<std::uint16_t> codes(xs.size());
  std::memcpy(codes.data(), bytes.data() + offset, 2 * xs.size());
  return codes;
}

// A failure at the first index where `got` differs from `want`, with its input.
void expect_same_codes(const std::vector<float>& xs, const std::vector<std::uint16_t>& got,
                       const std::vector<std::uint16_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      ADD_FAILURE() << what << ": " << std::hexfloat << xs[i] << " (bits 0x" << std::hex
                    << std::bit_cast<std::uint32_t>(xs[i]) << ") gave 0x" << got[i] << ", want 0x"
                    << want[i];
      return;
    }
  }
}

// The scalar encode, then encode_row on every instruction set and at an odd offset, give `want`.
void expect_encodes(DType dtype, std::uint16_t (*scalar)(float), const std::vector<float>& xs,
                    const std::vector<std::uint16_t>& want) {
  std::vector<std::uint16_t> codes(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) codes[i] = scalar(xs[i]);
  expect_same_codes(xs, codes, want, "scalar encode");
  for_each_simd_target([&](const std::string& target) {
    expect_same_codes(xs, encoded_codes(dtype, xs, 0), want, "encode_row " + target);
  });
  expect_same_codes(xs, encoded_codes(dtype, xs, 1), want, "encode_row, odd offset");
}

TEST(Convert, Fp16EncodeEveryValueClassOnEveryTarget) {
  const std::vector<Fp16Case> cases = fp16_cases();
  std::vector<float> xs;
  std::vector<std::uint16_t> want;
  for (const Fp16Case& c : cases) {
    xs.push_back(c.x);
    want.push_back(c.code);
  }
  expect_encodes(DType::kFloat16, float_to_fp16, xs, want);
}

// bf16 likewise: each code, the midpoint to the next and its neighbours, NaNs of every code.
TEST(Convert, Bf16EncodeMatchesTheScalarOnEveryTarget) {
  std::vector<float> xs;
  std::vector<std::uint16_t> want;
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    for (const std::uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u}) {
      xs.push_back(std::bit_cast<float>((c << 16) | low));
      const bool finite = (c & 0x7FFFu) < 0x7F80u;
      const std::uint32_t up = low > 0x8000u || (low == 0x8000u && (c & 1u) != 0) ? 1u : 0u;
      want.push_back(static_cast<std::uint16_t>(finite ? c + up : float_to_bf16(xs.back())));
    }
  }
  expect_encodes(DType::kBfloat16, float_to_bf16, xs, want);
}

TEST(Convert, Fp8RowsApplyThePerTensorScale) {
  const std::vector<float> values = {1.0f, -3.0f, 900.0f};
  std::vector<std::byte> bytes(3);
  encode_row(DType::kFp8E4m3, values, 2.0f, bytes);
  EXPECT_EQ(static_cast<std::uint8_t>(bytes[0]), 0x30);  // 0.5
  EXPECT_EQ(static_cast<std::uint8_t>(bytes[1]), 0xBC);  // -1.5
  EXPECT_EQ(static_cast<std::uint8_t>(bytes[2]), 0x7E);  // 450 saturates to 448
  std::vector<float> back(3);
  decode_row(DType::kFp8E4m3, bytes, 2.0f, back);
  EXPECT_EQ(back, (std::vector<float>{1.0f, -3.0f, 896.0f}));
}

TEST(Convert, RowsAreLittleEndian) {
  const std::vector<float> values = {1.0f};
  std::vector<std::byte> bytes(2);
  encode_row(DType::kBfloat16, values, 1.0f, bytes);
  EXPECT_EQ(bytes[0], std::byte{0x80});
  EXPECT_EQ(bytes[1], std::byte{0x3F});
  std::vector<std::byte> f32(4);
  encode_row(DType::kFloat32, values, 1.0f, f32);
  std::vector<float> back(1);
  decode_row(DType::kFloat32, f32, 1.0f, back);
  EXPECT_EQ(back[0], 1.0f);
}

TEST(Convert, RefusesNvfp4WithAClearError) {
  std::vector<float> values(16);
  std::vector<std::byte> bytes(16);
  mixkv::testing::expect_error([&] { encode_row(DType::kNvfp4, values, 1.0f, bytes); },
                               ErrorCode::kUnsupported, {"nvfp4", "bfloat16"});
  mixkv::testing::expect_error([&] { element_bytes(DType::kNvfp4); }, ErrorCode::kUnsupported,
                               {"nvfp4"});
}

TEST(Convert, RoundingBoundsAreHalfAnUlp) {
  EXPECT_EQ(rounding_bound(DType::kBfloat16).relative, 0x1p-8);
  EXPECT_EQ(rounding_bound(DType::kFloat16).relative, 0x1p-11);
  EXPECT_EQ(rounding_bound(DType::kFp8E4m3).relative, 0x1p-4);
  EXPECT_EQ(rounding_bound(DType::kFp8E4m3).absolute, 0x1p-10);
  EXPECT_EQ(rounding_bound(DType::kFp8E5m2).relative, 0x1p-3);
  EXPECT_EQ(rounding_bound(DType::kFloat32).relative, 0.0);
}

}  // namespace
}  // namespace mixkv::kernels
