// The reference model runner: a decoder-only model on the CPU whose attention and recurrent
// layers live in mixkv's paged cache (plan -> attention groups -> geometry -> allocated tensors
// -> write_kv through slot mappings -> paged_attention; recurrent states through the same
// geometry). Each architecture family is one small file composed from shared blocks
// (src/runner/); every weight name is in one table per family. docs/engine.md.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/cache/block_hash.hpp"
#include "mixkv/cache/block_pool.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/matmul.hpp"
#include "mixkv/kernels/thread_pool.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/architecture.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"
#include "mixkv/weights/gguf.hpp"
#include "mixkv/weights/safetensors.hpp"

namespace mixkv::runner {

using cache::TokenId;
using weights::Tensor;
using weights::TensorMap;

using WeightShapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;

// Which spelling of the family's name table: HuggingFace checkpoints' or GGUF files' (llama.cpp's
// token_embd.weight, blk.{i}.attn_q.weight, ...). Shapes are row-major, outermost first, in both.
enum class WeightNaming { kHuggingFace, kGguf };

// The names (from the family's table: Llama's model.layers.{i}.self_attn.q_proj.weight, ...;
// Qwen3-Next's linear_attn.*, Nemotron-H's backbone.layers.{i}.mixer.*, Gemma 2's extra norms;
// docs/engine.md) and shapes of every weight the runner reads for `desc`'s target, in
// checkpoint order.
WeightShapes weight_shapes(const model::Architecture& arch, const model::ModelDesc& desc,
                           WeightNaming naming = WeightNaming::kHuggingFace);

// Seeded, deterministic float32 weights of those shapes.
TensorMap generate_weights(const model::Architecture& arch, const model::ModelDesc& desc,
                           std::uint64_t seed);

// A drafter's own weights (it shares the target's embedding and LM head): EAGLE-style
// draft.fc.weight [hidden, 2 hidden], draft.layers.{j}.*, draft.norm.weight; the target's MTP
// layers (`desc` from model::describe_mtp) under mtp.* with mtp.pre_fc_norm_embedding and
// mtp.pre_fc_norm_hidden; a DFlash drafter's draft.fc.weight [hidden, n hidden] over the n target
// layers it reads, draft.hidden_norm.weight and Qwen3's per-head q_norm/k_norm in its layers.
WeightShapes draft_weight_shapes(const model::Architecture& draft, const model::ModelDesc& desc);
TensorMap generate_draft_weights(const model::Architecture& draft, const model::ModelDesc& desc,
                                 std::uint64_t seed);

// A drafter checkpoint's tensors under the names the runner reads: a drafter's own checkpoint
// names them without the "draft." prefix (z-lab's DFlash: fc.weight, hidden_norm.weight,
// layers.0.self_attn.q_proj.weight, ..., norm.weight), so each gets it. Throws Error naming a
// tensor that already carries it.
TensorMap as_draft_weights(TensorMap checkpoint, const std::string& origin);

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
  // Self-speculative drafting (model::kSelfDraft): the drafter is the target's first
  // self_draft_layers layers, its final norm and LM head, over the target's own cache of those
  // layers (nothing planned for it). 0: none. Attention-only prefixes (model::describe_self).
  int self_draft_layers = 0;
  // The attention layers' KV-cache dtype (model::DescribeOptions::kv_dtype); nullopt: the
  // config's.
  std::optional<DType> kv_dtype = std::nullopt;
  // Recurrent states' dtype (model::DescribeOptions::ssm_dtype); nullopt: the config's.
  std::optional<DType> ssm_dtype = std::nullopt;
  // Threads for the matrix products and attention (the caller's included); 0: one per core,
  // at most 8. Results are the same bits whatever the count.
  int threads = 0;
  // How block-format (q8_0, q4_0, q4_1) and bf16 weights reduce (kernels::ReductionOrder): kGgml
  // gives llama.cpp's bits for the block formats (bf16: float x); kBlockSum mixkv's cheaper
  // order, for which each block-format weight is packed once at load where the CPU's path reads
  // the packed layout (AVX-512 VNNI), the file's pages of it then released, and bf16 products
  // read x rounded to bf16 (docs/kernels.md). Either way a token's logits are the same alone or
  // batched.
  kernels::ReductionOrder weight_order = kernels::ReductionOrder::kGgml;
  // How the attention layers reduce (kernels::AttentionOrder), the target's and the drafter's:
  // kBf16Pairs needs bfloat16 or fp8_e4m3 caches (kv_dtype) and head sizes that are multiples of
  // 32, and
  // loading a model whose attention layers cannot take it throws Error naming the layer.
  kernels::AttentionOrder attention_order = kernels::AttentionOrder::kFloat;
  // The order of the attention layers' kernel pages (layout::LayerGeometry): NHD, or HND, where
  // the rows one KV head reads are contiguous in each page (paged decode reads them faster,
  // docs/kernels.md). The same tokens either way.
  attn::KvLayout kv_layout = attn::KvLayout::kNHD;
};

