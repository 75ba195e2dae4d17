// The run-time manager's per-step cost: one speculative decode step (allocate one token plus 4
// look-ahead, commit the token and one accepted draft) for every running request, and admission
// of requests sharing a 1,024-token prefix, hashing included.
#include <benchmark/benchmark.h>

#include <chrono>
#include <numeric>
#include <vector>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/model/describe.hpp"

namespace {

using namespace mixkv;

plan::CachePlan plan_for(std::string_view target, std::optional<std::string_view> draft,
                         std::int64_t blocks) {
  model::DescribeOptions d;
  d.num_spec_tokens = 4;
  const auto desc = model::describe_refs(target, draft, d);
  plan::PlanOptions o;
  o.policy = plan::Policy::kVllm;
  o.max_model_len = 4096;
  o.memory_bytes = std::int64_t{8} << 30;
  o.memory_bytes = plan::make_plan(desc, o).block_unit_bytes * blocks;
  return plan::make_plan(desc, o);
}

std::vector<cache::TokenId> prompt(std::int64_t n, cache::TokenId start) {
  std::vector<cache::TokenId> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

void decode_steps(benchmark::State& state, std::string_view target) {
  const std::int64_t requests = state.range(0);
  // Room for every request to grow by a few hundred tokens during the run.
  const auto plan = plan_for(target, std::nullopt, requests * 160 + 64);
  cache::KvCacheManager m(plan, 4);
  for (std::int64_t i = 0; i < requests; ++i) {
    const cache::RequestId id{i};
    m.add_request(id, prompt(1000, static_cast<cache::TokenId>(i * 5000)));
    if (!m.admit(id, 4)) state.SkipWithError("admission failed");
    m.commit(id, 1000, std::vector<cache::TokenId>{1});
  }
  const std::vector<cache::TokenId> out = {2, 3};
  std::int64_t steps = 0;
  for (auto _ : state) {
    for (std::int64_t i = 0; i < requests; ++i) {
      const cache::RequestId id{i};
      if (!m.allocate(id, 1, 4)) {
        state.SkipWithError("pool exhausted");
        break;
      }
      m.commit(id, 2, out, 1);
    }
    steps += requests;
    if (steps > requests * 600) {
      state.SkipWithError("ran longer than the pool allows");
      break;
    }
  }
  // Seconds per request-step (printed with its SI prefix: 40n = 40 ns).
  state.counters["ns_per_request_step"] = benchmark::Counter(
      static_cast<double>(requests),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_DecodeStep(benchmark::State& state) { decode_steps(state, "llama-3.1-8b"); }
BENCHMARK(BM_DecodeStep)
    ->Arg(256)
    ->Arg(1024)
    ->Arg(10000)
    ->Iterations(200)
    ->Unit(benchmark::kMicrosecond);

void BM_DecodeStepFullPlusSliding(benchmark::State& state) { decode_steps(state, "gpt-oss-20b"); }
BENCHMARK(BM_DecodeStepFullPlusSliding)->Arg(256)->Iterations(200)->Unit(benchmark::kMicrosecond);

void BM_DecodeStepRecurrentHybrid(benchmark::State& state) {
  decode_steps(state, "qwen3-next-80b-a3b");
}
BENCHMARK(BM_DecodeStepRecurrentHybrid)->Arg(256)->Iterations(200)->Unit(benchmark::kMicrosecond);

// llama-3.1-8b (4 look-ahead slots) whose request 0 has computed a 1,100-token prompt, so the
// first 1,024 tokens of prompt(1100, 1) are in the prefix cache.
cache::KvCacheManager manager_with_cached_prompt(benchmark::State& state) {
  cache::KvCacheManager m(plan_for("llama-3.1-8b", std::nullopt, 4096), 4);
  m.add_request(cache::RequestId{0}, prompt(1100, 1));
  if (!m.admit(cache::RequestId{0}, 4)) state.SkipWithError("admission failed");
  m.commit(cache::RequestId{0}, 1100, std::vector<cache::TokenId>{1});
  return m;
}

// Admit a request whose 1,024-token prefix is cached, then free it.
void BM_AdmitSharedPrefix(benchmark::State& state) {
  cache::KvCacheManager m = manager_with_cached_prompt(state);
  auto shared = prompt(1100, 1);
  std::int64_t id = 1;
  for (auto _ : state) {
    m.add_request(cache::RequestId{id}, shared);
    auto hit = m.admit(cache::RequestId{id}, 4);
    benchmark::DoNotOptimize(hit);
    m.free(cache::RequestId{id});
    ++id;
  }
  state.counters["hit_tokens"] = static_cast<double>(m.find_prefix_hit(cache::RequestId{0}));
}
BENCHMARK(BM_AdmitSharedPrefix)->Unit(benchmark::kMicrosecond);

// Free one request that holds a 1,100-token prompt (its 1,024-token prefix shared) plus look-ahead:
// only the free() call is timed.
void BM_FreeRequest(benchmark::State& state) {
  cache::KvCacheManager m = manager_with_cached_prompt(state);
  auto shared = prompt(1100, 1);
  std::int64_t id = 1;
  for (auto _ : state) {
    m.add_request(cache::RequestId{id}, shared);
    if (!m.admit(cache::RequestId{id}, 4)) state.SkipWithError("admission failed");
    const auto t0 = std::chrono::steady_clock::now();
    m.free(cache::RequestId{id});
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ++id;
  }
  state.counters["blocks_per_request"] =
      static_cast<double>(m.block_table(cache::RequestId{0}, 0).size());
}
BENCHMARK(BM_FreeRequest)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Host bytes of manager state per block of the decode-step benchmark's pool (1,024 requests).
void BM_MetadataPerBlock(benchmark::State& state) {
  const auto plan = plan_for("llama-3.1-8b", std::nullopt, 1024 * 160 + 64);
  cache::KvCacheManager m(plan, 4);
  for (auto _ : state) benchmark::DoNotOptimize(m.pool().metadata_bytes_per_block());
  state.counters["metadata_bytes_per_block"] = m.pool().metadata_bytes_per_block();
}
BENCHMARK(BM_MetadataPerBlock)->Iterations(1);

}  // namespace
