#include "mixkv/sample/sampler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "mixkv/core/error.hpp"
#include "mixkv/runner/model_runner.hpp"

namespace mixkv::sample {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Throws unless lo <= value <= hi (lo < value with lo_open), naming the field and its range.
void check_range(double value, double lo, double hi, bool lo_open, std::string_view field,
                 std::string_view meaning) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return;
  const std::string range = std::isinf(hi)
                                ? fmt::format("{} {}", lo_open ? ">" : ">=", lo)
                                : fmt::format("in {}{}, {}]", lo_open ? "(" : "[", lo, hi);
  throw_invalid(fmt::format("sampling parameter {} = {} is out of range: it must be {} ({})", field,
                            value, range, meaning));
}

// splitmix64's finaliser (Steele, Lea and Flood 2014): a bijection whose output bits all depend
// on every input bit, so nearby (seed, position) keys give independent-looking draws.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void validate(const SamplingParams& p) {
  check_range(p.temperature, 0, kInf, false, "temperature", "0 is greedy");
  if (p.top_k < -1) {
    throw_invalid(fmt::format(
        "sampling parameter top_k = {} is out of range: it must be -1 or 0 (all tokens) or a "
        "positive count",
        p.top_k));
  }
  check_range(p.top_p, 0, 1, true, "top_p", "1 keeps every token");
  check_range(p.min_p, 0, 1, false, "min_p", "0 keeps every token");
  check_range(p.repetition_penalty, 0, kInf, true, "repetition_penalty", "1 is none");
  check_range(p.presence_penalty, -2, 2, false, "presence_penalty", "0 is none");
  check_range(p.frequency_penalty, -2, 2, false, "frequency_penalty", "0 is none");
}

bool is_greedy(const SamplingParams& p) { return p.temperature < kGreedyTemperature; }

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
}

double uniform(std::uint64_t seed, std::int64_t position, Stream stream) {
  const std::uint64_t key =
      mix(seed ^ mix(static_cast<std::uint64_t>(position) * 0x9e3779b97f4a7c15ULL +
                     static_cast<std::uint64_t>(stream)));
  // The top 53 bits as a double in [0, 1).
  return static_cast<double>(key >> 11) * 0x1.0p-53;
}

TokenId draw(std::span<const float> probs, double u) {
  if (probs.empty()) throw_internal("sample::draw from an empty distribution");
  double total = 0;
  for (float p : probs) total += p;
  if (!(total > 0) || !std::isfinite(total)) {
    throw_internal(fmt::format("sample::draw from a distribution of total {}", total));
  }
  const double target = u * total;
  double running = 0;
  std::size_t last_nonzero = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    running += probs[i];
    last_nonzero = i;
    if (running > target) return static_cast<TokenId>(i);
  }
  // u x total rounds to the total itself: the last token that has any probability.
  return static_cast<TokenId>(last_nonzero);
}

Sampler::Sampler(SamplingParams params, std::span<const TokenId> prompt)
    : params_(params), prompt_tokens_(prompt.begin(), prompt.end()) {
  validate(params_);
  std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
  prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                       prompt_tokens_.end());
}

void Sampler::commit(TokenId token) {
  ++output_counts_[token];
  ++position_;
}

// vLLM's order (v1 sampler): repetition penalty over prompt and output tokens (a positive logit
// divided by it, a negative one multiplied), then frequency and presence penalties over output
// tokens only.
void Sampler::penalise(std::span<const float> logits, std::span<const TokenId> pending,
                       std::vector<float>& out) const {
  out.assign(logits.begin(), logits.end());
  if (!has_penalties(params_)) return;
  std::unordered_map<TokenId, std::int64_t> counts = output_counts_;
  for (TokenId t : pending) ++counts[t];
  const auto vocab = static_cast<TokenId>(out.size());
  const auto in_vocab = [&](TokenId t) { return t >= 0 && t < vocab; };
  if (params_.repetition_penalty != 1.0) {
    const auto rp = static_cast<float>(params_.repetition_penalty);
    auto apply = [&](TokenId t) {
      float& l = out[static_cast<std::size_t>(t)];
      l = l > 0 ? l / rp : l * rp;
    };
    for (TokenId t : prompt_tokens_) {
      if (in_vocab(t)) apply(t);
    }
    for (const auto& [t, n] : counts) {
      if (in_vocab(t) && !std::binary_search(prompt_tokens_.begin(), prompt_tokens_.end(), t)) {
        apply(t);
      }
    }
  }
  for (const auto& [t, n] : counts) {
    if (!in_vocab(t)) continue;
    out[static_cast<std::size_t>(t)] -= static_cast<float>(
        params_.frequency_penalty * static_cast<double>(n) + params_.presence_penalty);
  }
}

TokenId Sampler::pick(std::span<const float> logits, std::span<const TokenId> pending) const {
  if (!has_penalties(params_)) return runner::argmax(logits);
  std::vector<float> penalised;
  penalise(logits, pending, penalised);
  return runner::argmax(penalised);
}

void Sampler::distribution(std::span<const float> logits, std::span<const TokenId> pending,
                           std::vector<float>& probs) const {
  if (logits.empty()) throw_invalid("sampling from no logits");
  if (greedy()) {
    probs.assign(logits.size(), 0.0f);
    probs[static_cast<std::size_t>(pick(logits, pending))] = 1.0f;
    return;
  }
  std::vector<float>& x = probs;
  penalise(logits, pending, x);
  const auto inv_t = static_cast<float>(1.0 / params_.temperature);
  float top = kNegInf;
  for (float& l : x) {
    l *= inv_t;
    top = std::max(top, l);
  }
  if (!std::isfinite(top)) throw_invalid("sampling from logits that are all -inf or NaN");
  for (float& l : x) l = std::exp(l - top);  // softmax numerators, the likeliest is 1
  // min-p: relative to the likeliest token, whose numerator is 1.
  if (params_.min_p > 0) {
    const auto floor = static_cast<float>(params_.min_p);
    for (float& p : x) {
      if (p < floor) p = 0;
    }
  }
  // top-k, then top-p over what top-k kept. Ties at the cut are kept: the kept set depends on
  // the probabilities alone, not on the order of token ids.
  const bool top_k = params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < x.size();
  if (top_k || params_.top_p < 1.0) {
    std::vector<float> sorted;
    sorted.reserve(x.size());
    for (float p : x) {
      if (p > 0) sorted.push_back(p);
    }
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    float cut = 0;  // tokens below it are dropped
    std::size_t kept = sorted.size();
    if (top_k && static_cast<std::size_t>(params_.top_k) < kept) {
      kept = static_cast<std::size_t>(params_.top_k);
      cut = sorted[kept - 1];
    }
    if (params_.top_p < 1.0) {
      double total = 0;
      for (std::size_t i = 0; i < kept; ++i) total += sorted[i];
      const double want = params_.top_p * total;
      double running = 0;
      for (std::size_t i = 0; i < kept; ++i) {
        running += sorted[i];
        if (running >= want) {
          cut = std::max(cut, sorted[i]);
          break;
        }
      }
    }
    for (float& p : x) {
      if (p < cut) p = 0;
    }
  }
  double total = 0;
  for (float p : x) total += p;
  const auto inv = static_cast<float>(1.0 / total);
  for (float& p : x) p *= inv;
}

TokenId Sampler::next(std::span<const float> logits) const {
  if (greedy()) return pick(logits);
  std::vector<float> probs;
  distribution(logits, {}, probs);
  return draw(probs, uniform(params_.seed, position_, Stream::kSample));
}

}  // namespace mixkv::sample
