// backoff: how a rank polls an unfinished operation: spin for a short window, then sleep in growing steps.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace zero::comm {

// A poll loop calls pause() after each poll that found the operation unfinished. During the first
// `spin` it returns at once (a peer that is a few microseconds late costs no wake-up latency); after
// that it sleeps, 20 us at first and twice as long each time up to `max_sleep`, so a rank waiting for
// a slow, stopped or unreachable peer costs almost no CPU while still polling often enough to
// notice completion (and to make progress for the MPI library) within max_sleep.
class backoff {
 public:
  backoff(std::chrono::microseconds spin, std::chrono::microseconds max_sleep)
      : spin_until_(std::chrono::steady_clock::now() + spin), max_sleep_(max_sleep) {}

  void pause() {
    if (!sleeping_) {
      if (std::chrono::steady_clock::now() < spin_until_) return;
      sleeping_ = true;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, max_sleep_);
  }
  bool sleeping() const { return sleeping_; }
  // The poll did work (it took long enough to have moved data): spin again, as at the start. A
  // transfer that needs this rank's polls to progress (MPI's copy-in/copy-out fragments) then runs
  // at full speed once the late peer has arrived.
  void progressed(std::chrono::microseconds spin) {
    spin_until_ = std::chrono::steady_clock::now() + spin;
    sleeping_ = false;
    sleep_ = std::chrono::microseconds(20);
  }

 private:
  std::chrono::steady_clock::time_point spin_until_;
  std::chrono::microseconds max_sleep_;
  std::chrono::microseconds sleep_{20};
  bool sleeping_ = false;
};

}  // namespace zero::comm
