// The umbrella header of the CUDA parts: zero.hpp plus sys::cuda, comm::cuda_threads and (where NCCL is found) comm::nccl.
#pragma once

#include "zero/zero.hpp"
#include "zero/gpu/check.cuh"
#include "zero/gpu/context.cuh"
#include "zero/gpu/launch.cuh"
#include "zero/gpu/kernels.cuh"
#include "zero/sys/cuda.cuh"
#include "zero/comm/backends/cuda_threads.cuh"
// NCCL is a separate package: a CUDA user without it still gets the single-GPU backend.
#if __has_include(<nccl.h>)
#include "zero/comm/backends/nccl.cuh"
#endif
