// offload::io_worker: one thread that runs a rank's file reads and writes in the order they are submitted, while the rank computes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace zero::offload {

// The disk tier's asynchronous I/O: submit() queues a job and returns its ticket; wait(ticket)
// returns once that job and every job before it has run, and rethrows the first exception any of
// them threw (a failed job poisons the queue: later jobs are skipped, since they may depend on it).
// One thread per engine that offloads to disk: it spends its time in pread/pwrite, blocked on the
// disk, not competing with the rank for a core. Jobs run strictly in submission order, so a read
// queued after a write of the same bytes sees them written.
class io_worker {
 public:
  io_worker() : thread_([this] { run(); }) {}
  io_worker(const io_worker&) = delete;
  io_worker& operator=(const io_worker&) = delete;
  // Finishes the queued jobs, then stops (their errors are dropped: nothing is left to report to).
  ~io_worker() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::uint64_t submit(std::function<void()> job) {
    std::lock_guard lock(m_);
    jobs_.push_back(std::move(job));
    cv_.notify_all();
    return ++submitted_;
  }
  void wait(std::uint64_t ticket) {
    std::unique_lock lock(m_);
    done_cv_.wait(lock, [&] { return done_ >= ticket || failure_; });
    if (failure_) std::rethrow_exception(failure_);
  }
  void wait_all() { wait(submitted()); }
  std::uint64_t submitted() const {
    std::lock_guard lock(m_);
    return submitted_;
  }
  // After a failure: clears it and the jobs not run, so the worker can serve a later attempt.
  void reset() {
    std::unique_lock lock(m_);
    done_cv_.wait(lock, [&] { return done_ + jobs_.size() == submitted_ && !running_; });
    jobs_.clear();
    done_ = submitted_;
    failure_ = nullptr;
  }

 private:
  void run() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      if (!failure_) {
        running_ = true;
        lock.unlock();
        std::exception_ptr e;
        try {
          job();
        } catch (...) {
          e = std::current_exception();
        }
        lock.lock();
        running_ = false;
        if (e && !failure_) failure_ = e;
      }
      ++done_;
      done_cv_.notify_all();
    }
  }

  mutable std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  std::uint64_t submitted_ = 0, done_ = 0;
  bool stop_ = false, running_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // last: started once everything it uses exists
};

}  // namespace zero::offload
