// The one scheduler: continuous batching over a KvCacheManager with all-or-nothing admission,
// prefix caching, chunked prefill, preemption by recompute, and speculative steps (drafts
// proposed, verified in one model step, the longest matching prefix plus the bonus token
// committed). `generate` (the reference runner), `simulate` (a trace with a stand-in model) and
// the tests all drive it; they differ only in the Model and the Drafter they plug in.
// docs/engine.md, "Scheduler and speculation".
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/plan/plan.hpp"
#include "mixkv/sample/sampler.hpp"
#include "mixkv/sched/draft_policy.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::sched {

using cache::TokenId;

// One request's part of a step, as the model computes it: `tokens` at positions [start, start +
// tokens.size()), with the request's manager block table per KV-cache group.
struct Work {
  std::size_t request = 0;
  std::span<const TokenId> tokens;  // a prefill chunk, or [last verified token, d1..dk]
  std::int64_t start = 0;
  std::vector<std::span<const cache::BlockId>> block_tables;  // per KV-cache group
  // Per KV-cache group, or empty: recurrent groups' restore and snapshot (KvCacheManager::
  // recurrent_step).
  std::vector<cache::RecurrentStep> recurrent;
  bool prefill = true;  // false: a decode or verify step (recurrent checkpoints per token)
  bool sample = false;  // the rows' picks are read: a decode step, or a prompt's last chunk
  // The request samples from the logits (temperature > 0 or penalties): the model must answer
  // ModelOutput::logits. A batch where no work does is served by the picks alone.
  bool reads_logits = false;
};

// The model's answer for a step.
struct ModelOutput {
  // Per token row of the batch (in order): the token the target picks after that row (greedy
  // argmax for the runner). Only rows of works with `sample` are read.
  std::vector<TokenId> picks;
  // vocab_size() values per read row (logit_rows: a sampling prefill chunk's last row, every
  // row of a decode or verify work; batch order): the logits, for requests that sample
  // (temperature > 0 or penalties). A model without logits (the simulator's stand-in) leaves it
  // empty and serves greedy requests only.
  std::vector<float> logits;
  // Per token row, feature_width values: what a drafter observes (may be empty).
  std::vector<float> features;
  std::int64_t feature_width = 0;
};

// The rows of a work whose picks (and logits) the scheduler reads: the last of a prompt's final
// chunk, none of its earlier chunks, every row of a decode or verify work. A model need compute
// its LM head only for them.
std::size_t logit_rows(const Work& w);

// What the scheduler runs each step.
class Model {
 public:
  virtual ~Model() = default;
  virtual ModelOutput forward(std::span<const Work> batch) = 0;
  // Drafted tokens must lie in [0, vocab_size()).
  virtual std::int64_t vocab_size() const = 0;
};

struct Request {
  std::vector<TokenId> prompt;  // not empty
  std::int64_t max_tokens = 1;  // generated tokens after which the request finishes
  std::string label;            // names it in errors: "request 3", "trace.jsonl:7"
  // Generated tokens that end the request (EOS, end-of-turn markers): it stops after the first
  // of them, which is its last output; tokens a speculative step accepted after it are dropped,
  // so a request stops where plain decoding stops.
  std::vector<TokenId> stop_tokens = {};
  // How its tokens are chosen (mixkv/sample): greedy by default, which reads the model's picks
  // and keeps speculative decoding bit-identical to plain; otherwise drawn from the logits, and
  // drafts accepted by speculative sampling (spec::accept_sampled).
  sample::SamplingParams sampling = {};
  // P/D disaggregation, prefill side: once its prompt is computed the request finishes but keeps
  // its blocks (another instance reads them) until free_held() releases them.
  bool hold = false;
  // P/D disaggregation, decode side: at its first admission SchedulerOptions::load_prompt may
  // bring the prompt's KV from outside instead of computing it.
  bool external_prompt = false;
};

struct RequestStats {
  std::int64_t prompt_tokens = 0;
  std::int64_t generated_tokens = 0;   // committed output tokens (may pass max_tokens: below)
  std::int64_t prefix_hit_tokens = 0;  // at the (last) admission
  std::int64_t drafted_tokens = 0;
  std::int64_t accepted_tokens = 0;
  std::int64_t decode_steps = 0;  // model steps that verified (or plainly decoded) a token
  std::int64_t preemptions = 0;
  // Per draft position p (0 .. k-1): verify steps that drafted a token at p, and those in which
  // it was accepted (vLLM's num_accepted_tokens_per_pos).
  std::vector<std::int64_t> drafted_per_position;
  std::vector<std::int64_t> accepted_per_position;
  double seconds = 0;                   // from the first admission to the last token
  double first_token_seconds = 0;       // from the first admission to the first output token
  double acceptance_rate() const;       // accepted / drafted (0 when nothing was drafted)
  double mean_accepted_length() const;  // tokens per decode step, the bonus token included
  double tokens_per_second() const;
  // Output tokens after the first over the time after it: decoding alone, the prompt's prefill
  // left out (0 with fewer than two tokens).
  double decode_tokens_per_second() const;
};

