// The one scheduler on a stand-in model whose "greedy" token is a function of the position: a
// plain run and speculative runs (always right, always wrong, half right) commit the same
// tokens; chunked prefill, admission limits, preemption and prefix hits follow the manager.
#include "mixkv/sched/scheduler.hpp"

#include <gtest/gtest.h>

#include <map>

#include "mixkv/plan/plan.hpp"
#include "test_support.hpp"

namespace mixkv::sched {
namespace {

using mixkv::testing::kMiB;

// The target's pick after position p of request i: a fixed stream, so plain decoding gives
// tokens known in advance.
TokenId truth(std::size_t request, std::int64_t position) {
  return static_cast<TokenId>(1000 + 7 * request + 3 * position % 101);
}

// Picks truth() after every row and records the largest chunk and batch it was given.
class StreamModel final : public Model {
 public:
  ModelOutput forward(std::span<const Work> batch) override {
    ModelOutput out;
    ++steps;
    std::int64_t drafts = 0, rows = 0;
    bool prefill = false;
    for (const Work& w : batch) {
      if (!w.prefill) drafts += std::ssize(w.tokens) - 1;
      rows += std::ssize(w.tokens);
      prefill = prefill || w.prefill;
      for (std::size_t i = 0; i < w.tokens.size(); ++i) {
        out.picks.push_back(truth(w.request, w.start + static_cast<std::int64_t>(i) + 1));
      }
      if (w.prefill) max_chunk = std::max<std::int64_t>(max_chunk, std::ssize(w.tokens));
    }
    max_batch = std::max<std::int64_t>(max_batch, std::ssize(batch));
    max_step_drafts = std::max(max_step_drafts, drafts);
    if (!prefill) max_decode_rows = std::max(max_decode_rows, rows);
    if (!prefill && std::ssize(batch) == 8) max_drafts_of_8 = std::max(max_drafts_of_8, drafts);
    return out;
  }
  std::int64_t vocab_size() const override { return 1 << 20; }
  std::int64_t steps = 0, max_chunk = 0, max_batch = 0, max_step_drafts = 0;
  std::int64_t max_decode_rows = 0;  // over steps without a prefill chunk
  std::int64_t max_drafts_of_8 = 0;  // over steps of 8 decoding requests
};

// Proposes the truth for the first `right` drafts, then wrong tokens; with `odd_wrong`, only
// wrong ones for odd requests. `free`: as prompt lookup (no forward), else as a model drafter
// that is told its draft lengths first (and keeps to them).
class FixedDrafter final : public spec::Drafter {
 public:
  explicit FixedDrafter(int right, bool odd_wrong = false, bool free = false)
      : right_(right), odd_wrong_(odd_wrong), free_(free) {}
  std::string name() const override { return "fixed"; }
  bool drafts_for_free() const override { return free_; }
  std::vector<TokenId> propose(const spec::DraftContext& ctx, int k) override {
    std::vector<TokenId> out;
    const int right = odd_wrong_ && ctx.request % 2 == 1 ? 0 : right_;
    for (int t = 0; t < std::min(k, ctx.max_drafts); ++t) {
      const std::int64_t position = ctx.num_computed + 1 + t;
      out.push_back(t < right ? truth(ctx.request, position) : 7);
    }
    return out;
  }