// One request's slice of a forward pass: `tokens` at positions [start, start + tokens.size()),
// with the request's manager block table of every KV-cache group (the blocks must hold those
// positions; earlier positions' K/V must already be in the cache).
//
// Recurrent groups: table[0] is the live state. With `checkpoints` (a decode or verify step) the
// state after token i goes to table[i], which must then hold every token; without (a prefill
// chunk) every token updates table[0]. `recurrent[g]`, when given, is the manager's
// RecurrentStep for group g: a prefix hit's state to copy into table[0] first, and the snapshot
// block to copy the state after `snapshot_at` tokens into.
// Which of a request's rows forward() computes logits for: the final norm and the LM head (a
// vocab x hidden product, SmolLM2's 49,152 rows) are spent only on rows that are read. A row's
// logits are the same bits whichever rows are chosen.
enum class LogitRows { kAll, kLast, kNone };

struct SequenceInput {
  std::span<const TokenId> tokens;
  std::int64_t start = 0;
  std::vector<std::span<const cache::BlockId>> block_tables;  // per KV-cache group
  bool checkpoints = false;
  std::vector<cache::RecurrentStep> recurrent = {};  // per KV-cache group, or empty
  LogitRows logits = LogitRows::kAll;  // forward() only; the drafters' passes give every row
};

struct ForwardOutput {
  // [rows, vocab], batch order: forward() gives the rows each request's LogitRows asks for,
  // the drafters' passes every token's.
  std::vector<float> logits;
  std::vector<float> hidden;  // [tokens, hidden]: the last layer's output before the final norm
  // Target forward with a DFlash drafter: [tokens, n hidden], the outputs of the n target layers
  // the drafter reads (DraftInfo::target_layer_ids), concatenated in that order. Else empty.
  std::vector<float> layer_hidden;
};

struct Network;  // the loaded blocks (src/runner/family.hpp)
struct Scratch;  // a forward's layer buffers (src/runner/blocks.hpp)

class ModelRunner {
 public:
  // Throws Error when a layer kind is not served (Mamba2 outside nemotron_h, MLA, chunked, KDA,
  // Mamba1), a weight is missing or misshapen, a DFlash drafter's target layers or mask token do
  // not fit the target, or the cache cannot be planned.
  // Float weights (generated, or a safetensors checkpoint): copied into the runner.
  ModelRunner(const model::ModelSource& config, const TensorMap& weights,
              const RunnerOptions& options = {});
  // A GGUF file (`config` is weights::model_source_from_gguf of it): matrices stay in the file's
  // mapping in their stored type (Q4_1, Q8_0, F16, ...; types the kernels do not read are decoded
  // to float32 once), embedding rows are decoded on lookup, only norms are converted to float.
  // The runner holds `file` open. A drafter model needs float weights (the other constructor).
  ModelRunner(const model::ModelSource& config, std::shared_ptr<const weights::GgufFile> file,
              const RunnerOptions& options = {});
  ModelRunner(ModelRunner&&) noexcept;
  ModelRunner& operator=(ModelRunner&&) noexcept;
  ~ModelRunner();

  // Writes every input token's K/V into the cache, then attends. Each query attends through its
  // own one-query kernel call, so a token's logits are bit-identical whatever the batch, chunking
  // or speculation around it (docs/engine.md, determinism).
  ForwardOutput forward(std::span<const SequenceInput> batch);
  // A spent ForwardOutput's logits handed back: the next forward's LM head writes into that
  // storage, so a step of as many rows as the last allocates and zeroes nothing (a batch-16 step's
  // logits are 3 MB).
  void reuse_logits(std::vector<float> logits) { spare_logits_ = std::move(logits); }
  // argmax() of each vocab_size()-wide row of `logits` into picks (one per row), the rows split
  // across the runner's threads (a 16-row step's argmax reads 3 MB).
  void argmax_rows(std::span<const float> logits, std::span<TokenId> picks);

  // The drafter's layers over `batch` (its cache slots as the target's), fed per token with
  // features[t] (hidden wide): the previous position's target hidden state, or the drafter's own
  // output standing in for it. Returns the drafter's logits (through the target's LM head) and
  // its hidden states. Throws when the runner has no drafter.
  ForwardOutput draft_forward(std::span<const SequenceInput> batch,
                              std::span<const float> features);
  bool has_drafter() const;

