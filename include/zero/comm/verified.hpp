// comm::verified<C>: a CommBackend decorator checking that the ranks make the same call and its results are right.
#pragma once

// What it checks, call by call, before handing the call to the wrapped backend and after it:
//
//  1. Agreement. Each rank's fingerprint of the call (comm/fingerprint.hpp: the call number, the
//     collective, the element type, the count, the op, the root, and the call label where the caller
//     sets one, as the engine does: "reduce unit 'fc2'") is all-gathered first; ranks that differ
//     fail before any data moves.
//  2. The data. After the call, each rank's evidence is all-gathered and every rank checks every
//     rank's, so all of them throw the same error or none does:
//       all_reduce       the result's checksum (XXH3 where xxHash is installed, core/hash.hpp's
//                        run_hash64): equal on every rank; and at `samples` positions the ranks'
//                        inputs and results: each result equals the reduction of the inputs in rank
//                        order (acc = x0; acc op= x1; ...; 2-byte floats in fp32, rounded once;
//                        canonical NaNs), the contract of a deterministic backend
//       reduce_scatter   the same sampled check on each rank's slice (each rank sends its inputs at
//                        the sampled positions of every slice)
//       all_gather       each block a rank received has the checksum of the send buffer of the rank
//                        it came from
//       broadcast        every rank's result has the checksum of the root's send buffer
//       all_to_all       block k received by rank r has the checksum of rank k's block r
//     A backend that sums in another rank order, drops a rank's contribution, misplaces a block or
//     hands ranks different results fails at its first such call with zero::error (kind comm) naming
//     the collective, the call number and label, the ranks whose results are wrong, and the first
//     wrong element with its value and the expected one. With samples = every_element, every element
//     of every reduction is recomputed.
//
// Cost, per collective, in two extra all-gathers on the wrapped backend (of doubles, each 32 bits of
// a word: what every CommBackend moves exactly), each rank contributing, with k = min(samples, count):
//   agreement        13 words (the fingerprint's 104 bytes)            208 bytes
//   all_reduce       2k + 1 words (inputs, checksum, results)           16 (2k + 1) bytes: 2,064 at k = 64
//   reduce_scatter   (N + 1) k + 1 words (every slice's sampled inputs)  16 ((N + 1) k + 1) bytes
//   all_gather       N + 1 words, broadcast 2, all_to_all 2N (checksums)
//   barrier, split   agreement only
// (by comm::counted's rule, each all-gather of W words per rank sends 16 W (N - 1) bytes per rank),
// plus, on each rank, one pass over its result to checksum it and k N sampled reductions. Both
// all-gathers are blocking and latency-bound. They are not the caller's traffic: a comm::counted
// over the verified backend (the engine's counters) sees only the calls it makes; stats() counts
// verification's own.
//
// Memory: the checks read the caller's buffers directly, so the wrapped backend's system must be
// host memory (system::host_addressable: sys::host); a device backend is refused at compile time and
// is checked by the conformance suite instead (comm/conformance.hpp).
//
// Nonblocking calls, all_to_all, split and call labels are offered where the wrapped backend has
// them. A started collective is agreed on at start and its data checked at wait, with a blocking
// all-gather: over a nonblocking backend the ranks must wait for their requests in the same order
// relative to their other calls (the engine does: its order is the program's), or the checks of
// different calls meet and fail naming both. A request dropped without wait is not checked (on any
// rank: the engine drops the same ones everywhere).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/counted.hpp"
#include "zero/comm/fingerprint.hpp"
#include "zero/comm/nonblocking.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/hash.hpp"
#include "zero/core/numeric.hpp"
#include "zero/error.hpp"

