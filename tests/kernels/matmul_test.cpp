// Weight-streaming matrix products: every storage type decoded as its format defines (checked
// against a scalar double-precision decoder written here from the format, over random codes and
// scales), products within float rounding of a double reference (for the block formats: of the
// product over x quantised as ggml quantises it, q8_1 / q8_0, with a quantiser written here from
// ggml's definition), and the same bits whatever the number of rows, the thread count or the
// instruction set's register tiling (the block formats, and bfloat16 in the blocksum order: the
// same bits on every instruction set).
#include "mixkv/kernels/matmul.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mixkv/kernels/convert.hpp"
#include "mixkv/kernels/simd_targets.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace {

constexpr WeightType kTypes[] = {WeightType::kFloat32, WeightType::kBfloat16, WeightType::kFloat16,
                                 WeightType::kQ8_0,    WeightType::kQ4_0,     WeightType::kQ4_1};

std::uint16_t u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// An fp16 scale of either sign, 2^-12 .. 2^-2 in magnitude (as real quantised weights hold).
std::uint16_t random_scale(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mag(-12.0f, -2.0f);
  const float s = std::exp2(mag(rng)) * (rng() % 2 ? 1.0f : -1.0f);
  return float_to_fp16(s);
}

void put16(std::vector<std::byte>& out, std::uint16_t v) {
  out.push_back(static_cast<std::byte>(v & 0xFF));
  out.push_back(static_cast<std::byte>(v >> 8));
}

// A random [rows, cols] weight: float types from random values, block types from random codes.
std::vector<std::byte> random_weight(WeightType type, std::int64_t rows, std::int64_t cols,
                                     std::mt19937_64& rng) {
  std::vector<std::byte> out;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::int64_t e = 0; e < rows * cols;) {
    switch (type) {
      case WeightType::kFloat32: {
        const auto bits = std::bit_cast<std::uint32_t>(dist(rng));
        for (int b = 0; b < 4; ++b) out.push_back(static_cast<std::byte>(bits >> (8 * b)));
        ++e;
        break;
      }
      case WeightType::kBfloat16:
        put16(out, float_to_bf16(dist(rng)));
        ++e;
        break;
      case WeightType::kFloat16:
        put16(out, float_to_fp16(dist(rng)));
        ++e;
        break;
      case WeightType::kQ8_0:
        put16(out, random_scale(rng));
        for (int i = 0; i < 32; ++i) out.push_back(static_cast<std::byte>(rng()));
        e += 32;
        break;
      case WeightType::kQ4_0:
      case WeightType::kQ4_1:
        put16(out, random_scale(rng));
        if (type == WeightType::kQ4_1) put16(out, random_scale(rng));
        for (int i = 0; i < 16; ++i) out.push_back(static_cast<std::byte>(rng()));
        e += 32;
        break;
    }
  }
  return out;
}

// Element c of row r, in double, straight from the format's definition.
double reference_element(WeightType type, const std::vector<std::byte>& w, std::int64_t cols,
                         std::int64_t r, std::int64_t c) {
  const std::int64_t row_bytes = weight_bytes(type, 1, cols);
  const std::byte* row = w.data() + r * row_bytes;
  switch (type) {
    case WeightType::kFloat32: {
      float v;
      std::memcpy(&v, row + 4 * c, 4);
      return v;
    }
    case WeightType::kBfloat16:
      return bf16_to_float(u16(row + 2 * c));
    case WeightType::kFloat16:
      return fp16_to_float(u16(row + 2 * c));
    case WeightType::kQ8_0: {
      const std::byte* block = row + c / 32 * 34;
      const auto q = static_cast<std::int8_t>(block[2 + c % 32]);
      return double{fp16_to_float(u16(block))} * q;
    }
    case WeightType::kQ4_0:
    case WeightType::kQ4_1: {
      const bool q41 = type == WeightType::kQ4_1;
      const std::byte* block = row + c / 32 * (q41 ? 20 : 18);
      const auto byte = static_cast<std::uint8_t>(block[(q41 ? 4 : 2) + c % 16]);
      const int q = c % 32 < 16 ? byte & 15 : byte >> 4;
      const double d = fp16_to_float(u16(block));
      return q41 ? q * d + fp16_to_float(u16(block + 2)) : (q - 8) * d;
    }
  }
  return 0;
}

std::vector<float> random_x(std::int64_t n, std::int64_t cols, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> x(static_cast<std::size_t>(n * cols));
  for (auto& v : x) v = dist(rng);
  return x;
}

// One block of 32 activations as ggml's x86 quantize_row_q8_0 / _q8_1 store it: d = amax / 127
// (to fp16), codes round(x * 127 / amax) with ties to even, s = fp16(d * sum of codes).
struct XBlock {
  int q[32];
  double d, s;
};

XBlock reference_quantize(const float* x) {
  XBlock out{};
  float amax = 0;
  for (int e = 0; e < 32; ++e) amax = std::max(amax, std::abs(x[e]));
  const float d = amax / 127.0f, inverse = amax != 0 ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int e = 0; e < 32; ++e) {
    const float v = x[e] * inverse;
    float r = std::floor(v);
    const float frac = v - r;
    if (frac > 0.5f || (frac == 0.5f && std::fmod(r, 2.0f) != 0)) r += 1;  // ties to even
    out.q[e] = static_cast<int>(r);
    sum += out.q[e];
  }
  out.d = fp16_to_float(float_to_fp16(d));
  out.s = fp16_to_float(float_to_fp16(d * static_cast<float>(sum)));
  return out;
}

// Code e of a block-format weight block as the products use it: q8_0 signed, q4_0 as q - 8,
// q4_1 as stored.
int weight_code(WeightType type, const std::byte* block, std::int64_t e) {
  if (type == WeightType::kQ8_0) return static_cast<std::int8_t>(block[2 + e]);
  const bool q41 = type == WeightType::kQ4_1;
  const auto byte = static_cast<std::uint8_t>(block[(q41 ? 4 : 2) + e % 16]);
  return (e < 16 ? byte & 15 : byte >> 4) - (q41 ? 0 : 8);
}

// The product of W's row r and x's row `xr` (cols floats), in double: for float types over the
// exact values; for the block formats as ggml defines its dot, sum over blocks of
// d_w d_x sum(q_w q_x) (+ m_w s_x for q4_1), q_w as stored (q4_0: q - 8), over quantised x.
// `mag` gets the sum of the terms' magnitudes (what float rounding scales with).
double reference_product(WeightType type, const std::vector<std::byte>& w, std::int64_t cols,
                         std::int64_t r, const float* xr, double& mag) {
  double ref = 0;
  mag = 0;
  if (weight_block_elements(type) == 1) {
    for (std::int64_t e = 0; e < cols; ++e) {
      const double p = xr[e] * reference_element(type, w, cols, r, e);
      ref += p;
      mag += std::abs(p);
    }
    return ref;
  }
  const std::byte* row = w.data() + r * weight_bytes(type, 1, cols);
  const std::int64_t block_bytes = weight_bytes(type, 1, 32);
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const XBlock xb = reference_quantize(xr + 32 * b);
    const std::byte* block = row + b * block_bytes;
    const double dw = fp16_to_float(u16(block));
    double dot = 0, dot_mag = 0;
    for (std::int64_t e = 0; e < 32; ++e) {
      const int q = weight_code(type, block, e);
      dot += q * xb.q[e];
      dot_mag += std::abs(q * xb.q[e]);
    }
    ref += dw * xb.d * dot;
    mag += std::abs(dw * xb.d) * dot_mag;
    if (type == WeightType::kQ4_1) {
      const double m = fp16_to_float(u16(block + 2));
      ref += m * xb.s;
      mag += std::abs(m * xb.s);
    }
  }
  return ref;
}

