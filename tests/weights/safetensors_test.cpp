// safetensors: the writer's files read back exactly, every malformed header is refused with an
// error naming the tensor or field, and damaged files are read or refused, never anything else.
#include "mixkv/weights/safetensors.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "mixkv/core/error.hpp"
#include "mutation_fuzz.hpp"

namespace mixkv::weights {
namespace {

weights::TensorMap sample_tensors() {
  weights::TensorMap m;
  m["a.weight"] =
      weights::Tensor{DType::kFloat32, {2, 3}, {1.5f, -2.0f, 0.25f, 3.0f, 1e-3f, -7.0f}};
  m["b.bias"] = weights::Tensor{DType::kBfloat16, {4}, {1.0f, -0.5f, 2.0f, 0.0f}};
  m["c.scale"] = weights::Tensor{DType::kFloat16, {1, 2}, {0.5f, -65504.0f}};
  return m;
}

// A file from a header written by hand and `data_bytes` zero bytes of data.
std::vector<std::byte> file_with_header(const std::string& header, std::size_t data_bytes) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string error_of(const std::vector<std::byte>& file) {
  try {
    weights::parse_safetensors(file, "test.safetensors");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    return e.what();
  }
  return "";
}

TEST(Safetensors, WrittenTensorsReadBackWithTheirDtypesAndValues) {
  const weights::TensorMap m = sample_tensors();
  const weights::TensorMap back =
      weights::parse_safetensors(weights::serialize_safetensors(m), "mem");
  EXPECT_EQ(back, m);  // every value above is exact in its dtype
}

TEST(Safetensors, ValuesAreRoundedToTheStoredDtype) {
  weights::TensorMap m;
  m["x"] =
      weights::Tensor{DType::kBfloat16, {1}, {1.00390625f}};  // 1 + 2^-8: halfway, ties to even
  const weights::TensorMap back =
      weights::parse_safetensors(weights::serialize_safetensors(m), "mem");
  EXPECT_EQ(back.at("x").values[0], 1.0f);
}

TEST(Safetensors, HeaderFollowsTheFormat) {
  const std::vector<std::byte> f = weights::serialize_safetensors(sample_tensors());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(f[i]);
  EXPECT_EQ((8 + n) % 8, 0u);  // data aligned
  const auto header = nlohmann::json::parse(reinterpret_cast<const char*>(f.data()) + 8,
                                            reinterpret_cast<const char*>(f.data()) + 8 + n);
  EXPECT_EQ(header["b.bias"]["dtype"], "BF16");
  EXPECT_EQ(header["a.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["a.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(f.size(), 8 + n + 24 + 8 + 4);
}

TEST(Safetensors, FileRoundTripsThroughDisk) {
  const auto path =
      std::filesystem::temp_directory_path() /
      ("mixkv_st_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
       ".safetensors");
  weights::write_safetensors(path.string(), sample_tensors());
  EXPECT_EQ(weights::read_safetensors(path.string()), sample_tensors());
  std::filesystem::remove(path);
}

TEST(Safetensors, MetadataIsIgnored) {
  const auto f = file_with_header(
      R"({"__metadata__":{"format":"pt"},"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
      4);
  EXPECT_EQ(weights::parse_safetensors(f, "m").size(), 1u);
}

TEST(Safetensors, TruncatedFilesAreRefused) {
  EXPECT_NE(error_of(std::vector<std::byte>(5)).find("too short"), std::string::npos);
  auto f = file_with_header(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  f.resize(12);
  EXPECT_NE(error_of(f).find("header length"), std::string::npos);
}

TEST(Safetensors, BadHeadersNameTheTensorAndField) {
  struct Case {
    std::string header;
    std::size_t data;
    std::string expect;
  };
  const Case cases[] = {
      {"not json", 0, "not valid JSON"},
      {"[1]", 0, "not a JSON object"},
      {R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8, "tensor w: dtype \"I64\""},
      {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, "tensor w has no 'dtype'"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "tensor w: shape"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "needs 8 bytes"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 4, "fall outside"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, "fall outside"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "tensor w: data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "overlap"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(file_with_header(c.header, c.data));
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.header << " -> " << e;
    EXPECT_NE(e.find("test.safetensors"), std::string::npos) << e;
  }
}

TEST(Safetensors, WriterRefusesUnsupportedDtypesAndShapeMismatches) {
  weights::TensorMap m;
  m["q"] = weights::Tensor{DType::kFp8E4m3, {1}, {1.0f}};
  EXPECT_THROW(weights::serialize_safetensors(m), Error);
  m["q"] = weights::Tensor{DType::kFloat32, {2}, {1.0f}};
  EXPECT_THROW(weights::serialize_safetensors(m), Error);
}

// Damage to valid files: the data's bytes changed (NaNs and infinities included); the header's
// values replaced by values of any type, through the JSON so that the length prefix stays right
// and the checks behind the JSON parse are reached; or bytes changed, 64-bit fields overwritten
// with large values and the file cut anywhere. The reader returns tensors or throws mixkv::Error
// (bad input), never anything else; what it returns holds one value per shape element and is a
// fixed point of writing and reading again. fuzz/safetensors_fuzzer.cpp does the same at length.
TEST(Safetensors, MutatedFilesParseOrFailCleanly) {
  TensorMap with_metadata = sample_tensors();
  with_metadata["d.empty"] = Tensor{DType::kFloat32, {0, 3}, {}};
  const std::vector<std::vector<std::byte>> bases = {serialize_safetensors(sample_tensors()),
                                                     serialize_safetensors(with_metadata)};
  const auto make = [&](std::uint64_t i) {
    mixkv::testing::FuzzRng rng = mixkv::testing::fuzz_rng(0x6d69786b76737431, i);  // "mixkvst1"
    std::vector<std::byte> file = mixkv::testing::fuzz_pick(rng, bases);
    std::uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | std::to_integer<std::uint64_t>(file[b]);
    const auto mode = rng() % 3;
    if (mode == 0) {  // the values only: any bits, NaN and infinities included
      for (std::size_t at = 8 + n; at < file.size(); ++at) {
        if (mixkv::testing::fuzz_chance(rng, 30)) file[at] = static_cast<std::byte>(rng() & 0xFF);
      }
    } else if (mode == 1) {
      const auto* text = reinterpret_cast<const char*>(file.data()) + 8;
      nlohmann::json header = nlohmann::json::parse(text, text + n);
      for (auto edits = 1 + rng() % 2; edits > 0; --edits) {
        std::vector<nlohmann::json*> values;
        mixkv::testing::fuzz_values(header, values);
        *values[rng() % values.size()] = mixkv::testing::fuzz_json_value(rng);
      }
      const std::vector<std::byte> data(file.begin() + static_cast<std::ptrdiff_t>(8 + n),
                                        file.end());
      file = file_with_header(header.dump(), data.size());
      std::copy(data.begin(), data.end(), file.end() - static_cast<std::ptrdiff_t>(data.size()));
    } else {
      mixkv::testing::fuzz_damage_bytes(file, rng, 3);
    }
    return file;
  };
  const auto check = [](const std::vector<std::byte>& file, bool* parsed) -> std::string {
    TensorMap tensors;
    try {
      tensors = parse_safetensors(file, "fuzz.safetensors");
    } catch (const Error& e) {
      return e.code() == ErrorCode::kInvalidInput ? "" : fmt::format("not bad input: {}", e.what());
    } catch (const std::exception& e) {
      return fmt::format("escaped as {}", e.what());
    }
    *parsed = true;
    for (const auto& [name, t] : tensors) {
      if (std::ssize(t.values) != t.numel()) {
        return fmt::format("{} holds {} values for {} elements", name, t.values.size(), t.numel());
      }
    }
    const std::vector<std::byte> again = serialize_safetensors(tensors);
    if (serialize_safetensors(parse_safetensors(again, "again")) != again) {
      return "writing and reading again changed the file";
    }
    return "";
  };
  mixkv::testing::run_fuzz(
      "safetensors fuzz", 3000, 10, make, check,
      [](const std::vector<std::byte>& file) { return fmt::format("{} bytes", file.size()); });
}

}  // namespace
}  // namespace mixkv::weights
