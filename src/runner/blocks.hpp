// The runner's building blocks, shared by every architecture family: attention over the planned
// cache, Gated DeltaNet and Mamba2 mixers over recurrent state blocks, the MLP variants, and the
// decoder block that composes one mixer and one MLP with their norms and residuals. A family's
// file (llama.cpp, gemma2.cpp, nemotron_h.cpp, qwen3_next.cpp) builds its layers from these at
// load time; forward() then runs them without asking which family they came from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/recurrent_kernel.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "runner/ops.hpp"

namespace mixkv::runner {

// Buffers the layers of a forward reuse one after the other (each layer overwrites what it
// reads), kept by the runner between forwards: a decode step then allocates nothing per layer.
struct Scratch {
  std::vector<float> q, k, v, attn;  // Attention::run
  std::vector<float> gate, up;       // Mlp::run
  std::vector<kernels::PagedSequence> seqs;
  std::vector<std::int64_t> slots;  // each row's cache slot (Attention::run)
  // RoPE's (cos, sin) pairs of every row of the forward and what they were computed for: the
  // attention layers share them (ops::rope_angles depends on the position, theta and d alone).
  struct RopeAngles {
    ops::RopeMode mode = ops::RopeMode::kHalves;
    std::int64_t d = 0;
    double theta = 0;
    std::vector<std::int64_t> positions;
    std::vector<float> cs;  // [rows, d]
  } rope;
};

// What a block sees of one forward besides its rows.
struct Step {
  std::span<const SequenceInput> batch;
  std::span<const std::int64_t> positions;       // per token row
  std::vector<std::vector<std::byte>>* tensors;  // the plan's cache tensors
  std::int64_t hidden = 0;
  kernels::ThreadPool* pool = nullptr;  // matrix products and attention; null: this thread
  Scratch* scratch = nullptr;           // null: each layer allocates its own
  std::int64_t rows() const { return static_cast<std::int64_t>(positions.size()); }
};

// A token mixer: attention or a recurrent layer. Reads the block's normed rows, writes its
// output rows (hidden wide).
class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual void run(const Step& step, std::span<const float> normed, std::span<float> out) const = 0;
  // The kernel spec of an attention mixer; nullptr for the others.
  virtual const kernels::AttentionSpec* attention_spec() const { return nullptr; }
};

// Whose arithmetic a block follows where the exact bits are a choice: mixkv's own kernels, or
// llama.cpp's (kernels/attention_ggml.hpp: its attention over an f16 cache, RoPE angles, SiLU),
// the reference for models read from GGUF files (docs/engine.md, "llama.cpp's numerics").
enum class Numerics { kMixkv, kGgml };

// Attention through the paged cache: q/k/v projections, optional per-head q/k RMSNorm (Qwen3),
// optional RoPE, write_kv through the slot mapping, paged attention with the layer's group
// parameters, output projection.
class Attention final : public Mixer {
 public:
  struct Weights {
    Matrix q, k, v, o;
    std::vector<float> sinks;
    std::vector<float> q_norm, k_norm;  // empty: none
  };
  // Which dimensions RoPE rotates together (ops::rope, ops::rope_pairs), or none.
  enum class Rope { kNone, kHalves, kPairs };
  Attention(std::string name, kernels::AttentionSpec spec, layout::LayerGeometry geometry,
            Weights w, Rope rope, double rope_theta, double eps,
            Numerics numerics = Numerics::kMixkv);
  void run(const Step& step, std::span<const float> normed, std::span<float> out) const override;
  const kernels::AttentionSpec* attention_spec() const override { return &spec_; }
  // A layer's K and V rows for `normed` inputs at `positions`: projections, k_norm, RoPE; then
  // their write into the cache. DFlash's context features take this path without a query.
  void project_kv(std::span<const float> normed, std::span<const std::int64_t> positions,
                  kernels::ThreadPool* pool, std::vector<float>& k, std::vector<float>& v) const;
  void write_kv(const Step& step, std::span<const float> k, std::span<const float> v) const;

