#include "mixkv/sched/scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "mixkv/core/error.hpp"
#include "mixkv/spec/acceptance.hpp"

namespace mixkv::sched {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

cache::RequestId id_of(std::size_t i) { return cache::RequestId{static_cast<std::int64_t>(i)}; }

// Adds the time since `t0` to `total`, in seconds.
void charge(double& total, Clock::time_point t0) {
  total += std::chrono::duration<double>(Clock::now() - t0).count();
}

// Steps a request is refused drafts (while it could draft) before it gets one to try: its text
// may have turned into something its drafter predicts.
constexpr int kPlainStepsBeforeProbe = 8;
// Weight of a verify step in the scheduler-wide estimate that new requests start from.
constexpr double kSchedulerAcceptanceWeight = 0.1;

}  // namespace

std::size_t logit_rows(const Work& w) {
  if (!w.prefill) return w.tokens.size();
  return w.sample && !w.tokens.empty() ? 1 : 0;
}

double RequestStats::acceptance_rate() const {
  return drafted_tokens > 0
             ? static_cast<double>(accepted_tokens) / static_cast<double>(drafted_tokens)
             : 0.0;
}
double RequestStats::mean_accepted_length() const {
  return decode_steps > 0 ? static_cast<double>(accepted_tokens + decode_steps) /
                                static_cast<double>(decode_steps)
                          : 0.0;
}
double RequestStats::tokens_per_second() const {
  return seconds > 0 ? static_cast<double>(generated_tokens) / seconds : 0.0;
}
double RequestStats::decode_tokens_per_second() const {
  const double after = seconds - first_token_seconds;
  return generated_tokens > 1 && after > 0 ? static_cast<double>(generated_tokens - 1) / after
                                           : 0.0;
}

void validate_num_spec_tokens(int k) {
  if (k < 0 || k > kMaxDraftTokens) {
    throw_invalid(
        fmt::format("--num-spec-tokens {} is out of range; use 0 to {}", k, kMaxDraftTokens));
  }
}

Scheduler::Scheduler(cache::KvCacheManager& manager, const plan::CachePlan& plan,
                     const SchedulerOptions& options)
    : manager_(manager),
      options_(options),
      k_(options.num_spec_tokens),
      cost_(options.step_cost ? options.step_cost : std::make_shared<MeasuredStepCost>()),
      acceptance_(options.num_spec_tokens) {
  for (const plan::KvCacheGroup& g : plan.groups) {
    recurrent_.push_back(g.behaviour == plan::Behaviour::kRecurrent);
  }
  validate_num_spec_tokens(options.num_spec_tokens);
  if (options.max_batch < 1 || options.prefill_chunk < 0) {
    throw_invalid(fmt::format(
        "scheduler: max_batch ({}) must be positive and prefill_chunk ({}) not negative",
        options.max_batch, options.prefill_chunk));
  }
}

std::size_t Scheduler::add(Request request) {
  if (request.prompt.empty()) throw_invalid(fmt::format("{}: the prompt is empty", request.label));
  if (request.max_tokens < 1) {
    throw_invalid(fmt::format("{}: {} tokens to generate is not positive", request.label,
                              request.max_tokens));
  }
  Req r;
  r.prompt_len = request.prompt.size();
  r.stats.prompt_tokens = static_cast<std::int64_t>(request.prompt.size());
  r.tokens = std::move(request.prompt);
  r.max_tokens = request.max_tokens;
  r.stop_tokens = std::move(request.stop_tokens);
  try {
    r.sampler = sample::Sampler(request.sampling, r.tokens);
  } catch (const Error& e) {
    throw_invalid(fmt::format("{}: {}", request.label, e.what()));
  }
  r.reads_logits = !r.sampler.greedy() || sample::has_penalties(request.sampling);
  r.label = std::move(request.label);
  r.hold = request.hold;
  r.external = request.external_prompt;
  r.acceptance = acceptance_;
  r.stats.drafted_per_position.assign(static_cast<std::size_t>(k_), 0);
  r.stats.accepted_per_position.assign(static_cast<std::size_t>(k_), 0);
  reqs_.push_back(std::move(r));
  waiting_.push_back(reqs_.size() - 1);
  return reqs_.size() - 1;
}

std::span<const TokenId> Scheduler::outputs(std::size_t i) const {
  const Req& r = reqs_.at(i);
  return std::span<const TokenId>(r.tokens).subspan(r.prompt_len);
}

