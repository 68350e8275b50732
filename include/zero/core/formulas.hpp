// The paper's memory and communication equations, written independently of the engine that must meet them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "zero/core/checked.hpp"
#include "zero/error.hpp"

namespace zero::formula {

// Products and sums of the equations, refused (invalid_argument) where they would wrap: Psi comes
// from the model (at most 2^51 padded elements), M and N from the options.
namespace detail {
inline std::uint64_t mul(std::uint64_t a, std::uint64_t b) { return mul_or_fail(a, b, "formula"); }
inline std::uint64_t add(std::uint64_t a, std::uint64_t b) { return add_or_fail(a, b, "formula"); }
}  // namespace detail

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
  using detail::add, detail::mul;
  switch (stage) {
    case 0:
      return mul(s.param_bytes + s.grad_bytes + s.k_bytes, psi);
    case 1:
      return add(mul(s.param_bytes + s.grad_bytes, psi), mul(s.k_bytes, per_rank));
    case 2:
      return add(mul(s.param_bytes, psi), mul(s.grad_bytes + s.k_bytes, per_rank));
    case 3:
      return add(mul(s.param_bytes + s.grad_bytes + s.k_bytes, per_rank), mul(s.param_bytes, persistent));
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
  using detail::add, detail::mul;
  const auto m = static_cast<std::uint64_t>(micro_batches);  // < 2^31: 3m, 2m and m + 1 do not wrap
  std::uint64_t elems = 0;
  if (stage == 3)
    elems = add(add(mul(3 * m, psi - persistent), mul(m + 1, persistent)), mul(2 * m, extra_gathered));
  else
    elems = mul(stage == 0 ? 2 * m : m + 1, psi);
  return mul(elems / static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1), elem_bytes);
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
  return detail::mul(
      detail::add(psi - persistent, extra_gathered) / static_cast<std::uint64_t>(n) * static_cast<std::uint64_t>(n - 1),
      elem_bytes);
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
  const std::uint64_t bytes = detail::mul(4, held);
  return detail::mul(arrays, disk ? detail::add(bytes, 4095) / 4096 * 4096 : bytes);
}

