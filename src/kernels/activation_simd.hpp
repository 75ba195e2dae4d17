// The constants of activation.cpp's exponential, shared by its scalar and vector steps, and the
// vector row behind silu_mul (activation_simd.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mixkv::kernels::detail {

namespace exp_steps {
// Inputs outside [kLowest, kHighest] round to 0 or +inf as floats either way.
inline constexpr double kLowest = -104.0;
inline constexpr double kHighest = 89.0;
inline constexpr double kLog2e = 0x1.71547652b82fep+0;
// ln 2 in two parts, the first with 32 significant bits, so k * kLn2Hi is exact for |k| < 2^20.
inline constexpr double kLn2Hi = 0x1.62e42feep-1;
inline constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
// e^r = sum of r^n / n!, n = 0..11, in Horner's order from the highest term; |r| <= ln 2 / 2,
// where the first term left out is below 2^-47 of the sum.
inline constexpr int kTerms = 12;
inline constexpr double kTaylor[kTerms] = {1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320,
                                           1.0 / 5040,     1.0 / 720,     1.0 / 120,    1.0 / 24,
                                           1.0 / 6,        1.0 / 2,       1.0,          1.0};
// k + 1.5 * 2^52 holds the integer k in its low mantissa bits (|k| < 2^51).
inline constexpr double kShifter = 0x1.8p52;
inline constexpr std::uint64_t kShifterBits = 0x4338000000000000ull;
}  // namespace exp_steps

void silu_mul_row(const float* gate, float* up, std::size_t count);

}  // namespace mixkv::kernels::detail
