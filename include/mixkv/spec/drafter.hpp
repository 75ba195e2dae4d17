// Speculative decoding's drafter interface: what a drafter is told about a request, what it
// proposes, and what it sees of the target's verified work. The scheduler (mixkv::sched) drives
// every drafter through it; one file per drafter implements it. docs/engine.md.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "mixkv/cache/block_hash.hpp"
#include "mixkv/cache/block_pool.hpp"

namespace mixkv::spec {

using cache::TokenId;

// What a drafter is told about one request.
struct DraftContext {
  std::size_t request = 0;
  std::span<const TokenId> tokens = {};  // prompt and verified outputs
  std::int64_t num_computed = 0;         // positions whose target KV is in the cache
  std::span<const std::span<const cache::BlockId>> block_tables = {};  // per KV-cache group
  // The most drafts the scheduler will verify for it this step (its adaptive draft length, the
  // tokens left to generate): a drafter that pays per draft stops there; more are cut off.
  int max_drafts = std::numeric_limits<int>::max();
  // The tokens that end the request (end of turn, end of text, stop ids): where a message ends,
  // which prompt lookup does not copy across.
  std::span<const TokenId> stop_tokens = {};
};

// What the target computed for one request in a step, shown to the drafter before the manager
// commits it: the features (runner::ModelRunner::draft_features) of positions
// [first, ctx.num_computed).
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
  // Proposing costs nothing next to a model step (no forward: prompt lookup, a reference). The
  // scheduler then asks for every draft the verify could take and keeps those that pay; a
  // drafter that runs a forward per draft is told its lengths first (DraftContext::max_drafts).
  virtual bool drafts_for_free() const { return false; }
  // ctx.tokens.back() is the last verified token, not computed yet (num_computed ==
  // tokens.size() - 1). May return fewer than k tokens. Drafts may be written into the
  // request's look-ahead slots: the block tables hold num_computed + 1 + k positions.
  virtual std::vector<TokenId> propose(const DraftContext& ctx, int k) = 0;
  // The drafter's own estimate for the drafts its last proposal gave `request`: per draft j, the
  // probability that it is accepted given that drafts 0..j-1 were. Empty: it has none, and the
  // scheduler's record of the request's acceptance per position serves (docs/sched.md).
  virtual std::span<const double> confidence(std::size_t /*request*/) const { return {}; }
  // Every decoding request of a step at once, in order. A drafter whose forward serves a batch
  // overrides it; by default each request is proposed for alone.
  virtual std::vector<std::vector<TokenId>> propose_batch(std::span<const DraftContext> ctxs,
                                                          int k);
  // The target's features of the request's newly verified positions [first, ctx.num_computed),
  // before the manager commits them; ctx.tokens includes the tokens they verified (and the token
  // sampled after them).
  virtual void observe(const DraftContext& /*ctx*/, std::int64_t /*first*/,
                       std::span<const float> /*features*/) {}
  // Every request of a step at once; by default observe() for each.
  virtual void observe_batch(std::span<const Observation> observations);
  // The request's blocks are freed (finished, or preempted: it is admitted again later).
  virtual void forget(std::size_t /*request*/) {}
};

}  // namespace mixkv::spec
