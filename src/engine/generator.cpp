#include "mixkv/engine/generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

OracleDrafter::OracleDrafter(std::vector<std::vector<TokenId>> references)
    : references_(std::move(references)) {}

std::vector<TokenId> OracleDrafter::propose(const DraftContext& ctx, int k) {
  const std::size_t request = ctx.request;
  const std::span<const TokenId> tokens = ctx.tokens;
  if (request >= references_.size()) return {};
  const auto& ref = references_[request];
  // Only a request still on its reference path has a known continuation.
  if (tokens.size() > ref.size() || !std::equal(tokens.begin(), tokens.end(), ref.begin())) {
    return {};
  }
  const std::size_t n = std::min(ref.size() - tokens.size(), static_cast<std::size_t>(k));
  return {ref.begin() + static_cast<std::ptrdiff_t>(tokens.size()),
          ref.begin() + static_cast<std::ptrdiff_t>(tokens.size() + n)};
}

RandomDrafter::RandomDrafter(std::int64_t vocab_size, std::uint64_t seed)
    : vocab_size_(vocab_size), rng_(seed) {}

std::vector<TokenId> RandomDrafter::propose(const DraftContext&, int k) {
  std::uniform_int_distribution<TokenId> dist(0, static_cast<TokenId>(vocab_size_ - 1));
  std::vector<TokenId> out(static_cast<std::size_t>(std::max(k, 0)));
  for (TokenId& t : out) t = dist(rng_);
  return out;
}

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  if (min_n < 1 || max_n < min_n) {
    throw_invalid(fmt::format("ngram drafter: n from {} to {} is not a range of positive lengths",
                              min_n, max_n));
  }
}

std::vector<TokenId> NgramDrafter::propose(const DraftContext& ctx, int k) {
  const std::span<const TokenId> tokens = ctx.tokens;
  const auto size = static_cast<std::int64_t>(tokens.size());
  for (std::int64_t n = max_n_; n >= min_n_; --n) {
    if (size <= n) continue;
    const auto suffix = tokens.subspan(static_cast<std::size_t>(size - n));
    // The most recent earlier occurrence: start j, ending before the suffix's own start.
    for (std::int64_t j = size - n - 1; j >= 0; --j) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + j)) continue;
      std::vector<TokenId> seq(tokens.begin(), tokens.end());
      std::vector<TokenId> out;
      for (std::int64_t i = 0; i < k; ++i) {
        const TokenId next = seq[static_cast<std::size_t>(j + n + i)];
        out.push_back(next);
        seq.push_back(next);
      }
      return out;
    }
  }
  return {};
}

EagleDrafter::EagleDrafter(ModelRunner& runner)
    : runner_(runner),
      name_(runner.desc().draft_info && runner.desc().draft_info->kind == model::DraftKind::kMtp
                ? "mtp"
                : "eagle") {
  if (!runner.has_drafter() || runner.has_block_drafter()) {
    throw_invalid(
        "the eagle drafter needs a runner built with an EAGLE-style drafter or MTP layers "
        "(RunnerOptions::draft or mtp)");
  }
}

void EagleDrafter::observe(const DraftContext& ctx, std::int64_t first,
                           std::span<const float> hidden) {
  const Observation o{ctx, first, hidden};
  observe_batch(std::span(&o, 1));
}