 private:
  int right_;
  bool odd_wrong_, free_;
};

plan::CachePlan small_plan(std::int64_t memory, int k) {
  model::DescribeOptions d;
  d.num_spec_tokens = k;
  const auto desc = testing::describe_builtin("llama-3.1-8b", std::nullopt, d);
  plan::PlanOptions o;
  o.memory_bytes = memory;
  o.block_size = 16;
  o.max_model_len = 1024;
  o.request_len = 512;
  return plan::make_plan(desc, o);
}

std::vector<Request> requests(int n) {
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    std::vector<TokenId> prompt;
    // Half share a 64-token prefix.
    for (int j = 0; j < 40 + 13 * i; ++j) prompt.push_back(i % 2 == 0 && j < 64 ? j + 1 : 500 + i);
    out.push_back({prompt, 20 + i, "request " + std::to_string(i)});
  }
  return out;
}

struct Outcome {
  std::vector<std::vector<TokenId>> outputs;
  Counters counters;
  std::int64_t max_chunk = 0, max_batch = 0, max_step_drafts = 0, max_decode_rows = 0;
  std::int64_t max_drafts_of_8 = 0;
  std::vector<RequestStats> stats;
};

Outcome run(const plan::CachePlan& plan, int k, spec::Drafter* drafter, SchedulerOptions o = {}) {
  cache::KvCacheManager manager(plan, k);
  o.num_spec_tokens = k;
  // Draft lengths must not depend on this machine's timings: a verify row costs a tenth of a step.
  if (!o.step_cost) o.step_cost = std::make_shared<LinearStepCost>(1.0, 0.1);
  Scheduler s(manager, plan, o);
  const auto reqs = requests(8);
  for (const Request& r : reqs) s.add(r);
  StreamModel model;
  s.run(model, drafter);
  Outcome out;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_TRUE(s.finished(i));
    const auto o2 = s.outputs(i);
    out.outputs.emplace_back(o2.begin(), o2.end());
    out.stats.push_back(s.stats(i));
  }
  out.counters = s.counters();
  out.max_chunk = model.max_chunk;
  out.max_batch = model.max_batch;
  out.max_step_drafts = model.max_step_drafts;
  out.max_decode_rows = model.max_decode_rows;
  out.max_drafts_of_8 = model.max_drafts_of_8;
  EXPECT_EQ(manager.check_invariants(), "");
  EXPECT_EQ(manager.pool().num_used(), 0);
  return out;
}

TEST(Scheduler, PlainDecodingCommitsTheModelsPicksInChunksAndBatches) {
  const auto plan = small_plan(256 * kMiB, 0);
  SchedulerOptions o;
  o.max_batch = 3;
  o.prefill_chunk = 16;
  const Outcome r = run(plan, 0, nullptr, o);
  for (std::size_t i = 0; i < r.outputs.size(); ++i) {
    const auto len = static_cast<std::int64_t>(requests(8)[i].prompt.size());
    ASSERT_EQ(std::ssize(r.outputs[i]), 20 + static_cast<std::int64_t>(i));
    for (std::size_t t = 0; t < r.outputs[i].size(); ++t) {
      EXPECT_EQ(r.outputs[i][t], truth(i, len + static_cast<std::int64_t>(t))) << i << " " << t;
    }
    EXPECT_EQ(r.stats[i].decode_steps, 19 + static_cast<std::int64_t>(i));
  }
  EXPECT_EQ(r.max_chunk, 16);
  EXPECT_EQ(r.max_batch, 3);
  EXPECT_GT(r.counters.hit_tokens, 0);  // the shared 64-token prefix, in 16-token blocks
}

TEST(Scheduler, SpeculationCommitsExactlyThePlainTokens) {
  const auto plan = small_plan(256 * kMiB, 4);
  const Outcome plain = run(plan, 0, nullptr);
  for (int right : {0, 2, 4}) {
    FixedDrafter d(right);
    const Outcome fast = run(plan, 4, &d);
    EXPECT_EQ(fast.outputs, plain.outputs) << right << " right";
    for (const RequestStats& s : fast.stats) {
      EXPECT_GT(s.drafted_tokens, 0);
      // Only the first `right` drafts of a step can be accepted.
      EXPECT_LE(s.accepted_tokens, s.decode_steps * right);
      if (right == 0) {
        EXPECT_EQ(s.accepted_tokens, 0);
      }
    }
    if (right == 4) {
      EXPECT_LT(fast.counters.steps, plain.counters.steps);
    }
  }
}

