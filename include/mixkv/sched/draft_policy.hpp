// How many tokens each request drafts in a step: the lengths that maximise the step's expected
// tokens per second, from what a model step of n token rows costs (a StepCost: measured online,
// or fixed for tests) and each request's recent acceptance per draft position. Under batching the
// weight pass is shared by every request's rows, so an extra verify row saves less relative to
// the step than at batch 1, and the same rule gives a smaller total. docs/sched.md.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mixkv::sched {

// What a step costs. Any unit (seconds when measured): the policy only compares costs.
class StepCost {
 public:
  virtual ~StepCost() = default;
  // A model forward over `rows` token rows (each request's last token and drafts).
  virtual double step(std::int64_t rows) const = 0;
  // A drafter's pass whose longest chain drafts `positions` tokens (0 costs nothing). Only a
  // drafter that runs a forward per position pays it (spec::Drafter::drafts_for_free).
  virtual double draft(int positions) const = 0;
  // The scheduler reports every decode step it timed (prefill chunks excluded: their rows cost
  // differently) and every drafter pass; a fixed cost ignores them.
  virtual void observe_step(std::int64_t /*rows*/, double /*seconds*/) {}
  virtual void observe_draft(int /*positions*/, double /*seconds*/) {}
};

// step(rows) = base + per_row * (rows - 1); draft(positions) = per_position * positions.
class LinearStepCost final : public StepCost {
 public:
  LinearStepCost(double base, double per_row, double per_position = 0.0);
  double step(std::int64_t rows) const override;
  double draft(int positions) const override;

 private:
  double base_, per_row_, per_position_;
};

// Measured online: an exponentially weighted mean of step seconds per row count, read through a
// local linear fit over the measured counts near the one asked (weights fall with the ratio of
// row counts), so one noisy count does not make extra rows look free. Before anything near is
// measured, the prior's shape (1 + prior_per_row * (rows - 1)) scales the nearest measurement;
// before anything at all, the prior itself (in units of a one-row step). Drafter passes: the
// mean seconds per chain position.
class MeasuredStepCost final : public StepCost {
 public:
  // A verify row cost a quarter of a one-row decode step on SmolLM2 with issue 15's kernels
  // (docs/engine.md); 0.3 errs towards fewer drafts until measured.
  static constexpr double kPriorPerRow = 0.3;
  explicit MeasuredStepCost(double prior_per_row = kPriorPerRow);
  double step(std::int64_t rows) const override;
  double draft(int positions) const override;
  void observe_step(std::int64_t rows, double seconds) override;
  void observe_draft(int positions, double seconds) override;
  // Row counts measured so far (for tests and reports).
  std::int64_t measured_rows() const;

 private:
  static constexpr std::size_t kMaxRows = 1024;  // larger steps are read as this many
  double prior(double rows) const { return 1.0 + prior_per_row_ * (rows - 1.0); }
  double prior_per_row_;
  std::vector<double> mean_;           // per row count: EWMA of seconds
  std::vector<std::int32_t> count_;    // per row count: steps seen (capped)
  std::vector<std::size_t> measured_;  // the row counts with a step seen, ascending
  double draft_per_position_ = 0.0;
  bool draft_measured_ = false;
};

// One request's recent acceptance: per draft position p, the probability that draft p is
// accepted given that drafts 0..p-1 were, as an exponentially weighted mean over the verify
// steps that drafted p.
class AcceptanceEstimate {
 public:
  // A request starts from `prior` at every position (the scheduler's running estimate over
  // earlier requests).
  static constexpr double kPrior = 0.7;
  static constexpr double kRequestWeight = 0.5;  // reacts within a few steps (copy spans end)
  AcceptanceEstimate(int positions = 0, double prior = kPrior);
  explicit AcceptanceEstimate(std::vector<double> conditional);
  // A verify step drafted `drafted` tokens and accepted the first `accepted`: positions below
  // `accepted` were accepted, position `accepted` (if drafted) rejected, later ones not seen.
  // Positions never seen take the estimate of the position before them.
  void update(int drafted, int accepted, double weight = kRequestWeight);
  std::span<const double> conditional() const { return conditional_; }

 private:
  std::vector<double> conditional_;
  std::vector<bool> seen_;  // per position: updated by a verify step at least once
};

// One decoding request's part of the choice.
struct DraftCandidate {
  int available = 0;                    // drafts it may take (drafter's proposals, k, tokens left)
  std::span<const double> conditional;  // AcceptanceEstimate::conditional()
  int forced = 0;                       // at least this many (a probe), if available
};

// The draft length per candidate maximising (expected tokens) / (step(fixed_rows + drafts) +
// draft(longest)), where a request's expected tokens are 1 + the sum over its drafts of the
// probability that all of them up to there are accepted; 0 for all is plain decoding.
// `fixed_rows`: the step's rows whatever the drafts (one per decoding request). With
// `charge_drafter` false the drafts are already made (prompt lookup) and only verify rows cost.
// `max_total` caps the step's drafts (0: no cap). Deterministic for a fixed StepCost: ties go to
// fewer drafts, then to earlier requests.
std::vector<int> choose_draft_lengths(const StepCost& cost, std::int64_t fixed_rows,
                                      std::span<const DraftCandidate> candidates,
                                      bool charge_drafter, std::int64_t max_total = 0);

}  // namespace mixkv::sched
