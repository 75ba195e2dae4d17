// What every AMX (Advanced Matrix Extensions) kernel needs, shared by the weight products
// (matmul_amx.hpp) and paged attention (attention_amx.cpp): the run-time probe and the tile
// configuration record. Only x86-64 with GCC or Clang defines MIXKV_AMX.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MIXKV_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

// The instruction sets an AMX kernel function is compiled for (the rest of the binary is not).
#define MIXKV_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")))

namespace mixkv::kernels::detail::amx_support {

// LDTILECFG's 64-byte record, palette 1: per tile its rows and bytes per row.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// CPUID leaf 7: AMX-BF16 (EDX 22), AMX-TILE (EDX 24), AVX-512 F/BW/VL, AVX512-BF16 (leaf 7
// sub-leaf 1, EAX 5); then the kernel's permission for the tile data (Linux 5.16+, arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, process-wide).
inline bool probe() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a < 7) return false;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  const bool tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
  const bool avx512 = ((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);  // F, BW, VL
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
  const bool avx512bf16 = (a >> 5) & 1;
  if (!tile || !bf16 || !avx512 || !avx512bf16) return false;
  constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kXtileData = 18;         // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

// Whether this CPU and OS run AMX-BF16 tiles (probed once per process).
inline bool tiles_usable() {
  static const bool ok = probe();
  return ok;
}

}  // namespace mixkv::kernels::detail::amx_support
#endif
