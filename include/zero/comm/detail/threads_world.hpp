// comm::detail::threads_world: the rendezvous, agreement check and failure handling of ranks that are threads of one
// process.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zero/comm/call_label.hpp"
#include "zero/comm/detail/arrivals.hpp"
#include "zero/comm/fingerprint.hpp"
#include "zero/comm/flight_recorder.hpp"
#include "zero/core/fixed_text.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/error.hpp"

// Shared by every backend whose ranks are threads (comm::threads, comm::cuda_threads, comm::nccl's
// launcher), so that no backend includes another.
namespace zero::comm {

namespace detail {

using comm::coll_kind;  // the kinds live in fingerprint.hpp; detail::coll_kind stays a valid name

// One pause of a spin-wait loop: lets the sibling hyper-thread run and saves power.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// What one rank announces when it enters a collective; every rank checks that all announcements agree
// before any of them touches another rank's buffer.
struct announcement {
  fingerprint call;
  const void* send = nullptr;
  void* recv = nullptr;
};

// The state the ranks of one launch share: a barrier that can be aborted, and per rank an
// announcement slot, a sequence number, a call label and a flight recorder. Shared by every backend
// whose ranks are threads of one process (comm::threads, comm::cuda_threads); `backend` names the
// backend in its errors.
//
// The barrier's fast path takes no lock: a rank arrives by storing its rendezvous count on its own
// cache line (detail::arrivals) and spins for `spin` (a few microseconds) reading its peers'. A rank
// whose peers are late parks on a condition variable, so a slow or stopped peer costs the waiting
// ranks no CPU; the mutex is taken only to park, to wake a parked rank, and on failures.
class threads_world {
 public:
  static constexpr std::chrono::microseconds default_spin{20};

  threads_world(int n, std::chrono::milliseconds timeout, const char* backend = "comm::threads",
                std::chrono::microseconds spin = default_spin, std::size_t recorder_capacity = 8)
      : n_(n), timeout_(timeout), spin_(spin), backend_(backend), origin_(monotonic_ns()), arrivals_(n) {
    ranks_.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) ranks_.push_back(std::make_unique<rank_state>(recorder_capacity, origin_));
  }

