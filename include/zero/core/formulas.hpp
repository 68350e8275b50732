// The paper's memory and communication equations, written independently of the engine that must meet them.
#pragma once

#include <algorithm>
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
//
// Stage 3 with persistent units (engine_options::persist_below_elements): Psi_p padded elements of
// units small enough to stay gathered add one full parameter copy, p Psi_p, to the shards.
inline std::uint64_t model_state_bytes(int stage, std::uint64_t psi, int n, state_sizes s,
                                       std::uint64_t persistent = 0) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: Psi = ", psi, " is not a multiple of N = ", n);
  ZERO_CHECK(persistent <= psi, invalid_argument, "formula: persistent elements ", persistent,
             " exceed Psi = ", psi);
  const std::uint64_t per_rank = psi / static_cast<std::uint64_t>(n);
  switch (stage) {
    case 0: return (s.param_bytes + s.grad_bytes + s.k_bytes) * psi;
    case 1: return (s.param_bytes + s.grad_bytes) * psi + s.k_bytes * per_rank;
    case 2: return s.param_bytes * psi + (s.grad_bytes + s.k_bytes) * per_rank;
    case 3: return (s.param_bytes + s.grad_bytes + s.k_bytes) * per_rank + s.param_bytes * persistent;
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
//
// Stage 3 with persistent units (engine_options::persist_below_elements): their Psi_p elements are
// reduce-scattered M times and all-gathered once after the update, as in stages 1-2, instead of being
// gathered in every pass: (3M (Psi - Psi_p) + (M + 1) Psi_p + 2M extra_gathered) (N-1)/N, where
// extra_gathered counts the shared units that are not persistent (a persistent one is gathered by view).
inline std::uint64_t comm_bytes_per_step(int stage, std::uint64_t psi, int n, std::size_t elem_bytes,
                                         int micro_batches = 1, std::uint64_t extra_gathered = 0,
                                         std::uint64_t persistent = 0) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: Psi = ", psi, " is not a multiple of N = ", n);
  ZERO_CHECK(extra_gathered % static_cast<std::uint64_t>(n) == 0 && persistent % static_cast<std::uint64_t>(n) == 0,
             invalid_argument, "formula: the extra gathered elements ", extra_gathered, " or the persistent elements ",
             persistent, " are not a multiple of N = ", n);
  ZERO_CHECK(persistent <= psi, invalid_argument, "formula: persistent elements ", persistent,
             " exceed Psi = ", psi);
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  ZERO_CHECK(micro_batches >= 1, invalid_argument, "formula: micro_batches must be at least 1");
  const auto m = static_cast<std::uint64_t>(micro_batches);
  std::uint64_t elems = 0;
  if (stage == 3) elems = 3 * m * (psi - persistent) + (m + 1) * persistent + 2 * m * extra_gathered;
  else elems = (stage == 0 ? 2 * m : m + 1) * psi;
  return elems / static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1) * elem_bytes;
}

// Bytes each rank sends for one forward-only (evaluation) pass: stage 3 all-gathers every unit once
// per use, (Psi - Psi_p + extra_gathered) (N-1)/N elements (persistent units are read where they are);
// stages 0-2 hold the parameters in full and send nothing.
inline std::uint64_t eval_comm_bytes_per_pass(int stage, std::uint64_t psi, int n, std::size_t elem_bytes,
                                              std::uint64_t extra_gathered = 0, std::uint64_t persistent = 0) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0 && extra_gathered % static_cast<std::uint64_t>(n) == 0 &&
                 persistent % static_cast<std::uint64_t>(n) == 0 && persistent <= psi,
             invalid_argument, "formula: Psi = ", psi, ", the extra gathered elements ", extra_gathered,
             " or the persistent elements ", persistent, " are not multiples of N = ", n, " within Psi");
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  if (stage != 3) return 0;
  return (psi - persistent + extra_gathered) / static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1) *
         elem_bytes;
}

}  // namespace zero::formula

namespace zero::formula {

// The bytes of the state arrays an engine offloads (engine_options::offload): `arrays` fp32 arrays
// (the master weights, if kept apart from the parameters, and each optimizer slot) over the rank's
// held state, H = Psi/N elements in stages 1-3 (sharded optimizer states) and Psi in stage 0. In host
// memory 4 H bytes per array; on disk each array's region is rounded up to whole 4 KiB blocks (the
// unit of direct I/O): arrays x ceil(4 H / 4096) x 4096.
inline std::uint64_t offloaded_state_bytes(int stage, std::uint64_t psi, int n, std::size_t arrays, bool disk) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: Psi = ", psi, " is not a multiple of N = ", n);
  const std::uint64_t held = stage >= 1 ? psi / static_cast<std::uint64_t>(n) : psi;
  const std::uint64_t bytes = 4 * held;
  return arrays * (disk ? (bytes + 4095) / 4096 * 4096 : bytes);
}

// The host memory the disk tier holds per rank besides its file, for `held` elements per array
// (offloaded_state_bytes's H): its slice sets, min(3, slices) of them (one per slice in flight: a
// state of one or two slices needs no more), each of `arrays` slices of `slice` fp32 elements, where
// slice is slice_elements or, for a smaller state, H rounded up to 1024 (whole 4 KiB blocks); and one
// 8-byte checksum per array and slice.
struct disk_tier_host_bytes {
  std::uint64_t staging = 0, checksums = 0;
  std::uint64_t total() const { return staging + checksums; }
};
inline disk_tier_host_bytes disk_tier_host_memory(std::uint64_t held, std::size_t arrays, std::uint64_t slice_elements) {
  const std::uint64_t slice = std::min<std::uint64_t>(slice_elements, (held + 1023) / 1024 * 1024);
  if (slice == 0) return {};
  const std::uint64_t slices = (held + slice - 1) / slice;
  return {std::min<std::uint64_t>(3, slices) * arrays * slice * 4, arrays * slices * 8};
}

