#include "mixkv/core/dtype.hpp"

#include <array>
#include <string>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/enum_names.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv {
namespace {

// Canonical spelling first for each type; later entries are accepted aliases (HF torch_dtype
// strings, vLLM's --kv-cache-dtype values and PyTorch names).
constexpr std::array kNames = {
    Named<DType>{"bfloat16", DType::kBfloat16},
    Named<DType>{"float16", DType::kFloat16},
    Named<DType>{"float32", DType::kFloat32},
    Named<DType>{"fp8_e4m3", DType::kFp8E4m3},
    Named<DType>{"fp8_e5m2", DType::kFp8E5m2},
    Named<DType>{"nvfp4", DType::kNvfp4},
    Named<DType>{"fp8", DType::kFp8E4m3},
    Named<DType>{"bf16", DType::kBfloat16},
    Named<DType>{"fp16", DType::kFloat16},
    Named<DType>{"half", DType::kFloat16},
    Named<DType>{"fp32", DType::kFloat32},
    Named<DType>{"float", DType::kFloat32},
    Named<DType>{"float8_e4m3fn", DType::kFp8E4m3},
    Named<DType>{"float8_e5m2", DType::kFp8E5m2},
    Named<DType>{"fp4", DType::kNvfp4},
};

constexpr std::array<std::string_view, 7> kAdvertised = {"bfloat16", "float16",  "float32", "fp8",
                                                         "fp8_e4m3", "fp8_e5m2", "nvfp4"};

// nvfp4 stores one fp8 scale for every block of this many elements.
constexpr std::int64_t kNvfp4ScaleBlock = 16;

}  // namespace

std::string_view to_string(DType dtype) { return name_of(kNames, dtype); }

std::optional<DType> parse_dtype(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (lower.starts_with("torch.")) lower.erase(0, 6);
  return value_of(kNames, std::string_view(lower));
}

std::span<const std::string_view> dtype_names() { return kAdvertised; }

std::int64_t storage_bytes(DType dtype, std::int64_t elements) {
  if (elements < 0) throw_internal("storage_bytes called with a negative element count");
  switch (dtype) {
    case DType::kFloat32:
      return checked_mul(elements, 4, "float32 storage size");
    case DType::kBfloat16:
    case DType::kFloat16:
      return checked_mul(elements, 2, "16-bit storage size");
    case DType::kFp8E4m3:
    case DType::kFp8E5m2:
      return elements;
    case DType::kNvfp4:
      return ceil_div(elements, 2) + ceil_div(elements, kNvfp4ScaleBlock);
  }
  throw_internal("storage_bytes: unknown dtype");
}

}  // namespace mixkv