// Float roundings per output: `cols` products added in float (in a few lanes, then a tree),
// plus 9; on AMX tiles (bf16) each x is three exact bf16 terms, so three additions per column.
// The block formats: one fused multiply-add per block and lane (the integer sums are exact).
double roundings(WeightType type, std::int64_t cols) {
  if (weight_block_elements(type) == 32) return static_cast<double>(cols / 32) + 9;
  return static_cast<double>(matmul_uses_amx(type) ? 3 * cols : cols) + 9;
}

struct Case {
  WeightType type;
  std::int64_t rows, cols;
};

// Shapes: register tiles with a tail of W rows (37 = 9 x 4 + 1), several scratch chunks (1056
// columns > 512), and for float types rows that do not fill whole vectors.
std::vector<Case> cases() {
  std::vector<Case> out;
  for (WeightType t : kTypes) {
    out.push_back({t, 37, 1056});
    out.push_back({t, 6, 64});
    if (weight_block_elements(t) == 1) {
      out.push_back({t, 5, 100});
      out.push_back({t, 9, 521});
      out.push_back({t, 3, 3});
    }
  }
  return out;
}

std::string name(const Case& c) {
  return std::string(to_string(c.type)) + " " + std::to_string(c.rows) + "x" +
         std::to_string(c.cols);
}

TEST(WeightMatmul, DecodesEveryTypeAsItsFormatDefines) {
  std::mt19937_64 rng(1);
  for (const Case& c : cases()) {
    const auto w = random_weight(c.type, c.rows, c.cols, rng);
    ASSERT_EQ(static_cast<std::int64_t>(w.size()), weight_bytes(c.type, c.rows, c.cols));
    const WeightView view{c.type, c.rows, c.cols, w.data()};
    std::vector<float> row(static_cast<std::size_t>(c.cols));
    for (std::int64_t r = 0; r < c.rows; ++r) {
      dequantize_row(view, r, row);
      for (std::int64_t e = 0; e < c.cols; ++e) {
        const double expect = reference_element(c.type, w, c.cols, r, e);
        // q4_1's q * d + m is rounded to float once; every other value is exact.
        const double tol = c.type == WeightType::kQ4_1 ? std::abs(expect) * 0x1p-24 : 0.0;
        ASSERT_LE(std::abs(row[static_cast<std::size_t>(e)] - expect), tol)
            << name(c) << " row " << r << " element " << e;
      }
    }
  }
}

// y within float rounding of the double-precision product over the exact weight values (block
// formats: and over x quantised as ggml does): below roundings * 2^-24 * the terms' magnitudes.
TEST(WeightMatmul, MatchesTheDoubleReference) {
  std::mt19937_64 rng(2);
  for (const Case& c : cases()) {
    const auto w = random_weight(c.type, c.rows, c.cols, rng);
    const WeightView view{c.type, c.rows, c.cols, w.data()};
    for (std::int64_t n : {1, 3, 8}) {
      const auto x = random_x(n, c.cols, rng);
      std::vector<float> y(static_cast<std::size_t>(n * c.rows));
      matmul(view, x, y);
      for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t r = 0; r < c.rows; ++r) {
          double mag = 0;
          const double ref = reference_product(c.type, w, c.cols, r, x.data() + i * c.cols, mag);
          const double tol = roundings(c.type, c.cols) * 0x1p-24 * mag;
          ASSERT_NEAR(y[static_cast<std::size_t>(i * c.rows + r)], ref, tol)
              << name(c) << " n " << n << " row " << i << " output " << r;
        }
      }
    }
  }
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

// What a batch-invariant engine relies on: a token's outputs do not depend on the tokens beside
// it (n = 1 .. 17 crosses every register tile of x rows and the scratch path), nor on threads.
void check_invariance(const std::string& target) {
  std::mt19937_64 rng(3);
  ThreadPool two(2), three(3);
  for (const Case& c : cases()) {
    const auto w = random_weight(c.type, c.rows, c.cols, rng);
    const WeightView view{c.type, c.rows, c.cols, w.data()};
    const std::int64_t n_max = 17;
    const auto x = random_x(n_max, c.cols, rng);
    // Each row alone, on the calling thread.
    std::vector<float> alone(static_cast<std::size_t>(n_max * c.rows));
    for (std::int64_t i = 0; i < n_max; ++i) {
      matmul(view,
             std::span(x).subspan(static_cast<std::size_t>(i * c.cols),
                                  static_cast<std::size_t>(c.cols)),
             std::span(alone).subspan(static_cast<std::size_t>(i * c.rows),
                                      static_cast<std::size_t>(c.rows)));
    }
    for (std::int64_t n : {1, 2, 3, 4, 5, 8, 9, 17}) {
      const std::span xs = std::span(x).first(static_cast<std::size_t>(n * c.cols));
      const std::vector<float> expect(alone.begin(), alone.begin() + n * c.rows);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
        std::vector<float> y(static_cast<std::size_t>(n * c.rows));
        matmul(view, xs, y, pool);
        expect_same_bits(y, expect,
                         name(c) + " on " + target + ": " + std::to_string(n) + " rows, " +
                             std::to_string(pool ? pool->size() : 1) + " threads");
      }
    }
  }
}

TEST(WeightMatmul, RowsAndThreadsGiveTheSameBits) { check_invariance(matmul_target()); }

// Every instruction set this binary carries and this CPU runs (AVX-512, AVX2, the portable
// baseline ...): each is accurate and invariant on its own (their bits may differ from each
// other: the vector width is part of the reduction order).
TEST(WeightMatmul, EveryInstructionSetIsAccurateAndInvariant) {
  std::mt19937_64 rng(4);
  int targets = 0;
  // The AVX paths of the types AMX takes are checked too, on a machine that has AMX.
  set_matmul_amx(false);
  for_each_simd_target([&](const std::string& target) {
    ++targets;
    EXPECT_EQ(target, matmul_target());
    check_invariance(target);
    for (WeightType t : kTypes) {
      const std::int64_t rows = 5, cols = 96;
      const auto w = random_weight(t, rows, cols, rng);
      const auto x = random_x(2, cols, rng);
      std::vector<float> y(2 * rows);
      matmul({t, rows, cols, w.data()}, x, y);
      for (std::int64_t i = 0; i < 2; ++i) {
        for (std::int64_t r = 0; r < rows; ++r) {
          double mag = 0;
          const double ref = reference_product(t, w, cols, r, x.data() + i * cols, mag);
          EXPECT_NEAR(y[static_cast<std::size_t>(i * rows + r)], ref,
                      roundings(t, cols) * 0x1p-24 * mag)
              << to_string(t) << " on " << target;
        }
      }
    }
  });
  set_matmul_amx(true);
  EXPECT_GE(targets, 1);
  EXPECT_EQ(simd_targets().size(), static_cast<std::size_t>(targets));
}

