// `mixkv bench-generate`: plain against speculative tokens/s, with acceptance, over a fixed prompt
// set: prompts whose answers copy spans of the prompt (rewrite, extract, edit code), where prompt
// lookup pays, and open questions, where it finds nothing and adaptive draft length must keep it
// at plain speed. Every configuration runs several times; the medians are reported.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "cli.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/kernels/thread_pool.hpp"
#include "mixkv/model/architecture.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/ngram.hpp"
#include "mixkv/spec/oracle.hpp"
#include "mixkv/spec/random.hpp"
#include "mixkv/spec/self_draft.hpp"
#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "mixkv/weights/gguf_model.hpp"
#include "mixkv/weights/model_files.hpp"
#include "model_options.hpp"
#include "runner_setup.hpp"

namespace mixkv::cli {
namespace {

struct BenchPrompt {
  std::string name;
  std::string category;  // "copy": the answer copies spans of the prompt; "novel": it does not
  std::string text;
};

// The built-in set. Copy prompts hand the model a text to reproduce with small changes, so
// prompt lookup finds the answer's spans in the prompt; novel prompts ask for new text.
const std::vector<BenchPrompt>& builtin_prompts() {
  static const std::vector<BenchPrompt> prompts = {
      {"rewrite", "copy",
       "Rewrite the following paragraph with the spelling mistakes corrected and nothing else "
       "changed:\n\nThe quick brown fox jumpd over the lazy dog. It was a sunny day and the fox "
       "was very hapy. The dog did not move at all, because it was sleeping under the old oak "
       "tree near the river."},
      {"extract", "copy",
       "Copy every sentence of this text that names a city, one per line:\n\nParis is the "
       "capital of France. The weather was cold that winter. Berlin has many museums and parks. "
       "My friend likes to read books. Rome was not built in a day."},
      {"rename", "copy",
       "Rename the variable x to count in this Python function and show the whole "
       "function:\n\n```python\ndef tally(items):\n    x = 0\n    for item in items:\n        if "
       "item is not None:\n            x = x + 1\n    return x\n```"},
      {"docstring", "copy",
       "Add a docstring to this function and show the whole code:\n\n```python\ndef "
       "area(width, height):\n    if width < 0 or height < 0:\n        raise "
       "ValueError(\"negative size\")\n    return width * height\n```"},
      {"const", "copy",
       "Change var to const in this JavaScript function and show the whole "
       "function:\n\n```javascript\nfunction total(prices) {\n  var sum = 0;\n  for (var i = 0; i "
       "< prices.length; i++) {\n    sum = sum + prices[i];\n  }\n  return sum;\n}\n```"},
      {"emails", "copy",
       "Extract every email address from this text, one per line:\n\nContact Anna at "
       "anna.smith@example.com for sales. For support write to help@shop.example.org or call us. "
       "Bob (bob.jones@mail.example.net) leads the team."},
      {"poem", "novel", "Write a short poem about the sea."},
      {"exercise", "novel", "What are three benefits of regular exercise?"},
      {"rainbow", "novel", "Explain how a rainbow forms."},
      {"coffee", "novel", "Suggest a name for a new coffee shop and say why you chose it."},
  };
  return prompts;
}

// --prompts FILE: one prompt a line (blank lines skipped), category "file"; or, on a line that
// starts with '{', a JSON object {"name", "category", "text"} (bench/generate-prompts.jsonl holds
// the built-in set, so that scripts/bench-llamacpp-generate.py runs llama.cpp on the same prompts).
std::vector<BenchPrompt> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_invalid(fmt::format("--prompts {}: cannot open the file", path));
  std::vector<BenchPrompt> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const std::string name = fmt::format("line {}", number);
    if (line[first] != '{') {
      out.push_back({name, "file", line});
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string() ||
        j.value("text", std::string()).empty()) {
      throw_invalid(fmt::format(
          "--prompts {}: line {} starts with '{{' but is not a JSON object with a non-empty "
          "string \"text\" (and optional \"name\", \"category\")",
          path, number));
    }
    const auto field = [&](const char* key, const std::string& fallback) {
      return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
    };
    out.push_back({field("name", name), field("category", "file"), j["text"].get<std::string>()});
  }
  if (out.empty()) throw_invalid(fmt::format("--prompts {}: no prompt in the file", path));
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The 1-minute load average, or nothing where the system does not say: the machine may be
// shared, and a ratio means more beside it.
std::optional<double> load_average() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  if (in >> load) return load;
  return std::nullopt;
}

