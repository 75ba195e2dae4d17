// What handing work between threads costs on this machine, beside the model figures:
// - BM_CoreRoundTrip/cpus:0,1: two threads pinned to CPUs 0 and 1 hand one cache line back and
//   forth (kernels::cache_line_round_trip_ns), 2,000 round trips an iteration; the counter
//   round_trip_ns is one. It tells
//   where the machine put the two CPUs: on cores sharing an L3 a round trip takes tens of
//   nanoseconds, across dies or sockets hundreds. On a VM the host may move the vCPUs between the
//   two between runs, and a model step whose threads hand each other many lines (a verify's or a
//   batch's rows: BM_ModelForward) costs more on the far placement (docs/engine.md, "Twelfth
//   pass"). Skipped on one CPU or where threads cannot be pinned.
// - BM_PoolRegion/workers:2: one kernels::ThreadPool region of two empty tasks.
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

#include "mixkv/kernels/thread_pool.hpp"

namespace {

// Pins the calling thread to `cpu`; false where the system refuses.
bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

void BM_CoreRoundTrip(benchmark::State& state) {
  cpu_set_t before;
  if (pthread_getaffinity_np(pthread_self(), sizeof(before), &before) != 0 || !pin_to(0)) {
    state.SkipWithError("cannot pin this thread to CPU 0");
    return;
  }
  std::atomic<bool> partner_pinned{true};
  const auto pin_partner = [&] {
    if (!pin_to(1)) partner_pinned.store(false);
  };
  constexpr std::int64_t kTrips = 2000;
  double sum_ns = 0;
  for (auto _ : state) {
    const std::optional<double> ns =
        mixkv::kernels::cache_line_round_trip_ns(kTrips, std::chrono::seconds(1), pin_partner);
    if (!ns || !partner_pinned.load()) {
      state.SkipWithError(ns ? "cannot pin a thread to CPU 1"
                             : "no round trip measured (one CPU, or none answered within 1 s)");
      break;
    }
    sum_ns += *ns;
    // The timed trips' time, not the warm-up's nor the partner's start.
    state.SetIterationTime(*ns * 1e-9 * kTrips);
  }
  if (state.iterations() > 0) {
    state.counters["round_trip_ns"] = sum_ns / static_cast<double>(state.iterations());
  }
  pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
}

BENCHMARK(BM_CoreRoundTrip)->Name("BM_CoreRoundTrip/cpus:0,1")->UseManualTime()->Iterations(50);

// BM_PoolRegion/workers:2: one parallel region of two empty tasks, what a decode step pays a few
// hundred times beside its work (a layer opens about nine). Not pinned: the pool's threads sit
// where the system puts them, as in the engine.
void BM_PoolRegion(benchmark::State& state) {
  mixkv::kernels::ThreadPool pool(2);
  std::atomic<std::int64_t> sink{0};
  for (auto _ : state) {
    pool.parallel_for(2,
                      [&](std::int64_t i, int) { sink.fetch_add(i, std::memory_order_relaxed); });
  }
  benchmark::DoNotOptimize(sink.load());
}

BENCHMARK(BM_PoolRegion)->Name("BM_PoolRegion/workers:2")->UseRealTime();

}  // namespace
