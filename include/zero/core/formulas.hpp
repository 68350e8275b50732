// The paper's memory and communication equations, written independently of the engine that must meet them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/error.hpp"

namespace zero::formula {

// Bytes per parameter of each model state: p (parameters), g (gradients), K (master weights, if
// kept apart from the parameters, plus every optimizer slot).
struct state_sizes {
  std::size_t param_bytes = 4, grad_bytes = 4, k_bytes = 8;
};

// Model-state bytes per rank for ZeRO stage `stage`, Psi padded parameters and N ranks:
//   stage 0: (p + g + K) Psi        stage 1: (p + g) Psi + K Psi/N
//   stage 2: p Psi + (g + K) Psi/N  stage 3: (p + g + K) Psi/N
// Psi is a multiple of N (every unit is padded to one), so the divisions are exact.
inline std::uint64_t model_state_bytes(int stage, std::uint64_t psi, int n, state_sizes s) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: Psi = ", psi, " is not a multiple of N = ", n);
  const std::uint64_t per_rank = psi / static_cast<std::uint64_t>(n);
  switch (stage) {
    case 0: return (s.param_bytes + s.grad_bytes + s.k_bytes) * psi;
    case 1: return (s.param_bytes + s.grad_bytes) * psi + s.k_bytes * per_rank;
    case 2: return s.param_bytes * psi + (s.grad_bytes + s.k_bytes) * per_rank;
    case 3: return (s.param_bytes + s.grad_bytes + s.k_bytes) * per_rank;
  }
  fail(error_kind::invalid_argument, "formula: no ZeRO stage ", stage);
}

// Bytes each rank sends per step (bus volume): 2 Psi (N-1)/N elements for stages 0-2 (one
// all-reduce, or reduce-scatter plus all-gather), 3 Psi (N-1)/N for stage 3 (parameters gathered in
// forward and again in backward, gradients reduce-scattered), each of `elem_bytes` bytes. With M
// micro-batches each reduced on its own, the gradient pass (and in stage 3 the gathers) happen M
// times: 2M, M + 1, M + 1 and 3M Psi (N-1)/N.
//
// Shared (tied) units gathered more than once per pass (unit_spec::gathers) add, in stage 3 only,
// their extra all-gathers in both passes of every micro-batch: `extra_gathered` is the sum over units
// of (gathers - 1) x padded elements, and stage 3 sends (3M Psi + 2M extra_gathered) (N-1)/N. Stages
// 0-2 gather by view: the extra gathers cost nothing there.
inline std::uint64_t comm_bytes_per_step(int stage, std::uint64_t psi, int n, std::size_t elem_bytes,
                                         int micro_batches = 1, std::uint64_t extra_gathered = 0) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: Psi = ", psi, " is not a multiple of N = ", n);
  ZERO_CHECK(extra_gathered % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: the extra gathered elements ", extra_gathered, " are not a multiple of N = ", n);
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  ZERO_CHECK(micro_batches >= 1, invalid_argument, "formula: micro_batches must be at least 1");
  const auto m = static_cast<std::uint64_t>(micro_batches);
  const std::uint64_t passes = stage == 3 ? 3 * m : (stage == 0 ? 2 * m : m + 1);
  const std::uint64_t elems = passes * psi + (stage == 3 ? 2 * m * extra_gathered : 0);
  return elems / static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1) * elem_bytes;
}

// Bytes each rank sends for one forward-only (evaluation) pass: stage 3 all-gathers every unit once
// per use, (Psi + extra_gathered) (N-1)/N elements; stages 0-2 hold the parameters in full and send
// nothing.
inline std::uint64_t eval_comm_bytes_per_pass(int stage, std::uint64_t psi, int n, std::size_t elem_bytes,
                                              std::uint64_t extra_gathered = 0) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0 && extra_gathered % static_cast<std::uint64_t>(n) == 0,
             invalid_argument, "formula: Psi = ", psi, " or the extra gathered elements ", extra_gathered,
             " are not a multiple of N = ", n);
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  if (stage != 3) return 0;
  return (psi + extra_gathered) / static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1) * elem_bytes;
}

}  // namespace zero::formula