// A cache line's round trip between two spinning threads, in ns, unless the runs use one thread:
// a machine (or a VM's host) may put the threads that share a step on cores sharing an L3 or on
// cores farther apart, and a verify's or a batch's step costs more on the far placement
// (docs/engine.md, "Twelfth pass"). Nothing where it could not be measured.
std::optional<double> thread_round_trip_ns(int threads) {
  if (threads == 1) return std::nullopt;
  return kernels::cache_line_round_trip_ns(2000);
}

// One configuration (a prompt and a drafter, or plain) over the runs.
struct Measured {
  std::vector<double> tokens_per_second;  // per run
  // Per run: output tokens after each request's first over the longest time after a first token
  // (decoding alone, without the prompt's prefill).
  std::vector<double> decode_tokens_per_second;
  std::int64_t generated = 0;  // per run (greedy: the same every run)
  std::int64_t decoded = 0;    // per run: the generated tokens after each request's first
  std::int64_t drafted = 0;    // summed over the requests of one run
  std::int64_t accepted = 0;
  std::int64_t decode_steps = 0;
  std::vector<std::int64_t> drafted_per_position;
  std::vector<std::int64_t> accepted_per_position;
  bool identical = true;  // greedy tokens equal plain's in every run
  double seconds() const {
    const double tps = median(tokens_per_second);
    return tps > 0 ? static_cast<double>(generated) / tps : 0.0;
  }
  double decode_seconds() const {
    const double tps = median(decode_tokens_per_second);
    return tps > 0 ? static_cast<double>(decoded) / tps : 0.0;
  }
};

void record(Measured& m, const engine::GenerateReport& r) {
  m.tokens_per_second.push_back(r.tokens_per_second());
  std::int64_t after_first = 0;
  double span = 0;
  for (const auto& q : r.requests) {
    after_first += std::max<std::int64_t>(0, q.stats.generated_tokens - 1);
    span = std::max(span, q.stats.seconds - q.stats.first_token_seconds);
  }
  m.decode_tokens_per_second.push_back(span > 0 ? static_cast<double>(after_first) / span : 0.0);
  m.generated = r.generated_tokens();
  m.decoded = after_first;
  m.drafted = m.accepted = m.decode_steps = 0;
  m.drafted_per_position.clear();
  m.accepted_per_position.clear();
  for (const auto& q : r.requests) {
    m.drafted += q.stats.drafted_tokens;
    m.accepted += q.stats.accepted_tokens;
    m.decode_steps += q.stats.decode_steps;
    m.drafted_per_position.resize(q.stats.drafted_per_position.size());
    m.accepted_per_position.resize(q.stats.accepted_per_position.size());
    for (std::size_t p = 0; p < q.stats.drafted_per_position.size(); ++p) {
      m.drafted_per_position[p] += q.stats.drafted_per_position[p];
      m.accepted_per_position[p] += q.stats.accepted_per_position[p];
    }
  }
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// The median over runs of a drafter's decode tokens/s over those of the plain run just before
// it: each pair ran within a second, so a machine that changes speed between runs (a host moving
// the threads: docs/engine.md, "Twelfth pass") moves both sides of a pair alike.
double paired_decode_ratio(const Measured& spec, const Measured& plain) {
  std::vector<double> ratios;
  for (std::size_t r = 0;
       r < std::min(spec.decode_tokens_per_second.size(), plain.decode_tokens_per_second.size());
       ++r) {
    ratios.push_back(ratio(spec.decode_tokens_per_second[r], plain.decode_tokens_per_second[r]));
  }
  return median(ratios);
}

}  // namespace