// The draft policy with a fixed cost (a verify row a quarter of a step): a request whose drafts
// all fail decodes plainly (a probe every few steps), one whose drafts pass keeps drafting, side
// by side in one batch, for a drafter that pays per draft and one that drafts for free; tokens
// stay the plain ones.
TEST(Scheduler, ARequestWhoseDraftsFailFallsBackToPlainDecoding) {
  const auto plan = small_plan(256 * kMiB, 4);
  const Outcome plain = run(plan, 0, nullptr);
  for (const bool free : {false, true}) {
    FixedDrafter d(4, /*odd_wrong=*/true, free);
    SchedulerOptions o;
    o.step_cost = std::make_shared<LinearStepCost>(1.0, 0.25);
    const Outcome got = run(plan, 4, &d, o);
    EXPECT_EQ(got.outputs, plain.outputs);
    for (std::size_t i = 0; i < got.stats.size(); ++i) {
      const RequestStats& s = got.stats[i];
      if (i % 2 == 1) {
        EXPECT_EQ(s.accepted_tokens, 0) << i;
        // A few at first (it starts from the scheduler's estimate, which the good requests
        // raise), then one probe every 8 plain steps; k every step would be 4 per step.
        EXPECT_LE(s.drafted_tokens, 4 + s.decode_steps / 4) << i << " free " << free;
      } else {
        EXPECT_EQ(s.accepted_tokens, s.drafted_tokens) << i << " free " << free;
        EXPECT_GE(s.accepted_tokens, s.decode_steps) << i << " free " << free;  // 2 a step
      }
    }
  }
}

// A drafter that drafts for free and gives its own estimate per draft: the policy reads that,
// not the request's record, and sends no probes. Sure of wrong drafts, they are all verified
// (and fail); doubtful of right ones, none is.
class ConfidentDrafter final : public spec::Drafter {
 public:
  ConfidentDrafter(bool right, double confidence) : right_(right), confidence_(8, confidence) {}
  std::string name() const override { return "confident"; }
  bool drafts_for_free() const override { return true; }
  std::vector<TokenId> propose(const spec::DraftContext& ctx, int k) override {
    std::vector<TokenId> out;
    for (int t = 0; t < std::min(k, ctx.max_drafts); ++t) {
      out.push_back(right_ ? truth(ctx.request, ctx.num_computed + 1 + t) : 7);
    }
    return out;
  }
  std::span<const double> confidence(std::size_t /*request*/) const override { return confidence_; }

 private:
  bool right_;
  std::vector<double> confidence_;
};

TEST(Scheduler, ADrafterThatEstimatesItsDraftsIsJudgedByItsEstimates) {
  const auto plan = small_plan(256 * kMiB, 4);
  const Outcome plain = run(plan, 0, nullptr);
  SchedulerOptions o;
  o.step_cost = std::make_shared<LinearStepCost>(1.0, 0.25);
  ConfidentDrafter doubtful(/*right=*/true, 0.1);
  const Outcome none = run(plan, 4, &doubtful, o);
  EXPECT_EQ(none.outputs, plain.outputs);
  // (A draft at 0.1 pays only beside a prefill chunk, whose rows make one more row cheap.)
  EXPECT_LE(none.counters.drafted_tokens, none.counters.decode_steps / 20);
  ConfidentDrafter sure(/*right=*/false, 0.95);
  const Outcome all = run(plan, 4, &sure, o);
  EXPECT_EQ(all.outputs, plain.outputs);
  EXPECT_EQ(all.counters.accepted_tokens, 0);
  // Well above the probes a request's own record of failures allows (4 + a quarter of a draft a
  // step: ARequestWhoseDraftsFailFallsBackToPlainDecoding).
  for (const RequestStats& s : all.stats) EXPECT_GE(s.drafted_tokens, 2 * s.decode_steps);
}

