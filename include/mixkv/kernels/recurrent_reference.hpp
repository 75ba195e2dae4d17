// Dense references for the recurrent kernels: plain per-token loops in double precision over one
// request's contiguous state and inputs, independent of the kernels' code, and the tolerances the
// kernels are held to. The kernel tests and `mixkv verify` use them. Their loops are ordered for
// the cache where that costs nothing in clarity (the delta rule runs a block of state columns
// through every token), never reassociating a sum.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mixkv/kernels/recurrent_kernel.hpp"

namespace mixkv::kernels {

// One request's run: outputs [num_tokens, ...], the state after every token, and the largest
// sum of absolute terms behind any output or state element (what float rounding scales with).
struct RecurrentRun {
  std::vector<double> out;
  std::vector<std::vector<double>> states;  // states[i]: after token i (or only the last)
  double magnitude = 0;
};

// `state` is the request's state tensor as the cache holds it (decoded); inputs are this
// request's rows only (same layouts as the kernels', with num_tokens rows). With
// `every_state` false only the final state is kept (long prefills).
RecurrentRun reference_conv(const ConvSpec& spec, std::span<const float> state,
                            std::int64_t num_tokens, const ConvInputs& inputs,
                            bool every_state = true);
RecurrentRun reference_gdn(const GdnSpec& spec, std::span<const float> state,
                           std::int64_t num_tokens, const GdnInputs& inputs,
                           bool every_state = true);
RecurrentRun reference_kda(const KdaSpec& spec, std::span<const float> state,
                           std::int64_t num_tokens, const KdaInputs& inputs,
                           bool every_state = true);
RecurrentRun reference_mamba2(const Mamba2Spec& spec, std::span<const float> state,
                              std::int64_t num_tokens, const Mamba2Inputs& inputs,
                              bool every_state = true);

// Tolerances. The kernels compute in float: each token's dot products of length `reduction`
// and the carried state add a few float ulps of the run's magnitude per token, so outputs get
// 16 ulps x (reduction + tokens) x magnitude. A stored state is also rounded once to its dtype:
// plus rounding_bound(dtype) of the largest state value.
double output_tolerance(std::int64_t reduction, std::int64_t tokens, double magnitude);
double state_tolerance(DType dtype, std::int64_t reduction, std::int64_t tokens, double magnitude,
                       double max_state);
// The largest |x| of `values` (0 for none): a run's magnitude, a state's largest value.
double max_abs(std::span<const double> values);

}  // namespace mixkv::kernels
