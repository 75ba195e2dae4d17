// The runner's row operations that batch rows for speed give each row the bits of the one-row
// operation.
#include "runner/ops.hpp"

#include <gtest/gtest.h>

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
  // Magnitudes spread over 2^-20 .. 2^20, so a row's double sum rounds, and its order shows.
  for (std::int64_t rows : {1, 2, 3, 4, 5, 7, 8, 9, 16}) {
    std::vector<float> x(static_cast<std::size_t>(rows * kWidth));
    for (float& v : x) v = std::ldexp(value(rng), exponent(rng));
    std::vector<float> expected(x.size()), got(x.size());
    for (std::int64_t r = 0; r < rows; ++r) {
      ops::rms_norm(x.data() + r * kWidth, w, kWidth, 1e-5, expected.data() + r * kWidth);
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
