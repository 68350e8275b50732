// comm::mpi: ranks as MPI processes; by default the sums are rank-ordered and bit-identical to comm::threads.
#pragma once

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
#include <string>
#include <utility>
#include <vector>

#include "zero/comm/mpi_session.hpp"  // <mpi.h> without the deprecated C++ bindings
#include "zero/comm/reduce_op.hpp"
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

enum class mpi_mode {
  // reduce_scatter = MPI_Alltoall of the N slices + a local sum in rank order 0..N-1; all_reduce =
  // that + MPI_Allgatherv. Bit-identical to comm::threads; holds a scratch of the full buffer.
  deterministic,
  // MPI_Reduce_scatter_block / MPI_Allreduce: whatever order the MPI library's algorithm picks
  // (it may depend on N, the message size and the tuning), so results may differ in the last bits.
  fast,
};

struct mpi_options {
  mpi_mode mode = mpi_mode::deterministic;
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
// go on: its peers may be blocked in a collective it will never enter, and MPI has no timeout.
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

class mpi {
 public:
  using system = sys::host;
  using options = mpi_options;

  // Wraps a duplicate of `comm` (a collective call on comm): the duplicate gets MPI_ERRORS_RETURN
  // without changing the caller's error handler, and its traffic cannot mix with the caller's.
  explicit mpi(MPI_Comm comm = MPI_COMM_WORLD, options opt = {}) : opt_(opt) {
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
        scratch_(std::move(o.scratch_)), scratch_bytes_(std::exchange(o.scratch_bytes_, 0)) {}
  mpi& operator=(mpi&&) = delete;
  ~mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

  // Runs fn(comm) on this process's rank of `comm` and returns what fn returns. If fn throws, it
  // prints "rank R failed: <what>" and ends the job with MPI_Abort: the other ranks may be waiting
  // in a collective this rank will never enter, and ending the job is the only way not to hang.
  template <class Fn>
  static decltype(auto) run(Fn&& fn, options opt = {}, MPI_Comm comm = MPI_COMM_WORLD) {
    try {
      mpi c(comm, opt);
      return std::invoke(std::forward<Fn>(fn), c);
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
    if (opt_.mode == mpi_mode::fast) {
      check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n, type, detail::mpi_op(op), comm_),
            "MPI_Allreduce", "all_reduce");
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
    check(MPI_Alltoallv(send, counts_.data(), displs_.data(), type, slices, from_counts_.data(),
                        from_displs_.data(), type, comm_),
          "MPI_Alltoallv", "all_reduce");
    // send has been read entirely, so writing recv is safe even when it is send.
    sum_in_rank_order(slices, mine, recv + displs_[static_cast<std::size_t>(rank_)], op);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, counts_.data(), displs_.data(), type, comm_),
          "MPI_Allgatherv", "all_reduce");
  }

  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    verify(what::reduce_scatter, count, sizeof(T), op, 0);
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "reduce_scatter");
    const auto N = static_cast<std::size_t>(size_);
    if (opt_.mode == mpi_mode::fast) {
      // MPI forbids aliased buffers; the in-place form (recv inside send) goes through scratch.
      if (!detail::overlaps(send, N * count * sizeof(T), recv, count * sizeof(T))) {
        check(MPI_Reduce_scatter_block(send, recv, n, type, detail::mpi_op(op), comm_), "MPI_Reduce_scatter_block",
              "reduce_scatter");
      } else {
        T* tmp = scratch<T>(count);
        check(MPI_Reduce_scatter_block(send, tmp, n, type, detail::mpi_op(op), comm_), "MPI_Reduce_scatter_block",
              "reduce_scatter");
        system::copy(recv, tmp, count * sizeof(T));
      }
      return;
    }
    if (size_ == 1) return system::copy(recv, send, count * sizeof(T));
    // Each rank sends slice k to rank k and receives every rank's copy of its own slice: (N-1)/N of
    // the buffer on the wire, as in a ring, but the sum is then done here in rank order.
    T* slices = scratch<T>(N * count);
    check(MPI_Alltoall(send, n, type, slices, n, type, comm_), "MPI_Alltoall", "reduce_scatter");
    sum_in_rank_order(slices, count, recv, op);
  }

  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    verify(what::all_gather, count, sizeof(T), reduce_op::sum, 0);
    const MPI_Datatype type = mpi_datatype<T>::get();
    const int n = checked_count(count, "all_gather");
    if (send == recv + count * static_cast<std::size_t>(rank_))
      check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, type, comm_), "MPI_Allgather", "all_gather");
    else
      check(MPI_Allgather(send, n, type, recv, n, type, comm_), "MPI_Allgather", "all_gather");
  }

  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ZERO_CHECK(root >= 0 && root < size_, invalid_argument, "comm::mpi rank ", rank_, ": broadcast root ", root,
               " is not in [0, ", size_, ")");
    verify(what::broadcast, count, sizeof(T), reduce_op::sum, root);
    const int n = checked_count(count, "broadcast");
    if (rank_ == root) system::copy(recv, send, count * sizeof(T));
    check(MPI_Bcast(recv, n, mpi_datatype<T>::get(), root, comm_), "MPI_Bcast", "broadcast");
  }

  void barrier() {
    verify(what::barrier, 0, 0, reduce_op::sum, 0);
    check(MPI_Barrier(comm_), "MPI_Barrier", "barrier");
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
    check(MPI_Allreduce(MPI_IN_PLACE, v, 2 * fields, MPI_LONG_LONG, MPI_MAX, comm_), "MPI_Allreduce", "verify");
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
    for (std::size_t at = 0; at < len; at += block) {
      const std::size_t b = std::min(block, len - at);
      std::memcpy(out + at, slices + at, b * sizeof(T));
      for (std::size_t k = 1; k < N; ++k) detail::combine(out + at, slices + k * len + at, b, op);
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
  std::unique_ptr<std::byte, host_free> scratch_;
  std::size_t scratch_bytes_ = 0;
  std::vector<int> counts_, displs_, from_counts_, from_displs_;  // reused by all_reduce
};
static_assert(CommBackend<mpi>);

}  // namespace zero::comm