// The block formats' integer dots: every instruction set (AVX-512 with and without VNNI, AVX2,
// the scalar baseline ...) gives the same bits (the same integer sums and the same float steps
// in the same order on every path), for 1 to 17 rows of x and shapes with a tail of W rows.
TEST(WeightMatmul, BlockFormatsGiveTheSameBitsOnEveryInstructionSet) {
  std::mt19937_64 rng(6);
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1}) {
    for (const auto& shape : {std::pair<std::int64_t, std::int64_t>{37, 1056}, {6, 64}}) {
      // Named copies, not a structured binding: the lambdas below capture them (clang 14 cannot
      // capture a binding).
      const std::int64_t rows = shape.first, cols = shape.second;
      const auto w = random_weight(t, rows, cols, rng);
      for (std::int64_t n : {1, 2, 3, 5, 8, 17}) {
        const auto x = random_x(n, cols, rng);
        std::vector<float> first;
        std::string first_target;
        for (const bool vnni : {true, false}) {  // AVX-512 with and without VNNI, where it runs
          set_matmul_vnni(vnni);
          for_each_simd_target([&](const std::string& simd) {
            const std::string target = simd + (vnni ? "" : " without VNNI");
            std::vector<float> y(static_cast<std::size_t>(n * rows));
            matmul({t, rows, cols, w.data()}, x, y);
            if (first.empty()) {
              first = y;
              first_target = target;
            } else {
              expect_same_bits(y, first,
                               std::string(to_string(t)) + " " + std::to_string(n) +
                                   " rows: " + target + " vs " + first_target);
            }
          });
        }
        set_matmul_vnni(true);
      }
    }
  }
}

// ggml's activation quantisation on values that tell its choices apart: with amax = 127 the
// codes are x itself rounded to the nearest integer, ties to even (roundf would give 3, 4, -3,
// 1, -1, 2, 127); a q8_0 weight of unit codes (d = 1) picks each code out exactly. A q4_1 weight
// with d = 0 and m = 1 gives s = fp16(d_x * sum of codes). A non-finite x gives non-finite
// outputs.
TEST(WeightMatmul, QuantisesActivationsAsGgmlDoes) {
  std::vector<float> x(32, 0.0f);
  const float values[] = {127.0f, 2.5f, 3.5f, -2.5f, 0.5f, -0.5f, 1.5f, 126.5f};
  const int codes[] = {127, 2, 4, -2, 0, 0, 2, 126};
  std::copy(std::begin(values), std::end(values), x.begin());
  std::vector<std::byte> w;
  for (int r = 0; r < 8; ++r) {
    put16(w, float_to_fp16(1.0f));
    for (int e = 0; e < 32; ++e) w.push_back(static_cast<std::byte>(e == r ? 1 : 0));
  }
  std::vector<float> y(8);
  matmul({WeightType::kQ8_0, 8, 32, w.data()}, x, y);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(y[static_cast<std::size_t>(r)], codes[r]) << r;

  // x = 0.01 * codes-ish values: d = 1.27 / 127 in float, s = fp16(d * 259).
  std::vector<float> xs(32, 0.0f);
  for (int e = 0; e < 8; ++e)
    xs[static_cast<std::size_t>(e)] = 0.01f * static_cast<float>(codes[e]);
  const float amax = 0.01f * 127.0f;
  int sum = 0;
  for (int e = 0; e < 8; ++e)
    sum += static_cast<int>(std::nearbyint(xs[static_cast<std::size_t>(e)] * (127.0f / amax)));
  std::vector<std::byte> w1;
  put16(w1, float_to_fp16(0.0f));
  put16(w1, float_to_fp16(1.0f));
  for (int e = 0; e < 16; ++e) w1.push_back(std::byte{0x77});
  std::vector<float> y1(1);
  matmul({WeightType::kQ4_1, 1, 32, w1.data()}, xs, y1);
  EXPECT_EQ(y1[0], fp16_to_float(float_to_fp16(amax / 127.0f * static_cast<float>(sum))));

  x[3] = std::numeric_limits<float>::infinity();
  matmul({WeightType::kQ8_0, 8, 32, w.data()}, x, y);
  for (float v : y) EXPECT_FALSE(std::isfinite(v));
}

// Rows of x long enough that blocks are quantised sixteen at a time where the target does
// (AVX-512): each block's codes and scale are still its own, beside blocks of zeros, and a
// non-finite block among the sixteen spoils only its own row of x (whose every output meets
// its NaN scale), not the other row's blocks in its group. A q8_0 weight whose row c picks
// column c gives y = d_x * code exactly.
TEST(WeightMatmul, QuantisesBlocksTogetherAsOneAtATime) {
  constexpr std::int64_t kCols = 640;  // 20 blocks a row: groups of 16 and a remainder
  constexpr std::int64_t kRows = 3;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> x(static_cast<std::size_t>(kRows * kCols));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t block = i / 32;
    x[i] = block % 7 == 3 ? 0.0f : std::ldexp(value(rng), exponent(rng) / 4 + int(block % 5) - 2);
  }
  std::vector<std::byte> w;
  for (std::int64_t r = 0; r < kCols; ++r) {
    put16(w, float_to_fp16(1.0f));
    for (std::int64_t e = 0; e < 32; ++e) w.push_back(static_cast<std::byte>(r % 32 == e ? 1 : 0));
    for (std::int64_t b = 1; b < kCols / 32; ++b) {
      put16(w, float_to_fp16(1.0f));
      for (int e = 0; e < 32; ++e) w.push_back(std::byte{0});
    }
  }
  // Row r's only nonzero code sits in block 0 at r % 32: move it to block r / 32.
  const std::int64_t row_bytes = weight_bytes(WeightType::kQ8_0, 1, kCols);
  for (std::int64_t r = 0; r < kCols; ++r) {
    std::byte* row = w.data() + r * row_bytes;
    row[2 + r % 32] = std::byte{0};
    row[(r / 32) * 34 + 2 + r % 32] = std::byte{1};
  }
  const auto check = [&](std::int64_t bad_block) {
    std::vector<float> y(static_cast<std::size_t>(kRows * kCols));
    for_each_simd_target([&](const std::string& simd) {
      matmul({WeightType::kQ8_0, kCols, kCols, w.data()}, x, y);
      for (std::int64_t t = 0; t < kRows; ++t) {
        for (std::int64_t b = 0; b < kCols / 32; ++b) {
          const float* xb = x.data() + t * kCols + b * 32;
          if (bad_block >= 0 && t == bad_block / (kCols / 32)) {  // its row's d_x: NaN x 0
            for (std::int64_t e = 0; e < 32; ++e)
              EXPECT_FALSE(std::isfinite(y[static_cast<std::size_t>(t * kCols + b * 32 + e)]))
                  << simd;
            continue;
          }
          const XBlock ref = reference_quantize(xb);
          for (std::int64_t e = 0; e < 32; ++e) {
            EXPECT_EQ(y[static_cast<std::size_t>(t * kCols + b * 32 + e)],
                      static_cast<float>(ref.d * ref.q[e]))
                << simd << ": row " << t << ", block " << b << ", element " << e;
          }
        }
      }
    });
  };
  check(-1);
  x[static_cast<std::size_t>(kCols + 5 * 32 + 9)] = std::numeric_limits<float>::quiet_NaN();
  check(kCols / 32 + 5);  // x's block 25, in the group of blocks 16-31 (rows 0 and 1)
}

