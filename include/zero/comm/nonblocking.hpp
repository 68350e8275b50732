// The optional nonblocking collectives of a CommBackend: start a collective, wait for it later.
#pragma once

#include <concepts>
#include <cstddef>
#include <utility>

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
