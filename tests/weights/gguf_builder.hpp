// Builds GGUF files byte by byte for tests: typed metadata, tensor infos and aligned data, laid
// out as docs/gguf.md describes, with knobs to break each field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace mixkv::testing {

class GgufBuilder {
 public:
  std::uint32_t version = 3;
  std::uint64_t alignment = 32;  // used for the layout; write general.alignment to change it

  void u8(std::string_view key, std::uint8_t v) { kv(key, 0, bytes_of(v)); }
  void i8(std::string_view key, std::int8_t v) { kv(key, 1, bytes_of(v)); }
  void u16(std::string_view key, std::uint16_t v) { kv(key, 2, bytes_of(v)); }
  void i16(std::string_view key, std::int16_t v) { kv(key, 3, bytes_of(v)); }
  void u32(std::string_view key, std::uint32_t v) { kv(key, 4, bytes_of(v)); }
  void i32(std::string_view key, std::int32_t v) { kv(key, 5, bytes_of(v)); }
  void f32(std::string_view key, float v) { kv(key, 6, bytes_of(v)); }
  void boolean(std::string_view key, bool v) { kv(key, 7, bytes_of(std::uint8_t(v ? 1 : 0))); }
  void str(std::string_view key, std::string_view v) { kv(key, 8, string_bytes(v)); }
  void u64(std::string_view key, std::uint64_t v) { kv(key, 10, bytes_of(v)); }
  void i64(std::string_view key, std::int64_t v) { kv(key, 11, bytes_of(v)); }
  void f64(std::string_view key, double v) { kv(key, 12, bytes_of(v)); }
  void str_array(std::string_view key, const std::vector<std::string>& v) {
    std::vector<std::byte> body = bytes_of(std::uint32_t{8});
    append(body, bytes_of(std::uint64_t(v.size())));
    for (const auto& s : v) append(body, string_bytes(s));
    kv(key, 9, body);
  }
  void i32_array(std::string_view key, const std::vector<std::int32_t>& v) {
    std::vector<std::byte> body = bytes_of(std::uint32_t{5});
    append(body, bytes_of(std::uint64_t(v.size())));
    for (auto x : v) append(body, bytes_of(x));
    kv(key, 9, body);
  }
  // A raw key/value: `type` and the encoded value bytes as they follow it.
  void kv(std::string_view key, std::uint32_t type, const std::vector<std::byte>& value) {
    append(kvs_, string_bytes(key));
    append(kvs_, bytes_of(type));
    append(kvs_, value);
    ++n_kv_;
  }

  // A tensor with GGUF dims (ne order: innermost first) and its raw bytes; the offset is the
  // next aligned position of the data section unless `offset` is given.
  void tensor(std::string_view name, std::vector<std::uint64_t> ne, std::uint32_t type,
              const std::vector<std::byte>& data, std::int64_t offset = -1) {
    if (offset < 0) {
      pad_to(data_, alignment);
      offset = static_cast<std::int64_t>(data_.size());
    }
    append(infos_, string_bytes(name));
    append(infos_, bytes_of(std::uint32_t(ne.size())));
    for (auto d : ne) append(infos_, bytes_of(d));
    append(infos_, bytes_of(type));
    append(infos_, bytes_of(std::uint64_t(offset)));
    if (static_cast<std::size_t>(offset) + data.size() > data_.size()) {
      data_.resize(static_cast<std::size_t>(offset) + data.size());
    }
    if (!data.empty()) std::memcpy(data_.data() + offset, data.data(), data.size());
    ++n_tensors_;
  }

  std::vector<std::byte> build() const {
    std::vector<std::byte> out = string_raw("GGUF");
    append(out, bytes_of(version));
    append(out, bytes_of(n_tensors_));
    append(out, bytes_of(n_kv_));
    append(out, kvs_);
    append(out, infos_);
    pad_to(out, alignment);
    append(out, data_);
    return out;
  }

  template <typename T>
  static std::vector<std::byte> bytes_of(const T& v) {
    std::vector<std::byte> out(sizeof(T));
    std::memcpy(out.data(), &v, sizeof(T));
    return out;
  }
  static std::vector<std::byte> string_bytes(std::string_view s) {
    std::vector<std::byte> out = bytes_of(std::uint64_t(s.size()));
    append(out, string_raw(s));
    return out;
  }
  static std::vector<std::byte> string_raw(std::string_view s) {
    std::vector<std::byte> out(s.size());
    if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());  // an empty view may be null
    return out;
  }
  static void append(std::vector<std::byte>& to, const std::vector<std::byte>& from) {
    to.insert(to.end(), from.begin(), from.end());
  }
  static void pad_to(std::vector<std::byte>& v, std::uint64_t alignment) {
    while (v.size() % alignment != 0) v.push_back(std::byte{0});
  }

 private:
  std::vector<std::byte> kvs_, infos_, data_;
  std::uint64_t n_kv_ = 0;
  std::uint64_t n_tensors_ = 0;
};

// Little-endian bytes of fp16 values given as bit patterns, and other small helpers for blocks.
inline void put_u16(std::vector<std::byte>& v, std::uint16_t x) {
  v.push_back(std::byte(x & 0xFF));
  v.push_back(std::byte(x >> 8));
}
inline void put_u8(std::vector<std::byte>& v, std::uint8_t x) { v.push_back(std::byte(x)); }

}  // namespace mixkv::testing