Action add_bench_generate_command(CLI::App& app) {
  struct Args {
    std::string model;
    std::vector<std::string> drafts = {"oracle", "ngram"};
    int num_spec_tokens = 4;
    std::optional<int> draft_layers;  // self; absent: model::kDefaultSelfDraftLayers
    int batch = 1;
    std::string prompts;
    std::int64_t max_tokens = 128;
    int runs = 3;
    int threads = 0;
    std::string weight_order = kDefaultWeightOrder;
    std::string attention_order = "float";
    std::string kv_layout = "NHD";
    bool fixed_draft = false;
    std::optional<double> step_cost_per_row;  // absent: measured
    std::string memory = "256MiB";
    std::string kv_dtype = "auto";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "bench-generate", "Plain against speculative tokens/s with acceptance, over a prompt set");
  cmd->footer(
      "MODEL: smollm2-135m, a llama GGUF file, or a tiny model (tiny-swa, ...; byte prompts, "
      "random weights). Each prompt of the built-in set (copy prompts: rewrite, extract, rename, "
      "docstring, const, emails, whose answers copy spans of the prompt; novel prompts: poem, "
      "exercise, rainbow, coffee) runs as --batch requests, plain and with each drafter, --runs "
      "times; tokens/s are medians, prefill included and decode only (the tokens after each "
      "request's first over the time after it). Greedy tokens must match plain's (exit status 3 "
      "if not). Progress goes to stderr when it is a terminal. docs/engine.md.");
  cmd->add_option("MODEL", args->model, "Target model")->required();
  cmd->add_option("--draft", args->drafts,
                  "Drafters to compare with plain: oracle (the target's own greedy "
                  "continuation), ngram (prompt lookup), self (the target's first "
                  "--draft-layers layers), random; none: plain only")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--num-spec-tokens", args->num_spec_tokens,
                  "Most tokens drafted per step (the draft length adapts below it)")
      ->capture_default_str();
  cmd->add_option("--draft-layers", args->draft_layers,
                  fmt::format("Target layers the self drafter runs (default {})",
                              model::kDefaultSelfDraftLayers));
  cmd->add_option("--batch", args->batch, "Requests of each prompt generated together")
      ->capture_default_str();
  cmd->add_option("--prompts", args->prompts,
                  "A file of prompts, one a line (plain text, or JSON {\"name\", \"category\", "
                  "\"text\"}), instead of the built-in set (bench/generate-prompts.jsonl)");
  cmd->add_option("--max-tokens", args->max_tokens, "Tokens generated per request, at most")
      ->capture_default_str();
  cmd->add_option("--runs", args->runs, "Runs of each configuration (medians are reported)")
      ->capture_default_str();
  add_weight_order_option(*cmd, args->weight_order);
  add_attention_order_option(*cmd, args->attention_order);
  add_kv_layout_option(*cmd, args->kv_layout);
  cmd->add_option("--threads", args->threads,
                  "Threads for matrix products and attention (default: one per core, at most 8)");
  cmd->add_flag("--fixed-draft-length", args->fixed_draft,
                "Draft --num-spec-tokens every step (no adaptive draft length)");
  cmd->add_option("--step-cost-per-row", args->step_cost_per_row,
                  "Draft lengths from a fixed cost, a verify row this fraction of a one-row step "
                  "(default: measured online), so the drafting counts do not depend on the "
                  "machine's load");
  cmd->add_option("--memory", args->memory, "KV-cache bytes (e.g. 256MiB)")->capture_default_str();
  add_kv_dtype_option(*cmd, args->kv_dtype);
  cmd->add_flag("--json", args->json, "One JSON object: per prompt and per category");

  return [args](std::ostream& out) {
    if (args->batch < 1 || args->batch > 256) {
      throw_invalid(fmt::format("--batch {} is out of range; use 1 to 256", args->batch));
    }
    if (args->runs < 1 || args->runs > 100) {
      throw_invalid(fmt::format("--runs {} is out of range; use 1 to 100", args->runs));
    }
    check_num_spec_tokens(args->num_spec_tokens);
    // `none` alone: plain decoding only (a batch's throughput against batch 1's).
    if (args->drafts.size() == 1 && args->drafts[0] == "none") args->drafts.clear();
    for (const std::string& d : args->drafts) {
      if (d != "oracle" && d != "ngram" && d != "random" && d != model::kSelfDraft) {
        throw_invalid(
            fmt::format("--draft {}: bench-generate compares oracle, ngram, self and random "
                        "(comma-separated), or none alone (plain only)",
                        d));
      }
    }
    const bool self = std::ranges::find(args->drafts, model::kSelfDraft) != args->drafts.end();
    if (args->draft_layers && !self) {
      throw_invalid(fmt::format("--draft-layers {} is for the self drafter; add --draft self",
                                *args->draft_layers));
    }
    // The model: a GGUF (its tokenizer and chat template make the prompts) or a tiny model.
    std::shared_ptr<const weights::GgufFile> gguf;
    std::unique_ptr<tokenizer::Tokenizer> tok;
    model::ModelSource source;
    weights::TensorMap tensors;
    if (auto path = weights::resolve_gguf(args->model)) {
      gguf = std::make_shared<const weights::GgufFile>(weights::GgufFile::open(*path));
      source = weights::model_source_from_gguf(*gguf, args->model);
      tok = tokenizer::tokenizer_from_gguf(*gguf);
    } else if (const engine::TinyModel* tiny = engine::find_tiny_model(args->model);
               tiny != nullptr && tiny->missing.empty()) {
      source = engine::tiny_model_source(*tiny);
      tensors = runner::generate_weights(model::read_architecture(source),
                                         model::describe(source, std::nullopt, {}), tiny->seed);
    } else {
      throw_invalid(fmt::format(
          "bench-generate {}: give smollm2-135m (fetched by `make deps`), a GGUF file or a tiny "
          "model",
          args->model));
    }
    runner::RunnerOptions ro;
    ro.memory_bytes = plan::parse_memory_size(args->memory);
    ro.num_spec_tokens = args->num_spec_tokens;
    ro.threads = args->threads;
    ro.weight_order = parse_weight_order(args->weight_order);
    ro.attention_order = kernels::parse_attention_order(args->attention_order, "--attention-order");
    ro.kv_layout = attn::parse_kv_layout(args->kv_layout, "--kv-layout");
    ro.kv_dtype = dtype_option("--kv-dtype", args->kv_dtype);
    if (gguf) ro.max_model_len = 2048;  // as generate: far more than a prompt and its answer
    if (self) {
      // The self drafter changes nothing of the plan (its layers' KV is the target's), so one
      // runner serves the plain runs and the others.
      model::DescribeOptions d;
      d.draft_layers = args->draft_layers;
      ro.self_draft_layers = model::describe_self(source, d).draft_info->shared_target_layers;
    }
    runner::ModelRunner runner =
        gguf ? runner::ModelRunner(source, gguf, ro) : runner::ModelRunner(source, tensors, ro);

    const std::vector<BenchPrompt> set =
        args->prompts.empty() ? builtin_prompts() : read_prompts(args->prompts);
    std::vector<engine::TokenId> stops;
    if (tok) {
      for (engine::TokenId id = 0; id < tok->vocab_size(); ++id) {
        if (tok->is_end_of_generation(id)) stops.push_back(id);
      }
    }
    const auto encode = [&](const std::string& text) {
      if (!gguf) return engine::encode_bytes(text);
      const auto& chat = tokenizer::chat_template_for(*gguf, std::nullopt);
      const std::vector<tokenizer::ChatMessage> messages = {{"user", text}};
      return tok->encode(chat.render(messages, true), {.add_special = true, .parse_special = true});
    };

    const bool progress = isatty(STDERR_FILENO) != 0;
    const std::size_t total =
        set.size() * (1 + args->drafts.size()) * static_cast<std::size_t>(args->runs);
    std::size_t done = 0;
    const auto tick = [&](const std::string& what) {
      ++done;
      if (!progress) return;
      constexpr int kWidth = 30;
      const auto filled = static_cast<int>(kWidth * done / total);
      std::cerr << fmt::format("\r[{:<{}}] {}/{} {:<32}", std::string(filled, '#'), kWidth, done,
                               total, what)
                << std::flush;
    };

    // One cost model over every run: the plain runs measure one-row steps, the speculative ones
    // the verify steps, and each run's draft lengths start from what the runs before measured.
    if (args->step_cost_per_row &&
        !(*args->step_cost_per_row >= 0 && *args->step_cost_per_row <= 4)) {
      throw_invalid(fmt::format("--step-cost-per-row {} is out of range; use 0 to 4",
                                *args->step_cost_per_row));
    }
    const std::shared_ptr<sched::StepCost> step_cost =
        args->step_cost_per_row
            ? std::shared_ptr<sched::StepCost>(
                  std::make_shared<sched::LinearStepCost>(1.0, *args->step_cost_per_row))
            : std::make_shared<sched::MeasuredStepCost>();
    // Per prompt: plain, then each drafter; every run of a drafter right after a plain run.
    std::vector<Measured> plain(set.size());
    std::vector<std::vector<Measured>> spec(set.size(), std::vector<Measured>(args->drafts.size()));
    bool all_identical = true;
    const std::optional<double> trip_before = thread_round_trip_ns(args->threads);
    for (std::size_t i = 0; i < set.size(); ++i) {
      const std::vector<std::vector<engine::TokenId>> prompts(static_cast<std::size_t>(args->batch),
                                                              encode(set[i].text));
      engine::GenerateOptions go;
      go.max_tokens = args->max_tokens;
      go.max_batch = args->batch;
      go.stop_tokens = stops;
      go.adaptive_draft = !args->fixed_draft;
      go.step_cost = step_cost;
      for (int run = 0; run < args->runs; ++run) {
        go.num_spec_tokens = 0;
        const engine::GenerateReport p = engine::generate(runner, prompts, nullptr, go);
        record(plain[i], p);
        tick(fmt::format("{} plain run {}", set[i].name, run + 1));
        for (std::size_t d = 0; d < args->drafts.size(); ++d) {
          std::unique_ptr<spec::Drafter> drafter;
          if (args->drafts[d] == "oracle") {
            std::vector<std::vector<engine::TokenId>> refs;
            for (std::size_t r = 0; r < prompts.size(); ++r) {
              refs.push_back(prompts[r]);
              refs.back().insert(refs.back().end(), p.requests[r].tokens.begin(),
                                 p.requests[r].tokens.end());
            }
            drafter = std::make_unique<spec::OracleDrafter>(std::move(refs));
          } else if (args->drafts[d] == "ngram") {
            drafter = std::make_unique<spec::NgramDrafter>();
          } else if (args->drafts[d] == model::kSelfDraft) {
            drafter = std::make_unique<spec::SelfDrafter>(runner);
          } else {
            drafter = std::make_unique<spec::RandomDrafter>(runner.vocab_size(), 0);
          }
          go.num_spec_tokens = args->num_spec_tokens;
          const engine::GenerateReport s = engine::generate(runner, prompts, drafter.get(), go);
          record(spec[i][d], s);
          for (std::size_t r = 0; r < prompts.size(); ++r) {
            if (s.requests[r].tokens != p.requests[r].tokens) spec[i][d].identical = false;
          }
          all_identical = all_identical && spec[i][d].identical;
          tick(fmt::format("{} {} run {}", set[i].name, args->drafts[d], run + 1));
        }
      }
    }
    if (progress) std::cerr << '\n';
    const std::optional<double> trip_after = thread_round_trip_ns(args->threads);

    // Per category: tokens over the medians' seconds, summed over its prompts.
    std::vector<std::string> categories;
    for (const BenchPrompt& p : set) {
      if (std::find(categories.begin(), categories.end(), p.category) == categories.end()) {
        categories.push_back(p.category);
      }
    }
    struct Sum {
      double tokens = 0, seconds = 0, decoded = 0, decode_seconds = 0;
      std::int64_t drafted = 0, accepted = 0, steps = 0;
      std::vector<std::int64_t> dpp, app;
      double tps() const { return seconds > 0 ? tokens / seconds : 0.0; }
      double decode_tps() const { return decode_seconds > 0 ? decoded / decode_seconds : 0.0; }
      void add(const Measured& m) {
        tokens += static_cast<double>(m.generated);
        seconds += m.seconds();
        decoded += static_cast<double>(m.decoded);
        decode_seconds += m.decode_seconds();
        drafted += m.drafted;
        accepted += m.accepted;
        steps += m.decode_steps;
        dpp.resize(std::max(dpp.size(), m.drafted_per_position.size()));
        app.resize(dpp.size());
        for (std::size_t p = 0; p < m.drafted_per_position.size(); ++p) {
          dpp[p] += m.drafted_per_position[p];
          app[p] += m.accepted_per_position[p];
        }
      }
    };
    const auto rate = [](std::int64_t a, std::int64_t b) {
      return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
    };
    const std::optional<double> load = load_average();

    if (args->json) {
      nlohmann::json j = {{"model", args->model},
                          {"batch", args->batch},
                          {"num_spec_tokens", args->num_spec_tokens},
                          {"adaptive_draft", !args->fixed_draft},
                          {"runs", args->runs},
                          {"threads", args->threads},
                          {"kv_dtype", args->kv_dtype},
                          {"max_tokens", args->max_tokens},
                          {"identical_to_plain", all_identical}};
      if (load) j["load_average"] = *load;
      if (args->threads != 1) {
        const auto ns = [](std::optional<double> v) {
          return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
        };
        j["thread_round_trip_ns"] = {{"before", ns(trip_before)}, {"after", ns(trip_after)}};
      }
      if (args->step_cost_per_row) j["step_cost_per_row"] = *args->step_cost_per_row;
      // What the draft policy read at the end: a step of batch + j rows over one of batch rows.
      nlohmann::json ratios = nlohmann::json::array();
      for (int extra = 0; extra <= args->batch * args->num_spec_tokens; ++extra) {
        ratios.push_back(step_cost->step(args->batch + extra) / step_cost->step(args->batch));
      }
      j["step_cost_ratio"] = ratios;
      if (self) j["draft_layers"] = runner.self_draft_layers();
      j["prompts"] = nlohmann::json::array();
      for (std::size_t i = 0; i < set.size(); ++i) {
        nlohmann::json pj = {
            {"name", set[i].name},
            {"category", set[i].category},
            {"generated_tokens", plain[i].generated},
            {"plain_tokens_per_second", median(plain[i].tokens_per_second)},
            {"plain_decode_tokens_per_second", median(plain[i].decode_tokens_per_second)}};
        for (std::size_t d = 0; d < args->drafts.size(); ++d) {
          const Measured& m = spec[i][d];
          pj[args->drafts[d]] = {
              {"tokens_per_second", median(m.tokens_per_second)},
              {"ratio_to_plain",
               ratio(median(m.tokens_per_second), median(plain[i].tokens_per_second))},
              {"decode_tokens_per_second", median(m.decode_tokens_per_second)},
              {"decode_ratio_to_plain", ratio(median(m.decode_tokens_per_second),
                                              median(plain[i].decode_tokens_per_second))},
              {"paired_decode_ratio_to_plain", paired_decode_ratio(m, plain[i])},
              {"acceptance_rate", rate(m.accepted, m.drafted)},
              {"mean_accepted_length", rate(m.accepted + m.decode_steps, m.decode_steps)},
              {"accepted_per_position", m.accepted_per_position},
              {"drafted_per_position", m.drafted_per_position},
              {"identical_to_plain", m.identical}};
        }
        j["prompts"].push_back(pj);
      }
      j["categories"] = nlohmann::json::array();
      for (const std::string& c : categories) {
        Sum ps;
        for (std::size_t i = 0; i < set.size(); ++i) {
          if (set[i].category == c) ps.add(plain[i]);
        }
        nlohmann::json cj = {{"category", c},
                             {"plain_tokens_per_second", ps.tps()},
                             {"plain_decode_tokens_per_second", ps.decode_tps()}};
        for (std::size_t d = 0; d < args->drafts.size(); ++d) {
          Sum s;
          for (std::size_t i = 0; i < set.size(); ++i) {
            if (set[i].category == c) s.add(spec[i][d]);
          }
          cj[args->drafts[d]] = {{"tokens_per_second", s.tps()},
                                 {"ratio_to_plain", ratio(s.tps(), ps.tps())},
                                 {"decode_tokens_per_second", s.decode_tps()},
                                 {"decode_ratio_to_plain", ratio(s.decode_tps(), ps.decode_tps())},
                                 {"acceptance_rate", rate(s.accepted, s.drafted)},
                                 {"mean_accepted_length", rate(s.accepted + s.steps, s.steps)},
                                 {"accepted_per_position", s.app},
                                 {"drafted_per_position", s.dpp}};
        }
        j["categories"].push_back(cj);
      }
      out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    } else {
      out << fmt::format(
          "bench-generate {}: batch {}, k = {} ({}), {} run{} each (medians), threads {}{}\n",
          args->model, args->batch, args->num_spec_tokens, args->fixed_draft ? "fixed" : "adaptive",
          args->runs, args->runs == 1 ? "" : "s",
          args->threads > 0 ? fmt::format("{}", args->threads) : "default",
          load ? fmt::format(", load {:.1f}", *load) : "");
      if (trip_before || trip_after) {
        const auto ns = [](std::optional<double> v) {
          return v ? fmt::format("{:.0f} ns", *v) : std::string("not measured");
        };
        out << fmt::format("threads' cache-line round trip: {} before the runs, {} after\n",
                           ns(trip_before), ns(trip_after));
      }
      out << "step cost, batch + 0.." << args->batch * args->num_spec_tokens
          << " rows over batch rows:";
      for (int extra = 0; extra <= args->batch * args->num_spec_tokens; ++extra) {
        out << fmt::format(" {:.2f}",
                           step_cost->step(args->batch + extra) / step_cost->step(args->batch));
      }
      out << '\n';
      if (self) {
        out << fmt::format("self drafter: the target's first {} layers\n",
                           runner.self_draft_layers());
      }
      const auto cell = [&](double tps, double base, double acc) {
        return fmt::format(
            "  {:>18}", fmt::format("{:.1f} ({:.2f}x, {:.0f}%)", tps, ratio(tps, base), 100 * acc));
      };
      // Two tables: the whole requests' tokens/s (prefill included), then decoding alone (the
      // tokens after each request's first over the time after it), which is what speculation
      // speeds up.
      for (const bool decode : {false, true}) {
        out << (decode ? "decode only (after each request's first token):\n"
                       : "prefill included:\n");
        out << fmt::format("{:<10} {:<8} {:>7} {:>9}", "prompt", "category", "tokens", "plain t/s");
        for (const std::string& d : args->drafts) {
          out << fmt::format("  {:>18}", fmt::format("{} t/s (x, acc)", d));
        }
        out << '\n';
        const auto tps = [&](const Measured& m) {
          return median(decode ? m.decode_tokens_per_second : m.tokens_per_second);
        };
        for (std::size_t i = 0; i < set.size(); ++i) {
          const double base = tps(plain[i]);
          out << fmt::format("{:<10} {:<8} {:>7} {:>9.1f}", set[i].name, set[i].category,
                             decode ? plain[i].decoded : plain[i].generated, base);
          for (std::size_t d = 0; d < args->drafts.size(); ++d) {
            const Measured& m = spec[i][d];
            out << cell(tps(m), base, rate(m.accepted, m.drafted));
          }
          out << '\n';
        }
        for (const std::string& c : categories) {
          Sum ps;
          for (std::size_t i = 0; i < set.size(); ++i) {
            if (set[i].category == c) ps.add(plain[i]);
          }
          const double base = decode ? ps.decode_tps() : ps.tps();
          out << fmt::format("{:<10} {:<8} {:>7.0f} {:>9.1f}", "all", c,
                             decode ? ps.decoded : ps.tokens, base);
          for (std::size_t d = 0; d < args->drafts.size(); ++d) {
            Sum s;
            for (std::size_t i = 0; i < set.size(); ++i) {
              if (set[i].category == c) s.add(spec[i][d]);
            }
            out << cell(decode ? s.decode_tps() : s.tps(), base, rate(s.accepted, s.drafted));
          }
          out << '\n';
        }
      }
      if (!args->drafts.empty()) {
        out << fmt::format("greedy tokens {} to plain\n",
                           all_identical ? "identical" : "DIFFER FROM PLAIN");
      }
    }
    if (!all_identical) throw ExitStatus{3};
  };
}

}  // namespace mixkv::cli
