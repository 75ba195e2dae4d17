// One vector of cache or weight elements decoded to float, shared by the Highway kernels
// (attention_simd.cpp, matmul.cpp). Like Highway's own -inl.h headers it is included once per
// instruction set after foreach_target.h (the toggling guard below), so each target gets its copy.
#if defined(MIXKV_KERNELS_SIMD_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MIXKV_KERNELS_SIMD_DECODE_INL_H_
#undef MIXKV_KERNELS_SIMD_DECODE_INL_H_
#else
#define MIXKV_KERNELS_SIMD_DECODE_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <limits>

#include <hwy/highway.h>

#include "mixkv/core/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace mixkv::kernels::detail::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// One vector of elements j.. of a cache row, as floats. Bit-exact like kernels_convert: bf16 is
// a shift; fp16 and fp8 move exponent and mantissa into float position and rebias with one
// exact multiply by a power of two (normal and subnormal codes alike), then inf/NaN codes are
// patched in; fp8 then multiplies by its per-tensor scale.
template <DType kT>
HWY_INLINE hn::Vec<hn::ScalableTag<float>> decode(const std::byte* row, std::int64_t j,
                                                  float scale) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  // AVX2 and later convert fp16 in hardware (F16C, exact for every code): fp16 directly, and fp8
  // through it. e5m2 is the top byte of an fp16; e4m3 is placed in fp16's exponent and mantissa
  // bits (value / 256 is exact in fp16, normal or subnormal) and scaled back by an exact 256.
  if constexpr (kT == DType::kFloat16 || kT == DType::kFp8E4m3 || kT == DType::kFp8E5m2) {
    const hn::Rebind<std::uint16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    if constexpr (kT == DType::kFloat16) {
      return hn::PromoteTo(
          df, hn::BitCast(dh, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(row) + j)));
    } else {
      if constexpr (kT == DType::kFp8E5m2) {
        const hn::Rebind<std::uint8_t, DF> d8;
        const auto u =
            hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const std::uint8_t*>(row) + j));
        return hn::Mul(hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(u))), hn::Set(df, scale));
      } else {
        // The code sign-extended to 16 bits and shifted left by 7: the sign lands in bit 15 (and
        // a copy in bit 14, which the mask clears), exponent and mantissa in bits 13..7.
        const hn::Rebind<std::int8_t, DF> d8s;
        const hn::Rebind<std::int16_t, DF> d16s;
        const auto c =
            hn::PromoteTo(d16s, hn::LoadU(d8s, reinterpret_cast<const std::int8_t*>(row) + j));
        auto h = hn::And(hn::BitCast(d16, hn::ShiftLeft<7>(c)), hn::Set(d16, 0xBFFF));
        // e4m3fn has no infinities; 0x7F is NaN.
        const auto nan = hn::Eq(hn::And(h, hn::Set(d16, 0x3F80)), hn::Set(d16, 0x3F80));
        h = hn::IfThenElse(nan, hn::Set(d16, 0x7E00), h);
        return hn::Mul(hn::Mul(hn::PromoteTo(df, hn::BitCast(dh, h)), hn::Set(df, 256.0f)),
                       hn::Set(df, scale));
      }
    }
  }
#endif
  if constexpr (kT == DType::kFloat32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + j);
  } else if constexpr (kT == DType::kBfloat16) {
    const hn::Rebind<std::uint16_t, DF> d16;
    const auto u =
        hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(row) + j));
    return hn::BitCast(df, hn::ShiftLeft<16>(u));
  } else if constexpr (kT == DType::kFloat16) {
    const hn::Rebind<std::uint16_t, DF> d16;
    const auto u =
        hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(row) + j));
    const auto sign = hn::ShiftLeft<16>(hn::And(u, hn::Set(du, 0x8000u)));
    const auto em = hn::And(u, hn::Set(du, 0x7FFFu));
    const auto finite = hn::Mul(hn::BitCast(df, hn::ShiftLeft<13>(em)), hn::Set(df, 0x1p112f));
    const auto special = hn::BitCast(
        df, hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<13>(hn::And(em, hn::Set(du, 0x3FFu)))));
    const auto is_special = hn::RebindMask(df, hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7BFF)));
    const auto v = hn::IfThenElse(is_special, special, finite);
    return hn::BitCast(df, hn::Or(hn::BitCast(du, v), sign));
  } else {
    const hn::Rebind<std::uint8_t, DF> d8;
    const auto u = hn::PromoteTo(du, hn::LoadU(d8, reinterpret_cast<const std::uint8_t*>(row) + j));
    const auto sign = hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)));
    const auto em = hn::And(u, hn::Set(du, 0x7Fu));
    hn::Vec<DF> v;
    if constexpr (kT == DType::kFp8E4m3) {
      // e4m3fn: no infinities, 0x7F is NaN.
      const auto finite = hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(em)), hn::Set(df, 0x1p120f));
      const auto is_nan = hn::RebindMask(df, hn::Eq(em, hn::Set(du, 0x7Fu)));
      v = hn::IfThenElse(is_nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), finite);
    } else {
      const auto finite = hn::Mul(hn::BitCast(df, hn::ShiftLeft<21>(em)), hn::Set(df, 0x1p112f));
      const auto special = hn::BitCast(
          df, hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<21>(hn::And(em, hn::Set(du, 3u)))));
      const auto is_special = hn::RebindMask(df, hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7B)));
      v = hn::IfThenElse(is_special, special, finite);
    }
    v = hn::BitCast(df, hn::Or(hn::BitCast(du, v), sign));
    return hn::Mul(v, hn::Set(df, scale));
  }
}

}  // namespace mixkv::kernels::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MIXKV_KERNELS_SIMD_DECODE_INL_H_
