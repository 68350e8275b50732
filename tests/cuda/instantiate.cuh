// Explicit instantiations of the device engine: every stage and optimizer on each device backend, so nvcc compiles every kernel.
#pragma once

#include "zero/zero_cuda.cuh"

// An explicit instantiation compiles every member of the engine (and so every kernel it launches,
// and every collective it calls) whether or not a test uses it.
#define ZERO_INSTANTIATE_ENGINES(Comm, Prec)                                         \
  template class zero::engine<zero::stage0, Comm, zero::optim::sgd, Prec>;          \
  template class zero::engine<zero::stage1, Comm, zero::optim::sgd, Prec>;          \
  template class zero::engine<zero::stage2, Comm, zero::optim::sgd, Prec>;          \
  template class zero::engine<zero::stage3, Comm, zero::optim::sgd, Prec>;          \
  template class zero::engine<zero::stage0, Comm, zero::optim::adamw, Prec>;        \
  template class zero::engine<zero::stage1, Comm, zero::optim::adamw, Prec>;        \
  template class zero::engine<zero::stage2, Comm, zero::optim::adamw, Prec>;        \
  template class zero::engine<zero::stage3, Comm, zero::optim::adamw, Prec>;

#if ZERO_WITH_NCCL
#define ZERO_INSTANTIATE_DEVICE_ENGINES(Prec)                  \
  ZERO_INSTANTIATE_ENGINES(zero::comm::cuda_threads, Prec)    \
  ZERO_INSTANTIATE_ENGINES(zero::comm::nccl, Prec)
#else
#define ZERO_INSTANTIATE_DEVICE_ENGINES(Prec) ZERO_INSTANTIATE_ENGINES(zero::comm::cuda_threads, Prec)
#endif