 private:
  std::string name_;
  kernels::AttentionSpec spec_;
  layout::LayerGeometry geometry_;
  ops::RopeMode rope_mode() const;  // with rope_ kHalves or kPairs
  // The (cos, sin) pairs of every row at `positions` (null without RoPE), from `cache` when it
  // holds those of the same positions, theta and form.
  const float* rope_angles(std::span<const std::int64_t> positions,
                           Scratch::RopeAngles& cache) const;
  void norm_and_rotate(std::span<float> rows, std::int64_t heads, const std::vector<float>& norm,
                       const float* angles, std::int64_t from, std::int64_t to) const;
  void cache_slots(const Step& step, std::vector<std::int64_t>& slots) const;
  Weights w_;
  Rope rope_;
  double rope_theta_;
  double eps_;
  Numerics numerics_;
};

// Qwen3-Next's Gated DeltaNet mixer (HF Qwen3NextGatedDeltaNet), one kernel call per token.
class GatedDeltaNet final : public Mixer {
 public:
  struct Weights {
    // in_proj_qkvz and in_proj_ba rows grouped per key head, as Qwen3-Next's checkpoints are;
    // a_neg = -exp(A_log); norm over each value head.
    Matrix in_qkvz, in_ba, out;
    std::vector<float> conv, dt_bias, a_neg, norm;
  };
  GatedDeltaNet(std::string name, kernels::GdnLayerSpec spec, layout::LayerGeometry geometry,
                Weights w, double eps);
  void run(const Step& step, std::span<const float> normed, std::span<float> out) const override;

 private:
  std::string name_;
  kernels::GdnLayerSpec spec_;
  layout::LayerGeometry geometry_;
  Weights w_;
  double eps_;
};

// Nemotron-H's Mamba2 mixer (HF NemotronHMamba2Mixer), one kernel call per token.
class Mamba2 final : public Mixer {
 public:
  struct Weights {
    // in_proj rows [z; x, B, C; dt]; conv over x, B, C (bias optional); a_neg = -exp(A_log);
    // norm grouped by n_groups.
    Matrix in_proj, out;
    std::vector<float> conv, conv_bias, dt_bias, a_neg, d_skip, norm;
  };
  Mamba2(std::string name, kernels::Mamba2LayerSpec spec, layout::LayerGeometry geometry, Weights w,
         double eps);
  void run(const Step& step, std::span<const float> normed, std::span<float> out) const override;

 private:
  std::string name_;
  kernels::Mamba2LayerSpec spec_;
  layout::LayerGeometry geometry_;
  Weights w_;
  double eps_;
};

// The MLP variants: SwiGLU (Llama), GELU-tanh gated (Gemma 2), relu² without a gate (Nemotron-H).
struct Mlp {
  enum class Activation { kSwiGlu, kGeluTanhGated, kRelu2 };
  Activation activation = Activation::kSwiGlu;
  std::int64_t intermediate = 0;
  Matrix gate, up, down;                 // no gate for kRelu2
  Numerics numerics = Numerics::kMixkv;  // kGgml: SwiGLU with ggml's SiLU
  void run(std::span<const float> normed, std::int64_t rows, kernels::ThreadPool* pool,
           std::span<float> out, Scratch* scratch = nullptr) const;
};

// One decoder block: [norm, mixer, optional output norm, residual] then [norm, MLP, optional
// output norm, residual]. Either half may be absent (Nemotron-H's blocks hold one of them).
struct Block {
  std::string name;
  double eps = 1e-5;
  std::vector<float> mixer_norm;
  std::unique_ptr<Mixer> mixer;
  std::vector<float> mixer_out_norm;  // Gemma 2's post_attention_layernorm; empty: none
  std::vector<float> mlp_norm;
  std::unique_ptr<Mlp> mlp;
  std::vector<float> mlp_out_norm;  // Gemma 2's post_feedforward_layernorm; empty: none
  // x: [rows, hidden], updated in place; scratch buffers of the same size.
  void run(const Step& step, std::vector<float>& x, std::vector<float>& normed,
           std::vector<float>& tmp) const;
};

// The state discipline every recurrent layer shares (docs/engine.md): per request, check its
// state blocks, copy a prefix hit's state into the live slot, zero the live state before
// position 0; per token, `step(row, seq)` runs the layer's kernels reading the previous state and
// storing this token's into table[i] (decode and verify steps) or back into table[0]; the state
// after the manager's snapshot position is copied into the snapshot block.
void step_recurrent(const std::string& layer, const layout::LayerGeometry& geo, const Step& step,
                    const std::function<void(std::int64_t, const kernels::StateSequence&)>& fn);

}  // namespace mixkv::runner