  // Self-speculative drafting (RunnerOptions::self_draft_layers): `batch` through the target's
  // first self_draft_layers() blocks, which write their K/V into the target's own cache (for
  // the last verified token the values a verify writes again; for drafts, look-ahead slots the
  // verify rewrites before reading), then the final norm and LM head over the rows each input's
  // LogitRows asks for. Throws when the runner has no self drafter.
  ForwardOutput self_draft(std::span<const SequenceInput> batch);
  int self_draft_layers() const { return self_draft_layers_; }

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

  const model::Architecture& config() const { return config_; }
  const model::ModelDesc& desc() const { return desc_; }
  const plan::CachePlan& plan() const { return plan_; }
  const layout::Geometry& geometry() const { return geometry_; }
  std::span<const std::byte> cache_tensor(int tensor) const;
  // The same bytes, writable: a KV transfer registers them (the prefill side's pages are read
  // by the peer, the decode side's written by it) between forwards.
  std::span<std::byte> cache_tensor(int tensor);
  int num_cache_tensors() const { return static_cast<int>(tensors_.size()); }
  std::int64_t vocab_size() const { return config_.vocab_size; }
  // The kernel spec of attention layer `layer` (e.g. "layers.0") as forward() runs it: window,
  // soft cap, scale, sinks. Throws Error for a name that is not an attention layer of the target.
  const kernels::AttentionSpec& attention_spec(std::string_view layer) const;

 private:
  ModelRunner(const model::ModelSource& config, const TensorMap* weights,
              std::shared_ptr<const weights::GgufFile> file, const RunnerOptions& options);
  void check_batch(std::span<const SequenceInput> batch, std::vector<std::int64_t>& positions,
                   std::vector<float>& x) const;
  // `capture` (optional): the ids of layers whose outputs go to captured, [tokens, ids x hidden].
  // `limit`: the blocks run (the first ones; self drafting).
  // `lane`: the pool and buffers the blocks run with (none: the runner's own).
  struct Lane {
    kernels::ThreadPool* pool = nullptr;  // null: the calling thread
    Scratch* scratch = nullptr;
  };
  void run_blocks(bool draft, std::span<const SequenceInput> batch,
                  std::span<const std::int64_t> positions, std::vector<float>& x,
                  std::span<const int> capture = {}, std::vector<float>* captured = nullptr,
                  std::size_t limit = std::numeric_limits<std::size_t>::max(),
                  std::optional<Lane> lane = std::nullopt);
  // The rows of `batch` whose LogitRows asks for logits, in order.
  static std::vector<std::int64_t> logit_rows(std::span<const SequenceInput> batch);
  // Final norm and LM head over the rows of x listed in `rows` (null: every row).
  ForwardOutput head(std::vector<float> x, const std::vector<float>& norm, double eps,
                     const std::vector<std::int64_t>* rows = nullptr);
  // Where forward() runs a batch as one part per thread (first request of each part, then the
  // batch's size); empty: the whole batch together on the pool.
  std::vector<std::size_t> request_parts(std::span<const SequenceInput> batch) const;
  // forward() of a batch together on the pool.
  ForwardOutput forward_together(std::span<const SequenceInput> batch,
                                 const std::vector<std::int64_t>& positions, std::vector<float> x);
  ForwardOutput forward_parts(std::span<const SequenceInput> batch,
                              std::span<const std::size_t> parts,
                              const std::vector<std::int64_t>& positions, std::vector<float> x);
  // How the steps that may run as parts ran lately, by way (0: together on the pool, 1: a part
  // per thread): an exponentially weighted mean of seconds per row (0: not yet timed), and the
  // count of such steps, for the probes of the way not taken (forward()).
  struct WayTimes {
    double per_row[2] = {0.0, 0.0};
    std::int64_t steps = 0;
  };
  WayTimes way_times_;

  model::Architecture config_;
  model::ModelDesc desc_;
  plan::CachePlan plan_;
  std::vector<attn::AttentionGroup> groups_;
  layout::Geometry geometry_;
  std::vector<std::vector<std::byte>> tensors_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  // DFlash only.
  std::vector<int> dflash_layer_ids_;
  TokenId mask_token_ = 0;
  int block_size_ = 0;
  int self_draft_layers_ = 0;
  std::vector<float> spare_logits_;  // reuse_logits()
};

// Greedy sampling: the index of the largest logit, the lowest one on ties.
TokenId argmax(std::span<const float> logits);

}  // namespace mixkv::runner
