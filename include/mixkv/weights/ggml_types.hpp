// The tensor element types of ggml (the storage types of GGUF files): each type packs
// `block_elements` values into `block_bytes` bytes. Ids and block sizes follow ggml's
// `enum ggml_type` and `ggml-common.h` (ggml-org/ggml); ids ggml has retired are unknown here.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace mixkv::weights {

enum class GgmlType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

// Values per block of ggml's legacy quants (QK4_0, QK4_1, QK5_0, QK5_1 and QK8_0 of ggml-common.h).
inline constexpr int kLegacyBlock = 32;

struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;  // ggml's spelling: "F32", "Q4_1", "Q6_K", ...
  int block_elements;     // values per block
  int block_bytes;        // bytes per block
};

// Every type in the table, in id order.
std::span<const GgmlTypeInfo> ggml_types();
// The type with ggml id `id`, or nullptr when the id is not a type mixkv knows.
const GgmlTypeInfo* find_ggml_type(std::uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType type);
std::string_view to_string(GgmlType type);

}  // namespace mixkv::weights