// FIFO, all or nothing in every group; the prefix hit skips computed blocks.
void Scheduler::admit() {
  while (!waiting_.empty() &&
         static_cast<std::int64_t>(running_.size() + loading_) < options_.max_batch) {
    const std::size_t i = waiting_.front();
    Req& r = reqs_[i];
    const auto t0 = Clock::now();
    manager_.add_request(id_of(i), r.tokens);
    const auto hit = manager_.admit(id_of(i), k_);
    if (!hit) manager_.free(id_of(i));
    charge(counters_.manager_seconds, t0);
    if (!hit) {
      if (running_.empty() && held_ == 0 && loading_ == 0) {
        throw_invalid(fmt::format(
            "{}: {} tokens plus {} look-ahead do not fit the KV cache ({} blocks) even alone; "
            "give more cache memory",
            r.label, r.tokens.size(), k_, manager_.pool().num_blocks()));
      }
      break;
    }
    waiting_.pop_front();
    r.computed = *hit;
    r.stats.prefix_hit_tokens = *hit;
    if (r.external) {
      // Once only: after a preemption the request recomputes what it lost.
      r.external = false;
      if (options_.start_load && options_.start_load(i, manager_, id_of(i), *hit)) {
        r.loading = true;
        ++loading_;
        if (!r.started) r.started = true, r.admitted_at_ns = now_ns();
        continue;
      }
      if (options_.load_prompt &&
          !apply_load(i, *hit, options_.load_prompt(i, manager_, id_of(i), *hit)))
        continue;
    }
    start_running(i, *hit);
  }
  counters_.peak_running =
      std::max(counters_.peak_running, static_cast<std::int64_t>(running_.size()));
}

void Scheduler::start_running(std::size_t i, std::int64_t hit) {
  Req& r = reqs_[i];
  counters_.prompt_tokens += static_cast<std::int64_t>(r.tokens.size());
  counters_.hit_tokens += hit;
  if (!r.started) r.started = true, r.admitted_at_ns = now_ns();
  running_.push_back(i);
}

bool Scheduler::apply_load(std::size_t i, std::int64_t hit, std::optional<std::int64_t> loaded) {
  Req& r = reqs_[i];
  const auto last = static_cast<std::int64_t>(r.tokens.size()) - 1;
  if (!loaded) {
    r.load_failed = true;
    if (!r.started) r.started = true, r.admitted_at_ns = now_ns();
    retire(i, nullptr);
    return false;
  }
  if (*loaded < hit || *loaded > last) {
    throw_internal(fmt::format("{}: load_prompt answered {} tokens, outside [{}, {}]", r.label,
                               *loaded, hit, last));
  }
  if (*loaded > hit) {
    // The loaded tokens are verified KV like computed ones (their full blocks join the
    // prefix cache); the commit also ends a prefix hit's recurrent restore, so the next
    // step reads the loaded state.
    const auto t1 = Clock::now();
    manager_.commit(id_of(i), *loaded - hit, {}, 0);
    charge(counters_.manager_seconds, t1);
    counters_.external_tokens += *loaded - hit;
    r.computed = *loaded;
  }
  return true;
}

void Scheduler::complete_load(std::size_t i, std::optional<std::int64_t> loaded) {
  Req& r = reqs_.at(i);
  if (!r.loading) throw_internal(fmt::format("{}: complete_load without a load", r.label));
  r.loading = false;
  --loading_;
  const std::int64_t hit = r.stats.prefix_hit_tokens;
  if (r.cancel_on_load) {
    r.hold = false;
    retire(i, nullptr);
    ++counters_.cancelled;
    return;
  }
  if (apply_load(i, hit, loaded)) start_running(i, hit);
  counters_.peak_running =
      std::max(counters_.peak_running, static_cast<std::int64_t>(running_.size()));
}

void Scheduler::preempt(std::size_t i, spec::Drafter* drafter) {
  if (drafter != nullptr) drafter->forget(i);
  const auto t0 = Clock::now();
  manager_.free(id_of(i));
  charge(counters_.manager_seconds, t0);
  Req& r = reqs_[i];
  r.computed = 0;
  r.prefilling = true;
  ++r.stats.preemptions;
  ++counters_.preemptions;
  waiting_.push_front(i);
}

