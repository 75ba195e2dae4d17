#include "mixkv/weights/gguf.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::weights {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host (GGUF files are little-endian)");

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr std::uint64_t kDefaultAlignment = 32;
constexpr std::uint64_t kMaxAlignment = std::uint64_t{1} << 30;
constexpr std::uint32_t kMaxDims = 4;       // GGML_MAX_DIMS
constexpr std::size_t kMaxTensorName = 64;  // docs/gguf.md: "at most 64 bytes long"
constexpr int kMaxArrayDepth = 4;           // arrays of arrays: no real file nests deeper
// Least bytes one entry takes in the file, to bound counts before allocating for them.
constexpr std::uint64_t kMinKvBytes = 8 + 4 + 1;              // key length, type, a one-byte value
constexpr std::uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset

// Sequential little-endian reads over the file; every read checks the bytes left and names the
// field being read when the file ends early.
class Cursor {
 public:
  Cursor(std::span<const std::byte> bytes, const std::string& origin)
      : bytes_(bytes), origin_(origin) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return bytes_.size() - pos_; }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(std::string_view what) {
    const auto n = read<std::uint64_t>(what);
    if (n > left()) {
      throw_invalid(
          fmt::format("{}: {} has length {} at byte {}, but only {} bytes are left in the "
                      "file; the file is truncated or corrupt",
                      origin_, what, n, pos_ - 8, left()));
    }
    std::string out(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return out;
  }

  // Refuses `count` entries of at least `min_bytes` each when the file cannot hold them.
  void check_count(std::uint64_t count, std::uint64_t min_bytes, std::string_view what) const {
    if (count > left() / min_bytes) {
      throw_invalid(
          fmt::format("{}: {} is {}, more than the {} bytes left in the file can hold; "
                      "the file is truncated or corrupt",
                      origin_, what, count, left()));
    }
  }

 private:
  void need(std::uint64_t n, std::string_view what) const {
    if (n > left()) {
      throw_invalid(fmt::format("{}: truncated: the file ends at byte {} inside {}", origin_,
                                bytes_.size(), what));
    }
  }

  std::span<const std::byte> bytes_;
  const std::string& origin_;
  std::uint64_t pos_ = 0;
};

std::uint64_t min_element_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kString:  // its length
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kArray:  // element type and count
      return 12;
  }
  return 1;
}

bool known_value_type(std::uint32_t id) { return id <= 12; }

// Reads one scalar of `type` (not an array) into its widened form.
template <typename Out>
Out read_widened(Cursor& in, GgufValueType type, std::string_view what) {
  switch (type) {
    case GgufValueType::kUint8:
      return Out(in.read<std::uint8_t>(what));
    case GgufValueType::kInt8:
      return Out(in.read<std::int8_t>(what));
    case GgufValueType::kUint16:
      return Out(in.read<std::uint16_t>(what));
    case GgufValueType::kInt16:
      return Out(in.read<std::int16_t>(what));
    case GgufValueType::kUint32:
      return Out(in.read<std::uint32_t>(what));
    case GgufValueType::kInt32:
      return Out(in.read<std::int32_t>(what));
    case GgufValueType::kUint64:
      return Out(in.read<std::uint64_t>(what));
    case GgufValueType::kInt64:
      return Out(in.read<std::int64_t>(what));
    case GgufValueType::kFloat32:
      return Out(in.read<float>(what));
    case GgufValueType::kFloat64:
      return Out(in.read<double>(what));
    default:
      break;
  }
  throw_internal("read_widened: not a number type");
}

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}
bool is_float(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

GgufValueType read_value_type(Cursor& in, const std::string& origin, const std::string& what) {
  const auto id = in.read<std::uint32_t>(what + " type");
  if (!known_value_type(id)) {
    throw_invalid(fmt::format("{}: {} has value type {}, which GGUF does not define (0..12)",
                              origin, what, id));
  }
  return static_cast<GgufValueType>(id);
}

bool read_bool(Cursor& in, const std::string& origin, const std::string& what) {
  const auto b = in.read<std::uint8_t>(what);
  if (b > 1) {
    throw_invalid(fmt::format("{}: {} is a bool stored as {}, expected 0 or 1", origin, what, b));
  }
  return b == 1;
}

GgufValue read_value(Cursor& in, GgufValueType type, const std::string& origin,
                     const std::string& what, int depth);

GgufValue read_array(Cursor& in, const std::string& origin, const std::string& what, int depth) {
  if (depth >= kMaxArrayDepth) {
    throw_invalid(fmt::format("{}: {} nests arrays deeper than {} levels; the file is corrupt",
                              origin, what, kMaxArrayDepth));
  }
  GgufValue out;
  out.type = GgufValueType::kArray;
  out.element_type = read_value_type(in, origin, what + " element");
  const auto n = in.read<std::uint64_t>(what + " length");
  in.check_count(n, min_element_bytes(out.element_type), what + " length");
  const std::string element = what + " element";
  auto fill = [&](auto& vec, auto&& read_one) {
    vec.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) vec.push_back(read_one());
  };
  const GgufValueType et = out.element_type;
  if (is_unsigned(et)) {
    std::vector<std::uint64_t> v;
    fill(v, [&] { return read_widened<std::uint64_t>(in, et, element); });
    out.data = std::move(v);
  } else if (is_signed(et)) {
    std::vector<std::int64_t> v;
    fill(v, [&] { return read_widened<std::int64_t>(in, et, element); });
    out.data = std::move(v);
  } else if (is_float(et)) {
    std::vector<double> v;
    fill(v, [&] { return read_widened<double>(in, et, element); });
    out.data = std::move(v);
  } else if (et == GgufValueType::kBool) {
    std::vector<bool> v;
    fill(v, [&] { return read_bool(in, origin, element); });
    out.data = std::move(v);
  } else if (et == GgufValueType::kString) {
    std::vector<std::string> v;
    fill(v, [&] { return in.read_string(element); });
    out.data = std::move(v);
  } else {
    std::vector<GgufValue> v;
    fill(v, [&] { return read_value(in, GgufValueType::kArray, origin, element, depth + 1); });
    out.data = std::move(v);
  }
  return out;
}

