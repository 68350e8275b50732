// comm::mpi: ranks as MPI processes; by default the sums are rank-ordered and bit-identical to comm::threads.
#pragma once

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/backoff.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/detail/combine.hpp"  // the one definition of a rank-ordered step
#include "zero/comm/fingerprint.hpp"
#include "zero/comm/flight_recorder.hpp"
#include "zero/comm/mpi_session.hpp"  // <mpi.h> without the deprecated C++ bindings
#include "zero/comm/nonblocking.hpp"
#include "zero/comm/peer_process.hpp"
#include "zero/comm/split.hpp"
#include "zero/comm/termination_report.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/numeric.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/error.hpp"
#include "zero/sys/host.hpp"

namespace zero::comm {

// The MPI datatype of a collective's element type; specialise it to send another type.
template <class T>
struct mpi_datatype {
  static_assert(sizeof(T) == 0,
                "comm::mpi has no MPI datatype for this element type: specialise zero::comm::mpi_datatype<T> "
                "with `static MPI_Datatype get()`");
};
// Functions, not constants: in Open MPI the predefined handles are addresses of library objects.
template <>
struct mpi_datatype<float> {
  static MPI_Datatype get() { return MPI_FLOAT; }
};
template <>
struct mpi_datatype<double> {
  static MPI_Datatype get() { return MPI_DOUBLE; }
};
template <>
struct mpi_datatype<std::uint8_t> {
  static MPI_Datatype get() { return MPI_UINT8_T; }
};
template <>
struct mpi_datatype<std::int8_t> {
  static MPI_Datatype get() { return MPI_INT8_T; }
};
template <>
struct mpi_datatype<std::int32_t> {
  static MPI_Datatype get() { return MPI_INT32_T; }
};
template <>
struct mpi_datatype<std::int64_t> {
  static MPI_Datatype get() { return MPI_INT64_T; }
};
template <>
struct mpi_datatype<std::uint64_t> {
  static MPI_Datatype get() { return MPI_UINT64_T; }
};
// 2-byte floats travel as 16-bit words; MPI never does arithmetic on them: they are summed here, in
// fp32 and rank order, also in fast mode.
template <>
struct mpi_datatype<bf16> {
  static MPI_Datatype get() { return MPI_UINT16_T; }
};
template <>
struct mpi_datatype<fp16> {
  static MPI_Datatype get() { return MPI_UINT16_T; }
};

enum class mpi_mode {
  // reduce_scatter = all-to-all of the N slices + a local sum in rank order 0..N-1; all_reduce =
  // that + an all-gather. Bit-identical to comm::threads; holds a scratch of the full buffer.
  deterministic,
  // MPI's reduce_scatter_block / allreduce: whatever order the MPI library's algorithm picks (it
  // may depend on N, the message size and the tuning), so results may differ in the last bits.
  fast,
};

struct mpi_options {
  mpi_mode mode = mpi_mode::deterministic;
  // How long a rank waits in a collective before it fails with zero::error (kind comm): MPI itself
  // never gives up on a peer that returned early or entered another collective. A positive
  // timeout uses the nonblocking collectives (MPI_Iallgather, ...) polled against a deadline;
  // zero uses the blocking ones and waits forever. After a timeout the communicator is unusable
  // (the collective is still pending): end the job, as comm::mpi::run does.
  // A rank that times out first probes its peers (for up to a quarter of the timeout, at most 2 s):
  // the error then says which ranks did not answer and where the others are.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Before each collective, one small MPI_Allreduce compares the calls' fingerprints (sequence
  // number, operation, element type, count, op, root, and the engine's label such as "reduce unit
  // 'fc2'") over ranks, so a mismatched call fails with zero::error on every rank, naming both
  // calls, instead of truncating a message, hanging or exchanging the wrong data. Costs one
  // latency-bound round per collective.
  bool verify = false;
  // How a waiting rank polls its nonblocking collective (positive timeout): MPI_Test in a loop for
  // `spin`, then with sleeps growing from 20 us to `max_sleep` between polls, so a slow, stopped or
  // unreachable peer costs almost no CPU. A collective whose peers arrive after the spin completes
  // up to max_sleep later than it could.
  std::chrono::microseconds spin{1000};
  std::chrono::microseconds max_sleep{1000};
  // Collectives each rank's flight recorder keeps (printed in every comm error and on SIGTERM).
  std::size_t flight_recorder = 8;
};

namespace detail {

// Turns an MPI return code into zero::error (kind comm) naming the rank, the operation and MPI's text.
inline void mpi_check(int rc, const char* call, const char* operation, int rank, int size) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  std::string why = MPI_Error_string(rc, text, &len) == MPI_SUCCESS ? std::string(text, static_cast<std::size_t>(len))
                                                                    : std::string("unknown MPI error");
  fail(error_kind::comm, "comm::mpi rank ", rank, " of ", size, ": ", operation, " failed in ", call, ": ", why,
       " (MPI error code ", rc, ")");
}

inline MPI_Op mpi_op(reduce_op op) { return op == reduce_op::sum ? MPI_SUM : MPI_MAX; }

inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

// What a rank answers when a peer that timed out probes it: the collective it is in (or was in last)
// and for how long. Travels as bytes between ranks of one program.
struct rank_status {
  std::int32_t in_collective = 0;
  std::int32_t answered = 0;
  std::int32_t in_flight = 0;  // nonblocking collectives started and not yet waited for
  std::int32_t reserved = 0;
  std::int64_t for_ns = 0;
  std::uint64_t recorded = 0;
  fingerprint call;
};

// Per-communicator diagnostics, on the heap so that their address never changes: MPI writes into the
// probe buffers, and the SIGTERM report reads the recorder. Tags of the side communicator, which
// carries nothing but probes so that they cannot match a collective's messages.
struct mpi_watch {
  static constexpr int tag_probe = 1, tag_answer = 2;

  mpi_watch(int r, int n, std::size_t capacity) : rank(r), size(n), rec(capacity) {}

