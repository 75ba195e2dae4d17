// Scratch buffers that start on a cache line.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace mixkv::kernels::detail {

// An allocator whose buffers start on a 64-byte cache line. The kernels' scratch rows (queries,
// scores, accumulators, quantised x) are read and written as whole vectors at multiples of the
// vector from their start, and the heap's 16-byte alignment left every other 32-byte access of
// AVX2 (and three of four 64-byte ones of AVX-512) straddling two lines, a second access each:
// a two-thread decode's tasks took 11-27% longer than one thread's, each worker as unlucky as
// its heap (docs/kernels.md, "Scratch on cache lines").
template <class T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kLine{64};
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kLine)); }
  void deallocate(T* p, std::size_t n) noexcept { ::operator delete(p, n * sizeof(T), kLine); }
  template <class U>
  bool operator==(const LineAligned<U>&) const noexcept {
    return true;
  }
};

template <class T>
using LineVector = std::vector<T, LineAligned<T>>;

}  // namespace mixkv::kernels::detail
