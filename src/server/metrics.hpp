// The server's Prometheus metrics (prometheus-cpp's core registry, text format), named after
// vLLM's with the prefix `mixkv:`. The engine thread updates them after every step; /metrics
// serialises the registry. docs/server.md lists them.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <string>
#include <vector>

#include "mixkv/plan/plan.hpp"

namespace mixkv::server {

class Metrics {
 public:
  Metrics();
  // One kv_cache_usage_perc series per KV-cache group of `plan` (labels group, kind).
  void add_groups(const plan::CachePlan& plan);
  // The accepted-token counter of draft position `position`, made on first use.
  prometheus::Counter& accepted_at(std::size_t position);
  // P/D: the failure counter of one reason (transfer::FailureReason's name), made on first use.
  prometheus::Counter& transfer_failure(const std::string& reason);
  std::string text() const;

  prometheus::Gauge* running = nullptr;
  prometheus::Gauge* waiting = nullptr;
  std::vector<prometheus::Gauge*> kv_usage;  // per KV-cache group
  prometheus::Counter* prefix_queries = nullptr;
  prometheus::Counter* prefix_hits = nullptr;
  prometheus::Counter* preemptions = nullptr;
  prometheus::Counter* drafts = nullptr;
  prometheus::Counter* draft_tokens = nullptr;
  prometheus::Counter* accepted_tokens = nullptr;
  prometheus::Counter* prompt_tokens = nullptr;
  prometheus::Counter* generation_tokens = nullptr;
  prometheus::Histogram* ttft = nullptr;
  prometheus::Histogram* itl = nullptr;
  prometheus::Histogram* e2e = nullptr;
  // P/D disaggregation (--kv-role).
  prometheus::Counter* transfer_bytes = nullptr;      // pulled into this instance
  prometheus::Histogram* transfer_latency = nullptr;  // a pull, fetch to acknowledgement
  prometheus::Gauge* transfer_held = nullptr;         // prefill: requests pinned for readers

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* kv_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* per_pos_family_ = nullptr;
  std::vector<prometheus::Counter*> per_pos_;
  prometheus::Family<prometheus::Counter>* failures_family_ = nullptr;
};

}  // namespace mixkv::server
