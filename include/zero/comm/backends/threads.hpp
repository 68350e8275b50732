// comm::threads: N ranks as threads of one process, with deterministic rank-ordered collectives.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/counted.hpp"
#include "zero/comm/detail/combine.hpp"
#include "zero/comm/detail/streaming_copy.hpp"
#include "zero/comm/detail/threads_world.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/fixed_text.hpp"
#include "zero/core/numeric.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/error.hpp"
#include "zero/sys/host.hpp"

namespace zero::comm {

struct threads_options {
  // How long a rank waits in a collective for its peers before the whole world fails.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // How long a rank that arrives first spins before it parks (0: park at once). Spinning saves the
  // futex wake-up when peers arrive within microseconds; parking makes a long wait free.
  std::chrono::microseconds spin = detail::threads_world::default_spin;
  // Collectives each rank's flight recorder keeps (printed in every comm error).
  std::size_t flight_recorder = 8;
};

class threads {
 public:
  using system = sys::host;
  using options = threads_options;

  // Runs fn(comm) on n ranks, one thread each; returns when all return. If any rank throws, the
  // others' pending and later collectives fail, and the first exception is rethrown here.
  static void launch(int n, const std::function<void(threads&)>& fn, options opt = {}) {
    ZERO_CHECK(n > 0, invalid_argument, "comm::threads::launch: world size must be positive, got ", n);
    detail::threads_world world(n, opt.timeout, "comm::threads", opt.spin, opt.flight_recorder);
    detail::run_ranks(world, n, [&world, &fn](int r) {
      threads comm(world, r);
      fn(comm);
    });
  }

  threads(const threads&) = delete;
  threads& operator=(const threads&) = delete;
  // A sub-communicator (split) leaves its world when destroyed: a peer still waiting in it fails
  // instead of waiting for the timeout.
  ~threads() {
    if (owned_) owned_->depart(rank_);
  }

  int rank() const { return rank_; }
  int size() const { return world_->size(); }

