#include "mixkv/kernels/thread_pool.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::kernels {

ThreadPool::ThreadPool(int workers) : workers_(workers) {
  if (workers < 1) {
    throw_invalid(fmt::format("thread pool: {} workers asked for; give at least 1", workers));
  }
  threads_.reserve(static_cast<std::size_t>(workers - 1));
  for (int w = 1; w < workers; ++w) threads_.emplace_back([this, w] { work(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : threads_) t.join();
}

// Takes task indices until none is left. Tasks are handed out one at a time under the lock: the
// kernels' tasks are large (a request's query block over a range of heads), so the lock is cheap.
void ThreadPool::drain(int worker) {
  std::unique_lock lock(mutex_);
  while (next_ < count_) {
    const std::int64_t i = next_++;
    const auto* task = task_;
    lock.unlock();
    try {
      (*task)(i, worker);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      next_ = count_;  // skip what is left
      continue;
    }
    lock.lock();
  }
}

void ThreadPool::work(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++busy_;
    }
    drain(worker);
    {
      std::lock_guard lock(mutex_);
      --busy_;
    }
    done_.notify_one();
  }
}

void ThreadPool::parallel_for(std::int64_t count,
                              const std::function<void(std::int64_t, int)>& task) {
  if (count <= 0) return;
  std::lock_guard call(call_mutex_);
  if (threads_.empty() || count == 1) {
    for (std::int64_t i = 0; i < count; ++i) task(i, 0);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    task_ = &task;
    count_ = count;
    next_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  start_.notify_all();
  drain(0);
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    // Workers that woke late find nothing left and leave at once; wait for those still running.
    done_.wait(lock, [&] { return busy_ == 0 && next_ >= count_; });
    task_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace mixkv::kernels
