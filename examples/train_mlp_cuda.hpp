// train_mlp_cuda's parts: what its main and its engines' translation units share.
#pragma once

// The engines are compiled in three translation units, one per precision (train_mlp_cuda_fp32.cu,
// _bf16.cu, _fp16.cu), so that a machine with several cores compiles them at once: one unit of all
// 48 engines was the GPU build's critical path.

#include <cstddef>
#include <string_view>

#include "trainer_cli.hpp"
#include "zero/comm/any_backend.hpp"
#include "zero/zero_cuda.cuh"

namespace train_mlp_cuda {

// The step against its floor (--roofline): the steady-state step time, the same GEMMs alone, and the
// optimizer's bytes at the device's copy bandwidth, measured on rank 0's device in the same run.
struct roofline {
  bool wanted = false;
  double step_s = 0, gemm_s = 0, optimizer_at_copy_s = 0, copy_gbps = 0;
  std::size_t updated_elements = 0;
  double bytes_per_element = 0;
};

using comm_type = zero::comm::any_backend<zero::sys::cuda>;

// Trains with the engine the options name, if its precision is this unit's (nothing otherwise); comm:
// cuda_threads or NCCL behind one type, so that each engine is compiled once for both.
void dispatch_fp32(comm_type& comm, const trainer::options& o, trainer::summary& out, roofline& rl);
void dispatch_bf16(comm_type& comm, const trainer::options& o, trainer::summary& out, roofline& rl);
void dispatch_fp16(comm_type& comm, const trainer::options& o, trainer::summary& out, roofline& rl);

// Whether this build compiles the unit of precision p (a build for one precision, ZERO_TRAINER_PRECISION,
// compiles that unit alone: examples/meson.build).
constexpr bool unit_compiled(std::string_view p) {
  return trainer::built_precision.empty() || trainer::built_precision == p;
}

// The one of the three the options' precision names.
inline void dispatch(comm_type& comm, const trainer::options& o, trainer::summary& out, roofline& rl) {
  if constexpr (unit_compiled("fp32")) dispatch_fp32(comm, o, out, rl);
  if constexpr (unit_compiled("bf16")) dispatch_bf16(comm, o, out, rl);
  if constexpr (unit_compiled("fp16")) dispatch_fp16(comm, o, out, rl);
}

}  // namespace train_mlp_cuda