GgufValue read_value(Cursor& in, GgufValueType type, const std::string& origin,
                     const std::string& what, int depth) {
  if (type == GgufValueType::kArray) return read_array(in, origin, what, depth);
  GgufValue out;
  out.type = type;
  if (is_unsigned(type)) {
    out.data = read_widened<std::uint64_t>(in, type, what);
  } else if (is_signed(type)) {
    out.data = read_widened<std::int64_t>(in, type, what);
  } else if (is_float(type)) {
    out.data = read_widened<double>(in, type, what);
  } else if (type == GgufValueType::kBool) {
    out.data = read_bool(in, origin, what);
  } else {
    out.data = in.read_string(what);
  }
  return out;
}

std::string describe_type(const GgufValue& v) {
  if (!v.is_array()) return std::string(to_string(v.type));
  return fmt::format("array of {}", to_string(v.element_type));
}

}  // namespace

std::string_view to_string(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

std::size_t GgufValue::array_size() const {
  if (!is_array()) return 0;
  return std::visit(
      [](const auto& d) -> std::size_t {
        using D = std::decay_t<decltype(d)>;
        if constexpr (requires { d.size(); } && !std::is_same_v<D, std::string>) {
          return d.size();
        } else {
          return 0;
        }
      },
      data);
}

std::int64_t GgufTensor::numel() const {
  // The parser checked that the product of the non-zero dimensions fits.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::int64_t GgufTensor::rows() const {
  const std::int64_t row = row_elements();
  return row == 0 ? 0 : numel() / row;
}

bool GgufFile::has_magic(std::span<const std::byte> bytes) {
  std::uint32_t magic = 0;
  if (bytes.size() < sizeof magic) return false;
  std::memcpy(&magic, bytes.data(), sizeof magic);
  return magic == kMagic;
}

bool GgufFile::file_has_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[4] = {};
  if (!in.read(head, sizeof head)) return false;
  return has_magic(std::as_bytes(std::span(head)));
}

GgufFile GgufFile::open(const std::string& path) {
  MappedFile mapping = MappedFile::open(path);
  const std::span<const std::byte> bytes = mapping.bytes();
  GgufFile file = parse(bytes, path);
  file.mapping_ = std::move(mapping);  // the views stay valid: the mapping's address is fixed
  return file;
}