// The activation scale d = amax / 127 rounds to fp16 as float_to_fp16 does on every instruction
// set (F16C's conversion where the target has it), across fp16's whole range: subnormal scales
// (amax below 127 x 2^-14), ties between two fp16 values, and overflow to infinity (amax / 127 at
// or above 65520, whose outputs are then not finite). A q8_0 weight of one unit code picks out
// d_x x 127 for each of the 327 rows of x, enough blocks that the pool's workers quantise them.
TEST(WeightMatmul, ActivationScalesRoundToFp16AsTheScalarDoesAtEveryMagnitude) {
  std::vector<float> amaxes;
  for (int e = -40; e <= 24; ++e) {
    for (const float m : {1.0f, 1.0009765625f, 1.00146484375f, 1.5f, 1.999f}) {
      amaxes.push_back(std::ldexp(m, e));
    }
  }
  amaxes.push_back(65520.0f * 127.0f);
  amaxes.push_back(std::numeric_limits<float>::max());
  const auto n = static_cast<std::int64_t>(amaxes.size());
  std::vector<float> x(static_cast<std::size_t>(n * 32), 0.0f);
  for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i * 32)] = amaxes[i];
  std::vector<std::byte> w;
  put16(w, float_to_fp16(1.0f));
  for (int e = 0; e < 32; ++e) w.push_back(static_cast<std::byte>(e == 0 ? 1 : 0));
  ThreadPool pool(2);
  for_each_simd_target([&](const std::string& simd) {
    std::vector<float> y(static_cast<std::size_t>(n));
    matmul({WeightType::kQ8_0, 1, 32, w.data()}, x, y, &pool);
    for (std::int64_t i = 0; i < n; ++i) {
      const float d = fp16_to_float(float_to_fp16(amaxes[i] / 127.0f));
      const float got = y[static_cast<std::size_t>(i)];
      if (std::isinf(d)) {  // an infinite d_x meets the block's zero codes too: inf x 0
        EXPECT_FALSE(std::isfinite(got)) << simd << ": amax " << amaxes[i];
      } else {
        EXPECT_EQ(got, d * 127.0f) << simd << ": amax " << amaxes[i];
      }
    }
  });
}

// The AMX path (where the CPU has it), beyond the shapes above: x of every magnitude (its three
// bf16 terms must add back to x exactly, 2^-100 .. 2^100), rows that leave a partial panel of 16,
// columns that leave a partial step of 32 (600 also makes several column chunks), several
// groups of 16 x rows and two passes of 64 (rows alone give the same bits), and an infinite
// weight.
TEST(WeightMatmul, AmxTilesKeepFloatAccuracy) {
  if (!matmul_uses_amx(WeightType::kBfloat16)) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  std::mt19937_64 rng(5);
  ThreadPool two(2);
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{40, 600}, {17, 33}}) {
    auto w = random_weight(WeightType::kBfloat16, rows, cols, rng);
    const WeightView view{WeightType::kBfloat16, rows, cols, w.data()};
    const std::int64_t n = 70;  // five groups of 16 x rows, two passes of 64
    std::vector<float> x(static_cast<std::size_t>(n * cols));
    std::uniform_real_distribution<float> mant(1.0f, 2.0f), expo(-100.0f, 100.0f);
    for (auto& v : x) v = mant(rng) * std::exp2(std::round(expo(rng))) * (rng() % 2 ? 1.0f : -1.0f);
    std::vector<float> y(static_cast<std::size_t>(n * rows)), y2(y.size());
    matmul(view, x, y);
    matmul(view, x, y2, &two);
    expect_same_bits(y, y2, "AMX, 1 vs 2 threads");
    for (std::int64_t i = 0; i < n; i += 23) {
      std::vector<float> alone(static_cast<std::size_t>(rows));
      matmul(
          view,
          std::span(x).subspan(static_cast<std::size_t>(i * cols), static_cast<std::size_t>(cols)),
          alone);
      const std::vector<float> in_batch(y.begin() + i * rows, y.begin() + (i + 1) * rows);
      expect_same_bits(alone, in_batch, "AMX, row " + std::to_string(i) + " alone vs among 70");
    }
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t r = 0; r < rows; ++r) {
        double ref = 0, mag = 0;
        for (std::int64_t e = 0; e < cols; ++e) {
          const double p = x[static_cast<std::size_t>(i * cols + e)] *
                           reference_element(WeightType::kBfloat16, w, cols, r, e);
          ref += p;
          mag += std::abs(p);
        }
        ASSERT_NEAR(y[static_cast<std::size_t>(i * rows + r)], ref,
                    roundings(WeightType::kBfloat16, cols) * 0x1p-24 * mag)
            << rows << "x" << cols << " row " << i << " output " << r;
      }
    }
  }
  // One infinite weight: its output is not finite. (NaN rather than float math's inf: the zero
  // low terms of x meet it; a broken weight still shows, as docs/kernels.md says.)
  std::vector<std::byte> w(static_cast<std::size_t>(weight_bytes(WeightType::kBfloat16, 2, 32)));
  const std::uint16_t one = float_to_bf16(1.0f), inf = 0x7F80;
  for (std::size_t e = 0; e < 64; ++e) std::memcpy(w.data() + 2 * e, e == 5 ? &inf : &one, 2);
  std::vector<float> x(32, 0.5f), y(2);
  matmul({WeightType::kBfloat16, 2, 32, w.data()}, x, y);
  EXPECT_FALSE(std::isfinite(y[0]));
  EXPECT_EQ(y[1], 16.0f);
}

// ---- The kBlockSum order (mixkv's): one exact integer sum per block, one float chain ----

constexpr WeightType kBlockTypes[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1};

// Output (r, xr) in the kBlockSum order, emulated in float from the definition (the test's own
// quantiser, codes and steps): y = fma(d_w * d_x, I_b, y) over blocks, q4_1 then
// y = fma(m_w, s_x, y). What every path must give bit for bit.
float blocksum_emulated(WeightType type, const std::vector<std::byte>& w, std::int64_t cols,
                        std::int64_t r, const float* xr) {
  const std::byte* row = w.data() + r * weight_bytes(type, 1, cols);
  const std::int64_t block_bytes = weight_bytes(type, 1, 32);
  float y = 0.0f;
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const XBlock xb = reference_quantize(xr + 32 * b);
    const std::byte* block = row + b * block_bytes;
    std::int32_t sum = 0;
    for (int e = 0; e < 32; ++e) {
      const int q = weight_code(type, block, e);
      sum += q * xb.q[e];
    }
    const float d = fp16_to_float(u16(block)) * static_cast<float>(xb.d);
    y = std::fma(d, static_cast<float>(sum), y);
    if (type == WeightType::kQ4_1) {
      y = std::fma(fp16_to_float(u16(block + 2)), static_cast<float>(xb.s), y);
    }
  }
  return y;
}

// Shapes: one panel of 16 W rows exactly, partial last panels (37, 17, 1 rows), several panels
// per task; one block, odd block counts (the AMX-INT8 path's last block without a pair), an
// even one (4), a long row.
constexpr std::pair<std::int64_t, std::int64_t> kBlockSumShapes[] = {
    {37, 1056}, {16, 128}, {17, 32}, {1, 160}, {48, 288}};

// y of n rows of x against `rows` rows of W, each output from `one(r, i)` (an emulation).
template <typename F>
std::vector<float> emulate_outputs(std::int64_t n, std::int64_t rows, F&& one) {
  std::vector<float> y(static_cast<std::size_t>(n * rows));
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t r = 0; r < rows; ++r) y[static_cast<std::size_t>(i * rows + r)] = one(r, i);
  return y;
}

