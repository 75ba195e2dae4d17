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
        auto c00 = hn::LoadU(df, ci), c01 = hn::LoadU(df, ci + w);
        auto c10 = hn::LoadU(df, ci + n), c11 = hn::LoadU(df, ci + n + w);
        auto c20 = hn::LoadU(df, ci + 2 * n), c21 = hn::LoadU(df, ci + 2 * n + w);
        auto c30 = hn::LoadU(df, ci + 3 * n), c31 = hn::LoadU(df, ci + 3 * n + w);
        auto c40 = hn::LoadU(df, ci + 4 * n), c41 = hn::LoadU(df, ci + 4 * n + w);
        auto c50 = hn::LoadU(df, ci + 5 * n), c51 = hn::LoadU(df, ci + 5 * n + w);
        const float* ai = a + i * k;
        for (std::int64_t p = k0; p < k1; ++p) {
          const auto b0 = hn::LoadU(df, b + p * n + j);
          const auto b1 = hn::LoadU(df, b + p * n + j + w);
          auto x = hn::Set(df, ai[p]);
          c00 = hn::MulAdd(x, b0, c00);
          c01 = hn::MulAdd(x, b1, c01);
          x = hn::Set(df, ai[k + p]);
          c10 = hn::MulAdd(x, b0, c10);
          c11 = hn::MulAdd(x, b1, c11);
          x = hn::Set(df, ai[2 * k + p]);
          c20 = hn::MulAdd(x, b0, c20);
          c21 = hn::MulAdd(x, b1, c21);
          x = hn::Set(df, ai[3 * k + p]);
          c30 = hn::MulAdd(x, b0, c30);
          c31 = hn::MulAdd(x, b1, c31);
          x = hn::Set(df, ai[4 * k + p]);
          c40 = hn::MulAdd(x, b0, c40);
          c41 = hn::MulAdd(x, b1, c41);
          x = hn::Set(df, ai[5 * k + p]);
          c50 = hn::MulAdd(x, b0, c50);
          c51 = hn::MulAdd(x, b1, c51);
        }
        hn::StoreU(c00, df, ci), hn::StoreU(c01, df, ci + w);
        hn::StoreU(c10, df, ci + n), hn::StoreU(c11, df, ci + n + w);
        hn::StoreU(c20, df, ci + 2 * n), hn::StoreU(c21, df, ci + 2 * n + w);
        hn::StoreU(c30, df, ci + 3 * n), hn::StoreU(c31, df, ci + 3 * n + w);
        hn::StoreU(c40, df, ci + 4 * n), hn::StoreU(c41, df, ci + 4 * n + w);
        hn::StoreU(c50, df, ci + 5 * n), hn::StoreU(c51, df, ci + 5 * n + w);
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
