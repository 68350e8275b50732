// expect-success
#include "zero/zero.hpp"

// The control: the library's own policies model every concept, so the runner's compiler works.
static_assert(zero::CommBackend<zero::comm::threads>);
static_assert(zero::Partitioner<zero::stage2>);
static_assert(zero::OptimizerState<zero::optim::adamw>);
static_assert(zero::PrecisionPolicy<zero::precision::fp32>);
// The engine's whole requirement and the capability checks, on the library's thread backend.
static_assert(zero::CommBackendForEngine<zero::comm::threads, zero::bf16>);
static_assert(zero::comm::check_all_to_all<zero::comm::threads>());
static_assert(zero::comm::check_byte_all_gather<zero::comm::threads>());
static_assert(zero::comm::check_split<zero::comm::threads>());
static_assert(zero::comm::check_call_labels<zero::comm::threads>());
static_assert(zero::comm::check_nonblocking<zero::comm::counted<zero::comm::threads>>());
