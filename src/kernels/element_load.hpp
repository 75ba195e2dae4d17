// Inline element decoding shared by the conversion module and the attention kernel's inner loop
// (which is compiled once per instruction set; these inline into each copy).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mixkv/core/dtype.hpp"

namespace mixkv::kernels::detail {

inline float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

inline float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7FFFu;
  // Exponent and mantissa moved into float position, then rebiased by 2^(127-15): exact for
  // normal and subnormal halves alike.
  float v = std::bit_cast<float>(em << 13) * 0x1p112f;
  if (em >= 0x7C00u) v = std::bit_cast<float>(0x7F800000u | ((em & 0x3FFu) << 13));
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
}

inline std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v = 0;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The 256 values of an fp8 format (e4m3fn or e5m2), unscaled.
const float* fp8_table(DType dtype);

// Decodes `count` elements; `table` is fp8_table(dtype) for fp8 dtypes (else unused).
inline void load_row(DType dtype, const float* table, const std::byte* bytes, std::size_t count,
                     float scale, float* values) {
  if (count == 0) return;  // an MLA layer's empty V rows: no pointers to hand memcpy
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(values, bytes, count * sizeof(float));
      return;
    case DType::kBfloat16:
      for (std::size_t i = 0; i < count; ++i)
        values[i] = bf16_bits_to_float(load_u16(bytes + 2 * i));
      return;
    case DType::kFloat16:
      for (std::size_t i = 0; i < count; ++i)
        values[i] = fp16_bits_to_float(load_u16(bytes + 2 * i));
      return;
    default:
      for (std::size_t i = 0; i < count; ++i)
        values[i] = table[static_cast<std::uint8_t>(bytes[i])] * scale;
      return;
  }
}

}  // namespace mixkv::kernels::detail
