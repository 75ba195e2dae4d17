// A small, explicitly owned pool of worker threads for the CPU kernels: the caller creates it,
// passes it by pointer (AttentionInputs::pool) and destroys it; there is no global pool.
// parallel_for hands out task indices dynamically, so which worker runs a task varies from run to
// run; kernels keep results bit-identical by computing each output wholly inside one task, in an
// order fixed by the task alone. docs/kernels.md.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mixkv::kernels {

class ThreadPool {
 public:
  // `workers` threads of work in all, the calling thread included (so 1 starts no thread).
  // Throws Error unless workers >= 1.
  explicit ThreadPool(int workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return workers_; }

  // Runs task(i, worker) for every i in [0, count), worker in [0, size()) naming the thread (for
  // per-worker scratch), and returns when all are done. The calling thread works too. The first
  // exception a task throws is rethrown here after the others finish. Calls from several threads
  // take turns; a task must not call parallel_for on the same pool.
  void parallel_for(std::int64_t count,
                    const std::function<void(std::int64_t task, int worker)>& task);

 private:
  void work(int worker);
  void drain(int worker);

  int workers_ = 1;
  std::vector<std::thread> threads_;
  std::mutex call_mutex_;  // one parallel_for at a time
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  // Guarded by mutex_.
  std::uint64_t generation_ = 0;
  int busy_ = 0;
  bool stop_ = false;
  const std::function<void(std::int64_t, int)>* task_ = nullptr;
  std::int64_t count_ = 0;
  std::int64_t next_ = 0;
  std::exception_ptr error_;
};

}  // namespace mixkv::kernels
