// `mixkv generate`: greedy generation on a tiny model (or a config.json + model.safetensors
// directory) through the reference engine, plain and with a drafter, checking that both give the
// same tokens.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/plan/memory_budget.hpp"

namespace mixkv::cli {
namespace {

struct Loaded {
  model::ModelSource source;
  weights::TensorMap weights;
};

std::string checkpoint_file(const std::filesystem::path& dir) {
  const auto weights = dir / "model.safetensors";
  std::error_code ec;
  if (!std::filesystem::exists(weights, ec)) {
    throw_invalid(fmt::format("{} has no model.safetensors; generate reads one checkpoint file",
                              dir.string()));
  }
  return weights.string();
}

bool is_directory(const std::string& ref) {
  std::error_code ec;
  return std::filesystem::is_directory(ref, ec);
}

// A tiny model's name, or a directory with config.json and model.safetensors.
Loaded load_model(const std::string& ref) {
  if (const engine::TinyModel* tiny = engine::find_tiny_model(ref)) {
    if (!tiny->missing.empty()) {
      throw_unsupported(
          fmt::format("{} cannot be run yet: the engine lacks {}", ref, tiny->missing));
    }
    Loaded l{engine::tiny_model_source(*tiny), {}};
    const auto config = engine::read_transformer_config(l.source);
    l.weights =
        engine::generate_weights(config, model::describe(l.source, std::nullopt, {}), tiny->seed);
    return l;
  }
  const std::filesystem::path dir(ref);
  if (!is_directory(ref)) {
    std::string names;
    for (const auto& m : engine::tiny_models()) names += fmt::format(" {}", m.name);
    throw_invalid(
        fmt::format("unknown model '{}': give a tiny model (one of:{}) or a directory "
                    "holding config.json and model.safetensors",
                    ref, names));
  }
  return {model::load_model_source(ref), weights::read_safetensors(checkpoint_file(dir))};
}

// Request i of a batch: the prompt, then for i > 0 a suffix repeated 1 to 3 times, so the batch
// mixes lengths and shares the prompt as a prefix.
std::vector<std::vector<engine::TokenId>> batch_prompts(const std::vector<engine::TokenId>& prompt,
                                                        int batch) {
  std::vector<std::vector<engine::TokenId>> out;
  for (int i = 0; i < batch; ++i) {
    std::vector<engine::TokenId> p = prompt;
    for (int r = 0; i > 0 && r <= i % 3; ++r) {
      const auto suffix = engine::encode_bytes(fmt::format(" (variant {})", i));
      p.insert(p.end(), suffix.begin(), suffix.end());
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

Action add_generate_command(CLI::App& app) {
  struct Args {
    std::string model;
    std::string draft;
    int num_spec_tokens = 3;
    std::string prompt;
    std::vector<engine::TokenId> prompt_ids;
    std::int64_t max_tokens = 32;
    int batch = 1;
    std::uint64_t seed = 0;
    std::string memory = "64MiB";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Greedy generation through the reference engine, plain and speculative");
  cmd->footer(
      "MODEL: tiny-swa, tiny-hybrid, tiny-mamba or tiny-gemma (mixkv's tiny models have "
      "generated weights and a byte-level vocabulary; tiny-hybrid mixes Gated DeltaNet and full "
      "attention layers, tiny-mamba Mamba2 and attention blocks, tiny-gemma soft-capped sliding "
      "and full layers) or a "
      "directory with config.json and "
      "model.safetensors. With --draft, the prompts are "
      "generated twice, plain and speculative, and the tokens must match (exit status 3 if "
      "not). --batch B runs B requests: the prompt, then the prompt with a suffix. "
      "docs/engine.md.");
  cmd->add_option("MODEL", args->model, "Target model")->required();
  cmd->add_option(
      "--draft", args->draft,
      "Drafter: oracle (the target's own greedy continuation), ngram (prompt lookup), random, "
      "mtp (the target's MTP layers: tiny-hybrid), tiny-eagle (with tiny-swa), tiny-dflash "
      "(block drafter, with tiny-swa or tiny-hybrid), or a drafter checkpoint directory "
      "(config.json and model.safetensors)");
  cmd->add_option("--num-spec-tokens", args->num_spec_tokens, "Tokens drafted per step")
      ->capture_default_str();
  auto* text = cmd->add_option("--prompt", args->prompt, "Prompt text (bytes)");
  cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids")->excludes(text);
  cmd->add_option("--max-tokens", args->max_tokens, "Tokens generated per request")
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "Requests generated together")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the random drafter")->capture_default_str();
  cmd->add_option("--memory", args->memory, "KV-cache bytes (e.g. 64MiB)")->capture_default_str();
  cmd->add_flag("--json", args->json,
                "One JSON object per request: {\"tokens\", \"text\", \"stats\"}");

  return [args](std::ostream& out) {
    if (args->batch < 1 || args->batch > 256) {
      throw_invalid(fmt::format("--batch {} is out of range; use 1 to 256", args->batch));
    }
    Loaded loaded = load_model(args->model);
    engine::RunnerOptions ro;
    ro.memory_bytes = plan::parse_memory_size(args->memory);
    ro.num_spec_tokens = args->draft.empty() ? 0 : args->num_spec_tokens;
    // A drafter model (a tiny drafter, or a checkpoint directory): its layers join the target's
    // plan, its weights the target's.
    const engine::TinyModel* tiny_draft = engine::find_tiny_model(args->draft);
    const bool keyword = args->draft == "oracle" || args->draft == "ngram" ||
                         args->draft == "random" || args->draft == model::kMtpDraft;
    if (!keyword && tiny_draft == nullptr && !args->draft.empty() && is_directory(args->draft)) {
      ro.draft = model::load_model_source(args->draft);
      loaded.weights.merge(engine::as_draft_weights(
          weights::read_safetensors(checkpoint_file(args->draft)), args->draft));
    }
    if (tiny_draft != nullptr) {
      if (!engine::drafts_for(*tiny_draft, args->model)) {
        throw_invalid(fmt::format(
            "--draft {} is a drafter for {}, not for {}", args->draft,
            tiny_draft->draft_for.empty() ? "nothing (it is a target)" : tiny_draft->draft_for,
            args->model));
      }
      ro.draft = engine::tiny_model_source(*tiny_draft);
      model::DescribeOptions d;
      d.num_spec_tokens = ro.num_spec_tokens;
      const auto desc = model::describe(loaded.source, ro.draft, d);
      loaded.weights.merge(engine::generate_draft_weights(
          engine::read_transformer_config(*ro.draft), desc, tiny_draft->seed));
    }
    // The target's own MTP layers: weights come with a checkpoint's, or are generated for a tiny
    // model (seed + 1).
    const bool mtp = args->draft == model::kMtpDraft;
    if (mtp) {
      ro.mtp = true;
      if (const engine::TinyModel* tiny = engine::find_tiny_model(args->model)) {
        model::DescribeOptions d;
        d.num_spec_tokens = ro.num_spec_tokens;
        loaded.weights.merge(
            engine::generate_draft_weights(engine::read_transformer_config(loaded.source),
                                           model::describe_mtp(loaded.source, d), tiny->seed + 1));
      }
    }
    engine::ModelRunner runner(loaded.source, loaded.weights, ro);

    std::vector<engine::TokenId> prompt = args->prompt_ids;
    if (prompt.empty())
      prompt = engine::encode_bytes(args->prompt.empty() ? "Once upon a time" : args->prompt);
    const auto prompts = batch_prompts(prompt, args->batch);
    engine::GenerateOptions go;
    go.max_tokens = args->max_tokens;
    go.max_batch = args->batch;
    const engine::GenerateReport plain = engine::generate(runner, prompts, nullptr, go);

    std::unique_ptr<engine::Drafter> drafter;
    if (args->draft == "oracle") {
      std::vector<std::vector<engine::TokenId>> refs;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        refs.push_back(prompts[i]);
        refs.back().insert(refs.back().end(), plain.requests[i].tokens.begin(),
                           plain.requests[i].tokens.end());
      }
      drafter = std::make_unique<engine::OracleDrafter>(std::move(refs));
    } else if (runner.has_block_drafter()) {
      drafter = std::make_unique<engine::DflashDrafter>(runner);
    } else if (ro.draft || mtp) {
      drafter = std::make_unique<engine::EagleDrafter>(runner);
    } else if (args->draft == "ngram") {
      drafter = std::make_unique<engine::NgramDrafter>();
    } else if (args->draft == "random") {
      drafter = std::make_unique<engine::RandomDrafter>(runner.vocab_size(), args->seed);
    } else if (!args->draft.empty()) {
      throw_invalid(
          fmt::format("--draft {}: unknown drafter; use oracle, ngram, random, mtp (a target "
                      "with MTP layers), tiny-eagle (with tiny-swa), tiny-dflash (with "
                      "tiny-swa or tiny-hybrid) or a drafter checkpoint directory",
                      args->draft));
    }
    engine::GenerateReport spec;
    if (drafter) {
      go.num_spec_tokens = args->num_spec_tokens;
      spec = engine::generate(runner, prompts, drafter.get(), go);
    }

    bool all_identical = true;
    std::string report;
    if (!args->json) {
      report += fmt::format("generate {}: {} request{}, {} tokens each, plain{}\n", args->model,
                            prompts.size(), prompts.size() == 1 ? "" : "s", args->max_tokens,
                            drafter ? fmt::format(" and with drafter {} (k = {})", drafter->name(),
                                                  args->num_spec_tokens)
                                    : "");
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const engine::RequestOutput& p = plain.requests[i];
      const engine::RequestOutput& r = drafter ? spec.requests[i] : p;
      const bool identical = r.tokens == p.tokens;
      all_identical = all_identical && identical;
      const std::string text = engine::decode_bytes(r.tokens);
      const engine::RequestStats& s = r.stats;
      if (args->json) {
        nlohmann::json stats = {
            {"prompt_tokens", s.prompt_tokens},
            {"generated_tokens", s.generated_tokens},
            {"prefix_hit_tokens", s.prefix_hit_tokens},
            {"preemptions", s.preemptions},
            {"tokens_per_second", s.tokens_per_second()},
            {"plain_tokens_per_second", p.stats.tokens_per_second()},
        };
        if (drafter) {
          stats["drafter"] = drafter->name();
          stats["num_spec_tokens"] = args->num_spec_tokens;
          stats["drafted_tokens"] = s.drafted_tokens;
          stats["accepted_tokens"] = s.accepted_tokens;
          stats["acceptance_rate"] = s.acceptance_rate();
          stats["mean_accepted_length"] = s.mean_accepted_length();
          stats["identical_to_plain"] = identical;
        }
        const nlohmann::json j = {
            {"request", i}, {"tokens", r.tokens}, {"text", text}, {"stats", stats}};
        report += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + '\n';
        continue;
      }
      report += fmt::format("request {}: {} prompt tokens ({} from the prefix cache)\n", i,
                            s.prompt_tokens, s.prefix_hit_tokens);
      report += fmt::format("  text    {}\n", quoted(text));
      report += fmt::format("  plain   {:.1f} tokens/s\n", p.stats.tokens_per_second());
      if (drafter) {
        report += fmt::format(
            "  {:<7} {:.1f} tokens/s ({:.2f}x), acceptance {:.1f}%, mean accepted length {:.2f}, "
            "{}\n",
            drafter->name(), s.tokens_per_second(),
            p.stats.tokens_per_second() > 0 ? s.tokens_per_second() / p.stats.tokens_per_second()
                                            : 0.0,
            100 * s.acceptance_rate(), s.mean_accepted_length(),
            identical ? "identical to plain" : "DIFFERS FROM PLAIN");
      }
    }
    if (!args->json) {
      report += fmt::format("batch: plain {:.1f} tokens/s", plain.tokens_per_second());
      if (drafter) {
        report += fmt::format(", {} {:.1f} tokens/s; tokens {}", drafter->name(),
                              spec.tokens_per_second(), all_identical ? "identical" : "DIFFER");
      }
      report += '\n';
    }
    out << report;
    if (!all_identical) throw ExitStatus{3};
  };
}

}  // namespace mixkv::cli
