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

}  // namespace zero::comm
