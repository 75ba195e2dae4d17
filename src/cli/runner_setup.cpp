// The part of `generate` and `serve` that turns MODEL and --draft into a runner.
#include "runner_setup.hpp"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>

#include "mixkv/core/error.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/model/architecture.hpp"
#include "mixkv/spec/dflash.hpp"
#include "mixkv/spec/eagle.hpp"
#include "mixkv/spec/ngram.hpp"
#include "mixkv/spec/random.hpp"
#include "mixkv/spec/self_draft.hpp"
#include "mixkv/weights/gguf_model.hpp"
#include "mixkv/weights/model_files.hpp"
#include "mixkv/weights/safetensors.hpp"

namespace mixkv::cli {
namespace {

using Loaded = RunnerSetup;

std::string checkpoint_file(const std::filesystem::path& dir) {
  const auto weights = dir / "model.safetensors";
  std::error_code ec;
  if (!std::filesystem::exists(weights, ec)) {
    throw_invalid(fmt::format("{} has no model.safetensors; generate reads one checkpoint file",
                              dir.string()));
  }
  return weights.string();
}

// A tiny model's name, a GGUF (smollm2-135m or a path), or a directory with config.json and
// model.safetensors.
Loaded load_model(const std::string& ref) {
  if (auto path = weights::resolve_gguf(ref)) {
    Loaded l;
    l.gguf = std::make_shared<const weights::GgufFile>(weights::GgufFile::open(*path));
    l.source = weights::model_source_from_gguf(*l.gguf, ref);
    l.tokenizer = tokenizer::tokenizer_from_gguf(*l.gguf);
    return l;
  }
  if (const engine::TinyModel* tiny = engine::find_tiny_model(ref)) {
    if (!tiny->missing.empty()) {
      throw_unsupported(
          fmt::format("{} cannot be run yet: the engine lacks {}", ref, tiny->missing));
    }
    Loaded l{engine::tiny_model_source(*tiny), {}, nullptr, nullptr, {}};
    const auto config = model::read_architecture(l.source);
    l.weights =
        runner::generate_weights(config, model::describe(l.source, std::nullopt, {}), tiny->seed);
    return l;
  }
  const std::filesystem::path dir(ref);
  if (!is_directory(ref)) {
    std::string names;
    for (const auto& m : engine::tiny_models()) names += fmt::format(" {}", m.name);
    throw_invalid(
        fmt::format("unknown model '{}': give smollm2-135m (fetched by `make deps` into {}, "
                    "$MIXKV_MODEL_DIR overrides it), a GGUF file, a tiny model (one of:{}) or a "
                    "directory holding config.json and model.safetensors",
                    ref, weights::model_dir(), names));
  }
  return {model::load_model_source(ref),
          weights::read_safetensors(checkpoint_file(dir)),
          nullptr,
          nullptr,
          {}};
}

}  // namespace

void add_weight_order_option(CLI::App& cmd, std::string& order) {
  cmd.add_option("--weight-order", order,
                 "Reduction order of the q8_0/q4_0/q4_1 and bf16 weight products: blocksum "
                 "(packed block formats, bf16 products over x rounded to bf16; verify and "
                 "batched rows cost little more than one row) or ggml (llama.cpp's bits for "
                 "the block formats, float x for bf16); docs/kernels.md")
      ->capture_default_str()
      ->check(CLI::IsMember({"ggml", "blocksum"}));
}

void add_attention_order_option(CLI::App& cmd, std::string& order) {
  cmd.add_option("--attention-order", order,
                 "Reduction order of attention: float, or bf16-pairs (q and the softmax weights "
                 "rounded to bf16, products summed in pairs, VDPBF16PS where the CPU has it: "
                 "verify rows cost less; needs --kv-dtype bfloat16 or fp8_e4m3 and head sizes "
                 "that are multiples of 32); docs/kernels.md")
      ->capture_default_str()
      ->check(CLI::IsMember({"float", "bf16-pairs"}));
}

void add_kv_layout_option(CLI::App& cmd, std::string& kv_layout) {
  cmd.add_option("--kv-layout", kv_layout,
                 "Order of the KV cache's pages: NHD (a token's KV heads side by side) or HND (a "
                 "KV head's tokens side by side: paged decode reads them faster); the same "
                 "tokens either way; docs/kernels.md")
      ->capture_default_str()
      ->check(CLI::IsMember({"NHD", "HND"}));
}

void add_kv_dtype_option(CLI::App& cmd, std::string& dtype) {
  cmd.add_option("--kv-dtype", dtype,
                 "KV cache dtype of the attention layers: auto (the model's) or a dtype (e.g. "
                 "bfloat16, float16, fp8_e4m3)")
      ->capture_default_str();
}

kernels::ReductionOrder parse_weight_order(const std::string& text) {
  if (text == "ggml") return kernels::ReductionOrder::kGgml;
  if (text == "blocksum") return kernels::ReductionOrder::kBlockSum;
  throw_invalid(fmt::format("--weight-order '{}' is not an order; use ggml or blocksum", text));
}

bool is_directory(const std::string& ref) {
  std::error_code ec;
  return std::filesystem::is_directory(ref, ec);
}

runner::ModelRunner RunnerSetup::make_runner() const {
  return gguf != nullptr ? runner::ModelRunner(source, gguf, options)
                         : runner::ModelRunner(source, weights, options);
}

RunnerSetup prepare_runner(const std::string& model, const std::string& draft, int num_spec_tokens,
                           std::int64_t memory_bytes, std::int64_t max_model_len, int threads,
                           std::optional<int> draft_layers) {
  Loaded loaded = load_model(model);
  runner::RunnerOptions ro;
  // The CLI's order, not the library's (ggml): every runner made here (generate, serve, the
  // Python package's stream) computes the same tokens as the commands' default.
  ro.weight_order = parse_weight_order(kDefaultWeightOrder);
  ro.memory_bytes = memory_bytes;
  ro.num_spec_tokens = draft.empty() ? 0 : num_spec_tokens;
  ro.threads = threads;
  ro.max_model_len = max_model_len;
  if (loaded.gguf != nullptr && ro.max_model_len == 0) {
    // SmolLM2's 8,192-token context would take 189 MB of float16 KV for one request; a chat
    // turn needs far less, and --max-model-len gives more.
    const auto context = model::describe(loaded.source, std::nullopt, {}).facts;
    ro.max_model_len = std::min<std::int64_t>(context.max_position_embeddings.value_or(2048), 2048);
  }
  // A drafter model (a tiny drafter, or a checkpoint directory): its layers join the target's
  // plan, its weights the target's.
  const engine::TinyModel* tiny_draft = engine::find_tiny_model(draft);
  const bool self = draft == model::kSelfDraft;
  if (draft_layers && !self) {
    throw_invalid(fmt::format("--draft-layers {} is for --draft self, not --draft {}",
                              *draft_layers, draft.empty() ? "(none)" : draft));
  }
  if (self) {
    // The target's own first layers: the runner checks the count against the model.
    model::DescribeOptions d;
    d.draft_layers = draft_layers;
    ro.self_draft_layers = model::describe_self(loaded.source, d).draft_info->shared_target_layers;
  }
  const bool keyword = draft == "oracle" || draft == "ngram" || draft == "random" ||
                       draft == model::kMtpDraft || self;
  if (!keyword && tiny_draft == nullptr && !draft.empty() && is_directory(draft)) {
    ro.draft = model::load_model_source(draft);
    loaded.weights.merge(
        runner::as_draft_weights(weights::read_safetensors(checkpoint_file(draft)), draft));
  }
  if (tiny_draft != nullptr) {
    if (!engine::drafts_for(*tiny_draft, model)) {
      throw_invalid(fmt::format(
          "--draft {} is a drafter for {}, not for {}", draft,
          tiny_draft->draft_for.empty() ? "nothing (it is a target)" : tiny_draft->draft_for,
          model));
    }
    ro.draft = engine::tiny_model_source(*tiny_draft);
    model::DescribeOptions d;
    d.num_spec_tokens = ro.num_spec_tokens;
    const auto desc = model::describe(loaded.source, ro.draft, d);
    loaded.weights.merge(runner::generate_draft_weights(model::read_architecture(*ro.draft), desc,
                                                        tiny_draft->seed));
  }
  // The target's own MTP layers: weights come with a checkpoint's, or are generated for a tiny
  // model (seed + 1).
  const bool mtp = draft == model::kMtpDraft;
  if (mtp) {
    ro.mtp = true;
    if (const engine::TinyModel* tiny = engine::find_tiny_model(model)) {
      model::DescribeOptions d;
      d.num_spec_tokens = ro.num_spec_tokens;
      loaded.weights.merge(runner::generate_draft_weights(model::read_architecture(loaded.source),
                                                          model::describe_mtp(loaded.source, d),
                                                          tiny->seed + 1));
    }
  }
  loaded.options = std::move(ro);
  return loaded;
}

std::unique_ptr<spec::Drafter> make_drafter(const std::string& draft, runner::ModelRunner& runner,
                                            std::uint64_t seed) {
  if (draft.empty()) return nullptr;
  if (runner.self_draft_layers() > 0) return std::make_unique<spec::SelfDrafter>(runner);
  if (runner.has_block_drafter()) return std::make_unique<spec::DflashDrafter>(runner);
  if (runner.has_drafter()) return std::make_unique<spec::EagleDrafter>(runner);
  if (draft == "ngram") return std::make_unique<spec::NgramDrafter>();
  if (draft == "random") return std::make_unique<spec::RandomDrafter>(runner.vocab_size(), seed);
  throw_invalid(
      fmt::format("--draft {}: unknown drafter; use oracle, ngram, random, self, mtp (a target "
                  "with MTP layers), tiny-eagle (with tiny-swa), tiny-dflash (with "
                  "tiny-swa or tiny-hybrid) or a drafter checkpoint directory",
                  draft));
}

std::vector<tokenizer::TokenId> end_of_generation_ids(const tokenizer::Tokenizer& tok) {
  std::vector<tokenizer::TokenId> ids;
  for (tokenizer::TokenId id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_end_of_generation(id)) ids.push_back(id);
  }
  return ids;
}

}  // namespace mixkv::cli
