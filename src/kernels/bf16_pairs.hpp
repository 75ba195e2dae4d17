// What the bf16-pair orders share (the bf16 weight products' kBlockSum order in matmul.cpp and
// paged attention's AttentionOrder::kBf16Pairs): the run-time probe for AVX512-BF16's VDPBF16PS,
// and the floating-point mode every path of those orders runs in. VDPBF16PS reads subnormal inputs
// as zero and flushes subnormal results whatever the MXCSR says; with FTZ and DAZ set, the paths
// that add the same exact products with ordinary instructions give its bits.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MIXKV_BF16_PROBE 1
#include <cpuid.h>
#include <xmmintrin.h>  // _mm_getcsr / _mm_setcsr
#endif

namespace mixkv::kernels::detail {

// Whether the CPU has AVX512-BF16 (CPUID leaf 7, sub-leaf 1, EAX bit 5) beside AVX-512 BW.
inline bool avx512_bf16_cpu() {
#ifdef MIXKV_BF16_PROBE
  static const bool cpu = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7 || !__builtin_cpu_supports("avx512bw")) return false;
    __cpuid_count(7, 1, a, b, c, d);
    return ((a >> 5) & 1u) != 0;
  }();
  return cpu;
#else
  return false;
#endif
}

// FTZ (MXCSR bit 15) and DAZ (bit 6) on the calling thread while it lives, the caller's mode
// restored after (a worker's next task may belong to another order).
class FlushSubnormals {
 public:
#ifdef MIXKV_BF16_PROBE
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
#else
  FlushSubnormals() = default;
#endif
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
#ifdef MIXKV_BF16_PROBE
  unsigned saved_;
#endif
};

}  // namespace mixkv::kernels::detail
