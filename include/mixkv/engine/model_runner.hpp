// The reference model runner: a small decoder-only transformer on the CPU whose attention layers
// read and write mixkv's paged cache (plan -> attention groups -> geometry -> allocated tensors ->
// write_kv through slot mappings -> paged_attention). Embedding, RMSNorm, RoPE, attention,
// SwiGLU MLP, LM head. Weights come from a safetensors checkpoint or are generated from a seed.
// docs/engine.md.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/cache/block_pool.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/recurrent_kernel.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"
#include "mixkv/weights/safetensors.hpp"

namespace mixkv::engine {

// The whole-model numbers the runner needs beyond the ModelDesc (which gives the layers).
struct TransformerConfig {
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t vocab_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_q_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  // Family specifics (docs/engine.md). model_type decides the weight names and block layout:
  // "nemotron_h" (blocks of hybrid_override_pattern: M Mamba2, * attention, - MLP; backbone.*
  // names, no RoPE, relu² MLP) and "gemma2" (RMSNorm times 1 + w, four norms per layer, GELU-tanh
  // gated MLP, embeddings scaled by sqrt(hidden), final_logit_softcapping); else Llama's.
  std::string model_type;
  std::string block_pattern;                  // nemotron_h: hybrid_override_pattern
  bool conv_bias = true;                      // nemotron_h: use_conv_bias
  std::optional<double> final_logit_softcap;  // gemma2: final_logit_softcapping
  bool operator==(const TransformerConfig&) const = default;
};

// Reads the fields above from a HuggingFace config (top level or `text_config`); throws Error
// naming the field.
TransformerConfig read_transformer_config(const model::ModelSource& source);

// The HuggingFace (Llama-style) names and shapes of every weight the runner reads, for `desc`'s
// target layers: model.embed_tokens.weight, model.layers.{i}.{input_layernorm, self_attn.
// {q,k,v,o}_proj, self_attn.sinks, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm,
// lm_head (unless tied). Gated DeltaNet layers have Qwen3-Next's linear_attn.{in_proj_qkvz,
// in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj} in place of self_attn (docs/engine.md).
// nemotron_h names its blocks backbone.layers.{i}.{norm, mixer.*} (Mamba2 mixers: mixer.{in_proj,
// conv1d, dt_bias, A_log, D, norm, out_proj}), backbone.embeddings and backbone.norm_f; gemma2
// adds pre_feedforward_layernorm and post_feedforward_layernorm.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> weight_shapes(
    const TransformerConfig& config, const model::ModelDesc& desc);

// Seeded, deterministic float32 weights of those shapes.
weights::TensorMap generate_weights(const TransformerConfig& config, const model::ModelDesc& desc,
                                    std::uint64_t seed);

// An EAGLE-style drafter's own weights (it shares the target's embedding and LM head):
// draft.fc.weight [hidden, 2 hidden] (the concatenation of a token's embedding and the previous
// position's target hidden state, projected), draft.layers.{j}.* as a target layer's, and
// draft.norm.weight. For the target's MTP layers (`desc` from model::describe_mtp) the names are
// Qwen3-Next's: mtp.fc.weight, mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight
// (RMSNorms of the two halves before fc), mtp.layers.{j}.*, mtp.norm.weight. A DFlash drafter
// (z-lab's DFlashDraftModel) has draft.fc.weight [hidden, n hidden] over the n target layers it
// reads, draft.hidden_norm.weight, draft.layers.{j}.* with Qwen3's per-head
// self_attn.{q_norm,k_norm}.weight [head_dim], and draft.norm.weight.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> draft_weight_shapes(
    const TransformerConfig& draft, const model::ModelDesc& desc);
weights::TensorMap generate_draft_weights(const TransformerConfig& draft,
                                          const model::ModelDesc& desc, std::uint64_t seed);

// A drafter checkpoint's tensors under the names the runner reads: a drafter's own checkpoint
// names them without the "draft." prefix (z-lab's DFlash: fc.weight, hidden_norm.weight,
// layers.0.self_attn.q_proj.weight, ..., norm.weight), so each gets it. Throws Error naming a
// tensor that already carries it.
weights::TensorMap as_draft_weights(weights::TensorMap checkpoint, const std::string& origin);

struct RunnerOptions {
  std::int64_t memory_bytes = 64ll << 20;  // KV cache bytes
  std::int64_t block_size = 16;            // attention manager block (tokens)
  std::int64_t max_model_len = 0;          // 0: the config's max_position_embeddings
  int num_spec_tokens = 0;                 // planned speculative tokens
  plan::Policy policy = plan::Policy::kMixkv;
  // A drafter fed by target hidden states: EAGLE-style (decoder layers chained token by token)
  // or DFlash (a non-causal block drafter reading chosen target layers). Described with the
  // target, so its layers are planned into the same cache and the manager's block tables cover
  // them. Its weights come with the target's (draft_weight_shapes).
  std::optional<model::ModelSource> draft = std::nullopt;
  // Draft with the target config's own MTP layers (num_nextn_predict_layers) instead: planned
  // like an EAGLE drafter's (model::describe_mtp), weights under mtp.* with the target's.
  bool mtp = false;
  // Recurrent states' dtype (model::DescribeOptions::ssm_dtype); nullopt: the config's.
  std::optional<DType> ssm_dtype = std::nullopt;
};