  int size() const { return n_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::microseconds spin() const { return spin_; }
  std::size_t recorder_capacity() const { return state(0).rec.capacity(); }
  const char* backend() const { return backend_; }

  // ---- sub-worlds (comm::threads::split and its device twin) ----
  //
  // The members of one group of a split meet at one object, made by the first member that asks and
  // handed to each of `members` members (the entry is dropped when the last has taken it). `split` is
  // the rank's count of splits so far (the same on every rank: a split is a collective), `color` the
  // group. make() returns the object; world_of(object) its threads_world, which is aborted whenever
  // this world is (a failed rank ends its peers' waits in every sub-world too). Neither may call
  // back into this world (its lock is held).
  template <class T, class Make, class WorldOf>
  std::shared_ptr<T> meet(std::uint64_t split, int color, int members, Make make, WorldOf world_of) {
    std::lock_guard lk(m_);
    auto& e = meetings_[{split, color}];
    if (!e.object) {
      std::shared_ptr<T> made = make();
      std::shared_ptr<threads_world> child = world_of(made);
      children_.push_back(child);
      if (aborted_.load(std::memory_order_relaxed)) child->abort(reason_);
      e.object = std::move(made);
      e.left = members;
    }
    std::shared_ptr<T> out = std::static_pointer_cast<T>(e.object);
    if (--e.left == 0) meetings_.erase({split, color});
    return out;
  }
  // Rank r's splits so far (only r's own thread calls it for r).
  std::uint64_t next_split(int r) { return state(r).splits++; }
  announcement& slot(int r) { return state(r).a; }
  const flight_recorder& recorder(int r) const { return state(r).rec; }

  // Rank r enters its next collective: the fingerprint (r's sequence number and current label) goes
  // into its slot and its flight recorder. Only rank r's own thread calls these for r.
  template <class T>
  void announce(int r, coll_kind kind, const T* send, T* recv, std::size_t count, reduce_op op, int root) {
    rank_state& s = state(r);
    s.a = announcement{fingerprint::make<T>(s.seq++, kind, count, op, root, s.label), send, recv};
    s.rec.begin(s.a.call);
  }
  void announce_barrier(int r) {
    rank_state& s = state(r);
    s.a = announcement{fingerprint::make_barrier(s.seq++, s.label), nullptr, nullptr};
    s.rec.begin(s.a.call);
  }
  void finish(int r) { state(r).rec.end(); }
  call_label set_label(int r, call_label l) {
    const call_label previous = state(r).label;
    state(r).label = l;
    return previous;
  }

  // Blocks until every rank arrives. Throws zero::error (comm) instead of waiting forever when the
  // world is aborted, a rank has already returned from its function, or the timeout passes.
  void arrive_and_wait(int rank, coll_kind what) { rendezvous(rank, what, false); }

  // The rendezvous that ends a collective's data phase, where ranks read and write each other's buffers:
  // after the rendezvous that began it, every rank is in that phase, which does not wait for anyone, so
  // each arrives here in bounded time. An abort does not release this rank before its peers have
  // arrived (or left their functions): a rank that threw at once would unwind and free its buffers
  // while a peer still copies into them. Once all have arrived the call returns; the abort is reported
  // at the next rendezvous. A peer that left before arriving (it failed in the data phase) makes it
  // throw; one that cannot be seen to have left, in a world formed by a split, ends at the timeout.
  void arrive_after_data_phase(int rank, coll_kind what) { rendezvous(rank, what, true); }

  void abort(const std::string& reason) {
    std::lock_guard lk(m_);
    abort_locked(reason);
  }
  void depart(int rank) {
    std::lock_guard lk(m_);
    state(rank).departed = true;
    cv_.notify_all();
  }
  // Keeps the first failure: it is the cause; the errors it triggers on other ranks come later.
  void record_failure(int rank, std::exception_ptr e, const std::string& what) {
    std::lock_guard lk(m_);
    if (!first_failure_) first_failure_ = e;
    state(rank).failed = true;
    abort_locked(zero::detail::concat("rank ", rank, " failed: ", what));
  }
  std::exception_ptr first_failure() const { return first_failure_; }

  // Where every rank is and what this rank did last: the flight recorders, as text.
  std::string report(int rank) const {
    std::lock_guard lk(m_);
    return report_locked(rank);
  }

 private:
  struct rank_state {
    rank_state(std::size_t capacity, std::int64_t origin) : rec(capacity, origin) {}
    announcement a;
    flight_recorder rec;
    call_label label;
    std::uint64_t seq = 0;         // collectives announced so far
    std::uint64_t rendezvous = 0;  // rendezvous arrived at (only the rank's own thread touches it)
    std::uint64_t splits = 0;      // sub-worlds formed so far (only the rank's own thread touches it)
    bool departed = false;         // returned from its function (guarded by m_)
    bool failed = false;           // threw out of its function (guarded by m_)
  };
  rank_state& state(int r) { return *ranks_[static_cast<std::size_t>(r)]; }
  const rank_state& state(int r) const { return *ranks_[static_cast<std::size_t>(r)]; }

  void rendezvous(int rank, coll_kind what, bool draining) {
    if (!draining && aborted_.load(std::memory_order_acquire)) {
      std::lock_guard lk(m_);
      throw_if_aborted(rank, what);
    }
    const std::uint64_t e = ++state(rank).rendezvous;
    arrivals_.arrive(rank, e);
    // A parked peer needs a wake-up; a spinning one sees the count by itself, and the usual case, no
    // sleeper, costs no system call.
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lk(m_);
      cv_.notify_all();
    }
    if (arrivals_.complete(e)) return;
    const auto start = std::chrono::steady_clock::now();
    if (spin_.count() > 0 && spin_until_complete(e, start + spin_, draining)) return;
    park(rank, what, e, start + timeout_, draining);
  }

