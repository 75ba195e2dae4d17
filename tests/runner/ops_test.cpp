// The runner's row operations that batch rows for speed give each row the bits of the one-row
// operation, and those are ggml's steps.
#include "runner/ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace mixkv::runner {
namespace {

TEST(RmsNormRows, EachRowHasTheBitsOfItsOwnRmsNorm) {
  constexpr std::int64_t kWidth = 576;  // SmolLM2's hidden size
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> w(kWidth);
  for (float& v : w) v = value(rng);
  // Magnitudes spread over 2^-20 .. 2^20, rows unlike each other (a sum or scale taken from the
  // wrong row shows; the double sum's order rarely reaches the float mean).
  for (std::int64_t rows : {1, 2, 3, 4, 5, 7, 8, 9, 16}) {
    std::vector<float> x(static_cast<std::size_t>(rows * kWidth));
    for (float& v : x) v = std::ldexp(value(rng), exponent(rng));
    std::vector<float> expected(x.size()), got(x.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      // ggml's steps, one row at a time: squares in float, summed in double in order.
      const float* xr = x.data() + r * kWidth;
      double ss = 0.0;
      for (std::int64_t i = 0; i < kWidth; ++i) ss += static_cast<double>(xr[i] * xr[i]);
      const auto mean = static_cast<float>(ss / static_cast<double>(kWidth));
      const float inv = 1.0f / std::sqrt(mean + static_cast<float>(1e-5));
      for (std::int64_t i = 0; i < kWidth; ++i) {
        expected[static_cast<std::size_t>(r * kWidth + i)] =
            xr[i] * inv * w[static_cast<std::size_t>(i)];
      }
      std::vector<float> one(static_cast<std::size_t>(kWidth));
      ops::rms_norm(xr, w, kWidth, 1e-5, one.data());
      EXPECT_EQ(std::memcmp(one.data(), expected.data() + r * kWidth, one.size() * sizeof(float)),
                0);
    }
    ops::rms_norm_rows(x.data(), rows, w, kWidth, 1e-5, got.data());
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << rows << " rows";
    // In place, as the runner normalises a block's output rows.
    ops::rms_norm_rows(x.data(), rows, w, kWidth, 1e-5, x.data());
    EXPECT_EQ(std::memcmp(x.data(), expected.data(), x.size() * sizeof(float)), 0)
        << rows << " rows in place";
  }
}

}  // namespace
}  // namespace mixkv::runner
