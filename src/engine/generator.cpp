#include "mixkv/engine/generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "mixkv/core/error.hpp"
#include "mixkv/sched/scheduler.hpp"

namespace mixkv::engine {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

sched::ModelOutput RunnerModel::forward(std::span<const sched::Work> batch) {
  std::vector<runner::SequenceInput> inputs;
  inputs.reserve(batch.size());
  for (const sched::Work& w : batch) {
    runner::SequenceInput in;
    in.tokens = w.tokens;
    in.start = w.start;
    in.block_tables = w.block_tables;
    in.checkpoints = !w.prefill;
    in.recurrent = w.recurrent;
    // The LM head only for the rows the scheduler reads (sched::logit_rows).
    in.logits = !w.prefill ? runner::LogitRows::kAll
                : w.sample ? runner::LogitRows::kLast
                           : runner::LogitRows::kNone;
    inputs.push_back(std::move(in));
  }
  runner::ForwardOutput fwd = runner_.forward(inputs);
  sched::ModelOutput out;
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  // Greedy picks only where they are read (a prefill's earlier rows pick nothing), all rows'
  // in one call.
  std::vector<TokenId> row_picks(fwd.logits.size() / vocab);
  runner_.argmax_rows(fwd.logits, row_picks);
  std::size_t read = 0;  // logits rows
  for (const sched::Work& w : batch) {
    const std::size_t n = w.tokens.size(), picked = sched::logit_rows(w);
    for (std::size_t i = 0; i < n; ++i)
      out.picks.push_back(i + picked >= n ? row_picks[read++] : 0);
  }
  // Sampled requests read the logits rows; they move, no copy. A greedy batch's logits go back
  // to the runner, whose next forward writes into them (no allocation, no zeroing).
  if (std::ranges::any_of(batch, [](const sched::Work& w) { return w.reads_logits; })) {
    out.logits = std::move(fwd.logits);
  } else {
    runner_.reuse_logits(std::move(fwd.logits));
  }
  if (features_) {
    out.feature_width = runner_.draft_feature_width();
    out.features =
        runner_.has_block_drafter() ? std::move(fwd.layer_hidden) : std::move(fwd.hidden);
  }
  return out;
}

std::int64_t GenerateReport::generated_tokens() const {
  std::int64_t n = 0;
  for (const auto& r : requests) n += r.stats.generated_tokens;
  return n;
}
double GenerateReport::tokens_per_second() const {
  return seconds > 0 ? static_cast<double>(generated_tokens()) / seconds : 0.0;
}

void validate(const GenerateOptions& options) {
  if (options.max_tokens < 1) {
    throw_invalid(fmt::format("--max-tokens {} is not positive", options.max_tokens));
  }
  sched::validate_num_spec_tokens(options.num_spec_tokens);
  if (options.max_batch < 1 || options.prefill_chunk < 1) {
    throw_invalid("generate: max_batch and prefill_chunk must be positive");
  }
}

GenerateReport generate(runner::ModelRunner& runner, std::span<const std::vector<TokenId>> prompts,
                        spec::Drafter* drafter, const GenerateOptions& options) {
  validate(options);
  const int k = drafter != nullptr ? options.num_spec_tokens : 0;
  if (k > runner.desc().num_spec_tokens) {
    // The plan sized the look-ahead, the recurrent checkpoints and conv rows for that many.
    throw_invalid(fmt::format(
        "--num-spec-tokens {} exceeds the {} speculative tokens the runner's cache was planned "
        "for; build the runner with RunnerOptions::num_spec_tokens = {}",
        k, runner.desc().num_spec_tokens, k));
  }
  const plan::CachePlan& plan = runner.plan();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto len = static_cast<std::int64_t>(prompts[i].size());
    if (len < 1) throw_invalid(fmt::format("request {}: the prompt is empty", i));
    if (len + options.max_tokens + k > plan.max_model_len) {
      throw_invalid(fmt::format(
          "request {}: {} prompt tokens + {} generated + {} speculative exceed the planned "
          "max_model_len {}; shorten the prompt or --max-tokens",
          i, len, options.max_tokens, k, plan.max_model_len));
    }
  }

  cache::KvCacheManager manager(plan, k, {options.prefix_caching, 0});
  sched::SchedulerOptions so;
  so.num_spec_tokens = k;
  so.max_batch = options.max_batch;
  so.adaptive_draft = options.adaptive_draft;
  so.step_cost = options.step_cost;
  so.prefill_chunk = options.prefill_chunk;
  so.before_free = options.before_free;
  so.on_tokens = options.on_tokens;
  sched::Scheduler scheduler(manager, plan, so);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    // Each request draws with its own seed, so a batch of one prompt gives different samples
    // and request i's tokens do not depend on the batch size.
    sample::SamplingParams sampling = options.sampling;
    sampling.seed = options.sampling.seed + i;
    scheduler.add({prompts[i], options.max_tokens, fmt::format("request {}", i),
                   options.stop_tokens, sampling});
  }
  RunnerModel model(runner, k > 0 && drafter != nullptr);
  const auto start = Clock::now();
  scheduler.run(model, k > 0 ? drafter : nullptr);

  GenerateReport report;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report.steps = scheduler.counters().steps;
  report.preemptions = scheduler.counters().preemptions;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput out;
    const std::span<const TokenId> generated = scheduler.outputs(i);
    // A speculative step may commit past max_tokens (an oracle's drafts are not capped).
    const auto n = std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(generated.size()),
                                            static_cast<std::ptrdiff_t>(options.max_tokens));
    out.tokens.assign(generated.begin(), generated.begin() + n);
    out.stats = scheduler.stats(i);
    out.stats.generated_tokens = n;
    report.requests.push_back(std::move(out));
  }
  return report;
}

}  // namespace mixkv::engine
