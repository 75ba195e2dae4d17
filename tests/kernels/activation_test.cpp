// mixkv's SiLU (activation.hpp): the vector rows give the scalar's bits on every instruction set
// and at every offset, the exponential is the correctly rounded float one (against long double)
// and std::exp's within an ulp, and the edges (zeros, infinities, NaN, overflow, subnormal
// results) follow x / (1 + e^-x).
#include "mixkv/kernels/activation.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mixkv/core/error.hpp"
#include "mixkv/kernels/simd_targets.hpp"

namespace mixkv::kernels {
namespace {

constexpr float kActInf = std::numeric_limits<float>::infinity();

// Gate values over the whole range SiLU meets and beyond it, with the edges.
std::vector<float> activation_gates() {
  std::vector<float> g = {-0x1.62e430p+6f, -0x1.62e42ep+6f, 0.0f,   -0.0f,   1.0f,      -1.0f,
                          88.9f,           89.5f,           -89.5f, 103.9f,  104.5f,    -104.5f,
                          87.3f,           -87.3f,          1e-30f, -1e-30f, 0x1p-149f, kActInf,
                          -kActInf,        20.0f,           -20.0f, 0.5f,    -0.5f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-110.0f, 110.0f), narrow(-8.0f, 8.0f);
  for (int i = 0; i < 20000; ++i) g.push_back(i % 2 == 0 ? wide(rng) : narrow(rng));
  return g;
}

std::uint32_t act_bits(float x) { return std::bit_cast<std::uint32_t>(x); }

TEST(Activation, SiluMulGivesTheScalarBitsOnEveryTargetAndOffset) {
  const std::vector<float> gate = activation_gates();
  std::vector<float> up(gate.size());
  for (std::size_t i = 0; i < up.size(); ++i) up[i] = 0.25f + static_cast<float>(i % 13);
  for_each_simd_target([&](const std::string& target) {
    for (std::size_t offset : {0, 1, 3, 7}) {  // rows that start mid-vector, tails of any length
      std::vector<float> got(up.begin() + static_cast<std::ptrdiff_t>(offset), up.end());
      silu_mul(std::span(gate).subspan(offset), got);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const float g = gate[offset + i];
        const float want = up[offset + i] * silu(g);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[i])) << target << " gate " << g;
        } else {
          ASSERT_EQ(act_bits(got[i]), act_bits(want)) << target << " gate " << g << " at " << i;
        }
      }
    }
  });
}

TEST(Activation, ExpIsTheRoundedFloatExponential) {
  std::size_t differs_from_std = 0, finite = 0;
  for (float x : activation_gates()) {
    if (!std::isfinite(x)) continue;
    ++finite;
    const float got = exp_rounded(x);
    const auto exact = static_cast<float>(std::exp(static_cast<long double>(x)));
    ASSERT_EQ(act_bits(got), act_bits(exact)) << "x " << x;
    const float libm = std::exp(x);
    differs_from_std += act_bits(got) != act_bits(libm);
    ASSERT_LE(std::abs(static_cast<std::int64_t>(act_bits(got)) -
                       static_cast<std::int64_t>(act_bits(libm))),
              1)
        << "x " << x;
  }
  // glibc's expf is within an ulp but not always the nearest float: 7 of these 20,000 inputs.
  EXPECT_LE(differs_from_std, finite / 1000);
}

TEST(Activation, EdgesFollowTheFormula) {
  EXPECT_EQ(act_bits(silu(0.0f)), act_bits(0.0f));
  EXPECT_EQ(silu(kActInf), kActInf);
  EXPECT_TRUE(std::isnan(silu(-kActInf)));  // -inf / (1 + inf)
  EXPECT_TRUE(std::isnan(silu(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(act_bits(silu(-200.0f)), act_bits(-0.0f));  // e^200 is +inf as a float
  EXPECT_EQ(silu(200.0f), 200.0f);
  EXPECT_EQ(exp_rounded(-104.5f), 0.0f);
  EXPECT_EQ(exp_rounded(89.5f), kActInf);
  // The float overflow edge: the first input whose exponential rounds past float's largest.
  EXPECT_EQ(exp_rounded(0x1.62e430p+6f), kActInf);
  const float below = exp_rounded(std::nextafter(0x1.62e430p+6f, 0.0f));
  EXPECT_TRUE(std::isfinite(below));
  EXPECT_GT(below, 3.4e38f);
  EXPECT_EQ(exp_rounded(-100.0f), static_cast<float>(std::exp(-100.0L)));  // a subnormal
  EXPECT_GT(exp_rounded(-100.0f), 0.0f);
  EXPECT_EQ(exp_rounded(0.0f), 1.0f);
  EXPECT_NEAR(silu(2.0f), 2.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

TEST(Activation, SiluMulRefusesSpansOfDifferentSizes) {
  std::vector<float> gate(4), up(5);
  EXPECT_THROW(silu_mul(gate, up), Error);
}

}  // namespace
}  // namespace mixkv::kernels