namespace zero::comm {

struct verified_options {
  static constexpr std::size_t every_element = std::numeric_limits<std::size_t>::max();
  // Elements per reducing call whose reduction is recomputed from the ranks' inputs (spread over the
  // buffer, different positions each call; every element when count <= samples).
  std::size_t samples = 64;
  // The wrapped backend sums in rank order (acc = x0; acc += x1; ...): sampled sums are compared bit
  // for bit. False for a backend documented otherwise (comm::mpi's fast mode): sums are then not
  // compared with the reference (max still is, and the ranks' results must still agree).
  bool rank_ordered = true;
};

// Verification's own traffic: what comm::counted would count for its all-gathers.
struct verified_stats {
  std::uint64_t calls = 0;        // collectives checked (barrier and split included)
  std::uint64_t collectives = 0;  // all-gathers issued for the checks
  std::uint64_t bytes = 0;        // their bus bytes (comm::bus_bytes)
};

template <CommBackend C>
class verified;

namespace detail {
// A verified backend's request where the wrapped backend has one: the wrapped request and the data
// check to run once it has completed. Absent otherwise, so the wrapper names no nonblocking member.
template <class C, bool = nonblocking<C>>
struct verified_requests {};
template <class C>
struct verified_requests<C, true> {
  struct request {
    typename C::request inner{};
    std::function<void()> check;  // empty once run
  };
};
// Whether R is verified<C>'s request: a concept, so that a backend without nonblocking calls (and so
// without verified_requests<C>::request) is never asked for the type (clang substitutes a member
// template's non-dependent constraints when the class is instantiated).
template <class R, class C>
concept verified_request_of = nonblocking<C> && std::same_as<R, typename verified_requests<C>::request>;
}  // namespace detail

template <CommBackend C>
class verified : public detail::verified_requests<C> {
  static_assert(requires { requires C::system::host_addressable; },
                "comm::verified checksums the ranks' buffers on the host: the wrapped backend's system must be host "
                "memory (system::host_addressable); check a device backend with comm/conformance.hpp");

 public:
  using system = typename C::system;
  explicit verified(C& inner, verified_options o = {}) : inner_(&inner), opts_(o) {}
  verified(const verified&) = delete;
  verified& operator=(const verified&) = delete;

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  C& inner() const { return *inner_; }
  const verified_options& options() const { return opts_; }
  const verified_stats& stats() const { return stats_; }

