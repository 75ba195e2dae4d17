// Greedy generation over the reference runner: a continuous-batching scheduler that admits
// requests through the KvCacheManager (all-or-nothing allocation, prefix caching), prefills in
// chunks, preempts by recompute when the pool runs dry, and decodes with optional speculative
// decoding by a chain drafter (propose k tokens, verify them in one target forward, accept the
// longest matching prefix plus the bonus token, commit only those to the manager). docs/engine.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/engine/model_runner.hpp"

namespace mixkv::engine {

// What a drafter is told about one request.
struct DraftContext {
  std::size_t request = 0;
  std::span<const TokenId> tokens = {};  // prompt and verified outputs
  std::int64_t num_computed = 0;         // positions whose target KV is in the cache
  std::span<const std::span<const cache::BlockId>> block_tables = {};  // per KV-cache group
};

// What the target computed for one request in a step, shown to the drafter before the manager
// commits it: the features (ModelRunner::draft_features) of positions [first, ctx.num_computed).
struct Observation {
  DraftContext ctx;
  std::int64_t first = 0;
  std::span<const float> features = {};
};

// A drafter: proposes up to k tokens to follow a request's verified tokens.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // ctx.tokens.back() is the last verified token, not computed yet (num_computed ==
  // tokens.size() - 1). May return fewer than k tokens. Drafts may be written into the
  // request's look-ahead slots: the block tables hold num_computed + 1 + k positions.
  virtual std::vector<TokenId> propose(const DraftContext& ctx, int k) = 0;
  // Every decoding request of a step at once, in order. A drafter whose forward serves a batch
  // overrides it; by default each request is proposed for alone.
  virtual std::vector<std::vector<TokenId>> propose_batch(std::span<const DraftContext> ctxs,
                                                          int k);
  // The target's features (ModelRunner::draft_features) of the request's newly verified
  // positions [first, ctx.num_computed), before the manager commits them; ctx.tokens includes
  // the tokens they verified (and the token sampled after them).
  virtual void observe(const DraftContext& /*ctx*/, std::int64_t /*first*/,
                       std::span<const float> /*features*/) {}
  // Every request of a step at once; by default observe() for each.
  virtual void observe_batch(std::span<const Observation> observations);
  // The request's blocks are freed (finished, or preempted: it is admitted again later).
  virtual void forget(std::size_t /*request*/) {}
};

