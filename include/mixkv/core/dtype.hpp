// Element types of caches and recurrent states, and their exact storage size.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace mixkv {

enum class DType {
  kBfloat16,
  kFloat16,
  kFloat32,
  kFp8E4m3,
  kFp8E5m2,
  kNvfp4,  // 4-bit e2m1 data plus one fp8 scale per 16 elements
};

// Canonical names: "bfloat16", "float16", "float32", "fp8_e4m3", "fp8_e5m2", "nvfp4".
std::string_view to_string(DType dtype);

// Accepts the canonical names and common spellings ("bf16", "half", "fp16", "fp32", "float",
// "fp8" (= e4m3), "float8_e4m3fn", "fp4"). Returns nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view text);

// Names accepted by parse_dtype that the CLI advertises, canonical first.
std::span<const std::string_view> dtype_names();

// Bytes needed to store `elements` values of `dtype`, rounded up to whole bytes; nvfp4 counts its
// scales. Throws Error on overflow or a negative count.
std::int64_t storage_bytes(DType dtype, std::int64_t elements);

}  // namespace mixkv
