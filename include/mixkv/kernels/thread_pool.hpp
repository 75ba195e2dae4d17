// A small, explicitly owned pool of worker threads for the CPU kernels: the caller creates it,
// passes it by pointer (AttentionInputs::pool) and destroys it; there is no global pool.
// parallel_for hands out task indices dynamically, so which worker runs a task varies from run to
// run; kernels keep results bit-identical by computing each output wholly inside one task, in an
// order fixed by the task alone. A decode step starts a few hundred parallel regions, so the
// hand-off is an atomic store that spinning workers see within a microsecond; idle workers stop
// spinning after kSpinMicros and sleep until the next region. docs/kernels.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace mixkv::kernels {

class ThreadPool {
 public:
  using Task = std::function<void(std::int64_t task, int worker)>;
  // How long a worker with nothing to do keeps polling for the next region before it sleeps:
  // long enough to bridge the single-threaded steps between the regions of a forward and between
  // decode steps, short enough that an idle engine gives its cores back at once.
  static constexpr std::int64_t kSpinMicros = 1000;
  // After this long the polling worker yields its core between looks, so that on a machine with
  // more runnable threads than cores it does not hold one the caller needs.
  static constexpr std::int64_t kYieldAfterMicros = 50;

  // `workers` threads of work in all, the calling thread included (so 1 starts no thread).
  // Throws Error unless workers >= 1.
  explicit ThreadPool(int workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return workers_; }

  // Runs task(i, worker) for every i in [0, count), worker in [0, size()) naming the thread (for
  // per-worker scratch), and returns when all are done. The calling thread works too. The first
  // exception a task throws is rethrown here after the others finish (tasks not yet started are
  // skipped). Calls from several threads take turns; a task must not call parallel_for on the
  // same pool.
  void parallel_for(std::int64_t count, const Task& task);
  // Two phases in one region: first(i, worker) for every i in [0, first_count), then
  // task(i, worker) for every i in [0, count). Each thread in the region claims first's indices
  // while any is left, waits until every one of them is done (by whichever thread), then claims
  // task's: the second phase needs no hand-off of its own (a matrix product whose x is quantised
  // by both threads first). The wait cannot deadlock: it waits only for indices other threads
  // are running. Errors as parallel_for's; one thrown in the first phase skips the second.
  void parallel_for(std::int64_t first_count, const Task& first, std::int64_t count,
                    const Task& task);

  // Regions that found every worker asleep and had to wake it (tests and profiling).
  std::uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }

 private:
  void work(int worker);
  bool run_task(const Task& fn, std::int64_t i, int worker);
  void drain(int worker);
  void wait_for_region(std::uint64_t seen);

  int workers_ = 1;
  std::vector<std::thread> threads_;
  std::mutex call_mutex_;  // one parallel_for at a time

  // The region word: generation << 32 | busy workers << 1 | open. A worker joins the current
  // region by a compare-exchange that needs it open and adds one to busy; the caller closes it
  // (clears open) once busy is 0, so no worker can still be reading the region's task when the
  // next region is set up.
  std::atomic<std::uint64_t> region_{0};
  // The region's phases, read by workers only after they joined it (first_count_ 0: one phase).
  const Task* first_ = nullptr;
  std::int64_t first_count_ = 0;
  const Task* task_ = nullptr;
  std::int64_t count_ = 0;
  alignas(64) std::atomic<std::int64_t> next_first_{0};  // the first phase's next index
  std::atomic<std::int64_t> done_first_{0};              // its indices finished
  alignas(64) std::atomic<std::int64_t> next_{0};        // the next task index to claim
  // Sleeping workers wait on wake_ (a futex word) and count themselves in sleepers_, so the
  // caller makes the wake-up system call only when someone sleeps.
  alignas(64) std::atomic<std::uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> wakeups_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;  // guarded by error_mutex_
};

// The mean time in ns for a cache line to go from the calling thread to a second thread and
// back, both spinning on it, over `trips` round trips (after as many again to start), or fewer
// where `budget` runs out first (two threads sharing one CPU take a time slice a trip). It tells
// where the system put two threads that will share a step's work: on cores sharing an L3 tens of
// ns, across dies or sockets hundreds, and a step whose threads hand each other many lines costs
// more on the far placement (docs/engine.md, "Twelfth pass"). `partner_start` runs first on the
// second thread (a benchmark pins it). Nothing with fewer than two CPUs.
std::optional<double> cache_line_round_trip_ns(
    std::int64_t trips, std::chrono::nanoseconds budget = std::chrono::milliseconds(20),
    const std::function<void()>& partner_start = {});

}  // namespace mixkv::kernels
