// plan: an engine's memory per rank (by category, with its transient peaks) and traffic per step, before anything runs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zero/comm/counted.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/concepts/precision_policy.hpp"
#include "zero/core/checked.hpp"
#include "zero/core/formulas.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/agreement.hpp"
#include "zero/engine/memory_check.hpp"
#include "zero/engine/options.hpp"
#include "zero/error.hpp"
#include "zero/partition/stages.hpp"

namespace zero {

// What plan() needs of a precision policy, as run-time values: of<P>() for a policy type
// (zero/plan_by_name.hpp finds one of the catalog's by its name, a tool's flag).
struct plan_precision {
  std::string_view name = "fp32";
  std::size_t param_bytes = 4, grad_bytes = 4;
  bool separate_master = false;  // an fp32 master copy apart from the parameters

  template <PrecisionPolicy P>
  static constexpr plan_precision of() {
    return {P::name, sizeof(typename P::param_type), sizeof(typename P::grad_type), P::separate_master};
  }
};

// What plan() needs of an optimizer: its fp32 slots per parameter.
struct plan_optimizer {
  std::string_view name = "adamw";
  int slots = 2;

  template <OptimizerState O>
  static constexpr plan_optimizer of() {
    return {O::name, O::slots};
  }
};

// One unit's transient buffers (bytes), for loops other than the one plan() assumes.
struct unit_plan {
  std::string name;
  std::size_t numel = 0, padded = 0, shard = 0;  // elements, as zero::layout places them
  int gathers = 1;                               // unit_spec::gathers: times gathered per pass
  bool persistent = false;                       // stage 3: kept gathered (engine_options::persist_below_elements)
  std::uint64_t gathered_bytes = 0;              // stage 3: gather(u)'s all-gathered parameters, padded
  std::uint64_t bucket_bytes = 0;                // grads(u)'s transient bucket, padded, where one is used
  std::uint64_t wire_bytes = 0;                  // reproducible: reduce(u)'s binned words, 24 per padded element
  std::uint64_t consolidation_bytes = 0;         // full_params(u) in stages 1-3: the unit's padded fp32 gather
};

// An engine's memory per rank and traffic per step. Exact for the engine as built (a test holds every
// field equal to what the engine then measures), for the loop of the protocol: in each micro-batch
// every unit is gathered and released in a forward pass, then gathered again, given its gradients
// and reduced in a backward pass, so at most one unit is gathered at a time and grads(u) follows
// gather(u); every step() updates (no step skipped for non-finite gradients). A shared unit
// (unit_spec::gathers > 1) is gathered that many times in each pass and reduced once: its gradient
// bucket is taken at its first grads() and held to its reduce(), which the plan assumes spans the
// whole backward pass (the tied embedding's pattern: the output layer first, the embedding last), so
// its bucket adds to every other unit's gathered parameters and bucket.
struct plan_report {
  int stage = 0, ranks = 1;
  std::size_t numel = 0, padded = 0;  // parameters, unpadded and padded (Psi)
  std::size_t persistent = 0;         // stage 3: padded elements of the persistent units (Psi_p)
  std::vector<unit_plan> units;

  // Persistent: allocated by the constructor, held until the engine is destroyed.
  // params, grads, master, optimizer_states, offload; = memory().current. model_states.offload is the
  // host memory of the offload tier, which a CPU system counts as its own (mem_category::offload, in
  // peak_bytes and memory_limit_bytes): the host tier's arrays, or the disk tier's slice sets and
  // checksums (offload_staging_bytes + offload_checksum_bytes). A device system holds these bytes in
  // host memory beside its budget: there memory() has them not, and fits() must be asked without them.
  model_state_plan model_states;
  // engine_options::offload: the master weights and slots in host memory or on disk instead (then
  // model_states has none of them): = offload().host_bytes + offload().disk_bytes.
  std::uint64_t offloaded_bytes = 0;
  std::uint64_t offload_staging_bytes = 0;   // the disk tier's slice sets: = offload().staging_bytes on a CPU system
  std::uint64_t offload_checksum_bytes = 0;  // the disk tier's slice checksums: = offload().checksum_bytes