// Every way of computing the blocksum order this machine has: packed (read by the VNNI path
// where it runs) or not, VNNI on or off, each instruction set; `check` sees each result.
template <typename F>
void for_each_blocksum_path(F&& check) {
  for (const bool packed : {true, false}) {
    for (const bool vnni : {true, false}) {
      set_matmul_vnni(vnni);
      for_each_simd_target([&](const std::string& simd) {
        check(simd + (vnni ? "" : " without VNNI") + (packed ? ", packed" : ", unpacked"), packed);
      });
    }
  }
  set_matmul_vnni(true);
}

// Bit for bit the emulation above, for 1 .. 64 rows of x, on every path, with 1, 2 and 3
// threads: so n rows equal 1 row, threads change nothing, and every instruction set agrees.
TEST(BlockSumOrder, EveryPathGivesTheDefinitionsBitsForAnyRowCount) {
  std::mt19937_64 rng(7);
  ThreadPool two(2), three(3);
  for (WeightType t : kBlockTypes) {
    for (const auto& shape : kBlockSumShapes) {
      const std::int64_t rows = shape.first, cols = shape.second;  // captured below
      const auto w = random_weight(t, rows, cols, rng);
      const PackedWeight packed = pack_weight({t, rows, cols, w.data()});
      EXPECT_EQ(packed.bytes(), (rows + 15) / 16 * 16 * weight_bytes(t, 1, cols));
      const std::int64_t n_max = 64;
      const auto x = random_x(n_max, cols, rng);
      const std::vector<float> expect = emulate_outputs(n_max, rows, [&](auto r, auto i) {
        return blocksum_emulated(t, w, cols, r, x.data() + i * cols);
      });
      for_each_blocksum_path([&](const std::string& path, bool use_packed) {
        WeightView view{t, rows, cols, w.data(), ReductionOrder::kBlockSum};
        if (use_packed) view.packed = packed.data();
        for (std::int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64}) {
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
            if (n > 9 && pool == &three) continue;  // keeps the sanitizer build fast
            std::vector<float> y(static_cast<std::size_t>(n * rows));
            matmul(view, std::span(x).first(static_cast<std::size_t>(n * cols)), y, pool);
            expect_same_bits(y, std::vector<float>(expect.begin(), expect.begin() + n * rows),
                             std::string(to_string(t)) + " " + std::to_string(rows) + "x" +
                                 std::to_string(cols) + " " + std::to_string(n) + " rows, " +
                                 std::to_string(pool ? pool->size() : 1) + " threads, " + path);
          }
        }
      });
    }
  }
}

// Within float rounding of the double product over the codes (one rounding per block for the
// product and one for the sum, q4_1 two more), and the same quantised x as the ggml order: the
// two orders differ only in float rounding.
TEST(BlockSumOrder, MatchesTheDoubleReferenceAndTheGgmlOrderWithinRounding) {
  std::mt19937_64 rng(8);
  for (WeightType t : kBlockTypes) {
    const std::int64_t rows = 37, cols = 1056, n = 5;
    const auto w = random_weight(t, rows, cols, rng);
    const PackedWeight packed = pack_weight({t, rows, cols, w.data()});
    const auto x = random_x(n, cols, rng);
    std::vector<float> y(static_cast<std::size_t>(n * rows)), g(y.size());
    matmul({t, rows, cols, w.data(), ReductionOrder::kBlockSum, packed.data()}, x, y);
    matmul({t, rows, cols, w.data()}, x, g);
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t r = 0; r < rows; ++r) {
        double mag = 0;
        const double ref = reference_product(t, w, cols, r, x.data() + i * cols, mag);
        const double tol = (4.0 * static_cast<double>(cols / 32) + 9) * 0x1p-24 * mag;
        const auto at = static_cast<std::size_t>(i * rows + r);
        ASSERT_NEAR(y[at], ref, tol) << to_string(t) << " row " << i << " output " << r;
        ASSERT_NEAR(y[at], g[at], 2 * tol) << to_string(t) << " vs the ggml order";
      }
    }
  }
}

// A non-finite x reaches its outputs in this order too (its block's d is NaN).
TEST(BlockSumOrder, NonFiniteActivationsGiveNonFiniteOutputs) {
  std::mt19937_64 rng(9);
  for (WeightType t : kBlockTypes) {
    const auto w = random_weight(t, 20, 64, rng);
    const PackedWeight packed = pack_weight({t, 20, 64, w.data()});
    auto x = random_x(2, 64, rng);
    x[64 + 40] = std::numeric_limits<float>::infinity();
    std::vector<float> y(40);
    matmul({t, 20, 64, w.data(), ReductionOrder::kBlockSum, packed.data()}, x, y);
    for (int r = 0; r < 20; ++r) {
      EXPECT_TRUE(std::isfinite(y[static_cast<std::size_t>(r)])) << to_string(t);
      EXPECT_FALSE(std::isfinite(y[static_cast<std::size_t>(20 + r)])) << to_string(t);
    }
  }
}

TEST(BlockSumOrder, RefusesWhatCannotBePacked) {
  using mixkv::testing::expect_error;
  std::vector<std::byte> w(static_cast<std::size_t>(weight_bytes(WeightType::kFloat16, 4, 64)));
  expect_error(
      [&] {
        (void)pack_weight({WeightType::kFloat16, 4, 64, w.data()});
      },
      ErrorCode::kInvalidInput, {"pack_weight", "float16", "q8_0, q4_0, q4_1 and bfloat16"});
  expect_error(
      [&] {
        (void)pack_weight({WeightType::kQ8_0, 4, 64, nullptr});
      },
      ErrorCode::kInvalidInput, {"no data"});
  std::vector<std::byte> q(static_cast<std::size_t>(weight_bytes(WeightType::kQ8_0, 4, 64)));
  const PackedWeight packed = pack_weight({WeightType::kQ8_0, 4, 64, q.data()});
  std::vector<float> x(64), y(4);
  expect_error(
      [&] {
        WeightView v{WeightType::kQ8_0, 4, 64, q.data()};
        v.packed = packed.data();  // packed, but the ggml order
        matmul(v, x, y, nullptr, "layer 2 down");
      },
      ErrorCode::kInvalidInput, {"layer 2 down", "packed", "blocksum"});
  EXPECT_EQ(to_string(ReductionOrder::kGgml), "ggml");
  EXPECT_EQ(to_string(ReductionOrder::kBlockSum), "blocksum");
}

// ---- bfloat16 in the kBlockSum order: x as bf16, one chain of pairs of products per output ----

// The order's definition (matmul.hpp), written here from it: per pair q of columns in order, the
// product of column 2 q + 1, then that of 2 q (x rounded to bf16; past the row: zeros), each
// addition rounded. Products of two bf16 values are exact in float.
float bf16_pairs_emulated(const std::vector<std::byte>& w, std::int64_t cols, std::int64_t r,
                          const float* x) {
  const std::byte* row = w.data() + r * 2 * cols;
  const auto value = [&](std::int64_t col, bool of_x) -> float {
    if (col >= cols) return 0.0f;
    return bf16_to_float(of_x ? float_to_bf16(x[col]) : u16(row + 2 * col));
  };
  float acc = 0.0f;
  for (std::int64_t q = 0; 2 * q < cols; ++q) {
    for (const std::int64_t col : {2 * q + 1, 2 * q}) {
      const float product = value(col, true) * value(col, false);
      acc = acc + product;
    }
  }
  return acc;
}

