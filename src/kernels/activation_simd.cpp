// silu_mul's rows in Highway vectors (one copy per instruction set, the best chosen at run
// time): the steps of activation.cpp's exp_rounded and silu on double lanes, half a vector of
// floats at a time.
#include "kernels/activation_simd.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>

#include "mixkv/kernels/activation.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activation_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// Highway's headers after foreach_target.h, as its documentation requires.
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace mixkv::kernels::detail::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DD = hn::ScalableTag<double>;
using DU = hn::RebindToUnsigned<DD>;
using DF = hn::Rebind<float, DD>;  // as many floats as a vector holds doubles

HWY_INLINE hn::Vec<DF> silu_lanes(hn::Vec<DF> x) {
  using namespace exp_steps;
  const DD dd;
  const DU du;
  const DF df;
  const auto neg = hn::Neg(hn::PromoteTo(dd, x));
  const auto v = hn::Min(hn::Max(neg, hn::Set(dd, kLowest)), hn::Set(dd, kHighest));
  const auto k = hn::Round(hn::Mul(v, hn::Set(dd, kLog2e)));
  const auto r =
      hn::Sub(hn::Sub(v, hn::Mul(k, hn::Set(dd, kLn2Hi))), hn::Mul(k, hn::Set(dd, kLn2Lo)));
  auto p = hn::Set(dd, kTaylor[0]);
  for (int i = 1; i < kTerms; ++i) p = hn::Add(hn::Mul(p, r), hn::Set(dd, kTaylor[i]));
  const auto bits = hn::BitCast(du, hn::Add(k, hn::Set(dd, kShifter)));
  const auto scale = hn::BitCast(
      dd, hn::ShiftLeft<52>(hn::Add(hn::Sub(bits, hn::Set(du, kShifterBits)), hn::Set(du, 1023))));
  // Rounded to float. From -x = 0x1.62e430p+6 (88.7228394) up, e^-x lies past the midpoint
  // between float's largest value and 2^128, so it rounds to +inf, as the scalar cast gives;
  // not every target's demotion does (Highway's scalar one stops at the largest float).
  const auto e = hn::IfThenElse(hn::Ge(hn::Neg(x), hn::Set(df, 0x1.62e430p+6f)),
                                hn::Set(df, std::numeric_limits<float>::infinity()),
                                hn::DemoteTo(df, hn::Mul(p, scale)));
  // A NaN x gives NaN through the division whatever e is.
  return hn::Div(x, hn::Add(hn::Set(df, 1.0f), e));
}

}  // namespace

void SiluMulImpl(const float* gate, float* up, std::size_t count) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + n <= count; i += n) {
    const auto s = silu_lanes(hn::LoadU(df, gate + i));
    hn::StoreU(hn::Mul(hn::LoadU(df, up + i), s), df, up + i);
  }
  for (; i < count; ++i) up[i] *= silu(gate[i]);
}

}  // namespace mixkv::kernels::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mixkv::kernels::detail {

HWY_EXPORT(SiluMulImpl);

void silu_mul_row(const float* gate, float* up, std::size_t count) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, count);
}

}  // namespace mixkv::kernels::detail
#endif  // HWY_ONCE