// Whole-run counters.
struct Counters {
  std::int64_t steps = 0;          // model steps
  std::int64_t request_steps = 0;  // works computed: prefill chunks and decode steps
  std::int64_t decode_steps = 0;   // decode works
  std::int64_t decode_tokens = 0;  // tokens committed by decode works (accepted + bonus)
  std::int64_t generated_tokens = 0;
  std::int64_t preemptions = 0;
  std::int64_t peak_running = 0;
  std::int64_t prompt_tokens = 0;    // over every admission, re-admissions after preemption too
  std::int64_t hit_tokens = 0;       // prefix hits over every admission
  std::int64_t drafted_tokens = 0;   // drafts verified
  std::int64_t accepted_tokens = 0;  // of them, accepted
  // Per draft position p (0 .. k-1): verify steps whose draft p was accepted.
  std::vector<std::int64_t> accepted_per_position;
  std::int64_t cancelled = 0;        // requests cancel() ended
  std::int64_t external_tokens = 0;  // prompt tokens load_prompt brought instead of a forward
  double manager_seconds = 0;        // inside KvCacheManager calls only
};

// The most tokens a drafter may propose for one request in one step (`--num-spec-tokens`,
// SchedulerOptions::num_spec_tokens), in every command and the server.
inline constexpr int kMaxDraftTokens = 32;
// Throws InvalidInput naming `--num-spec-tokens` unless 0 <= k <= kMaxDraftTokens (0: plain).
void validate_num_spec_tokens(int k);

struct SchedulerOptions {
  int num_spec_tokens = 0;          // k: drafts per decode step (0 or no drafter: plain)
  std::int64_t max_batch = 16;      // requests running at once
  std::int64_t prefill_chunk = 32;  // prompt tokens one request computes per step; 0: all
  // Drafts stop at a request's max_tokens (generate knows each request's length). The simulator
  // turns it off: a server does not know where a request will stop, so it drafts k every step.
  bool cap_drafts = true;
  // Each request's draft length is chosen every step by choose_draft_lengths (draft_policy.hpp)
  // from its recent acceptance per position and what a step of n rows costs (at most
  // num_spec_tokens), so a request whose drafts keep failing decodes plainly, and under batching
  // the step's drafts shrink to what pays. Off: k every step.
  bool adaptive_draft = true;
  // What a step costs by its rows; null: the scheduler measures its own steps (MeasuredStepCost).
  // Share one across schedulers to keep what was measured; inject a fixed one where results
  // must not depend on timing (tests).
  std::shared_ptr<StepCost> step_cost;
  // At most this many drafts in one step over all requests (0: only the cost decides).
  std::int64_t max_draft_tokens_per_step = 0;
  // Called for each finished request just before its blocks are freed (tests inspect the cache).
  std::function<void(const cache::KvCacheManager&, cache::RequestId, std::size_t request)>
      before_free;
  // Called after every step with the tokens it committed to a request (streaming output).
  std::function<void(std::size_t request, std::span<const TokenId> tokens)> on_tokens;
  // For requests with `external_prompt`, once admitted (blocks allocated for the whole prompt,
  // `hit` tokens served by the prefix cache): fills their blocks from outside and returns how
  // many prompt tokens now hold KV (from `hit` to prompt length - 1: the last prompt token is
  // always computed here, for its logits); `hit` when nothing came (the rest is computed), or
  // nullopt to fail the request (it ends with no output; load_failed() tells).
  std::function<std::optional<std::int64_t>(std::size_t request, const cache::KvCacheManager&,
                                            cache::RequestId id, std::int64_t hit)>
      load_prompt;
  // The asynchronous form of load_prompt (set one of the two): starts filling the blocks and
  // returns true at once; the request then waits admitted (its blocks allocated, counted in
  // max_batch, never preempted) outside the running batch, so the others keep stepping, until
  // Scheduler::complete_load() brings load_prompt's answer. False: nothing comes (computed here).
  std::function<bool(std::size_t request, const cache::KvCacheManager&, cache::RequestId id,
                     std::int64_t hit)>
      start_load;
};

// Drives one KvCacheManager, built from `plan` for num_spec_tokens look-ahead tokens. Requests
// are identified by the index add() returns (their RequestId in the manager).
class Scheduler {
 public:
  Scheduler(cache::KvCacheManager& manager, const plan::CachePlan& plan,
            const SchedulerOptions& options);

