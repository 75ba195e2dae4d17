// The runner's arithmetic, shared by every block: projections, norms, rotary embedding and the
// scalar activations. Every function computes each output in one fixed order that depends only
// on its own inputs, never on the batch around it; with -ffp-contract=off (src/CMakeLists.txt)
// that makes a token's logits bit-identical alone or in any batch (docs/engine.md, determinism).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mixkv/cache/block_pool.hpp"

namespace mixkv::runner::ops {

// One dot product: eight interleaved partial sums (lane j takes i = j mod 8), folded pairwise.
float dot(const float* row, const float* x, std::int64_t in);
// Y[t, o] = sum_i W[o, i] X[t, i] for `tokens` rows of X, one dot() per output.
void matmul(std::span<const float> w, const float* x, std::int64_t tokens, std::int64_t in,
            std::int64_t out, float* y);
void rms_norm(const float* x, std::span<const float> w, std::int64_t n, double eps, float* y);
// RMSNorm of each `d`-wide head of `v` with the same weights (Qwen3's q_norm and k_norm).
void norm_heads(float* v, std::int64_t heads, std::int64_t d, std::span<const float> w, double eps);
// Rotary embedding, the rotate-half (GPT-NeoX / HF Llama) form.
void rope(float* x, std::int64_t heads, std::int64_t d, std::int64_t position, double theta);
// Scales each `d`-wide head to unit L2 norm (flash-linear-attention's l2norm, eps 1e-6).
void l2_normalise(float* v, std::int64_t heads, std::int64_t d);
float silu(float v);
float softplus(float v);   // PyTorch's (threshold 20: the identity above it)
float gelu_tanh(float v);  // PyTorch's gelu(approximate="tanh")
std::vector<std::int64_t> block_ids(std::span<const cache::BlockId> table);

}  // namespace mixkv::runner::ops
