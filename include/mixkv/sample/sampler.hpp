// Sampling: how a request turns the target's logits into its next token. Plain decoding and
// speculative acceptance (mixkv/spec/acceptance.hpp) draw from the same distribution, built here
// the way OpenAI's API and vLLM define its parameters. docs/sample.md.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace mixkv::sample {

using TokenId = std::int32_t;

// A request's sampling parameters. The defaults are greedy decoding without penalties, which
// picks exactly runner::argmax of the logits.
struct SamplingParams {
  double temperature = 0.0;         // >= 0; below kGreedyTemperature: greedy
  int top_k = 0;                    // keep the k most likely tokens; 0 or -1: all (vLLM's -1)
  double top_p = 1.0;               // (0, 1]: the smallest set holding this much probability
  double min_p = 0.0;               // [0, 1]: drop tokens below min_p x the likeliest one's
  double repetition_penalty = 1.0;  // > 0; prompt and output tokens (HF / vLLM)
  double presence_penalty = 0.0;    // [-2, 2]; output tokens (OpenAI)
  double frequency_penalty = 0.0;   // [-2, 2]; output tokens, per occurrence (OpenAI)
  std::uint64_t seed = 0;           // the request's draws depend on it and the position only
};

// vLLM's threshold: temperatures below it sample greedily (dividing by them overflows).
inline constexpr double kGreedyTemperature = 1e-5;

// Throws InvalidInput naming the field and its range when `p` is out of range (NaN included).
void validate(const SamplingParams& p);

bool is_greedy(const SamplingParams& p);
bool has_penalties(const SamplingParams& p);

// A uniform draw in [0, 1) that depends only on (seed, position, stream): a request's tokens do
// not depend on which other requests share its steps, nor on how many tokens a step verifies.
enum class Stream : std::uint64_t { kSample = 1, kAccept = 2 };
double uniform(std::uint64_t seed, std::int64_t position, Stream stream);

// Index drawn from `probs` (non-negative, not necessarily normalised) with the uniform `u`:
// the first index whose running sum exceeds u x total, summed in index order.
TokenId draw(std::span<const float> probs, double u);

// One request's sampler: its parameters and the token counts its penalties need. Positions count
// the request's output tokens: the token after the prompt is position 0.
class Sampler {
 public:
  Sampler() = default;  // greedy, no penalties
  // Throws InvalidInput for out-of-range parameters (validate()).
  Sampler(SamplingParams params, std::span<const TokenId> prompt);

  const SamplingParams& params() const { return params_; }
  std::int64_t position() const { return position_; }
  bool greedy() const { return is_greedy(params_); }

  // The distribution of the token after the output so far followed by `pending` (drafts not yet
  // accepted: they count for the penalties of later positions), from that position's logits:
  // penalties, temperature, min-p, top-k, top-p, normalised to sum 1. Greedy parameters give
  // the one-hot distribution of pick().
  void distribution(std::span<const float> logits, std::span<const TokenId> pending,
                    std::vector<float>& probs) const;

  // The greedy token at that position: argmax of the penalised logits (runner::argmax's tie
  // rule: the lowest id). Without penalties exactly runner::argmax(logits).
  TokenId pick(std::span<const float> logits, std::span<const TokenId> pending = {}) const;

  // Plain decoding's token at the current position (pick() when greedy, else a draw from
  // distribution() with uniform(seed, position, kSample)). Does not commit.
  TokenId next(std::span<const float> logits) const;

  // Appends an accepted token to the output: the position advances and the penalties count it.
  void commit(TokenId token);

 private:
  void penalise(std::span<const float> logits, std::span<const TokenId> pending,
                std::vector<float>& out) const;

  SamplingParams params_;
  std::int64_t position_ = 0;
  std::vector<TokenId> prompt_tokens_;  // distinct, sorted
  std::unordered_map<TokenId, std::int64_t> output_counts_;
};

}  // namespace mixkv::sample