// A weight pass shared by up to 16 rows, then rows that cost a whole step each: with 8 requests
// decoding, the policy drafts no more than the 8 rows the pass has left, where alone each would
// draft 4; an explicit per-step cap holds too.
TEST(Scheduler, CapsTheDraftsOfAStepUnderBatching) {
  class KneeCost final : public StepCost {
   public:
    double step(std::int64_t rows) const override {
      return 1.0 + 0.05 * static_cast<double>(std::min<std::int64_t>(rows, 16) - 1) +
             static_cast<double>(std::max<std::int64_t>(rows - 16, 0));
    }
    double draft(int) const override { return 0.0; }
  };
  const auto plan = small_plan(256 * kMiB, 4);
  const Outcome plain = run(plan, 0, nullptr);
  FixedDrafter d(4);
  SchedulerOptions o;
  o.step_cost = std::make_shared<KneeCost>();
  o.max_batch = 8;
  o.prefill_chunk = 0;  // every prompt in one step, so the 8 decode together
  const Outcome knee = run(plan, 4, &d, o);
  EXPECT_EQ(knee.outputs, plain.outputs);
  EXPECT_EQ(knee.max_drafts_of_8, 8);   // not 8 x 4
  EXPECT_EQ(knee.max_decode_rows, 16);  // as requests finish, the others take the room
  EXPECT_GT(knee.counters.accepted_tokens, 0);
  o.max_batch = 1;
  const Outcome alone = run(plan, 4, &d, o);
  EXPECT_EQ(alone.outputs, plain.outputs);
  EXPECT_EQ(alone.max_step_drafts, 4);
  o.max_batch = 8;
  o.step_cost = std::make_shared<LinearStepCost>(1.0, 0.01);
  o.max_draft_tokens_per_step = 3;
  const Outcome capped = run(plan, 4, &d, o);
  EXPECT_EQ(capped.outputs, plain.outputs);
  EXPECT_EQ(capped.max_step_drafts, 3);
}

TEST(Scheduler, ATightPoolPreemptsAndStillFinishesWithThePlainTokens) {
  const auto roomy = small_plan(256 * kMiB, 2);
  auto tight = roomy;
  tight.pools[0].num_blocks = 14;  // the largest request alone needs 10 blocks of 16
  const Outcome plain = run(roomy, 0, nullptr);
  FixedDrafter d(1);
  SchedulerOptions o;
  o.max_batch = 8;
  const Outcome squeezed = run(tight, 2, &d, o);
  EXPECT_GT(squeezed.counters.preemptions, 0);
  EXPECT_EQ(squeezed.outputs, plain.outputs);
}

TEST(Scheduler, CancelFreesARunningOrWaitingRequestBetweenSteps) {
  const auto plan = small_plan(256 * kMiB, 2);
  cache::KvCacheManager manager(plan, 2);
  SchedulerOptions o;
  o.num_spec_tokens = 2;
  o.max_batch = 2;
  Scheduler s(manager, plan, o);
  const auto reqs = requests(3);
  for (const Request& r : reqs) s.add(r);
  StreamModel model;
  FixedDrafter d(1);
  s.step(model, &d);
  ASSERT_EQ(s.num_running(), 2u);
  ASSERT_EQ(s.num_waiting(), 1u);
  const std::int32_t used = manager.pool().num_used();
  s.cancel(0, &d);  // running: its blocks go back now
  EXPECT_TRUE(s.finished(0));
  EXPECT_LT(manager.pool().num_used(), used);
  s.cancel(2, &d);  // waiting: nothing held, it just leaves the queue
  EXPECT_EQ(s.num_waiting(), 0u);
  EXPECT_EQ(s.num_running(), 1u);
  EXPECT_EQ(manager.check_invariants(), "");
  s.cancel(0, &d);  // a no-op once finished
  EXPECT_EQ(s.counters().cancelled, 2);
  s.run(model, &d);
  EXPECT_EQ(manager.pool().num_used(), 0);
  // The one left ran to its end with the plain tokens; the others keep what they had.
  const Outcome plain = run(plan, 0, nullptr);
  const auto out1 = s.outputs(1);
  EXPECT_EQ(std::vector<TokenId>(out1.begin(), out1.end()), plain.outputs[1]);
  EXPECT_EQ(s.counters().drafted_tokens, s.stats(0).drafted_tokens + s.stats(1).drafted_tokens);
  std::int64_t per_pos = 0;
  for (const std::int64_t a : s.counters().accepted_per_position) per_pos += a;
  EXPECT_EQ(per_pos, s.counters().accepted_tokens);
  // release() drops a finished request's tokens, and refuses a running one.
  s.release(1);
  EXPECT_TRUE(s.outputs(1).empty());
  s.add(reqs[0]);
  EXPECT_THROW(s.release(3), Error);
}

