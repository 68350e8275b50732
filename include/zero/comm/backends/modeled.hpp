// comm::modeled<C>: a CommBackend decorator that makes each collective take alpha + bytes / beta on the host clock.
#pragma once

// On one machine the ranks' data moves through memory in microseconds, so communication hides
// nothing and overlap cannot show. This decorator gives every collective the duration it would have
// on a link of a chosen latency (alpha) and bandwidth (beta), deterministically: the inner backend
// moves the data (results are the inner backend's, bit for bit), then the call is held until the
// link model says it ends.
//
// The model, per rank (the link is this rank's port, a serial resource):
//   bytes  = bus_bytes(c, buffer, N) of comm/counted.hpp: what the rank sends under the ring
//            algorithms, (N-1)/N of the buffer for reduce_scatter and all_gather, 2(N-1)/N for
//            all_reduce, the buffer for broadcast, 0 for barrier. The same formula comm::counted
//            uses, so the modeled bytes of the engine's protocol calls are the traffic it reports.
//   cost   = alpha + bytes / beta when N > 1; 0 when N == 1 (one rank has no link). alpha is per
//            collective (the start-up of one call), not per ring hop.
//   start  = max(ready, link_free_at): ready is when the inner call returned (every rank had
//            arrived and the data had moved), and a collective starts no earlier than the previous
//            one's modeled end, the link being busy until then.
//   end    = start + cost; link_free_at = end; the call returns at end (or when the inner call
//            returned, if that is later).
// The memory time of the inner call is not part of the model; it adds to the wall time (it is
// microseconds next to the modeled milliseconds that are the point of the model).
//
// The wait sleeps for the bulk and spins for the last spin_margin, so a held call does not burn a
// core and ends close to its modeled end: tens of microseconds late on an idle machine, about 0.5 ms
// on 2 cores with a load average of 13 (the scheduler's wake-up latency). The spin does not yield:
// under load a yield hands the core away for a whole time slice (measured: 5 ms late per call).

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/counted.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/error.hpp"

namespace zero::comm {

// A link of latency alpha (seconds per collective) and bandwidth beta (bytes per second).
struct link_model {
  double latency_s = 0;                                             // alpha, >= 0
  double bytes_per_s = std::numeric_limits<double>::infinity();     // beta, > 0; infinity: no bandwidth term

  // From the units a user gives: latency in microseconds, bandwidth in GB/s (1e9 bytes per second).
  static link_model of(double latency_us, double gbps) {
    if (!(std::isfinite(latency_us) && latency_us >= 0))
      fail(error_kind::invalid_argument, "link model: the latency must be a finite number of microseconds >= 0, got ",
           latency_us);
    if (!(gbps > 0))  // infinity is allowed: latency only
      fail(error_kind::invalid_argument, "link model: the bandwidth must be > 0 GB/s, got ", gbps);
    return link_model{latency_us * 1e-6, gbps * 1e9};
  }
  // No latency and infinite bandwidth: a pass-through, calls are timed but never held.
  bool enabled() const { return latency_s > 0 || std::isfinite(bytes_per_s); }
  // The modeled duration of a collective that sends `bytes` on a link shared by `ranks` ranks.
  double seconds(std::uint64_t bytes, int ranks) const {
    if (ranks <= 1 || !enabled()) return 0.0;
    return latency_s + static_cast<double>(bytes) / bytes_per_s;
  }
};

// What a rank's collectives cost, since construction or reset().
struct link_stats {
  std::uint64_t calls = 0;  // collectives and barriers
  std::uint64_t bytes = 0;  // bus bytes sent, the model's `bytes`
  double modeled_s = 0;     // sum of the modeled costs
  double waited_s = 0;      // time calls were held past the inner call's return to reach their modeled end
  double blocked_s = 0;     // wall time inside the calls (inner call and hold), link modeled or not
};

template <CommBackend C>
class modeled {
 public:
  using system = typename C::system;
  using clock = std::chrono::steady_clock;
  // The last part of a hold is spun rather than slept: a sleep overshoots by tens of microseconds,
  // a spin of this length costs little.
  static constexpr std::chrono::microseconds spin_margin{100};

  // Wraps `inner` by reference. A default link_model is a pass-through: calls are only timed.
  explicit modeled(C& inner, link_model link = {}) : inner_(&inner), link_(link) {}

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  C& inner() const { return *inner_; }
  const link_model& link() const { return link_; }
  const link_stats& stats() const { return stats_; }
  void reset() { stats_ = {}; }
  // The modeled end of the last collective: the link is busy until then.
  clock::time_point link_free_at() const { return link_free_at_; }

