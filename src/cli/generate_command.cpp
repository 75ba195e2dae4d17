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
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/oracle.hpp"
#include "runner_setup.hpp"

namespace mixkv::cli {
namespace {

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
  CLI::Option* spec_tokens = cmd->add_option("--num-spec-tokens", args->num_spec_tokens,
                                             "Tokens drafted per step (with --draft)")
                                 ->capture_default_str();
  auto* text = cmd->add_option("--prompt", args->prompt,
                               "Prompt text (bytes; default \"Once upon a time\")");
  cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids")->excludes(text);
  cmd->add_option("--max-tokens", args->max_tokens, "Tokens generated per request")
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "Requests generated together")->capture_default_str();
  add_seed_option(*cmd, "--seed", args->seed, "Seed of the random drafter");
  cmd->add_option("--memory", args->memory, "KV-cache bytes (e.g. 64MiB)")->capture_default_str();
  cmd->add_flag("--json", args->json,
                "One JSON object per request: {\"tokens\", \"text\", \"stats\"}");

  return [args, spec_tokens, text](std::ostream& out) {
    if (text->count() > 0 && args->prompt.empty()) {
      throw_invalid(
          "--prompt is empty; give some text, or leave --prompt out to use the built-in one "
          "(\"Once upon a time\")");
    }
    if (spec_tokens->count() > 0 && args->draft.empty()) {
      throw_invalid(fmt::format(
          "--num-spec-tokens {} needs a drafter: add --draft (oracle, ngram, random, mtp, a tiny "
          "drafter or a checkpoint directory), or drop --num-spec-tokens",
          args->num_spec_tokens));
    }
    if (args->batch < 1 || args->batch > 256) {
      throw_invalid(fmt::format("--batch {} is out of range; use 1 to 256", args->batch));
    }
    RunnerSetup setup = prepare_runner(args->model, args->draft, args->num_spec_tokens,
                                       plan::parse_memory_size(args->memory));
    runner::ModelRunner runner(setup.source, setup.weights, setup.options);

    std::vector<engine::TokenId> prompt = args->prompt_ids;
    if (prompt.empty())
      prompt = engine::encode_bytes(text->count() > 0 ? args->prompt : "Once upon a time");
    const auto prompts = batch_prompts(prompt, args->batch);
    engine::GenerateOptions go;
    go.max_tokens = args->max_tokens;
    go.max_batch = args->batch;
    const engine::GenerateReport plain = engine::generate(runner, prompts, nullptr, go);

    std::unique_ptr<spec::Drafter> drafter;
    if (args->draft == "oracle") {
      std::vector<std::vector<engine::TokenId>> refs;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        refs.push_back(prompts[i]);
        refs.back().insert(refs.back().end(), plain.requests[i].tokens.begin(),
                           plain.requests[i].tokens.end());
      }
      drafter = std::make_unique<spec::OracleDrafter>(std::move(refs));
    } else {
      drafter = make_drafter(args->draft, runner, args->seed);
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