  // Polls the peers' counts until rendezvous e completes (true) or `until` passes or the world is
  // aborted (false: the caller parks, and throws there; draining, only `until` ends the polls).
  //
  // The first few polls only pause: a peer running on another core arrives within a fraction of a
  // microsecond in a loop of collectives. After that every poll yields the core: when the ranks
  // outnumber the free cores (N = 4 on 2 cores, or other processes' work), the peer we wait for may
  // be waiting for this very core, and a longer pure spin is time it cannot run. Measured at a load
  // average of 8-11 on 2 cores, 1 KiB all_reduce, median: 4.4 us (N = 2) and 17 us (N = 4) when the
  // core was yielded every 64 pauses, 2.1 and 7.9 us when yielded every poll.
  bool spin_until_complete(std::uint64_t e, std::chrono::steady_clock::time_point until, bool draining) const {
    constexpr unsigned pure_polls = 4;
    for (unsigned i = 0;; ++i) {
      if (arrivals_.complete(e)) return true;
      if (i < pure_polls) {
        cpu_relax();
        continue;
      }
      if ((!draining && aborted_.load(std::memory_order_relaxed)) || std::chrono::steady_clock::now() >= until)
        return false;
      std::this_thread::yield();
    }
  }

  // The slow path of arrive_and_wait: sleeps on the condition variable until rendezvous e completes,
  // the world is aborted, a peer that has not arrived returns from its function, or the deadline.
  //
  // No lost wake-up: this rank counts itself as a sleeper (under m_) before it checks the counts a
  // last time, and an arriving rank stores its count before it reads the number of sleepers; with
  // both seq_cst, either this rank sees the count or the arriving one sees the sleeper, and then
  // notifies under m_, which this rank holds until the wait has begun.
  //
  // Draining (arrive_after_data_phase), an abort alone does not end the wait: only every peer's arrival,
  // a peer that left its function without arriving, or the deadline.
  void park(int rank, coll_kind what, std::uint64_t e, std::chrono::steady_clock::time_point deadline,
            bool draining) {
    std::unique_lock lk(m_);
    for (;;) {
      if (arrivals_.complete(e)) return;
      if (!draining) throw_if_aborted(rank, what);
      // A peer that returned (or threw) before arriving never will: fail now rather than at the
      // timeout. (One that arrived and then returned cannot be seen here: it returned only after e
      // completed.)
      for (int k = 0; k < n_; ++k)
        if ((state(k).departed || state(k).failed) && !arrivals_.has_arrived(k, e)) {
          if (!state(k).failed)
            abort_locked(zero::detail::concat("rank ", k, " returned after ", state(k).seq,
                                              " collective(s) while rank ", rank, " waits in ",
                                              current_call(rank, what)));
          throw_if_aborted(rank, what);
        }
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (arrivals_.complete(e)) {
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return;
      }
      const auto status = cv_.wait_until(lk, deadline);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      if (arrivals_.complete(e)) return;
      if (status == std::cv_status::timeout) {
        std::string missing;
        for (int k = 0; k < n_; ++k)
          if (!arrivals_.has_arrived(k, e)) missing += zero::detail::concat(missing.empty() ? "" : ", ", k);
        abort_locked(zero::detail::concat("rank ", rank, " waited ", timeout_.count(), " ms in ",
                                          current_call(rank, what), " but only ", arrivals_.arrived(e), " of ", n_,
                                          " ranks arrived (missing: rank ", missing, ")"));
        throw_if_aborted(rank, what);
      }
    }
  }

  // The collective rank r is in, by its fingerprint ("#3 all_reduce(float x 100, sum)"), or the
  // bare kind for a rendezvous that is not a recorded collective.
  std::string current_call(int r, coll_kind what) const {
    const auto& rec = state(r).rec;
    if (rec.in_collective()) return rec.last().call.str();
    return to_string(what);
  }

