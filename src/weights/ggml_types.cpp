#include "mixkv/weights/ggml_types.hpp"

#include <array>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::weights {
namespace {

constexpr int kQKK = 256;  // elements per super-block of the k-quants and i-quants (QK_K)

// Block sizes from ggml-common.h's block_* structs (ggml_half is 2 bytes).
constexpr std::array<GgmlTypeInfo, 32> kTypes{{
    {GgmlType::kF32, "F32", 1, 4},
    {GgmlType::kF16, "F16", 1, 2},
    {GgmlType::kQ4_0, "Q4_0", kLegacyBlock, 2 + kLegacyBlock / 2},
    {GgmlType::kQ4_1, "Q4_1", kLegacyBlock, 2 + 2 + kLegacyBlock / 2},
    {GgmlType::kQ5_0, "Q5_0", kLegacyBlock, 2 + 4 + kLegacyBlock / 2},
    {GgmlType::kQ5_1, "Q5_1", kLegacyBlock, 2 + 2 + 4 + kLegacyBlock / 2},
    {GgmlType::kQ8_0, "Q8_0", kLegacyBlock, 2 + kLegacyBlock},
    {GgmlType::kQ8_1, "Q8_1", kLegacyBlock, 2 + 2 + kLegacyBlock},
    {GgmlType::kQ2_K, "Q2_K", kQKK, 2 + 2 + kQKK / 16 + kQKK / 4},
    {GgmlType::kQ3_K, "Q3_K", kQKK, 2 + kQKK / 4 + kQKK / 8 + 12},
    {GgmlType::kQ4_K, "Q4_K", kQKK, 2 + 2 + 12 + kQKK / 2},
    {GgmlType::kQ5_K, "Q5_K", kQKK, 2 + 2 + 12 + kQKK / 8 + kQKK / 2},
    {GgmlType::kQ6_K, "Q6_K", kQKK, 2 + kQKK / 2 + kQKK / 4 + kQKK / 16},
    {GgmlType::kQ8_K, "Q8_K", kQKK, 4 + kQKK + kQKK / 8},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", kQKK, 2 + kQKK / 4},
    {GgmlType::kIQ2_XS, "IQ2_XS", kQKK, 2 + kQKK / 4 + kQKK / 32},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", kQKK, 2 + kQKK / 4 + kQKK / 8},
    {GgmlType::kIQ1_S, "IQ1_S", kQKK, 2 + kQKK / 8 + kQKK / 16},
    {GgmlType::kIQ4_NL, "IQ4_NL", kLegacyBlock, 2 + kLegacyBlock / 2},
    {GgmlType::kIQ3_S, "IQ3_S", kQKK, 2 + kQKK / 4 + kQKK / 8 + kQKK / 32 + 4},
    {GgmlType::kIQ2_S, "IQ2_S", kQKK, 2 + kQKK / 4 + kQKK / 16},
    {GgmlType::kIQ4_XS, "IQ4_XS", kQKK, 2 + 2 + kQKK / 64 + kQKK / 2},
    {GgmlType::kI8, "I8", 1, 1},
    {GgmlType::kI16, "I16", 1, 2},
    {GgmlType::kI32, "I32", 1, 4},
    {GgmlType::kI64, "I64", 1, 8},
    {GgmlType::kF64, "F64", 1, 8},
    {GgmlType::kIQ1_M, "IQ1_M", kQKK, kQKK / 8 + kQKK / 16 + kQKK / 32},
    {GgmlType::kBF16, "BF16", 1, 2},
    {GgmlType::kTQ1_0, "TQ1_0", kQKK, 2 + 4 * 13},
    {GgmlType::kTQ2_0, "TQ2_0", kQKK, 2 + kQKK / 4},
    // An e8m0 scale byte, then 16 bytes of e2m1 pairs.
    {GgmlType::kMXFP4, "MXFP4", kLegacyBlock, 1 + kLegacyBlock / 2},
}};
}  // namespace

std::span<const GgmlTypeInfo> ggml_types() { return kTypes; }

const GgmlTypeInfo* find_ggml_type(std::uint32_t id) {
  for (const GgmlTypeInfo& t : kTypes) {
    if (static_cast<std::uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  if (const GgmlTypeInfo* t = find_ggml_type(static_cast<std::uint32_t>(type))) return *t;
  throw_internal(
      fmt::format("ggml type id {} is not in the type table", static_cast<std::uint32_t>(type)));
}

std::string_view to_string(GgmlType type) { return ggml_type_info(type).name; }

}  // namespace mixkv::weights
