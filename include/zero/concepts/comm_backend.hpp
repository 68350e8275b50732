// The CommBackend concept: the collectives the engine needs, with NCCL's signatures and in-place rules.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "zero/core/reduce_op.hpp"

namespace zero {

// Requirements (T is float and double; a backend may accept more types, and the engine needs more:
// CommBackendForEngine below):
//   typename C::system                       the memory space its buffers live in (sys::host, ...)
//   c.rank(), c.size()                       this rank and the world size
//   c.all_reduce(send, recv, count, op)      recv[i] = op over ranks of send[i]; send == recv allowed
//   c.reduce_scatter(send, recv, count, op)  send holds size()*count elements, recv gets this rank's
//                                            count-element slice of the reduction; in place when
//                                            recv == send + rank()*count
//   c.all_gather(send, recv, count)          recv[k*count + i] = send_of_rank_k[i]; in place when
//                                            send == recv + rank()*count
//   c.broadcast(send, recv, count, root)     recv = send of root; send == recv allowed
//   c.barrier()
// Counts are in elements per rank, as in NCCL. The backend owns its stream, if any: a call may
// return before the data has moved, and the engine waits through the system before it reads.
// A deterministic backend sums in rank order 0, 1, ..., N-1 (acc = x0; acc += x1; ...), and no
// collective waits forever: a failed or departed peer ends it with zero::error (kind comm).
//
// Optional (detected, not required): `call_label c.set_call_label(call_label)` (comm/call_label.hpp).
// The engine labels the collectives it issues ("reduce unit 'fc2'") through it, and a backend that
// takes labels puts them in each call's fingerprint, so ranks that issue calls of equal shape for
// different units get an error instead of each other's data. A backend without it works unchanged.
template <class C>
concept CommBackend = requires(C& c, const float* sf, float* rf, const double* sd, double* rd, std::size_t n,
                               int root, reduce_op op) {
  typename C::system;
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  c.all_reduce(sf, rf, n, op);
  c.all_reduce(sd, rd, n, op);
  c.reduce_scatter(sf, rf, n, op);
  c.reduce_scatter(sd, rd, n, op);
  c.all_gather(sf, rf, n);
  c.all_gather(sd, rd, n);
  c.broadcast(sf, rf, n, root);
  c.broadcast(sd, rd, n, root);
  c.barrier();
};

// The collectives the engine issues in a precision's wire type T (comm_type: bf16 and fp16 as well
// as float): all_reduce and reduce_scatter of gradients, all_gather of parameters. The engine
// static_asserts this for its precision, so a backend that moves only float and double is refused
// with a message naming the missing type's role rather than an overload error in the engine.
template <class C, class T>
concept CommBackendFor = CommBackend<C> && requires(C& c, const T* s, T* r, std::size_t n, reduce_op op) {
  c.all_reduce(s, r, n, op);
  c.reduce_scatter(s, r, n, op);
  c.all_gather(s, r, n);
};

// The element types the engine moves besides the precision's, by the feature that moves them:
//   the settings agreement check   at construction every rank's engine_options and optimizer settings,
//                                  as std::int64_t words, all-gathered (also the reproducible mode's
//                                  summaries and exact gradient norm): every engine compiles it, and
//                                  static_asserts it with a message naming the feature
//   the reproducible mode          engine_options::reproducible: binned std::int64_t words summed by
//                                  all_reduce (stage 0) or reduce_scatter (stages 1-3), exact in any
//                                  order; its reducer (engine/reduce/binned.hpp) is compiled into an
//                                  engine only over a backend that has them, and without them the
//                                  option is refused at construction, naming this concept
// The optional capabilities (nonblocking calls, all_to_all, split, a byte all_gather, call labels)
// are detected by the concepts of their headers in comm/, each with a check_* helper to
// static_assert after a backend that means to have one (a misspelled member is then a compile error
// naming it, not a capability silently off).
template <class C>
concept CommBackendForSettingsCheck = requires(C& c, const std::int64_t* s, std::int64_t* r, std::size_t n) {
  c.all_gather(s, r, n);
};

template <class C>
concept CommBackendForReproducible =
    requires(C& c, const std::int64_t* s, std::int64_t* r, std::size_t n, reduce_op op) {
      c.all_reduce(s, r, n, op);
      c.reduce_scatter(s, r, n, op);
      c.all_gather(s, r, n);
    };

// Everything the engine's blocking calls can use of a backend for a precision whose comm_type is T
// (every option available). A backend author's one-line check:
// static_assert(zero::CommBackendForEngine<my_backend, float>).
template <class C, class T>
concept CommBackendForEngine = CommBackendFor<C, T> && CommBackendForSettingsCheck<C> && CommBackendForReproducible<C>;

}  // namespace zero