  // Names the following collectives in their fingerprints (the engine labels its calls, e.g. "reduce
  // unit 'fc2'"); returns the previous label. See zero::comm::scoped_label.
  call_label set_call_label(call_label l) { return world_->set_label(rank_, l); }
  // This rank's last collectives, with start and end times.
  const flight_recorder& recorder() const { return world_->recorder(rank_); }
  // Where every rank is and what this rank did last, as printed in comm errors.
  std::string report() const { return world_->report(rank_); }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    enter<T>(detail::coll_kind::all_reduce, send, recv, count, op, 0);
    // Rank r reduces the r-th chunk and writes it to every rank: each element is summed once, in rank
    // order, and chunks are disjoint, so in-place use is safe.
    const std::size_t n = static_cast<std::size_t>(size()), r = static_cast<std::size_t>(rank_);
    const std::size_t begin = count * r / n, end = count * (r + 1) / n;
    for (std::size_t k = 0; k < n; ++k) outs_[k] = world_->slot(static_cast<int>(k)).recv;
    const bool streaming = streams((end - begin) * n * sizeof(T));
    reduce_range<T>(begin, end - begin, outs_.data(), n, begin, op, streaming);
    leave(detail::coll_kind::all_reduce, streaming);
  }

  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    enter<T>(detail::coll_kind::reduce_scatter, send, recv, count, op, 0);
    void* const out[1] = {recv};
    // By the call's whole buffer, as all_reduce and all_gather decide: its N inputs pass through the
    // caches as theirs do, and a slice written with plain stores above 8 MiB measured slower than
    // all_reduce's streamed 16 MiB.
    const bool streaming = streams(count * static_cast<std::size_t>(size()) * sizeof(T));
    reduce_range<T>(count * static_cast<std::size_t>(rank_), count, out, 1, 0, op, streaming);
    leave(detail::coll_kind::reduce_scatter, streaming);
  }

  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    enter<T>(detail::coll_kind::all_gather, send, recv, count, reduce_op::sum, 0);
    // Rank r writes its own block into every rank's output (a push): its block is read once for the
    // N copies, so a rank reads S/N bytes and writes S, where each rank copying every block into its
    // own output (a pull) read S. A rank in place already holds its block where it goes.
    const std::size_t mine = count * static_cast<std::size_t>(rank_);
    std::size_t m = 0;
    for (int k = 0; k < size(); ++k) {
      T* dst = static_cast<T*>(world_->slot(k).recv) + mine;
      if (dst != send) outs_[m++] = dst;
    }
    const bool streaming = streams(count * static_cast<std::size_t>(size()) * sizeof(T));
    if (count > 0) detail::copy_to_each(outs_.data(), m, send, count * sizeof(T), streaming);
    leave(detail::coll_kind::all_gather, streaming);
  }

  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ZERO_CHECK(root >= 0 && root < size(), invalid_argument, "comm::threads rank ", rank_, ": broadcast root ", root,
               " is not in [0, ", size(), ")");
    enter<T>(detail::coll_kind::broadcast, send, recv, count, reduce_op::sum, root);
    const T* src = static_cast<const T*>(world_->slot(root).send);
    const bool streaming = streams(count * sizeof(T));
    if (src != recv && count > 0) copy(recv, src, count * sizeof(T), streaming);
    leave(detail::coll_kind::broadcast, streaming);
  }

  // Block k of send to rank k; recv[k*count..] from rank k (comm/all_to_all.hpp). Each rank copies
  // its blocks out of its peers' send buffers, so send and recv must not overlap.
  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count) {
    enter<T>(detail::coll_kind::all_to_all, send, recv, count, reduce_op::sum, 0);
    const std::size_t bytes = count * sizeof(T), mine = count * static_cast<std::size_t>(rank_);
    const bool streaming = streams(bytes * static_cast<std::size_t>(size()));
    for (int k = 0; k < size() && count > 0; ++k) {
      const T* src = static_cast<const T*>(world_->slot(k).send) + mine;
      copy(recv + count * static_cast<std::size_t>(k), src, bytes, streaming);
    }
    leave(detail::coll_kind::all_to_all, streaming);
  }

  // The ranks that pass the same color form a world of their own, ranked in this world's order
  // (comm/split.hpp). A collective: the colors are all-gathered first, so every rank sees every
  // group, and each group meets at one new threads_world, aborted whenever this one is.
  std::unique_ptr<threads> split(int color) {
    ZERO_CHECK(color >= 0, invalid_argument, "comm::threads rank ", rank_, ": split color must be >= 0, got ", color);
    std::vector<int> colors(static_cast<std::size_t>(size()));
    all_gather(&color, colors.data(), 1);
    int sub_rank = 0, members = 0;
    for (int k = 0; k < size(); ++k)
      if (colors[static_cast<std::size_t>(k)] == color) {
        if (k < rank_) ++sub_rank;
        ++members;
      }
    detail::threads_world& parent = *world_;
    auto child = parent.meet<detail::threads_world>(
        parent.next_split(rank_), color, members,
        [&] {
          return std::make_shared<detail::threads_world>(members, parent.timeout(), parent.backend(), parent.spin(),
                                                         parent.recorder_capacity());
        },
        [](const auto& w) { return w; });
    return std::unique_ptr<threads>(new threads(std::move(child), sub_rank));
  }

  void barrier() {
    world_->announce_barrier(rank_);
    world_->arrive_and_wait(rank_, detail::coll_kind::barrier);
    check_agreement();
    world_->arrive_after_data_phase(rank_, detail::coll_kind::barrier);
    world_->finish(rank_);
  }

 private:
  threads(detail::threads_world& w, int rank)
      : world_(&w), rank_(rank), ins_(static_cast<std::size_t>(w.size())), outs_(static_cast<std::size_t>(w.size())) {}
  threads(std::shared_ptr<detail::threads_world> w, int rank) : threads(*w, rank) { owned_ = std::move(w); }

  // After enter, every rank's announcement agrees and ins_ holds the ranks' send buffers.
  template <class T>
  void enter(detail::coll_kind kind, const T* send, T* recv, std::size_t count, reduce_op op, int root) {
    static_assert(is_wire_type_v<T>, "comm::threads collectives take arithmetic types, zero::bf16 and zero::fp16");
    world_->announce(rank_, kind, send, recv, count, op, root);
    world_->arrive_and_wait(rank_, kind);
    check_agreement();
    for (int k = 0; k < size(); ++k) ins_[static_cast<std::size_t>(k)] = world_->slot(k).send;
  }
  // Nobody returns (and reuses or frees a buffer) until every rank has finished reading and writing,
  // even when the world was aborted meanwhile.
  void leave(detail::coll_kind kind, bool streamed) {
    if (streamed) detail::streaming_fence();  // the output is visible to the peers that see this rank arrive
    world_->arrive_after_data_phase(rank_, kind);
    world_->finish(rank_);
  }

  void check_agreement() { detail::check_agreement(*world_, rank_); }

  // Whether a call that writes `bytes` on this rank bypasses the caches (see streaming_copy.hpp).
  static bool streams(std::size_t bytes) { return bytes >= detail::streaming_threshold; }
  static void copy(void* dst, const void* src, std::size_t bytes, bool streaming) {
    if (streaming) detail::streaming_copy(dst, src, bytes);
    else if (bytes == 256) std::memcpy(dst, src, 256);  // a whole group: a copy of known size, in registers
    else std::memcpy(dst, src, bytes);
  }

  // Reduces elements [from, from + len) of every rank's send buffer (ins_) in rank order and stores
  // the result at [at, at + len) of each of the `outs` buffers in out. One pass: a group of elements
  // (256 bytes of T) is read from every input and combined in registers or L1 before it is stored, so
  // each input byte is read once and each output byte written once, with the inputs read as N
  // parallel streams (a block of kilobytes per input, one after the other, measured 1.3-2x slower
  // at 64 MiB). Sums run on packs of the CPU's widest vectors (detail::sum_group). A group (a pack,
  // where the sums go straight to the one output) is complete before it is stored, so an output that
  // is an input at the same element (in place) is safe. 2-byte floats are summed in fp32 and rounded once; every NaN stored
  // is the canonical one. `streaming`: the output is written with non-temporal stores.
  template <class T>
  void reduce_range(std::size_t from, std::size_t len, void* const* out, std::size_t outs, std::size_t at,
                    reduce_op op, bool streaming) const {
    using A = accumulate_as_t<T>;
    constexpr std::size_t group = 256 / sizeof(T);
    const std::size_t n = ins_.size();
    if (n == 1 && outs == 1 && static_cast<const T*>(out[0]) + at == static_cast<const T*>(ins_[0]) + from) {
      canonical_in_place(static_cast<T*>(out[0]) + at, len);
      return;
    }
    A acc[group];
    [[maybe_unused]] T rounded[std::is_same_v<A, T> ? 1 : group];
    for (std::size_t i = 0; i < len; i += group) {
      const std::size_t g = std::min(group, len - i);
      const T* first = static_cast<const T*>(ins_[0]) + from + i;
      if constexpr (std::is_same_v<A, T>) {
        if (op == reduce_op::sum && n > 1) {
          // One output written with plain stores takes the sums straight from the registers.
          T* sums = outs == 1 && !streaming ? static_cast<T*>(out[0]) + at + i : acc;
          if (detail::sum_group(sums, ins_.data(), n, from + i, g))
            for (std::size_t j = 0; j < g; ++j) sums[j] = store_as<T>(sums[j]);  // one NaN on every system
          if (sums != acc) continue;
        } else {
          if (n == 1) std::memcpy(acc, first, g * sizeof(T));
          else detail::combine_pair(acc, first, static_cast<const T*>(ins_[1]) + from + i, g, op);
          for (std::size_t k = 2; k < n; ++k) detail::combine(acc, static_cast<const T*>(ins_[k]) + from + i, g, op);
          if constexpr (std::is_floating_point_v<T>)
            for (std::size_t j = 0; j < g; ++j) acc[j] = store_as<T>(acc[j]);  // one NaN on every system
        }
        for (std::size_t k = 0; k < outs; ++k) copy(static_cast<T*>(out[k]) + at + i, acc, g * sizeof(T), streaming);
      } else {
        for (std::size_t j = 0; j < g; ++j) acc[j] = static_cast<A>(first[j]);
        for (std::size_t k = 1; k < n; ++k)
          detail::combine_widened(acc, static_cast<const T*>(ins_[k]) + from + i, g, op);
        for (std::size_t j = 0; j < g; ++j) rounded[j] = store_as<T>(acc[j]);
        for (std::size_t k = 0; k < outs; ++k)
          copy(static_cast<T*>(out[k]) + at + i, rounded, g * sizeof(T), streaming);
      }
    }
  }

  // One rank reducing in place (a world of one): the sum is the input itself but for its NaNs, which are
  // stored canonical as every sum's are. A group of elements is read, and written only where it
  // holds a NaN: a 1-rank engine's reduce costs a read of its gradient, not a copy of it onto itself.
  // A NaN is a magnitude (the bits without the sign) above infinity's, so infinity's bits minus its
  // magnitude are negative (the top bit set): a group holds one if the OR of those differences has
  // the top bit, an OR reduction of fixed length that compilers vectorize with the baseline ISA.
  template <class T>
  static void canonical_in_place(T* p, std::size_t len) {
    if constexpr (!std::is_integral_v<T>) {
      using A = accumulate_as_t<T>;
      using U = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                   std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
      static_assert(sizeof(U) == sizeof(T));
      constexpr U magnitude = std::numeric_limits<U>::max() >> 1;  // every bit but the sign
      const T inf_value = static_cast<T>(std::numeric_limits<float>::infinity());
      U inf = 0;
      std::memcpy(&inf, &inf_value, sizeof inf);
      constexpr std::size_t group = 256 / sizeof(T);
      const auto holds_nan = [&](const T* q, std::size_t g) {
        U any = 0;
        for (std::size_t j = 0; j < g; ++j) {
          U b;
          std::memcpy(&b, q + j, sizeof b);
          any |= static_cast<U>(inf - static_cast<U>(b & magnitude));
        }
        return (any & ~magnitude) != 0;
      };
      for (std::size_t i = 0; i < len; i += group) {
        const std::size_t g = std::min(group, len - i);
        if (g == group ? holds_nan(p + i, group) : holds_nan(p + i, g))
          for (std::size_t j = 0; j < g; ++j) p[i + j] = store_as<T>(static_cast<A>(p[i + j]));
      }
    }
  }

  detail::threads_world* world_;
  int rank_;
  std::vector<const void*> ins_;  // each rank's send buffer in the current collective
  std::vector<void*> outs_;       // the buffers this rank writes (all_reduce, all_gather)
  std::shared_ptr<detail::threads_world> owned_;  // a split's world, shared by its members
};
static_assert(CommBackend<threads>);
static_assert(CommBackend<counted<threads>>);
static_assert(has_all_to_all<threads> && has_all_to_all<counted<threads>>);
static_assert(splittable<threads>);

}  // namespace zero::comm
