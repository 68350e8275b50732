// flight_recorder: a rank's ring buffer of its last K collectives (fingerprint, start, end), printed when one fails.
#pragma once

#include <time.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "zero/comm/fingerprint.hpp"
#include "zero/core/fixed_text.hpp"

namespace zero::comm {

// CLOCK_MONOTONIC in nanoseconds: what steady_clock reads on Linux, and async-signal-safe.
inline std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The last `capacity` collectives of one rank, each with the time it started and ended (nanoseconds
// since `origin`; -1 while it has not ended). A collective that failed or never returned stays
// "not ended", which is how a report shows where a rank stopped. The storage is allocated once;
// begin() and end() take an uncontended lock (other threads read it in comm::threads). A signal
// handler, which must not lock, reads it with format_unlocked() and accepts a torn entry.
class flight_recorder {
 public:
  struct entry {
    fingerprint call;
    std::int64_t start_ns = 0, end_ns = -1;
  };

  explicit flight_recorder(std::size_t capacity = 8, std::int64_t origin_ns = monotonic_ns())
      : ring_(capacity > 0 ? capacity : 1), origin_(origin_ns) {}

  // Returns the entry's number (0, 1, ...), for end(number) when collectives overlap.
  std::uint64_t begin(const fingerprint& f) {
    std::lock_guard lk(m_);
    ring_[recorded_ % ring_.size()] = entry{f, now(), -1};
    return recorded_++;
  }
  // Ends the newest entry.
  void end() {
    std::lock_guard lk(m_);
    if (recorded_ > 0) ring_[(recorded_ - 1) % ring_.size()].end_ns = now();
  }
  // Ends entry `number` (a nonblocking collective completes after later ones started), unless the
  // ring has overwritten it since.
  void end(std::uint64_t number) {
    std::lock_guard lk(m_);
    if (number < recorded_ && recorded_ - number <= ring_.size()) ring_[number % ring_.size()].end_ns = now();
  }

  // Nanoseconds since the origin.
  std::int64_t now() const { return monotonic_ns() - origin_; }
  std::size_t capacity() const { return ring_.size(); }
  std::uint64_t recorded() const {
    std::lock_guard lk(m_);
    return recorded_;
  }
  // The newest entry (default-constructed when nothing was recorded).
  entry last() const {
    std::lock_guard lk(m_);
    return recorded_ ? ring_[(recorded_ - 1) % ring_.size()] : entry{};
  }
  bool in_collective() const {
    std::lock_guard lk(m_);
    return recorded_ && ring_[(recorded_ - 1) % ring_.size()].end_ns < 0;
  }

  // One line: "in #4 all_reduce(float x 100, sum) since +1.250000 s" or "not in a collective since
  // +1.240000 s (last: #3 barrier)" or "no collective yet".
  void format_status(fixed_text& t) const {
    std::lock_guard lk(m_);
    format_status_unlocked(t);
  }
  void format_status_unlocked(fixed_text& t) const {
    if (recorded_ == 0) {
      t << "no collective yet";
      return;
    }
    const entry& e = ring_[(recorded_ - 1) % ring_.size()];
    if (e.end_ns < 0) {
      t << "in ";
      e.call.format(t);
      t << " since +";
      t.seconds(e.start_ns, 6) << " s";
    } else {
      t << "not in a collective since +";
      t.seconds(e.end_ns, 6) << " s (last: ";
      e.call.format(t);
      t << ')';
    }
  }

  // The retained entries, oldest first, one per line, each line starting with `indent`.
  void format(fixed_text& t, const char* indent) const {
    std::lock_guard lk(m_);
    format_unlocked(t, indent);
  }
  void format_unlocked(fixed_text& t, const char* indent) const {
    const std::uint64_t n = recorded_ < ring_.size() ? recorded_ : ring_.size();
    for (std::uint64_t i = recorded_ - n; i < recorded_; ++i) {
      const entry& e = ring_[i % ring_.size()];
      t << indent;
      e.call.format(t);
      t << ": +";
      t.seconds(e.start_ns, 6);
      if (e.end_ns >= 0) {
        t << " to +";
        t.seconds(e.end_ns, 6) << " s";
      } else {
        t << " s, not ended";
      }
      t << '\n';
    }
  }

 private:
  mutable std::mutex m_;
  std::vector<entry> ring_;
  std::uint64_t recorded_ = 0;
  std::int64_t origin_;
};

}  // namespace zero::comm
