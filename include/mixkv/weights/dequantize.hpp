// Decoding ggml tensor types to float, exactly as ggml's block definitions say (ggml-common.h
// and ggml-quants.c of ggml-org/ggml). For every type here each value is a small integer times an
// fp16 scale (plus an fp16 offset): the product is exact in float, so the only rounding is the
// final add and the result is the same whether or not a compiler fuses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mixkv/weights/ggml_types.hpp"
#include "mixkv/weights/gguf.hpp"

namespace mixkv::weights {

// Types dequantize() decodes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
bool can_dequantize(GgmlType type);

// Bytes that `elements` values of `type` take; Error when `elements` is not a whole number of
// blocks.
std::int64_t ggml_bytes(GgmlType type, std::int64_t elements);

// Decodes dst.size() values (whole blocks) from `src`, which must hold exactly their bytes.
// Throws Error (unsupported) for a type outside can_dequantize(), (invalid input) for sizes that
// do not match.
void dequantize(GgmlType type, std::span<const std::byte> src, std::span<float> dst);

// The whole tensor, row-major in its shape.
std::vector<float> dequantize(const GgufTensor& tensor);

}  // namespace mixkv::weights