  // Transient buffers, allocated and freed inside the protocol's calls.
  std::uint64_t bucket_bytes = 0;    // the largest unit's gradient bucket (stages 2-3, or M > 1 reduced micro-batches)
  std::uint64_t shared_bucket_bytes = 0;  // the buckets of the shared units, held through the backward pass
  std::uint64_t gathered_bytes = 0;  // the largest unit gathered (stage 3)
  std::uint64_t wire_bytes = 0;      // reproducible: the largest unit's binned words, beside its bucket in reduce(u)
  // step()'s buffer of the norm's collective (stages 1-3, when a norm is computed): one double and the
  // optimizer's fingerprint (8 doubles), or in the reproducible mode the all-gathered words of every
  // rank (8 x 4 x N bytes)
  std::uint64_t norm_bytes = 0;
  std::uint64_t step_transient_peak = 0;   // = memory().peak_bytes(transient) after steps of the loop above
  std::uint64_t peak_bytes = 0;            // model states + step_transient_peak: = memory().peak_total
  std::uint64_t consolidation_bytes = 0;   // full_params() in stages 1-3: the largest unit in fp32
  std::uint64_t init_broadcast_bytes = 0;  // initialize(range fn, broadcast_from_rank0): its one chunk buffer

  // Bytes (nccl-tests bus volume) and calls per step, by collective: = comm().last_step.
  comm::comm_stats step_comm;
  // The step's control collective, per step, = comm().control: the gradient norm's all-reduce with the
  // optimizer's fingerprint (stages 1-3 with a norm), else at N > 1 the fingerprint's own all-reduce.
  comm::comm_stats control_comm;

  std::uint64_t step_bytes_sent() const { return step_comm.total_bytes(); }
  // Whether every byte the engine holds during training fits `memory_bytes` per rank: the check
  // engine_options::memory_limit_bytes makes before each allocation passes throughout.
  bool fits(std::uint64_t memory_bytes) const { return peak_bytes <= memory_bytes; }
};

namespace detail {

inline void plan_count(comm::comm_stats& s, comm::collective c, std::uint64_t buffer_bytes, int ranks,
                       std::uint64_t times = 1) {
  // The counted decorator's rule, call by call: (N-1)/N of the buffer (2(N-1)/N for all_reduce).
  // Checked: a shape or micro_batches from a model file must not wrap the bytes per step.
  const auto n = static_cast<std::uint64_t>(ranks);
  std::uint64_t bytes = 0;
  if (n > 1)
    bytes = mul_or_fail((c == comm::collective::all_reduce ? 2 : 1) * (n - 1), buffer_bytes, "plan: bytes") / n;
  auto& total = s.bytes[static_cast<int>(c)];
  total = add_or_fail(total, mul_or_fail(times, bytes, "plan: bytes per step"), "plan: bytes per step");
  s.calls[static_cast<int>(c)] += times;
}

}  // namespace detail

// The memory and traffic of engine<stage, *, optimizer, precision> on `ranks` ranks for `spec` with
// `options`, from the layout and the formulas alone: nothing is allocated. Throws zero::error
// (invalid_argument) for what the engine's constructor would refuse.
inline plan_report plan(const model_spec& spec, int ranks, int stage, plan_precision precision,
                        plan_optimizer optimizer, const engine_options& options = {}) {
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "plan: no ZeRO stage ", stage, " (0-3)");
  ZERO_CHECK(ranks > 0, invalid_argument, "plan: world size must be positive, got ", ranks);
  ZERO_CHECK(optimizer.slots >= 0, invalid_argument, "plan: optimizer '", optimizer.name, "' has ", optimizer.slots,
             " slots");
  ZERO_CHECK(options.micro_batches >= 1, invalid_argument, "plan: micro_batches must be >= 1, got ",
             options.micro_batches);
  const bool shards_states = stage >= 1, shards_grads = stage >= 2, shards_params = stage == 3;
  ZERO_CHECK(options.accumulate != accumulation::local_then_reduce || !shards_grads, invalid_argument,
             "plan: local_then_reduce accumulation needs full gradients; stage ", stage, " shards them");
  ZERO_CHECK(!options.fp32_grad_accumulation || shards_grads, invalid_argument,
             "plan: fp32_grad_accumulation applies to stages 2 and 3, not stage ", stage);
  const bool repro = options.reproducible;
  ZERO_CHECK(!repro || (options.accumulate == accumulation::reduce_each_micro_batch && !options.fp32_grad_accumulation),
             invalid_argument,
             "plan: reproducible reduces every micro-batch on its own, without fp32_grad_accumulation");
  ZERO_CHECK(
      !repro || static_cast<std::uint64_t>(ranks) * static_cast<std::uint64_t>(options.micro_batches) <= (1u << 24),
      invalid_argument, "plan: reproducible averages over N x micro_batches, at most 2^24");
  ZERO_CHECK(!(options.zeropp.qwz || options.zeropp.qgz || options.zeropp.hpz), invalid_argument,
             "plan: ZeRO++ (engine_options::zeropp qwz, qgz, hpz) is not planned yet; its traffic per step is "
             "zero::formula::bytes_per_step (core/link_formulas.hpp), its model states add hpZ's secondary shard "
             "(formula::hpz_secondary_bytes)");

