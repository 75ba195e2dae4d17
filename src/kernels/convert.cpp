#include "mixkv/kernels/convert.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "kernels/convert_simd.hpp"
#include "kernels/element_load.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::kernels {
namespace {

// A small binary float format: sign, `exp_bits` exponent bits with `bias`, `man_bits` mantissa
// bits, subnormals. `ieee` formats reserve the top exponent for inf/NaN; e4m3fn only reserves the
// all-ones code for NaN. Encoding and decoding run in double, where every step is exact except
// the one rounding (nearbyint, ties to even under the default rounding mode).
struct SmallFloat {
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee;
  std::uint32_t max_finite;  // code of the largest finite magnitude
  std::uint32_t inf;         // code of +inf (ieee formats)
  std::uint32_t nan;         // code of the canonical positive NaN
  bool saturate;             // out-of-range values clamp to max_finite instead of inf
};

constexpr SmallFloat kBf16{8, 7, 127, true, 0x7F7F, 0x7F80, 0x7FC0, false};
constexpr SmallFloat kFp16{5, 10, 15, true, 0x7BFF, 0x7C00, 0x7E00, false};
constexpr SmallFloat kE4m3{4, 3, 7, false, 0x7E, 0, 0x7F, true};
constexpr SmallFloat kE5m2{5, 2, 15, true, 0x7B, 0x7C, 0x7E, true};

std::uint32_t encode_small(const SmallFloat& f, float x) {
  const std::uint32_t sign = std::signbit(x) ? 1u << (f.exp_bits + f.man_bits) : 0u;
  if (std::isnan(x)) return sign | f.nan;
  const double ax = std::fabs(static_cast<double>(x));
  if (ax == 0) return sign;
  std::uint32_t code = 0;
  if (std::isinf(ax)) {
    code = f.max_finite + 1;  // overflow, resolved below
  } else {
    int e2 = 0;
    std::frexp(ax, &e2);  // ax = m * 2^e2, m in [0.5, 1)
    const int min_exp = 1 - f.bias;
    const int e = std::max(e2 - 1, min_exp);
    // Units of the last place at exponent e; q in [0, 2^(man_bits+1)].
    const double q = std::nearbyint(std::ldexp(ax, f.man_bits - e));
    const auto qi = static_cast<std::uint64_t>(q);
    const std::uint64_t hidden = std::uint64_t{1} << f.man_bits;
    std::uint64_t wide = 0;
    if (qi < hidden) {
      wide = qi;  // subnormal (only reachable at e == min_exp)
    } else {
      // Biased exponent field (e + bias) above the mantissa; a carry into 2^(man_bits+1)
      // lands on the next exponent with a zero mantissa by itself.
      wide = (static_cast<std::uint64_t>(e + f.bias) << f.man_bits) + (qi - hidden);
    }
    code = wide > f.max_finite ? f.max_finite + 1 : static_cast<std::uint32_t>(wide);
  }
  if (code > f.max_finite) code = f.saturate ? f.max_finite : f.inf;
  return sign | code;
}

double decode_small(const SmallFloat& f, std::uint32_t bits) {
  const std::uint32_t man_mask = (1u << f.man_bits) - 1;
  const std::uint32_t exp_mask = (1u << f.exp_bits) - 1;
  const bool negative = (bits >> (f.exp_bits + f.man_bits)) & 1u;
  const std::uint32_t magnitude = bits & ((1u << (f.exp_bits + f.man_bits)) - 1);
  const std::uint32_t exp = (magnitude >> f.man_bits) & exp_mask;
  const std::uint32_t man = magnitude & man_mask;
  double v = 0;
  if (f.ieee && exp == exp_mask) {
    v = man == 0 ? HUGE_VAL : std::nan("");
  } else if (!f.ieee && magnitude == f.nan) {
    v = std::nan("");
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(man | (1u << f.man_bits)),
                   static_cast<int>(exp) - f.bias - f.man_bits);
  }
  return negative ? -v : v;
}

template <const SmallFloat& F>
std::array<float, 256> fp8_table() {
  std::array<float, 256> t{};
  for (std::uint32_t c = 0; c < 256; ++c) t[c] = static_cast<float>(decode_small(F, c));
  return t;
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = fp8_table<kE4m3>();
  return table;
}
const std::array<float, 256>& e5m2_table() {
  static const std::array<float, 256> table = fp8_table<kE5m2>();
  return table;
}

using detail::bf16_bits_to_float;
using detail::fp16_bits_to_float;

}  // namespace

std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // keep it quiet
  // Round to nearest even on the 16 dropped bits; a carry into the exponent is the right answer
  // (up to infinity).
  const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}
float bf16_to_float(std::uint16_t bits) { return bf16_bits_to_float(bits); }

