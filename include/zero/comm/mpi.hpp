// comm::mpi: ranks as MPI processes; by default the sums are rank-ordered and bit-identical to comm::threads.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zero/comm/mpi_session.hpp"  // <mpi.h> without the deprecated C++ bindings
#include "zero/comm/reduce_op.hpp"
#include "zero/core/numeric.hpp"
#include "zero/comm/threads.hpp"  // detail::combine: the one definition of a rank-ordered step
#include "zero/concepts/comm_backend.hpp"
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
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Before each collective, one small MPI_Allreduce compares (operation, count, element size, op,
  // root) over ranks, so a mismatched call fails with zero::error on every rank instead of
  // truncating a message or hanging. Costs one latency-bound round per collective.
  bool verify = false;
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
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  mpi(mpi&& o) noexcept
      : opt_(o.opt_), comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_),
        stuck_(o.stuck_), scratch_(std::move(o.scratch_)), scratch_bytes_(std::exchange(o.scratch_bytes_, 0)) {}
  mpi& operator=(mpi&&) = delete;
  ~mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A timed-out collective is still pending on the communicator; freeing it would be erroneous.
    if (comm_ != MPI_COMM_NULL && !finalized && !stuck_) MPI_Comm_free(&comm_);
  }

  // Runs fn(comm) on this process's rank of `comm` and returns what fn returns. If fn throws, it
  // prints "rank R failed: <what>" and ends the job with MPI_Abort: the other ranks may be waiting
  // in a collective this rank will never enter, and ending the job is the only way not to hang.
  template <class Fn>
  static decltype(auto) run(Fn&& fn, options opt = options{}, MPI_Comm comm = MPI_COMM_WORLD) {
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
  // Bytes held by the exchange buffer of the deterministic mode: the largest full buffer so far.
  std::size_t scratch_bytes() const { return scratch_bytes_; }
  void release_scratch() {
    scratch_.reset();
    scratch_bytes_ = 0;
  }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    verify(what::all_reduce, count, sizeof(T), op, 0);
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_reduce");
    if (opt_.mode == mpi_mode::fast && !is_half_v<T>) {
      const void* in = send == recv ? MPI_IN_PLACE : send;
      const MPI_Op mop = detail::mpi_op(op);
      collective(
          "all_reduce", "MPI_Allreduce", [&] { return MPI_Allreduce(in, recv, n, type, mop, comm_); },
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
        "all_reduce", "MPI_Alltoallv",
        [&] { return MPI_Alltoallv(send, sc, sd, type, slices, rc, rd, type, comm_); },
        [&](MPI_Request* r) { return MPI_Ialltoallv(send, sc, sd, type, slices, rc, rd, type, comm_, r); });
    // send has been read entirely, so writing recv is safe even when it is send.
    sum_in_rank_order(slices, mine, recv + displs_[static_cast<std::size_t>(rank_)], op);
    collective(
        "all_reduce", "MPI_Allgatherv",
        [&] { return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, sc, sd, type, comm_); },
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, sc, sd, type, comm_, r);
        });
  }

  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    verify(what::reduce_scatter, count, sizeof(T), op, 0);
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "reduce_scatter");
    const auto N = static_cast<std::size_t>(size_);
    if (opt_.mode == mpi_mode::fast && !is_half_v<T>) {
      // MPI forbids aliased buffers; the in-place form (recv inside send) goes through scratch.
      const bool aliased = detail::overlaps(send, N * count * sizeof(T), recv, count * sizeof(T));
      T* out = aliased ? scratch<T>(count) : recv;
      const MPI_Op mop = detail::mpi_op(op);
      collective(
          "reduce_scatter", "MPI_Reduce_scatter_block",
          [&] { return MPI_Reduce_scatter_block(send, out, n, type, mop, comm_); },
          [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, out, n, type, mop, comm_, r); });
      if (aliased) system::copy(recv, out, count * sizeof(T));
      return;
    }
    if (size_ == 1) return system::copy(recv, send, count * sizeof(T));
    // Each rank sends slice k to rank k and receives every rank's copy of its own slice: (N-1)/N of
    // the buffer on the wire, as in a ring, but the sum is then done here in rank order.
    T* slices = scratch<T>(N * count);
    collective(
        "reduce_scatter", "MPI_Alltoall", [&] { return MPI_Alltoall(send, n, type, slices, n, type, comm_); },
        [&](MPI_Request* r) { return MPI_Ialltoall(send, n, type, slices, n, type, comm_, r); });
    sum_in_rank_order(slices, count, recv, op);
  }

  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    verify(what::all_gather, count, sizeof(T), reduce_op::sum, 0);
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_gather");
    // NCCL's in-place rule (send is this rank's slot of recv) is MPI_IN_PLACE for MPI.
    const bool in_place = send == recv + count * static_cast<std::size_t>(rank_);
    const void* in = in_place ? MPI_IN_PLACE : send;
    const int in_count = in_place ? 0 : n;
    const MPI_Datatype in_type = in_place ? MPI_DATATYPE_NULL : type;
    collective(
        "all_gather", "MPI_Allgather", [&] { return MPI_Allgather(in, in_count, in_type, recv, n, type, comm_); },
        [&](MPI_Request* r) { return MPI_Iallgather(in, in_count, in_type, recv, n, type, comm_, r); });
  }

  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ZERO_CHECK(root >= 0 && root < size_, invalid_argument, "comm::mpi rank ", rank_, ": broadcast root ", root,
               " is not in [0, ", size_, ")");
    verify(what::broadcast, count, sizeof(T), reduce_op::sum, root);
    const int n = checked_count(count, "broadcast");
    if (rank_ == root) system::copy(recv, send, count * sizeof(T));
    const MPI_Datatype type = mpi_datatype<T>::get();
    collective(
        "broadcast", "MPI_Bcast", [&] { return MPI_Bcast(recv, n, type, root, comm_); },
        [&](MPI_Request* r) { return MPI_Ibcast(recv, n, type, root, comm_, r); });
  }

  void barrier() {
    verify(what::barrier, 0, 0, reduce_op::sum, 0);
    collective(
        "barrier", "MPI_Barrier", [&] { return MPI_Barrier(comm_); },
        [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

 private:
  enum class what : int { all_reduce, reduce_scatter, all_gather, broadcast, barrier };
  static const char* to_string(what w) {
    switch (w) {
      case what::all_reduce: return "all_reduce";
      case what::reduce_scatter: return "reduce_scatter";
      case what::all_gather: return "all_gather";
      case what::broadcast: return "broadcast";
      case what::barrier: return "barrier";
    }
    return "?";
  }

  void check(int rc, const char* call, const char* operation) const {
    detail::mpi_check(rc, call, operation, rank_, size_);
  }

  // Runs one MPI collective: the blocking call when there is no timeout, else the nonblocking one
  // polled until it completes or the deadline passes. MPI_Test drives MPI's progress engine (and
  // yields the core when Open MPI runs oversubscribed), as MPI_Wait would.
  template <class Blocking, class Nonblocking>
  void collective(const char* operation, const char* call, Blocking blocking, Nonblocking nonblocking) {
    if (opt_.timeout.count() <= 0) return check(blocking(), call, operation);
    MPI_Request req = MPI_REQUEST_NULL;
    check(nonblocking(&req), call, operation);
    const auto start = std::chrono::steady_clock::now();
    for (int done = 0;;) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), call, operation);
      if (done) return;
      if (std::chrono::steady_clock::now() - start > opt_.timeout) {
        stuck_ = true;
        fail(error_kind::comm, "comm::mpi rank ", rank_, " of ", size_, ": ", operation, " waited ",
             opt_.timeout.count(), " ms in ", call,
             " without completing: a peer failed, returned without calling it, or called another collective");
      }
    }
  }

  // MPI-3 counts are int; a larger message would need derived datatypes, which no caller needs yet.
  int checked_count(std::size_t count, const char* operation) const {
    ZERO_CHECK(count <= static_cast<std::size_t>(std::numeric_limits<int>::max()), invalid_argument, "comm::mpi rank ",
               rank_, ": ", operation, " of ", count, " elements per rank exceeds MPI's int count limit");
    return static_cast<int>(count);
  }

  // One allreduce of (x, -x) with MAX yields the maximum and minus the minimum of every field: the
  // calls agree exactly when the two coincide.
  void verify(what w, std::size_t count, std::size_t elem_size, reduce_op op, int root) {
    if (!opt_.verify || size_ == 1) return;
    constexpr int fields = 5;
    const long long mine[fields] = {static_cast<long long>(w), static_cast<long long>(count),
                                    static_cast<long long>(elem_size), static_cast<long long>(op), root};
    long long v[2 * fields];
    for (int i = 0; i < fields; ++i) {
      v[i] = mine[i];
      v[fields + i] = -mine[i];
    }
    collective(
        to_string(w), "MPI_Allreduce (verify)",
        [&] { return MPI_Allreduce(MPI_IN_PLACE, v, 2 * fields, MPI_LONG_LONG, MPI_MAX, comm_); },
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, v, 2 * fields, MPI_LONG_LONG, MPI_MAX, comm_, r); });
    for (int i = 0; i < fields; ++i)
      if (v[i] != -v[fields + i])
        fail(error_kind::comm, "comm::mpi rank ", rank_, ": ranks disagree on the collective: this rank calls ",
             to_string(w), "(count ", count, ", ", elem_size, "-byte elements, op ", zero::to_string(op), ", root ",
             root, "), and over the ranks ", field_name(i), " ranges from ", -v[fields + i], " to ", v[i]);
  }
  static const char* field_name(int i) {
    static const char* const names[] = {"the operation", "the count", "the element size", "the reduction op",
                                        "the root"};
    return names[i];
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
      scratch_.reset(static_cast<std::byte*>(system::allocate(bytes)));
      scratch_bytes_ = bytes;
    }
    return reinterpret_cast<T*>(scratch_.get());
  }
  struct host_free {
    void operator()(std::byte* p) const noexcept { system::deallocate(p, 0); }
  };

  options opt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1, size_ = 0;
  bool stuck_ = false;  // a collective timed out and is still pending
  std::unique_ptr<std::byte, host_free> scratch_;
  std::size_t scratch_bytes_ = 0;
  std::vector<int> counts_, displs_, from_counts_, from_displs_;  // reused by all_reduce
};
static_assert(CommBackend<mpi>);

}  // namespace zero::comm