// Proposes the target's own greedy continuation, known from an earlier plain run: every draft
// is accepted (the upper bound of speculation).
class OracleDrafter final : public Drafter {
 public:
  // references[i]: request i's prompt followed by its plain greedy output.
  explicit OracleDrafter(std::vector<std::vector<TokenId>> references);
  std::string name() const override { return "oracle"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  std::vector<std::vector<TokenId>> references_;
};

// Proposes seeded uniform random tokens: almost everything is rejected (a fault-injected drafter).
class RandomDrafter final : public Drafter {
 public:
  RandomDrafter(std::int64_t vocab_size, std::uint64_t seed);
  std::string name() const override { return "random"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  std::int64_t vocab_size_;
  std::mt19937_64 rng_;
};

// Prompt lookup (n-gram) drafting, as vLLM's "ngram" method: find the most recent earlier
// occurrence of the last n tokens (n from max_n down to min_n) and propose what followed it,
// extended through its own proposal so a repeating cycle yields k tokens. No weights: greedy
// output that repeats itself (as small models' does) is predicted well, anything else not at all.
class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int min_n = 1, int max_n = 3);
  std::string name() const override { return "ngram"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  int min_n_;
  int max_n_;
};

// EAGLE-style drafter on the runner's drafter layers (RunnerOptions::draft). Position q of its
// cache holds the layer input fc([embedding(t_q); h_(q-1)]), h the target's hidden state at the
// position before. observe() runs it over the newly verified positions with the real hidden
// states before they are committed (so every cached block holds what a plain run would have
// put there) and through the last sampled token, whose output is the first draft; propose()
// chains the remaining k - 1 drafts on the drafter's own hidden states. Both run every request
// of the step in one drafter forward (per chain position, for propose).
class EagleDrafter final : public Drafter {
 public:
  // The same chain serves the target's MTP layers (RunnerOptions::mtp): named "mtp" then.
  explicit EagleDrafter(ModelRunner& runner);
  std::string name() const override { return name_; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;
  std::vector<std::vector<TokenId>> propose_batch(std::span<const DraftContext> ctxs,
                                                  int k) override;
  void observe(const DraftContext& ctx, std::int64_t first, std::span<const float> hidden) override;
  void observe_batch(std::span<const Observation> observations) override;
  void forget(std::size_t request) override;

 private:
  struct State {
    std::int64_t next = 0;         // first position the drafter has not computed for real
    std::int64_t hidden_base = 0;  // position of hidden's first row
    std::vector<float> hidden;     // target hidden states not consumed yet
    std::int64_t pending_at = -1;  // position whose drafter output gave `pending`
    TokenId pending = 0;
    std::vector<float> pending_hidden;
  };
  ModelRunner& runner_;
  std::string name_;
  std::map<std::size_t, State> states_;
};

// DFlash block drafter on the runner's drafter layers (RunnerOptions::draft of a DFlash config,
// `tiny-dflash`). observe() writes the drafter's K/V of the newly verified positions, projected
// from the target's chosen layers, before they are committed, so every cached block holds what a
// run without speculation would have put there. propose() drafts a whole block in one forward:
// the last verified token and k mask tokens, attending non-causally to the context and each
// other; the block's K/V lands in look-ahead slots the next observe() rewrites. Both run over
// every request of the step in one batched forward. It keeps no state between steps.
class DflashDrafter final : public Drafter {
 public:
  explicit DflashDrafter(ModelRunner& runner);
  std::string name() const override { return "dflash"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;
  std::vector<std::vector<TokenId>> propose_batch(std::span<const DraftContext> ctxs,
                                                  int k) override;
  void observe(const DraftContext& ctx, std::int64_t first,
               std::span<const float> features) override;
  void observe_batch(std::span<const Observation> observations) override;

 private:
  ModelRunner& runner_;
};

struct GenerateOptions {
  std::int64_t max_tokens = 32;     // generated tokens per request (no EOS stop: see docs)
  int num_spec_tokens = 0;          // k; 0 or no drafter: plain decoding
  int max_batch = 16;               // requests running at once
  std::int64_t prefill_chunk = 32;  // prompt tokens one request computes per step
  bool prefix_caching = true;
  // Called for each finished request just before its blocks are freed (tests inspect the cache).
  std::function<void(const cache::KvCacheManager&, cache::RequestId, std::size_t request)>
      before_free;
};

struct RequestStats {
  std::int64_t prompt_tokens = 0;
  std::int64_t generated_tokens = 0;
  std::int64_t prefix_hit_tokens = 0;  // at the (last) admission
  std::int64_t drafted_tokens = 0;
  std::int64_t accepted_tokens = 0;
  std::int64_t decode_steps = 0;  // target forwards that verified (or plainly decoded) a token
  std::int64_t preemptions = 0;
  double seconds = 0;                   // from admission to the last token
  double acceptance_rate() const;       // accepted / drafted (0 when nothing was drafted)
  double mean_accepted_length() const;  // tokens per decode step, the bonus token included
  double tokens_per_second() const;
};

struct RequestOutput {
  std::vector<TokenId> tokens;  // generated, max_tokens of them
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

// Generates for every prompt. `drafter` may be null (plain decoding). The runner's cache is
// reused; a fresh manager is made per call. Throws Error when a request cannot fit the cache
// even alone, or options are out of range.
GenerateReport generate(ModelRunner& runner, std::span<const std::vector<TokenId>> prompts,
                        Drafter* drafter, const GenerateOptions& options);

}  // namespace mixkv::engine
