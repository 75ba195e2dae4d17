#include "mixkv/weights/dequantize.hpp"

#include <cstring>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "mixkv/kernels/convert.hpp"

namespace mixkv::weights {
namespace {

float f16_at(const std::byte* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return kernels::fp16_to_float(bits);
}

std::uint8_t u8_at(const std::byte* p) { return std::to_integer<std::uint8_t>(*p); }

// block_q4_0 {fp16 d; u8 qs[16]}: value j is (low nibble of qs[j] - 8) * d, value j+16 the high
// nibble's.
void q4_0(const std::byte* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < kLegacyBlock / 2; ++j) {
    const int q = u8_at(b + 2 + j);
    y[j] = float((q & 0x0F) - 8) * d;
    y[j + kLegacyBlock / 2] = float((q >> 4) - 8) * d;
  }
}

// block_q4_1 {fp16 d; fp16 m; u8 qs[16]}: nibble * d + m, same order as Q4_0.
void q4_1(const std::byte* b, float* y) {
  const float d = f16_at(b);
  const float m = f16_at(b + 2);
  for (int j = 0; j < kLegacyBlock / 2; ++j) {
    const int q = u8_at(b + 4 + j);
    y[j] = float(q & 0x0F) * d + m;
    y[j + kLegacyBlock / 2] = float(q >> 4) * d + m;
  }
}

// The fifth bit of value j (and of value j+16) in the 32-bit qh field of Q5_0 / Q5_1.
std::uint32_t qh_at(const std::byte* p) {
  std::uint32_t qh;
  std::memcpy(&qh, p, 4);
  return qh;
}

// block_q5_0 {fp16 d; u8 qh[4]; u8 qs[16]}: (nibble | bit << 4) - 16, times d.
void q5_0(const std::byte* b, float* y) {
  const float d = f16_at(b);
  const std::uint32_t qh = qh_at(b + 2);
  for (int j = 0; j < kLegacyBlock / 2; ++j) {
    const int q = u8_at(b + 6 + j);
    const int lo = (q & 0x0F) | int(((qh >> j) & 1u) << 4);
    const int hi = (q >> 4) | int(((qh >> (j + kLegacyBlock / 2)) & 1u) << 4);
    y[j] = float(lo - 16) * d;
    y[j + kLegacyBlock / 2] = float(hi - 16) * d;
  }
}

// block_q5_1 {fp16 d; fp16 m; u8 qh[4]; u8 qs[16]}: (nibble | bit << 4) * d + m.
void q5_1(const std::byte* b, float* y) {
  const float d = f16_at(b);
  const float m = f16_at(b + 2);
  const std::uint32_t qh = qh_at(b + 4);
  for (int j = 0; j < kLegacyBlock / 2; ++j) {
    const int q = u8_at(b + 8 + j);
    const int lo = (q & 0x0F) | int(((qh >> j) & 1u) << 4);
    const int hi = (q >> 4) | int(((qh >> (j + kLegacyBlock / 2)) & 1u) << 4);
    y[j] = float(lo) * d + m;
    y[j + kLegacyBlock / 2] = float(hi) * d + m;
  }
}

// block_q8_0 {fp16 d; i8 qs[32]}: qs[j] * d. block_q8_1 adds an fp16 sum after d (unused here).
void q8(const std::byte* b, int header, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < kLegacyBlock; ++j) {
    y[j] = float(static_cast<std::int8_t>(u8_at(b + header + j))) * d;
  }
}
void q8_0(const std::byte* b, float* y) { q8(b, 2, y); }
void q8_1(const std::byte* b, float* y) { q8(b, 4, y); }

void f32(const std::byte* b, float* y) { std::memcpy(y, b, 4); }
void f16(const std::byte* b, float* y) { *y = f16_at(b); }
void bf16(const std::byte* b, float* y) {
  std::uint16_t bits;
  std::memcpy(&bits, b, 2);
  *y = kernels::bf16_to_float(bits);
}

using BlockFn = void (*)(const std::byte*, float*);

BlockFn block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return f32;
    case GgmlType::kF16:
      return f16;
    case GgmlType::kBF16:
      return bf16;
    case GgmlType::kQ4_0:
      return q4_0;
    case GgmlType::kQ4_1:
      return q4_1;
    case GgmlType::kQ5_0:
      return q5_0;
    case GgmlType::kQ5_1:
      return q5_1;
    case GgmlType::kQ8_0:
      return q8_0;
    case GgmlType::kQ8_1:
      return q8_1;
    default:
      return nullptr;
  }
}

}  // namespace

bool can_dequantize(GgmlType type) { return block_decoder(type) != nullptr; }

std::int64_t ggml_bytes(GgmlType type, std::int64_t elements) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  if (elements < 0 || elements % info.block_elements != 0) {
    throw_invalid(fmt::format("{} values of {} are not a whole number of its {}-value blocks",
                              elements, info.name, info.block_elements));
  }
  return elements / info.block_elements * info.block_bytes;
}

void dequantize(GgmlType type, std::span<const std::byte> src, std::span<float> dst) {
  const BlockFn decode = block_decoder(type);
  if (decode == nullptr) {
    throw_unsupported(
        fmt::format("mixkv cannot decode ggml type {} yet; supported: F32, F16, "
                    "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1",
                    to_string(type)));
  }
  const GgmlTypeInfo& info = ggml_type_info(type);
  const auto n = static_cast<std::int64_t>(dst.size());
  const std::int64_t bytes = ggml_bytes(type, n);
  if (bytes != static_cast<std::int64_t>(src.size())) {
    throw_invalid(fmt::format("{} values of {} take {} bytes, but {} were given", n, info.name,
                              bytes, src.size()));
  }
  const std::int64_t blocks = n / info.block_elements;
  for (std::int64_t i = 0; i < blocks; ++i) {
    decode(src.data() + i * info.block_bytes, dst.data() + i * info.block_elements);
  }
}

std::vector<float> dequantize(const GgufTensor& tensor) {
  std::vector<float> out(static_cast<std::size_t>(tensor.numel()));
  dequantize(tensor.type, tensor.bytes, out);
  return out;
}

}  // namespace mixkv::weights
