// thread_pool: a rank's helper threads for the host's element-wise passes, each taking a contiguous range.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zero {

// engine_options::host_threads = T: the host's update pass over T threads, the calling thread and
// T - 1 helpers this pool owns (started with the engine, joined when it is destroyed). A pass of n
// elements is cut into at most T contiguous ranges of whole 64-byte lines of fp32 (multiples of 16
// elements), each of at least min_range_elements, the caller taking the first. An element-wise
// rule computes each element with the same operations whatever range it falls in (a range's tail
// runs lane by lane, with the bits of the packs), so the result does not depend on T. A rank's pool is
// its own: a run uses ranks x T threads in the update (with comm::threads, give each rank
// cores / ranks; under MPI, one process per rank, the cores of its slot).
class thread_pool {
 public:
  // Below this many elements a range is not worth a thread's wake-up (a few microseconds).
  static constexpr std::size_t min_range_elements = 1024;
  static constexpr std::size_t line_elements = 16;

  explicit thread_pool(int threads = 1) : threads_(std::max(threads, 1)) {
    for (int k = 1; k < threads_; ++k) helpers_.emplace_back([this, k] { serve(k); });
  }
  ~thread_pool() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : helpers_) t.join();
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int threads() const { return threads_; }

  // How [0, n) is cut: ranges of `chunk` elements (the last shorter), `parts` of them.
  struct split {
    std::size_t chunk = 0;
    int parts = 1;
  };
  static split split_of(std::size_t n, int threads) {
    const auto t = static_cast<std::size_t>(std::max(threads, 1));
    std::size_t chunk = (n + t - 1) / t;
    chunk = (chunk + line_elements - 1) / line_elements * line_elements;
    chunk = std::max(chunk, min_range_elements);
    if (n == 0) return {0, 1};
    return {chunk, static_cast<int>((n + chunk - 1) / chunk)};
  }

  // Calls f(begin, end) for the ranges of [0, n), the first on the calling thread, and returns when
  // all are done; an exception thrown by a range is rethrown here (the first one).
  template <class F>
  void run(std::size_t n, F&& f) {
    const split s = split_of(n, threads_);
    if (s.parts <= 1) {
      f(std::size_t{0}, n);
      return;
    }
    const std::function<void(std::size_t, std::size_t)> task = [&](std::size_t b, std::size_t e) { f(b, e); };
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      n_ = n;
      split_ = s;
      pending_ = s.parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      f(std::size_t{0}, std::min(n, s.chunk));
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Helper k takes range k of each pass that has one.
  void serve(int k) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (k >= split_.parts) continue;
      const auto* task = task_;
      const std::size_t begin = static_cast<std::size_t>(k) * split_.chunk;
      const std::size_t end = std::min(n_, begin + split_.chunk);
      lock.unlock();
      std::exception_ptr failed;
      try {
        (*task)(begin, end);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed && !error_) error_ = failed;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const int threads_;
  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t, std::size_t)>* task_ = nullptr;
  std::size_t n_ = 0;
  split split_{};
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
};

}  // namespace zero
