// comm::detail::arrivals: per-rank rendezvous counters on separate cache lines, the lock-free fast path of a barrier.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace zero::comm::detail {

// Rank r's counter says how many rendezvous r has arrived at. Rendezvous number e (1, 2, ...) is
// complete when every counter is >= e; no counter runs further ahead, since a rank waits at each.
//
// Arriving is one store to the rank's own counter and waiting is reading the others': no lock, and
// at N = 2 one cache-line transfer each way. Each counter has a line pair to itself (128 bytes: x86
// fetches adjacent lines in pairs), so a rank's store never invalidates a line that another rank
// writes (no false sharing).
//
// All accesses are seq_cst: the store releases what the rank wrote before arriving (its
// announcement, its part of the collective) to the rank whose load sees it, and threads_world's
// parking relies on the total order (an arriving rank that finds no sleeper is seen by any rank
// that goes to sleep after it; see threads_world::park).
class arrivals {
 public:
  explicit arrivals(int n) : n_(n), lines_(std::make_unique<line[]>(static_cast<std::size_t>(n))) {}

  void arrive(int r, std::uint64_t e) { at(r).store(e, std::memory_order_seq_cst); }
  bool has_arrived(int r, std::uint64_t e) const { return at(r).load(std::memory_order_seq_cst) >= e; }
  bool complete(std::uint64_t e) const {
    for (int k = 0; k < n_; ++k)
      if (!has_arrived(k, e)) return false;
    return true;
  }
  int arrived(std::uint64_t e) const {
    int a = 0;
    for (int k = 0; k < n_; ++k) a += has_arrived(k, e) ? 1 : 0;
    return a;
  }

 private:
  struct alignas(128) line {
    std::atomic<std::uint64_t> count{0};
  };
  std::atomic<std::uint64_t>& at(int r) { return lines_[static_cast<std::size_t>(r)].count; }
  const std::atomic<std::uint64_t>& at(int r) const { return lines_[static_cast<std::size_t>(r)].count; }

  int n_;
  std::unique_ptr<line[]> lines_;
};

}  // namespace zero::comm::detail
