// The CommBackend concept: the collectives the engine needs, with NCCL's signatures and in-place rules.
#pragma once

#include <concepts>
#include <cstddef>

#include "zero/core/reduce_op.hpp"

namespace zero {

// Requirements (T is float and double; a backend may accept more types):
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

}  // namespace zero