  // Labels the following calls in their fingerprints (and the wrapped backend's, where it takes labels).
  call_label set_call_label(call_label l) {
    if constexpr (labels_calls<C>) inner_->set_call_label(l);
    return std::exchange(label_, l);
  }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op)
    requires requires(C& c, const T* s, T* r, std::size_t n, reduce_op o) { c.all_reduce(s, r, n, o); }
  {
    auto check = before_reduce<T>(coll_kind::all_reduce, send, count, op);
    inner_->all_reduce(send, recv, count, op);
    after_reduce<T>(check, recv);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op)
    requires requires(C& c, const T* s, T* r, std::size_t n, reduce_op o) { c.reduce_scatter(s, r, n, o); }
  {
    auto check = before_reduce<T>(coll_kind::reduce_scatter, send, count, op);
    inner_->reduce_scatter(send, recv, count, op);
    after_reduce<T>(check, recv);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count)
    requires requires(C& c, const T* s, T* r, std::size_t n) { c.all_gather(s, r, n); }
  {
    auto check = before_copy<T>(coll_kind::all_gather, send, count, 0);
    inner_->all_gather(send, recv, count);
    after_copy<T>(check, recv);
  }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root)
    requires requires(C& c, const T* s, T* r, std::size_t n, int root_rank) { c.broadcast(s, r, n, root_rank); }
  {
    auto check = before_copy<T>(coll_kind::broadcast, send, count, root);
    inner_->broadcast(send, recv, count, root);
    after_copy<T>(check, recv);
  }
  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count)
    requires has_all_to_all<C> && requires(C& c, const T* s, T* r, std::size_t n) { c.all_to_all(s, r, n); }
  {
    auto check = before_copy<T>(coll_kind::all_to_all, send, count, 0);
    inner_->all_to_all(send, recv, count);
    after_copy<T>(check, recv);
  }
  void barrier() {
    agree(fingerprint::make_barrier(seq_++, label_));
    inner_->barrier();
  }

  // A sub-communicator of the wrapped backend's split, verified with the same options. The split is
  // agreed on first (as a call labelled "split").
  std::unique_ptr<verified> split(int color)
    requires splittable<C>
  {
    agree(fingerprint::make_barrier(seq_++, call_label{"split", label_.unit}));
    std::unique_ptr<C> child = inner_->split(color);
    return std::unique_ptr<verified>(new verified(std::move(child), opts_));
  }

  // Nonblocking, where the wrapped backend is: agreed on at start, the data checked at wait.
  template <class T>
  auto start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op)
    requires nonblocking<C> &&
             requires(C& c, const T* s, T* r, std::size_t n, reduce_op o) { c.start_all_reduce(s, r, n, o); }
  {
    auto check = before_reduce<T>(coll_kind::all_reduce, send, count, op);
    return started(inner_->start_all_reduce(send, recv, count, op),
                   [this, check = std::move(check), recv]() mutable { after_reduce<T>(check, recv); });
  }
  template <class T>
  auto start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op)
    requires nonblocking<C> &&
             requires(C& c, const T* s, T* r, std::size_t n, reduce_op o) { c.start_reduce_scatter(s, r, n, o); }
  {
    auto check = before_reduce<T>(coll_kind::reduce_scatter, send, count, op);
    return started(inner_->start_reduce_scatter(send, recv, count, op),
                   [this, check = std::move(check), recv]() mutable { after_reduce<T>(check, recv); });
  }
  template <class T>
  auto start_all_gather(const T* send, T* recv, std::size_t count)
    requires nonblocking<C> && requires(C& c, const T* s, T* r, std::size_t n) { c.start_all_gather(s, r, n); }
  {
    auto check = before_copy<T>(coll_kind::all_gather, send, count, 0);
    return started(inner_->start_all_gather(send, recv, count),
                   [this, check = std::move(check), recv]() mutable { after_copy<T>(check, recv); });
  }
  template <class T>
  auto start_all_to_all(const T* send, T* recv, std::size_t count)
    requires nonblocking<C> && nonblocking_all_to_all<C> &&
             requires(C& c, const T* s, T* r, std::size_t n) { c.start_all_to_all(s, r, n); }
  {
    auto check = before_copy<T>(coll_kind::all_to_all, send, count, 0);
    return started(inner_->start_all_to_all(send, recv, count),
                   [this, check = std::move(check), recv]() mutable { after_copy<T>(check, recv); });
  }
  template <class R>
  void wait(R& r)
    requires detail::verified_request_of<R, C>
  {
    inner_->wait(r.inner);
    if (r.check) std::exchange(r.check, {})();
  }

 private:
  // One call's check: its fingerprint, the positions sampled, and this rank's evidence (the words
  // known before the call, then those computed after it).
  struct call_check {
    fingerprint call;
    std::vector<std::size_t> at;
    std::vector<std::uint64_t> words;
  };

  verified(std::unique_ptr<C> owned, verified_options o) : inner_(owned.get()), opts_(o), owned_(std::move(owned)) {}

  template <class R, class F>
  auto started(R inner, F&& check) {
    typename detail::verified_requests<C>::request r;
    r.inner = std::move(inner);
    r.check = std::forward<F>(check);
    return r;
  }

  std::size_t ranks() const { return static_cast<std::size_t>(size()); }

  template <class T>
  static std::uint64_t bits_of(const T& v) {
    std::uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
  }
  template <class T>
  static T value_of(std::uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
  }
  template <class T>
  static std::string text(std::uint64_t b) {
    const T v = value_of<T>(b);
    char buf[64];
    if constexpr (std::is_integral_v<T>)
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    else if constexpr (std::is_floating_point_v<T>)
      std::snprintf(buf, sizeof buf, "%a", static_cast<double>(v));
    else  // the 2-byte floats, exactly as float
      std::snprintf(buf, sizeof buf, "%a", static_cast<double>(static_cast<float>(v)));
    return buf;
  }
  template <class T>
  static std::uint64_t checksum(const T* p, std::size_t n) {
    return run_hash64(p, n * sizeof(T));
  }

  // The reduction of the ranks' values in rank order, as a deterministic backend computes it.
  template <class T>
  static std::uint64_t reference(const std::vector<std::uint64_t>& all, std::size_t words, std::size_t at, int n,
                                 reduce_op op) {
    using A = accumulate_as_t<T>;
    A acc = static_cast<A>(value_of<T>(all[at]));
    for (int k = 1; k < n; ++k) {
      const A x = static_cast<A>(value_of<T>(all[static_cast<std::size_t>(k) * words + at]));
      acc = op == reduce_op::sum ? static_cast<A>(acc + x) : (acc < x ? x : acc);
    }
    return bits_of(store_as<T>(acc));
  }

  // Sampled positions in [0, count): all of them when count <= samples, else one in each of `samples`
  // equal stretches, drawn from the call number so that successive calls look at different elements.
  std::vector<std::size_t> positions(std::size_t count, std::uint64_t seq) const {
    std::vector<std::size_t> at;
    if (count <= opts_.samples) {
      for (std::size_t i = 0; i < count; ++i) at.push_back(i);
      return at;
    }
    const std::size_t k = opts_.samples;
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t lo = j * count / k, hi = (j + 1) * count / k;
      const std::uint64_t h = run_hash64(&seq, sizeof seq, j + 1);
      at.push_back(lo + static_cast<std::size_t>(h % (hi - lo)));
    }
    return at;
  }

  // Every rank's words, in rank order, through the wrapped backend (each word as two doubles of 32 bits).
  std::vector<std::uint64_t> gather(const std::vector<std::uint64_t>& mine) {
    const std::size_t n = mine.size(), me = static_cast<std::size_t>(rank());
    std::vector<double> wire(2 * n * ranks());
    for (std::size_t i = 0; i < n; ++i) {
      wire[2 * (me * n + i)] = static_cast<double>(mine[i] >> 32);
      wire[2 * (me * n + i) + 1] = static_cast<double>(mine[i] & 0xffffffffu);
    }
    {
      const scoped_label<C> l(*inner_, "verify");  // the same on every rank, whatever the call
      inner_->all_gather(wire.data() + 2 * me * n, wire.data(), 2 * n);
    }
    ++stats_.collectives;
    stats_.bytes += bus_bytes(collective::all_gather, wire.size() * sizeof(double), size());
    std::vector<std::uint64_t> all(n * ranks());
    for (std::size_t i = 0; i < all.size(); ++i)
      all[i] = (static_cast<std::uint64_t>(wire[2 * i]) << 32) | static_cast<std::uint64_t>(wire[2 * i + 1]);
    return all;
  }

  // Every rank's fingerprint of this call; a rank that differs from rank 0 fails every rank.
  void agree(const fingerprint& f) {
    ++stats_.calls;
    if (size() == 1) return;
    constexpr std::size_t words = sizeof(fingerprint) / sizeof(std::uint64_t);
    static_assert(sizeof(fingerprint) % sizeof(std::uint64_t) == 0);
    std::vector<std::uint64_t> mine(words);
    std::memcpy(mine.data(), &f, sizeof f);
    const std::vector<std::uint64_t> all = gather(mine);
    std::vector<fingerprint> calls(ranks());
    for (std::size_t r = 0; r < ranks(); ++r)
      std::memcpy(static_cast<void*>(&calls[r]), all.data() + r * words, sizeof(fingerprint));
    unsigned diff = 0;
    for (const fingerprint& c : calls) diff |= c.differences(calls[0]);
    if (diff == 0) return;
    std::string msg = "comm::verified rank " + std::to_string(rank()) + ": call #" + std::to_string(f.seq) +
                      ": the ranks' calls differ (in " + fingerprint::describe(diff) + "):";
    std::vector<bool> told(ranks(), false);
    for (std::size_t r = 0; r < ranks(); ++r) {
      if (told[r]) continue;
      std::string who;
      for (std::size_t q = r; q < ranks(); ++q)
        if (!told[q] && calls[q].same_call(calls[r])) {
          told[q] = true;
          who += (who.empty() ? "" : ", ") + std::to_string(q);
        }
      msg += (r == 0 ? " rank(s) " : "; rank(s) ") + who + " call " + calls[r].str();
    }
    fail(error_kind::comm, msg, "; every rank must issue the same collectives in the same order");
  }

  [[noreturn]] void wrong(const call_check& c, const std::string& what) const {
    fail(error_kind::comm, "comm::verified rank ", rank(), ": call ", c.call.str(), ": ", what);
  }
  static std::string rank_list(const std::vector<int>& rs) {
    std::string s;
    for (int r : rs) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  }

  // all_reduce, reduce_scatter: agreement, then this rank's inputs at the sampled positions (of every
  // rank's slice for reduce_scatter), read before an in-place call overwrites them.
  template <class T>
  call_check before_reduce(coll_kind kind, const T* send, std::size_t count, reduce_op op) {
    call_check c{fingerprint::make<T>(seq_, kind, count, op, 0, label_), positions(count, seq_), {}};
    ++seq_;
    agree(c.call);
    const std::size_t blocks = kind == coll_kind::reduce_scatter ? ranks() : 1;
    for (std::size_t b = 0; b < blocks; ++b)
      for (std::size_t i : c.at) c.words.push_back(bits_of(send[b * count + i]));
    return c;
  }
  template <class T>
  void after_reduce(call_check& c, const T* recv) {
    const std::size_t k = c.at.size(), n = ranks();
    const bool scatter = c.call.kind == coll_kind::reduce_scatter;
    const std::size_t inputs = scatter ? n * k : k;
    c.words.push_back(scatter ? 0 : checksum(recv, c.call.count));  // reduce_scatter's slices differ
    for (std::size_t i : c.at) c.words.push_back(bits_of(recv[i]));
    if (n == 1) return;
    const std::size_t words = c.words.size();
    const std::vector<std::uint64_t> all = gather(c.words);
    const auto result = [&](std::size_t r, std::size_t j) { return all[r * words + inputs + 1 + j]; };
    if (!scatter) {
      std::vector<int> differ;
      for (std::size_t r = 1; r < n; ++r)
        if (all[r * words + inputs] != all[inputs]) differ.push_back(static_cast<int>(r));
      if (!differ.empty())
        wrong(c, "the ranks' results differ: rank(s) " + rank_list(differ) +
                     " hold other bits than rank 0 (checksums of the result); every rank must get the same result");
    }
    const bool exact = opts_.rank_ordered || c.call.op == reduce_op::max;
    if (!exact) return;
    std::vector<int> differ;
    std::string first;
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t j = 0; j < k; ++j) {
        const std::uint64_t want = reference<T>(all, words, (scatter ? r * k : 0) + j, size(), c.call.op);
        if (result(r, j) == want) continue;
        if (first.empty())
          first = "element " + std::to_string(c.at[j]) + (scatter ? " of rank " + std::to_string(r) + "'s slice" : "") +
                  " is " + text<T>(result(r, j)) + " on rank " + std::to_string(r) + ", the " + to_string(c.call.op) +
                  " of the ranks' inputs in rank order is " + text<T>(want);
        differ.push_back(static_cast<int>(r));
        break;
      }
    if (!differ.empty())
      wrong(c, "the result of rank(s) " + rank_list(differ) + " is not the rank-ordered reduction of the ranks' " +
                   "inputs: " + first + " (a backend that reduces out of rank order, or drops or misplaces a " +
                   "contribution)");
  }

  // all_gather, broadcast, all_to_all: agreement, then the checksum of what this rank sends (each
  // block's, for all_to_all).
  template <class T>
  call_check before_copy(coll_kind kind, const T* send, std::size_t count, int root) {
    call_check c{fingerprint::make<T>(seq_, kind, count, reduce_op::sum, root, label_), {}, {}};
    ++seq_;
    agree(c.call);
    if (kind == coll_kind::all_to_all)
      for (std::size_t b = 0; b < ranks(); ++b) c.words.push_back(checksum(send + b * count, count));
    else
      c.words.push_back(checksum(send, count));
    return c;
  }
  template <class T>
  void after_copy(call_check& c, const T* recv) {
    const std::size_t n = ranks(), count = c.call.count;
    const bool blocks = c.call.kind != coll_kind::broadcast;
    if (blocks)
      for (std::size_t b = 0; b < n; ++b) c.words.push_back(checksum(recv + b * count, count));
    else
      c.words.push_back(checksum(recv, count));
    if (n == 1) return;
    const std::size_t words = c.words.size(), sent = c.call.kind == coll_kind::all_to_all ? n : 1;
    const std::vector<std::uint64_t> all = gather(c.words);
    std::vector<int> differ;
    std::string first;
    for (std::size_t r = 0; r < n; ++r) {
      const std::uint64_t* got = all.data() + r * words + sent;
      for (std::size_t b = 0; b < (blocks ? n : 1); ++b) {
        std::uint64_t want;
        std::string which;
        if (c.call.kind == coll_kind::all_gather) {
          want = all[b * words];
          which = "block " + std::to_string(b) + " is not rank " + std::to_string(b) + "'s send buffer";
        } else if (c.call.kind == coll_kind::all_to_all) {
          want = all[b * words + r];
          which = "block " + std::to_string(b) + " is not rank " + std::to_string(b) + "'s block " + std::to_string(r);
        } else {
          want = all[static_cast<std::size_t>(c.call.root) * words];
          which = "the result is not the root's send buffer";
        }
        if (got[b] == want) continue;
        if (first.empty()) first = "on rank " + std::to_string(r) + ", " + which;
        differ.push_back(static_cast<int>(r));
        break;
      }
    }
    if (!differ.empty())
      wrong(c, "rank(s) " + rank_list(differ) + " received wrong data (checksums): " + first);
  }

  C* inner_;
  verified_options opts_;
  std::unique_ptr<C> owned_;  // a split's communicator
  call_label label_{};
  std::uint64_t seq_ = 0;
  verified_stats stats_;
};

}  // namespace zero::comm