// One request's slice of a forward pass: `tokens` at positions [start, start + tokens.size()),
// with the request's manager block table of every KV-cache group (the blocks must hold those
// positions; earlier positions' K/V must already be in the cache).
//
// Recurrent groups (Gated DeltaNet): table[0] is the live state. With `checkpoints` (a decode or
// verify step) the state after token i goes to table[i], which must then hold every token;
// without (a prefill chunk) every token updates table[0]. `recurrent[g]`, when given, is the
// manager's RecurrentStep for group g: a prefix hit's state to copy into table[0] first, and the
// snapshot block to copy the state after `snapshot_at` tokens into.
struct SequenceInput {
  std::span<const TokenId> tokens;
  std::int64_t start = 0;
  std::vector<std::span<const cache::BlockId>> block_tables;  // per KV-cache group
  bool checkpoints = false;
  std::vector<cache::RecurrentStep> recurrent = {};  // per KV-cache group, or empty
};

struct ForwardOutput {
  std::vector<float> logits;  // [tokens, vocab], batch order
  std::vector<float> hidden;  // [tokens, hidden]: the last layer's output before the final norm
  // Target forward with a DFlash drafter: [tokens, n hidden], the outputs of the n target layers
  // the drafter reads (DraftInfo::target_layer_ids), concatenated in that order. Else empty.
  std::vector<float> layer_hidden;
};

class ModelRunner {
 public:
  // Throws Error when a layer kind is not served (Mamba2 outside nemotron_h, MLA, chunked, KDA,
  // Mamba1), a weight is missing or misshapen, a DFlash drafter's target layers or mask token do
  // not fit the target, or the cache cannot be planned.
  ModelRunner(const model::ModelSource& config, const weights::TensorMap& weights,
              const RunnerOptions& options = {});

  // Writes every input token's K/V into the cache, then attends. Each query attends through its
  // own one-query kernel call, so a token's logits are bit-identical whatever the batch, chunking
  // or speculation around it (docs/engine.md, determinism).
  ForwardOutput forward(std::span<const SequenceInput> batch);

  // The drafter's layers over `batch` (its cache slots as the target's), fed per token with
  // features[t] (hidden wide): the previous position's target hidden state, or the drafter's own
  // output standing in for it. Returns the drafter's logits (through the target's LM head) and
  // its hidden states. Throws when the runner has no drafter.
  ForwardOutput draft_forward(std::span<const SequenceInput> batch,
                              std::span<const float> features);
  bool has_drafter() const { return !draft_layers_.empty(); }

  // DFlash (a block drafter, RunnerOptions::draft of DraftKind::kDflash). The drafter's cache
  // position p holds K/V projected from the target's features at p; block_draft() then drafts
  // a whole block in one forward.
  bool has_block_drafter() const { return has_drafter() && !dflash_layer_ids_.empty(); }
  // The width of one token's features for the drafter: n hidden for DFlash (ForwardOutput::
  // layer_hidden), hidden for EAGLE and MTP (ForwardOutput::hidden).
  std::int64_t draft_feature_width() const;
  // The features the drafter reads from a target forward's output, [tokens, width].
  std::span<const float> draft_features(const ForwardOutput& out) const;
  // Writes, into every drafter layer's cache, the K/V of the batch's positions computed from
  // `features` ([tokens, draft_feature_width()], batch order): fc, hidden_norm, then each
  // layer's k_proj, k_norm, RoPE and v_proj. The tokens themselves are not read. Runs no query.
  void draft_context(std::span<const SequenceInput> batch, std::span<const float> features);
  // One block per request: tokens[0] is the anchor (the last verified token) at `start`, the
  // others mask_token(). Writes the block's K/V into the drafter's cache (look-ahead slots the
  // next draft_context() overwrites), then every block query attends non-causally to the
  // context before `start` and the whole block. Returns logits and hidden states of every
  // block position (row i + 1 of a block predicts its i-th draft).
  ForwardOutput block_draft(std::span<const SequenceInput> batch);
  TokenId mask_token() const { return mask_token_; }
  // The largest block a DFlash drafter was built for (its config's block_size).
  int block_size() const { return block_size_; }