// What one step that updates moves between the tiers.
struct offload_step_bytes {
  std::uint64_t disk_read = 0, disk_written = 0, to_host = 0, from_host = 0;
};

// Per step: the disk tier reads and writes every array's region once, offloaded_state_bytes each
// way. Where the system's memory is not host memory (a GPU), the update's operands cross: the R real
// elements the rank updates (its held state without the padding) bring their gradients to the host
// (g bytes each, plus the fp32 weights themselves when the parameters are the master weights) and
// take the new parameters back (c bytes each: the parameter copy, or the 4-byte weights).
inline offload_step_bytes offload_bytes_per_step(int stage, std::uint64_t psi, int n, std::size_t arrays, bool disk,
                                                 bool host_memory_system, std::uint64_t real_held,
                                                 std::size_t grad_bytes, std::size_t param_copy_bytes) {
  offload_step_bytes b;
  if (disk) b.disk_read = b.disk_written = offloaded_state_bytes(stage, psi, n, arrays, true);
  if (!host_memory_system) {
    b.to_host = real_held * (grad_bytes + (param_copy_bytes ? 0 : 4));
    b.from_host = real_held * (param_copy_bytes ? param_copy_bytes : 4);
  }
  return b;
}

// ---- the reproducible reduction (engine_options::reproducible, docs/reproducibility.md) ----------
// Gradients travel and accumulate as three int64 words per element (binned sums), and the sum is
// rounded once into an fp32 gradient, so each reduced gradient element costs:
inline constexpr std::size_t reproducible_wire_bytes = 3 * 8;  // on the wire, per element of a reduce
// held per gradient element a rank reduces: the words of the micro-batches' sum, and its fp32 rounding
inline constexpr std::size_t reproducible_grad_bytes = reproducible_wire_bytes + 4;
// and each reduce first agrees on the bins: one int64 per unit and rank, all-gathered.
inline constexpr std::size_t reproducible_summary_bytes = 8;

// Model-state bytes per rank in that mode. Every stage reduces into a transient bucket (kernels never
// write the persistent store), so the store covers what the rank updates: all of Psi in stage 0, its
// Psi/N slice in stages 1-3 (stage 1 then holds gradients as stage 2 does), at
// reproducible_grad_bytes (G) per element:
//   stage 0: (p + G + K) Psi   stages 1 and 2: p Psi + (G + K) Psi/N   stage 3: (p + G + K) Psi/N
// plus, in stage 3, p Psi_p for the persistent units' copy (model_state_bytes). s.grad_bytes is not
// used (the gradient type only sizes the transient bucket).
inline std::uint64_t reproducible_model_state_bytes(int stage, std::uint64_t psi, int n, state_sizes s,
                                                    std::uint64_t persistent = 0) {
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  s.grad_bytes = reproducible_grad_bytes;
  return model_state_bytes(stage == 1 ? 2 : stage, psi, n, s, stage == 3 ? persistent : 0);
}

// Bytes each rank sends per step in that mode (bus volume), with M micro-batches each reduced on its
// own and U units: every reduce sends the unit's words (an all-reduce in stage 0, a reduce-scatter in
// stages 1-3) after the all-gather of one summary per unit and rank, and the parameters move as in the
// default mode (param_bytes per element):
//   stage 0:     M (2 x 24 Psi (N-1)/N + 8 (N-1) U)
//   stages 1-2:  M (24 Psi (N-1)/N + 8 (N-1) U) + p Psi (N-1)/N
//   stage 3:     M (24 Psi (N-1)/N + 8 (N-1) U) + p (2M (Psi - Psi_p + extra_gathered) + Psi_p) (N-1)/N
// (Psi_p: the persistent units' elements, gathered once after the update instead of in every pass;
// extra_gathered counts the shared units that are not persistent, as in comm_bytes_per_step).
// Fusing units into one reduce (reduce_bucket_elements) changes the calls, not the bytes.
inline std::uint64_t reproducible_comm_bytes_per_step(int stage, std::uint64_t psi, int n, std::size_t param_bytes,
                                                      int micro_batches, std::uint64_t units,
                                                      std::uint64_t extra_gathered = 0, std::uint64_t persistent = 0) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0, invalid_argument, "formula: Psi = ", psi,
             " is not a multiple of N = ", n);
  ZERO_CHECK(extra_gathered % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: the extra gathered elements ", extra_gathered, " are not a multiple of N = ", n);
  ZERO_CHECK(persistent % static_cast<std::uint64_t>(n) == 0 && persistent <= psi, invalid_argument,
             "formula: the persistent elements ", persistent, " are not a multiple of N = ", n, " within Psi");
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  ZERO_CHECK(micro_batches >= 1, invalid_argument, "formula: micro_batches must be at least 1");
  const auto m = static_cast<std::uint64_t>(micro_batches), nn = static_cast<std::uint64_t>(n);
  const std::uint64_t part = psi / nn * (nn - 1);  // Psi (N-1)/N elements
  const std::uint64_t grads = (stage == 0 ? 2 : 1) * part * reproducible_wire_bytes;
  const std::uint64_t summaries = reproducible_summary_bytes * (nn - 1) * units;
  std::uint64_t params = 0;
  if (stage == 1 || stage == 2) params = part * param_bytes;
  if (stage == 3) params = (2 * m * (psi - persistent + extra_gathered) + persistent) / nn * (nn - 1) * param_bytes;
  return m * (grads + summaries) + params;
}

}  // namespace zero::formula
