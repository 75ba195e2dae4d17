#include "mixkv/kernels/thread_pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "mixkv/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mixkv::kernels {
namespace {

// The region word's fields (ThreadPool::region_).
constexpr std::uint64_t kOpen = 1;
constexpr std::uint64_t kBusy = 2;
constexpr int kGenerationShift = 32;

std::uint64_t generation(std::uint64_t word) { return word >> kGenerationShift; }
std::uint64_t busy(std::uint64_t word) { return (word & 0xFFFFFFFFu) >> 1; }

// One polling step: tells the core that this is a spin loop (it yields the pipeline to the other
// hyper-thread and saves power) without giving up the time slice.
void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// One step of a wait on another thread's task: polling, and past a few microseconds (a thread
// descheduled in the middle of a task, on a machine with more threads than cores) giving it the
// core rather than burning the time slice.
void wait_step(std::uint32_t spins) {
  if (spins > 256) {
    std::this_thread::yield();
  } else {
    relax();
  }
}

}  // namespace

ThreadPool::ThreadPool(int workers) : workers_(workers) {
  if (workers < 1) {
    throw_invalid(fmt::format("thread pool: {} workers asked for; give at least 1", workers));
  }
  threads_.reserve(static_cast<std::size_t>(workers - 1));
  for (int w = 1; w < workers; ++w) threads_.emplace_back([this, w] { work(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard call(call_mutex_);
    stop_.store(true, std::memory_order_seq_cst);
    const std::uint64_t word = region_.load(std::memory_order_relaxed);
    region_.store((generation(word) + 1) << kGenerationShift, std::memory_order_seq_cst);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    wake_.notify_all();
  }
  for (auto& t : threads_) t.join();
}

// Runs fn(i, worker); false, with the region's first error kept, if it threw.
bool ThreadPool::run_task(const Task& fn, std::int64_t i, int worker) {
  try {
    fn(i, worker);
    return true;
  } catch (...) {
    std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
    return false;
  }
}

// Claims task indices until none is left, the first phase's before the second's. One atomic
// increment per task: tasks may be small (a few rows of a weight). The thread that ran the last
// index leaves without asking again: the counter's line sits in the other thread's cache by then,
// and the region's close waits on that round trip (~400 ns when the host puts the two vCPUs on
// different dies).
void ThreadPool::drain(int worker) {
  if (first_count_ > 0) {
    for (;;) {
      const std::int64_t i = next_first_.fetch_add(1, std::memory_order_relaxed);
      if (i >= first_count_) break;
      // A first-phase error skips the second phase (published by done_first_ below).
      if (!run_task(*first_, i, worker)) next_.store(count_, std::memory_order_relaxed);
      done_first_.fetch_add(1, std::memory_order_release);
      if (i + 1 >= first_count_) break;
    }
    // Every index is claimed: the ones left are running on other threads.
    for (std::uint32_t spins = 1; done_first_.load(std::memory_order_acquire) < first_count_;
         ++spins) {
      wait_step(spins);
    }
  }
  for (;;) {
    const std::int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= count_) return;
    if (!run_task(*task_, i, worker))
      next_.store(count_, std::memory_order_relaxed);  // skip the rest
    if (i + 1 >= count_) return;
  }
}

// Returns once the region word's generation differs from `seen` (or the pool stops): polling for
// kSpinMicros, then asleep on wake_. The sleeper counts itself before its last look at the word
// and the caller publishes the word before it reads the count (all sequentially consistent), so
// either the sleeper sees the new region or the caller sees the sleeper and wakes it.
void ThreadPool::wait_for_region(std::uint64_t seen) {
  const auto changed = [&] {
    return generation(region_.load(std::memory_order_seq_cst)) != seen ||
           stop_.load(std::memory_order_relaxed);
  };
  // Polling: on the core alone for the first kYieldAfterMicros (the gaps inside a forward), then
  // offering the core to other runnable threads between looks (on a machine with more threads
  // than cores the thread that will start the next region may be waiting for this very core).
  const auto start = std::chrono::steady_clock::now();
  bool yielding = false;
  for (std::uint32_t i = 1;; ++i) {
    if (changed()) return;
    if (yielding) {
      std::this_thread::yield();
    } else {
      relax();
    }
    if (yielding || i % 64 == 0) {
      const auto spent = std::chrono::steady_clock::now() - start;
      if (spent > std::chrono::microseconds(kSpinMicros)) break;
      yielding = spent > std::chrono::microseconds(kYieldAfterMicros);
    }
  }
  for (;;) {
    const std::uint32_t ticket = wake_.load(std::memory_order_seq_cst);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (changed()) {
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    wake_.wait(ticket, std::memory_order_seq_cst);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void ThreadPool::work(int worker) {
  std::uint64_t seen = 0;  // the generation the pool starts at (closed)
  for (;;) {
    wait_for_region(seen);
    if (stop_.load(std::memory_order_relaxed)) return;
    std::uint64_t word = region_.load(std::memory_order_acquire);
    seen = generation(word);
    // Join while the region is open; one that closed already (all its tasks done by others) is
    // skipped.
    bool joined = false;
    while ((word & kOpen) != 0 && generation(word) == seen) {
      if (region_.compare_exchange_weak(word, word + kBusy, std::memory_order_acquire,
                                        std::memory_order_acquire)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    drain(worker);
    region_.fetch_sub(kBusy, std::memory_order_release);
  }
}

void ThreadPool::parallel_for(std::int64_t count, const Task& task) {
  static const Task kNone;
  parallel_for(0, kNone, count, task);
}

void ThreadPool::parallel_for(std::int64_t first_count, const Task& first, std::int64_t count,
                              const Task& task) {
  first_count = std::max<std::int64_t>(first_count, 0);
  count = std::max<std::int64_t>(count, 0);
  if (first_count == 0 && count == 0) return;
  std::lock_guard call(call_mutex_);
  if (threads_.empty() || (first_count <= 1 && count <= 1)) {
    for (std::int64_t i = 0; i < first_count; ++i) first(i, 0);
    for (std::int64_t i = 0; i < count; ++i) task(i, 0);
    return;
  }
  // The region is closed and no worker is inside it: its fields are the caller's to set.
  first_ = &first;
  first_count_ = first_count;
  next_first_.store(0, std::memory_order_relaxed);
  done_first_.store(0, std::memory_order_relaxed);
  task_ = &task;
  count_ = count;
  next_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  std::uint64_t word = region_.load(std::memory_order_relaxed);
  region_.store(((generation(word) + 1) << kGenerationShift) | kOpen, std::memory_order_seq_cst);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    wake_.notify_all();
  }
  drain(0);
  // Every task is claimed; those a worker holds are done when it leaves. Close the region once
  // no worker is inside (a worker that has not joined yet then finds it closed).
  for (std::uint32_t spins = 1;; ++spins) {
    word = region_.load(std::memory_order_acquire);
    if (busy(word) == 0 &&
        region_.compare_exchange_weak(word, word & ~kOpen, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      break;
    }
    wait_step(spins);
  }
  first_ = task_ = nullptr;
  if (std::exception_ptr error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
}

std::optional<double> cache_line_round_trip_ns(std::int64_t trips, std::chrono::nanoseconds budget,
                                               const std::function<void()>& partner_start) {
  if (std::thread::hardware_concurrency() < 2 || trips < 1) return std::nullopt;
  // The calling thread writes odd values and the partner even ones; -1 sends the partner home.
  alignas(64) std::atomic<std::int64_t> line{0};
  std::thread partner([&] {
    if (partner_start) partner_start();
    for (std::int64_t expected = 1;; expected += 2) {
      for (std::int64_t v = line.load(std::memory_order_acquire); v != expected;
           v = line.load(std::memory_order_acquire)) {
        if (v < 0) return;
      }
      line.store(expected + 1, std::memory_order_release);
    }
  });
  const auto start = std::chrono::steady_clock::now();
  std::int64_t next = 1;
  // `count` round trips from `next` on; false once the budget (from `start`) is spent.
  const auto trip = [&](std::int64_t count, std::int64_t& done) {
    for (done = 0; done < count;) {
      line.store(next, std::memory_order_release);
      while (line.load(std::memory_order_acquire) != next + 1) {
      }
      next += 2;
      ++done;
      if (done % 16 == 0 && std::chrono::steady_clock::now() - start > budget) return false;
    }
    return true;
  };
  std::int64_t warm = 0, timed = 0;
  std::optional<double> mean;
  if (trip(trips, warm)) {
    const auto t0 = std::chrono::steady_clock::now();
    trip(trips, timed);
    const std::chrono::duration<double, std::nano> spent = std::chrono::steady_clock::now() - t0;
    if (timed > 0) mean = spent.count() / static_cast<double>(timed);
  }
  line.store(-1, std::memory_order_release);
  partner.join();
  return mean;
}

}  // namespace mixkv::kernels
