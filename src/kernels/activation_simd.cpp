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

// silu of kN vectors side by side, each step for all of them before the next: one vector's
// steps are a chain of ~30 dependent double operations (the Taylor sum alone 22), which a core
// cannot run ahead of far enough to fill its units from a loop of one vector at a time.
template <int kN>
HWY_INLINE void silu_lanes(hn::Vec<DF>* x) {
  using namespace exp_steps;
  const DD dd;
  const DU du;
  const DF df;
  using VD = hn::Vec<DD>;
  VD r[kN], k[kN], p[kN];
  for (int i = 0; i < kN; ++i) {
    const auto neg = hn::Neg(hn::PromoteTo(dd, x[i]));
    const auto v = hn::Min(hn::Max(neg, hn::Set(dd, kLowest)), hn::Set(dd, kHighest));
    k[i] = hn::Round(hn::Mul(v, hn::Set(dd, kLog2e)));
    r[i] =
        hn::Sub(hn::Sub(v, hn::Mul(k[i], hn::Set(dd, kLn2Hi))), hn::Mul(k[i], hn::Set(dd, kLn2Lo)));
    p[i] = hn::Set(dd, kTaylor[0]);
  }
  for (int t = 1; t < kTerms; ++t)
    for (int i = 0; i < kN; ++i) p[i] = hn::Add(hn::Mul(p[i], r[i]), hn::Set(dd, kTaylor[t]));
  for (int i = 0; i < kN; ++i) {
    const auto bits = hn::BitCast(du, hn::Add(k[i], hn::Set(dd, kShifter)));
    const auto scale = hn::BitCast(
        dd,
        hn::ShiftLeft<52>(hn::Add(hn::Sub(bits, hn::Set(du, kShifterBits)), hn::Set(du, 1023))));
    // Rounded to float. From -x = 0x1.62e430p+6 (88.7228394) up, e^-x lies past the midpoint
    // between float's largest value and 2^128, so it rounds to +inf, as the scalar cast gives;
    // not every target's demotion does (Highway's scalar one stops at the largest float).
    const auto e = hn::IfThenElse(hn::Ge(hn::Neg(x[i]), hn::Set(df, 0x1.62e430p+6f)),
                                  hn::Set(df, std::numeric_limits<float>::infinity()),
                                  hn::DemoteTo(df, hn::Mul(p[i], scale)));
    // A NaN x gives NaN through the division whatever e is.
    x[i] = hn::Div(x[i], hn::Add(hn::Set(df, 1.0f), e));
  }
}

}  // namespace

void SiluMulImpl(const float* gate, float* up, std::size_t count) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  // Vectors side by side: 8 on AVX-512 (BM_SiluMul/smollm2/rows:16 on a Zen 5: 40-64 us one at a
  // time, 29-39 four, 26-27 eight); 4 on 16 registers (AVX2 and below).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  constexpr int kSide = 8;
#else
  constexpr int kSide = 4;
#endif
  std::size_t i = 0;
  for (; i + kSide * n <= count; i += kSide * n) {
    hn::Vec<DF> s[kSide];
    for (int j = 0; j < kSide; ++j) s[j] = hn::LoadU(df, gate + i + j * n);
    silu_lanes<kSide>(s);
    for (int j = 0; j < kSide; ++j) {
      hn::StoreU(hn::Mul(hn::LoadU(df, up + i + j * n), s[j]), df, up + i + j * n);
    }
  }
  for (; i + n <= count; i += n) {
    auto s = hn::LoadU(df, gate + i);
    silu_lanes<1>(&s);
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