  ZERO_CHECK(options.offload.tier == offload_tier::none ||
                 (options.offload.slice_elements > 0 && options.offload.slice_elements % 1024 == 0),
             invalid_argument, "plan: offload.slice_elements must be a positive multiple of 1024 (4 KiB of fp32), got ",
             options.offload.slice_elements);

  // The layout alone decides how units split, the same for every stage, so one layout serves them all.
  const layout l = layout::make(spec, ranks);
  plan_report r;
  r.stage = stage;
  r.ranks = ranks;
  r.numel = l.numel();
  r.padded = l.padded();

  const std::uint64_t full = l.padded(), shard = l.shard_total();
  // Stage 3's persistent units keep a whole copy of their parameters (the engine's place_persistent_units).
  auto persists = [&](const unit_layout& ul) {
    return shards_params && options.persist_below_elements > 0 && ul.numel <= options.persist_below_elements;
  };
  for (std::size_t u = 0; u < l.num_units(); ++u)
    if (persists(l.unit(unit_id{u}))) r.persistent += l.unit(unit_id{u}).padded;
  const std::uint64_t state_elems = shards_states ? shard : full;
  const std::size_t stored_grad_bytes = repro                            ? formula::reproducible_grad_bytes
                                        : options.fp32_grad_accumulation ? sizeof(float)
                                                                         : precision.grad_bytes;
  // Reproducible: the store covers what the rank updates (its slice wherever states are sharded).
  const bool grads_sharded = repro ? shards_states : shards_grads;
  // Elements are at most 2^51 (layout::max_padded_elements); the bytes per element come from the caller.
  const auto bytes = [](std::uint64_t elements, std::uint64_t per_element) {
    return mul_or_fail(elements, per_element, "plan: model-state bytes");
  };
  r.model_states.params = bytes((shards_params ? shard : full) + r.persistent, precision.param_bytes);
  r.model_states.grads = bytes(grads_sharded ? shard : full, stored_grad_bytes);
  r.model_states.master = precision.separate_master ? bytes(state_elems, sizeof(float)) : 0;
  r.model_states.optimizer_states =
      bytes(bytes(state_elems, sizeof(float)), static_cast<std::uint64_t>(optimizer.slots));
  if (options.offload.tier != offload_tier::none) {
    const std::size_t arrays = (precision.separate_master ? 1 : 0) + static_cast<std::size_t>(optimizer.slots);
    const bool disk = options.offload.tier == offload_tier::disk;
    r.offloaded_bytes = formula::offloaded_state_bytes(stage, full, ranks, arrays, disk);
    r.model_states.master = r.model_states.optimizer_states = 0;
    if (disk) {
      const auto host = formula::disk_tier_host_memory(state_elems, arrays, options.offload.slice_elements);
      r.offload_staging_bytes = host.staging;
      r.offload_checksum_bytes = host.checksums;
      r.model_states.offload = host.total();
    } else {
      r.model_states.offload = r.offloaded_bytes;  // the host tier's arrays
    }
  }

