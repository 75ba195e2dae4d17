#include "mixkv/sched/draft_policy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "mixkv/core/error.hpp"

namespace mixkv::sched {
namespace {

constexpr double kStepWeight = 0.1;  // EWMA weight of a new step time per row count
constexpr std::int32_t kMaxCount = 16;
// Local fit: a measured row count m weighs count * exp(-|ln(m / rows)| / kBandwidth).
constexpr double kBandwidth = 0.35;
constexpr double kMaxJump = 3.0;

}  // namespace

LinearStepCost::LinearStepCost(double base, double per_row, double per_position)
    : base_(base), per_row_(per_row), per_position_(per_position) {
  if (!(base > 0) || per_row < 0 || per_position < 0) {
    throw_invalid(fmt::format(
        "LinearStepCost: base {} must be positive, per_row {} and per_position {} not negative",
        base, per_row, per_position));
  }
}

double LinearStepCost::step(std::int64_t rows) const {
  return base_ + per_row_ * static_cast<double>(std::max<std::int64_t>(rows, 1) - 1);
}

double LinearStepCost::draft(int positions) const {
  return per_position_ * static_cast<double>(std::max(positions, 0));
}

MeasuredStepCost::MeasuredStepCost(double prior_per_row)
    : prior_per_row_(prior_per_row), mean_(kMaxRows + 1, 0.0), count_(kMaxRows + 1, 0) {
  if (prior_per_row < 0) {
    throw_invalid(fmt::format("MeasuredStepCost: prior_per_row {} is negative", prior_per_row));
  }
}

void MeasuredStepCost::observe_step(std::int64_t rows, double seconds) {
  if (rows < 1 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const auto n = static_cast<std::size_t>(std::min<std::int64_t>(rows, kMaxRows));
  // One step the OS preempted must not make a row count look dear for long: a sample counts
  // for at most kMaxJump times what the counts measured so far predict.
  if (!measured_.empty()) seconds = std::min(seconds, kMaxJump * step(rows));
  // The first samples of a count average plainly, later ones decay (the machine's load moves).
  const double w = std::max(kStepWeight, 1.0 / static_cast<double>(count_[n] + 1));
  mean_[n] += w * (seconds - mean_[n]);
  if (count_[n] == 0) measured_.insert(std::lower_bound(measured_.begin(), measured_.end(), n), n);
  count_[n] = std::min(count_[n] + 1, kMaxCount);
}

void MeasuredStepCost::observe_draft(int positions, double seconds) {
  if (positions < 1 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const double per = seconds / positions;
  if (!draft_measured_) {
    draft_per_position_ = per;
    draft_measured_ = true;
  } else {
    draft_per_position_ += kStepWeight * (per - draft_per_position_);
  }
}

std::int64_t MeasuredStepCost::measured_rows() const { return std::ssize(measured_); }

double MeasuredStepCost::step(std::int64_t rows) const {
  const double x = static_cast<double>(std::clamp<std::int64_t>(rows, 1, kMaxRows));
  // Weighted means and co-moments of the measured counts around x.
  double sw = 0, sx = 0, sy = 0;
  const double lx = std::log(x);
  const auto weight = [&](std::size_t m) {
    return count_[m] * std::exp(-std::abs(std::log(static_cast<double>(m)) - lx) / kBandwidth);
  };
  for (const std::size_t m : measured_) {
    const double w = weight(m);
    sw += w;
    sx += w * static_cast<double>(m);
    sy += w * mean_[m];
  }
  if (sw <= 0) return prior(x);  // nothing measured: units of a one-row step
  const double mx = sx / sw, my = sy / sw;
  double sxx = 0, sxy = 0;
  for (const std::size_t m : measured_) {
    const double w = weight(m);
    const double dx = static_cast<double>(m) - mx;
    sxx += w * dx * dx;
    sxy += w * dx * (mean_[m] - my);
  }
  // The prior's slope at the fitted level: what one more row costs if the fit cannot tell.
  const double prior_slope = my * prior_per_row_ / prior(mx);
  double slope = prior_slope;
  // Trust the fit only over a spread of at least about one row on each side.
  if (sxx / sw >= 0.25) slope = sxy / sxx;
  // Rows are never free, nor dearer than a whole step each.
  const double lo = 0.02 * prior_slope;
  slope = std::clamp(slope, lo, std::max(lo, 4.0 * my / std::max(1.0, mx)));
  return std::max(my + slope * (x - mx), 0.05 * my);
}

double MeasuredStepCost::draft(int positions) const {
  return draft_measured_ ? draft_per_position_ * static_cast<double>(std::max(positions, 0)) : 0.0;
}

AcceptanceEstimate::AcceptanceEstimate(int positions, double prior)
    : conditional_(static_cast<std::size_t>(std::max(positions, 0)), prior),
      seen_(conditional_.size(), false) {}

AcceptanceEstimate::AcceptanceEstimate(std::vector<double> conditional)
    : conditional_(std::move(conditional)), seen_(conditional_.size(), true) {}

void AcceptanceEstimate::update(int drafted, int accepted, double weight) {
  const int seen = std::min<int>(drafted, static_cast<int>(conditional_.size()));
  for (int p = 0; p < seen && p <= accepted; ++p) {
    const auto i = static_cast<std::size_t>(p);
    conditional_[i] += weight * ((p < accepted ? 1.0 : 0.0) - conditional_[i]);
    seen_[i] = true;
  }
  // A position never drafted reads as the one before it: a chain the policy kept short because
  // of the prior would otherwise never learn that its later drafts pass too.
  for (std::size_t i = 1; i < conditional_.size(); ++i) {
    if (!seen_[i]) conditional_[i] = conditional_[i - 1];
  }
}

std::vector<int> choose_draft_lengths(const StepCost& cost, std::int64_t fixed_rows,
                                      std::span<const DraftCandidate> candidates,
                                      bool charge_drafter, std::int64_t max_total) {
  std::vector<int> out(candidates.size(), 0);
  // Every (request, position) a draft could take, valued by the probability that it and the
  // drafts before it are accepted: the expected tokens it adds. Within a request the values do
  // not increase with the position, so the m most valuable are a prefix of each request's, and
  // the best step takes the best m for some m.
  struct Slot {
    double value;
    std::size_t request;
    int position;
  };
  std::vector<Slot> slots;
  double tokens = 0;  // expected tokens of the forced part (and the one per request)
  std::int64_t rows = fixed_rows;
  int longest = 0;
  for (std::size_t r = 0; r < candidates.size(); ++r) {
    const DraftCandidate& c = candidates[r];
    tokens += 1.0;
    double p = 1.0;
    for (int j = 0; j < c.available; ++j) {
      const double a = j < std::ssize(c.conditional)
                           ? std::clamp(c.conditional[static_cast<std::size_t>(j)], 0.0, 1.0)
                           : 0.0;
      p *= a;
      if (j < c.forced && (max_total <= 0 || rows - fixed_rows < max_total)) {
        out[r] = j + 1;
        tokens += p;
        ++rows;
        longest = std::max(longest, j + 1);
      } else {
        slots.push_back({p, r, j});
      }
    }
  }
  std::stable_sort(slots.begin(), slots.end(),
                   [](const Slot& a, const Slot& b) { return a.value > b.value; });
  const auto rate = [&](double t, std::int64_t n, int chain) {
    return t / (cost.step(n) + (charge_drafter ? cost.draft(chain) : 0.0));
  };
  double best = rate(tokens, rows, longest);
  std::size_t take = 0;
  std::int64_t total = rows - fixed_rows;
  for (std::size_t m = 0; m < slots.size(); ++m) {
    if (max_total > 0 && total >= max_total) break;
    // A request's later position never comes before its earlier one (values do not increase
    // along a request, and stable_sort keeps their order on ties).
    tokens += slots[m].value;
    ++rows;
    ++total;
    longest = std::max(longest, slots[m].position + 1);
    const double r = rate(tokens, rows, longest);
    if (r > best * (1.0 + 1e-12)) {
      best = r;
      take = m + 1;
    }
  }
  for (std::size_t m = 0; m < take; ++m) {
    out[slots[m].request] = std::max(out[slots[m].request], slots[m].position + 1);
  }
  return out;
}

}  // namespace mixkv::sched
