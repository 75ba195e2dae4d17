// Row encoding of floats to fp16 and bf16 with Highway (one copy per instruction set, the best
// chosen at run time like the attention kernels): the KV cache write of every token of every
// attention layer goes through here. Integer arithmetic on the float bits plus one float add,
// the same steps as the scalar float_to_fp16 / float_to_bf16 (convert.cpp), so every target
// writes the same bits as the scalar encode: round to nearest, ties to even, NaN to the quiet
// canonical code (fp16) or the quieted payload (bf16).
#include "kernels/convert_simd.hpp"

#include <cstddef>
#include <cstdint>

#include "mixkv/kernels/convert.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/convert_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers after foreach_target.h, as its documentation requires.
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace mixkv::kernels::detail::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using D16 = hn::Rebind<std::uint16_t, DF>;

// fp16 codes of one vector of floats, in 32-bit lanes (the steps of fp16_code in convert.cpp).
HWY_INLINE hn::Vec<DU> fp16_codes(hn::Vec<DF> x) {
  const DF df;
  const DU du;
  const DI di;
  const auto u = hn::BitCast(du, x);
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const auto a = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
  // Normal halves: rebias the exponent by 127 - 15 and round the 13 dropped mantissa bits.
  const auto rebiased = hn::Sub(a, hn::Set(du, 0x38000000u));
  const auto odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<13>(hn::Add(rebiased, hn::Add(hn::Set(du, 0x0FFFu), odd)));
  // Subnormal halves: |x| + 0.5 lands in [0.5, 1), whose unit in the last place is fp16's
  // smallest subnormal, so the float add rounds |x| to it; the bits above 0.5's are the code.
  const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))),
                           hn::Set(du, 0x3F000000u));
  // a < 2^31, so signed compares order the magnitudes.
  const auto ai = hn::BitCast(di, a);
  auto code = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000))), sub, normal);
  code = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477FEFFF))),
                        hn::Set(du, 0x7C00u), code);
  code = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7F800000))),
                        hn::Set(du, 0x7E00u), code);
  return hn::Or(sign, code);
}

// bf16 codes, in 32-bit lanes (float_to_bf16's steps).
HWY_INLINE hn::Vec<DU> bf16_codes(hn::Vec<DF> x) {
  const DU du;
  const DI di;
  const auto u = hn::BitCast(du, x);
  const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), odd)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x0040u));
  const auto a = hn::BitCast(di, hn::And(u, hn::Set(du, 0x7FFFFFFFu)));
  return hn::IfThenElse(hn::RebindMask(du, hn::Gt(a, hn::Set(di, 0x7F800000))), quiet, rounded);
}

template <bool kHalf>
void encode_t(const float* values, std::size_t count, std::uint16_t* out) {
  const DF df;
  const D16 d16;
  const std::size_t n = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + n <= count; i += n) {
    const auto x = hn::LoadU(df, values + i);
    hn::StoreU(hn::TruncateTo(d16, kHalf ? fp16_codes(x) : bf16_codes(x)), d16, out + i);
  }
  for (; i < count; ++i) out[i] = kHalf ? float_to_fp16(values[i]) : float_to_bf16(values[i]);
}

}  // namespace

void EncodeFp16Impl(const float* values, std::size_t count, std::uint16_t* out) {
  encode_t<true>(values, count, out);
}
void EncodeBf16Impl(const float* values, std::size_t count, std::uint16_t* out) {
  encode_t<false>(values, count, out);
}

}  // namespace mixkv::kernels::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mixkv::kernels::detail {

HWY_EXPORT(EncodeFp16Impl);
HWY_EXPORT(EncodeBf16Impl);

void encode_fp16_row(const float* values, std::size_t count, std::uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(EncodeFp16Impl)(values, count, out);
}
void encode_bf16_row(const float* values, std::size_t count, std::uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(EncodeBf16Impl)(values, count, out);
}

}  // namespace mixkv::kernels::detail
#endif  // HWY_ONCE
