// comm::threads: N ranks as threads of one process, with deterministic rank-ordered collectives.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "zero/comm/reduce_op.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/numeric.hpp"
#include "zero/error.hpp"
#include "zero/sys/host.hpp"

namespace zero::comm {

namespace detail {

enum class coll_kind : int { all_reduce, reduce_scatter, all_gather, broadcast, barrier };

inline const char* to_string(coll_kind k) {
  switch (k) {
    case coll_kind::all_reduce: return "all_reduce";
    case coll_kind::reduce_scatter: return "reduce_scatter";
    case coll_kind::all_gather: return "all_gather";
    case coll_kind::broadcast: return "broadcast";
    case coll_kind::barrier: return "barrier";
  }
  return "?";
}

// What one rank announces when it enters a collective; every rank checks that all announcements agree
// before any of them touches another rank's buffer.
struct announcement {
  coll_kind kind = coll_kind::barrier;
  std::size_t count = 0;
  std::size_t elem_size = 0;
  reduce_op op = reduce_op::sum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  bool operator_matches(const announcement& o) const {
    return kind == o.kind && count == o.count && elem_size == o.elem_size && op == o.op && root == o.root;
  }
};

// The state the ranks of one launch share: a generation-counting barrier that can be aborted, and
// one announcement slot per rank. Shared by every backend whose ranks are threads of one process
// (comm::threads, comm::cuda_threads); `backend` names the backend in its errors.
class threads_world {
 public:
  threads_world(int n, std::chrono::milliseconds timeout, const char* backend = "comm::threads")
      : n_(n), timeout_(timeout), backend_(backend), slots_(static_cast<std::size_t>(n)),
        departed_(static_cast<std::size_t>(n)) {}

  int size() const { return n_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const char* backend() const { return backend_; }
  announcement& slot(int r) { return slots_[static_cast<std::size_t>(r)]; }

  // Blocks until every rank arrives. Throws zero::error (comm) instead of waiting forever when the
  // world is aborted, a rank has already returned from its function, or the timeout passes.
  void arrive_and_wait(int rank, coll_kind what) {
    std::unique_lock lk(m_);
    throw_if_aborted(rank, what);
    const std::uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (generation_ == gen) {
      throw_if_aborted(rank, what);
      for (int k = 0; k < n_; ++k)
        if (departed_[static_cast<std::size_t>(k)]) {
          abort_locked(zero::detail::concat("rank ", k, " returned while rank ", rank, " waits in ", to_string(what)));
          throw_if_aborted(rank, what);
        }
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && generation_ == gen) {
        abort_locked(zero::detail::concat("rank ", rank, " waited ", timeout_.count(), " ms in ", to_string(what),
                                    " but only ", arrived_, " of ", n_, " ranks arrived"));
        throw_if_aborted(rank, what);
      }
    }
  }

  void abort(const std::string& reason) {
    std::lock_guard lk(m_);
    abort_locked(reason);
  }
  void depart(int rank) {
    std::lock_guard lk(m_);
    departed_[static_cast<std::size_t>(rank)] = 1;
    cv_.notify_all();
  }
  // Keeps the first failure: it is the cause; the errors it triggers on other ranks come later.
  void record_failure(int rank, std::exception_ptr e, const std::string& what) {
    std::lock_guard lk(m_);
    if (!first_failure_) first_failure_ = e;
    abort_locked(zero::detail::concat("rank ", rank, " failed: ", what));
  }
  std::exception_ptr first_failure() const { return first_failure_; }

 private:
  void abort_locked(const std::string& reason) {
    if (!aborted_) {
      aborted_ = true;
      reason_ = reason;
    }
    cv_.notify_all();
  }
  void throw_if_aborted(int rank, coll_kind what) const {
    if (aborted_) fail(error_kind::comm, backend_, " rank ", rank, ": ", to_string(what), " aborted: ", reason_);
  }

  int n_;
  std::chrono::milliseconds timeout_;
  const char* backend_;
  std::vector<announcement> slots_;
  std::vector<char> departed_;
  std::mutex m_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  int arrived_ = 0;
  bool aborted_ = false;
  std::string reason_;
  std::exception_ptr first_failure_;
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
// whose size it has misjudged.
inline void check_agreement(threads_world& world, int rank) {
  const auto& first = world.slot(0);
  for (int k = 1; k < world.size(); ++k) {
    const auto& a = world.slot(k);
    if (!a.operator_matches(first)) {
      std::string msg = zero::detail::concat(
          world.backend(), " rank ", rank, ": ranks disagree on the collective: rank 0 calls ", to_string(first.kind),
          "(count ", first.count, ", ", first.elem_size, "-byte elements), rank ", k, " calls ", to_string(a.kind),
          "(count ", a.count, ", ", a.elem_size, "-byte elements)");
      world.abort(msg);
      fail(error_kind::comm, msg);
    }
  }
}

template <class T>
void combine(T* acc, const T* x, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
}

template <class A, class T>
void combine_widened(A* acc, const T* x, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(x[i]);
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], static_cast<A>(x[i]));
}

}  // namespace detail

struct threads_options {
  // How long a rank waits in a collective for its peers before the whole world fails.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class threads {
 public:
  using system = sys::host;
  using options = threads_options;

  // Runs fn(comm) on n ranks, one thread each; returns when all return. If any rank throws, the
  // others' pending and later collectives fail, and the first exception is rethrown here.
  static void launch(int n, const std::function<void(threads&)>& fn, options opt = {}) {
    ZERO_CHECK(n > 0, invalid_argument, "comm::threads::launch: world size must be positive, got ", n);
    detail::threads_world world(n, opt.timeout);
    detail::run_ranks(world, n, [&world, &fn](int r) {
      threads comm(world, r);
      fn(comm);
    });
  }

