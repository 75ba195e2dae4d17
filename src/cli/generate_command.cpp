// `mixkv generate`: greedy generation through the reference engine, plain and with a drafter,
// checking that both give the same tokens: on a GGUF model (smollm2-135m or a path; its own
// tokenizer and chat template, the reply printed as text, streamed), a tiny model with random
// weights (token ids shown, not text), or a config.json + model.safetensors directory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "cli.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/model/architecture.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/dflash.hpp"
#include "mixkv/spec/eagle.hpp"
#include "mixkv/spec/ngram.hpp"
#include "mixkv/spec/oracle.hpp"
#include "mixkv/spec/random.hpp"
#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "mixkv/weights/gguf_model.hpp"
#include "mixkv/weights/model_files.hpp"
#include "model_options.hpp"
#include "runner_setup.hpp"

namespace mixkv::cli {
namespace {

// Request i of a batch: the prompt, then for i > 0 a suffix repeated 1 to 3 times, so the batch
// mixes lengths and shares the prompt as a prefix (with a chat template, the suffix ends the
// user's message, so the requests share everything before it).
std::string variant_suffix(int i) {
  std::string suffix;
  for (int r = 0; i > 0 && r <= i % 3; ++r) suffix += fmt::format(" (variant {})", i);
  return suffix;
}

// Token ids for the terminal: the tiny models' random weights emit bytes that are not text.
std::string id_list(std::span<const engine::TokenId> ids) {
  constexpr std::size_t kShown = 24;
  std::string out = fmt::format("{}", fmt::join(ids.first(std::min(ids.size(), kShown)), " "));
  if (ids.size() > kShown) out += fmt::format(" ... ({} in all)", ids.size());
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
    std::optional<int> draft_layers;  // --draft self
    std::string weight_order = kDefaultWeightOrder;
    std::string attention_order = "float";
    std::string kv_layout = "NHD";
    std::string kv_dtype = "auto";
    int num_spec_tokens = 3;
    std::string prompt;
    std::vector<engine::TokenId> prompt_ids;
    std::int64_t max_tokens = 32;
    int batch = 1;
    std::uint64_t seed = 0;
    sample::SamplingParams sampling;
    std::string memory = "64MiB";
    bool json = false;
    bool raw = false;
    std::string system;
    std::string chat_template;
    bool ignore_eos = false;
    std::int64_t max_model_len = 0;
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generation through the reference engine, plain and speculative");
  cmd->footer(
      "MODEL: smollm2-135m (SmolLM2-135M-Instruct, fetched by `make deps`) or any llama GGUF "
      "file: the prompt goes through the model's chat template and the reply is printed as text, "
      "streamed, until the end-of-turn token or --max-tokens. Or tiny-swa, tiny-hybrid, "
      "tiny-mamba or tiny-gemma (mixkv's tiny models have random generated weights and a "
      "byte-level vocabulary, so their output is shown as token ids; tiny-hybrid mixes Gated "
      "DeltaNet and full attention layers, tiny-mamba Mamba2 and attention blocks, tiny-gemma "
      "soft-capped sliding and full layers), or a directory with config.json and "
      "model.safetensors. With --draft, the prompts are generated twice, plain and speculative, "
      "and greedy tokens must match (exit status 3 if not); with --temperature > 0 the two runs "
      "sample the same distribution (speculative sampling), not the same tokens. --batch B runs "
      "B requests: the prompt, then the prompt with a suffix. Greedy (temperature 0) is the "
      "default. docs/engine.md, docs/sample.md.");
  cmd->add_option("MODEL", args->model, "Target model")->required();
  cmd->add_option(
      "--draft", args->draft,
      "Drafter: oracle (the target's own greedy continuation), ngram (prompt lookup), random, "
      "self (the target's first --draft-layers layers, sharing their KV), "
      "mtp (the target's MTP layers: tiny-hybrid), tiny-eagle (with tiny-swa), tiny-dflash "
      "(block drafter, with tiny-swa or tiny-hybrid), or a drafter checkpoint directory "
      "(config.json and model.safetensors)");
  CLI::Option* spec_tokens = cmd->add_option("--num-spec-tokens", args->num_spec_tokens,
                                             "Tokens drafted per step (with --draft)")
                                 ->capture_default_str();
  cmd->add_option("--draft-layers", args->draft_layers,
                  fmt::format("Target layers the --draft self drafter runs (default {})",
                              model::kDefaultSelfDraftLayers));
  auto* text = cmd->add_option("--prompt", args->prompt,
                               "Prompt text: the user's message for a GGUF model (default \"What "
                               "is the capital of France?\"), bytes for a tiny model (default "
                               "\"Once upon a time\")");
  cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids")->excludes(text);
  cmd->add_option("--max-tokens", args->max_tokens, "Tokens generated per request")
      ->capture_default_str();
  cmd->add_option("--batch", args->batch, "Requests generated together")->capture_default_str();
  add_seed_option(*cmd, "--seed", args->seed,
                  "Seed of sampling (request i draws with seed + i) and of the random drafter");
  add_sampling_options(*cmd, args->sampling);
  cmd->add_option("--memory", args->memory, "KV-cache bytes (e.g. 64MiB)")->capture_default_str();
  cmd->add_flag("--json", args->json,
                "One JSON object per request: {\"tokens\", \"text\", \"stats\"}");
  auto* raw = cmd->add_flag("--raw", args->raw,
                            "GGUF models: tokenize the prompt as it is, without the chat template");
  cmd->add_option("--system", args->system, "GGUF models: a system message before the prompt")
      ->excludes(raw);
  cmd->add_option("--chat-template", args->chat_template,
                  "GGUF models: render with this template (chatml, smollm2) instead of the one "
                  "the file's tokenizer.chat_template is recognised as")
      ->excludes(raw);
  cmd->add_flag("--ignore-eos", args->ignore_eos,
                "GGUF models: generate --max-tokens tokens, past the end of the turn");
  cmd->add_option("--max-model-len", args->max_model_len,
                  "Longest request the cache is planned for (default: the model's context, at "
                  "most 2048 for a GGUF model)");
  add_weight_order_option(*cmd, args->weight_order);
  add_attention_order_option(*cmd, args->attention_order);
  add_kv_layout_option(*cmd, args->kv_layout);
  add_kv_dtype_option(*cmd, args->kv_dtype);
  cmd->add_option("--threads", args->threads,
                  "Threads for matrix products and attention (default: one per core, at most 8)");

  return [args, spec_tokens, text, raw](std::ostream& out) {
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
    if (!args->draft.empty()) check_num_spec_tokens(args->num_spec_tokens);
    if (args->batch < 1 || args->batch > 256) {
      throw_invalid(fmt::format("--batch {} is out of range; use 1 to 256", args->batch));
    }
    engine::GenerateOptions go;
    go.max_tokens = args->max_tokens;
    go.sampling = args->sampling;
    go.sampling.seed = args->seed;
    go.max_batch = args->batch;
    go.adaptive_draft = true;
    // Before the model loads and the reply starts: a bad value is refused with nothing printed.
    engine::validate(go);
    sample::validate(go.sampling);
    if (args->max_model_len < 0) {
      throw_invalid(fmt::format("--max-model-len {} is negative", args->max_model_len));
    }
    RunnerSetup setup =
        prepare_runner(args->model, args->draft, args->draft.empty() ? 0 : args->num_spec_tokens,
                       plan::parse_memory_size(args->memory), args->max_model_len, args->threads,
                       args->draft_layers);
    const bool gguf = setup.gguf != nullptr;
    if (!gguf && (raw->count() > 0 || !args->system.empty() || !args->chat_template.empty() ||
                  args->ignore_eos)) {
      throw_invalid(fmt::format(
          "--raw, --system, --chat-template and --ignore-eos are for GGUF models (with a "
          "tokenizer and chat template); {} has a byte vocabulary and no end of turn",
          args->model));
    }
    setup.options.weight_order = parse_weight_order(args->weight_order);
    setup.options.attention_order =
        kernels::parse_attention_order(args->attention_order, "--attention-order");
    setup.options.kv_layout = attn::parse_kv_layout(args->kv_layout, "--kv-layout");
    setup.options.kv_dtype = dtype_option("--kv-dtype", args->kv_dtype);
    runner::ModelRunner runner = setup.make_runner();

    // The prompts: ids as given, else the text through the chat template (GGUF, unless --raw)
    // or as bytes (tiny models), each request's variant suffix after it.
    const std::string prompt_text =
        text->count() > 0 ? args->prompt
                          : (gguf ? "What is the capital of France?" : "Once upon a time");
    const tokenizer::ChatTemplate* chat = nullptr;
    if (gguf && raw->count() == 0 && args->prompt_ids.empty()) {
      chat = &tokenizer::chat_template_for(
          *setup.gguf, args->chat_template.empty()
                           ? std::nullopt
                           : std::optional<std::string_view>(args->chat_template));
    }
    const auto encode = [&](const std::string& s) {
      return gguf ? setup.tokenizer->encode(s, {.add_special = true, .parse_special = true})
                  : engine::encode_bytes(s);
    };
    std::vector<std::vector<engine::TokenId>> prompts;
    for (int i = 0; i < args->batch; ++i) {
      const std::string suffix = variant_suffix(i);
      if (!args->prompt_ids.empty()) {
        std::vector<engine::TokenId> p = args->prompt_ids;
        const auto tail = gguf ? setup.tokenizer->encode(suffix) : engine::encode_bytes(suffix);
        p.insert(p.end(), tail.begin(), tail.end());
        prompts.push_back(std::move(p));
      } else if (chat != nullptr) {
        std::vector<tokenizer::ChatMessage> messages;
        if (!args->system.empty()) messages.push_back({"system", args->system});
        messages.push_back({"user", prompt_text + suffix});
        prompts.push_back(encode(chat->render(messages, true)));
      } else {
        prompts.push_back(encode(prompt_text + suffix));
      }
    }
    if (gguf && !args->ignore_eos) go.stop_tokens = end_of_generation_ids(*setup.tokenizer);
    const bool stream = gguf && !args->json && prompts.size() == 1;
    std::optional<tokenizer::StreamDecoder> decoder;
    if (!args->json) {
      out << fmt::format(
          "generate {}: {} request{}, up to {} tokens each, plain{}{}\n", args->model,
          prompts.size(), prompts.size() == 1 ? "" : "s", args->max_tokens,
          args->draft.empty()
              ? ""
              : fmt::format(" and with --draft {} (k = {})", args->draft, args->num_spec_tokens),
          gguf ? "" : " (random weights: the tokens are not text)");
    }
    if (stream) {
      // The plain run's reply as it is generated; the speculative run is then compared with it.
      decoder.emplace(*setup.tokenizer);
      out << "reply: " << std::flush;
      go.on_tokens = [&](std::size_t, std::span<const engine::TokenId> ids) {
        for (const engine::TokenId id : ids) out << decoder->push(id);
        out << std::flush;
      };
    }
    const engine::GenerateReport plain = engine::generate(runner, prompts, nullptr, go);
    if (stream) out << decoder->finish() << '\n';
    go.on_tokens = nullptr;

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

    // Sampled tokens follow the same distribution plain and speculative, not the same path.
    const bool compare = sample::is_greedy(args->sampling);
    bool all_identical = true;
    std::string report;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const engine::RequestOutput& p = plain.requests[i];
      const engine::RequestOutput& r = drafter ? spec.requests[i] : p;
      const bool identical = r.tokens == p.tokens;
      all_identical = all_identical && (identical || !compare);
      const std::string text =
          gguf ? setup.tokenizer->decode(r.tokens) : engine::decode_bytes(r.tokens);
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
          stats["drafted_per_position"] = s.drafted_per_position;
          stats["accepted_per_position"] = s.accepted_per_position;
          stats["identical_to_plain"] = identical;
        }
        const nlohmann::json j = {
            {"request", i}, {"tokens", r.tokens}, {"text", text}, {"stats", stats}};
        report += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + '\n';
        continue;
      }
      report +=
          fmt::format("request {}: {} prompt tokens ({} from the prefix cache), {} generated\n", i,
                      s.prompt_tokens, s.prefix_hit_tokens, r.tokens.size());
      if (!gguf) {
        report += fmt::format("  tokens  {}\n", id_list(r.tokens));
      } else if (!stream) {
        report += fmt::format("  reply   {}\n", quoted(text));
      }
      report += fmt::format("  plain   {:.1f} tokens/s\n", p.stats.tokens_per_second());
      if (drafter) {
        report += fmt::format(
            "  {:<7} {:.1f} tokens/s ({:.2f}x), acceptance {:.1f}%, mean accepted length {:.2f}, "
            "{}\n",
            drafter->name(), s.tokens_per_second(),
            p.stats.tokens_per_second() > 0 ? s.tokens_per_second() / p.stats.tokens_per_second()
                                            : 0.0,
            100 * s.acceptance_rate(), s.mean_accepted_length(),
            !compare    ? "sampled"
            : identical ? "identical to plain"
                        : "DIFFERS FROM PLAIN");
      }
    }
    if (!args->json) {
      report += fmt::format("batch: plain {:.1f} tokens/s", plain.tokens_per_second());
      if (drafter) {
        report += fmt::format(", {} {:.1f} tokens/s; tokens {}", drafter->name(),
                              spec.tokens_per_second(),
                              !compare        ? "sampled (not compared)"
                              : all_identical ? "identical"
                                              : "DIFFER");
      }
      report += '\n';
    }
    out << report;
    if (!all_identical) throw ExitStatus{3};
  };
}

}  // namespace mixkv::cli