GgufFile GgufFile::parse(std::span<const std::byte> bytes, std::string origin) {
  GgufFile f;
  f.origin_ = std::move(origin);
  f.file_size_ = bytes.size();
  const std::string& o = f.origin_;
  Cursor in(bytes, o);

  const auto magic = in.read<std::uint32_t>("the magic number");
  if (magic != kMagic) {
    throw_invalid(
        fmt::format("{}: not a GGUF file: the magic number is 0x{:08x}, expected "
                    "0x{:08x} (\"GGUF\")",
                    o, magic, kMagic));
  }
  f.version_ = in.read<std::uint32_t>("the version");
  if (f.version_ == 1) {
    throw_unsupported(
        fmt::format("{}: GGUF version 1 is not supported (versions 2 and 3 are); "
                    "convert the file with a current llama.cpp",
                    o));
  }
  if (f.version_ != 2 && f.version_ != 3) {
    const std::uint32_t swapped = __builtin_bswap32(f.version_);
    if (swapped == 2 || swapped == 3) {
      throw_unsupported(
          fmt::format("{}: a big-endian GGUF file (version {} byte-swapped); mixkv "
                      "reads little-endian GGUF only",
                      o, swapped));
    }
    throw_invalid(
        fmt::format("{}: GGUF version {} is unknown; mixkv reads versions 2 and 3", o, f.version_));
  }
  const auto n_tensors = in.read<std::uint64_t>("the tensor count");
  const auto n_kv = in.read<std::uint64_t>("the metadata count");
  in.check_count(n_kv, kMinKvBytes, "the metadata count");

  f.metadata_.reserve(n_kv);
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = in.read_string(fmt::format("the key of metadata entry #{}", i));
    const std::string what = fmt::format("metadata '{}'", key);
    const GgufValueType type = read_value_type(in, o, what);
    GgufValue value = read_value(in, type, o, what, 0);
    if (!f.metadata_index_.emplace(key, f.metadata_.size()).second) {
      throw_invalid(
          fmt::format("{}: metadata key '{}' appears twice; the file is corrupt", o, key));
    }
    f.metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const GgufValue* a = f.find("general.alignment")) {
    const auto* v = std::get_if<std::uint64_t>(&a->data);
    if (a->is_array() || v == nullptr || *v == 0 || !std::has_single_bit(*v) ||
        *v > kMaxAlignment) {
      throw_invalid(
          fmt::format("{}: metadata 'general.alignment' must be an unsigned power of two "
                      "up to 2^30, found {}",
                      o, v ? fmt::to_string(*v) : describe_type(*a)));
    }
    f.alignment_ = *v;
  } else {
    f.alignment_ = kDefaultAlignment;
  }

  in.check_count(n_tensors, kMinTensorInfoBytes, "the tensor count");
  f.tensors_.reserve(n_tensors);
  std::vector<std::uint64_t> sizes;
  sizes.reserve(n_tensors);
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = in.read_string(fmt::format("the name of tensor #{}", i));
    const std::string what = fmt::format("tensor '{}'", t.name);
    if (t.name.size() > kMaxTensorName) {
      throw_invalid(
          fmt::format("{}: the name of tensor #{} is {} bytes long; GGUF allows at most {}", o, i,
                      t.name.size(), kMaxTensorName));
    }
    const auto n_dims = in.read<std::uint32_t>(what + " dimension count");
    if (n_dims > kMaxDims) {
      throw_invalid(fmt::format("{}: {} has {} dimensions; ggml tensors have at most {}", o, what,
                                n_dims, kMaxDims));
    }
    std::vector<std::int64_t> ne(n_dims);
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = in.read<std::uint64_t>(what + " dimensions");
      if (dim > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
        throw_invalid(fmt::format("{}: {} dimension {} is {}, too large", o, what, d, dim));
      }
      ne[d] = static_cast<std::int64_t>(dim);
    }
    const auto type_id = in.read<std::uint32_t>(what + " type");
    const GgmlTypeInfo* info = find_ggml_type(type_id);
    if (info == nullptr) {
      throw_invalid(
          fmt::format("{}: {} has tensor type id {}, which is not a ggml type mixkv "
                      "knows; the file is corrupt or newer than mixkv",
                      o, what, type_id));
    }
    t.type = info->type;
    t.offset = in.read<std::uint64_t>(what + " offset");
    t.shape.assign(ne.rbegin(), ne.rend());
    const std::int64_t row = ne.empty() ? 1 : ne[0];
    if (row % info->block_elements != 0) {
      throw_invalid(
          fmt::format("{}: {} rows have {} elements, not a multiple of the {} block "
                      "({} elements)",
                      o, what, row, info->name, info->block_elements));
    }
    std::int64_t bytes_per_row =
        checked_mul(row / info->block_elements, info->block_bytes, what + " size");
    std::int64_t nbytes = bytes_per_row;
    for (std::size_t d = 1; d < ne.size(); ++d) nbytes = checked_mul(nbytes, ne[d], what + " size");
    // The product of the non-zero dimensions must fit: then every partial product in any order
    // fits too (numel(), a reader's row counts), a zero dimension making the count 0.
    const auto nonzero = [&](std::size_t d) { return d < ne.size() && ne[d] != 0 ? ne[d] : 1; };
    checked_product({nonzero(0), nonzero(1), nonzero(2), nonzero(3)}, what + " element count");
    if (t.offset % f.alignment_ != 0) {
      throw_invalid(fmt::format("{}: {} data offset {} is not a multiple of the alignment {}", o,
                                what, t.offset, f.alignment_));
    }
    sizes.push_back(static_cast<std::uint64_t>(nbytes));  // placed once data_offset is known
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second) {
      throw_invalid(fmt::format("{}: {} appears twice; the file is corrupt", o, what));
    }
    f.tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const std::uint64_t end_of_infos = in.pos();
  f.data_offset_ = (end_of_infos + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  const std::uint64_t data_size =
      f.data_offset_ <= bytes.size() ? bytes.size() - f.data_offset_ : 0;
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) {
    GgufTensor& t = f.tensors_[i];
    const std::uint64_t nbytes = sizes[i];
    if (t.offset > data_size || nbytes > data_size - t.offset) {
      throw_invalid(
          fmt::format("{}: tensor '{}' data (offset {}, {} bytes) extends past the end "
                      "of the file (data section of {} bytes at byte {}); the file is "
                      "truncated or corrupt",
                      o, t.name, t.offset, nbytes, data_size, f.data_offset_));
    }
    t.bytes = bytes.subspan(f.data_offset_ + t.offset, nbytes);
  }
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

