// `mixkv simulate`: replays a request trace through a simple continuous-batching scheduler that
// drives a KvCacheManager with speculative steps, and reports what the manager did (throughput,
// preemptions, prefix hits, KV usage over time per group). docs/cache.md describes the scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::sim {

// One request of a trace. The prompt is either explicit `tokens`, or `prompt_len` tokens drawn
// from the stream of `prefix_id` for the first `prefix_len` tokens (default: all of them) and
// from the request's own stream after that; requests with equal prefix ids share that prefix.
struct TraceRequest {
  std::int64_t arrival_step = 0;
  std::int64_t prompt_len = 0;
  std::optional<std::int64_t> prefix_id;
  std::optional<std::int64_t> prefix_len;
  std::vector<cache::TokenId> tokens;  // explicit prompt; empty: use prompt_len
  std::int64_t output_len = 1;
  std::string source;  // "FILE:LINE" or "synthetic #i", for error messages

  std::int64_t length() const {
    return tokens.empty() ? prompt_len : static_cast<std::int64_t>(tokens.size());
  }
};

// JSONL, one request per line: {"arrival_step": int, "prompt_len": int | "prompt": [ids],
// "prefix_id": int|null, "prefix_len": int (optional), "output_len": int}. Blank lines are
// skipped. A bad line throws Error naming `name` and the line number. The result is sorted by
// arrival step (stable).
std::vector<TraceRequest> parse_trace(std::istream& in, std::string_view name);
std::vector<TraceRequest> read_trace(const std::string& path);

struct SyntheticOptions {
  std::int64_t requests = 200;
  std::uint64_t seed = 0;
  std::int64_t max_len = 0;  // prompt + output + look-ahead stay within it (0: no limit)
  int num_spec_tokens = 0;
};
// Seeded: shared-prefix groups of 256 to 2,048 tokens (about 70% of requests), own suffixes of
// 16 to 768 tokens, outputs of 16 to 384 tokens, about two arrivals per step.
std::vector<TraceRequest> synthetic_trace(const SyntheticOptions& options);

struct SimOptions {
  double acceptance = 0.7;  // probability each draft token is accepted (stop at first reject)
  std::uint64_t seed = 0;
  std::int64_t max_batch = 256;    // running requests at most
  std::int64_t sample_every = 4;   // steps between KV usage samples
  std::int64_t max_samples = 256;  // the usage series is thinned to at most this many
  // Called every 16 steps and once at the end with (requests finished, requests), outside the
  // manager's timed calls (the CLI draws a progress bar with it).
  std::function<void(std::int64_t, std::int64_t)> progress;
};

struct UsageSample {
  std::int64_t step = 0;
  std::int64_t running = 0;
  std::int64_t waiting = 0;
  std::int64_t blocks_used = 0;           // pool blocks referenced by some table
  std::vector<std::int64_t> blocks_held;  // per KV-cache group
};

struct GroupUsage {
  int group = 0;
  plan::Behaviour behaviour = plan::Behaviour::kAllTokens;
  std::int64_t block_size = 0;        // recurrent groups: the snapshot interval
  std::int64_t peak_blocks_held = 0;  // over the samples
  double mean_blocks_held = 0;        // over the samples
  std::int64_t hit_tokens = 0;        // GroupStats::hit_tokens at the end
  std::int64_t evictions = 0;         // GroupStats::evictions at the end
};

struct SimReport {
  std::int64_t requests = 0;
  std::int64_t requests_finished = 0;
  std::int64_t steps = 0;          // scheduler steps, idle ones included
  std::int64_t request_steps = 0;  // prefills + decode steps of running requests
  std::int64_t decode_steps = 0;   // speculative steps (request-steps without prefills)
  std::int64_t preemptions = 0;
  std::int64_t peak_concurrency = 0;
  std::int64_t prompt_tokens = 0;  // over every admission, re-admissions after preemption too
  std::int64_t hit_tokens = 0;
  std::int64_t generated_tokens = 0;
  double prefix_hit_rate = 0;       // hit_tokens / prompt_tokens
  double mean_accepted_length = 0;  // tokens per decode step: accepted drafts + the bonus token
  int num_spec_tokens = 0;
  double acceptance = 0;
  double wall_seconds = 0;
  double manager_seconds = 0;           // inside manager calls only
  double request_steps_per_second = 0;  // request_steps / manager_seconds
  double ns_per_request_step = 0;
  std::int64_t pool_blocks = 0;
  std::vector<GroupUsage> groups;
  std::vector<UsageSample> usage;
  std::string invariants;  // KvCacheManager::check_invariants() after the run ("" = all hold)
};

// Runs `trace` on `manager` (built from `plan` with `num_spec_tokens`). Every request is freed
// at the end. Throws Error when a request cannot fit the pool even alone, or is longer than the
// plan's max_model_len.
SimReport simulate(cache::KvCacheManager& manager, const plan::CachePlan& plan, int num_spec_tokens,
                   const std::vector<TraceRequest>& trace, const SimOptions& options = {});
SimReport simulate(const plan::CachePlan& plan, int num_spec_tokens,
                   const std::vector<TraceRequest>& trace, const SimOptions& options = {});

nlohmann::json to_json(const SimReport& report);

// The usage series in long form, one row per (sample, group), with a header:
//   step,running,waiting,blocks_used,group,behaviour,block_size,blocks_held
// Column names and order are stable; new columns are only ever appended.
std::string to_csv(const SimReport& report);

}  // namespace mixkv::sim
