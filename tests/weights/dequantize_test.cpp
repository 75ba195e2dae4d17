// Dequantisation of each ggml block format on blocks built by hand, against values worked out by
// hand from the block definitions (ggml-common.h): scale and offset are fp16 bit patterns whose
// values are exact (0x3800 = 0.5, 0x3400 = 0.25, 0xBC00 = -1, 0x3C00 = 1, 0x4000 = 2).
#include "mixkv/weights/dequantize.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_support.hpp"
#include "weights/gguf_builder.hpp"

namespace mixkv::weights {
namespace {

using testing::expect_error;
using testing::put_u16;
using testing::put_u8;

std::vector<float> decode(GgmlType type, const std::vector<std::byte>& block, std::size_t n) {
  std::vector<float> out(n);
  dequantize(type, block, out);
  return out;
}

// qs[j] with low nibble j and high nibble 15 - j: values 0..15 in the first half, 15..0 in the
// second.
void put_ramp_nibbles(std::vector<std::byte>& b) {
  for (int j = 0; j < 16; ++j) put_u8(b, std::uint8_t(j | ((15 - j) << 4)));
}

TEST(Dequantize, Q4_0) {
  std::vector<std::byte> b;
  put_u16(b, 0x3800);  // d = 0.5
  put_ramp_nibbles(b);
  ASSERT_EQ(b.size(), 18u);
  const std::vector<float> want = {-4,  -3.5, -3,   -2.5, -2,   -1.5, -1,   -0.5, 0,    0.5, 1,
                                   1.5, 2,    2.5,  3,    3.5,  3.5,  3,    2.5,  2,    1.5, 1,
                                   0.5, 0,    -0.5, -1,   -1.5, -2,   -2.5, -3,   -3.5, -4};
  EXPECT_EQ(decode(GgmlType::kQ4_0, b, 32), want);
}

TEST(Dequantize, Q4_1) {
  std::vector<std::byte> b;
  put_u16(b, 0x3400);  // d = 0.25
  put_u16(b, 0xBC00);  // m = -1
  put_ramp_nibbles(b);
  ASSERT_EQ(b.size(), 20u);
  const std::vector<float> want = {-1,   -0.75, -0.5, -0.25, 0,     0.25, 0.5,   0.75,
                                   1,    1.25,  1.5,  1.75,  2,     2.25, 2.5,   2.75,
                                   2.75, 2.5,   2.25, 2,     1.75,  1.5,  1.25,  1,
                                   0.75, 0.5,   0.25, 0,     -0.25, -0.5, -0.75, -1};
  EXPECT_EQ(decode(GgmlType::kQ4_1, b, 32), want);
}

TEST(Dequantize, Q8_0) {
  std::vector<std::byte> b;
  put_u16(b, 0x4000);  // d = 2
  put_u8(b, 0x80);     // -128
  for (int j = 1; j < 31; ++j) put_u8(b, std::uint8_t(std::int8_t(j - 16)));
  put_u8(b, 127);
  ASSERT_EQ(b.size(), 34u);
  const std::vector<float> want = {-256, -30, -28, -26, -24, -22, -20, -18, -16, -14, -12,
                                   -10,  -8,  -6,  -4,  -2,  0,   2,   4,   6,   8,   10,
                                   12,   14,  16,  18,  20,  22,  24,  26,  28,  254};
  EXPECT_EQ(decode(GgmlType::kQ8_0, b, 32), want);
}

TEST(Dequantize, Q8_1IgnoresItsSum) {
  std::vector<std::byte> b;
  put_u16(b, 0x3800);  // d = 0.5
  put_u16(b, 0x1234);  // s: the block sum, not part of the values
  for (int j = 0; j < 32; ++j) put_u8(b, std::uint8_t(std::int8_t(j - 16)));
  const std::vector<float> y = decode(GgmlType::kQ8_1, b, 32);
  EXPECT_EQ(y[0], -8.0f);
  EXPECT_EQ(y[1], -7.5f);
  EXPECT_EQ(y[16], 0.0f);
  EXPECT_EQ(y[31], 7.5f);
}

// qs = 0x3A everywhere (low nibble 10, high nibble 3) and qh = 0x80000001: the fifth bit is set for
// value 0 (bit 0) and value 31 (bit 31) only.
std::vector<std::byte> q5_block(bool with_min) {
  std::vector<std::byte> b;
  put_u16(b, 0x3800);                // d = 0.5
  if (with_min) put_u16(b, 0x3C00);  // m = 1
  for (std::uint8_t x : {0x01, 0x00, 0x00, 0x80}) put_u8(b, x);
  for (int j = 0; j < 16; ++j) put_u8(b, 0x3A);
  return b;
}

TEST(Dequantize, Q5_0) {
  const std::vector<std::byte> b = q5_block(false);
  ASSERT_EQ(b.size(), 22u);
  const std::vector<float> y = decode(GgmlType::kQ5_0, b, 32);
  EXPECT_EQ(y[0], 5.0f);                                      // (10 | 16) - 16 = 10, times 0.5
  for (int j = 1; j < 16; ++j) EXPECT_EQ(y[j], -3.0f) << j;   // 10 - 16
  for (int j = 16; j < 31; ++j) EXPECT_EQ(y[j], -6.5f) << j;  // 3 - 16
  EXPECT_EQ(y[31], 1.5f);                                     // (3 | 16) - 16
}

TEST(Dequantize, Q5_1) {
  const std::vector<std::byte> b = q5_block(true);
  ASSERT_EQ(b.size(), 24u);
  const std::vector<float> y = decode(GgmlType::kQ5_1, b, 32);
  EXPECT_EQ(y[0], 14.0f);                                    // 26 * 0.5 + 1
  for (int j = 1; j < 16; ++j) EXPECT_EQ(y[j], 6.0f) << j;   // 10 * 0.5 + 1
  for (int j = 16; j < 31; ++j) EXPECT_EQ(y[j], 2.5f) << j;  // 3 * 0.5 + 1
  EXPECT_EQ(y[31], 10.5f);                                   // 19 * 0.5 + 1
}

TEST(Dequantize, FloatTypes) {
  std::vector<std::byte> h;
  for (std::uint16_t bits : {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0x3555}) put_u16(h, bits);
  const std::vector<float> f16 = decode(GgmlType::kF16, h, 6);
  EXPECT_EQ(f16[0], 1.0f);
  EXPECT_EQ(f16[1], -2.0f);
  EXPECT_EQ(f16[2], 65504.0f);
  EXPECT_EQ(f16[3], std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(f16[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16[5], 0.333251953125f);

  std::vector<std::byte> bf;
  for (std::uint16_t bits : {0x3F80, 0xC040, 0x4049}) put_u16(bf, bits);
  EXPECT_EQ(decode(GgmlType::kBF16, bf, 3), (std::vector<float>{1.0f, -3.0f, 3.140625f}));

  const float v[2] = {1.25f, -7.0f};
  std::vector<std::byte> f(8);
  std::memcpy(f.data(), v, 8);
  EXPECT_EQ(decode(GgmlType::kF32, f, 2), (std::vector<float>{1.25f, -7.0f}));
}

TEST(Dequantize, ATensorOfSeveralBlocksAndRows) {
  testing::GgufBuilder g;
  std::vector<std::byte> data;
  for (std::uint16_t d : {0x3C00, 0x4000}) {  // row 0 scaled by 1, row 1 by 2
    put_u16(data, d);
    for (int j = 0; j < 32; ++j) put_u8(data, std::uint8_t(j));
  }
  g.tensor("w", {32, 2}, 8, data);
  const std::vector<std::byte> file = g.build();
  const GgufFile f = GgufFile::parse(file, "test.gguf");
  const std::vector<float> y = dequantize(f.tensor("w"));
  ASSERT_EQ(y.size(), 64u);
  EXPECT_EQ(y[5], 5.0f);
  EXPECT_EQ(y[32 + 5], 10.0f);
  EXPECT_EQ(y[63], 62.0f);
}

TEST(Dequantize, RefusesWrongSizesAndTypesItCannotDecode) {
  std::vector<float> out(32);
  expect_error([&] { dequantize(GgmlType::kQ4_0, std::vector<std::byte>(17), out); },
               ErrorCode::kInvalidInput, {"Q4_0", "18 bytes", "17"});
  std::vector<float> odd(31);
  expect_error([&] { dequantize(GgmlType::kQ8_0, std::vector<std::byte>(34), odd); },
               ErrorCode::kInvalidInput, {"31", "Q8_0"});
  expect_error([&] { dequantize(GgmlType::kQ6_K, std::vector<std::byte>(210), out); },
               ErrorCode::kUnsupported, {"Q6_K"});
  EXPECT_TRUE(can_dequantize(GgmlType::kQ4_1));
  EXPECT_FALSE(can_dequantize(GgmlType::kQ4_K));
}

TEST(GgmlTypes, BlockSizesFollowTheBlockStructs) {
  EXPECT_EQ(ggml_type_info(GgmlType::kQ4_0).block_bytes, 18);
  EXPECT_EQ(ggml_type_info(GgmlType::kQ4_1).block_bytes, 20);
  EXPECT_EQ(ggml_type_info(GgmlType::kQ8_0).block_bytes, 34);
  EXPECT_EQ(ggml_type_info(GgmlType::kQ6_K).block_bytes, 210);
  EXPECT_EQ(ggml_type_info(GgmlType::kQ4_K).block_bytes, 144);
  EXPECT_EQ(ggml_type_info(GgmlType::kBF16).block_bytes, 2);
  EXPECT_EQ(find_ggml_type(4), nullptr);  // Q4_2, retired
  EXPECT_EQ(to_string(GgmlType::kQ4_1), "Q4_1");
  EXPECT_EQ(ggml_bytes(GgmlType::kQ4_1, 576), 18 * 20);
}

}  // namespace
}  // namespace mixkv::weights
