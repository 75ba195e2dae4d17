// Greedy generation over the reference runner: the one scheduler (mixkv::sched) drives the
// runner as its model, with an optional drafter (mixkv::spec) for speculative decoding: admission
// through the KvCacheManager (all-or-nothing, prefix caching), chunked prefill, preemption by
// recompute, drafts verified in one target forward and only verified tokens committed.
// docs/engine.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/sample/sampler.hpp"
#include "mixkv/sched/scheduler.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::engine {

using cache::TokenId;
using sched::RequestStats;

// The reference runner as the scheduler's model: one forward over the step's works, greedy
// picks on the rows the scheduler reads, and (with `features`) what its drafter observes.
// `generate` and the server (mixkv::server) run it.
class RunnerModel final : public sched::Model {
 public:
  RunnerModel(runner::ModelRunner& runner, bool features) : runner_(runner), features_(features) {}
  sched::ModelOutput forward(std::span<const sched::Work> batch) override;
  std::int64_t vocab_size() const override { return runner_.vocab_size(); }

 private:
  runner::ModelRunner& runner_;
  bool features_;
};

struct GenerateOptions {
  std::int64_t max_tokens = 32;  // generated tokens per request, at most
  int num_spec_tokens = 0;       // k; 0 or no drafter: plain decoding
  int max_batch = 16;            // requests running at once
  // SchedulerOptions::adaptive_draft. Off by default here: the engine's tests pin k drafts a step
  // to exercise rejection and rollback; `mixkv generate` and `bench-generate` turn it on.
  bool adaptive_draft = false;
  // SchedulerOptions::step_cost: null measures this call's steps; bench-generate shares one over
  // its runs, tests inject a fixed one.
  std::shared_ptr<sched::StepCost> step_cost;
  std::int64_t prefill_chunk = 32;  // prompt tokens one request computes per step
  bool prefix_caching = true;
  // Tokens that end a request (the tokenizer's end-of-generation ids); empty: every request
  // generates max_tokens (the tiny models, whose random weights have no notion of an end).
  std::vector<TokenId> stop_tokens;
  // Every request's sampling parameters (default greedy); request i draws with seed + i.
  sample::SamplingParams sampling;
  // Called after every step with the tokens it committed to request `request` (streaming).
  std::function<void(std::size_t request, std::span<const TokenId> tokens)> on_tokens;
  // Called for each finished request just before its blocks are freed (tests inspect the cache).
  std::function<void(const cache::KvCacheManager&, cache::RequestId, std::size_t request)>
      before_free;
};

struct RequestOutput {
  std::vector<TokenId> tokens;  // generated: max_tokens, or fewer up to a stop token
  RequestStats stats;
};

struct GenerateReport {
  std::vector<RequestOutput> requests;  // in prompt order
  std::int64_t steps = 0;
  std::int64_t preemptions = 0;
  double seconds = 0;
  std::int64_t generated_tokens() const;
  double tokens_per_second() const;
};

// Throws InvalidInput naming the flag when max_tokens, num_spec_tokens, max_batch or
// prefill_chunk is out of range: what generate checks before any work, for a caller that wants to
// refuse bad options before it loads a model. (The sampling parameters are checked per request,
// naming it: sample::validate checks them alone.)
void validate(const GenerateOptions& options);

// Generates for every prompt. `drafter` may be null (plain decoding). The runner's cache is
// reused; a fresh manager is made per call. Throws Error when a request cannot fit the cache
// even alone, or options are out of range.
GenerateReport generate(runner::ModelRunner& runner, std::span<const std::vector<TokenId>> prompts,
                        spec::Drafter* drafter, const GenerateOptions& options);

}  // namespace mixkv::engine
