#include "bench_matmul.hpp"

#include <algorithm>
#include <stdexcept>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench_matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace mixkv::bench::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// The depth of one pass over K: the B panel (kDepth x 2 vectors) stays in L1 while every row
// tile of A streams past it.
constexpr std::int64_t kDepth = 256;
constexpr std::int64_t kRows = kMatmulRows;

// C[rows r0..r1) += A * B over the whole K, in K blocks.
void MatmulRows(const float* a, const float* b, float* c, std::int64_t r0, std::int64_t r1,
                std::int64_t n, std::int64_t k) {
  const DF df;
  const auto w = static_cast<std::int64_t>(hn::Lanes(df));
  for (std::int64_t k0 = 0; k0 < k; k0 += kDepth) {
    const std::int64_t k1 = std::min(k, k0 + kDepth);
    for (std::int64_t j = 0; j < n; j += 2 * w) {
      for (std::int64_t i = r0; i < r1; i += kRows) {
        float* ci = c + i * n + j;
        hn::Vec<DF> c0[kRows], c1[kRows];  // row r of the tile: columns j.. and j + w..
        for (std::int64_t r = 0; r < kRows; ++r) {
          c0[r] = hn::LoadU(df, ci + r * n);
          c1[r] = hn::LoadU(df, ci + r * n + w);
        }
        const float* ai = a + i * k;
        for (std::int64_t p = k0; p < k1; ++p) {
          const auto b0 = hn::LoadU(df, b + p * n + j);
          const auto b1 = hn::LoadU(df, b + p * n + j + w);
          for (std::int64_t r = 0; r < kRows; ++r) {
            const auto x = hn::Set(df, ai[r * k + p]);
            c0[r] = hn::MulAdd(x, b0, c0[r]);
            c1[r] = hn::MulAdd(x, b1, c1[r]);
          }
        }
        for (std::int64_t r = 0; r < kRows; ++r) {
          hn::StoreU(c0[r], df, ci + r * n);
          hn::StoreU(c1[r], df, ci + r * n + w);
        }
      }
    }
  }
}

std::int64_t ColumnMultiple() { return 2 * static_cast<std::int64_t>(hn::Lanes(DF())); }

}  // namespace mixkv::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mixkv::bench {

HWY_EXPORT(MatmulRows);
HWY_EXPORT(ColumnMultiple);

std::int64_t matmul_column_multiple() { return HWY_DYNAMIC_DISPATCH(ColumnMultiple)(); }

void matmul(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n,
            std::int64_t k, kernels::ThreadPool* pool) {
  if (m % kMatmulRows != 0 || n % matmul_column_multiple() != 0 || k <= 0) {
    throw std::invalid_argument("matmul: m must be a multiple of 6, n of twice the vector width");
  }
  std::fill(c, c + m * n, 0.0f);
  // Tasks of 8 register tiles of rows: C rows are disjoint, so workers never share a write.
  constexpr std::int64_t kTaskRows = 8 * kMatmulRows;
  const std::int64_t tasks = (m + kTaskRows - 1) / kTaskRows;
  const auto run = [&](std::int64_t t, int) {
    HWY_DYNAMIC_DISPATCH(MatmulRows)
    (a, b, c, t * kTaskRows, std::min(m, (t + 1) * kTaskRows), n, k);
  };
  if (pool != nullptr) {
    pool->parallel_for(tasks, run);
  } else {
    for (std::int64_t t = 0; t < tasks; ++t) run(t, 0);
  }
}

}  // namespace mixkv::bench
#endif  // HWY_ONCE
