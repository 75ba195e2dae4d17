#include "runner/ops.hpp"

#include <algorithm>
#include <cmath>

#include "mixkv/core/error.hpp"

namespace mixkv::runner::ops {

void matmul(const Matrix& w, const float* x, std::int64_t tokens, float* y,
            kernels::ThreadPool* pool) {
  kernels::matmul(w.view, std::span<const float>(x, static_cast<std::size_t>(tokens * w.cols())),
                  std::span<float>(y, static_cast<std::size_t>(tokens * w.rows())), pool);
}

void matmul_many(std::initializer_list<Projection> projections, const float* x, std::int64_t tokens,
                 kernels::ThreadPool* pool, const kernels::RowsEpilogue& epilogue) {
  constexpr std::size_t kMost = 4;
  if (projections.size() > kMost) throw_internal("ops::matmul_many: more than four projections");
  kernels::MatmulProduct products[kMost];
  std::size_t n = 0;
  for (const Projection& p : projections) {
    products[n++] = {p.w->view,
                     std::span<float>(p.y, static_cast<std::size_t>(tokens * p.w->rows()))};
  }
  if (n == 0) return;
  kernels::matmul_many(
      std::span<const kernels::MatmulProduct>(products, n),
      std::span<const float>(x, static_cast<std::size_t>(tokens * projections.begin()->w->cols())),
      pool, epilogue);
}

void for_chunks(kernels::ThreadPool* pool, std::int64_t n, std::int64_t grain,
                const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  const std::int64_t most = pool != nullptr ? pool->size() : 1;
  const std::int64_t chunks = std::min(most, n / std::max<std::int64_t>(grain, 1));
  if (chunks < 2) return fn(0, n);
  // Chunk c is [c n / chunks, (c + 1) n / chunks): even sizes, no chunk empty.
  pool->parallel_for(chunks,
                     [&](std::int64_t c, int) { fn(c * n / chunks, (c + 1) * n / chunks); });
}

namespace {

// y = x / rms(x) * w, given x's sum of squares.
void rms_scale(const float* x, double ss, std::span<const float> w, std::int64_t n, double eps,
               float* y) {
  const auto mean = static_cast<float>(ss / static_cast<double>(n));
  const float inv = 1.0f / std::sqrt(mean + static_cast<float>(eps));
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[static_cast<std::size_t>(i)];
}

// rms_norm of kRows consecutive rows, their sums side by side: each is still one add after
// another over its row (the bits of rms_norm), but a row's chain of dependent double adds (~4
// cycles each, ~1 us for 576) no longer waits for the previous row's.
template <int kRows>
void rms_norm_group(const float* x, std::span<const float> w, std::int64_t n, double eps,
                    float* y) {
  double ss[kRows] = {};
  for (std::int64_t i = 0; i < n; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const float v = x[r * n + i];
      ss[r] += static_cast<double>(v * v);
    }
  }
  for (int r = 0; r < kRows; ++r) rms_scale(x + r * n, ss[r], w, n, eps, y + r * n);
}

}  // namespace

// ggml's steps (ggml_compute_forward_rms_norm_f32): the squares, rounded to float, summed in
// double; their mean rounded to float; then 1 / sqrt(mean + eps) in float, x times it, times the
// weight. The block-format products quantise their input, so a last-bit difference here moves
// codes there; matching llama.cpp's bits keeps those codes the same.
void rms_norm(const float* x, std::span<const float> w, std::int64_t n, double eps, float* y) {
  rms_norm_group<1>(x, w, n, eps, y);
}

void rms_norm_rows(const float* x, std::int64_t rows, std::span<const float> w, std::int64_t n,
                   double eps, float* y) {
  std::int64_t r = 0;
  for (; r + 4 <= rows; r += 4) rms_norm_group<4>(x + r * n, w, n, eps, y + r * n);
  switch (rows - r) {
    case 3:
      return rms_norm_group<3>(x + r * n, w, n, eps, y + r * n);
    case 2:
      return rms_norm_group<2>(x + r * n, w, n, eps, y + r * n);
    case 1:
      return rms_norm_group<1>(x + r * n, w, n, eps, y + r * n);
    default:
      return;
  }
}

void norm_heads(float* v, std::int64_t heads, std::int64_t d, std::span<const float> w,
                double eps) {
  rms_norm_rows(v, heads, w, d, eps, v);
}

void rope_angles(RopeMode mode, std::int64_t d, std::int64_t position, double theta, float* cs) {
  const std::int64_t half = d / 2;
  if (mode == RopeMode::kPairsGgml) {
    // ggml's rope cache: the running angle multiplied by theta_scale after each pair.
    const float theta_scale = std::pow(static_cast<float>(theta), -2.0f / static_cast<float>(d));
    auto angle = static_cast<float>(position);
    for (std::int64_t i = 0; i < half; ++i) {
      cs[2 * i] = std::cos(angle);
      cs[2 * i + 1] = std::sin(angle);
      angle *= theta_scale;
    }
    return;
  }
  for (std::int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) *
                         std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    cs[2 * i] = static_cast<float>(std::cos(angle));
    cs[2 * i + 1] = static_cast<float>(std::sin(angle));
  }
}

void rope_rotate(RopeMode mode, float* x, std::int64_t heads, std::int64_t d, const float* cs) {
  const std::int64_t half = d / 2;
  for (std::int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (std::int64_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      // Halves: dimension i with i + d/2; pairs: 2i with 2i + 1.
      float* p0 = mode == RopeMode::kHalves ? v + i : v + 2 * i;
      float* p1 = mode == RopeMode::kHalves ? v + i + half : v + 2 * i + 1;
      const float a = *p0, b = *p1;
      if (mode == RopeMode::kPairsGgml) {
        // GCC contracts ggml's x0 cos - x1 sin and x0 sin + x1 cos into one fused multiply-add
        // each, the first product of each fused (found against llama.cpp's tensors: every output
        // of every position).
        *p0 = std::fma(a, c, -(b * s));
        *p1 = std::fma(a, s, b * c);
      } else {
        *p0 = a * c - b * s;
        *p1 = b * c + a * s;
      }
    }
  }
}

void l2_normalise(float* v, std::int64_t heads, std::int64_t d) {
  for (std::int64_t hh = 0; hh < heads; ++hh) {
    float* x = v + hh * d;
    float ss = 0.0f;
    for (std::int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss + 1e-6f);
    for (std::int64_t i = 0; i < d; ++i) x[i] *= inv;
  }
}

float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

float gelu_tanh(float g) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

std::vector<std::int64_t> block_ids(std::span<const cache::BlockId> table) {
  std::vector<std::int64_t> blocks(table.size());
  std::transform(table.begin(), table.end(), blocks.begin(),
                 [](cache::BlockId b) { return std::int64_t{b.value()}; });
  return blocks;
}

}  // namespace mixkv::runner::ops
