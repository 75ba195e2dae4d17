// mixkv's SiLU: x / (1 + e^-x) in float, with e^x computed in double and rounded once to float,
// so it is the correctly rounded float exponential wherever the double result is not within
// ~2^-47 of a float rounding midpoint (measured over all 2,239,889,410 floats of [-104, 89]:
// all but 2 give long double's exp rounded to float; glibc 2.36's expf differs from it on
// 170,648 of them, by one ulp), the same bits on every instruction set and every libm. One
// definition for every SiLU of the engine's own numerics (MLP gates, Gated DeltaNet and Mamba2
// gates, the recurrent convolutions); llama.cpp's is ggml_silu (attention_ggml.hpp).
#pragma once

#include <span>

namespace mixkv::kernels {

// e^x in double, then rounded to float: 0 below -104, +inf above 89 (beyond float's range
// either way), NaN for NaN.
float exp_rounded(float x);

// x / (1 + exp_rounded(-x)).
float silu(float x);

// up[i] *= silu(gate[i]) for every i, in vectors (Highway, the best target the CPU has); the
// same bits as the scalar silu for every element, so a row's result does not depend on where it
// sits in the span. Throws Error when the spans' sizes differ.
void silu_mul(std::span<const float> gate, std::span<float> up);

}  // namespace mixkv::kernels