  int rank() const { return rank_; }
  int size() const { return world_->size(); }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    auto peers = enter<T>(detail::coll_kind::all_reduce, send, recv, count, op, 0);
    // Rank r reduces the r-th chunk and writes it to every rank: each element is summed once, in rank
    // order, and chunks are disjoint, so in-place use is safe.
    const std::size_t n = static_cast<std::size_t>(size()), r = static_cast<std::size_t>(rank_);
    const std::size_t begin = count * r / n, end = count * (r + 1) / n;
    reduce_blocks<T>(peers, begin, end, op, [&](std::size_t at, const T* block, std::size_t len) {
      for (std::size_t k = 0; k < n; ++k)
        std::memcpy(static_cast<T*>(world_->slot(static_cast<int>(k)).recv) + at, block, len * sizeof(T));
    });
    leave(detail::coll_kind::all_reduce);
  }

  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    auto peers = enter<T>(detail::coll_kind::reduce_scatter, send, recv, count, op, 0);
    const std::size_t base = count * static_cast<std::size_t>(rank_);
    reduce_blocks<T>(peers, base, base + count, op,
                     [&](std::size_t at, const T* block, std::size_t len) {
                       std::memcpy(recv + (at - base), block, len * sizeof(T));
                     });
    leave(detail::coll_kind::reduce_scatter);
  }

  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    enter<T>(detail::coll_kind::all_gather, send, recv, count, reduce_op::sum, 0);
    for (int k = 0; k < size(); ++k) {
      const T* src = static_cast<const T*>(world_->slot(k).send);
      T* dst = recv + count * static_cast<std::size_t>(k);
      if (src != dst && count > 0) std::memcpy(dst, src, count * sizeof(T));
    }
    leave(detail::coll_kind::all_gather);
  }

  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ZERO_CHECK(root >= 0 && root < size(), invalid_argument, "comm::threads rank ", rank_, ": broadcast root ", root,
               " is not in [0, ", size(), ")");
    enter<T>(detail::coll_kind::broadcast, send, recv, count, reduce_op::sum, root);
    const T* src = static_cast<const T*>(world_->slot(root).send);
    if (src != recv && count > 0) std::memcpy(recv, src, count * sizeof(T));
    leave(detail::coll_kind::broadcast);
  }

  void barrier() {
    world_->slot(rank_) = detail::announcement{};
    world_->arrive_and_wait(rank_, detail::coll_kind::barrier);
    check_agreement();
    world_->arrive_and_wait(rank_, detail::coll_kind::barrier);
  }

 private:
  threads(detail::threads_world& w, int rank) : world_(&w), rank_(rank) {}

  template <class T>
  std::vector<const T*> enter(detail::coll_kind kind, const T* send, T* recv, std::size_t count, reduce_op op,
                              int root) {
    static_assert(is_wire_type_v<T>, "comm::threads collectives take arithmetic types, zero::bf16 and zero::fp16");
    world_->slot(rank_) = detail::announcement{kind, count, sizeof(T), op, root, send, recv};
    world_->arrive_and_wait(rank_, kind);
    check_agreement();
    std::vector<const T*> peers(static_cast<std::size_t>(size()));
    for (int k = 0; k < size(); ++k) peers[static_cast<std::size_t>(k)] = static_cast<const T*>(world_->slot(k).send);
    return peers;
  }
  // Nobody returns (and reuses a buffer) until every rank has finished reading and writing.
  void leave(detail::coll_kind kind) { world_->arrive_and_wait(rank_, kind); }

  void check_agreement() { detail::check_agreement(*world_, rank_); }

  // Reduces [begin, end) of all peers' send buffers in rank order, a cache-sized block at a time,
  // and hands each finished block to emit. The block is reduced completely before emit writes, so
  // a receive buffer that aliases a send buffer is safe. 2-byte floats are summed in fp32 and
  // rounded once.
  template <class T, class Emit>
  static void reduce_blocks(const std::vector<const T*>& peers, std::size_t begin, std::size_t end, reduce_op op,
                            Emit emit) {
    using A = accumulate_as_t<T>;
    constexpr std::size_t block = 2048;
    A acc[block];
    [[maybe_unused]] T out[std::is_same_v<A, T> ? 1 : block];
    for (std::size_t at = begin; at < end; at += block) {
      const std::size_t len = std::min(block, end - at);
      if constexpr (std::is_same_v<A, T>) {
        std::memcpy(acc, peers[0] + at, len * sizeof(T));
        for (std::size_t k = 1; k < peers.size(); ++k) detail::combine(acc, peers[k] + at, len, op);
        if constexpr (std::is_floating_point_v<T>)
          for (std::size_t i = 0; i < len; ++i) acc[i] = store_as<T>(acc[i]);  // one NaN on every system
        emit(at, acc, len);
      } else {
        for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<A>(peers[0][at + i]);
        for (std::size_t k = 1; k < peers.size(); ++k) detail::combine_widened(acc, peers[k] + at, len, op);
        for (std::size_t i = 0; i < len; ++i) out[i] = store_as<T>(acc[i]);
        emit(at, out, len);
      }
    }
  }

  detail::threads_world* world_;
  int rank_;
};
static_assert(CommBackend<threads>);

}  // namespace zero::comm