// Every way this machine computes the order: VDPBF16PS where the CPU has it, and every
// instruction set's float lanes.
template <typename F>
void for_each_bf16_pairs_path(F&& check) {
  for (const bool dots : {true, false}) {
    set_matmul_bf16_dots(dots);
    for_each_simd_target(
        [&](const std::string& simd) { check(simd + (dots ? "" : " without BF16 dots")); });
  }
  set_matmul_bf16_dots(true);
}

// Shapes: panels of 32 W rows with tails (37, 70: three panels, the threads' ranges cut between
// them), one partial panel (6, 5, 9, 3), rows of an odd column count (521, 3, 33).
constexpr std::pair<std::int64_t, std::int64_t> kBf16PairShapes[] = {{37, 1056}, {6, 64}, {5, 100},
                                                                     {9, 521},   {3, 3},  {70, 33}};

// Bit for bit the definition, for 1 .. 40 rows of x (up to five x tiles, the last one partial), on
// every path, with 1, 2 and 3 threads.
TEST(Bf16PairOrder, EveryPathGivesTheDefinitionsBitsForAnyRowCount) {
  std::mt19937_64 rng(21);
  ThreadPool two(2), three(3);
  for (const auto& shape : kBf16PairShapes) {
    const std::int64_t rows = shape.first, cols = shape.second;  // captured below
    const auto w = random_weight(WeightType::kBfloat16, rows, cols, rng);
    const std::int64_t n_max = 40;
    const auto x = random_x(n_max, cols, rng);
    const std::vector<float> expect = emulate_outputs(n_max, rows, [&](auto r, auto i) {
      return bf16_pairs_emulated(w, cols, r, x.data() + i * cols);
    });
    const WeightView view{WeightType::kBfloat16, rows, cols, w.data(), ReductionOrder::kBlockSum};
    for_each_bf16_pairs_path([&](const std::string& path) {
      for (std::int64_t n : {1, 2, 3, 4, 5, 8, 9, 17, 40}) {
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
          std::vector<float> y(static_cast<std::size_t>(n * rows));
          matmul(view, std::span(x).first(static_cast<std::size_t>(n * cols)), y, pool);
          expect_same_bits(y, std::vector<float>(expect.begin(), expect.begin() + n * rows),
                           std::to_string(rows) + "x" + std::to_string(cols) + " " +
                               std::to_string(n) + " rows, " +
                               std::to_string(pool ? pool->size() : 1) + " threads, " + path);
        }
      }
    });
  }
}

// pack_weight's copy (what a runner hands matmul) gives the bits of the weight's own rows (which
// matmul packs a panel at a time), on every path and for any rows of x and threads; its size is
// 32 rows (the last panel padded) x 4 bytes per pair of columns.
TEST(Bf16PairOrder, PackedCopyGivesTheBitsOfTheRows) {
  std::mt19937_64 rng(23);
  ThreadPool two(2), three(3);
  EXPECT_TRUE(matmul_reads_packed(WeightType::kBfloat16));
  for (const auto& shape : kBf16PairShapes) {
    const std::int64_t rows = shape.first, cols = shape.second;  // captured below
    const auto w = random_weight(WeightType::kBfloat16, rows, cols, rng);
    const std::int64_t n_max = 9;
    const auto x = random_x(n_max, cols, rng);
    WeightView view{WeightType::kBfloat16, rows, cols, w.data(), ReductionOrder::kBlockSum};
    const PackedWeight packed = pack_weight(view);
    EXPECT_EQ(packed.bytes(), (rows + 31) / 32 * 32 * ((cols + 1) / 2) * 4);
    for_each_bf16_pairs_path([&](const std::string& path) {
      for (std::int64_t n : {1, 5, 8, 9}) {
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
          const auto xs = std::span(x).first(static_cast<std::size_t>(n * cols));
          std::vector<float> own(static_cast<std::size_t>(n * rows)), copy(own.size());
          view.packed = nullptr;
          matmul(view, xs, own, pool);
          view.packed = packed.data();
          matmul(view, xs, copy, pool);
          expect_same_bits(copy, own,
                           std::to_string(rows) + "x" + std::to_string(cols) + " " +
                               std::to_string(n) + " rows, " +
                               std::to_string(pool ? pool->size() : 1) + " threads, " + path);
        }
      }
    });
  }
}

// Within float rounding (one addition per column) of the double product over x rounded to bf16,
// and within x's rounding (2^-9 of each product) of the product over x itself.
TEST(Bf16PairOrder, MatchesTheDoubleReferenceWithinXsRounding) {
  std::mt19937_64 rng(22);
  const std::int64_t rows = 37, cols = 1056, n = 5;
  const auto w = random_weight(WeightType::kBfloat16, rows, cols, rng);
  const auto x = random_x(n, cols, rng);
  std::vector<float> x_bf16(x.size());
  for (std::size_t e = 0; e < x.size(); ++e) x_bf16[e] = bf16_to_float(float_to_bf16(x[e]));
  std::vector<float> y(static_cast<std::size_t>(n * rows));
  matmul({WeightType::kBfloat16, rows, cols, w.data(), ReductionOrder::kBlockSum}, x, y);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t r = 0; r < rows; ++r) {
      double mag = 0;
      const double rounded_x =
          reference_product(WeightType::kBfloat16, w, cols, r, x_bf16.data() + i * cols, mag);
      const double exact_x =
          reference_product(WeightType::kBfloat16, w, cols, r, x.data() + i * cols, mag);
      const auto at = static_cast<std::size_t>(i * rows + r);
      ASSERT_NEAR(y[at], rounded_x, static_cast<double>(cols) * 0x1p-24 * mag)
          << "row " << i << " output " << r;
      ASSERT_NEAR(y[at], exact_x, 0x1p-9 * mag) << "row " << i << " output " << r;
    }
  }
}

// Subnormal weights, activations, products and sums: VDPBF16PS reads subnormal inputs as zero
// and flushes subnormal results; every other path does the same (FTZ and DAZ on x86), so all
// give the same bits, and a weight or activation of 2^-130 contributes nothing.
TEST(Bf16PairOrder, SubnormalsAreFlushedOnEveryPath) {
  std::mt19937_64 rng(23);
  const std::int64_t rows = 9, cols = 96, n = 3;
  std::vector<std::byte> w;
  std::uniform_int_distribution<int> exponent(-150, -110);
  std::vector<float> x(static_cast<std::size_t>(n * cols));
  for (std::int64_t e = 0; e < rows * cols; ++e)
    put16(w, float_to_bf16(std::ldexp(rng() % 2 ? 1.5f : -1.25f, exponent(rng) / 2 - 10)));
  for (auto& v : x) v = std::ldexp(rng() % 2 ? 1.0f : -1.75f, exponent(rng) / 2 - 20);
  const WeightView view{WeightType::kBfloat16, rows, cols, w.data(), ReductionOrder::kBlockSum};
  std::vector<float> first;
  std::string first_path;
  for_each_bf16_pairs_path([&](const std::string& path) {
    std::vector<float> y(static_cast<std::size_t>(n * rows));
    matmul(view, x, y);
    if (first.empty()) {
      first = y;
      first_path = path;
    } else {
      expect_same_bits(y, first, path + " vs " + first_path);
    }
  });
#if defined(__x86_64__) || defined(__i386__)
  // One product of normal inputs and one of a subnormal weight: the second counts as zero.
  std::vector<std::byte> pair;
  put16(pair, float_to_bf16(1.0f));
  put16(pair, static_cast<std::uint16_t>(0x0001));  // the smallest subnormal bf16, 2^-133
  const std::vector<float> ones{0.5f, 1.0f};
  std::vector<float> y(1);
  matmul({WeightType::kBfloat16, 1, 2, pair.data(), ReductionOrder::kBlockSum}, ones, y);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(y[0]), std::bit_cast<std::uint32_t>(0.5f));
  std::vector<std::byte> tiny;
  put16(tiny, float_to_bf16(0x1p-100f));
  const std::vector<float> tiny_x{0x1p-100f};
  matmul({WeightType::kBfloat16, 1, 1, tiny.data(), ReductionOrder::kBlockSum}, tiny_x, y);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(y[0]), 0u) << "2^-200 flushed to zero";