  // Queues a request (FIFO behind the others). Throws Error for an empty prompt or max_tokens < 1.
  std::size_t add(Request request);
  // One step: admission, allocation (preempting the newest running request when the pool is
  // dry), drafts, one model forward over every running request, verification and commit, and
  // retirement of finished requests. `drafter` may be null (plain decoding). Throws Error when
  // a request does not fit the cache even alone, or the drafter misbehaves.
  void step(Model& model, spec::Drafter* drafter);
  // Steps until every queued request has finished.
  void run(Model& model, spec::Drafter* drafter);
  // Ends request `i` between steps, waiting or running: its blocks go back to the pool now (its
  // verified blocks stay in the prefix cache) and `drafter` (may be null) forgets it. A server
  // calls it when a client disconnects or a stop condition matched. No-op once finished. A
  // request whose start_load is in flight ends at its complete_load() (its blocks are written).
  void cancel(std::size_t i, spec::Drafter* drafter);
  // Drops the prompt and outputs of a finished request, so a long-running server holds only a
  // small record per past request. Throws Error for a request that has not finished.
  void release(std::size_t i);
  // Frees the blocks of a finished request that was added with `hold`. No-op for others.
  void free_held(std::size_t i);
  std::size_t num_held() const { return held_; }
  // What the draft policy reads (the injected or the measured cost).
  const StepCost& step_cost() const { return *cost_; }
  // load_prompt failed the request.
  bool load_failed(std::size_t i) const { return reqs_.at(i).load_failed; }
  // Ends start_load's load of request i with load_prompt's answer (between steps). A request
  // cancelled while it loaded is retired now, its blocks no longer written.
  void complete_load(std::size_t i, std::optional<std::int64_t> loaded);
  bool loading(std::size_t i) const { return reqs_.at(i).loading; }
  std::size_t num_loading() const { return loading_; }

  bool idle() const { return running_.empty() && waiting_.empty() && loading_ == 0; }
  std::size_t num_requests() const { return reqs_.size(); }
  std::size_t num_running() const { return running_.size(); }
  std::size_t num_waiting() const { return waiting_.size(); }
  std::size_t num_finished() const { return finished_; }
  // Prompt and committed outputs of request `i` (finished or not).
  std::span<const TokenId> tokens(std::size_t i) const { return reqs_.at(i).tokens; }
  std::span<const TokenId> outputs(std::size_t i) const;
  const RequestStats& stats(std::size_t i) const { return reqs_.at(i).stats; }
  bool finished(std::size_t i) const { return reqs_.at(i).finished; }
  const Counters& counters() const { return counters_; }
  const cache::KvCacheManager& manager() const { return manager_; }

 private:
  void admit();
  void allocate(spec::Drafter* drafter);
  void preempt(std::size_t i, spec::Drafter* drafter);
  void retire(std::size_t i, spec::Drafter* drafter);
  // load_prompt's answer for request i, admitted with `hit` tokens: false when it failed it.
  bool apply_load(std::size_t i, std::int64_t hit, std::optional<std::int64_t> loaded);
  void start_running(std::size_t i, std::int64_t hit);

  struct Req {
    std::vector<TokenId> tokens;  // prompt, then verified outputs
    std::size_t prompt_len = 0;
    std::int64_t max_tokens = 1;
    std::vector<TokenId> stop_tokens;
    sample::Sampler sampler;    // counts the committed outputs for its penalties
    bool reads_logits = false;  // sampling or penalties: picks alone do not decide
    bool stopped = false;       // a stop token was generated
    std::string label;
    std::int64_t computed = 0;  // mirrors the manager's num_computed
    bool prefilling = true;     // false once tokens.back() is a sampled, uncomputed token
    bool started = false;
    bool finished = false;
    bool hold = false;      // keeps its blocks once finished, until free_held()
    bool held = false;      // finished and still holding them
    bool external = false;  // load_prompt is asked at its next admission
    bool load_failed = false;
    bool loading = false;         // start_load's load in flight: its blocks are being written
    bool cancel_on_load = false;  // cancel() came while it loaded
    std::int64_t admitted_at_ns = 0;
    std::vector<TokenId> step_input;  // decode: last token + drafts
    AcceptanceEstimate acceptance;    // per draft position, from its verify steps
    int plain_steps = 0;              // steps the policy gave no draft though it could draft
    RequestStats stats;
  };
  int draft_limit(const Req& r) const;
  // The policy's draft lengths for the step's decoding requests (ctxs), each at most
  // available[c]; a request refused drafts for kPlainStepsBeforeProbe steps gets one (a probe:
  // its text may have changed). With `drafter` (its drafts made), a request the drafter gives
  // its own confidence for is judged by that, and needs no probe (the drafter learns from the
  // tokens that follow, verified or not).
  std::vector<int> draft_lengths(std::span<const spec::DraftContext> ctxs,
                                 std::span<const int> available, std::int64_t fixed_rows,
                                 bool charge_drafter, const spec::Drafter* drafter = nullptr);

  cache::KvCacheManager& manager_;
  std::vector<bool> recurrent_;  // per KV-cache group
  SchedulerOptions options_;
  int k_ = 0;
  std::shared_ptr<StepCost> cost_;
  AcceptanceEstimate acceptance_;  // over every request's verify steps: a new request's prior
  std::vector<Req> reqs_;
  std::deque<std::size_t> waiting_;
  std::vector<std::size_t> running_;  // in admission order: the back is the newest
  std::size_t finished_ = 0;
  std::size_t held_ = 0;
  std::size_t loading_ = 0;
  Counters counters_;
};

}  // namespace mixkv::sched
