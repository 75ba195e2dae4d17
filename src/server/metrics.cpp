#include "metrics.hpp"

#include <fmt/format.h>
#include <prometheus/text_serializer.h>

#include "mixkv/model/model.hpp"

namespace mixkv::server {
namespace {

prometheus::Gauge* gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Counter* counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram* histogram(prometheus::Registry& r, const std::string& name,
                                 const std::string& help,
                                 const prometheus::Histogram::BucketBoundaries& buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  running = gauge(r, "mixkv:num_requests_running", "Requests in the running batch");
  waiting = gauge(r, "mixkv:num_requests_waiting", "Requests waiting to be admitted");
  kv_family_ = &prometheus::BuildGauge()
                    .Name("mixkv:kv_cache_usage_perc")
                    .Help("Fraction of the block pool a KV-cache group holds (0 to 1)")
                    .Register(r);
  prefix_queries = counter(r, "mixkv:prefix_cache_queries_total",
                           "Prompt tokens looked up in the prefix cache, at every admission");
  prefix_hits = counter(r, "mixkv:prefix_cache_hits_total",
                        "Prompt tokens the prefix cache served, at every admission");
  preemptions = counter(r, "mixkv:num_preemptions_total", "Requests preempted by recompute");
  drafts = counter(r, "mixkv:spec_decode_num_drafts_total", "Verify steps of a drafter");
  draft_tokens = counter(r, "mixkv:spec_decode_num_draft_tokens_total", "Draft tokens verified");
  accepted_tokens =
      counter(r, "mixkv:spec_decode_num_accepted_tokens_total", "Draft tokens accepted");
  per_pos_family_ = &prometheus::BuildCounter()
                         .Name("mixkv:spec_decode_num_accepted_tokens_per_pos_total")
                         .Help("Draft tokens accepted, per draft position (0: first)")
                         .Register(r);
  prompt_tokens = counter(r, "mixkv:prompt_tokens_total", "Prompt tokens of finished requests");
  generation_tokens =
      counter(r, "mixkv:generation_tokens_total", "Tokens generated for finished requests");
  const prometheus::Histogram::BucketBoundaries latency = {
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0};
  ttft = histogram(r, "mixkv:time_to_first_token_seconds",
                   "From a request's arrival to its first token", latency);
  itl = histogram(r, "mixkv:inter_token_latency_seconds",
                  "Between two steps that give a request tokens", latency);
  e2e = histogram(r, "mixkv:e2e_request_latency_seconds", "From arrival to the last token",
                  {0.01, 0.05, 0.1, 0.3, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120});
  failures_family_ = &prometheus::BuildCounter()
                          .Name("mixkv:kv_transfer_failures_total")
                          .Help("Remote prefills or KV pulls that failed, by reason")
                          .Register(r);
  transfer_bytes = counter(r, "mixkv:kv_transfer_bytes_total",
                           "KV bytes pulled from prefill instances (--kv-role decode)");
  transfer_latency = histogram(
      r, "mixkv:kv_transfer_latency_seconds",
      "One request's KV pull, from the fetch to the acknowledgement",
      {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0});
  transfer_held = gauge(r, "mixkv:kv_transfer_held_requests",
                        "Prefilled requests whose blocks wait for a decode side (--kv-role "
                        "prefill)");
}

prometheus::Counter& Metrics::transfer_failure(const std::string& reason) {
  return failures_family_->Add({{"reason", reason}});
}

void Metrics::add_groups(const plan::CachePlan& plan) {
  for (const plan::KvCacheGroup& g : plan.groups) {
    kv_usage.push_back(&kv_family_->Add(
        {{"group", std::to_string(g.id)}, {"kind", std::string(model::to_string(g.kind))}}));
  }
}

prometheus::Counter& Metrics::accepted_at(std::size_t position) {
  while (per_pos_.size() <= position) {
    per_pos_.push_back(&per_pos_family_->Add({{"position", std::to_string(per_pos_.size())}}));
  }
  return *per_pos_[position];
}

std::string Metrics::text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace mixkv::server
