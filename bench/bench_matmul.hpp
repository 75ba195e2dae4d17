// A plain f32 matrix multiply in Highway, the yardstick for prefill attention's FLOP/s: both run
// in the same benchmark program on the same threads, so their ratio says how much of the
// machine's multiply-add rate the attention kernel reaches.
#pragma once

#include <cstdint>

#include "mixkv/kernels/thread_pool.hpp"

namespace mixkv::bench {

// Rows of C per register tile (6 rows x 2 vectors = 12 accumulators, which fits even AVX2's 16
// registers with the two B vectors and one broadcast).
inline constexpr std::int64_t kMatmulRows = 6;

// c[m x n] = a[m x k] * b[k x n], row-major. m must be a multiple of kMatmulRows and n of twice the
// vector width in floats (matmul_column_multiple()); throws std::invalid_argument otherwise.
// Rows are spread over `pool` when given.
void matmul(const float* a, const float* b, float* c, std::int64_t m, std::int64_t n,
            std::int64_t k, kernels::ThreadPool* pool);

std::int64_t matmul_column_multiple();

}  // namespace mixkv::bench
