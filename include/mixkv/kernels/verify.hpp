// `mixkv verify`: prove a plan by running it. Plans the model small (same geometry rules, less
// memory), allocates the planned tensors for real, writes random K/V through the slot mappings
// of a batch of requests, runs every attention group's paged kernel with the group's own
// parameters (decode, then a short extend) and compares with the dense reference over the
// logical sequences; then writes random states into every GDN/Mamba2 group's state blocks and
// checks the recurrent kernels (decode, speculative checkpoints, GDN chunked prefill) against
// theirs. Also the comparison the kernel tests use. docs/kernels.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/model.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::kernels {

// What the cache holds after a write of `values`: each element through the dtype and scale.
std::vector<float> stored_values(DType dtype, std::span<const float> values, float scale);

// One request as the kernel sees it (kernel block table) and as the reference sees it (its
// logical K/V as written, before the cache's rounding, and its queries).
struct CheckedSequence {
  std::span<const std::int64_t> kernel_pages;
  std::int64_t kv_len = 0;
  std::int64_t num_queries = 1;
  std::span<const float> k, v, q;
};

// Kernel against reference, twice: over the values the cache holds (float arithmetic only) and
// over the original values (plus the dtype's rounding of K and V).
struct Comparison {
  double max_error_stored = 0;
  double tolerance_stored = 0;
  double max_error_original = 0;
  double tolerance_original = 0;
  double max_reference = 0;  // max |reference output|, for a relative error
  bool ok() const {
    return max_error_stored <= tolerance_stored && max_error_original <= tolerance_original;
  }
  void merge(const Comparison& other);
  std::string to_string() const;
};

// Runs paged_attention(spec, layer, ...) over `batch` and dense_attention(reference_spec, ...)
// per sequence. `reference_spec` is the truth (the layer's own parameters), `spec` what the
// kernel is given.
//
// Tolerances. Float arithmetic: logits carry a relative error of a few float ulps of
// scale * sum|q||k|, the softmax sums a few ulps per halving of the key count; we allow
// 64 ulps of (1 + logit bound) times max|v|. Dtype: a stored K element differs from the
// original by at most rel*|k| + abs*scale_k, so a logit moves by at most
// delta = scale * sum_d |q_d| (rel |k_d| + abs scale_k); softmax weights then move by at most
// exp(2 delta) - 1 in total, and each V element by rel*|v| + abs*scale_v.
Comparison compare_with_reference(const AttentionSpec& spec, const AttentionSpec& reference_spec,
                                  const layout::LayerGeometry& layer, KvScales scales,
                                  std::span<const std::byte> cache,
                                  std::span<const CheckedSequence> batch,
                                  std::span<const float> sinks);

// A deliberate fault in what the kernel is given (never in how the data was written), so tests
// and users can see verify catch it.
enum class PlantedFault {
  kNone,
  kKernelPageStride,  // the manager page split into one kernel page too many
  kFullWindow,        // a sliding-window group run with window_left = -1
  // A drafter's group read with the target's kernel page size (the bug of an engine that picks
  // one kernel page for the whole model): its geometry is rebuilt as if the draft's attention
  // group had the first target attention group's kernel page.
  kTargetKernelPage,
  kStateSlot,  // a recurrent layer's states read and written one manager page too far
};

struct VerifyOptions {
  // memory_bytes is the scaled-down budget; 0 (the default) takes the smallest scale, to 1 MiB
  // and at most 512 MiB, whose plan holds `requests` requests of `longest_request` tokens
  // (shorter ones where 512 MiB does not hold those).
  // max_model_len 0 is min(2048, the model's own).
  plan::PlanOptions plan;
  int requests = 4;
  std::uint64_t seed = 1;
  std::int64_t longest_request = 1024;  // tokens of the first (longest) request, at most
  // Layers checked per group, at most (first and last, then an even sample between); 0: as many
  // as the dense reference's work budget allows.
  int max_layers_per_group = 0;
  // GDN and KDA groups: also check the chunked prefill (a chunk and a part, on the first
  // request). Its reference is most of a large hybrid's verify time (Qwen3.5-27B: ~17 s of ~20 s
  // per backend); sweeps over every pair, which are about geometry, turn it off and leave the
  // prefill kernel to the tests that check it on its own.
  bool chunked_prefill = true;
  PlantedFault fault = PlantedFault::kNone;
  // Group the fault applies to: the attention group (stride, window) or the recurrent KV-cache
  // group (state slot); -1: every group.
  int fault_group = -1;
  // Called after each layer is checked: (layers done, layers in all).
  std::function<void(int, int)> progress;
};

enum class GroupStatus { kPass, kMismatch, kSkipped, kNotVerified };
std::string_view to_string(GroupStatus status);

struct GroupResult {
  int attention_group = -1;  // -1 for recurrent KV-cache groups (kPass/kMismatch for GDN and
                             // Mamba2, kNotVerified for kinds without a kernel: KDA, Mamba1)
  int kv_cache_group = 0;
  std::string kind;    // first layer's kind
  std::string params;  // window/causal/dtype/heads, for the table
  std::vector<std::string> layers;
  int layers_checked = 0;
  GroupStatus status = GroupStatus::kPass;
  std::string reason;        // why skipped / not verified, or the first mismatching layer
  double max_abs_error = 0;  // over the values the cache holds
  double max_rel_error = 0;  // max_abs_error / max |reference|
  double tolerance = 0;
  double max_abs_error_original = 0;  // over the values before the cache's rounding
  double tolerance_original = 0;
};

struct VerifyRequest {
  std::int64_t kv_len = 0;
  std::int64_t extend_queries = 1;
  int shares_prefix_with = -1;  // request whose blocks hold its first shared_tokens tokens
  std::int64_t shared_tokens = 0;
};

struct VerifyReport {
  plan::CachePlan plan;  // the scaled-down plan that was run
  std::vector<VerifyRequest> requests;
  std::vector<GroupResult> groups;
  std::int64_t bytes_allocated = 0;
  bool mismatch() const;  // any group kMismatch
};

// Throws Error when the model cannot be planned in the scaled memory, or the options are bad.
VerifyReport verify(const model::ModelDesc& desc, const VerifyOptions& options);

}  // namespace mixkv::kernels
