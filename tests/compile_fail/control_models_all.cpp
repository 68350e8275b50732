// expect-success
#include "zero/zero.hpp"

// The control: the library's own policies model every concept, so the runner's compiler works.
static_assert(zero::CommBackend<zero::comm::threads>);
static_assert(zero::Partitioner<zero::stage2>);
static_assert(zero::OptimizerState<zero::optim::adamw>);
static_assert(zero::PrecisionPolicy<zero::precision::fp32>);