  // Kernels write a transient bucket (in the gradient type, whatever the store's type) when gradients
  // are sharded or several reduced micro-batches must be added up (engine::uses_bucket).
  const int reduces = options.accumulate == accumulation::reduce_each_micro_batch ? options.micro_batches : 1;
  const bool bucket = repro || shards_grads || reduces > 1;
  const bool norm = precision.separate_master || options.clip_norm > 0.0f || options.compute_grad_norm || repro;
  std::size_t largest_tensor = 0;
  std::uint64_t backward_peak = 0;  // the most one unit holds in backward besides the shared buckets
  for (std::size_t u = 0; u < l.num_units(); ++u) {
    const unit_layout& ul = l.unit(unit_id{u});
    const int gathers = spec.units()[u].gathers;
    unit_plan up{spec.units()[u].name, ul.numel, ul.padded, ul.shard, gathers, persists(ul)};
    up.gathered_bytes = shards_params && !up.persistent ? bytes(ul.padded, precision.param_bytes) : 0;
    up.bucket_bytes = bucket ? bytes(ul.padded, precision.grad_bytes) : 0;
    // Reproducible: reduce(u) converts the bucket into words (both held at once), then frees the bucket.
    up.wire_bytes = repro ? ul.padded * formula::reproducible_wire_bytes : 0;
    up.consolidation_bytes = shards_states ? ul.padded * sizeof(float) : 0;
    r.gathered_bytes = std::max(r.gathered_bytes, up.gathered_bytes);
    r.bucket_bytes = std::max(r.bucket_bytes, up.bucket_bytes);
    r.wire_bytes = std::max(r.wire_bytes, up.wire_bytes);
    r.consolidation_bytes = std::max(r.consolidation_bytes, up.consolidation_bytes);
    // Backward holds a unit gathered and its bucket at once: reduce(u) frees the bucket, release the unit.
    // A shared unit's bucket is held through the backward, so it is counted once, with the shared ones.
    if (gathers > 1) {
      r.shared_bucket_bytes += up.bucket_bytes;
      backward_peak = std::max(backward_peak, up.gathered_bytes + up.wire_bytes);
    } else {
      backward_peak = std::max(backward_peak, up.gathered_bytes + up.bucket_bytes + up.wire_bytes);
    }
    for (const auto& t : spec.units()[u].tensors) largest_tensor = std::max(largest_tensor, t.numel);

    // The protocol's collectives of this unit in one step (comm::counted's view of the engine).
    const std::uint64_t unit_params = bytes(ul.padded, precision.param_bytes);
    const std::uint64_t unit_grads = bytes(ul.padded, precision.grad_bytes);
    const auto m = static_cast<std::uint64_t>(options.micro_batches);
    const auto per_step = static_cast<std::uint64_t>(reduces);
    // Reproducible: the words instead of the gradients, after an all-gather of one summary per rank.
    const std::uint64_t unit_wire = repro ? up.wire_bytes : unit_grads;
    if (repro)
      detail::plan_count(r.step_comm, comm::collective::all_gather,
                         formula::reproducible_summary_bytes * static_cast<std::uint64_t>(ranks), ranks, per_step);
    if (stage == 0) {
      detail::plan_count(r.step_comm, comm::collective::all_reduce, unit_wire, ranks, per_step);
    } else {
      detail::plan_count(r.step_comm, comm::collective::reduce_scatter, unit_wire, ranks, per_step);
      if (shards_params && !up.persistent)  // gathered `gathers` times in forward and in backward, every micro-batch
        detail::plan_count(r.step_comm, comm::collective::all_gather, unit_params, ranks,
                           mul_or_fail(2 * m, static_cast<std::uint64_t>(gathers), "plan: gathers per step"));
      else  // stages 1-2 and stage 3's persistent units: the updated parameter slices to every rank
        detail::plan_count(r.step_comm, comm::collective::all_gather, unit_params, ranks);
    }
    r.units.push_back(std::move(up));
  }
  // The norm's partial sums meet in one all-reduce where states are sharded (stage 0 adds them locally),
  // with the optimizer's fingerprint (engine/agreement.hpp: 8 doubles). Where the step has no such
  // collective, the fingerprint has an all-reduce of its own at N > 1, its wire outside memory().
  const std::uint64_t fingerprint = detail::fingerprint_words * sizeof(double);
  if (norm && shards_states && repro) {
    // The squares' summary and the optimizer's hash, then four words, of every rank, all-gathered
    // (engine: binned_global_sum_of_squares).
    const auto n = static_cast<std::uint64_t>(ranks);
    r.norm_bytes = 4 * sizeof(std::int64_t) * n;
    detail::plan_count(r.control_comm, comm::collective::all_gather, 2 * sizeof(std::int64_t) * n, ranks);
    detail::plan_count(r.control_comm, comm::collective::all_gather, r.norm_bytes, ranks);
  } else if (norm && shards_states) {
    r.norm_bytes = sizeof(double) + fingerprint;
    detail::plan_count(r.control_comm, comm::collective::all_reduce, r.norm_bytes, ranks);
  } else if (ranks > 1) {
    detail::plan_count(r.control_comm, comm::collective::all_reduce, fingerprint, ranks);
  }
  // The totals the report and zero_plan add up, checked once here so that none of them wraps.
  const auto sum = [](std::uint64_t a, std::uint64_t b) { return add_or_fail(a, b, "plan: total bytes"); };
  for (std::uint64_t b = 0; const auto bytes_of : r.step_comm.bytes) b = sum(b, bytes_of);
  const std::uint64_t states = sum(sum(sum(r.model_states.params, r.model_states.grads),
                                       sum(r.model_states.master, r.model_states.optimizer_states)),
                                   r.model_states.offload);
  r.step_transient_peak = std::max(sum(r.shared_bucket_bytes, backward_peak), r.norm_bytes);
  r.peak_bytes = sum(states, r.step_transient_peak);
  sum(states, r.consolidation_bytes);  // zero_plan's peak of full_params()
  r.init_broadcast_bytes = std::min<std::uint64_t>(options.init_chunk_elements, largest_tensor) * sizeof(float);
  return r;
}

// The same for an engine's policy types: plan_for<stage2, optim::adamw, precision::bf16>(spec, N).
template <class P, OptimizerState Opt, PrecisionPolicy Prec>
plan_report plan_for(const model_spec& spec, int ranks, const engine_options& options = {}) {
  return plan(spec, ranks, P::stage, plan_precision::of<Prec>(), plan_optimizer::of<Opt>(), options);
}

}  // namespace zero
