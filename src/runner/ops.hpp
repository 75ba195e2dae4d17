// The runner's arithmetic, shared by every block: projections, norms, rotary embedding and the
// scalar activations. Every function computes each output in one fixed order that depends only
// on its own inputs, never on the batch around it; with -ffp-contract=off (src/CMakeLists.txt)
// that makes a token's logits bit-identical alone or in any batch (docs/engine.md, determinism).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "mixkv/cache/block_pool.hpp"
#include "mixkv/kernels/matmul.hpp"
#include "mixkv/kernels/thread_pool.hpp"

namespace mixkv::runner {

// A weight matrix [rows, cols] as the kernels read it, in its stored type: a view into a
// memory-mapped GGUF file (which the runner keeps open), or into float values the runner holds
// (generated weights, safetensors checkpoints, or a type the kernels do not read, decoded once).
// Copies share the values (a tied LM head is the embedding).
struct Matrix {
  kernels::WeightView view;
  std::shared_ptr<const std::vector<float>> owned;  // null for a view into a file
  // The kBlockSum order's packed copy that view.packed points into (RunnerOptions::weight_order).
  std::shared_ptr<const kernels::PackedWeight> packed;
  std::int64_t rows() const { return view.rows; }
  std::int64_t cols() const { return view.cols; }
};

}  // namespace mixkv::runner

namespace mixkv::runner::ops {

// Y[t, o] = sum_i W[o, i] X[t, i] for `tokens` rows of X in one kernels::matmul call (W streamed
// once for all rows); each output's bits depend on its own row alone.
void matmul(const Matrix& w, const float* x, std::int64_t tokens, float* y,
            kernels::ThreadPool* pool);
// One weight's output rows in a matmul_many call.
struct Projection {
  const Matrix* w;
  float* y;  // [tokens, w->rows()]
};
// Several weights against the same rows of X (a layer's q, k and v; gate and up) in one
// kernels::matmul_many call: X quantised once and one parallel region instead of one per weight;
// each output has the bits ops::matmul gives it. With an epilogue (same row counts), each task
// runs it on the rows it computed (kernels::matmul_many).
void matmul_many(std::initializer_list<Projection> projections, const float* x, std::int64_t tokens,
                 kernels::ThreadPool* pool, const kernels::RowsEpilogue& epilogue = {});
// fn(begin, end) over [0, n) in contiguous chunks of at least `grain` items, one chunk per pool
// thread at most, in one parallel region; on this thread alone when the pool is null or n holds
// fewer than two grains. For elementwise and per-row work (SwiGLU, norms, residuals, RoPE) whose
// every output depends on its own inputs only, so the bits do not depend on the split.
void for_chunks(kernels::ThreadPool* pool, std::int64_t n, std::int64_t grain,
                const std::function<void(std::int64_t, std::int64_t)>& fn);
void rms_norm(const float* x, std::span<const float> w, std::int64_t n, double eps, float* y);
// rms_norm of `rows` consecutive rows of n (y may be x): each row's bits as rms_norm's, several
// rows' sums computed side by side.
void rms_norm_rows(const float* x, std::int64_t rows, std::span<const float> w, std::int64_t n,
                   double eps, float* y);
// RMSNorm of each `d`-wide head of `v` with the same weights (Qwen3's q_norm and k_norm).
void norm_heads(float* v, std::int64_t heads, std::int64_t d, std::span<const float> w, double eps);
// Rotary embedding in three forms. kHalves: the rotate-half (GPT-NeoX / HF Llama) form, dimension
// i pairs with i + d/2. kPairs: the same rotation over adjacent pairs (2i, 2i + 1), ggml's default
// mode: what Llama GGUF files need, whose attn_q / attn_k rows llama.cpp's converter permuted so
// that pair (2i, 2i + 1) of a head holds HF's dimensions (i, i + d/2); attention scores are then
// those of HF's model. kPairsGgml: kPairs as ggml computes it (ggml_compute_forward_rope_f32,
// normal mode, no scaling): the angle of pair i is position * theta_scale^i by a running product
// in float (theta_scale = powf(theta, -2/d)), cos and sin in float, and each output two products
// and one add or subtract, each rounded. The other two compute each angle in double from the
// position alone, position * theta^(-2i/d).
enum class RopeMode { kHalves, kPairs, kPairsGgml };
// The d/2 (cos, sin) pairs of a row at `position`, into cs[0, d): they depend on the position,
// theta and d alone, so a forward computes them once per row for all its layers.
void rope_angles(RopeMode mode, std::int64_t d, std::int64_t position, double theta, float* cs);
// Rotates each of the `heads` d-wide heads of x by the angles rope_angles gave.
void rope_rotate(RopeMode mode, float* x, std::int64_t heads, std::int64_t d, const float* cs);
// Scales each `d`-wide head to unit L2 norm (flash-linear-attention's l2norm, eps 1e-6).
void l2_normalise(float* v, std::int64_t heads, std::int64_t d);
float softplus(float v);   // PyTorch's (threshold 20: the identity above it)
float gelu_tanh(float v);  // PyTorch's gelu(approximate="tanh")
std::vector<std::int64_t> block_ids(std::span<const cache::BlockId> table);

}  // namespace mixkv::runner::ops