  const TransformerConfig& config() const { return config_; }
  const model::ModelDesc& desc() const { return desc_; }
  const plan::CachePlan& plan() const { return plan_; }
  const layout::Geometry& geometry() const { return geometry_; }
  std::span<const std::byte> cache_tensor(int tensor) const;
  std::int64_t vocab_size() const { return config_.vocab_size; }
  // The kernel spec of attention layer `layer` (e.g. "layers.0") as forward() runs it: window,
  // soft cap, scale, sinks. Throws Error for a name that is not an attention layer of the target.
  const kernels::AttentionSpec& attention_spec(std::string_view layer) const;

 private:
  struct Layer {
    std::string name;
    bool gdn = false;  // a Gated DeltaNet layer (else attention)
    kernels::GdnLayerSpec gdn_spec;
    // Gated DeltaNet weights: in_proj_qkvz and in_proj_ba rows grouped per key head as
    // Qwen3-Next's checkpoints are; a_neg = -exp(A_log); norm over each value head.
    std::vector<float> in_qkvz, in_ba, conv_w, dt_bias, a_neg, gdn_norm, out_proj;
    std::int64_t intermediate = 0;
    double rms_norm_eps = 1e-5;
    double rope_theta = 10000.0;
    layout::LayerGeometry geometry;
    kernels::AttentionSpec spec;
    std::vector<float> input_norm, post_norm, wq, wk, wv, wo, sinks, gate, up, down;
    std::vector<float> q_norm, k_norm;  // Qwen3's per-head RMSNorm of q and k; empty: none
    // Mamba2 mixer (nemotron_h "M" blocks): in_proj rows [z; x, B, C; dt], conv over x, B, C,
    // gated RMSNorm grouped by n_groups; a_neg = -exp(A_log) and conv_w, dt_bias, out_proj above.
    bool mamba = false;
    kernels::Mamba2LayerSpec mamba_spec;
    std::vector<float> in_proj, conv_bias, d_skip, mamba_norm;
    // Block layout beyond Llama's: nemotron_h blocks hold a mixer or an MLP (mlp_only: `post_norm`
    // is the block's norm), its attention has no RoPE; gemma2 normalises the mixer's and the MLP's
    // outputs before each residual.
    enum class Activation { kSwiGlu, kGeluTanhGated, kRelu2 };
    Activation activation = Activation::kSwiGlu;
    bool rope = true;
    bool has_mlp = true;
    bool mlp_only = false;
    std::vector<float> mixer_out_norm, mlp_out_norm;
  };
  TransformerConfig config_;
  model::ModelDesc desc_;
  plan::CachePlan plan_;
  std::vector<attn::AttentionGroup> groups_;
  layout::Geometry geometry_;
  std::vector<std::vector<std::byte>> tensors_;
  void check_batch(std::span<const SequenceInput> batch, std::vector<std::int64_t>& positions,
                   std::vector<float>& x) const;
  void read_dflash_config(const model::ModelSource& draft, int num_spec_tokens);
  void step_recurrent(const Layer& layer, std::span<const SequenceInput> batch,
                      const std::function<void(std::int64_t, const kernels::StateSequence&)>& step);
  void run_gdn(const Layer& layer, std::span<const SequenceInput> batch,
               const std::vector<float>& normed, std::vector<float>& out);
  void run_mamba2(const Layer& layer, std::span<const SequenceInput> batch,
                  const std::vector<float>& normed, std::vector<float>& out);
  void load_nemotron_blocks(const std::function<std::vector<float>(const std::string&)>& get);
  // `capture` (optional): the ids of layers whose outputs go to captured, [tokens, ids x hidden].
  void run_layers(const std::vector<Layer>& layers, std::span<const SequenceInput> batch,
                  const std::vector<std::int64_t>& positions, std::vector<float>& x,
                  std::span<const int> capture = {}, std::vector<float>* captured = nullptr);
  void project_kv(const Layer& layer, std::span<const float> normed,
                  std::span<const std::int64_t> positions, std::vector<float>& k,
                  std::vector<float>& v) const;
  void write_layer_kv(const Layer& layer, std::span<const SequenceInput> batch,
                      std::span<const float> k, std::span<const float> v);
  ForwardOutput head(std::vector<float> x, const std::vector<float>& norm, double eps) const;

  std::vector<Layer> layers_;
  std::vector<Layer> draft_layers_;
  std::vector<float> embed_, final_norm_, lm_head_;
  std::vector<float> draft_fc_, draft_norm_;
  std::vector<float> mtp_norm_embedding_, mtp_norm_hidden_;  // MTP only: before draft_fc_
  double draft_eps_ = 1e-5;
  float embed_scale_ = 1.0f;  // gemma2: sqrt(hidden_size)
  // DFlash only.
  std::vector<int> dflash_layer_ids_;
  std::vector<float> dflash_hidden_norm_;
  TokenId mask_token_ = 0;
  int block_size_ = 0;
};

// Greedy sampling: the index of the largest logit, the lowest one on ties.
TokenId argmax(std::span<const float> logits);

}  // namespace mixkv::engine
