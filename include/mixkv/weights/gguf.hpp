// Reading GGUF files (ggml's single-file model format, docs/gguf.md of ggml-org/ggml): a header,
// typed metadata key/values, tensor infos, then the aligned tensor data. The file is memory-mapped
// read-only and every tensor is a view into the mapping: nothing is copied. Any malformed file is
// an Error (invalid input) naming the field at fault; counts and lengths are checked against the
// bytes left in the file before anything is allocated for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "mixkv/weights/ggml_types.hpp"
#include "mixkv/weights/mapped_file.hpp"

namespace mixkv::weights {

enum class GgufValueType : std::uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view to_string(GgufValueType type);

// One metadata value. Scalars and array elements are widened (unsigned integers to uint64,
// signed to int64, floats to double); `type` and `element_type` keep the stored type. Arrays of
// arrays nest as a vector of GgufValue.
struct GgufValue {
  using Data =
      std::variant<std::uint64_t, std::int64_t, double, bool, std::string,
                   std::vector<std::uint64_t>, std::vector<std::int64_t>, std::vector<double>,
                   std::vector<bool>, std::vector<std::string>, std::vector<GgufValue>>;
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType element_type = GgufValueType::kUint8;  // arrays only
  Data data;

  bool is_array() const { return type == GgufValueType::kArray; }
  std::size_t array_size() const;  // 0 for scalars
};

// One tensor: a view into the file. `shape` is row-major, outermost first (as in safetensors and
// PyTorch), which is GGUF's `ne` order reversed: shape.back() is the contiguous row, and
// quantisation blocks never cross a row.
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;  // from the start of the data section
  std::span<const std::byte> bytes;

  std::int64_t numel() const;
  std::int64_t row_elements() const { return shape.empty() ? 1 : shape.back(); }
  std::int64_t rows() const;  // numel() / row_elements()
};

class GgufFile {
 public:
  // Maps `path` and parses it. Throws Error naming the path and the field at fault.
  static GgufFile open(const std::string& path);
  // Parses bytes the caller owns (they must outlive the result); `origin` names them in errors.
  static GgufFile parse(std::span<const std::byte> bytes, std::string origin);

  // True when `bytes` start with the GGUF magic (cheap sniffing before a full parse).
  static bool has_magic(std::span<const std::byte> bytes);
  static bool file_has_magic(const std::string& path);

  const std::string& origin() const { return origin_; }
  // True for open()'s files: the tensors' bytes are a read-only shared mapping of the file, whose
  // pages may be dropped (madvise MADV_DONTNEED) and come back from the file when read again.
  bool mapped() const { return mapping_.has_value(); }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }  // start of the tensor data
  std::uint64_t file_size() const { return file_size_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;  // nullptr when absent

  // Typed lookups: nullopt when the key is absent; Error naming the key when its type does not
  // fit. Integers of any width convert when the value is in range; floats accept integers.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<std::uint64_t> get_uint(std::string_view key) const;
  std::optional<std::int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  // Arrays: nullptr / nullopt when absent; Error when the key is not an array of that kind.
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  std::optional<std::vector<std::int64_t>> get_int_array(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;  // nullptr when absent
  const GgufTensor& tensor(std::string_view name) const;       // throws naming it when absent

 private:
  GgufFile() = default;
  [[noreturn]] void fail_type(std::string_view key, const GgufValue& value,
                              std::string_view expected) const;

  std::optional<MappedFile> mapping_;
  std::string origin_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::uint64_t file_size_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, std::size_t, std::less<>> metadata_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace mixkv::weights