// The same rounding as encode_small(kFp16, x) in integer steps on the float's bits (the KV cache
// write and the block products' scales run it per element; convert_simd.cpp does these steps
// per vector lane). Normal halves: the exponent rebiased by 127 - 15 (a subtraction from the
// whole magnitude) and the 13 dropped mantissa bits rounded to nearest even; a carry moves into
// the exponent, up to infinity at 65520. Subnormal halves: |x| + 0.5 lies in [0.5, 1), where a
// float's unit in the last place is fp16's smallest subnormal 2^-24, so the float add rounds |x|
// to a multiple of it (ties to even) and the mantissa bits above 0.5's are the code (0x400, the
// smallest normal, when it rounds up).
std::uint16_t float_to_fp16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  std::uint32_t code = 0;
  if (a > 0x7F800000u) {
    code = kFp16.nan;
  } else if (a > 0x477FEFFFu) {  // at or above 65520, infinity included
    code = kFp16.inf;
  } else if (a < 0x38800000u) {  // below 2^-14
    code = std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3F000000u;
  } else {
    const std::uint32_t rebiased = a - 0x38000000u;
    code = (rebiased + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  }
  return static_cast<std::uint16_t>(sign | code);
}
float fp16_to_float(std::uint16_t bits) { return fp16_bits_to_float(bits); }

std::uint8_t float_to_fp8_e4m3(float x) {
  return static_cast<std::uint8_t>(encode_small(kE4m3, x));
}
float fp8_e4m3_to_float(std::uint8_t bits) { return e4m3_table()[bits]; }

std::uint8_t float_to_fp8_e5m2(float x) {
  return static_cast<std::uint8_t>(encode_small(kE5m2, x));
}
float fp8_e5m2_to_float(std::uint8_t bits) { return e5m2_table()[bits]; }

void check_cache_dtype(DType dtype, std::string_view where) {
  if (dtype == DType::kNvfp4) {
    throw_unsupported(fmt::format(
        "{}: the CPU attention kernels do not read {} caches yet; use bfloat16, float16, float32, "
        "fp8_e4m3 or fp8_e5m2",
        where, to_string(dtype)));
  }
}

int element_bytes(DType dtype) {
  check_cache_dtype(dtype, "element_bytes");
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBfloat16:
    case DType::kFloat16:
      return 2;
    default:
      return 1;
  }
}

RoundingBound rounding_bound(DType dtype) {
  check_cache_dtype(dtype, "rounding_bound");
  // Half a unit in the last place relative to the value, and half the smallest subnormal.
  auto of = [](const SmallFloat& f) {
    return RoundingBound{std::ldexp(1.0, -(f.man_bits + 1)),
                         std::ldexp(1.0, 1 - f.bias - f.man_bits - 1)};
  };
  switch (dtype) {
    case DType::kFloat32:
      return RoundingBound{0, 0};
    case DType::kBfloat16:
      return of(kBf16);
    case DType::kFloat16:
      return of(kFp16);
    case DType::kFp8E4m3:
      return of(kE4m3);
    default:
      return of(kE5m2);
  }
}

const float* detail::fp8_table(DType dtype) {
  return dtype == DType::kFp8E4m3 ? e4m3_table().data() : e5m2_table().data();
}

void decode_row_unchecked(DType dtype, const std::byte* bytes, std::size_t count, float scale,
                          float* values) {
  if (dtype == DType::kNvfp4) throw_internal("decode_row_unchecked: unsupported dtype");
  detail::load_row(dtype, detail::fp8_table(dtype), bytes, count, scale, values);
}

void decode_row(DType dtype, std::span<const std::byte> bytes, float scale,
                std::span<float> values) {
  const auto need = static_cast<std::size_t>(element_bytes(dtype)) * values.size();
  if (bytes.size() < need) {
    throw_internal(fmt::format("decode_row: {} bytes cannot hold {} {} values", bytes.size(),
                               values.size(), to_string(dtype)));
  }
  decode_row_unchecked(dtype, bytes.data(), values.size(), scale, values.data());
}

void encode_row(DType dtype, std::span<const float> values, float scale,
                std::span<std::byte> bytes) {
  const auto size = static_cast<std::size_t>(element_bytes(dtype));
  if (bytes.size() < size * values.size()) {
    throw_internal(fmt::format("encode_row: {} bytes cannot hold {} {} values", bytes.size(),
                               values.size(), to_string(dtype)));
  }
  std::byte* out = bytes.data();
  // 16-bit rows through the vector encoders (the same bits; a row at an odd address, which no
  // cache layout makes, element by element below).
  const bool aligned = reinterpret_cast<std::uintptr_t>(out) % alignof(std::uint16_t) == 0;
  if (aligned && (dtype == DType::kFloat16 || dtype == DType::kBfloat16)) {
    auto* out16 = reinterpret_cast<std::uint16_t*>(out);
    if (dtype == DType::kFloat16) {
      detail::encode_fp16_row(values.data(), values.size(), out16);
    } else {
      detail::encode_bf16_row(values.data(), values.size(), out16);
    }
    return;
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float x = values[i];
    switch (dtype) {
      case DType::kFloat32:
        std::memcpy(out + 4 * i, &x, 4);
        break;
      case DType::kBfloat16: {
        const std::uint16_t b = float_to_bf16(x);
        std::memcpy(out + 2 * i, &b, 2);
        break;
      }
      case DType::kFloat16: {
        const std::uint16_t b = float_to_fp16(x);
        std::memcpy(out + 2 * i, &b, 2);
        break;
      }
      case DType::kFp8E4m3:
        out[i] = static_cast<std::byte>(float_to_fp8_e4m3(x / scale));
        break;
      case DType::kFp8E5m2:
        out[i] = static_cast<std::byte>(float_to_fp8_e5m2(x / scale));
        break;
      case DType::kNvfp4:
        throw_internal("encode_row: unsupported dtype");
    }
  }
}

}  // namespace mixkv::kernels