TEST(Scheduler, RefusesWhatCanNeverRun) {
  const auto plan = small_plan(256 * kMiB, 0);
  cache::KvCacheManager manager(plan, 0);
  Scheduler s(manager, plan, {});
  EXPECT_THROW(s.add({{}, 4, "empty"}), Error);
  EXPECT_THROW(s.add({{1, 2}, 0, "nothing to generate"}), Error);
  auto tiny = plan;
  tiny.pools[0].num_blocks = 3;
  cache::KvCacheManager small(tiny, 0);
  Scheduler t(small, tiny, {});
  t.add({std::vector<TokenId>(200, 5), 4, "big.jsonl:3"});
  StreamModel model;
  testing::expect_error([&] { t.step(model, nullptr); }, ErrorCode::kInvalidInput,
                        {"big.jsonl:3", "do not fit"});
  SchedulerOptions too_many;
  too_many.num_spec_tokens = 33;
  EXPECT_THROW(Scheduler(manager, plan, too_many), Error);
}

}  // namespace
}  // namespace mixkv::sched

namespace mixkv::sched {
namespace {

// Counts the prompt rows the model computed per request.
class RowCounter final : public Model {
 public:
  ModelOutput forward(std::span<const Work> batch) override {
    ModelOutput out;
    for (const Work& w : batch) {
      if (w.prefill) prefill_rows[w.request] += std::ssize(w.tokens);
      for (std::size_t i = 0; i < w.tokens.size(); ++i) {
        out.picks.push_back(truth(w.request, w.start + static_cast<std::int64_t>(i) + 1));
      }
    }
    return out;
  }
  std::int64_t vocab_size() const override { return 1 << 20; }
  std::map<std::size_t, std::int64_t> prefill_rows;
};

TEST(Scheduler, ARequestWhosePromptKvArrivesFromOutsideComputesOnlyItsLastToken) {
  const auto plan = small_plan(256 * kMiB, 0);
  cache::KvCacheManager manager(plan, 0);
  SchedulerOptions o;
  std::vector<std::int64_t> hits;
  o.load_prompt = [&](std::size_t i, const cache::KvCacheManager& m, cache::RequestId id,
                      std::int64_t hit) -> std::optional<std::int64_t> {
    EXPECT_FALSE(m.block_table(id, 0).empty());  // its blocks are allocated already
    hits.push_back(hit);
    if (i == 2) return std::nullopt;  // fails: the request ends without output
    if (i == 1) return hit;           // nothing came: computed here
    return static_cast<std::int64_t>(requests(3)[i].prompt.size()) - 1;
  };
  Scheduler s(manager, plan, o);
  for (Request r : requests(3)) {
    r.external_prompt = true;
    s.add(r);
  }
  RowCounter model;
  s.run(model, nullptr);
  EXPECT_EQ(hits.size(), 3u);
  EXPECT_EQ(model.prefill_rows[0], 1);                                  // the last token only
  EXPECT_EQ(model.prefill_rows[1], std::ssize(requests(3)[1].prompt));  // all of it
  EXPECT_EQ(model.prefill_rows.count(2), 0u);
  EXPECT_EQ(s.counters().external_tokens, std::ssize(requests(3)[0].prompt) - 1);
  // The loaded tokens are the same KV as computed ones: the outputs are the plain ones.
  const Outcome plain = run(plan, 0, nullptr);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto out = s.outputs(i);
    EXPECT_EQ(std::vector<TokenId>(out.begin(), out.end()), plain.outputs[i]) << i;
    EXPECT_FALSE(s.load_failed(i));
  }
  EXPECT_TRUE(s.finished(2));
  EXPECT_TRUE(s.load_failed(2));
  EXPECT_TRUE(s.outputs(2).empty());
  EXPECT_EQ(manager.pool().num_used(), 0);
  EXPECT_EQ(manager.check_invariants(), "");
}

// start_load: the request waits admitted, outside the batch, while the others keep stepping;
// complete_load() runs it (or, cancelled meanwhile, frees its blocks only then).
TEST(Scheduler, AnAsynchronousLoadLetsTheOthersStepUntilItCompletes) {
  const auto plan = small_plan(256 * kMiB, 0);
  cache::KvCacheManager manager(plan, 0);
  SchedulerOptions o;
  std::vector<std::size_t> started;
  o.start_load = [&](std::size_t i, const cache::KvCacheManager& m, cache::RequestId id,
                     std::int64_t) {
    EXPECT_FALSE(m.block_table(id, 0).empty());  // its blocks are allocated already
    started.push_back(i);
    return true;
  };
  Scheduler s(manager, plan, o);
  const std::vector<Request> reqs = requests(3);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    Request r = reqs[i];
    r.external_prompt = i != 1;  // 0 and 2 load, 1 computes
    s.add(r);
  }
  RowCounter model;
  for (int step = 0; step < 8; ++step) s.step(model, nullptr);
  EXPECT_EQ(started, (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(s.num_loading(), 2u);
  EXPECT_EQ(s.num_running(), 1u);
  EXPECT_FALSE(s.outputs(1).empty());  // request 1 decodes while the others load
  EXPECT_TRUE(s.outputs(0).empty());
  EXPECT_EQ(model.prefill_rows.count(0), 0u);
  s.cancel(2, nullptr);  // its blocks are still being written: kept until the load ends
  EXPECT_FALSE(s.finished(2));
  s.complete_load(2, std::nullopt);
  EXPECT_TRUE(s.finished(2));
  s.complete_load(0, std::ssize(reqs[0].prompt) - 1);
  s.run(model, nullptr);
  EXPECT_EQ(model.prefill_rows[0], 1);  // the last token only
  const Outcome plain = run(plan, 0, nullptr);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto out = s.outputs(i);
    EXPECT_EQ(std::vector<TokenId>(out.begin(), out.end()), plain.outputs[i]) << i;
  }
  EXPECT_EQ(s.counters().cancelled, 1);
  EXPECT_EQ(manager.pool().num_used(), 0);
  EXPECT_EQ(manager.check_invariants(), "");
}

TEST(Scheduler, AHeldRequestKeepsItsBlocksUntilFreed) {
  const auto plan = small_plan(256 * kMiB, 0);
  cache::KvCacheManager manager(plan, 0);
  Scheduler s(manager, plan, {});
  Request r = requests(1)[0];
  r.max_tokens = 1;
  r.hold = true;
  s.add(r);
  Request cancelled = requests(2)[1];
  cancelled.hold = true;
  s.add(cancelled);
  StreamModel model;
  s.step(model, nullptr);
  s.cancel(1, nullptr);  // a cancelled request is read by nobody: freed at once
  s.run(model, nullptr);
  EXPECT_TRUE(s.finished(0));
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(s.num_held(), 1u);
  EXPECT_EQ(manager.num_computed(cache::RequestId(0)), std::ssize(r.prompt));
  EXPECT_GT(manager.pool().num_used(), 0);
  s.free_held(0);
  s.free_held(0);  // a no-op the second time
  EXPECT_EQ(s.num_held(), 0u);
  EXPECT_EQ(manager.pool().num_used(), 0);
  EXPECT_EQ(manager.check_invariants(), "");
}

}  // namespace
}  // namespace mixkv::sched
