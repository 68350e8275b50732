// The optional all_to_all collective of a CommBackend (qgZ's exchange), detected by concepts like the nonblocking calls.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace zero::comm {

// A backend that can exchange distinct blocks with every rank has
//   c.all_to_all(send, recv, count)
// send holds size() blocks of count elements, block k for rank k; afterwards recv[k*count + i] is
// element i of the block rank k sent to this rank (this rank's own block included). send and recv
// must not overlap. The engine sends bytes (std::uint8_t: quantized gradients, core/quantize.hpp),
// so that is the type the concept asks for; a backend may accept more. Like every collective, every
// rank calls it in the same order, and no call waits forever (zero::error, kind comm).
//
// Nonblocking as well (comm/nonblocking.hpp's rules: a request, wait):
//   C::request c.start_all_to_all(send, recv, count)
//
// comm::threads, comm::mpi (MPI_Alltoall), comm::cuda_threads, comm::nccl (grouped send/recv) have
// it; comm::counted and comm::modeled offer it over a backend that has it.
template <class C>
concept has_all_to_all = requires(C& c, const std::uint8_t* s, std::uint8_t* r, std::size_t n) { c.all_to_all(s, r, n); };

template <class C>
concept nonblocking_all_to_all = requires(C& c, const std::uint8_t* s, std::uint8_t* r, std::size_t n) {
  { c.start_all_to_all(s, r, n) } -> std::same_as<typename C::request>;
};

// The collectives that move bytes: qwZ's all-gather of quantized shards.
template <class C>
concept moves_bytes = requires(C& c, const std::uint8_t* s, std::uint8_t* r, std::size_t n) { c.all_gather(s, r, n); };

// For a backend author: static_assert(zero::comm::check_all_to_all<my_backend>()) after the class; a
// missing or misspelled member fails naming it, where the engine would only refuse qgZ at run time.
template <class C>
consteval bool check_all_to_all() {
  static_assert(has_all_to_all<C>, "check_all_to_all: no member all_to_all(const std::uint8_t* send, std::uint8_t* "
                                   "recv, std::size_t count) (qgZ's exchange)");
  return true;
}
// The nonblocking form as well (a backend that has comm/nonblocking.hpp's request and wait).
template <class C>
consteval bool check_nonblocking_all_to_all() {
  static_assert(requires { typename C::request; }, "check_nonblocking_all_to_all: the backend has no member type "
                                                   "`request` (comm/nonblocking.hpp)");
  static_assert(nonblocking_all_to_all<C>, "check_nonblocking_all_to_all: no member start_all_to_all(const "
                                           "std::uint8_t* send, std::uint8_t* recv, std::size_t count) returning "
                                           "C::request");
  return true;
}

// For a backend author: static_assert(zero::comm::check_byte_all_gather<my_backend>()); qwZ's gathers.
template <class C>
consteval bool check_byte_all_gather() {
  static_assert(moves_bytes<C>, "check_byte_all_gather: no all_gather(const std::uint8_t* send, std::uint8_t* recv, "
                                "std::size_t count) (qwZ's quantized parameter gathers)");
  return true;
}

}  // namespace zero::comm
