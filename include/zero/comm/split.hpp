// The optional split of a CommBackend into sub-communicators (hpZ's node groups), detected by a concept.
#pragma once

#include <concepts>
#include <memory>

namespace zero::comm {

// A backend that can form sub-communicators has
//   std::unique_ptr<C> c.split(int color)
// a collective on c: the ranks that pass the same color form a new communicator of the same backend
// type, ranked in the order of their ranks in c (MPI_Comm_split with key = rank; ncclCommSplit; for
// threads of one process, a world of their own). Colors are >= 0. The new communicator's collectives
// are independent of c's (each has its own order), and its system is c's (the same memory, stream
// and context), so buffers the engine holds serve both. Destroy it before c.
//
// comm::threads, comm::mpi, comm::cuda_threads and comm::nccl have it. The engine takes it for
// hpZ (engine_options::hpz): the node groups of node_size consecutive ranks, whose secondary
// all-gathers stay inside the node, and, for qgZ's second hop, the ranks of equal position in
// their nodes.
template <class C>
concept splittable = requires(C& c, int color) {
  { c.split(color) } -> std::same_as<std::unique_ptr<C>>;
};

// For a backend author: static_assert(zero::comm::check_split<my_backend>()) after the class; a
// missing member or one returning another type fails naming it, where the engine would only refuse
// hpZ at run time. A wrapper splits its inner backend and wraps the result in a new wrapper of its
// own type (comm::verified::split is an example).
template <class C>
consteval bool check_split() {
  static_assert(requires(C& c, int color) { c.split(color); }, "check_split: no member split(int color)");
  static_assert(splittable<C>, "check_split: split(int color) must return std::unique_ptr<C>, a communicator of "
                               "the same type (a wrapper wraps its inner backend's split)");
  return true;
}

}  // namespace zero::comm
