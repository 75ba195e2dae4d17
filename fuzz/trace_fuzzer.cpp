// libFuzzer entry point for the trace reader and the simulator: any bytes as a JSONL trace,
// simulated on a small plan of llama-3.1-8b (max_model_len 4096, a few hundred blocks, two
// speculative tokens). Each input must simulate or throw a mixkv::Error that is not kInternal,
// and a finished run must leave the manager's invariants whole; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "mixkv/core/error.hpp"
#include "mixkv/engine/simulate.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"

namespace {

struct Setup {
  mixkv::model::ModelDesc desc;
  mixkv::plan::CachePlan plan;
};

const Setup& setup() {
  static const Setup* s = [] {
    auto* out = new Setup;
    mixkv::model::DescribeOptions d;
    d.num_spec_tokens = 2;
    out->desc = mixkv::model::describe_refs("llama-3.1-8b", std::nullopt, d);
    mixkv::plan::PlanOptions o;
    o.max_model_len = 4096;
    o.request_len = 1024;
    o.memory_bytes = std::int64_t{1} << 30;  // ~1 GiB: a few hundred blocks of 16 tokens
    out->plan = mixkv::plan::make_plan(out->desc, o);
    return out;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Setup& s = setup();
  try {
    const auto trace = mixkv::sim::parse_trace(text, "fuzz.jsonl");
    mixkv::sim::SimOptions o;
    o.max_batch = 64;
    const mixkv::sim::SimReport r = mixkv::sim::simulate(s.plan, s.desc.num_spec_tokens, trace, o);
    if (!r.invariants.empty() || r.requests_finished != r.requests) {
      std::fprintf(stderr, "simulation broke the manager: %s (%lld of %lld finished)\n",
                   r.invariants.c_str(), static_cast<long long>(r.requests_finished),
                   static_cast<long long>(r.requests));
      std::abort();
    }
  } catch (const mixkv::Error& e) {
    if (e.code() == mixkv::ErrorCode::kInternal) {
      std::fprintf(stderr, "internal error: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