void GgufFile::fail_type(std::string_view key, const GgufValue& value,
                         std::string_view expected) const {
  throw_invalid(fmt::format("{}: metadata '{}' is {}, expected {}", origin_, key,
                            describe_type(value), expected));
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const auto* s = std::get_if<std::string>(&v->data);
  if (v->is_array() || s == nullptr) fail_type(key, *v, "a string");
  return *s;
}

std::optional<std::uint64_t> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) {
    if (const auto* u = std::get_if<std::uint64_t>(&v->data)) return *u;
    if (const auto* i = std::get_if<std::int64_t>(&v->data); i && *i >= 0) {
      return static_cast<std::uint64_t>(*i);
    }
  }
  fail_type(key, *v, "a non-negative integer");
}

std::optional<std::int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) {
    if (const auto* i = std::get_if<std::int64_t>(&v->data)) return *i;
    if (const auto* u = std::get_if<std::uint64_t>(&v->data);
        u && *u <= std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
      return static_cast<std::int64_t>(*u);
    }
  }
  fail_type(key, *v, "an integer (in the int64 range)");
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) {
    if (const auto* d = std::get_if<double>(&v->data)) return *d;
    if (const auto* i = std::get_if<std::int64_t>(&v->data)) return double(*i);
    if (const auto* u = std::get_if<std::uint64_t>(&v->data)) return double(*u);
  }
  fail_type(key, *v, "a number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const auto* b = std::get_if<bool>(&v->data);
  if (v->is_array() || b == nullptr) fail_type(key, *v, "a bool");
  return *b;
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return nullptr;
  const auto* a = std::get_if<std::vector<std::string>>(&v->data);
  if (!v->is_array() || a == nullptr) fail_type(key, *v, "an array of strings");
  return a;
}

std::optional<std::vector<std::int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->is_array()) {
    if (const auto* i = std::get_if<std::vector<std::int64_t>>(&v->data)) return *i;
    if (const auto* u = std::get_if<std::vector<std::uint64_t>>(&v->data)) {
      std::vector<std::int64_t> out;
      out.reserve(u->size());
      for (std::uint64_t x : *u) {
        if (x > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
          fail_type(key, *v, "an array of integers in the int64 range");
        }
        out.push_back(static_cast<std::int64_t>(x));
      }
      return out;
    }
  }
  fail_type(key, *v, "an array of integers");
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  if (const GgufTensor* t = find_tensor(name)) return *t;
  throw_invalid(fmt::format("{}: has no tensor '{}'", origin_, name));
}

}  // namespace mixkv::weights
