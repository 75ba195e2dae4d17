#include "mixkv/weights/safetensors.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/convert.hpp"

namespace mixkv::weights {
namespace {

// Headers beyond this are refused before allocating them (the reference implementation caps
// headers at 100 MB as well).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct FileDtype {
  std::string_view name;
  DType dtype;
};
// The safetensors dtype names for the element types the engine reads.
constexpr FileDtype kDtypes[] = {
    {"F32", DType::kFloat32}, {"F16", DType::kFloat16}, {"BF16", DType::kBfloat16}};

std::string_view file_name(DType dtype, const std::string& tensor) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw_invalid(
      fmt::format("safetensors: tensor {} has dtype {}; the writer takes float32, "
                  "float16 or bfloat16",
                  tensor, to_string(dtype)));
}

std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::int64_t Tensor::numel() const { return element_count(shape); }

TensorMap parse_safetensors(std::span<const std::byte> file, const std::string& origin) {
  if (file.size() < 8) {
    throw_invalid(
        fmt::format("{}: {} bytes is too short for a safetensors file (an 8-byte "
                    "header length comes first)",
                    origin, file.size()));
  }
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | std::to_integer<std::uint64_t>(file[static_cast<size_t>(i)]);
  }
  if (header_len > kMaxHeaderBytes || header_len > file.size() - 8) {
    throw_invalid(
        fmt::format("{}: header length {} exceeds the file ({} bytes after the length) "
                    "or the {} byte limit; the file is truncated or not safetensors",
                    origin, header_len, file.size() - 8, kMaxHeaderBytes));
  }
  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(fmt::format("{}: the header is not valid JSON: {}", origin, e.what()));
  }
  if (!header.is_object())
    throw_invalid(fmt::format("{}: the header is not a JSON object", origin));
  const std::span<const std::byte> data = file.subspan(8 + header_len);

  TensorMap out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = fmt::format("{}: tensor {}", origin, name);
    if (!entry.is_object()) throw_invalid(where + " is not a JSON object");
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(key)) throw_invalid(fmt::format("{} has no '{}' field", where, key));
    }
    Tensor t;
    const auto& dt = entry["dtype"];
    const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const auto& d) {
      return dt.is_string() && dt.get<std::string>() == d.name;
    });
    if (known == std::end(kDtypes)) {
      throw_invalid(fmt::format("{}: dtype {} is not one the engine reads (F32, F16, BF16)", where,
                                dt.dump()));
    }
    t.dtype = known->dtype;
    const auto& shape = entry["shape"];
    if (!shape.is_array()) throw_invalid(where + ": 'shape' is not an array");
    std::int64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) {
        throw_invalid(fmt::format("{}: shape {} has an entry that is not a non-negative integer",
                                  where, shape.dump()));
      }
      const auto v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(INT32_MAX)) {
        throw_invalid(fmt::format("{}: shape entry {} is too large", where, v));
      }
      t.shape.push_back(static_cast<std::int64_t>(v));
      numel = checked_mul(numel, static_cast<std::int64_t>(v), where + " shape");
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      throw_invalid(fmt::format("{}: data_offsets {} is not a pair of non-negative integers", where,
                                offsets.dump()));
    }
    const auto begin = offsets[0].get<std::uint64_t>();
    const auto end = offsets[1].get<std::uint64_t>();
    const int elem = kernels::element_bytes(t.dtype);
    const std::int64_t bytes = checked_mul(numel, std::int64_t{elem}, where + " bytes");
    if (begin > end || end > data.size()) {
      throw_invalid(fmt::format("{}: data_offsets [{}, {}] fall outside the {} data bytes", where,
                                begin, end, data.size()));
    }
    if (end - begin != static_cast<std::uint64_t>(bytes)) {
      throw_invalid(
          fmt::format("{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] "
                      "hold {}",
                      where, shape.dump(), known->name, bytes, begin, end, end - begin));
    }
    ranges.emplace_back(begin, end);
    t.values.resize(static_cast<std::size_t>(numel));
    kernels::decode_row(t.dtype, data.subspan(begin, end - begin), 1.0f, t.values);
    out.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      throw_invalid(fmt::format("{}: tensors overlap at data bytes [{}, {}]", origin,
                                ranges[i].first, ranges[i - 1].second));
    }
  }
  return out;
}

TensorMap read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_invalid(fmt::format("cannot open safetensors file {}", path));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_safetensors(std::as_bytes(std::span<const char>(bytes)), path);
}

std::vector<std::byte> serialize_safetensors(const TensorMap& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::string_view dtype = file_name(t.dtype, name);
    if (static_cast<std::int64_t>(t.values.size()) != t.numel()) {
      throw_invalid(fmt::format("safetensors: tensor {} has {} values for {} shape elements", name,
                                t.values.size(), t.numel()));
    }
    const auto bytes = static_cast<std::uint64_t>(t.numel() * kernels::element_bytes(t.dtype));
    header[name] = {
        {"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned, as the reference writer does.
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::vector<std::byte> out(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) {
    out[static_cast<size_t>(i)] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xFF);
  }
  std::transform(text.begin(), text.end(), out.begin() + 8,
                 [](char c) { return static_cast<std::byte>(c); });
  std::size_t at = 8 + text.size();
  for (const auto& [name, t] : tensors) {
    const auto bytes = static_cast<std::size_t>(t.numel() * kernels::element_bytes(t.dtype));
    kernels::encode_row(t.dtype, t.values, 1.0f, std::span<std::byte>(out).subspan(at, bytes));
    at += bytes;
  }
  return out;
}

void write_safetensors(const std::string& path, const TensorMap& tensors) {
  const std::vector<std::byte> bytes = serialize_safetensors(tensors);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw_invalid(fmt::format("cannot create safetensors file {}", path));
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw_invalid(fmt::format("writing safetensors file {} failed", path));
}

}  // namespace mixkv::weights
