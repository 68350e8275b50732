// The optional nonblocking collectives of a CommBackend: start a collective, wait for it later.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "zero/comm/all_to_all.hpp"
#include "zero/core/reduce_op.hpp"

namespace zero::comm {

// A backend that can run a collective while its caller computes has, besides the blocking calls:
//   typename C::request                         movable; a default-constructed request is complete
//   C::request c.start_all_reduce(send, recv, count, op)
//   C::request c.start_reduce_scatter(send, recv, count, op)
//   C::request c.start_all_gather(send, recv, count)
//   void c.wait(C::request&)                    returns when the collective has completed; a
//                                               complete request returns at once
// Same arguments, in-place rules and results (the same bits) as the blocking calls. Between start
// and wait the caller neither reads recv nor writes send or recv. Every rank starts its collectives
// in the same order (started and blocking calls together form that order), but may wait for them in
// any order; a blocking call may be issued while requests are in flight. A failure may surface at
// start or at wait, as zero::error (kind comm), and no wait blocks forever (the backend's timeout).
//
// A request dropped without wait must not leave the backend writing into freed memory: its
// destructor waits (and swallows an error it would throw; the engine waits explicitly first).
//
// The engine takes this interface where it exists (engine_options::overlap): reduce(u) returns
// with its collective in flight, stage 3 prefetches gathers, stages 1-2 overlap the parameter
// all-gather with the update. A backend without it works unchanged: each collective completes
// before the engine's call returns.
template <class C>
concept nonblocking = requires(C& c, typename C::request& r, const float* s, float* d, std::size_t n, reduce_op op) {
  { c.start_all_reduce(s, d, n, op) } -> std::same_as<typename C::request>;
  { c.start_reduce_scatter(s, d, n, op) } -> std::same_as<typename C::request>;
  { c.start_all_gather(s, d, n) } -> std::same_as<typename C::request>;
  c.wait(r);
};

// Whether C names any member of the interface above, spelled right: a backend that does means to
// overlap, so the engine refuses it unless it has all of them (overlap_complete_for), rather than
// letting a misspelled one turn overlap off without a word.
template <class C>
concept names_nonblocking_member =
    requires { typename C::request; } ||
    requires(C& c, const float* s, float* d, std::size_t n, reduce_op op) { c.start_all_reduce(s, d, n, op); } ||
    requires(C& c, const float* s, float* d, std::size_t n, reduce_op op) { c.start_reduce_scatter(s, d, n, op); } ||
    requires(C& c, const float* s, float* d, std::size_t n) { c.start_all_gather(s, d, n); };

// The three starts for element type T.
template <class C, class T>
concept starts_collectives_of = requires(C& c, const T* s, T* d, std::size_t n, reduce_op op) {
  { c.start_all_reduce(s, d, n, op) } -> std::same_as<typename C::request>;
  { c.start_reduce_scatter(s, d, n, op) } -> std::same_as<typename C::request>;
  { c.start_all_gather(s, d, n) } -> std::same_as<typename C::request>;
};

// What the engine starts on a nonblocking backend (comm::counted forwards every start to it, overlap
// on or off), for a precision whose comm_type is T: the three collectives in T; the settings
// fingerprint's all_reduce of doubles; the reproducible mode's all_reduce and reduce_scatter of
// std::int64_t words; qwZ's all_gather of bytes where the backend moves bytes (moves_bytes). A backend
// that names none of the interface passes (it runs blocking); one that names part of it does not.
template <class C, class T>
concept overlap_complete_for =
    !names_nonblocking_member<C> ||
    (nonblocking<C> && starts_collectives_of<C, T> &&
     requires(C& c, const double* sd, double* dd, const std::int64_t* si, std::int64_t* di, std::size_t n,
              reduce_op op) {
       { c.start_all_reduce(sd, dd, n, op) } -> std::same_as<typename C::request>;
       { c.start_all_reduce(si, di, n, op) } -> std::same_as<typename C::request>;
       { c.start_reduce_scatter(si, di, n, op) } -> std::same_as<typename C::request>;
     } &&
     (!moves_bytes<C> || requires(C& c, const std::uint8_t* s, std::uint8_t* d, std::size_t n) {
       { c.start_all_gather(s, d, n) } -> std::same_as<typename C::request>;
     }));

// For a backend author: static_assert(zero::comm::check_nonblocking<my_backend>()) after the class
// (T: the element type to check the starts for, the precision's comm_type). Each missing or
// misspelled member fails its own static_assert, named; true when C is nonblocking.
template <class C, class T = float>
consteval bool check_nonblocking() {
  static_assert(requires { typename C::request; },
                "check_nonblocking: the backend has no member type `request` (what start_* return and wait takes)");
  static_assert(requires {
                  requires std::is_default_constructible_v<typename C::request> &&
                               std::is_move_constructible_v<typename C::request>;
                },
                "check_nonblocking: C::request must be default-constructible (a complete request) and movable");
  static_assert(requires(C& c, const T* s, T* d, std::size_t n, reduce_op op) { c.start_all_reduce(s, d, n, op); },
                "check_nonblocking: no member start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op)");
  static_assert(
      requires(C& c, const T* s, T* d, std::size_t n, reduce_op op) { c.start_reduce_scatter(s, d, n, op); },
      "check_nonblocking: no member start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op)");
  static_assert(requires(C& c, const T* s, T* d, std::size_t n) { c.start_all_gather(s, d, n); },
                "check_nonblocking: no member start_all_gather(const T* send, T* recv, std::size_t count)");
  static_assert(starts_collectives_of<C, T>, "check_nonblocking: start_all_reduce, start_reduce_scatter and "
                                             "start_all_gather must return C::request");
  static_assert(requires(C& c, typename C::request& r) { c.wait(r); },
                "check_nonblocking: no member wait(C::request&)");
  static_assert(overlap_complete_for<C, T>,
                "check_nonblocking: the engine also starts all_reduce of double and all_reduce and reduce_scatter "
                "of std::int64_t (and all_gather of std::uint8_t where the backend has a byte all_gather)");
  return true;
}

// A nonblocking backend that knows only at run time whether its starts return before the collective
// completes (comm::any_backend: it depends on the backend it wraps) says so through
//   bool c.overlaps() const
// comm::counted, and hence the engine, asks it; a backend without the member overlaps when it is
// nonblocking.
template <class C>
concept overlap_decided_at_run_time = nonblocking<C> && requires(const C& c) {
  { c.overlaps() } -> std::same_as<bool>;
};

// The request of a backend without nonblocking collectives: its collectives complete when started.
struct completed_request {};

namespace detail {
template <class C>
struct request_of {
  using type = completed_request;
};
template <nonblocking C>
struct request_of<C> {
  using type = typename C::request;
};
}  // namespace detail

// What starting a collective on C returns: C::request, or completed_request.
template <class C>
using request_of_t = typename detail::request_of<C>::type;

}  // namespace zero::comm