#endif
}

// Infinities and NaN in x reach their row's outputs; the other rows stay finite.
TEST(Bf16PairOrder, NonFiniteActivationsGiveNonFiniteOutputs) {
  std::mt19937_64 rng(24);
  const auto w = random_weight(WeightType::kBfloat16, 20, 70, rng);
  auto x = random_x(3, 70, rng);
  x[70 + 40] = std::numeric_limits<float>::infinity();
  x[140 + 69] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(60);
  for_each_bf16_pairs_path([&](const std::string& path) {
    matmul({WeightType::kBfloat16, 20, 70, w.data(), ReductionOrder::kBlockSum}, x, y);
    for (int r = 0; r < 20; ++r) {
      EXPECT_TRUE(std::isfinite(y[static_cast<std::size_t>(r)])) << path;
      EXPECT_FALSE(std::isfinite(y[static_cast<std::size_t>(20 + r)])) << path;
      EXPECT_TRUE(std::isnan(y[static_cast<std::size_t>(40 + r)])) << path;
    }
  });
  EXPECT_TRUE(weight_order_applies(WeightType::kBfloat16));
  EXPECT_FALSE(weight_order_applies(WeightType::kFloat16));
  EXPECT_FALSE(weight_order_applies(WeightType::kFloat32));
  EXPECT_TRUE(weight_order_applies(WeightType::kQ4_1));
}

TEST(WeightMatmul, ReadsGgufTypeIds) {
  EXPECT_EQ(weight_type_from_ggml(0), WeightType::kFloat32);
  EXPECT_EQ(weight_type_from_ggml(1), WeightType::kFloat16);
  EXPECT_EQ(weight_type_from_ggml(2), WeightType::kQ4_0);
  EXPECT_EQ(weight_type_from_ggml(3), WeightType::kQ4_1);
  EXPECT_EQ(weight_type_from_ggml(8), WeightType::kQ8_0);
  EXPECT_EQ(weight_type_from_ggml(30), WeightType::kBfloat16);
  EXPECT_EQ(weight_type_from_ggml(14), std::nullopt);  // q6_K: not read yet
  EXPECT_EQ(weight_bytes(WeightType::kQ4_1, 2, 64), 2 * 2 * 20);
  EXPECT_EQ(weight_bytes(WeightType::kQ8_0, 3, 32), 3 * 34);
  EXPECT_EQ(weight_bytes(WeightType::kBfloat16, 3, 5), 30);
}

// matmul_many over weights of every type and of row counts that cut register tiles and the
// task ranges anywhere (the ranges run across the weights' boundaries): each output has the bits
// of its own matmul, whatever the rows of x and the threads.
TEST(WeightMatmul, ManyProductsOfOneXGiveEachProductsOwnBits) {
  std::mt19937_64 rng(11);
  ThreadPool two(2), three(3);
  for (const std::int64_t cols : {std::int64_t{96}, std::int64_t{37}}) {
    std::vector<std::vector<std::byte>> weights;
    std::vector<WeightView> views;
    for (WeightType t : kTypes) {
      if (cols % weight_block_elements(t) != 0) continue;
      for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{13}, std::int64_t{38}}) {
        weights.push_back(random_weight(t, rows, cols, rng));
        views.push_back({t, rows, cols, weights.back().data()});
      }
    }
    for (std::int64_t n : {1, 3, 9}) {
      const auto x = random_x(n, cols, rng);
      std::vector<std::vector<float>> alone, together;
      std::vector<MatmulProduct> products;
      for (const WeightView& v : views) {
        alone.emplace_back(static_cast<std::size_t>(n * v.rows));
        matmul(v, x, alone.back());
        together.emplace_back(alone.back().size());
      }
      for (std::size_t k = 0; k < views.size(); ++k) products.push_back({views[k], together[k]});
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
        for (auto& y : together) std::fill(y.begin(), y.end(), -1.0f);
        matmul_many(products, x, pool);
        for (std::size_t k = 0; k < views.size(); ++k) {
          expect_same_bits(together[k], alone[k],
                           std::string(to_string(views[k].dtype)) + " " +
                               std::to_string(views[k].rows) + "x" + std::to_string(cols) + ", " +
                               std::to_string(n) + " rows, " +
                               std::to_string(pool ? pool->size() : 1) + " threads");
        }
      }
    }
  }
}

// With an epilogue (a gated MLP's activation), every task takes the same rows of each product
// and runs the epilogue on them: each output keeps its own matmul's bits, in the ggml and
// blocksum orders, packed or not; the epilogue sees every row exactly once, after both products
// wrote it, in ranges that start at multiples of 64.
TEST(WeightMatmul, ManyProductsRunTheEpilogueOnTheRowsEachTaskComputed) {
  std::mt19937_64 rng(12);
  ThreadPool two(2), three(3);
  const std::int64_t cols = 64;
  for (WeightType t : kTypes) {
    for (const std::int64_t rows : {std::int64_t{13}, std::int64_t{200}}) {
      for (const ReductionOrder order : {ReductionOrder::kGgml, ReductionOrder::kBlockSum}) {
        const auto a = random_weight(t, rows, cols, rng), b = random_weight(t, rows, cols, rng);
        WeightView va{t, rows, cols, a.data(), order}, vb{t, rows, cols, b.data(), order};
        const bool packs = order == ReductionOrder::kBlockSum && weight_block_elements(t) == 32;
        const PackedWeight pa = packs ? pack_weight(va) : PackedWeight{};
        const PackedWeight pb = packs ? pack_weight(vb) : PackedWeight{};
        if (packs) va.packed = pa.data(), vb.packed = pb.data();
        for (const std::int64_t n : {1, 9}) {
          const auto x = random_x(n, cols, rng);
          const auto size = static_cast<std::size_t>(n * rows);
          std::vector<float> ya(size), yb(size), ma(size), mb(size);
          matmul(va, x, ya);
          matmul(vb, x, yb);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
            const std::string what = std::string(to_string(t)) + " " + std::to_string(rows) +
                                     " rows, " + std::to_string(n) + " of x, " +
                                     std::to_string(pool ? pool->size() : 1) + " threads";
            std::fill(ma.begin(), ma.end(), -1.0f);
            std::fill(mb.begin(), mb.end(), -1.0f);
            std::vector<int> seen(static_cast<std::size_t>(rows), 0);
            std::mutex mutex;
            bool complete = true;
            const MatmulProduct products[] = {{va, ma}, {vb, mb}};
            matmul_many(products, x, pool, [&](std::int64_t from, std::int64_t to) {
              std::lock_guard lock(mutex);
              EXPECT_EQ(from % 64, 0) << what;
              for (std::int64_t r = from; r < to; ++r) {
                ++seen[static_cast<std::size_t>(r)];
                for (std::int64_t i = 0; i < n; ++i) {
                  const auto at = static_cast<std::size_t>(i * rows + r);
                  complete = complete && ma[at] == ya[at] && mb[at] == yb[at];
                }
              }
            });
            EXPECT_TRUE(complete) << what << ": the epilogue ran before its rows were done";
            EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), rows) << what;
            expect_same_bits(ma, ya, what + ", first");
            expect_same_bits(mb, yb, what + ", second");
          }
        }
      }
    }
  }
}

