#include "mixkv/runner/model_runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <utility>

#include "mixkv/core/error.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "runner/family.hpp"
#include "runner/ops.hpp"

namespace mixkv::runner {
namespace {

TensorMap random_tensors(const WeightShapes& shapes, std::uint64_t seed) {
  TensorMap out;
  std::mt19937_64 rng(seed);
  for (const auto& [name, shape] : shapes) {
    Tensor t;
    t.shape = shape;
    t.values.resize(static_cast<std::size_t>(t.numel()));
    const bool norm = name.ends_with("norm.weight") || name.ends_with("norm_f.weight");
    const bool sinks = name.ends_with("sinks");
    // Uniform with the variance of Kaiming-style init (1/fan_in); embeddings of unit scale so
    // the tiny model's greedy continuation depends on its input.
    const double fan_in = static_cast<double>(shape.back());
    const double bound = name.find("embed") != std::string::npos ? 1.0 : std::sqrt(3.0 / fan_in);
    std::uniform_real_distribution<double> dist(-bound, bound);
    std::uniform_real_distribution<double> near_one(0.8, 1.2);
    std::uniform_real_distribution<double> sink(-1.0, 1.0);
    for (float& v : t.values) {
      v = static_cast<float>(norm ? near_one(rng) : sinks ? sink(rng) : dist(rng));
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

// The planner's advice names `plan`'s options; the runner's memory is generate's --memory and
// its max_model_len the config's own, so a cache too small for one request is told in those
// terms, with the least memory that plans. Bisection finds it: planning is cheap next to the
// run, and the cache is bounded by kMaxHostCacheBytes anyway.
plan::CachePlan plan_runner_cache(const model::ModelDesc& desc, const plan::PlanOptions& options,
                                  const std::string& origin) {
  try {
    return plan::make_plan(desc, options);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidInput || options.memory_bytes >= plan::kMaxHostCacheBytes)
      throw;
    plan::PlanOptions probe = options;
    probe.memory_bytes = plan::kMaxHostCacheBytes;
    plan::CachePlan roomy;
    try {
      roomy = plan::make_plan(desc, probe);
    } catch (const Error&) {
      throw e;  // not a question of memory
    }
    std::int64_t fails = options.memory_bytes, plans = plan::kMaxHostCacheBytes;
    while (plans - fails > 1) {
      probe.memory_bytes = fails + (plans - fails) / 2;
      try {
        plan::make_plan(desc, probe);
        plans = probe.memory_bytes;
      } catch (const Error&) {
        fails = probe.memory_bytes;
      }
    }
    throw_invalid(fmt::format(
        "{}: a KV cache of {} bytes does not hold one request of {} tokens (the model's "
        "max_model_len) in the reference engine; it needs at least {} bytes ({:.2f} MiB): give "
        "--memory {} or more",
        origin, options.memory_bytes, roomy.max_model_len, plans,
        static_cast<double>(plans) / static_cast<double>(1 << 20), plans));
  }
}

bool is_dflash(const model::ModelDesc& desc) {
  return desc.draft_info && desc.draft_info->kind == model::DraftKind::kDflash;
}

void check_feature_count(std::string_view what, std::int64_t tokens, std::int64_t width,
                         std::span<const float> features) {
  if (static_cast<std::int64_t>(features.size()) != tokens * width) {
    throw_invalid(fmt::format("{}: {} tokens need {} feature values, got {}", what, tokens,
                              tokens * width, features.size()));
  }
}

}  // namespace

WeightShapes weight_shapes(const model::Architecture& arch, const model::ModelDesc& desc,
                           WeightNaming naming) {
  const Family f = family_of(arch);
  WeightSource w(f.names, {}, desc.model, naming);
  Assembler a{arch, desc, w};
  Network net;
  f.build(a, net);
  return w.requested();
}

TensorMap generate_weights(const model::Architecture& arch, const model::ModelDesc& desc,
                           std::uint64_t seed) {
  return random_tensors(weight_shapes(arch, desc), seed);
}

WeightShapes draft_weight_shapes(const model::Architecture& draft, const model::ModelDesc& desc) {
  if (!desc.draft_info) return {};
  WeightSource w(llama_names(), {}, desc.model);
  Assembler a{draft, desc, w};
  Network net;
  build_drafter(a, net);
  return w.requested();
}

TensorMap generate_draft_weights(const model::Architecture& draft, const model::ModelDesc& desc,
                                 std::uint64_t seed) {
  return random_tensors(draft_weight_shapes(draft, desc), seed);
}

TensorMap as_draft_weights(TensorMap checkpoint, const std::string& origin) {
  TensorMap out;
  while (!checkpoint.empty()) {
    auto node = checkpoint.extract(checkpoint.begin());
    if (node.key().starts_with("draft.")) {
      throw_invalid(fmt::format(
          "{}: tensor {} already carries the draft. prefix; a drafter checkpoint names its "
          "tensors as the drafter model does (fc.weight, layers.0...)",
          origin, node.key()));
    }
    node.key() = "draft." + node.key();
    out.insert(std::move(node));
  }
  return out;
}

ModelRunner::ModelRunner(ModelRunner&&) noexcept = default;
ModelRunner& ModelRunner::operator=(ModelRunner&&) noexcept = default;
ModelRunner::~ModelRunner() = default;

ModelRunner::ModelRunner(const model::ModelSource& config, const TensorMap& weights,
                         const RunnerOptions& options)
    : ModelRunner(config, &weights, nullptr, options) {}

ModelRunner::ModelRunner(const model::ModelSource& config,
                         std::shared_ptr<const weights::GgufFile> file,
                         const RunnerOptions& options)
    : ModelRunner(config, nullptr, std::move(file), options) {}

ModelRunner::ModelRunner(const model::ModelSource& config, const TensorMap* weights,
                         std::shared_ptr<const weights::GgufFile> file,
                         const RunnerOptions& options)
    : config_(model::read_architecture(config)), net_(std::make_unique<Network>()) {
  if (file == nullptr && weights == nullptr) throw_internal("ModelRunner: no weights given");
  if (file != nullptr && (options.draft || options.mtp)) {
    throw_unsupported(fmt::format(
        "{}: a drafter model with GGUF weights; the runner reads drafter weights from "
        "safetensors checkpoints (use --draft ngram, oracle or random with a GGUF target)",
        config.origin));
  }
  if (options.threads < 0 || options.threads > 256) {
    throw_invalid(fmt::format("--threads {} is out of range; use 1 to 256 (0: one per core)",
                              options.threads));
  }
  const int threads = options.threads > 0
                          ? options.threads
                          : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  if (threads > 1) pool_ = std::make_unique<kernels::ThreadPool>(threads);
  model::DescribeOptions dopt;
  std::optional<model::Architecture> draft_config;
  // Recurrent layers' conv states keep num_spec_tokens extra rows, with or without a drafter.
  dopt.num_spec_tokens = options.num_spec_tokens;
  dopt.ssm_dtype = options.ssm_dtype;
  dopt.kv_dtype = options.kv_dtype;
  if (options.draft) {
    draft_config = model::read_architecture(*options.draft);
    // The drafter's cache in its own dtype (its config's torch_dtype), not the target's.
    dopt.draft_kv_dtype = draft_config->torch_dtype;
    if (draft_config->hidden_size != config_.hidden_size ||
        draft_config->vocab_size != config_.vocab_size) {
      throw_invalid(fmt::format(
          "{}: the drafter's hidden_size {} and vocab_size {} must equal the target's ({} and {}): "
          "it reads the target's hidden states and shares its embedding and LM head",
          options.draft->origin, draft_config->hidden_size, draft_config->vocab_size,
          config_.hidden_size, config_.vocab_size));
    }
  }
  if (options.self_draft_layers != 0) {
    if (options.draft || options.mtp) {
      throw_invalid(
          fmt::format("{}: give one drafter: a drafter model, the MTP layers or the self drafter",
                      config.origin));
    }
    if (config_.model_type == "nemotron_h") {
      throw_unsupported(fmt::format(
          "{}: a self drafter over nemotron_h blocks (its blocks are not its cache layers)",
          config.origin));
    }
    dopt.draft_layers = options.self_draft_layers;
    desc_ = model::describe_self(config, dopt);
    self_draft_layers_ = options.self_draft_layers;
  } else if (options.mtp) {
    if (options.draft) {
      throw_invalid(fmt::format("{}: give either a drafter model or the MTP layers, not both",
                                config.origin));
    }
    // The MTP layers are the target's: its config, dtype and weights.
    draft_config = config_;
    desc_ = model::describe_mtp(config, dopt);
  } else {
    desc_ = model::describe(config, options.draft, dopt);
  }
  desc_.num_spec_tokens = options.num_spec_tokens;
  if (desc_.draft_info && desc_.draft_info->kind != model::DraftKind::kEagle &&
      desc_.draft_info->kind != model::DraftKind::kMtp &&
      desc_.draft_info->kind != model::DraftKind::kSelf && !is_dflash(desc_)) {
    throw_unsupported(fmt::format(
        "{}: a {} drafter; the runner serves EAGLE-style chain drafters, MTP layers, DFlash "
        "block drafters and the self drafter",
        options.draft ? options.draft->origin : config.origin,
        model::to_string(desc_.draft_info->kind)));
  }
  if (is_dflash(desc_)) {
    // DFlash's own fields (z-lab's config: block_size and dflash_config with target_layer_ids
    // and mask_token_id; describe has read and checked the first two).
    const std::string& origin = options.draft->origin;
    const model::DraftInfo& info = *desc_.draft_info;
    block_size_ = info.block_size.value_or(0);
    if (info.target_layer_ids.empty()) {
      throw_invalid(fmt::format(
          "{}: field 'target_layer_ids' is missing or empty; a DFlash drafter reads the hidden "
          "states of these target layers",
          origin));
    }
    dflash_layer_ids_ = info.target_layer_ids;
    if (!draft_config->mask_token_id) {
      throw_invalid(fmt::format(
          "{}: field 'mask_token_id' is missing; a DFlash drafter fills its block with this token",
          origin));
    }
    mask_token_ = static_cast<TokenId>(*draft_config->mask_token_id);
    if (options.num_spec_tokens > block_size_ - 1) {
      throw_invalid(fmt::format(
          "{}: {} speculative tokens do not fit a DFlash block of {} (the anchor and at most {} "
          "drafts); use --num-spec-tokens {} or less",
          origin, options.num_spec_tokens, block_size_, block_size_ - 1, block_size_ - 1));
    }
  }
  for (const model::LayerDesc& l : desc_.layers) {
    const bool target = l.owner == model::Owner::kTarget;
    const std::string& origin = target || !options.draft ? config.origin : options.draft->origin;
    const bool gdn = l.kind == model::LayerKind::kGdn && target;
    const bool mamba =
        l.kind == model::LayerKind::kMamba2 && target && config_.model_type == "nemotron_h";
    if (l.kind != model::LayerKind::kFull && l.kind != model::LayerKind::kSliding && !gdn &&
        !mamba) {
      throw_unsupported(
          fmt::format("{}: layer {} is {}; the reference runner serves full and sliding attention, "
                      "(target) Gated DeltaNet layers and the Mamba2 layers of nemotron_h",
                      origin, l.name, model::to_string(l.kind)));
    }
  }
  plan::PlanOptions popt;
  popt.policy = options.policy;
  popt.backend = backend::Backend::kCpu;
  popt.memory_bytes = options.memory_bytes;
  popt.block_size = options.block_size;
  popt.max_model_len = options.max_model_len;
  popt.request_len = std::min<std::int64_t>(
      512, options.max_model_len > 0 ? options.max_model_len
                                     : desc_.facts.max_position_embeddings.value_or(512));
  plan_ = plan_runner_cache(desc_, popt, config.origin);
  groups_ = attn::build_attention_groups(desc_, plan_);
  for (attn::AttentionGroup& g : groups_)
    g.layout = options.kv_layout;  // the cpu backend takes both
  geometry_ = layout::make_geometry(desc_, plan_, groups_);
  std::int64_t cache_bytes = 0;
  for (const plan::Tensor& t : plan_.tensors) cache_bytes += t.bytes;  // the plan bounds the sum
  plan::check_host_cache_bytes(cache_bytes, "the reference engine's KV cache", "--memory");
  for (const plan::Tensor& t : plan_.tensors) {
    tensors_.emplace_back(static_cast<std::size_t>(t.bytes), std::byte{0});
  }

  // The family's blocks from the weights, each checked against the shape its code states.
  const Family family = family_of(config_);
  net_->file = file;
  WeightSource target_weights(family.names, {weights, file.get()}, config.origin,
                              file ? WeightNaming::kGguf : WeightNaming::kHuggingFace);
  target_weights.set_weight_order(options.weight_order);
  Assembler target{config_, desc_, target_weights, &groups_, &geometry_, options.attention_order};
  family.build(target, *net_);
  if (draft_config) {
    WeightSource draft_weights(llama_names(), {weights, nullptr}, config.origin);
    Assembler draft{*draft_config, desc_,      draft_weights,
                    &groups_,      &geometry_, options.attention_order};
    build_drafter(draft, *net_);
  }
}

bool ModelRunner::has_drafter() const { return !net_->draft_blocks.empty(); }

const kernels::AttentionSpec& ModelRunner::attention_spec(std::string_view name) const {
  for (const Block& b : net_->blocks) {
    if (b.name != name || !b.mixer) continue;
    if (const kernels::AttentionSpec* spec = b.mixer->attention_spec()) return *spec;
  }
  throw_invalid(fmt::format("attention_spec: {} is not an attention layer of the target", name));
}

std::span<const std::byte> ModelRunner::cache_tensor(int tensor) const {
  return tensors_.at(static_cast<std::size_t>(tensor));
}

std::span<std::byte> ModelRunner::cache_tensor(int tensor) {
  return tensors_.at(static_cast<std::size_t>(tensor));
}

void ModelRunner::check_batch(std::span<const SequenceInput> batch,
                              std::vector<std::int64_t>& positions, std::vector<float>& x) const {
  const std::int64_t h = config_.hidden_size;
  const std::int64_t vocab = config_.vocab_size;
  const kernels::WeightView& embed = net_->embed.view;
  for (std::size_t r = 0; r < batch.size(); ++r) {
    const SequenceInput& s = batch[r];
    if (s.block_tables.size() != plan_.groups.size()) {
      throw_invalid(
          fmt::format("forward: request {} has {} block tables, the plan {} KV-cache "
                      "groups",
                      r, s.block_tables.size(), plan_.groups.size()));
    }
    if (s.start < 0) throw_invalid(fmt::format("forward: request {} starts at {}", r, s.start));
    for (std::size_t i = 0; i < s.tokens.size(); ++i) {
      const TokenId t = s.tokens[i];
      if (t < 0 || t >= vocab) {
        throw_invalid(
            fmt::format("forward: token id {} is outside the vocabulary of {}", t, vocab));
      }
      // One row of the embedding, decoded from its stored type.
      x.resize(x.size() + static_cast<std::size_t>(h));
      kernels::dequantize_row(embed, t, std::span(x).last(static_cast<std::size_t>(h)));
      positions.push_back(s.start + static_cast<std::int64_t>(i));
    }
  }
}

void ModelRunner::run_blocks(bool draft, std::span<const SequenceInput> batch,
                             std::span<const std::int64_t> positions, std::vector<float>& x,
                             std::span<const int> capture, std::vector<float>* captured,
                             std::size_t limit, std::optional<Lane> lane) {
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(positions.size());
  std::vector<float> normed(static_cast<std::size_t>(total * h));
  std::vector<float> tmp(normed.size());
  if (captured != nullptr) {
    captured->assign(static_cast<std::size_t>(total * h) * capture.size(), 0);
  }
  const Lane on = lane.value_or(Lane{pool_.get(), &net_->scratch});
  const Step step{batch, positions, &tensors_, h, on.pool, on.scratch};
  const std::vector<Block>& blocks = draft ? net_->draft_blocks : net_->blocks;
  for (std::size_t index = 0; index < std::min(limit, blocks.size()); ++index) {
    blocks[index].run(step, x, normed, tmp);
    if (captured == nullptr) continue;
    // HF's hidden_states[id + 1]: the residual stream after layer `id`, into column block j.
    const auto width = static_cast<std::int64_t>(capture.size()) * h;
    for (std::size_t j = 0; j < capture.size(); ++j) {
      if (capture[j] != static_cast<int>(index)) continue;
      for (std::int64_t t = 0; t < total; ++t) {
        std::copy_n(x.begin() + t * h, h,
                    captured->begin() + t * width + static_cast<std::int64_t>(j) * h);
      }
    }
  }
}

// A decode step of many requests shares the weights' reads between its threads (each thread
// streams half of every weight for all the rows), at the price of hundreds of hand-offs: a
// layer's products, norms and attention each split across the threads, whose outputs the other
// thread then reads. From kMinPartRequests requests a thread of short sequences (decode and
// verify rows) the batch may instead run as one part per thread (forward_parts): each part's
// requests through every layer on its thread alone, reading every layer's weights (the LM head
// then runs together, its weight read once). Which is faster depends on where the host put the
// threads (docs/engine.md, "Parts per thread"): with the two vCPUs far apart (cache-line round
// trips of ~400 ns) a batch-16 SmolLM2 step took 5.8-6.4 ms as parts against 7.5-7.6 together,
// near (~70-150 ns) 5.9-6.2 against 5.8-5.9. So forward() times both ways and takes the faster,
// trying the other every kWayProbe steps (the host moves the threads). Rows are independent in
// every kernel: either way gives the same bits. Parts only on pools of a few threads: each part
// reads every weight, so many threads would multiply the weights' reads (measured on 2).
constexpr int kMaxPartThreads = 4;
constexpr std::size_t kMinPartRequests = 4;
constexpr std::size_t kMaxPartRowsPerRequest = 8;
constexpr std::int64_t kWayProbe = 16;
constexpr double kWayWeight = 0.25;  // of a new step in a way's mean

std::vector<std::size_t> ModelRunner::request_parts(std::span<const SequenceInput> batch) const {
  const int workers = pool_ != nullptr ? pool_->size() : 1;
  if (workers < 2 || workers > kMaxPartThreads || !dflash_layer_ids_.empty() ||
      batch.size() < kMinPartRequests * static_cast<std::size_t>(workers)) {
    return {};
  }
  std::int64_t total = 0;
  for (const SequenceInput& s : batch) {
    if (s.tokens.size() > kMaxPartRowsPerRequest) return {};
    total += static_cast<std::int64_t>(s.tokens.size());
  }
  if (total == 0) return {};
  // Contiguous parts of about equal rows: a part ends once its rows reach its share.
  std::vector<std::size_t> parts{0};
  std::int64_t rows = 0;
  for (std::size_t r = 0; r < batch.size(); ++r) {
    rows += static_cast<std::int64_t>(batch[r].tokens.size());
    const auto p = static_cast<std::int64_t>(parts.size());
    if (p < workers && rows * workers >= total * p && r + 1 < batch.size()) parts.push_back(r + 1);
  }
  parts.push_back(batch.size());
  return parts;
}

ForwardOutput ModelRunner::forward_parts(std::span<const SequenceInput> batch,
                                         std::span<const std::size_t> parts,
                                         const std::vector<std::int64_t>& positions,
                                         std::vector<float> x) {
  const std::int64_t h = config_.hidden_size;
  const std::size_t count = parts.size() - 1;
  std::vector<std::int64_t> row_at{0};  // each part's first row
  for (std::size_t p = 0; p < count; ++p) {
    std::int64_t rows = 0;
    for (std::size_t r = parts[p]; r < parts[p + 1]; ++r) {
      rows += static_cast<std::int64_t>(batch[r].tokens.size());
    }
    row_at.push_back(row_at.back() + rows);
  }
  net_->part_scratch.resize(count);
  pool_->parallel_for(static_cast<std::int64_t>(count), [&](std::int64_t task, int) {
    const auto p = static_cast<std::size_t>(task);
    const std::int64_t first = row_at[p], rows = row_at[p + 1] - first;
    if (rows == 0) return;  // requests without a token this step
    std::vector<float> part(x.begin() + first * h, x.begin() + (first + rows) * h);
    run_blocks(false, batch.subspan(parts[p], parts[p + 1] - parts[p]),
               std::span(positions).subspan(static_cast<std::size_t>(first),
                                            static_cast<std::size_t>(rows)),
               part, {}, nullptr, std::numeric_limits<std::size_t>::max(),
               Lane{nullptr, &net_->part_scratch[p]});
    std::copy(part.begin(), part.end(), x.begin() + first * h);
  });
  // The LM head together: its weight (SmolLM2's is 30 MB) read once for all the rows.
  const std::vector<std::int64_t> rows = logit_rows(batch);
  return head(std::move(x), net_->final_norm, net_->eps, &rows);
}

ForwardOutput ModelRunner::forward(std::span<const SequenceInput> batch) {
  std::vector<std::int64_t> positions;
  std::vector<float> x;
  check_batch(batch, positions, x);
  if (net_->embed_scale != 1.0f) {
    for (float& v : x) v *= net_->embed_scale;
  }
  if (const std::vector<std::size_t> parts = request_parts(batch); !parts.empty()) {
    // The way not yet timed, else the faster, and the other one every kWayProbe steps.
    double* per_row = way_times_.per_row;
    int way = per_row[1] <= per_row[0] ? 1 : 0;
    if (per_row[0] == 0.0) {
      way = 0;
    } else if (per_row[1] == 0.0) {
      way = 1;
    } else if (++way_times_.steps % kWayProbe == 0) {
      way = 1 - way;
    }
    const auto start = std::chrono::steady_clock::now();
    ForwardOutput out = way == 1 ? forward_parts(batch, parts, positions, std::move(x))
                                 : forward_together(batch, positions, std::move(x));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
        static_cast<double>(positions.size());
    per_row[way] =
        per_row[way] == 0.0 ? seconds : per_row[way] + kWayWeight * (seconds - per_row[way]);
    return out;
  }
  return forward_together(batch, positions, std::move(x));
}

ForwardOutput ModelRunner::forward_together(std::span<const SequenceInput> batch,
                                            const std::vector<std::int64_t>& positions,
                                            std::vector<float> x) {
  std::vector<float> captured;
  run_blocks(false, batch, positions, x, dflash_layer_ids_, &captured);
  const std::vector<std::int64_t> rows = logit_rows(batch);
  ForwardOutput out = head(std::move(x), net_->final_norm, net_->eps, &rows);
  out.layer_hidden = std::move(captured);
  return out;
}

std::vector<std::int64_t> ModelRunner::logit_rows(std::span<const SequenceInput> batch) {
  std::vector<std::int64_t> rows;
  std::int64_t row = 0;
  for (const SequenceInput& s : batch) {
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    if (s.logits == LogitRows::kAll) {
      for (std::int64_t i = 0; i < n; ++i) rows.push_back(row + i);
    } else if (s.logits == LogitRows::kLast && n > 0) {
      rows.push_back(row + n - 1);
    }
    row += n;
  }
  return rows;
}

ForwardOutput ModelRunner::self_draft(std::span<const SequenceInput> batch) {
  if (self_draft_layers_ == 0) throw_invalid("self_draft: the runner has no self drafter");
  std::vector<std::int64_t> positions;
  std::vector<float> x;
  check_batch(batch, positions, x);
  if (net_->embed_scale != 1.0f) {
    for (float& v : x) v *= net_->embed_scale;
  }
  run_blocks(false, batch, positions, x, {}, nullptr, static_cast<std::size_t>(self_draft_layers_));
  const std::vector<std::int64_t> rows = logit_rows(batch);
  return head(std::move(x), net_->final_norm, net_->eps, &rows);
}

std::int64_t ModelRunner::draft_feature_width() const {
  return has_block_drafter()
             ? static_cast<std::int64_t>(dflash_layer_ids_.size()) * config_.hidden_size
             : config_.hidden_size;
}

std::span<const float> ModelRunner::draft_features(const ForwardOutput& out) const {
  return has_block_drafter() ? out.layer_hidden : out.hidden;
}

void ModelRunner::draft_context(std::span<const SequenceInput> batch,
                                std::span<const float> features) {
  if (!has_block_drafter()) throw_invalid("draft_context: the runner has no DFlash drafter");
  std::vector<std::int64_t> positions;
  std::vector<float> unused;
  check_batch(batch, positions, unused);
  const std::int64_t h = config_.hidden_size;
  const std::int64_t width = draft_feature_width();
  const auto total = static_cast<std::int64_t>(positions.size());
  check_feature_count("draft_context", total, width, features);
  // The context features: fc over the chosen layers' states, then hidden_norm. Unlike block
  // tokens they enter each layer's k_proj and v_proj without the layer's input norm.
  std::vector<float> context(static_cast<std::size_t>(total * h));
  ops::matmul(net_->draft_fc, features.data(), total, context.data(), pool_.get());
  for (std::int64_t t = 0; t < total; ++t) {
    ops::rms_norm(context.data() + t * h, net_->dflash_hidden_norm, h, net_->draft_eps,
                  context.data() + t * h);
  }
  const Step step{batch, positions, &tensors_, h, pool_.get()};
  std::vector<float> k, v;
  for (const Attention* layer : net_->dflash_attention) {
    layer->project_kv(context, positions, pool_.get(), k, v);
    layer->write_kv(step, k, v);
  }
}

ForwardOutput ModelRunner::block_draft(std::span<const SequenceInput> batch) {
  if (!has_block_drafter()) throw_invalid("block_draft: the runner has no DFlash drafter");
  std::vector<std::int64_t> positions;
  std::vector<float> x;
  check_batch(batch, positions, x);
  for (std::size_t r = 0; r < batch.size(); ++r) {
    const auto n = static_cast<std::int64_t>(batch[r].tokens.size());
    if (n > block_size_) {
      throw_invalid(
          fmt::format("block_draft: request {} gives a block of {} tokens; the drafter's "
                      "block_size is {}",
                      r, n, block_size_));
    }
  }
  run_blocks(true, batch, positions, x);
  return head(std::move(x), net_->draft_norm, net_->draft_eps);
}

ForwardOutput ModelRunner::draft_forward(std::span<const SequenceInput> batch,
                                         std::span<const float> features) {
  if (!has_drafter() || has_block_drafter()) {
    throw_invalid(
        "draft_forward: the runner has no EAGLE-style or MTP drafter (a DFlash drafter runs "
        "through draft_context and block_draft)");
  }
  std::vector<std::int64_t> positions;
  std::vector<float> embedded;
  check_batch(batch, positions, embedded);
  const std::int64_t h = config_.hidden_size;
  const auto total = static_cast<std::int64_t>(positions.size());
  check_feature_count("draft_forward", total, h, features);
  // EAGLE's input: [embedding of the token; hidden state that predicted it] projected to hidden.
  // MTP (DeepSeek-V3, Qwen3-Next) RMS-normalises each half first.
  std::vector<float> both(static_cast<std::size_t>(total * 2 * h));
  for (std::int64_t t = 0; t < total; ++t) {
    float* row = both.data() + t * 2 * h;
    std::copy_n(embedded.begin() + t * h, h, row);
    std::copy_n(features.begin() + t * h, h, row + h);
    if (!net_->mtp_norm_embedding.empty()) {
      ops::rms_norm(row, net_->mtp_norm_embedding, h, net_->draft_eps, row);
      ops::rms_norm(row + h, net_->mtp_norm_hidden, h, net_->draft_eps, row + h);
    }
  }
  std::vector<float> x(static_cast<std::size_t>(total * h));
  ops::matmul(net_->draft_fc, both.data(), total, x.data(), pool_.get());
  run_blocks(true, batch, positions, x);
  return head(std::move(x), net_->draft_norm, net_->draft_eps);
}

ForwardOutput ModelRunner::head(std::vector<float> x, const std::vector<float>& norm, double eps,
                                const std::vector<std::int64_t>* rows) {
  const std::int64_t h = config_.hidden_size;
  const std::int64_t vocab = config_.vocab_size;
  const auto total = rows != nullptr ? static_cast<std::int64_t>(rows->size())
                                     : static_cast<std::int64_t>(x.size()) / h;
  std::vector<float> normed(static_cast<std::size_t>(total * h));
  for (std::int64_t t = 0; t < total; ++t) {
    const std::int64_t from = rows != nullptr ? (*rows)[static_cast<std::size_t>(t)] : t;
    std::copy_n(x.data() + from * h, h, normed.data() + t * h);
  }
  ops::rms_norm_rows(normed.data(), total, norm, h, eps, normed.data());
  ForwardOutput out;
  // The LM head overwrites every value: only values past the spare buffer's size are zeroed.
  out.logits = std::exchange(spare_logits_, {});
  out.logits.resize(static_cast<std::size_t>(total * vocab));
  if (total > 0) ops::matmul(net_->lm_head, normed.data(), total, out.logits.data(), pool_.get());
  if (net_->final_logit_softcap) {
    const auto cap = static_cast<float>(*net_->final_logit_softcap);
    for (float& v : out.logits) v = std::tanh(v / cap) * cap;
  }
  out.hidden = std::move(x);
  return out;
}

void ModelRunner::argmax_rows(std::span<const float> logits, std::span<TokenId> picks) {
  const auto vocab = static_cast<std::size_t>(config_.vocab_size);
  if (logits.size() != picks.size() * vocab) {
    throw_invalid(fmt::format("argmax_rows: {} logits for {} rows of {}", logits.size(),
                              picks.size(), vocab));
  }
  ops::for_chunks(pool_.get(), static_cast<std::int64_t>(picks.size()), 1,
                  [&](std::int64_t from, std::int64_t to) {
                    for (auto r = static_cast<std::size_t>(from); r < static_cast<std::size_t>(to);
                         ++r) {
                      picks[r] = argmax(logits.subspan(r * vocab, vocab));
                    }
                  });
}

// The first index of the largest logit, NaNs passed over (a NaN first logit wins: nothing
// compares greater than it), as one scan `if (logits[i] > logits[best]) best = i` gives, in two
// passes that vectorise: the maximum in 16 independent lanes (a NaN never replaces a lane's
// value), then the first logit equal to it (-0 equals +0, as the scan keeps the first of them).
// A batch-16 step argmaxes 16 rows of the whole vocabulary.
TokenId argmax(std::span<const float> logits) {
  if (logits.empty()) throw_invalid("argmax of no logits");
  if (std::isnan(logits[0])) return 0;
  constexpr std::size_t kLanes = 16;
  std::array<float, kLanes> lane;
  lane.fill(logits[0]);
  const std::size_t n = logits.size();
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::size_t j = 0; j < kLanes; ++j) {
      const float x = logits[i + j];
      lane[j] = x > lane[j] ? x : lane[j];
    }
  }
  float best = logits[0];
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (const float m : lane) best = m > best ? m : best;
  for (std::size_t k = 0; k < n; ++k) {
    if (logits[k] == best) return static_cast<TokenId>(k);
  }
  throw_internal("argmax: the largest logit was not found again");
}

}  // namespace mixkv::runner