  // Forwards the optional members of the wrapped backend (concepts/comm_backend.hpp).
  call_label set_call_label(call_label l) requires labels_calls<C> { return inner_->set_call_label(l); }
  auto make_system() const requires requires(const C& c) { c.make_system(); } { return inner_->make_system(); }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    run(collective::all_reduce, count * sizeof(T), [&] { inner_->all_reduce(send, recv, count, op); });
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    run(collective::reduce_scatter, count * sizeof(T) * static_cast<std::size_t>(size()),
        [&] { inner_->reduce_scatter(send, recv, count, op); });
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    run(collective::all_gather, count * sizeof(T) * static_cast<std::size_t>(size()),
        [&] { inner_->all_gather(send, recv, count); });
  }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    run(collective::broadcast, count * sizeof(T), [&] { inner_->broadcast(send, recv, count, root); });
  }
  // A barrier sends nothing: it costs alpha.
  void barrier() { timed(0, [&] { inner_->barrier(); }); }
  // Where the wrapped backend has it (comm/all_to_all.hpp): (N-1)/N of the N x count buffer.
  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count)
    requires has_all_to_all<C>
  {
    run(collective::all_to_all, count * sizeof(T) * static_cast<std::size_t>(size()),
        [&] { inner_->all_to_all(send, recv, count); });
  }
  // A split (comm/split.hpp) of the wrapped backend, over a link of the same model: each
  // sub-communicator's collectives book a link of their own.
  std::unique_ptr<modeled> split(int color)
    requires splittable<C>
  {
    std::unique_ptr<C> part = inner_->split(color);
    auto out = std::make_unique<modeled>(*part, link_);
    out->owned_ = std::move(part);
    return out;
  }

  // The bus bytes and modeled seconds of a collective over a buffer of `buffer_bytes` (the larger
  // side: size() * count elements for reduce_scatter and all_gather).
  std::uint64_t bytes_of(collective c, std::uint64_t buffer_bytes) const { return bus_bytes(c, buffer_bytes, size()); }
  double cost_of(collective c, std::uint64_t buffer_bytes) const {
    return link_.seconds(bytes_of(c, buffer_bytes), size());
  }

  // The two halves of a modeled call, public so that a caller which starts a collective and waits
  // for it later can use the same link: reserve() books `cost_s` seconds of the link from
  // max(ready, link_free_at()) and returns the modeled end; wait_until() holds the calling thread
  // until then and counts the time as waited.
  clock::time_point reserve(double cost_s, clock::time_point ready) {
    const clock::time_point start = ready > link_free_at_ ? ready : link_free_at_;
    link_free_at_ = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(cost_s));
    stats_.modeled_s += cost_s;
    return link_free_at_;
  }
  void wait_until(clock::time_point end) {
    const clock::time_point t0 = clock::now();
    if (t0 >= end) return;
    if (end - t0 > spin_margin) std::this_thread::sleep_until(end - spin_margin);
    while (clock::now() < end) {
    }
    stats_.waited_s += std::chrono::duration<double>(clock::now() - t0).count();
  }

  // Nonblocking calls (comm/nonblocking.hpp): the inner backend moves the data at start, as the
  // blocking call does; the link is booked from then, and wait() holds the caller until the booked
  // end, so that the caller computes while the modeled transfer runs (overlap, measured on a CPU).
  struct request {
    clock::time_point end{};
  };
  template <class T>
  request start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    return started(collective::all_reduce, count * sizeof(T), [&] { inner_->all_reduce(send, recv, count, op); });
  }
  template <class T>
  request start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    return started(collective::reduce_scatter, count * sizeof(T) * static_cast<std::size_t>(size()),
                   [&] { inner_->reduce_scatter(send, recv, count, op); });
  }
  template <class T>
  request start_all_gather(const T* send, T* recv, std::size_t count) {
    return started(collective::all_gather, count * sizeof(T) * static_cast<std::size_t>(size()),
                   [&] { inner_->all_gather(send, recv, count); });
  }
  template <class T>
  request start_all_to_all(const T* send, T* recv, std::size_t count)
    requires has_all_to_all<C>
  {
    return started(collective::all_to_all, count * sizeof(T) * static_cast<std::size_t>(size()),
                   [&] { inner_->all_to_all(send, recv, count); });
  }
  void wait(request& r) {
    const clock::time_point t0 = clock::now();
    wait_until(r.end);
    r.end = {};
    stats_.blocked_s += std::chrono::duration<double>(clock::now() - t0).count();
  }

 private:
  template <class F>
  request started(collective c, std::uint64_t buffer_bytes, F&& call) {
    const clock::time_point t0 = clock::now();
    const std::uint64_t bytes = bytes_of(c, buffer_bytes);
    call();
    stats_.calls += 1;
    stats_.bytes += bytes;
    request r;
    if (link_.enabled() && size() > 1) r.end = reserve(link_.seconds(bytes, size()), clock::now());
    stats_.blocked_s += std::chrono::duration<double>(clock::now() - t0).count();
    return r;
  }
  template <class F>
  void run(collective c, std::uint64_t buffer_bytes, F&& call) {
    timed(bytes_of(c, buffer_bytes), call);
  }
  // The inner call, then the hold to its modeled end; a call that throws is not held.
  template <class F>
  void timed(std::uint64_t bytes, F&& call) {
    const clock::time_point t0 = clock::now();
    call();
    stats_.calls += 1;
    stats_.bytes += bytes;
    if (link_.enabled() && size() > 1) wait_until(reserve(link_.seconds(bytes, size()), clock::now()));
    stats_.blocked_s += std::chrono::duration<double>(clock::now() - t0).count();
  }

  C* inner_;
  link_model link_;
  link_stats stats_;
  clock::time_point link_free_at_{};
  std::unique_ptr<C> owned_;  // a split's backend
};

}  // namespace zero::comm