  int rank, size;
  flight_recorder rec;
  call_label label;
  std::uint64_t seq = 0;
  process_id self;
  std::vector<process_id> peers;
  MPI_Comm side = MPI_COMM_NULL;
  int token_in = 0, token_out = 0;
  MPI_Request incoming = MPI_REQUEST_NULL;                  // a probe from any peer, always posted
  std::deque<std::pair<rank_status, MPI_Request>> replies;  // answers in flight (deque: stable addresses)
  std::vector<rank_status> answers;                         // this rank's own probe round
  std::vector<MPI_Request> answer_reqs, probe_reqs;
  int report_slot = -1;
  // The call this rank is in (a blocking collective, or the wait for a started one), since when
  // it started; a call that failed stays set, as its recorder entry stays "not ended".
  bool waiting = false;
  fingerprint wait_call;
  std::int64_t wait_start_ns = 0;
  std::int32_t in_flight = 0;  // started, not waited for

  void wait_in(const fingerprint& f, std::int64_t start_ns) {
    waiting = true;
    wait_call = f;
    wait_start_ns = start_ns;
  }

  rank_status status() const {
    rank_status s;
    const auto last = rec.last();
    s.recorded = rec.recorded();
    s.in_flight = in_flight;
    s.in_collective = waiting;
    s.call = waiting ? wait_call : last.call;
    s.for_ns = rec.now() - (waiting ? wait_start_ns : s.recorded == 0 ? 0 : last.end_ns >= 0 ? last.end_ns : last.start_ns);
    return s;
  }

  bool same_machine(int k) const {
    return self.machine != 0 && peers.size() > static_cast<std::size_t>(k) &&
           peers[static_cast<std::size_t>(k)].machine == self.machine;
  }

