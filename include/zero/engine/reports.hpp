// What the engine reports: the outcome of a step, and the bytes it has communicated.
#pragma once

#include <cstdint>
#include <limits>

#include "zero/comm/counted.hpp"

namespace zero {

struct step_report {
  std::uint64_t step = 0;   // optimizer updates so far (a skipped step does not count)
  bool skipped = false;     // the update was skipped on every rank (non-finite gradients)
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // global L2 norm, when computed
  float loss_scale = 1.0f;  // the scale this step's gradients carried
  comm::comm_stats comm;    // bytes this rank sent during the step's protocol calls
  // Bytes this rank sent on the control link during the optimizer's update: a matrix optimizer's
  // exchange (engine::optimizer_exchange_formula_bytes()), a tensor-wise optimizer's sums; 0 for an
  // element-wise optimizer and in a skipped step.
  comm::comm_stats optimizer_exchange;
};

// The scalar state of training besides the tensors: what a checkpoint stores next to them.
struct training_state {
  // The most steps a run can reach, and the bound on step, skipped_steps, their sum (a trainer's data
  // position) and clean_steps: 2^53, where a count is still exact as a double (the optimizers raise
  // their decay rates to the power of the step). A checkpoint with more is refused, never wrapped.
  static constexpr std::uint64_t max_steps = std::uint64_t{1} << 53;

  std::uint64_t step = 0;           // completed optimizer updates (skipped steps not included)
  float loss_scale = 1.0f;          // dynamic loss scaling: the current scale
  std::uint64_t clean_steps = 0;    // steps since the last overflow or growth of the scale
  int hysteresis_left = 0;          // overflows still tolerated before the scale is halved
  std::uint64_t skipped_steps = 0;  // steps skipped because of non-finite gradients
};

struct comm_report {
  comm::comm_stats protocol;   // gather/reduce/step traffic since construction
  comm::comm_stats last_step;  // that traffic during the last completed step (gather .. step)
  comm::comm_stats other;      // initialisation broadcasts, full_params() gathers: outside any step
  // The steps' control collectives since construction (the norm's all-reduce and the optimizer's
  // fingerprint, agreement.hpp; a tensor-wise optimizer's sums, a matrix optimizer's exchange): k times
  // plan_report::control_comm after k steps that updated.
  comm::comm_stats control;
  std::uint64_t steps = 0;     // step() calls, skipped ones included
  comm::comm_stats evaluation;  // gathers inside engine::evaluation() scopes, since construction: in no step
  // In a tensor-parallel mesh: the tensor-parallel group's traffic (the norm's exchange at each step,
  // full_model_params()); zero outside a mesh.
  comm::comm_stats tensor_parallel;
};

// What the overlap of communication with computation did (engine_options::overlap), since
// construction: counts, the same on every rank, so a test can hold them exactly.
struct overlap_report {
  bool active = false;               // overlap on and the backend has nonblocking collectives
  std::uint64_t prefetches = 0;      // stage 3 all-gathers started before their gather(u)
  std::uint64_t prefetch_hits = 0;   // gather(u) calls that found their prefetch
  std::uint64_t prefetch_misses = 0;  // prefetches dropped because the gather order changed (bytes spent)
  std::uint64_t reduces_started = 0;  // reduce collectives left in flight by reduce(u) (or step(), for a last bucket)
  std::uint64_t max_reduces_in_flight = 0;
  std::uint64_t parameter_gathers_started = 0;  // stages 1-2: step()'s all-gathers left in flight
  std::uint64_t fused_reduces = 0;  // reduce-scatters that carried several units (reduce_bucket_elements)
  // Stage 3's all-gathers that carried several units (gather_bucket_elements); the units after the
  // first of each count as prefetches (hits when their gather(u) takes them), on any backend.
  std::uint64_t gather_buckets = 0;
};

}  // namespace zero
