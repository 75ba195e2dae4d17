#include "mixkv/core/dtype.hpp"

#include <gtest/gtest.h>

#include <limits>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv {
namespace {

TEST(DType, AliasesParseToCanonicalTypes) {
  EXPECT_EQ(parse_dtype("fp8"), DType::kFp8E4m3);
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::kFp8E4m3);
  EXPECT_EQ(parse_dtype("BF16"), DType::kBfloat16);
  EXPECT_EQ(parse_dtype("torch.float16"), DType::kFloat16);
  EXPECT_EQ(parse_dtype("float32"), DType::kFloat32);
  EXPECT_EQ(parse_dtype("fp8_e5m2"), DType::kFp8E5m2);
  EXPECT_EQ(parse_dtype("nvfp4"), DType::kNvfp4);
  EXPECT_FALSE(parse_dtype("int3").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
}

TEST(DType, CanonicalNamesRoundTrip) {
  for (DType d : {DType::kBfloat16, DType::kFloat16, DType::kFloat32, DType::kFp8E4m3,
                  DType::kFp8E5m2, DType::kNvfp4}) {
    EXPECT_EQ(parse_dtype(to_string(d)), d);
  }
  EXPECT_EQ(to_string(DType::kFp8E4m3), "fp8_e4m3");
}

TEST(DType, StorageBytesAreExact) {
  EXPECT_EQ(storage_bytes(DType::kBfloat16, 1000), 2000);
  EXPECT_EQ(storage_bytes(DType::kFloat32, 3), 12);
  EXPECT_EQ(storage_bytes(DType::kFp8E5m2, 7), 7);
  // nvfp4: half a byte per element plus one scale byte per 16 elements, each rounded up.
  EXPECT_EQ(storage_bytes(DType::kNvfp4, 16), 8 + 1);
  EXPECT_EQ(storage_bytes(DType::kNvfp4, 17), 9 + 2);
}

TEST(CheckedMath, OverflowIsAnErrorNamingTheQuantity) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20, "x"), std::int64_t{1} << 40);
  try {
    checked_mul(kMax / 2, 3, "page bytes");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("page bytes"), std::string::npos);
  }
  EXPECT_THROW(checked_add(kMax, 1, "sum"), Error);
  EXPECT_THROW(storage_bytes(DType::kFloat32, kMax / 2), Error);
  EXPECT_EQ(checked_product({2, 3, 7}, "p"), 42);
}

TEST(ErrorCodes, MapToCliExitStatus) {
  EXPECT_EQ(Error(ErrorCode::kInvalidInput, "x").exit_code(), 2);
  EXPECT_EQ(Error(ErrorCode::kUnsupported, "x").exit_code(), 2);
  EXPECT_EQ(Error(ErrorCode::kInternal, "x").exit_code(), 1);
}

}  // namespace
}  // namespace mixkv