// Every request's new positions in one drafter forward: each token [next, num_computed] with
// the target hidden state of the position before it.
void EagleDrafter::observe_batch(std::span<const Observation> observations) {
  const std::int64_t h = runner_.config().hidden_size;
  std::vector<SequenceInput> batch;
  std::vector<float> features;
  std::vector<std::size_t> requests;  // per batch entry
  for (const Observation& o : observations) {
    const DraftContext& ctx = o.ctx;
    State& st = states_[ctx.request];
    if (st.hidden_base + static_cast<std::int64_t>(st.hidden.size()) / h != o.first) {
      // A gap: the prefix before `first` came from the cache (its drafter KV too). Start there;
      // the state before it is unknown, so the first position is fed zeros.
      st.hidden.clear();
      st.hidden_base = o.first;
      st.next = std::max(st.next, o.first);
    }
    st.hidden.insert(st.hidden.end(), o.features.begin(), o.features.end());
    const std::int64_t from = st.next;
    const std::int64_t to = ctx.num_computed;
    if (to < from || to >= static_cast<std::int64_t>(ctx.tokens.size())) continue;
    const auto at = features.size();
    features.resize(at + static_cast<std::size_t>((to - from + 1) * h), 0.0f);
    for (std::int64_t q = from; q <= to; ++q) {
      const std::int64_t row = q - 1 - st.hidden_base;
      if (row < 0 || row >= static_cast<std::int64_t>(st.hidden.size()) / h) continue;
      std::copy_n(st.hidden.begin() + row * h, h,
                  features.begin() + static_cast<std::ptrdiff_t>(at) + (q - from) * h);
    }
    SequenceInput in;
    in.tokens =
        ctx.tokens.subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(to - from + 1));
    in.start = from;
    in.block_tables.assign(ctx.block_tables.begin(), ctx.block_tables.end());
    batch.push_back(std::move(in));
    requests.push_back(ctx.request);
  }
  if (batch.empty()) return;
  const ForwardOutput out = runner_.draft_forward(batch, features);
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  std::size_t row = 0;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    State& st = states_[requests[b]];
    row += batch[b].tokens.size();
    const std::size_t last = row - 1;
    const std::int64_t to = batch[b].start + static_cast<std::int64_t>(batch[b].tokens.size()) - 1;
    st.pending_at = to;
    st.pending = argmax(std::span<const float>(out.logits).subspan(last * vocab, vocab));
    st.pending_hidden.assign(out.hidden.begin() + static_cast<std::ptrdiff_t>(last) * h,
                             out.hidden.begin() + static_cast<std::ptrdiff_t>(last + 1) * h);
    st.next = to + 1;
    // The observed rows end at position to - 1: all consumed. h_to comes with the next call.
    st.hidden.clear();
    st.hidden_base = to;
  }
}

std::vector<TokenId> EagleDrafter::propose(const DraftContext& ctx, int k) {
  return propose_batch(std::span(&ctx, 1), k).front();
}

// The first draft came with observe(); later drafts stand on the drafter's own output in place
// of the target's hidden state, one position of every request per forward. Their slots are
// look-ahead and are rewritten by the next observe().
std::vector<std::vector<TokenId>> EagleDrafter::propose_batch(std::span<const DraftContext> ctxs,
                                                              int k) {
  std::vector<std::vector<TokenId>> drafts(ctxs.size());
  std::vector<std::size_t> active;  // requests with a first draft
  std::vector<float> features;
  for (std::size_t r = 0; r < ctxs.size(); ++r) {
    const auto it = states_.find(ctxs[r].request);
    if (it == states_.end() || k < 1 || it->second.pending_at != ctxs[r].num_computed) continue;
    drafts[r].push_back(it->second.pending);
    features.insert(features.end(), it->second.pending_hidden.begin(),
                    it->second.pending_hidden.end());
    active.push_back(r);
  }
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  for (int i = 1; i < k && !active.empty(); ++i) {
    std::vector<SequenceInput> batch(active.size());
    for (std::size_t b = 0; b < active.size(); ++b) {
      const DraftContext& ctx = ctxs[active[b]];
      batch[b].tokens = std::span<const TokenId>(&drafts[active[b]].back(), 1);
      batch[b].start = ctx.num_computed + i;
      batch[b].block_tables.assign(ctx.block_tables.begin(), ctx.block_tables.end());
    }
    const ForwardOutput out = runner_.draft_forward(batch, features);
    for (std::size_t b = 0; b < active.size(); ++b) {
      drafts[active[b]].push_back(
          argmax(std::span<const float>(out.logits).subspan(b * vocab, vocab)));
    }
    features.assign(out.hidden.begin(), out.hidden.end());
  }
  return drafts;
}