// A peer snapshot (checkpoint::take_peer_snapshot): a rank's data file holds its canonical slice of
// the master weights and every optimizer slot in fp32, (1 + S) 4 Psi/N bytes for S slots (at most:
// the padding is in no file); a rank keeps its own and its ring predecessor's, 2 (1 + S) 4 Psi/N
// (its own alone at N = 1), and each snapshot sends the own file once, (1 + S) 4 Psi/N (none at N = 1).
struct peer_snapshot_cost {
  std::uint64_t held = 0, sent = 0;
};
inline peer_snapshot_cost peer_snapshot_bytes(std::uint64_t psi, int n, int slots) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0 && slots >= 0, invalid_argument, "formula: Psi = ", psi,
             " is not a multiple of N = ", n, ", or slots ", slots, " < 0");
  const std::uint64_t file = detail::mul(detail::mul(4, 1 + static_cast<std::uint64_t>(slots)), psi / static_cast<std::uint64_t>(n));
  return n == 1 ? peer_snapshot_cost{file, 0} : peer_snapshot_cost{detail::mul(2, file), file};
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
// way (a tensor-wise or matrix optimizer's two passes: `reads` = `writes` = 2 times). Where the system's memory is not
// host memory (a GPU), the update's operands cross: the R real elements the rank updates (its held state without the
// padding) bring their gradients to the host (g bytes each, plus the fp32 weights themselves when the parameters are
// the master weights) and take the new parameters back (c bytes each: the parameter copy, or the 4-byte weights).
inline offload_step_bytes offload_bytes_per_step(int stage, std::uint64_t psi, int n, std::size_t arrays, bool disk,
                                                 bool host_memory_system, std::uint64_t real_held,
                                                 std::size_t grad_bytes, std::size_t param_copy_bytes,
                                                 std::uint64_t reads = 1, std::uint64_t writes = 1) {
  offload_step_bytes b;
  if (disk) {
    const std::uint64_t region = offloaded_state_bytes(stage, psi, n, arrays, true);
    b.disk_read = detail::mul(region, reads);
    b.disk_written = detail::mul(region, writes);
  }
  if (!host_memory_system) {
    b.to_host = detail::mul(real_held, grad_bytes + (param_copy_bytes ? 0 : 4));
    b.from_host = detail::mul(real_held, param_copy_bytes ? param_copy_bytes : 4);
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
// Over more than one rank, without replicated shard groups, over a backend with all_to_all (every
// backend of the library), a reduce exchanges the gradient values instead: each slice goes to the
// rank that holds its words (all_to_all, the gradient type's bytes per element), which cuts and sums
// them itself. In stage 0, where every rank updates every element, each rank then rounds its slice at
// the unit's last reduce of the step and one all-gather of the fp32 gradient (4 bytes per element)
// gives every rank the whole. Elsewhere the words travel.
inline constexpr bool reproducible_exchanges_values(int stage, int n, int replicas, bool has_all_to_all) {
  return stage >= 0 && n > 1 && replicas == 1 && has_all_to_all;
}
// The rounded fp32 gradient's element, all-gathered once per unit and step where stage 0 exchanges values.
inline constexpr std::size_t reproducible_gathered_bytes = 4;

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
// stages 1-3), or where it exchanges values (value_bytes > 0: reproducible_exchanges_values) their
// g = value_bytes per element by all_to_all, after the all-gather of one summary per unit and rank,
// and the parameters move as in the default mode (param_bytes per element):
//   stage 0:     M (2 x 24 Psi (N-1)/N + 8 (N-1) U)     (values: M (g Psi (N-1)/N + 8 (N-1) U) + 4 Psi (N-1)/N,
//                                                        the rounded gradient all-gathered once)
//   stages 1-2:  M (24 Psi (N-1)/N + 8 (N-1) U) + p Psi (N-1)/N   (values: g for 24)
//   stage 3:     M (24 Psi (N-1)/N + 8 (N-1) U) + p (2M (Psi - Psi_p + extra_gathered) + Psi_p) (N-1)/N
// (Psi_p: the persistent units' elements, gathered once after the update instead of in every pass;
// extra_gathered counts the shared units that are not persistent, as in comm_bytes_per_step).
// Fusing units into one reduce (reduce_bucket_elements) changes the calls, not the bytes.
inline std::uint64_t reproducible_comm_bytes_per_step(int stage, std::uint64_t psi, int n, std::size_t param_bytes,
                                                      int micro_batches, std::uint64_t units,
                                                      std::uint64_t extra_gathered = 0, std::uint64_t persistent = 0,
                                                      std::size_t value_bytes = 0) {
  ZERO_CHECK(n > 0 && psi % static_cast<std::uint64_t>(n) == 0, invalid_argument, "formula: Psi = ", psi,
             " is not a multiple of N = ", n);
  ZERO_CHECK(extra_gathered % static_cast<std::uint64_t>(n) == 0, invalid_argument,
             "formula: the extra gathered elements ", extra_gathered, " are not a multiple of N = ", n);
  ZERO_CHECK(persistent % static_cast<std::uint64_t>(n) == 0 && persistent <= psi, invalid_argument,
             "formula: the persistent elements ", persistent, " are not a multiple of N = ", n, " within Psi");
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  ZERO_CHECK(micro_batches >= 1, invalid_argument, "formula: micro_batches must be at least 1");
  using detail::add, detail::mul;
  const auto m = static_cast<std::uint64_t>(micro_batches), nn = static_cast<std::uint64_t>(n);
  const std::uint64_t part = psi / nn * (nn - 1);  // Psi (N-1)/N elements
  const std::uint64_t grads = mul(value_bytes > 0 ? value_bytes : (stage == 0 ? 2 : 1) * reproducible_wire_bytes, part);
  const std::uint64_t summaries = mul(reproducible_summary_bytes * (nn - 1), units);
  const std::uint64_t gathered = stage == 0 && value_bytes > 0 ? mul(part, reproducible_gathered_bytes) : 0;
  std::uint64_t params = 0;
  if (stage == 1 || stage == 2) params = mul(part, param_bytes);
  if (stage == 3)
    params = mul(add(mul(2 * m, add(psi - persistent, extra_gathered)), persistent) / nn * (nn - 1), param_bytes);
  return add(add(mul(m, add(grads, summaries)), params), gathered);
}

// Replicated shard groups (engine_options::shard_group_size = S, R = N / S groups): the bytes each
// rank sends per step across the groups, on top of comm_bytes_per_step at S ranks within its group.
// Every reduce all-reduces the rank's reduced slice over the R groups, 2 (R-1)/R of it: Psi/S elements
// (stage 0, whose in-group reduce is an all-reduce: Psi), micro_batches times. `wire_bytes` is the
// gradient's element (the reproducible mode: its 24 binned bytes, plus one 8-byte summary per unit
// and reduce all-gathered over the R groups, (R-1) x 8 bytes each). Psi is a multiple of S x R (the
// layout pads as at N ranks), so every call's share is exact.
inline std::uint64_t replica_comm_bytes_per_step(int stage, std::uint64_t psi, int s, int r, std::size_t wire_bytes,
                                                 int micro_batches, std::uint64_t summary_units = 0) {
  ZERO_CHECK(s > 0 && r > 0 && psi % (static_cast<std::uint64_t>(s) * static_cast<std::uint64_t>(r)) == 0,
             invalid_argument, "formula: Psi = ", psi, " is not a multiple of S x R = ", s, " x ", r);
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  ZERO_CHECK(micro_batches >= 1, invalid_argument, "formula: micro_batches must be at least 1");
  using detail::add, detail::mul;
  const auto m = static_cast<std::uint64_t>(micro_batches), rr = static_cast<std::uint64_t>(r);
  const std::uint64_t elems = stage == 0 ? psi : psi / static_cast<std::uint64_t>(s);
  const std::uint64_t grads = mul(elems / rr * 2 * (rr - 1), wire_bytes);
  const std::uint64_t summaries = mul(reproducible_summary_bytes * (rr - 1), summary_units);
  return mul(m, add(grads, summaries));
}

}  // namespace zero::formula

namespace zero::formula {

// ---- partitioned activation checkpoints (ZeRO-R: activation_store, engine/activation_store.hpp) ----
// L checkpoints of E elements of b bytes each, on a tensor-parallel group of tp ranks that all hold the
// same activations. Pa keeps each rank's slice of s = ceil(E / tp) elements (the last slice padded).
inline std::uint64_t activation_slice_elements(std::uint64_t elements, int tp) {
  ZERO_CHECK(tp >= 1, invalid_argument, "formula: a tensor-parallel group of ", tp, " ranks");
  const auto t = static_cast<std::uint64_t>(tp);
  return elements / t + (elements % t != 0);
}

// Bytes one rank holds for the checkpoints while they are saved: in the system's memory and in host
// memory (pinned on a device system; the same RAM on a CPU system).
//   none (whole tensors): L E b in the system's memory
//   Pa:                   L s b in the system's memory
//   Pa+cpu:               0 in the system's memory, L s b in host memory
struct activation_bytes {
  std::uint64_t system = 0, host = 0;
};
inline activation_bytes activation_checkpoint_bytes(std::uint64_t layers, std::uint64_t elements,
                                                    std::size_t elem_bytes, int tp, bool partitioned,
                                                    bool in_host_memory) {
  ZERO_CHECK(!in_host_memory || partitioned, invalid_argument,
             "formula: activation checkpoints go to host memory only partitioned (Pa+cpu)");
  const std::uint64_t kept = partitioned ? activation_slice_elements(elements, tp) : elements;
  const std::uint64_t bytes = detail::mul(detail::mul(layers, kept), elem_bytes);
  return in_host_memory ? activation_bytes{0, bytes} : activation_bytes{bytes, 0};
}

// A restored checkpoint (Pa, Pa+cpu) is gathered whole into a buffer of tp s elements, the padding
// included, held until it is released: the backward pass's transient, tp s b per layer restored at once.
// Without partitioning the restore is the saved tensor itself: 0.
inline std::uint64_t activation_restore_bytes(std::uint64_t elements, std::size_t elem_bytes, int tp,
                                              bool partitioned) {
  if (!partitioned) return 0;
  return detail::mul(detail::mul(activation_slice_elements(elements, tp), static_cast<std::uint64_t>(tp)), elem_bytes);
}

// Bytes each rank sends per backward pass (bus volume, as comm::counted counts an all-gather of tp
// slices): L (tp - 1) s b with Pa or Pa+cpu (one all-gather per checkpoint), 0 without partitioning.
// Pa+cpu also copies L s b to host memory in the forward pass and back in the backward pass.
inline std::uint64_t activation_gather_bytes(std::uint64_t layers, std::uint64_t elements, std::size_t elem_bytes,
                                             int tp, bool partitioned) {
  if (!partitioned) return 0;
  const std::uint64_t s = activation_slice_elements(elements, tp);
  return detail::mul(detail::mul(detail::mul(layers, static_cast<std::uint64_t>(tp - 1)), s), elem_bytes);
}

}  // namespace zero::formula
