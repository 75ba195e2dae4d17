// Element conversion between float and the KV-cache element types (bf16, fp16, fp32, fp8 e4m3fn
// and e5m2), bit-exact and round-to-nearest-even, so what the kernels read back is exactly what a
// GPU cache write would have stored. fp8 values carry one per-tensor scale: stored = x / scale.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "mixkv/core/dtype.hpp"

namespace mixkv::kernels {

// Scalar conversions. Encoding rounds to nearest, ties to even. bf16 and fp16 overflow to
// infinity like IEEE casts; fp8 saturates to the largest finite value (CUDA's __NV_SATFINITE,
// what vLLM's cache writes use), infinities included. NaN stays NaN in every format.
std::uint16_t float_to_bf16(float x);
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_fp16(float x);
float fp16_to_float(std::uint16_t bits);
std::uint8_t float_to_fp8_e4m3(float x);
float fp8_e4m3_to_float(std::uint8_t bits);
std::uint8_t float_to_fp8_e5m2(float x);
float fp8_e5m2_to_float(std::uint8_t bits);

// Throws Error (kUnsupported) for a dtype the kernels cannot read (nvfp4), naming `where`.
void check_cache_dtype(DType dtype, std::string_view where);

// Bytes of one element; throws like check_cache_dtype.
int element_bytes(DType dtype);

// Rounding error of one stored element: |decode(encode(x)) - x| <= relative * |x| + absolute
// (before the fp8 scale; multiply `absolute` by it) for x inside the finite range.
struct RoundingBound {
  double relative = 0;
  double absolute = 0;
};
RoundingBound rounding_bound(DType dtype);

// Row conversions over host-endian (little-endian) bytes. `scale` multiplies fp8 values on
// decode and divides them on encode; other dtypes require scale == 1 (checked by the callers
// that take scales from users). `bytes` must hold values.size() elements.
void decode_row(DType dtype, std::span<const std::byte> bytes, float scale,
                std::span<float> values);
void encode_row(DType dtype, std::span<const float> values, float scale,
                std::span<std::byte> bytes);

// Unchecked forms for the kernels' inner loops (no dtype or size checks).
void decode_row_unchecked(DType dtype, const std::byte* bytes, std::size_t count, float scale,
                          float* values);

}  // namespace mixkv::kernels
