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

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
// Lanes(d16) e4m3 codes at `codes` as the fp16 bits of value / 256: the code sign-extended to
// 16 bits and shifted left by 7 puts the sign in bit 15 (and a copy in bit 14, which the mask
// clears), exponent and mantissa in bits 13..7; e4m3fn has no infinities, 0x7F is NaN.
template <bool kNanFree = false, class D16>
HWY_INLINE hn::Vec<D16> e4m3_as_fp16(D16 d16, const std::byte* codes) {
  const hn::RebindToSigned<D16> d16s;
  const hn::Rebind<std::int8_t, D16> d8s;
  const auto c = hn::PromoteTo(d16s, hn::LoadU(d8s, reinterpret_cast<const std::int8_t*>(codes)));
  const auto h = hn::And(hn::BitCast(d16, hn::ShiftLeft<7>(c)), hn::Set(d16, 0xBFFF));
  if constexpr (kNanFree) return h;  // the caller checked that no code is a NaN
  const auto nan = hn::Eq(hn::And(h, hn::Set(d16, 0x3F80)), hn::Set(d16, 0x3F80));
  return hn::IfThenElse(nan, hn::Set(d16, 0x7E00), h);
}
#endif

// The factor between a cache element's value and what decode_units gives for it: e4m3 comes out
// as value / 256 (exact: the fp16 that F16C widens, or the same number on the integer path),
// every other type as its value. The per-tensor scale and this unit meet once, outside the
// loops: decode's `scale / unit` (exact, a power of two times the scale).
constexpr float code_unit(DType t) { return t == DType::kFp8E4m3 ? 0x1p-8f : 1.0f; }

// One vector of elements j.. of a cache row, in units of code_unit (no scale). Bit-exact like
// kernels_convert: bf16 is a shift; fp16 and fp8 move exponent and mantissa into float position
// and rebias with one exact multiply by a power of two (normal and subnormal codes alike), then
// inf/NaN codes are patched in.
template <DType kT>
HWY_INLINE hn::Vec<hn::ScalableTag<float>> decode_units(const std::byte* row, std::int64_t j) {
  using DF = hn::ScalableTag<float>;
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  // AVX2 and later convert fp16 in hardware (F16C, exact for every code): fp16 directly, and fp8
  // through it. e5m2 is the top byte of an fp16; e4m3 is placed in fp16's exponent and mantissa
  // bits (value / 256 is exact in fp16, normal or subnormal).
  if constexpr (kT == DType::kFloat16 || kT == DType::kFp8E4m3 || kT == DType::kFp8E5m2) {
    const hn::Rebind<std::uint16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    if constexpr (kT == DType::kFloat16) {
      return hn::PromoteTo(
          df, hn::BitCast(dh, hn::LoadU(d16, reinterpret_cast<const std::uint16_t*>(row) + j)));
    } else if constexpr (kT == DType::kFp8E5m2) {
      const hn::Rebind<std::uint8_t, DF> d8;
      const auto u =
          hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const std::uint8_t*>(row) + j));
      return hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(u)));
    } else {
      return hn::PromoteTo(df, hn::BitCast(dh, e4m3_as_fp16(d16, row + j)));
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
      // e4m3fn: no infinities, 0x7F is NaN. Rebiased by 2^(127 - 7 - 8): value / 256.
      const auto finite = hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(em)), hn::Set(df, 0x1p112f));
      const auto is_nan = hn::RebindMask(df, hn::Eq(em, hn::Set(du, 0x7Fu)));
      v = hn::IfThenElse(is_nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()), finite);
    } else {
      const auto finite = hn::Mul(hn::BitCast(df, hn::ShiftLeft<21>(em)), hn::Set(df, 0x1p112f));
      const auto special = hn::BitCast(
          df, hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<21>(hn::And(em, hn::Set(du, 3u)))));
      const auto is_special = hn::RebindMask(df, hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7B)));
      v = hn::IfThenElse(is_special, special, finite);
    }
    return hn::BitCast(df, hn::Or(hn::BitCast(du, v), sign));
  }
}

// Two vectors, elements j.. and j + Lanes.. (the same floats as two decode_units). On AVX2 and
// AVX-512 e4m3 is widened to fp16 bits two float vectors' codes at a time (16 or 32: half the
// integer work per element of two one-vector widenings).
template <DType kT, bool kNanFree = false>
HWY_INLINE void decode_units2(const std::byte* row, std::int64_t j,
                              hn::Vec<hn::ScalableTag<float>>& lo,
                              hn::Vec<hn::ScalableTag<float>>& hi) {
  using DF = hn::ScalableTag<float>;
  const DF df;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  if constexpr (kT == DType::kFp8E4m3) {
    const hn::Repartition<std::uint16_t, DF> d16;
    const hn::Half<decltype(d16)> d16h;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto h = e4m3_as_fp16<kNanFree>(d16, row + j);
    lo = hn::PromoteTo(df, hn::BitCast(dh, hn::LowerHalf(d16h, h)));
    hi = hn::PromoteTo(df, hn::BitCast(dh, hn::UpperHalf(d16h, h)));
    return;
  }
#endif
  lo = decode_units<kT>(row, j);
  hi = decode_units<kT>(row, j + static_cast<std::int64_t>(hn::Lanes(df)));
}

// Whether decode_units2 widens two vectors at once (cheaper than two decode_units): loops that
// read such rows step by two vectors.
template <DType kT>
constexpr bool kPairedDecode =
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
    kT == DType::kFp8E4m3;
#else
    false;
#endif

// One vector of elements j.. of a cache row, as floats (the fp8 per-tensor scale applied).
template <DType kT>
HWY_INLINE hn::Vec<hn::ScalableTag<float>> decode(const std::byte* row, std::int64_t j,
                                                  float scale) {
  const auto v = decode_units<kT>(row, j);
  if constexpr (kT == DType::kFp8E4m3 || kT == DType::kFp8E5m2) {
    return hn::Mul(v, hn::Set(hn::ScalableTag<float>(), scale / code_unit(kT)));
  } else {
    return v;
  }
}

}  // namespace mixkv::kernels::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MIXKV_KERNELS_SIMD_DECODE_INL_H_
