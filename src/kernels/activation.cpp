// SiLU with a double-precision exponential (activation.hpp). The scalar steps below and the
// vector steps of activation_simd.cpp are the same IEEE double operations in the same order, no
// multiply-add fused (this file and that one compile with -ffp-contract=off), so both give the
// same bits on every target.
#include "mixkv/kernels/activation.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "kernels/activation_simd.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::kernels {

float exp_rounded(float x) {
  using namespace detail::exp_steps;
  const double v = std::min(std::max(static_cast<double>(x), kLowest), kHighest);
  const double k = std::nearbyint(v * kLog2e);
  const double r = (v - k * kLn2Hi) - k * kLn2Lo;
  double p = kTaylor[0];
  for (int i = 1; i < kTerms; ++i) p = p * r + kTaylor[i];
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(k + kShifter);
  const double scale = std::bit_cast<double>((bits - kShifterBits + 1023) << 52);
  return static_cast<float>(p * scale);  // a NaN x stays NaN through every step
}

float silu(float x) { return x / (1.0f + exp_rounded(-x)); }

void silu_mul(std::span<const float> gate, std::span<float> up) {
  if (gate.size() != up.size()) {
    throw_invalid(fmt::format("silu_mul: {} gate values for {} up values", gate.size(), up.size()));
  }
  detail::silu_mul_row(gate.data(), up.data(), up.size());
}

}  // namespace mixkv::kernels