  std::string report_locked(int rank) const {
    std::vector<char> buf(512 + static_cast<std::size_t>(n_) * 256 + state(rank).rec.capacity() * 256);
    fixed_text t(buf.data(), buf.size());
    t << "where each rank is (seconds since the launch):\n";
    for (int k = 0; k < n_; ++k) {
      t << "  rank " << k << ": ";
      state(k).rec.format_status(t);
      if (state(k).failed)
        t << ", then threw";
      else if (state(k).departed)
        t << ", then returned";
      t << '\n';
    }
    t << "last collectives of rank " << rank << ", oldest first:\n";
    state(rank).rec.format(t, "  ");
    std::string s = t.str();
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }

  void abort_locked(const std::string& reason) {
    if (!aborted_.load(std::memory_order_relaxed)) {
      reason_ = reason;
      aborted_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    // A child never takes its parent's lock, so holding this one while aborting it cannot deadlock.
    for (auto& w : children_)
      if (auto c = w.lock()) c->abort(reason);
  }
  // Called with m_ held (reason_ is guarded by it).
  void throw_if_aborted(int rank, coll_kind what) const {
    if (aborted_.load(std::memory_order_relaxed))
      fail(error_kind::comm, backend_, " rank ", rank, ": ", current_call(rank, what), " aborted: ", reason_, "\n",
           report_locked(rank));
  }

  int n_;
  std::chrono::milliseconds timeout_;
  std::chrono::microseconds spin_;
  const char* backend_;
  std::int64_t origin_;
  std::vector<std::unique_ptr<rank_state>> ranks_;
  arrivals arrivals_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};      // ranks parked (or about to park) on cv_
  std::atomic<bool> aborted_{false};  // set once, under m_; read without it on the fast path
  std::string reason_;                // guarded by m_
  std::exception_ptr first_failure_;
  struct meeting {
    std::shared_ptr<void> object;
    int left = 0;
  };
  std::map<std::pair<std::uint64_t, int>, meeting> meetings_;  // guarded by m_
  std::vector<std::weak_ptr<threads_world>> children_;         // guarded by m_
};

// Runs body(rank) on n threads and joins them. A rank that throws aborts the world (its peers' pending
// and later waits fail) and the first exception is rethrown here; a rank that returns departs (a peer
// still waiting for it fails instead of hanging).
template <class Body>
void run_ranks(threads_world& world, int n, const Body& body) {
  std::vector<std::thread> ranks;
  ranks.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&world, &body, r] {
      try {
        body(r);
        world.depart(r);
      } catch (const std::exception& e) {
        world.record_failure(r, std::current_exception(), e.what());
      } catch (...) {
        world.record_failure(r, std::current_exception(), "unknown exception");
      }
    });
  for (auto& t : ranks) t.join();
  if (auto e = world.first_failure()) std::rethrow_exception(e);
}

// Every rank checks every announcement, so all ranks reach the same verdict and none reads a buffer
// whose size it has misjudged. The fingerprints include the sequence number and the caller's label,
// so two calls of equal shape for different units ("reduce unit 'a'" against "reduce unit 'b'") are a
// mismatch too, not a silent exchange of the wrong data.
inline void check_agreement(threads_world& world, int rank) {
  const fingerprint& first = world.slot(0).call;
  for (int k = 1; k < world.size(); ++k) {
    const fingerprint& other = world.slot(k).call;
    if (const unsigned diff = other.differences(first)) {
      std::string msg = zero::detail::concat(
          world.backend(), " rank ", rank, ": ranks disagree on the collective: rank 0 calls ", first.str(), ", rank ",
          k, " calls ", other.str(), " (they differ in ", fingerprint::describe(diff), ")");
      world.abort(msg);
      fail(error_kind::comm, msg, "\n", world.report(rank));
    }
  }
}

}  // namespace detail

}  // namespace zero::comm
