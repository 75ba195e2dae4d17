// Reading and writing HuggingFace safetensors checkpoints: an 8-byte little-endian header length,
// a JSON header naming each tensor's dtype, shape and byte range, then the raw data. The engine
// keeps weights as float; F32, F16 and BF16 files are read and written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "mixkv/core/dtype.hpp"

namespace mixkv::weights {

// One weight tensor: its values in float, row-major, and the dtype it is stored in on disk.
struct Tensor {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
  std::int64_t numel() const;
  bool operator==(const Tensor&) const = default;
};

using TensorMap = std::map<std::string, Tensor, std::less<>>;

// Parses a whole safetensors file held in memory. Throws Error naming `origin` and the tensor or
// header field at fault: a truncated header, invalid JSON, an unknown dtype, a shape whose bytes
// do not match its data_offsets, ranges outside the data or overlapping each other.
TensorMap parse_safetensors(std::span<const std::byte> file, const std::string& origin);
TensorMap read_safetensors(const std::string& path);

// Serialises `tensors`, each in its own dtype (float32, float16 or bfloat16; values rounded to
// nearest even), in name order. Throws Error for another dtype or values that do not match the
// shape.
std::vector<std::byte> serialize_safetensors(const TensorMap& tensors);
void write_safetensors(const std::string& path, const TensorMap& tensors);

}  // namespace mixkv::weights