// Room for each decoding request's token plus k look-ahead; preempt the newest on failure, by
// recompute (its verified tokens become its prompt; its cached blocks stay in the prefix map). A
// prefill chunk's blocks came with admit(), but allocate() also picks the step's recurrent
// snapshot boundary (the manager drops it at every commit), so prefills ask too.
void Scheduler::allocate(spec::Drafter* drafter) {
  const auto t0 = Clock::now();
  for (std::size_t j = 0; j < running_.size(); ++j) {
    const std::size_t i = running_[j];
    const Req& req = reqs_[i];
    const auto left = static_cast<std::int64_t>(req.tokens.size()) - req.computed;
    const std::int64_t num_new =
        req.prefilling
            ? (options_.prefill_chunk > 0 ? std::min(options_.prefill_chunk, left) : left)
            : 1;
    if (req.prefilling && manager_.snapshot_interval() == 0) continue;
    while (!manager_.allocate(id_of(i), num_new, k_)) {
      if (running_.size() == 1) {
        throw_invalid(
            fmt::format("{} no longer fits the KV cache alone ({} blocks); give more cache memory",
                        req.label, manager_.pool().num_blocks()));
      }
      const std::size_t victim = running_.back();
      running_.pop_back();
      charge(counters_.manager_seconds, t0);
      preempt(victim, drafter);
      if (victim == i) break;
    }
  }
  charge(counters_.manager_seconds, t0);
}

void Scheduler::retire(std::size_t i, spec::Drafter* drafter) {
  Req& r = reqs_[i];
  r.finished = true;
  r.stats.seconds = static_cast<double>(now_ns() - r.admitted_at_ns) * 1e-9;
  if (options_.before_free) options_.before_free(manager_, id_of(i), i);
  if (drafter != nullptr) drafter->forget(i);
  ++finished_;
  if (r.hold) {
    r.held = true;
    ++held_;
    return;
  }
  const auto t0 = Clock::now();
  manager_.free(id_of(i));
  charge(counters_.manager_seconds, t0);
}

void Scheduler::free_held(std::size_t i) {
  Req& r = reqs_.at(i);
  if (!r.held) return;
  r.held = false;
  --held_;
  const auto t0 = Clock::now();
  manager_.free(id_of(i));
  charge(counters_.manager_seconds, t0);
}

void Scheduler::cancel(std::size_t i, spec::Drafter* drafter) {
  Req& r = reqs_.at(i);
  if (r.finished) return;
  if (r.loading) {
    // Its blocks are being written: freed once complete_load() says the writes are over.
    r.cancel_on_load = true;
    return;
  }
  if (const auto w = std::find(waiting_.begin(), waiting_.end(), i); w != waiting_.end()) {
    // Never admitted, or preempted: the manager holds nothing for it.
    waiting_.erase(w);
    r.finished = true;
    if (r.started) r.stats.seconds = static_cast<double>(now_ns() - r.admitted_at_ns) * 1e-9;
    ++finished_;
  } else {
    running_.erase(std::find(running_.begin(), running_.end(), i));
    r.hold = false;  // a cancelled request's blocks are read by nobody
    retire(i, drafter);
  }
  ++counters_.cancelled;
}

void Scheduler::release(std::size_t i) {
  Req& r = reqs_.at(i);
  if (!r.finished) throw_invalid(fmt::format("{} is still running; cancel it first", r.label));
  r.tokens = {};
  r.step_input = {};
  r.prompt_len = 0;
}

// The most drafts a request's verify may take this step: k, and with cap_drafts no more than the
// tokens it has left to generate after the bonus one.
int Scheduler::draft_limit(const Req& r) const {
  std::int64_t n = k_;
  if (options_.cap_drafts) {
    const auto left = r.max_tokens - static_cast<std::int64_t>(r.tokens.size() - r.prompt_len) - 1;
    n = std::min(n, std::max<std::int64_t>(0, left));
  }
  return static_cast<int>(n);
}