// A batch's x of 16 rows of 576 (288 blocks) is quantised by the pool's threads inside the
// products' region, one x per weight type of the call: the bits stay those of one matmul per
// weight on the calling thread, with weights of two block types sharing x, in both orders,
// packed or not, with or without an epilogue, many calls in a row (a worker that joins late
// finds the x of the call before).
TEST(WeightMatmul, ManyProductsQuantiseABatchXInsideTheirRegion) {
  std::mt19937_64 rng(14);
  ThreadPool two(2), three(3);
  const std::int64_t cols = 576, rows = 48, n = 16;
  const std::pair<WeightType, WeightType> pairs[] = {{WeightType::kQ4_1, WeightType::kQ8_0},
                                                     {WeightType::kQ4_0, WeightType::kQ4_1}};
  for (const auto& [ta, tb] : pairs) {
    for (const ReductionOrder order : {ReductionOrder::kGgml, ReductionOrder::kBlockSum}) {
      const auto a = random_weight(ta, rows, cols, rng), b = random_weight(tb, rows, cols, rng);
      WeightView va{ta, rows, cols, a.data(), order}, vb{tb, rows, cols, b.data(), order};
      const PackedWeight pa = order == ReductionOrder::kBlockSum ? pack_weight(va) : PackedWeight{};
      const PackedWeight pb = order == ReductionOrder::kBlockSum ? pack_weight(vb) : PackedWeight{};
      va.packed = pa.data();
      vb.packed = pb.data();
      const auto size = static_cast<std::size_t>(n * rows);
      for (int call = 0; call < 4; ++call) {
        const auto x = random_x(n, cols, rng);
        std::vector<float> ya(size), yb(size), ma(size), mb(size);
        // On a thread of its own: its x must not be left in this thread's buffers.
        std::thread([&] {
          matmul(va, x, ya);
          matmul(vb, x, yb);
        }).join();
        for (ThreadPool* pool : {&two, &three}) {
          for (const bool with_epilogue : {false, true}) {
            const std::string what =
                std::string(to_string(ta)) + " and " + std::string(to_string(tb)) + ", " +
                std::string(to_string(order)) + ", call " + std::to_string(call) + ", " +
                std::to_string(pool->size()) + " threads" + (with_epilogue ? ", epilogue" : "");
            std::fill(ma.begin(), ma.end(), -1.0f);
            std::fill(mb.begin(), mb.end(), -1.0f);
            const MatmulProduct products[] = {{va, ma}, {vb, mb}};
            std::atomic<std::int64_t> epilogue_rows{0};
            RowsEpilogue epilogue;
            if (with_epilogue) {
              epilogue = [&](std::int64_t from, std::int64_t to) { epilogue_rows += to - from; };
            }
            matmul_many(products, x, pool, epilogue);
            expect_same_bits(ma, ya, what + ", first");
            expect_same_bits(mb, yb, what + ", second");
            EXPECT_EQ(epilogue_rows.load(), with_epilogue ? rows : 0) << what;
          }
        }
      }
    }
  }
}

// Two q4_1 products named "layer 0 <a>" and "layer 0 <b>" of the given shapes, with buffers.
struct TwoProducts {
  TwoProducts(std::int64_t rows_a, std::int64_t cols_a, std::int64_t rows_b, std::int64_t cols_b,
              const char* a, const char* b)
      : wa(static_cast<std::size_t>(weight_bytes(WeightType::kQ4_1, rows_a, cols_a))),
        wb(static_cast<std::size_t>(weight_bytes(WeightType::kQ4_1, rows_b, cols_b))),
        x(static_cast<std::size_t>(cols_a)),
        ya(static_cast<std::size_t>(rows_a)),
        yb(static_cast<std::size_t>(rows_b)),
        name_a(std::string("layer 0 ") + a),
        name_b(std::string("layer 0 ") + b),
        products{{{WeightType::kQ4_1, rows_a, cols_a, wa.data()}, ya, name_a},
                 {{WeightType::kQ4_1, rows_b, cols_b, wb.data()}, yb, name_b}} {}
  std::vector<std::byte> wa, wb;
  std::vector<float> x, ya, yb;
  std::string name_a, name_b;
  MatmulProduct products[2];
};

TEST(WeightMatmul, ManyProductsWithAnEpilogueNeedOneRowCount) {
  TwoProducts two(4, 64, 8, 64, "up", "gate");
  mixkv::testing::expect_error(
      [&] { matmul_many(two.products, two.x, nullptr, [](std::int64_t, std::int64_t) {}); },
      ErrorCode::kInvalidInput, {"layer 0 gate", "8 rows", "layer 0 up", "same number of rows"});
}

TEST(WeightMatmul, ManyProductsNeedOneColumnCount) {
  TwoProducts two(4, 64, 4, 96, "q", "k");
  mixkv::testing::expect_error([&] { matmul_many(two.products, two.x); }, ErrorCode::kInvalidInput,
                               {"layer 0 k", "96 columns", "layer 0 q", "same number"});
}

TEST(WeightMatmul, RefusesShapesThatDoNotMatch) {
  using mixkv::testing::expect_error;
  std::vector<std::byte> w(static_cast<std::size_t>(weight_bytes(WeightType::kQ4_0, 4, 64)));
  std::vector<float> x(64), y(4);
  expect_error(
      [&] {
        matmul({WeightType::kQ4_0, 4, 48, w.data()}, x, y, nullptr, "layer 3 up");
      },
      ErrorCode::kInvalidInput, {"layer 3 up", "q4_0", "blocks of 32", "48"});
  expect_error(
      [&] {
        matmul({WeightType::kQ4_0, 4, 64, w.data()}, std::span(x).first(60), y);
      },
      ErrorCode::kInvalidInput, {"x holds 60 floats", "rows of 64"});
  expect_error(
      [&] {
        matmul({WeightType::kQ4_0, 4, 64, w.data()}, x, std::span(y).first(3));
      },
      ErrorCode::kInvalidInput, {"y holds 3 floats", "need 4"});
  expect_error(
      [&] {
        matmul({WeightType::kQ4_0, 4, 64, nullptr}, x, y);
      },
      ErrorCode::kInvalidInput, {"no data"});
  expect_error(
      [&] {
        matmul({WeightType::kQ4_0, 0, 64, w.data()}, x, y);
      },
      ErrorCode::kInvalidInput, {"must be positive"});
  expect_error(
      [&] {
        matmul({WeightType::kQ4_0, 4, 64, w.data()}, {}, y);
      },
      ErrorCode::kInvalidInput, {"x holds 0 floats"});
  std::vector<float> row(64);
  expect_error(
      [&] {
        dequantize_row({WeightType::kQ4_0, 4, 64, w.data()}, 4, row);
      },
      ErrorCode::kInvalidInput, {"row 4", "4 rows"});
}

}  // namespace
}  // namespace mixkv::kernels