  // Answers the probes that have arrived (while this rank waits in a collective); errors are ignored:
  // diagnostics must never turn into a failure of their own.
  void serve_probes() {
    for (int flag = 1; incoming != MPI_REQUEST_NULL && flag;) {
      MPI_Status st;
      flag = 0;
      if (MPI_Test(&incoming, &flag, &st) != MPI_SUCCESS || !flag) break;
      replies.emplace_back(status(), MPI_REQUEST_NULL);
      replies.back().first.answered = 1;
      MPI_Isend(&replies.back().first, sizeof(rank_status), MPI_BYTE, st.MPI_SOURCE, tag_answer, side,
                &replies.back().second);
      if (MPI_Irecv(&token_in, 1, MPI_INT, MPI_ANY_SOURCE, tag_probe, side, &incoming) != MPI_SUCCESS)
        incoming = MPI_REQUEST_NULL;
    }
    while (!replies.empty()) {
      int flag = 0;
      if (MPI_Test(&replies.front().second, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) break;
      replies.pop_front();
    }
  }

  // The SIGTERM report (termination_report.hpp): async-signal-safe, unlocked reads.
  static void write_report(const void* context, int fd, int sig) {
    const auto& w = *static_cast<const mpi_watch*>(context);
    static char buf[16384];
    fixed_text t(buf, sizeof buf);
    t << "rank " << w.rank << " of " << w.size << " (pid " << w.self.pid << "): terminated by signal " << sig << "; ";
    w.rec.format_status_unlocked(t);
    t << ", now +";
    t.seconds(w.rec.now(), 6) << " s\n";
    int alive = 0, elsewhere = 0;
    for (int k = 0; k < w.size; ++k) {
      if (k == w.rank) continue;
      if (!w.same_machine(k)) {
        ++elsewhere;
        continue;
      }
      const process_state st = state_of(w.peers[static_cast<std::size_t>(k)].pid);
      if (st == process_state::alive) {
        ++alive;
        continue;
      }
      t << "  rank " << k << " (pid " << w.peers[static_cast<std::size_t>(k)].pid
        << ", this machine): " << to_string(st) << '\n';
    }
    t << "  other peers: " << alive << " alive on this machine, " << elsewhere << " on other machines\n";
    t << "  last collectives of rank " << w.rank << ", oldest first:\n";
    w.rec.format_unlocked(t, "    ");
    for (std::size_t done = 0; done < t.size();) {
      const ssize_t n = ::write(fd, t.c_str() + done, t.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
  }
};

}  // namespace detail

// Ends the whole MPI job after printing "rank R failed: why" to stderr. Used when a rank cannot
// go on: its peers may be blocked in a collective it will never enter.
[[noreturn]] inline void mpi_abort(MPI_Comm comm, const std::string& why) {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool live = initialized && !finalized;
  if (live) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::cout.flush();
  std::fflush(stdout);
  std::fprintf(stderr, "rank %d failed: %s\n", rank, why.c_str());
  std::fflush(stderr);
  if (live) MPI_Abort(comm, 1);
  std::abort();  // MPI_Abort does not return; this covers a job without MPI
}

// A CommBackend over an MPI communicator, one rank per process. Collectives have NCCL's signatures
// and in-place rules; counts are elements per rank and must fit MPI's int. Every MPI failure is a
// zero::error (kind comm) naming the rank, the operation and MPI's error text; a collective that
// waits longer than options::timeout fails the same way. Call it from one thread per process.
class mpi {
 public:
  using system = sys::host;
  using options = mpi_options;

  // Wraps a duplicate of `comm` (a collective call on comm): the duplicate gets MPI_ERRORS_RETURN
  // without changing the caller's error handler, and its traffic cannot mix with the caller's.
  explicit mpi(MPI_Comm comm = MPI_COMM_WORLD, options opt = options{}) : opt_(opt) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    ZERO_CHECK(initialized, comm,
               "comm::mpi: MPI is not initialised (call MPI_Init or create a zero::comm::mpi_session first)");
    detail::mpi_check(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank", "construction", rank_, size_);
    detail::mpi_check(MPI_Comm_size(comm, &size_), "MPI_Comm_size", "construction", rank_, size_);
    detail::mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup", "construction", rank_, size_);
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "construction",
                      rank_, size_);
    // Diagnostics: every rank's process and machine (a peer on this machine can be looked up in
    // /proc when it stops answering), and a side communicator on which waiting ranks answer probes.
    w_ = std::make_unique<detail::mpi_watch>(rank_, size_, opt_.flight_recorder);
    w_->self = this_process();
    w_->peers.resize(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&w_->self, sizeof(process_id), MPI_BYTE, w_->peers.data(), sizeof(process_id), MPI_BYTE, comm_),
          "MPI_Allgather", "construction");
    if (opt_.timeout.count() > 0 && size_ > 1) {
      check(MPI_Comm_dup(comm_, &w_->side), "MPI_Comm_dup", "construction");
      check(MPI_Comm_set_errhandler(w_->side, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "construction");
      check(MPI_Irecv(&w_->token_in, 1, MPI_INT, MPI_ANY_SOURCE, detail::mpi_watch::tag_probe, w_->side, &w_->incoming),
            "MPI_Irecv", "construction");
    }
    // The second step of a started deterministic all_reduce runs on its own communicator (see
    // progress()), so that when it starts cannot disturb the order of the collectives on comm_.
    if (size_ > 1) {
      check(MPI_Comm_dup(comm_, &comm2_), "MPI_Comm_dup", "construction");
      check(MPI_Comm_set_errhandler(comm2_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "construction");
    }
    q_->owner = this;
    w_->report_slot = termination::add(&detail::mpi_watch::write_report, w_.get());
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  mpi(mpi&& o) noexcept
      : opt_(o.opt_),
        comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        rank_(o.rank_),
        size_(o.size_),
        stuck_(o.stuck_),
        comm2_(std::exchange(o.comm2_, MPI_COMM_NULL)),
        w_(std::move(o.w_)),
        q_(std::exchange(o.q_, nullptr)),
        scratch_(std::move(o.scratch_)),
        scratch_bytes_(std::exchange(o.scratch_bytes_, 0)) {
    if (q_) q_->owner = this;  // started requests follow the backend
  }
  mpi& operator=(mpi&&) = delete;
  ~mpi() {
    if (w_) termination::remove(w_->report_slot);
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Requests still held by the caller: their collectives complete here (errors are swallowed, as
    // in a request's destructor), and the requests are detached from this backend.
    if (q_ && !stuck_ && !finalized)
      while (!q_->ops.empty()) {
        try {
          finish(q_->ops.front()->id);
        } catch (...) {
          break;  // stuck_ now: what is in flight stays
        }
      }
    if (q_) q_->owner = nullptr;
    // A timed-out collective is still pending on the communicator; freeing it would be erroneous,
    // and MPI may still write into the probe buffers and the in-flight collectives' buffers: all are
    // left alone (the job is ending).
    if (stuck_ || finalized) {
      (void)w_.release();
      if (q_)
        for (auto& o : q_->ops) (void)o.release();
      return;
    }
    if (w_ && w_->side != MPI_COMM_NULL && !close_side()) (void)w_.release();
    if (comm2_ != MPI_COMM_NULL) MPI_Comm_free(&comm2_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  // Runs fn(comm) on this process's rank of `comm` and returns what fn returns. If fn throws, it
  // prints "rank R failed: <what>" and ends the job with MPI_Abort: the other ranks may be waiting
  // in a collective this rank will never enter, and ending the job is the only way not to hang.
  // While it runs, a SIGTERM (what mpirun sends the survivors when a rank dies) makes the rank print
  // where it stood before it dies, unless the program handles SIGTERM itself.
  template <class Fn>
  static decltype(auto) run(Fn&& fn, options opt = options{}, MPI_Comm comm = MPI_COMM_WORLD) {
    const termination::guard report_on_sigterm;
    std::optional<mpi> c;  // outside the try: the communicator stays intact until MPI_Abort
    try {
      c.emplace(comm, opt);
      return std::invoke(std::forward<Fn>(fn), *c);
    } catch (const std::exception& e) {
      mpi_abort(comm, e.what());
    } catch (...) {
      mpi_abort(comm, "unknown exception");
    }
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const { return comm_; }
  const options& opts() const { return opt_; }

  // Names the following collectives in their fingerprints (the engine labels its calls, e.g. "reduce
  // unit 'fc2'"); returns the previous label. See zero::comm::scoped_label.
  call_label set_call_label(call_label l) {
    const call_label previous = w_->label;
    w_->label = l;
    return previous;
  }
  // This rank's last collectives, with start and end times.
  const flight_recorder& recorder() const { return w_->rec; }
  // This rank's last collectives as text, as printed in comm errors.
  std::string report() const {
    std::vector<char> buf(256 + w_->rec.capacity() * 256);
    fixed_text t(buf.data(), buf.size());
    t << "last collectives of rank " << rank_ << ", oldest first:\n";
    w_->rec.format(t, "  ");
    std::string s = t.str();
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  // Bytes held by the exchange buffers of the deterministic mode: the largest full buffer of a
  // blocking collective so far, plus one buffer per started collective that needs one (kept for
  // reuse once it completes: as many as were ever in flight at once).
  std::size_t scratch_bytes() const { return scratch_bytes_ + q_->held_bytes; }
  // Frees the exchange buffers not in use by a started collective.
  void release_scratch() {
    scratch_.reset();
    scratch_bytes_ = 0;
    for (const auto& b : q_->pool) q_->held_bytes -= b.bytes;
    q_->pool.clear();
  }

  // ---- nonblocking collectives (comm/nonblocking.hpp) -----------------------------------------
 private:
  //
  // start_* records the call, verifies it (verify mode), and posts the MPI_I* collective; wait()
  // polls it as a blocking call polls its own, with the same backoff, probes, errors and timeout,
  // the deadline counted from the start of the wait (time the caller spends computing between
  // start and wait is not the peers' delay). Whatever needs the received data runs when the
  // collective is found complete, in any wait or blocking call of this backend: the rank-ordered
  // sum of the deterministic mode, the copy of an in-place fast reduce_scatter, and, for a
  // deterministic all_reduce, its second step, the MPI_Iallgatherv of the summed chunks. That one
  // is started on a second communicator, in the order the all_reduces were started (an older one
  // still in its first step holds back the younger ones'), so every rank starts the same sequence
  // on both communicators whatever order it waits in. Each started collective that needs an
  // exchange buffer has its own. With timeout 0 a wait polls without a deadline.

  struct queue;

 public:
  // A started collective. Movable; a default-constructed (or waited) request is complete. Its
  // destructor waits (and swallows an error). Wait for it, or drop it, before the backend is
  // destroyed; the backend's destructor completes the collectives still in flight.
  class request {
   public:
    request() = default;
    request(request&& o) noexcept : q_(std::move(o.q_)), id_(std::exchange(o.id_, 0)) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        finish();
        q_ = std::move(o.q_);
        id_ = std::exchange(o.id_, 0);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { finish(); }
    // Whether wait() has work left: the collective was started and not yet waited for.
    bool pending() const { return q_ != nullptr; }

   private:
    friend class mpi;
    request(std::shared_ptr<struct queue> q, std::uint64_t id) : q_(std::move(q)), id_(id) {}
    void finish() noexcept {
      if (!q_) return;
      try {
        if (q_->owner) q_->owner->wait(*this);
      } catch (...) {
      }
      q_.reset();
    }
    std::shared_ptr<struct queue> q_;
    std::uint64_t id_ = 0;
  };

  template <class T>
  request start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    auto o = begin_op(make<T>(coll_kind::all_reduce, count, op, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_reduce");
    if (opt_.mode == mpi_mode::fast && !is_half_v<T>) {
      const void* in = send == recv ? MPI_IN_PLACE : send;
      const MPI_Op mop = detail::mpi_op(op);
      return post(std::move(o), "MPI_Allreduce", [&](MPI_Request* r) { return MPI_Iallreduce(in, recv, n, type, mop, comm_, r); });
    }
    if (size_ == 1) {
      system::copy(recv, send, count * sizeof(T));
      return done_op(*o);
    }
    // As the blocking all_reduce; the counts live with the request until it completes (MPI reads
    // them while the collective runs).
    const auto N = static_cast<std::size_t>(size_);
    o->counts.resize(4 * N);
    int *sc = o->counts.data(), *sd = sc + N, *rc = sd + N, *rd = rc + N;
    for (std::size_t k = 0; k < N; ++k) {
      sd[k] = static_cast<int>(count * k / N);
      sc[k] = static_cast<int>(count * (k + 1) / N) - sd[k];
    }
    const std::size_t mine = static_cast<std::size_t>(sc[rank_]);
    for (std::size_t k = 0; k < N; ++k) {
      rc[k] = static_cast<int>(mine);
      rd[k] = static_cast<int>(k * mine);
    }
    T* slices = op_scratch<T>(*o, N * mine);
    T* chunk = recv + sd[rank_];
    o->local = [slices, mine, chunk, op](mpi& m) { m.sum_in_rank_order(slices, mine, chunk, op); };
    o->second_call = "MPI_Allgatherv";
    o->second = [recv, sc, sd, type](mpi& m, MPI_Request* r) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, sc, sd, type, m.comm2_, r);
    };
    return post(std::move(o), "MPI_Alltoallv",
                [&](MPI_Request* r) { return MPI_Ialltoallv(send, sc, sd, type, slices, rc, rd, type, comm_, r); });
  }

  template <class T>
  request start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    auto o = begin_op(make<T>(coll_kind::reduce_scatter, count, op, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "reduce_scatter");
    const auto N = static_cast<std::size_t>(size_);
    if (opt_.mode == mpi_mode::fast && !is_half_v<T>) {
      const bool aliased = detail::overlaps(send, N * count * sizeof(T), recv, count * sizeof(T));
      T* out = aliased ? op_scratch<T>(*o, count) : recv;
      if (aliased) o->local = [recv, out, count](mpi&) { system::copy(recv, out, count * sizeof(T)); };
      const MPI_Op mop = detail::mpi_op(op);
      return post(std::move(o), "MPI_Reduce_scatter_block",
                  [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, out, n, type, mop, comm_, r); });
    }
    if (size_ == 1) {
      system::copy(recv, send, count * sizeof(T));
      return done_op(*o);
    }
    T* slices = op_scratch<T>(*o, N * count);
    o->local = [slices, count, recv, op](mpi& m) { m.sum_in_rank_order(slices, count, recv, op); };
    return post(std::move(o), "MPI_Alltoall",
                [&](MPI_Request* r) { return MPI_Ialltoall(send, n, type, slices, n, type, comm_, r); });
  }

  template <class T>
  request start_all_gather(const T* send, T* recv, std::size_t count) {
    auto o = begin_op(make<T>(coll_kind::all_gather, count, reduce_op::sum, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_gather");
    const bool in_place = send == recv + count * static_cast<std::size_t>(rank_);
    const void* in = in_place ? MPI_IN_PLACE : send;
    const int in_count = in_place ? 0 : n;
    const MPI_Datatype in_type = in_place ? MPI_DATATYPE_NULL : type;
    return post(std::move(o), "MPI_Allgather",
                [&](MPI_Request* r) { return MPI_Iallgather(in, in_count, in_type, recv, n, type, comm_, r); });
  }

  // Block k of send to rank k, recv[k*count..] from rank k (comm/all_to_all.hpp): MPI_Ialltoall.
  template <class T>
  request start_all_to_all(const T* send, T* recv, std::size_t count) {
    auto o = begin_op(make<T>(coll_kind::all_to_all, count, reduce_op::sum, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_to_all");
    return post(std::move(o), "MPI_Alltoall",
                [&](MPI_Request* r) { return MPI_Ialltoall(send, n, type, recv, n, type, comm_, r); });
  }

  // Returns when r's collective has completed (at once for a complete request). A timeout, or an
  // MPI failure of this or another started collective found while polling, throws zero::error (kind
  // comm) and leaves the communicator unusable. r is complete afterwards either way.
  void wait(request& r) {
    if (!r.q_) return;
    const std::shared_ptr<queue> q = std::move(r.q_);
    r.q_ = nullptr;
    ZERO_CHECK(q.get() == q_.get(), invalid_argument, "comm::mpi rank ", rank_,
               ": wait() for a request started on another comm::mpi");
    finish(std::exchange(r.id_, 0));
  }
  // Collectives started and not yet waited for.
  std::size_t in_flight() const { return q_->ops.size(); }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    const call_scope scope(*this, make<T>(coll_kind::all_reduce, count, op, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_reduce");
    if (opt_.mode == mpi_mode::fast && !is_half_v<T>) {
      const void* in = send == recv ? MPI_IN_PLACE : send;
      const MPI_Op mop = detail::mpi_op(op);
      collective(
          "MPI_Allreduce", [&] { return MPI_Allreduce(in, recv, n, type, mop, comm_); },
          [&](MPI_Request* r) { return MPI_Iallreduce(in, recv, n, type, mop, comm_, r); });
      return;
    }
    if (size_ == 1) return system::copy(recv, send, count * sizeof(T));
    // The chunking of comm::threads: rank k sums elements [count*k/N, count*(k+1)/N) in rank order,
    // so every element sees the same additions in the same order on both backends.
    const auto N = static_cast<std::size_t>(size_);
    counts_.resize(N);
    displs_.resize(N);
    for (std::size_t k = 0; k < N; ++k) {
      displs_[k] = static_cast<int>(count * k / N);
      counts_[k] = static_cast<int>(count * (k + 1) / N) - displs_[k];
    }
    const std::size_t mine = static_cast<std::size_t>(counts_[static_cast<std::size_t>(rank_)]);
    from_counts_.assign(N, static_cast<int>(mine));
    from_displs_.resize(N);
    for (std::size_t k = 0; k < N; ++k) from_displs_[k] = static_cast<int>(k * mine);
    T* slices = scratch<T>(N * mine);
    const int *sc = counts_.data(), *sd = displs_.data(), *rc = from_counts_.data(), *rd = from_displs_.data();
    collective(
        "MPI_Alltoallv", [&] { return MPI_Alltoallv(send, sc, sd, type, slices, rc, rd, type, comm_); },
        [&](MPI_Request* r) { return MPI_Ialltoallv(send, sc, sd, type, slices, rc, rd, type, comm_, r); });
    // send has been read entirely, so writing recv is safe even when it is send.
    sum_in_rank_order(slices, mine, recv + displs_[static_cast<std::size_t>(rank_)], op);
    collective(
        "MPI_Allgatherv", [&] { return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, sc, sd, type, comm_); },
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, sc, sd, type, comm_, r);
        });
  }

  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    const call_scope scope(*this, make<T>(coll_kind::reduce_scatter, count, op, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "reduce_scatter");
    const auto N = static_cast<std::size_t>(size_);
    if (opt_.mode == mpi_mode::fast && !is_half_v<T>) {
      // MPI forbids aliased buffers; the in-place form (recv inside send) goes through scratch.
      const bool aliased = detail::overlaps(send, N * count * sizeof(T), recv, count * sizeof(T));
      T* out = aliased ? scratch<T>(count) : recv;
      const MPI_Op mop = detail::mpi_op(op);
      collective(
          "MPI_Reduce_scatter_block", [&] { return MPI_Reduce_scatter_block(send, out, n, type, mop, comm_); },
          [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, out, n, type, mop, comm_, r); });
      if (aliased) system::copy(recv, out, count * sizeof(T));
      return;
    }
    if (size_ == 1) return system::copy(recv, send, count * sizeof(T));
    // Each rank sends slice k to rank k and receives every rank's copy of its own slice: (N-1)/N of
    // the buffer on the wire, as in a ring, but the sum is then done here in rank order.
    T* slices = scratch<T>(N * count);
    collective(
        "MPI_Alltoall", [&] { return MPI_Alltoall(send, n, type, slices, n, type, comm_); },
        [&](MPI_Request* r) { return MPI_Ialltoall(send, n, type, slices, n, type, comm_, r); });
    sum_in_rank_order(slices, count, recv, op);
  }

  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    const call_scope scope(*this, make<T>(coll_kind::all_gather, count, reduce_op::sum, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_gather");
    // NCCL's in-place rule (send is this rank's slot of recv) is MPI_IN_PLACE for MPI.
    const bool in_place = send == recv + count * static_cast<std::size_t>(rank_);
    const void* in = in_place ? MPI_IN_PLACE : send;
    const int in_count = in_place ? 0 : n;
    const MPI_Datatype in_type = in_place ? MPI_DATATYPE_NULL : type;
    collective(
        "MPI_Allgather", [&] { return MPI_Allgather(in, in_count, in_type, recv, n, type, comm_); },
        [&](MPI_Request* r) { return MPI_Iallgather(in, in_count, in_type, recv, n, type, comm_, r); });
  }

  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ZERO_CHECK(root >= 0 && root < size_, invalid_argument, "comm::mpi rank ", rank_, ": broadcast root ", root,
               " is not in [0, ", size_, ")");
    const call_scope scope(*this, make<T>(coll_kind::broadcast, count, reduce_op::sum, root));
    const int n = checked_count(count, "broadcast");
    if (rank_ == root) system::copy(recv, send, count * sizeof(T));
    const MPI_Datatype type = mpi_datatype<T>::get();
    collective(
        "MPI_Bcast", [&] { return MPI_Bcast(recv, n, type, root, comm_); },
        [&](MPI_Request* r) { return MPI_Ibcast(recv, n, type, root, comm_, r); });
  }

  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count) {
    const call_scope scope(*this, make<T>(coll_kind::all_to_all, count, reduce_op::sum, 0));
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_to_all");
    collective(
        "MPI_Alltoall", [&] { return MPI_Alltoall(send, n, type, recv, n, type, comm_); },
        [&](MPI_Request* r) { return MPI_Ialltoall(send, n, type, recv, n, type, comm_, r); });
  }

  // The ranks that pass the same color form a new comm::mpi with this one's options, ranked in this
  // one's order (comm/split.hpp): MPI_Comm_split with key = rank, a collective on this communicator.
  // Called when no started collective is in flight (the engine splits at construction).
  std::unique_ptr<mpi> split(int color) {
    ZERO_CHECK(color >= 0, invalid_argument, "comm::mpi rank ", rank_, ": split color must be >= 0, got ", color);
    ZERO_CHECK(q_->ops.empty(), invalid_argument, "comm::mpi rank ", rank_,
               ": split() while started collectives are in flight; wait for them first");
    if (stuck_) unusable(w_->rec.last().call);
    MPI_Comm part = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, rank_, &part), "MPI_Comm_split", "split");
    std::unique_ptr<mpi> out;
    try {
      out.reset(new mpi(part, opt_));  // which duplicates `part`
    } catch (...) {
      MPI_Comm_free(&part);
      throw;
    }
    MPI_Comm_free(&part);
    return out;
  }

  void barrier() {
    const call_scope scope(*this, fingerprint::make_barrier(w_->seq++, w_->label));
    collective(
        "MPI_Barrier", [&] { return MPI_Barrier(comm_); }, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

 private:
  template <class T>
  fingerprint make(coll_kind kind, std::size_t count, reduce_op op, int root) {
    return fingerprint::make<T>(w_->seq++, kind, count, op, root, w_->label);
  }

  // One public collective in the flight recorder: started (and verified) on construction, ended on
  // a normal return. A collective that throws stays "not ended", which is where this rank stopped.
  class call_scope {
   public:
    call_scope(mpi& m, const fingerprint& f)
        : m_(m), uncaught_(std::uncaught_exceptions()), entry_(m_.w_->rec.begin(f)) {
      m_.w_->wait_in(f, m_.w_->rec.now());
      m_.verify(f);
    }
    ~call_scope() {
      if (std::uncaught_exceptions() != uncaught_) return;
      m_.w_->rec.end(entry_);
      m_.w_->waiting = false;
    }
    call_scope(const call_scope&) = delete;
    call_scope& operator=(const call_scope&) = delete;

   private:
    mpi& m_;
    int uncaught_;
    std::uint64_t entry_;
  };

  // ---- the started collectives ----

  // The system's deallocate takes the allocation's size. (Constructors, not a member initializer: a
  // nested class's initializer is not usable while the enclosing class is incomplete, where
  // unique_ptr's default constructor asks whether the deleter is default-constructible.)
  struct host_free {
    std::size_t bytes;
    host_free() noexcept : bytes(0) {}
    explicit host_free(std::size_t b) noexcept : bytes(b) {}
    void operator()(std::byte* p) const noexcept { system::deallocate(p, bytes); }
  };
  // An exchange buffer of a started collective.
  struct block {
    std::unique_ptr<std::byte, host_free> data;
    std::size_t bytes = 0;
  };
  // One started collective: its first MPI call, what runs when that completes, and, for a
  // deterministic all_reduce, a second MPI call.
  struct op {
    enum class stage { first, second, done };
    std::uint64_t id = 0;
    fingerprint call;
    std::uint64_t entry = 0;     // in the flight recorder
    std::int64_t start_ns = 0;   // recorder time
    const char* mpi_call = "";  // the MPI call in flight, for errors
    stage at = stage::first;
    MPI_Request req = MPI_REQUEST_NULL;
    std::function<void(mpi&)> local;                  // after the first call: the sum, a copy
    std::function<int(mpi&, MPI_Request*)> second;    // then this, on comm2_, when its turn comes
    const char* second_call = "";
    bool second_started = false;
    std::vector<int> counts;  // MPI_Ialltoallv's and MPI_Iallgatherv's counts and displacements
    block scratch;
  };
  // The started collectives in start order, and the exchange buffers of finished ones for reuse;
  // on the heap, shared with the requests, so that a moved backend keeps its requests.
  struct queue {
    mpi* owner = nullptr;
    std::deque<std::unique_ptr<op>> ops;
    std::vector<block> pool;
    std::size_t held_bytes = 0;  // pool + the in-flight collectives' buffers
    std::uint64_t last_id = 0;
  };

  // Records and verifies a collective about to start (what call_scope does for a blocking one).
  std::unique_ptr<op> begin_op(const fingerprint& f) {
    if (stuck_) unusable(f);
    auto o = std::make_unique<op>();
    o->call = f;
    o->entry = w_->rec.begin(f);
    o->start_ns = w_->rec.now();
    verify(f);
    return o;
  }
  // Posts the first MPI call and queues the collective.
  template <class Post>
  request post(std::unique_ptr<op> o, const char* call, Post first) {
    o->mpi_call = call;
    check(first(&o->req), call, to_string(o->call.kind));
    o->id = ++q_->last_id;
    const std::uint64_t id = o->id;
    q_->ops.push_back(std::move(o));
    w_->in_flight = static_cast<std::int32_t>(q_->ops.size());
    // MPI moves a nonblocking collective's data only inside MPI calls (Open MPI has no progress
    // thread by default): each start also advances the collectives already in flight.
    progress();
    return request(q_, id);
  }
  // A collective that completed when started (one rank, no MPI call).
  request done_op(const op& o) {
    w_->rec.end(o.entry);
    return request{};
  }
  template <class T>
  T* op_scratch(op& o, std::size_t elems) {
    const std::size_t bytes = elems * sizeof(T);
    if (bytes == 0) return nullptr;  // MPI reads no buffer for zero counts
    auto& pool = q_->pool;
    // The smallest free buffer that fits, else a new one.
    auto best = pool.end();
    for (auto it = pool.begin(); it != pool.end(); ++it)
      if (it->bytes >= bytes && (best == pool.end() || it->bytes < best->bytes)) best = it;
    if (best != pool.end()) {
      o.scratch = std::move(*best);
      pool.erase(best);
    } else {
      o.scratch.data = {static_cast<std::byte*>(system::allocate(bytes)), host_free{bytes}};
      o.scratch.bytes = bytes;
      q_->held_bytes += bytes;
    }
    return reinterpret_cast<T*>(o.scratch.data.get());
  }

  // Advances the started collectives, oldest first: tests each one's MPI call; runs its local step
  // when the first call has completed; starts a deterministic all_reduce's second call once every
  // older one's has started (the same order on every rank). True if something completed.
  bool progress() {
    bool moved = false, in_order = true;
    for (auto& p : q_->ops) {
      op& o = *p;
      if (o.at != op::stage::done && o.req != MPI_REQUEST_NULL) {
        int done = 0;
        const int rc = MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          stuck_ = true;  // the order of the second calls can no longer be kept
          check(rc, o.mpi_call, to_string(o.call.kind));
        }
        if (done) {
          moved = true;
          if (o.at == op::stage::first && o.local) o.local(*this);
          // The buffer was read by the local step; the second call does not use it.
          if (o.scratch.data) q_->pool.push_back(std::move(o.scratch));
          if (o.second && !o.second_started) {
            o.at = op::stage::second;
          } else {
            o.at = op::stage::done;
            w_->rec.end(o.entry);
          }
        }
      }
      if (o.at == op::stage::second && !o.second_started && in_order) {
        o.mpi_call = o.second_call;
        o.second_started = true;
        const int rc = o.second(*this, &o.req);
        if (rc != MPI_SUCCESS) {
          stuck_ = true;
          check(rc, o.mpi_call, to_string(o.call.kind));
        }
      }
      if (o.second && !o.second_started) in_order = false;
    }
    return moved;
  }

  // Waits for the started collective `id` and removes it.
  void finish(std::uint64_t id) {
    auto& ops = q_->ops;
    auto it = std::find_if(ops.begin(), ops.end(), [id](const auto& p) { return p->id == id; });
    if (it == ops.end()) return;
    const op& o = **it;
    if (o.at != op::stage::done) {
      if (stuck_) unusable(o.call);
      w_->wait_in(o.call, o.start_ns);
      poll([&] {
        progress();
        return o.at == op::stage::done;
      }, o.call, o.mpi_call);
      w_->waiting = false;
    }
    ops.erase(it);
    w_->in_flight = static_cast<std::int32_t>(ops.size());
  }

  [[noreturn]] void unusable(const fingerprint& f) const {
    fail(error_kind::comm, "comm::mpi rank ", rank_, " of ", size_, ": ", f.str(),
         ": the communicator is unusable after an earlier collective timed out or failed");
  }

  void check(int rc, const char* call, const char* operation) const {
    detail::mpi_check(rc, call, operation, rank_, size_);
  }
  // The collective in progress, by name, for MPI's own errors.
  const char* operation() const { return to_string(w_->rec.last().call.kind); }

  // Runs one MPI collective: the blocking call when there is no timeout, else the nonblocking one
  // polled until it completes or the deadline passes. The poll spins for opt_.spin and then sleeps
  // between polls (backoff), so a slow or stopped peer does not cost a core; MPI_Test also drives
  // MPI's progress engine, as MPI_Wait would. A rank that times out probes its peers before it
  // fails, so the error says which rank stopped answering and where the others are.
  template <class Blocking, class Nonblocking>
  void collective(const char* call, Blocking blocking, Nonblocking nonblocking) {
    // A timed-out collective is still pending: a new one could match its messages.
    const fingerprint f = w_->rec.last().call;
    if (stuck_) unusable(f);
    auto ok = [&](int rc) {
      if (rc != MPI_SUCCESS) check(rc, call, operation());
    };
    // Blocking MPI calls only when no started collective is in flight: one whose second step this
    // rank has yet to start would leave a peer waiting for it while this rank waits for that peer.
    if (opt_.timeout.count() <= 0 && q_->ops.empty()) return ok(blocking());
    MPI_Request req = MPI_REQUEST_NULL;
    ok(nonblocking(&req));
    poll([&] {
      int done = 0;
      ok(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (!q_->ops.empty()) progress();
      return done != 0;
    }, f, call);
  }

  // Polls done() (which tests MPI requests and so drives MPI's progress) until it returns true:
  // spinning for opt_.spin, then sleeping between polls (backoff). When opt_.timeout passes first
  // (a positive one), probes the peers and throws zero::error naming `f`, the MPI call and the
  // peers; the communicator is then unusable.
  // `call` is read when the timeout passes: a started all_reduce may be in its second MPI call by then.
  template <class Done>
  void poll(Done done, const fingerprint& f, const char* const& call) {
    const bool timed = opt_.timeout.count() > 0;
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    backoff wait(opt_.spin, opt_.max_sleep);
    for (unsigned polls = 0;; ++polls) {
      const std::int64_t before = wait.sleeping() ? thread_cpu_ns() : 0;
      if (done()) return;
      // An idle MPI_Test costs about a microsecond of CPU; one that copied data cost more. (CPU time,
      // not wall time: a poll that was merely preempted did no work.)
      if (wait.sleeping() && thread_cpu_ns() - before > 20000) wait.progressed(opt_.spin);
      if (wait.sleeping() || polls % 256 == 0) w_->serve_probes();
      if (timed && std::chrono::steady_clock::now() > deadline) break;
      wait.pause();
    }
    stuck_ = true;
    const std::string peers = probe_peers(f);
    fail(error_kind::comm, "comm::mpi rank ", rank_, " of ", size_, ": ", f.str(), " waited ", opt_.timeout.count(),
         " ms in ", call,
         " without completing: a peer failed, stopped, is unreachable, returned without calling it, or called "
         "another collective\n",
         peers, report());
  }

  // Asks every peer, on the side communicator, where it is, and waits up to a quarter of the timeout
  // (at most 2 s) for the answers. A peer answers while it waits in a comm::mpi collective; one that
  // does not answer is stopped, dead, unreachable, or busy outside comm::mpi (returned, computing).
  // The requests and buffers stay with the watch, which outlives a timed-out communicator.
  std::string probe_peers(const fingerprint& mine) {
    detail::mpi_watch& w = *w_;
    if (w.side == MPI_COMM_NULL) return "";
    const auto window = std::clamp(opt_.timeout / 4, std::chrono::milliseconds(1), std::chrono::milliseconds(2000));
    const auto N = static_cast<std::size_t>(size_);
    w.answers.assign(N, detail::rank_status{});
    w.answer_reqs.assign(N, MPI_REQUEST_NULL);
    w.probe_reqs.assign(N, MPI_REQUEST_NULL);
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) continue;
      const auto K = static_cast<std::size_t>(k);
      MPI_Irecv(&w.answers[K], sizeof(detail::rank_status), MPI_BYTE, k, detail::mpi_watch::tag_answer, w.side,
                &w.answer_reqs[K]);
      MPI_Isend(&w.token_out, 1, MPI_INT, k, detail::mpi_watch::tag_probe, w.side, &w.probe_reqs[K]);
    }
    const auto deadline = std::chrono::steady_clock::now() + window;
    backoff wait(std::chrono::microseconds(0), opt_.max_sleep);
    for (;;) {
      bool all = true;
      for (auto& r : w.answer_reqs) {
        int done = 1;
        if (r != MPI_REQUEST_NULL && MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 0;
        all = all && done;
      }
      w.serve_probes();  // peers that time out at the same moment probe this rank too
      if (all || std::chrono::steady_clock::now() > deadline) break;
      wait.pause();
    }
    std::string silent, lines;
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) continue;
      const detail::rank_status& a = w.answers[static_cast<std::size_t>(k)];
      char buf[512];
      fixed_text t(buf, sizeof buf);
      t << "  rank " << k << ": ";
      if (!a.answered) {
        if (!silent.empty()) silent += ", ";
        silent += std::to_string(k);
        t << "no answer";
        if (w.same_machine(k)) {
          const auto pid = w.peers[static_cast<std::size_t>(k)].pid;
          t << " (pid " << pid << " on this machine: " << to_string(state_of(pid)) << ')';
        }
      } else if (a.recorded == 0) {
        t << "answered: no collective yet";
      } else if (a.in_collective) {
        t << "answered: in ";
        a.call.format(t);
        t << " for ";
        t.seconds(a.for_ns, 3) << " s";
        if (a.call.differences(mine)) t << " (not this rank's call)";
      } else {
        t << "answered: not in a collective for ";
        t.seconds(a.for_ns, 3) << " s (last: ";
        a.call.format(t);
        t << ')';
      }
      if (a.answered && a.in_flight > 0) t << ", " << a.in_flight << " started and not waited for";
      lines += t.str();
      lines += '\n';
    }
    std::string head = zero::detail::concat("probes of the peers (", window.count(), " ms): ");
    head += silent.empty() ? std::string("every peer answered")
                           : "no answer from rank " + silent + " (stopped, dead, unreachable, or outside comm::mpi)";
    return head + "\n" + lines;
  }

  // Cancels the standing probe receive and frees the side communicator; false if answers this rank
  // sent are still in flight after a grace period (the watch must then outlive the communicator).
  bool close_side() {
    detail::mpi_watch& w = *w_;
    if (w.incoming != MPI_REQUEST_NULL) {
      MPI_Cancel(&w.incoming);
      MPI_Wait(&w.incoming, MPI_STATUS_IGNORE);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (!w.replies.empty() && std::chrono::steady_clock::now() < until) w.serve_probes();
    if (!w.replies.empty()) return false;
    MPI_Comm_free(&w.side);
    return true;
  }

  static std::int64_t thread_cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }

  // MPI-3 counts are int; a larger message would need derived datatypes, which no caller needs yet.
  int checked_count(std::size_t count, const char* operation) const {
    ZERO_CHECK(count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), invalid_argument, "comm::mpi rank ",
               rank_, ": ", operation, " of ", count, " elements per rank exceeds MPI's int count limit");
    return static_cast<int>(count);
  }

  // One allreduce of (x, -x) with MAX yields the maximum and minus the minimum of every field of the
  // fingerprint: the calls agree exactly when the two coincide. On a mismatch (every rank sees the
  // same result) the ranks gather each other's fingerprints to name both calls.
  void verify(const fingerprint& f) {
    if (!opt_.verify || size_ == 1) return;
    constexpr int fields = 8;
    const long long mine[fields] = {static_cast<long long>(f.seq),
                                    static_cast<long long>(f.kind),
                                    static_cast<long long>(f.type),
                                    static_cast<long long>(f.count),
                                    static_cast<long long>(f.op),
                                    f.root,
                                    static_cast<long long>(f.label_hash >> 32),
                                    static_cast<long long>(f.label_hash & 0xffffffffu)};
    long long v[2 * fields];
    for (int i = 0; i < fields; ++i) {
      v[i] = mine[i];
      v[fields + i] = -mine[i];
    }
    collective(
        "MPI_Allreduce (verify)",
        [&] { return MPI_Allreduce(MPI_IN_PLACE, v, 2 * fields, MPI_LONG_LONG, MPI_MAX, comm_); },
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, v, 2 * fields, MPI_LONG_LONG, MPI_MAX, comm_, r); });
    bool agree = true;
    for (int i = 0; i < fields; ++i) agree = agree && v[i] == -v[fields + i];
    if (agree) return;
    std::vector<fingerprint> all(static_cast<std::size_t>(size_));
    collective(
        "MPI_Allgather (verify)",
        [&] {
          return MPI_Allgather(&f, sizeof(fingerprint), MPI_BYTE, all.data(), sizeof(fingerprint), MPI_BYTE, comm_);
        },
        [&](MPI_Request* r) {
          return MPI_Iallgather(&f, sizeof(fingerprint), MPI_BYTE, all.data(), sizeof(fingerprint), MPI_BYTE, comm_, r);
        });
    int k = 1;
    while (k < size_ && all[static_cast<std::size_t>(k)].same_call(all[0])) ++k;
    if (k == size_) k = 1;  // cannot happen: the fields differ somewhere
    const fingerprint& other = all[static_cast<std::size_t>(k)];
    fail(error_kind::comm, "comm::mpi rank ", rank_, " of ", size_, ": ranks disagree on the collective: rank 0 calls ",
         all[0].str(), ", rank ", k, " calls ", other.str(), " (they differ in ",
         fingerprint::describe(other.differences(all[0])), ")\n", report());
  }