std::vector<int> Scheduler::draft_lengths(std::span<const spec::DraftContext> ctxs,
                                          std::span<const int> available, std::int64_t fixed_rows,
                                          bool charge_drafter, const spec::Drafter* drafter) {
  std::vector<DraftCandidate> candidates;
  candidates.reserve(ctxs.size());
  for (std::size_t c = 0; c < ctxs.size(); ++c) {
    const Req& r = reqs_[ctxs[c].request];
    const std::span<const double> own =
        drafter != nullptr ? drafter->confidence(ctxs[c].request) : std::span<const double>{};
    if (!own.empty()) {
      candidates.push_back({std::min(available[c], static_cast<int>(std::ssize(own))), own, 0});
      continue;
    }
    const int probe = r.plain_steps >= kPlainStepsBeforeProbe ? 1 : 0;
    candidates.push_back({available[c], r.acceptance.conditional(), probe});
  }
  std::vector<int> lengths = choose_draft_lengths(*cost_, fixed_rows, candidates, charge_drafter,
                                                  options_.max_draft_tokens_per_step);
  for (std::size_t c = 0; c < ctxs.size(); ++c) {
    Req& r = reqs_[ctxs[c].request];
    if (lengths[c] > 0) {
      r.plain_steps = 0;
    } else if (available[c] > 0) {
      ++r.plain_steps;
    }
  }
  return lengths;
}

void Scheduler::run(Model& model, spec::Drafter* drafter) {
  while (!idle()) step(model, drafter);
}

