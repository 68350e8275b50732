// comm::counted<C>: a CommBackend decorator that counts the bytes each rank sends, per collective.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/nonblocking.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/error.hpp"

namespace zero::comm {

enum class collective : int { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };
inline constexpr int collective_count = 5;

inline const char* to_string(collective c) {
  switch (c) {
    case collective::all_reduce:
      return "all_reduce";
    case collective::reduce_scatter:
      return "reduce_scatter";
    case collective::all_gather:
      return "all_gather";
    case collective::broadcast:
      return "broadcast";
    case collective::all_to_all:
      return "all_to_all";
  }
  return "?";
}

// Bytes one rank sends for a collective whose full buffer is `buffer_bytes`, by the bus-volume
// convention of nccl-tests: (N-1)/N of the buffer for reduce_scatter, all_gather and all_to_all,
// 2(N-1)/N for all_reduce, the buffer for broadcast. The buffer is the larger side: size()*count
// elements for reduce_scatter, all_gather and all_to_all. Integer division: exact whenever N divides
// the buffer, as it does for every collective the engine issues.
inline std::uint64_t bus_bytes(collective c, std::uint64_t buffer_bytes, int ranks) {
  const auto n = static_cast<std::uint64_t>(ranks);
  if (n <= 1) return 0;
  switch (c) {
    case collective::all_reduce:
      return 2 * (n - 1) * buffer_bytes / n;
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all:
      return (n - 1) * buffer_bytes / n;
    case collective::broadcast:
      return buffer_bytes;
  }
  return 0;
}

// The part of bus_bytes that crosses between nodes, when the N ranks sit on nodes of `node_size`
// consecutive ranks. The model is the direct one, in which each rank sends each peer what that peer
// needs: for reduce_scatter, all_gather and all_to_all a block of buffer/N to each of the N-1 peers
// (the bus bytes exactly), node_size - 1 of them on the rank's node and N - node_size elsewhere; an
// all_reduce is a reduce_scatter and an all_gather (2 (N - node_size)/N of the buffer between nodes);
// a broadcast's buffer is split among the peers the same way, (N - node_size)/(N - 1) of it. The
// intra-node part is bus_bytes minus this. node_size N (one node): 0; node_size 1: all of it.
inline std::uint64_t inter_node_bytes(collective c, std::uint64_t buffer_bytes, int ranks, int node_size) {
  const auto n = static_cast<std::uint64_t>(ranks), g = static_cast<std::uint64_t>(node_size);
  if (n <= 1 || g >= n) return 0;
  switch (c) {
    case collective::all_reduce:
      return 2 * (n - g) * buffer_bytes / n;
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all:
      return (n - g) * buffer_bytes / n;
    case collective::broadcast:
      return (n - g) * buffer_bytes / (n - 1);
  }
  return 0;
}

// The bus-volume factor by which nccl-tests turns algorithm bandwidth into bus bandwidth.
inline double bus_factor(collective c, int ranks) {
  const double n = ranks;
  if (ranks <= 1) return 0.0;
  switch (c) {
    case collective::all_reduce:
      return 2.0 * (n - 1) / n;
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all:
      return (n - 1) / n;
    case collective::broadcast:
      return 1.0;
  }
  return 0.0;
}

struct comm_stats {
  std::array<std::uint64_t, collective_count> bytes{};  // bus bytes sent by this rank
  std::array<std::uint64_t, collective_count> calls{};
  // The part of `bytes` sent to ranks on other nodes (inter_node_bytes above); the rest stays on
  // the rank's node.
  std::array<std::uint64_t, collective_count> inter{};
  std::uint64_t total_bytes() const {
    std::uint64_t t = 0;
    for (auto b : bytes) t += b;
    return t;
  }
  std::uint64_t inter_node_bytes() const {
    std::uint64_t t = 0;
    for (auto b : inter) t += b;
    return t;
  }
  std::uint64_t intra_node_bytes() const { return total_bytes() - inter_node_bytes(); }
  std::uint64_t operator[](collective c) const { return bytes[static_cast<int>(c)]; }
  comm_stats operator-(const comm_stats& o) const {
    comm_stats d;
    for (int i = 0; i < collective_count; ++i) {
      d.bytes[i] = bytes[i] - o.bytes[i];
      d.calls[i] = calls[i] - o.calls[i];
      d.inter[i] = inter[i] - o.inter[i];
    }
    return d;
  }
  comm_stats operator+(const comm_stats& o) const {
    comm_stats d;
    for (int i = 0; i < collective_count; ++i) {
      d.bytes[i] = bytes[i] + o.bytes[i];
      d.calls[i] = calls[i] + o.calls[i];
      d.inter[i] = inter[i] + o.inter[i];
    }
    return d;
  }
};

// Wraps a backend by reference; forwards every call and adds its bus bytes to stats(), and their
// inter-node part given the ranks' nodes (set_node_size; by default one node holds every rank). It
// always offers the nonblocking calls (comm/nonblocking.hpp): forwarded where the wrapped backend has
// them, the blocking call otherwise (its request is complete at once), and all_to_all where the
// wrapped backend has it (comm/all_to_all.hpp). Bytes are counted when a collective starts.
template <CommBackend C>
class counted {
 public:
  using system = typename C::system;
  using request = request_of_t<C>;
  // Whether start_* can return before the collective completes: C is nonblocking.
  static constexpr bool can_overlap = nonblocking<C>;
  // Whether it does: can_overlap, and where C decides at run time (comm::any_backend), C's answer.
  bool overlaps() const {
    if constexpr (overlap_decided_at_run_time<C>) return inner_->overlaps();
    else return can_overlap;
  }
  explicit counted(C& inner) : inner_(&inner), node_size_(inner.size()) {}
  // Counts on `inner` from now on (the node size reset to all of it; the counts so far kept): an
  // engine moves its links to its shard group once the ranks agree on it (engine/replica_groups.hpp).
  void rebind(C& inner) {
    inner_ = &inner;
    node_size_ = inner.size();
  }

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  C& inner() const { return *inner_; }
  const comm_stats& stats() const { return stats_; }
  void reset() { stats_ = {}; }
  // The ranks sit on nodes of `g` consecutive ranks (g divides size(); g = size(): one node, whose
  // traffic is all intra-node; g = 1: every peer is on another node).
  void set_node_size(int g) {
    ZERO_CHECK(g >= 1 && size() % g == 0, invalid_argument, "comm::counted rank ", rank(), ": node size ", g,
               " does not divide the world size ", size());
    node_size_ = g;
  }
  int node_size() const { return node_size_; }
  // Forwards call labels where the wrapped backend takes them.
  call_label set_call_label(call_label l) requires labels_calls<C> { return inner_->set_call_label(l); }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    inner_->all_reduce(send, recv, count, op);
    add(collective::all_reduce, count * sizeof(T));
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    inner_->reduce_scatter(send, recv, count, op);
    add(collective::reduce_scatter, count * sizeof(T) * static_cast<std::size_t>(size()));
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    inner_->all_gather(send, recv, count);
    add(collective::all_gather, count * sizeof(T) * static_cast<std::size_t>(size()));
  }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    inner_->broadcast(send, recv, count, root);
    add(collective::broadcast, count * sizeof(T));
  }
  void barrier() { inner_->barrier(); }
  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count)
    requires has_all_to_all<C>
  {
    inner_->all_to_all(send, recv, count);
    add(collective::all_to_all, count * sizeof(T) * static_cast<std::size_t>(size()));
  }

  template <class T>
  request start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    return start(collective::all_reduce, count * sizeof(T),
                 [&](auto& c) { return c.start_all_reduce(send, recv, count, op); },
                 [&](auto& c) { c.all_reduce(send, recv, count, op); });
  }
  template <class T>
  request start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    return start(collective::reduce_scatter, count * sizeof(T) * static_cast<std::size_t>(size()),
                 [&](auto& c) { return c.start_reduce_scatter(send, recv, count, op); },
                 [&](auto& c) { c.reduce_scatter(send, recv, count, op); });
  }
  template <class T>
  request start_all_gather(const T* send, T* recv, std::size_t count) {
    return start(collective::all_gather, count * sizeof(T) * static_cast<std::size_t>(size()),
                 [&](auto& c) { return c.start_all_gather(send, recv, count); },
                 [&](auto& c) { c.all_gather(send, recv, count); });
  }
  // Nonblocking where the wrapped backend starts all_to_all, blocking (a complete request) otherwise.
  template <class T>
  request start_all_to_all(const T* send, T* recv, std::size_t count)
    requires has_all_to_all<C>
  {
    request r{};
    if constexpr (can_overlap && nonblocking_all_to_all<C>) r = inner_->start_all_to_all(send, recv, count);
    else inner_->all_to_all(send, recv, count);
    add(collective::all_to_all, count * sizeof(T) * static_cast<std::size_t>(size()));
    return r;
  }
  void wait(request& r) {
    if constexpr (can_overlap) inner_->wait(r);
  }

 private:
  template <class Start, class Blocking>
  request start(collective c, std::uint64_t buffer_bytes, Start nonblocking_call, Blocking blocking_call) {
    request r{};
    if constexpr (can_overlap) r = nonblocking_call(*inner_);
    else blocking_call(*inner_);
    add(c, buffer_bytes);
    return r;
  }
  void add(collective c, std::uint64_t buffer_bytes) {
    stats_.bytes[static_cast<int>(c)] += bus_bytes(c, buffer_bytes, size());
    stats_.inter[static_cast<int>(c)] += inter_node_bytes(c, buffer_bytes, size(), node_size_);
    stats_.calls[static_cast<int>(c)] += 1;
  }
  C* inner_;
  int node_size_;
  comm_stats stats_;
};
}  // namespace zero::comm