  // out[i] = slice_0[i]; out[i] op= slice_1[i]; ... slice_{N-1}[i], a cache-sized block at a time
  // (the block size does not change the bits: every element sees the same sequence).
  template <class T>
  void sum_in_rank_order(const T* slices, std::size_t len, T* out, reduce_op op) const {
    constexpr std::size_t block = 4096;
    const auto N = static_cast<std::size_t>(size_);
    if constexpr (is_half_v<T>) {
      // As comm::threads: 2-byte floats accumulate in fp32 and are rounded once.
      float acc[block];
      for (std::size_t at = 0; at < len; at += block) {
        const std::size_t b = std::min(block, len - at);
        for (std::size_t i = 0; i < b; ++i) acc[i] = static_cast<float>(slices[at + i]);
        for (std::size_t k = 1; k < N; ++k) detail::combine_widened(acc, slices + k * len + at, b, op);
        for (std::size_t i = 0; i < b; ++i) out[at + i] = store_as<T>(acc[i]);
      }
    } else {
      for (std::size_t at = 0; at < len; at += block) {
        const std::size_t b = std::min(block, len - at);
        std::memcpy(out + at, slices + at, b * sizeof(T));
        for (std::size_t k = 1; k < N; ++k) detail::combine(out + at, slices + k * len + at, b, op);
        if constexpr (std::is_floating_point_v<T>)
          for (std::size_t i = 0; i < b; ++i) out[at + i] = store_as<T>(out[at + i]);  // one NaN on every system
      }
    }
  }

  template <class T>
  T* scratch(std::size_t elems) {
    const std::size_t bytes = elems * sizeof(T);
    if (bytes > scratch_bytes_) {
      scratch_.reset();  // free first: the old and new buffers need not coexist
      scratch_ = {static_cast<std::byte*>(system::allocate(bytes)), host_free{bytes}};
      scratch_bytes_ = bytes;
    }
    return reinterpret_cast<T*>(scratch_.get());
  }
  options opt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1, size_ = 0;
  bool stuck_ = false;  // a collective timed out and is still pending
  MPI_Comm comm2_ = MPI_COMM_NULL;  // the second step of started deterministic all_reduces
  std::unique_ptr<detail::mpi_watch> w_;
  std::shared_ptr<queue> q_ = std::make_shared<queue>();
  std::unique_ptr<std::byte, host_free> scratch_;
  std::size_t scratch_bytes_ = 0;
  std::vector<int> counts_, displs_, from_counts_, from_displs_;  // reused by all_reduce
};
static_assert(CommBackend<mpi>);
static_assert(nonblocking<mpi>);
static_assert(has_all_to_all<mpi> && nonblocking_all_to_all<mpi>);
static_assert(splittable<mpi>);

}  // namespace zero::comm