void EagleDrafter::forget(std::size_t request) { states_.erase(request); }

std::vector<std::vector<TokenId>> Drafter::propose_batch(std::span<const DraftContext> ctxs,
                                                         int k) {
  std::vector<std::vector<TokenId>> out;
  for (const DraftContext& ctx : ctxs) out.push_back(propose(ctx, k));
  return out;
}

void Drafter::observe_batch(std::span<const Observation> observations) {
  for (const Observation& o : observations) observe(o.ctx, o.first, o.features);
}

DflashDrafter::DflashDrafter(ModelRunner& runner) : runner_(runner) {
  if (!runner.has_block_drafter()) {
    throw_invalid(
        "the dflash drafter needs a runner built with a DFlash drafter (RunnerOptions::draft)");
  }
}

std::vector<TokenId> DflashDrafter::propose(const DraftContext& ctx, int k) {
  return propose_batch(std::span(&ctx, 1), k).front();
}

std::vector<std::vector<TokenId>> DflashDrafter::propose_batch(std::span<const DraftContext> ctxs,
                                                               int k) {
  const int drafts = std::min(k, runner_.block_size() - 1);
  std::vector<std::vector<TokenId>> out(ctxs.size());
  if (drafts < 1 || ctxs.empty()) return out;
  // Each block: the anchor (the last verified token, at num_computed), then the mask tokens.
  std::vector<TokenId> block(static_cast<std::size_t>(drafts) + 1, runner_.mask_token());
  std::vector<std::vector<TokenId>> blocks(ctxs.size(), block);
  std::vector<SequenceInput> batch(ctxs.size());
  for (std::size_t r = 0; r < ctxs.size(); ++r) {
    blocks[r][0] = ctxs[r].tokens.back();
    batch[r].tokens = blocks[r];
    batch[r].start = ctxs[r].num_computed;
    batch[r].block_tables.assign(ctxs[r].block_tables.begin(), ctxs[r].block_tables.end());
  }
  const ForwardOutput fwd = runner_.block_draft(batch);
  // A mask's output is the token at its own position (the block is denoised in place): rows
  // 1..drafts give the drafts for positions start + 1 .. start + drafts; the anchor's is unused.
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  std::size_t row = 0;
  for (std::size_t r = 0; r < ctxs.size(); ++r, row += block.size()) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(drafts); ++i) {
      out[r].push_back(
          argmax(std::span<const float>(fwd.logits).subspan((row + 1 + i) * vocab, vocab)));
    }
  }
  return out;
}

void DflashDrafter::observe(const DraftContext& ctx, std::int64_t first,
                            std::span<const float> features) {
  const Observation o{ctx, first, features};
  observe_batch(std::span(&o, 1));
}

