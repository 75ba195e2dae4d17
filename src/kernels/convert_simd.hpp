// The Highway row encoders behind encode_row (convert_simd.cpp): fp16 and bf16, bit for bit the
// scalar float_to_fp16 / float_to_bf16 on every instruction set.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mixkv::kernels::detail {

void encode_fp16_row(const float* values, std::size_t count, std::uint16_t* out);
void encode_bf16_row(const float* values, std::size_t count, std::uint16_t* out);

}  // namespace mixkv::kernels::detail