void Scheduler::step(Model& model, spec::Drafter* drafter) {
  if (k_ == 0) drafter = nullptr;  // nothing to draft: plain decoding
  admit();
  allocate(drafter);
  if (running_.empty()) return;

  // The step's works: a prefill chunk, or the last token and the drafts, per running request.
  std::vector<Work> batch;
  batch.reserve(running_.size());
  for (const std::size_t i : running_) {
    Req& r = reqs_[i];
    Work w;
    w.request = i;
    w.start = r.computed;
    w.prefill = r.prefilling;
    w.reads_logits = r.reads_logits;
    for (std::size_t g = 0; g < recurrent_.size(); ++g) {
      w.block_tables.push_back(manager_.block_table(id_of(i), static_cast<int>(g)));
      // Recurrent groups: the prefix hit's state to restore, the snapshot to keep.
      if (recurrent_[g]) {
        w.recurrent.resize(recurrent_.size());
        w.recurrent[g] = manager_.recurrent_step(id_of(i), static_cast<int>(g));
      }
    }
    if (r.prefilling) {
      const auto left = static_cast<std::int64_t>(r.tokens.size()) - r.computed;
      const std::int64_t n =
          options_.prefill_chunk > 0 ? std::min(options_.prefill_chunk, left) : left;
      w.tokens = std::span<const TokenId>(r.tokens).subspan(static_cast<std::size_t>(r.computed),
                                                            static_cast<std::size_t>(n));
      w.sample = n == left;
    } else {
      r.step_input.assign(1, r.tokens.back());
      w.sample = true;
    }
    batch.push_back(std::move(w));
  }
  // Drafts for every decoding request, in one call (a batched drafter runs one forward). A
  // drafter that drafts for free (no forward) proposes every draft the verify could take and
  // the policy keeps what pays; one that pays per draft is told the policy's lengths first.
  if (drafter != nullptr) {
    std::vector<spec::DraftContext> ctxs;
    std::vector<int> limits;
    std::int64_t fixed_rows = 0;  // the step's rows without drafts
    for (std::size_t j = 0; j < batch.size(); ++j) {
      const Req& r = reqs_[batch[j].request];
      fixed_rows += r.prefilling ? std::ssize(batch[j].tokens) : 1;
      if (r.prefilling) continue;
      limits.push_back(draft_limit(r));
      ctxs.push_back({batch[j].request, r.tokens, r.computed, batch[j].block_tables, limits.back(),
                      r.stop_tokens});
    }
    const bool adaptive = options_.adaptive_draft && !ctxs.empty();
    const bool free = drafter->drafts_for_free();
    if (adaptive && !free) {
      const std::vector<int> lengths = draft_lengths(ctxs, limits, fixed_rows, true);
      for (std::size_t c = 0; c < ctxs.size(); ++c) ctxs[c].max_drafts = lengths[c];
    }
    const auto t0 = Clock::now();
    std::vector<std::vector<TokenId>> proposed =
        ctxs.empty() ? std::vector<std::vector<TokenId>>{} : drafter->propose_batch(ctxs, k_);
    if (proposed.size() != ctxs.size()) {
      throw_invalid(fmt::format("drafter {} answered {} of {} requests", drafter->name(),
                                proposed.size(), ctxs.size()));
    }
    std::vector<int> available(ctxs.size());
    int longest = 0;
    for (std::size_t c = 0; c < ctxs.size(); ++c) {
      available[c] = static_cast<int>(
          std::min(proposed[c].size(), static_cast<std::size_t>(std::max(0, ctxs[c].max_drafts))));
      longest = std::max(longest, available[c]);
    }
    if (!free && longest > 0) {
      cost_->observe_draft(longest, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (adaptive && free) {
      const std::vector<int> lengths = draft_lengths(ctxs, available, fixed_rows, false, drafter);
      for (std::size_t c = 0; c < ctxs.size(); ++c) available[c] = lengths[c];
    }
    const std::int64_t vocab = model.vocab_size();
    for (std::size_t c = 0; c < ctxs.size(); ++c) {
      Req& r = reqs_[ctxs[c].request];
      for (std::size_t d = 0; d < static_cast<std::size_t>(available[c]); ++d) {
        const TokenId t = proposed[c][d];
        if (t < 0 || t >= vocab) {
          throw_invalid(fmt::format("drafter {} proposed token {} outside the vocabulary of {}",
                                    drafter->name(), t, vocab));
        }
        r.step_input.push_back(t);
      }
    }
  }
  for (Work& w : batch) {
    if (!w.prefill) w.tokens = reqs_[w.request].step_input;
  }
  const auto forward_start = Clock::now();
  const ModelOutput out = model.forward(batch);
  const double forward_seconds =
      std::chrono::duration<double>(Clock::now() - forward_start).count();
  ++counters_.steps;
  std::size_t rows = 0;
  bool any_prefill = false;
  for (const Work& w : batch) rows += w.tokens.size(), any_prefill = any_prefill || w.prefill;
  // Decode and verify steps teach the cost model (a prefill row costs another amount).
  if (!any_prefill) cost_->observe_step(static_cast<std::int64_t>(rows), forward_seconds);
  if (out.picks.size() != rows) {
    throw_internal(
        fmt::format("model answered {} picks for {} token rows", out.picks.size(), rows));
  }
  const auto vocab_rows = static_cast<std::size_t>(model.vocab_size());
  std::size_t read_rows = 0;
  for (const Work& w : batch) read_rows += logit_rows(w);
  const bool has_logits = out.logits.size() == read_rows * vocab_rows;
  if (!has_logits && !out.logits.empty()) {
    throw_internal(fmt::format("model answered {} logits for {} read rows of {}", out.logits.size(),
                               read_rows, vocab_rows));
  }

  // Verify: first every request's verdict; then the drafter sees the verified positions'
  // features (one batched call) before the manager commits them.
  struct Verdict {
    std::int64_t verified = 0;     // positions the step made part of the request
    std::vector<TokenId> sampled;  // new tokens: accepted drafts and the bonus, or the first
    int accepted = 0;
  };
  std::vector<Verdict> verdicts(batch.size());
  std::vector<spec::Observation> observations;
  const auto width = static_cast<std::size_t>(out.feature_width);
  const std::span<const float> features(out.features);
  std::size_t at = 0;        // the work's first token row
  std::size_t logit_at = 0;  // its first read row
  for (std::size_t j = 0; j < batch.size(); ++j) {
    const Work& w = batch[j];
    Req& r = reqs_[w.request];
    const std::size_t n = w.tokens.size();
    Verdict& v = verdicts[j];
    const std::span<const TokenId> picks = std::span(out.picks).subspan(at, n);
    if (r.reads_logits && !has_logits && (w.sample || !w.prefill)) {
      throw_invalid(fmt::format(
          "{}: its sampling parameters need the model's logits, which this model does not give; "
          "use greedy decoding (temperature 0, no penalties)",
          r.label));
    }
    // The step's logits rows of this work, where its sampler reads them.
    const std::size_t read = logit_rows(w);
    const std::span<const float> logits =
        r.reads_logits
            ? std::span<const float>(out.logits).subspan(logit_at * vocab_rows, read * vocab_rows)
            : std::span<const float>{};
    logit_at += read;
    if (w.prefill) {
      v.verified = static_cast<std::int64_t>(n);
      if (w.sample) {
        v.sampled.push_back(r.reads_logits ? r.sampler.next(logits.last(vocab_rows))
                                           : picks.back());
        r.prefilling = false;
        // Decoding starts from what the scheduler has seen of earlier requests' drafts.
        r.acceptance = acceptance_;
        r.plain_steps = 0;
      }
    } else {
      spec::Verdict a =
          r.reads_logits ? spec::accept_sampled(r.sampler, w.tokens.subspan(1), logits, vocab_rows)
                         : spec::accept_greedy(w.tokens.subspan(1), picks);
      v.accepted = a.accepted;
      v.verified = a.accepted + 1;
      v.sampled = std::move(a.tokens);
      r.stats.drafted_tokens += static_cast<std::int64_t>(n - 1);
      r.stats.accepted_tokens += a.accepted;
      counters_.drafted_tokens += static_cast<std::int64_t>(n - 1);
      counters_.accepted_tokens += a.accepted;
      if (counters_.accepted_per_position.size() < n - 1) {
        counters_.accepted_per_position.resize(n - 1, 0);
      }
      for (int p = 0; p < a.accepted; ++p) {
        ++counters_.accepted_per_position[static_cast<std::size_t>(p)];
      }
      if (n > 1) {
        r.acceptance.update(static_cast<int>(n - 1), a.accepted);
        acceptance_.update(static_cast<int>(n - 1), a.accepted, kSchedulerAcceptanceWeight);
      }
      ++r.stats.decode_steps;
      ++counters_.decode_steps;
      counters_.decode_tokens += v.verified;
    }
    // A stop token ends the request: nothing after it is kept (nor counted as accepted).
    const auto stop = std::find_first_of(v.sampled.begin(), v.sampled.end(), r.stop_tokens.begin(),
                                         r.stop_tokens.end());
    if (stop != v.sampled.end()) {
      const auto kept = static_cast<std::int64_t>(stop - v.sampled.begin()) + 1;
      v.sampled.resize(static_cast<std::size_t>(kept));
      if (!w.prefill) {
        r.stats.accepted_tokens -= v.accepted - static_cast<int>(kept - 1);
        counters_.decode_tokens -= v.verified - kept;
        v.accepted = static_cast<int>(kept - 1);
        v.verified = kept;
      }
      r.stopped = true;
    }
    if (!w.prefill) {
      for (std::size_t d = 0; d + 1 < n && d < r.stats.drafted_per_position.size(); ++d) {
        ++r.stats.drafted_per_position[d];
        if (static_cast<int>(d) < v.accepted) ++r.stats.accepted_per_position[d];
      }
    }
    ++counters_.request_steps;
    r.computed += v.verified;
    r.tokens.insert(r.tokens.end(), v.sampled.begin(), v.sampled.end());
    for (TokenId t : v.sampled) r.sampler.commit(t);
    if (options_.on_tokens && !v.sampled.empty()) options_.on_tokens(w.request, v.sampled);
    if (r.stats.generated_tokens == 0 && !v.sampled.empty()) {
      r.stats.first_token_seconds = static_cast<double>(now_ns() - r.admitted_at_ns) * 1e-9;
    }
    r.stats.generated_tokens += static_cast<std::int64_t>(v.sampled.size());
    counters_.generated_tokens += static_cast<std::int64_t>(v.sampled.size());
    if (drafter != nullptr) {
      const std::span<const float> f =
          width == 0 ? std::span<const float>{}
                     : features.subspan(at * width, static_cast<std::size_t>(v.verified) * width);
      observations.push_back({{w.request, r.tokens, r.computed, w.block_tables}, w.start, f});
    }
    at += n;
  }
  if (drafter != nullptr) drafter->observe_batch(observations);

  // Commit only what the target confirmed; retire finished requests.
  const auto t0 = Clock::now();
  for (std::size_t j = 0; j < batch.size(); ++j) {
    const Verdict& v = verdicts[j];
    manager_.commit(id_of(batch[j].request), v.verified, v.sampled, v.accepted);
  }
  charge(counters_.manager_seconds, t0);
  std::size_t kept = 0;
  for (const std::size_t i : running_) {
    const Req& r = reqs_[i];
    if (!r.prefilling &&
        (r.stopped || static_cast<std::int64_t>(r.tokens.size() - r.prompt_len) >= r.max_tokens)) {
      retire(i, drafter);
    } else {
      running_[kept++] = i;
    }
  }
  running_.resize(kept);
}

}  // namespace mixkv::sched