void DflashDrafter::observe_batch(std::span<const Observation> observations) {
  std::vector<SequenceInput> batch;
  std::vector<float> features;
  for (const Observation& o : observations) {
    const std::int64_t n = o.ctx.num_computed - o.first;
    if (n <= 0) continue;
    SequenceInput in;
    in.tokens =
        o.ctx.tokens.subspan(static_cast<std::size_t>(o.first), static_cast<std::size_t>(n));
    in.start = o.first;
    in.block_tables.assign(o.ctx.block_tables.begin(), o.ctx.block_tables.end());
    batch.push_back(std::move(in));
    features.insert(features.end(), o.features.begin(), o.features.end());
  }
  if (!batch.empty()) runner_.draft_context(batch, features);
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

std::int64_t GenerateReport::generated_tokens() const {
  std::int64_t n = 0;
  for (const auto& r : requests) n += r.stats.generated_tokens;
  return n;
}
double GenerateReport::tokens_per_second() const {
  return seconds > 0 ? static_cast<double>(generated_tokens()) / seconds : 0.0;
}

GenerateReport generate(ModelRunner& runner, std::span<const std::vector<TokenId>> prompts,
                        Drafter* drafter, const GenerateOptions& options) {
  if (options.max_tokens < 1) {
    throw_invalid(fmt::format("--max-tokens {} is not positive", options.max_tokens));
  }
  if (options.num_spec_tokens < 0 || options.num_spec_tokens > 32) {
    throw_invalid(
        fmt::format("--num-spec-tokens {} is out of range; use 0 to 32", options.num_spec_tokens));
  }
  if (options.max_batch < 1 || options.prefill_chunk < 1) {
    throw_invalid("generate: max_batch and prefill_chunk must be positive");
  }
  const int k = drafter != nullptr ? options.num_spec_tokens : 0;
  if (k > runner.desc().num_spec_tokens) {
    // The plan sized the look-ahead, the recurrent checkpoints and conv rows for that many.
    throw_invalid(fmt::format(
        "--num-spec-tokens {} exceeds the {} speculative tokens the runner's cache was planned "
        "for; build the runner with RunnerOptions::num_spec_tokens = {}",
        k, runner.desc().num_spec_tokens, k));
  }
  if (k == 0) drafter = nullptr;  // nothing to draft: plain decoding
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

  struct Request {
    std::vector<TokenId> tokens;  // prompt, then verified outputs
    std::size_t prompt_len = 0;
    std::int64_t computed = 0;  // mirrors the manager's num_computed
    bool prefilling = true;     // false once tokens.back() is a sampled, uncomputed token
    bool started = false;
    Clock::time_point admitted_at;
    std::vector<TokenId> step_input;  // decode: last token + drafts
    RequestOutput out;
  };
  std::vector<Request> reqs(prompts.size());
  std::deque<std::size_t> waiting;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].tokens = prompts[i];
    reqs[i].prompt_len = prompts[i].size();
    reqs[i].out.stats.prompt_tokens = static_cast<std::int64_t>(prompts[i].size());
    waiting.push_back(i);
  }

  cache::KvCacheManager manager(plan, k, {options.prefix_caching, 0});
  GenerateReport report;
  std::vector<std::size_t> running;
  std::size_t finished = 0;
  const auto start = Clock::now();
  auto id_of = [](std::size_t i) { return cache::RequestId{static_cast<std::int64_t>(i)}; };
  auto preempt = [&](std::size_t i) {
    if (drafter != nullptr) drafter->forget(i);
    manager.free(id_of(i));
    reqs[i].computed = 0;
    reqs[i].prefilling = true;
    ++reqs[i].out.stats.preemptions;
    ++report.preemptions;
    waiting.push_front(i);
  };

  while (finished < reqs.size()) {
    // Admission, FIFO, all or nothing in every group; the prefix hit skips computed blocks.
    while (!waiting.empty() && static_cast<int>(running.size()) < options.max_batch) {
      const std::size_t i = waiting.front();
      Request& r = reqs[i];
      manager.add_request(id_of(i), r.tokens);
      const auto hit = manager.admit(id_of(i), k);
      if (!hit) {
        manager.free(id_of(i));
        if (running.empty()) {
          throw_invalid(fmt::format(
              "request {}: {} tokens plus {} look-ahead do not fit the KV cache ({} blocks) even "
              "alone; give more cache memory",
              i, r.tokens.size(), k, manager.pool().num_blocks()));
        }
        break;
      }
      waiting.pop_front();
      r.computed = *hit;
      r.out.stats.prefix_hit_tokens = *hit;
      if (!r.started) r.started = true, r.admitted_at = Clock::now();
      running.push_back(i);
    }

    // Room for each decoding request's token plus k look-ahead; preempt the newest on failure.
    // A prefill chunk's blocks came with admit(), but allocate() also picks the step's recurrent
    // snapshot boundary (the manager drops it at every commit), so prefills ask too.
    for (std::size_t j = 0; j < running.size(); ++j) {
      const std::size_t i = running[j];
      const Request& req = reqs[i];
      const std::int64_t num_new =
          req.prefilling
              ? std::min<std::int64_t>(options.prefill_chunk,
                                       static_cast<std::int64_t>(req.tokens.size()) - req.computed)
              : 1;
      if (req.prefilling && manager.snapshot_interval() == 0) continue;
      while (!manager.allocate(id_of(i), num_new, k)) {
        if (running.size() == 1) {
          throw_invalid(
              fmt::format("request {} no longer fits the KV cache alone ({} blocks); "
                          "give more cache memory",
                          i, manager.pool().num_blocks()));
        }
        const std::size_t victim = running.back();
        running.pop_back();
        preempt(victim);
        if (victim == i) break;
      }
    }

    // The step's batch: a prefill chunk or last token + drafts per request.
    std::vector<SequenceInput> batch;
    std::vector<std::size_t> draft_counts;
    batch.reserve(running.size());
    for (const std::size_t i : running) {
      Request& r = reqs[i];
      SequenceInput in;
      in.start = r.computed;
      for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        in.block_tables.push_back(manager.block_table(id_of(i), static_cast<int>(g)));
        // Recurrent groups: the prefix hit's state to restore, the snapshot to keep.
        if (plan.groups[g].behaviour == plan::Behaviour::kRecurrent) {
          in.recurrent.resize(plan.groups.size());
          in.recurrent[g] = manager.recurrent_step(id_of(i), static_cast<int>(g));
        }
      }
      in.checkpoints = !r.prefilling;
      if (r.prefilling) {
        const auto n = std::min<std::int64_t>(
            options.prefill_chunk, static_cast<std::int64_t>(r.tokens.size()) - r.computed);
        in.tokens = std::span<const TokenId>(r.tokens).subspan(static_cast<std::size_t>(r.computed),
                                                               static_cast<std::size_t>(n));
        draft_counts.push_back(0);
      } else {
        r.step_input.assign(1, r.tokens.back());
        draft_counts.push_back(0);
      }
      batch.push_back(std::move(in));
    }
    // Drafts for every decoding request, in one call (a batched drafter runs one forward).
    if (drafter != nullptr) {
      std::vector<DraftContext> ctxs;
      std::vector<std::size_t> rows;
      for (std::size_t j = 0; j < running.size(); ++j) {
        const Request& r = reqs[running[j]];
        if (r.prefilling) continue;
        ctxs.push_back({running[j], r.tokens, r.computed, batch[j].block_tables});
        rows.push_back(j);
      }
      const std::vector<std::vector<TokenId>> proposed =
          ctxs.empty() ? std::vector<std::vector<TokenId>>{} : drafter->propose_batch(ctxs, k);
      if (proposed.size() != ctxs.size()) {
        throw_invalid(fmt::format("drafter {} answered {} of {} requests", drafter->name(),
                                  proposed.size(), ctxs.size()));
      }
      for (std::size_t c = 0; c < ctxs.size(); ++c) {
        Request& r = reqs[ctxs[c].request];
        const auto left =
            options.max_tokens - static_cast<std::int64_t>(r.tokens.size() - r.prompt_len) - 1;
        const std::size_t n =
            std::min<std::size_t>({proposed[c].size(), static_cast<std::size_t>(k),
                                   static_cast<std::size_t>(std::max<std::int64_t>(0, left))});
        for (std::size_t d = 0; d < n; ++d) {
          const TokenId t = proposed[c][d];
          if (t < 0 || t >= runner.vocab_size()) {
            throw_invalid(fmt::format("drafter {} proposed token {} outside the vocabulary of {}",
                                      drafter->name(), t, runner.vocab_size()));
          }
          r.step_input.push_back(t);
        }
        draft_counts[rows[c]] = n;
      }
    }
    for (std::size_t j = 0; j < running.size(); ++j) {
      if (!reqs[running[j]].prefilling) batch[j].tokens = reqs[running[j]].step_input;
    }
    const ForwardOutput fwd = runner.forward(batch);
    ++report.steps;

    // Verify, commit only what the target confirms, retire finished requests.
    const auto vocab = static_cast<std::size_t>(runner.vocab_size());
    auto row = [&](std::size_t r) {
      return std::span<const float>(fwd.logits).subspan(r * vocab, vocab);
    };
    // First every request's verdict, then the drafter sees the verified positions' features
    // (one batched call) before the manager commits them.
    struct Verdict {
      std::int64_t first = 0;        // first position computed this step
      std::int64_t verified = 0;     // positions the step made part of the request
      std::vector<TokenId> sampled;  // new tokens: accepted drafts and the bonus, or the first
      int accepted = 0;
    };
    std::vector<Verdict> verdicts(running.size());
    std::vector<Observation> observations;
    const auto width = static_cast<std::size_t>(runner.draft_feature_width());
    const std::span<const float> features = runner.draft_features(fwd);
    std::size_t at = 0;
    for (std::size_t j = 0; j < running.size(); ++j) {
      const std::size_t i = running[j];
      Request& r = reqs[i];
      const std::size_t n = batch[j].tokens.size();
      Verdict& v = verdicts[j];
      v.first = r.computed;
      if (r.prefilling) {
        v.verified = static_cast<std::int64_t>(n);
        if (r.computed + v.verified == static_cast<std::int64_t>(r.tokens.size())) {
          v.sampled.push_back(argmax(row(at + n - 1)));
          r.prefilling = false;
        }
      } else {
        const std::size_t drafts = draft_counts[j];
        std::size_t accepted = 0;
        TokenId bonus = argmax(row(at));
        while (accepted < drafts && r.step_input[accepted + 1] == bonus) {
          ++accepted;
          bonus = argmax(row(at + accepted));
        }
        v.sampled.assign(r.step_input.begin() + 1,
                         r.step_input.begin() + 1 + static_cast<std::ptrdiff_t>(accepted));
        v.sampled.push_back(bonus);
        v.verified = static_cast<std::int64_t>(accepted + 1);
        v.accepted = static_cast<int>(accepted);
        RequestStats& st = r.out.stats;
        st.drafted_tokens += static_cast<std::int64_t>(drafts);
        st.accepted_tokens += static_cast<std::int64_t>(accepted);
        ++st.decode_steps;
      }
      r.computed += v.verified;
      r.tokens.insert(r.tokens.end(), v.sampled.begin(), v.sampled.end());
      if (drafter != nullptr) {
        observations.push_back(
            {{i, r.tokens, r.computed, batch[j].block_tables},
             v.first,
             features.subspan(at * width, static_cast<std::size_t>(v.verified) * width)});
      }
      at += n;
    }
    if (drafter != nullptr) drafter->observe_batch(observations);

    std::size_t kept = 0;
    for (std::size_t j = 0; j < running.size(); ++j) {
      const std::size_t i = running[j];
      Request& r = reqs[i];
      RequestStats& st = r.out.stats;
      const Verdict& v = verdicts[j];
      manager.commit(id_of(i), v.verified, v.sampled, v.accepted);
      const auto generated = static_cast<std::int64_t>(r.tokens.size() - r.prompt_len);
      if (!r.prefilling && generated >= options.max_tokens) {
        r.out.tokens.assign(
            r.tokens.begin() + static_cast<std::ptrdiff_t>(r.prompt_len),
            r.tokens.begin() + static_cast<std::ptrdiff_t>(r.prompt_len + options.max_tokens));
        st.generated_tokens = options.max_tokens;
        st.seconds = seconds_between(r.admitted_at, Clock::now());
        if (options.before_free) options.before_free(manager, id_of(i), i);
        if (drafter != nullptr) drafter->forget(i);
        manager.free(id_of(i));
        ++finished;
      } else {
        running[kept++] = i;
      }
    }
    running.resize(kept);
  }
  report.seconds = seconds_between(start, Clock::now());
  for (Request& r : reqs) report.requests.push_back(std::move(r.out));
  return report;
}

}  // namespace mixkv::engine
