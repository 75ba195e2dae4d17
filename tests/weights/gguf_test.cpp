// The GGUF reader on files built byte by byte: every metadata type, tensor views, alignment, and
// every kind of damage a file can carry, each an Error naming the field.
#include "mixkv/weights/gguf.hpp"

#include <gtest/gtest.h>


#include "mutation_fuzz.hpp"
#include "test_support.hpp"
#include "weights/gguf_builder.hpp"

namespace mixkv::weights {
namespace {

using testing::expect_error;
using testing::GgufBuilder;

std::vector<std::byte> floats(std::initializer_list<float> v) {
  std::vector<std::byte> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

// A small valid file: a few keys of several types and two tensors.
GgufBuilder small_file() {
  GgufBuilder b;
  b.str("general.architecture", "llama");
  b.u32("llama.block_count", 2);
  b.str_array("tokenizer.ggml.tokens", {"a", "b", "ab"});
  b.i32_array("tokenizer.ggml.token_type", {1, 1, 3});
  b.tensor("x.weight", {4, 2}, 0, floats({1, 2, 3, 4, 5, 6, 7, 8}));
  b.tensor("y.weight", {3}, 0, floats({-1, -2, -3}));
  return b;
}

GgufFile parse(const std::vector<std::byte>& bytes) { return GgufFile::parse(bytes, "test.gguf"); }

TEST(Gguf, ReadsEveryMetadataType) {
  GgufBuilder b;
  b.u8("k.u8", 200);
  b.i8("k.i8", -100);
  b.u16("k.u16", 60000);
  b.i16("k.i16", -30000);
  b.u32("k.u32", 4000000000u);
  b.i32("k.i32", -2000000000);
  b.f32("k.f32", 0.5f);
  b.boolean("k.bool", true);
  b.str("k.str", "héllo");
  b.u64("k.u64", 18000000000000000000ull);
  b.i64("k.i64", -9000000000000000000ll);
  b.f64("k.f64", 1e-300);
  b.str_array("k.strs", {"x", "", "yz"});
  b.i32_array("k.ints", {-1, 0, 7});
  // An array of two arrays of uint8: element type 9, then each inner array's type and length.
  std::vector<std::byte> nested = GgufBuilder::bytes_of(std::uint32_t{9});
  GgufBuilder::append(nested, GgufBuilder::bytes_of(std::uint64_t{2}));
  for (std::uint8_t n : {1, 2}) {
    GgufBuilder::append(nested, GgufBuilder::bytes_of(std::uint32_t{0}));
    GgufBuilder::append(nested, GgufBuilder::bytes_of(std::uint64_t{n}));
    for (std::uint8_t i = 0; i < n; ++i) nested.push_back(std::byte{i});
  }
  b.kv("k.nested", 9, nested);
  const GgufFile f = parse(b.build());

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 15u);
  EXPECT_EQ(f.get_uint("k.u8"), 200u);
  EXPECT_EQ(f.find("k.u8")->type, GgufValueType::kUint8);
  EXPECT_EQ(f.get_int("k.i8"), -100);
  EXPECT_EQ(f.get_uint("k.u16"), 60000u);
  EXPECT_EQ(f.get_int("k.i16"), -30000);
  EXPECT_EQ(f.get_uint("k.u32"), 4000000000u);
  EXPECT_EQ(f.get_int("k.i32"), -2000000000);
  EXPECT_EQ(f.get_float("k.f32"), 0.5);
  EXPECT_EQ(f.get_bool("k.bool"), true);
  EXPECT_EQ(f.get_string("k.str"), "héllo");
  EXPECT_EQ(f.get_uint("k.u64"), 18000000000000000000ull);
  EXPECT_EQ(f.get_int("k.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_float("k.f64"), 1e-300);
  EXPECT_EQ(f.get_float("k.u32"), 4e9);  // integers read as numbers
  ASSERT_NE(f.get_string_array("k.strs"), nullptr);
  EXPECT_EQ(*f.get_string_array("k.strs"), (std::vector<std::string>{"x", "", "yz"}));
  EXPECT_EQ(f.get_int_array("k.ints"), (std::vector<std::int64_t>{-1, 0, 7}));
  const GgufValue* nest = f.find("k.nested");
  ASSERT_NE(nest, nullptr);
  EXPECT_EQ(nest->element_type, GgufValueType::kArray);
  const auto& inner = std::get<std::vector<GgufValue>>(nest->data);
  ASSERT_EQ(inner.size(), 2u);
  EXPECT_EQ(std::get<std::vector<std::uint64_t>>(inner[1].data),
            (std::vector<std::uint64_t>{0, 1}));
  EXPECT_EQ(f.get_string("absent"), std::nullopt);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Gguf, TypedLookupsNameTheKeyOnAMismatch) {
  GgufBuilder b;
  b.str("k.str", "text");
  b.i32("k.neg", -1);
  const GgufFile f = parse(b.build());
  expect_error([&] { f.get_uint("k.str"); }, ErrorCode::kInvalidInput, {"'k.str'", "string"});
  expect_error([&] { f.get_uint("k.neg"); }, ErrorCode::kInvalidInput, {"'k.neg'", "int32"});
  expect_error([&] { f.get_string_array("k.str"); }, ErrorCode::kInvalidInput,
               {"'k.str'", "array of strings"});
}

TEST(Gguf, TensorsAreViewsIntoTheFileInRowMajorShape) {
  const std::vector<std::byte> bytes = small_file().build();
  const GgufFile f = parse(bytes);
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensor& x = f.tensor("x.weight");
  EXPECT_EQ(x.type, GgmlType::kF32);
  EXPECT_EQ(x.shape, (std::vector<std::int64_t>{2, 4}));  // ne {4, 2} reversed
  EXPECT_EQ(x.numel(), 8);
  EXPECT_EQ(x.rows(), 2);
  EXPECT_EQ(x.bytes.size(), 32u);
  EXPECT_EQ(x.bytes.data(), bytes.data() + f.data_offset() + x.offset);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  float last;
  std::memcpy(&last, x.bytes.data() + 28, 4);
  EXPECT_EQ(last, 8.0f);
  const GgufTensor& y = f.tensor("y.weight");
  EXPECT_EQ(y.offset, 32u);  // the next multiple of 32 after x's 32 bytes
  EXPECT_EQ(f.find_tensor("z"), nullptr);
  expect_error([&] { f.tensor("z"); }, ErrorCode::kInvalidInput, {"'z'"});
}

TEST(Gguf, HonoursGeneralAlignment) {
  GgufBuilder b;
  b.alignment = 64;
  b.u32("general.alignment", 64);
  b.tensor("a", {3}, 0, floats({1, 2, 3}));
  b.tensor("b", {1}, 0, floats({4}));
  const GgufFile f = parse(b.build());
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.tensor("b").offset, 64u);
}

TEST(Gguf, ReadsVersion2) {
  GgufBuilder b = small_file();
  b.version = 2;
  EXPECT_EQ(parse(b.build()).version(), 2u);
}

TEST(Gguf, RefusesWrongMagicAndVersions) {
  std::vector<std::byte> bytes = small_file().build();
  bytes[0] = std::byte{'X'};
  expect_error([&] { parse(bytes); }, ErrorCode::kInvalidInput, {"test.gguf", "magic"});
  GgufBuilder b = small_file();
  b.version = 1;
  expect_error([&] { parse(b.build()); }, ErrorCode::kUnsupported, {"version 1"});
  b.version = 0x03000000;  // a big-endian file's version as a little-endian reader sees it
  expect_error([&] { parse(b.build()); }, ErrorCode::kUnsupported, {"big-endian"});
  b.version = 7;
  expect_error([&] { parse(b.build()); }, ErrorCode::kInvalidInput, {"version 7"});
  EXPECT_FALSE(GgufFile::has_magic(std::span<const std::byte>(bytes).first(2)));
}

TEST(Gguf, EveryTruncationIsAnErrorNotACrash) {
  const std::vector<std::byte> bytes = small_file().build();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<std::byte> cut(bytes.begin(), bytes.begin() + n);
    try {
      parse(cut);
      ADD_FAILURE() << "a file cut to " << n << " of " << bytes.size() << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidInput) << e.what();
    }
  }
  expect_error(
      [&] {
        parse({bytes.begin(), bytes.begin() + 6});
      },
      ErrorCode::kInvalidInput, {"truncated", "the version"});
  expect_error(
      [&] {
        parse({bytes.begin(), bytes.end() - 4});
      },
      ErrorCode::kInvalidInput, {"'y.weight'", "past the end"});
}

TEST(Gguf, AbsurdCountsAndLengthsAreRefusedBeforeAllocating) {
  // Header with 2^60 key/values.
  std::vector<std::byte> h = GgufBuilder::string_raw("GGUF");
  GgufBuilder::append(h, GgufBuilder::bytes_of(std::uint32_t{3}));
  GgufBuilder::append(h, GgufBuilder::bytes_of(std::uint64_t{0}));
  GgufBuilder::append(h, GgufBuilder::bytes_of(std::uint64_t{1} << 60));
  expect_error([&] { parse(h); }, ErrorCode::kInvalidInput, {"metadata count", "bytes left"});
  // 2^62 tensors.
  std::vector<std::byte> t = GgufBuilder::string_raw("GGUF");
  GgufBuilder::append(t, GgufBuilder::bytes_of(std::uint32_t{3}));
  GgufBuilder::append(t, GgufBuilder::bytes_of(std::uint64_t{1} << 62));
  GgufBuilder::append(t, GgufBuilder::bytes_of(std::uint64_t{0}));
  expect_error([&] { parse(t); }, ErrorCode::kInvalidInput, {"tensor count"});
  // A string claiming 2^63 bytes, an array claiming 2^61 strings.
  GgufBuilder s;
  s.kv("k", 8, GgufBuilder::bytes_of(std::uint64_t{1} << 63));
  expect_error([&] { parse(s.build()); }, ErrorCode::kInvalidInput, {"metadata 'k'", "length"});
  GgufBuilder a;
  std::vector<std::byte> arr = GgufBuilder::bytes_of(std::uint32_t{8});
  GgufBuilder::append(arr, GgufBuilder::bytes_of(std::uint64_t{1} << 61));
  a.kv("tokens", 9, arr);
  expect_error([&] { parse(a.build()); }, ErrorCode::kInvalidInput, {"metadata 'tokens'"});
  // Arrays nested five deep.
  GgufBuilder d;
  std::vector<std::byte> deep;
  for (int i = 0; i < 5; ++i) {
    GgufBuilder::append(deep, GgufBuilder::bytes_of(std::uint32_t{9}));
    GgufBuilder::append(deep, GgufBuilder::bytes_of(std::uint64_t{1}));
  }
  GgufBuilder::append(deep, GgufBuilder::bytes_of(std::uint32_t{0}));
  GgufBuilder::append(deep, GgufBuilder::bytes_of(std::uint64_t{0}));
  d.kv("deep", 9, deep);
  expect_error([&] { parse(d.build()); }, ErrorCode::kInvalidInput, {"'deep'", "nests"});
}

TEST(Gguf, BadValuesAndTensorInfosNameTheField) {
  GgufBuilder v;
  v.kv("k.bad", 13, GgufBuilder::bytes_of(std::uint32_t{0}));
  expect_error([&] { parse(v.build()); }, ErrorCode::kInvalidInput, {"'k.bad'", "value type 13"});
  GgufBuilder bo;
  bo.kv("k.bool", 7, {std::byte{2}});
  expect_error([&] { parse(bo.build()); }, ErrorCode::kInvalidInput, {"'k.bool'", "0 or 1"});
  GgufBuilder dup;
  dup.u32("k", 1);
  dup.u32("k", 2);
  expect_error([&] { parse(dup.build()); }, ErrorCode::kInvalidInput, {"'k'", "twice"});
  GgufBuilder al;
  al.u32("general.alignment", 48);
  expect_error([&] { parse(al.build()); }, ErrorCode::kInvalidInput,
               {"general.alignment", "power of two"});

  GgufBuilder type;
  type.tensor("w", {32}, 31, std::vector<std::byte>(64));  // 31 was Q4_0_4_4, retired
  expect_error([&] { parse(type.build()); }, ErrorCode::kInvalidInput,
               {"tensor 'w'", "type id 31"});
  GgufBuilder dims;
  dims.tensor("w", {1, 1, 1, 1, 1}, 0, floats({1}));
  expect_error([&] { parse(dims.build()); }, ErrorCode::kInvalidInput, {"'w'", "5 dimensions"});
  GgufBuilder block;
  block.tensor("w", {16}, 8, std::vector<std::byte>(34));  // Q8_0 rows must be multiples of 32
  expect_error([&] { parse(block.build()); }, ErrorCode::kInvalidInput,
               {"'w'", "not a multiple", "Q8_0"});
  GgufBuilder misaligned;
  misaligned.tensor("w", {1}, 0, floats({1}), 4);
  expect_error([&] { parse(misaligned.build()); }, ErrorCode::kInvalidInput,
               {"'w'", "offset 4", "alignment 32"});
  GgufBuilder past;
  past.tensor("w", {1}, 0, floats({1}), 1 << 20);
  std::vector<std::byte> bytes = past.build();
  bytes.resize(bytes.size() - (1 << 20));  // the data the offset points at is not there
  expect_error([&] { parse(bytes); }, ErrorCode::kInvalidInput, {"'w'", "past the end"});
  GgufBuilder huge;
  huge.tensor("w", {std::uint64_t{1} << 40, std::uint64_t{1} << 40}, 0, {});
  expect_error([&] { parse(huge.build()); }, ErrorCode::kInvalidInput, {"'w'"});
  // A zero dimension makes the size 0, but the others' product must still fit (the libFuzzer
  // target found the element count overflowing through such a tensor).
  GgufBuilder zero_huge;
  zero_huge.tensor("w", {0, std::uint64_t{1} << 40, std::uint64_t{1} << 40}, 0, {});
  expect_error([&] { parse(zero_huge.build()); }, ErrorCode::kInvalidInput,
               {"'w'", "element count"});
  GgufBuilder zero;
  zero.tensor("w", {0, 4}, 0, {});
  EXPECT_EQ(parse(zero.build()).tensor("w").numel(), 0);
  GgufBuilder twice;
  twice.tensor("w", {1}, 0, floats({1}));
  twice.tensor("w", {1}, 0, floats({2}));
  expect_error([&] { parse(twice.build()); }, ErrorCode::kInvalidInput, {"'w'", "twice"});
  GgufBuilder name;
  name.tensor(std::string(65, 'n'), {1}, 0, floats({1}));
  expect_error([&] { parse(name.build()); }, ErrorCode::kInvalidInput, {"65 bytes", "at most 64"});
}

// Random damage to a valid file (bytes flipped, 64-bit fields overwritten with large values,
// truncation): the reader returns a file or throws mixkv::Error, never anything else. The libFuzzer
// target fuzz/gguf_fuzzer.cpp does the same at length.
TEST(Gguf, MutatedFilesParseOrFailCleanly) {
  GgufBuilder b = small_file();
  b.f32("general.f", 1.5f);
  b.str("tokenizer.chat_template", "{{ x }}");
  const std::vector<std::byte> base = b.build();
  const auto make = [&](std::uint64_t i) {
    mixkv::testing::FuzzRng rng = mixkv::testing::fuzz_rng(0x6d69786b76676731, i);  // "mixkvgg1"
    std::vector<std::byte> m = base;
    mixkv::testing::fuzz_damage_bytes(m, rng, 4);
    return m;
  };
  const auto check = [](const std::vector<std::byte>& m, bool* parsed) -> std::string {
    try {
      const GgufFile f = parse(m);
      for (const GgufTensor& t : f.tensors()) {
        if (t.bytes.data() < m.data() || t.bytes.data() + t.bytes.size() > m.data() + m.size()) {
          return "tensor " + t.name + "'s bytes lie outside the file";
        }
      }
      *parsed = true;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kInternal) return std::string("internal error: ") + e.what();
    } catch (const std::exception& e) {
      return std::string("escaped as ") + e.what();
    }
    return "";
  };
  mixkv::testing::run_fuzz("gguf fuzz", 3000, 50, make, check, [](const std::vector<std::byte>& m) {
    return std::to_string(m.size()) + " bytes";
  });
}

}  // namespace
}  // namespace mixkv::weights
