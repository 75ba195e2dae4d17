// llama.cpp's numerics, for GGUF models whose reference is llama.cpp itself: its non-flash CPU
// attention over an f16 cache, and the exp its softmax and SiLU use. Each function computes what
// ggml's AVX-512 kernels of the pinned llama-cpp-python build compute (scripts/llamacpp-venv.sh;
// facts from ggml-cpu's vec.cpp, vec.h and ops.cpp), bit for bit, in portable code: the same
// roundings in the same order, not the same instructions. docs/kernels.md, "llama.cpp's attention
// numerics".
#pragma once

#include <span>

#include "mixkv/kernels/attention_kernel.hpp"

namespace mixkv::kernels {

// ggml_v_expf (AVX-512 form): x = n ln2 + b with n = round(x log2 e), a degree-5 polynomial in
// b by fused multiply-adds, times 2^n; 0 below and infinity above |n| > 192.
float ggml_expf(float x);

// ggml_v_silu: x / (1 + ggml_expf(0 - x)).
float ggml_silu(float x);

// ggml_vec_swiglu_f32: up[i] *= ggml_silu(gate[i]) (the same bits), over rows at once. Throws
// Error when the sizes differ.
void ggml_swiglu(std::span<const float> gate, std::span<float> up);

// x rounded to the nearest fp16 value, ties to even, as a float: fp16_to_float(float_to_fp16(x))
// by float adds (the rounding of q and the probabilities, hot in ggml_attention).
float fp16_round(float x);

// Attention as llama.cpp computes it for one query at a time (its decode path, n_ubatch 1):
// per query head, KQ = ggml_vec_dot_f16 of the f16 key rows with the query rounded to f16;
// ggml_soft_max_ext (scale, then exp(x - max) by ggml_expf, summed 16 at a time in double, times
// the float inverse); the probabilities rounded to f16; KQV = ggml_vec_dot_f16 of each
// dimension's f16 values with them over the padded key count llama.cpp uses (a multiple of 32,
// at least 32). The order depends on the query's position alone, so a query gives the same bits
// alone, in a prefill chunk or a verify block, at any batch or thread count.
// Takes what paged_attention takes; the cache must be fp16, the layer causal without window,
// soft cap or sinks (else Error, kUnsupported), and head sizes a multiple of 16.
void ggml_attention(const AttentionSpec& spec, const layout::LayerGeometry& layer,
                    const AttentionInputs& inputs, std::span<float> out);

// Lets the functions above use their AVX2 + FMA copy (the default where the CPU has both) or
// not (the baseline copy); returns whether they now do. For tests: both give the same bits.
bool set_ggml_avx2(bool enabled);

// Whether ggml_attention serves `spec` (the checks it would throw for, without throwing).
bool ggml_attention_serves(const AttentionSpec& spec);

}  // namespace mixkv::kernels
