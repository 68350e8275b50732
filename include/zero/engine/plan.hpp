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
#include "zero/core/link_formulas.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/activation_plan.hpp"
#include "zero/engine/agreement.hpp"
#include "zero/engine/matrix_owners.hpp"
#include "zero/engine/memory_check.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/plan_replay.hpp"
#include "zero/engine/tensor_sums.hpp"
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

// What plan() needs of an optimizer: its fp32 slots per parameter, a tensor-wise optimizer's sums per
// tensor (0 for the other kinds), and whether it has a matrix rule (its exchange of whole matrices).
struct plan_optimizer {
  std::string_view name = "adamw";
  int slots = 2;
  int tensor_sums = 0;
  bool matrix_rule = false;

  template <Optimizer O>
  static constexpr plan_optimizer of() {
    if constexpr (TensorwiseOptimizer<O>)
      return {O::name, O::slots, O::tensor_sums};
    else
      return {O::name, O::slots, 0, MatrixOptimizer<O>};
  }
};

// Where the backward pass releases each unit's gathered parameters: after its reduce(u) (gather, grads,
// reduce, release: docs/tutorial.md's loop) or before it (gather, grads, release, reduce: examples/
// train_loop.cpp's). The orders differ where reduce(u) allocates (the reproducible mode's words, qgZ's
// wires, a fused bucket) while stage 3 holds the unit gathered: released first, the unit's buffer is
// freed before them, and the transient peak can be one gathered unit lower.
enum class release_order { after_reduce, before_reduce };

inline constexpr const char* to_string(release_order o) {
  return o == release_order::after_reduce ? "after-reduce" : "before-reduce";
}

// One unit's transient buffers (bytes), for loops other than the one plan() assumes.
struct unit_plan {
  std::string name;
  std::size_t numel = 0, padded = 0, shard = 0;  // elements, as zero::layout places them
  int gathers = 1;                               // unit_spec::gathers: times gathered per pass
  bool persistent = false;                       // stage 3: kept gathered (engine_options::persist_below_elements)
  std::uint64_t gathered_bytes = 0;              // stage 3: gather(u)'s all-gathered parameters, padded
  std::uint64_t bucket_bytes = 0;                // grads(u)'s transient bucket, padded, where one is used
  std::uint64_t wire_bytes = 0;                  // reproducible: reduce(u)'s binned words, 24 per padded element
  std::uint64_t gather_wire_bytes = 0;           // qwZ: a primary gather's N quantized shards, beside the unit
  std::uint64_t reduce_wire_bytes = 0;           // qgZ: reduce(u)'s N slices sent and N received, beside its bucket
  std::uint64_t consolidation_bytes = 0;         // full_params(u) in stages 1-3: the unit's padded fp32 gather
};

// An engine's memory per rank and traffic per step. Exact for the engine as built (a test holds every
// field equal to what the engine then measures, with and without overlap, with ZeRO++), for the loop
// of the protocol: in each micro-batch every unit is gathered and released in a forward pass, then
// gathered again, given its gradients and reduced in a backward pass in reverse order, released after
// or before its reduce as plan()'s release_order says; every step() updates (no step skipped for
// non-finite gradients). Without overlap at most one unit is gathered at a time and grads(u) follows
// gather(u); with overlap on a backend that overlaps (plan()'s `overlapping`), stage 3 also holds the
// prefetched units and every stage the reduces left in flight with their buckets and wires, as the
// engine decides them from the calls alone. A shared
// unit (unit_spec::gathers > 1) is used once more per extra gather at the end of the forward pass and
// at the start of the backward pass (the tied embedding's pattern: the output layer last forward,
// first backward), and reduced once, at its place in the backward pass: its gradient bucket is taken
// at its first grads() and held to its reduce(), so it adds to every other unit's gathered parameters
// and bucket. The peaks come from replaying the engine's schedule over this loop (two steps: the first
// has no prefetch order yet), in time proportional to micro_batches x units.
struct plan_report {
  int stage = 0, ranks = 1;           // ranks: what ZeRO partitions over (N, or engine_options::shard_group_size)
  int replicas = 1;                   // the shard groups that replicate each other (N / shard_group_size)
  bool overlapping = false;           // options.overlap on a backend that overlaps: collectives left in flight
  release_order order = release_order::after_reduce;  // the backward pass's loop, as planned
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
  std::uint64_t bucket_bytes = 0;  // the largest unit's gradient bucket (stages 2-3, or M > 1 reduced micro-batches)
  std::uint64_t shared_bucket_bytes = 0;  // the buckets of the shared units, held through the backward pass
  std::uint64_t gathered_bytes = 0;       // the largest unit gathered (stage 3)
  std::uint64_t wire_bytes = 0;  // reproducible: the largest unit's binned words, beside its bucket in reduce(u)
  // step()'s buffer of the norm's collective (stages 1-3, when a norm is computed): one double and the
  // optimizer's fingerprint (8 doubles), or in the reproducible mode the all-gathered words of every
  // rank (8 x 4 x N bytes); twice the sums for a rank's pieces of a tensor-parallel mesh (the split and
  // the replicated tensors' apart), whose engine computes the norm at every step
  std::uint64_t norm_bytes = 0;
  // step()'s buffer of a tensor-wise optimizer's sums (stages 1-3 at N > 1, where a shard boundary cuts
  // a tensor): its all-reduce's doubles (engine/tensor_sums.hpp: tensor_sums::shape::exchange_doubles)
  std::uint64_t tensor_sums_bytes = 0;
  // step()'s buffers of a matrix optimizer (engine/matrix_owners.hpp): the staged values of the matrices'
  // held elements (the largest rank's), and the largest unit's exchange (where the states are sharded,
  // the all_to_alls' send and receive blocks and the owner's matrices; else the owners' blocks; 0 at
  // N = 1)
  std::uint64_t matrix_staged_bytes = 0;
  std::uint64_t matrix_exchange_bytes = 0;
  // = memory().peak_bytes(transient) after steps of the loop above: under options.memory_limit_bytes
  // where set (with overlap the engine then completes reduces and drops prefetches to make room).
  std::uint64_t step_transient_peak = 0;
  std::uint64_t peak_bytes = 0;            // model states + step_transient_peak: = memory().peak_total
  std::uint64_t consolidation_bytes = 0;   // full_params() in stages 1-3: the largest unit in fp32
  // An asynchronous checkpoint's snapshot (checkpoint::async_saver), held from its save() until its
  // writer is joined (and by default kept for the next save): the largest rank's data file, the master weights and
  // every slot (fp32) of its canonical slice of each unit. mem_category::snapshot on a CPU system (in
  // memory_limit_bytes, not in peak_bytes); pinned host memory beside a device's budget.
  std::uint64_t checkpoint_snapshot_bytes = 0;
  // A peer snapshot (checkpoint::take_peer_snapshot), held until the next one completes: the rank's own
  // data file and its ring predecessor's, the largest such pair (mem_category::snapshot, as above; twice
  // this while a take runs, the previous snapshot still held). Each take sends the own file once:
  // peer_snapshot_wire_bytes, the largest rank's (0 at N = 1).
  std::uint64_t peer_snapshot_bytes = 0;
  std::uint64_t peer_snapshot_wire_bytes = 0;
  std::uint64_t init_broadcast_bytes = 0;  // initialize(range fn, broadcast_from_rank0): its one chunk buffer

  // Bytes (nccl-tests bus volume) and calls per step, by collective: = comm().last_step.
  comm::comm_stats step_comm;
  // The step's control collectives, per step: the gradient norm's all-reduce with the optimizer's
  // fingerprint (stages 1-3 with a norm), else at N > 1 the fingerprint's own all-reduce; a tensor-wise
  // optimizer's sums and a matrix optimizer's exchange. comm().control counts since construction: after
  // k steps that updated it is k times this.
  comm::comm_stats control_comm;

  std::uint64_t step_bytes_sent() const { return step_comm.total_bytes(); }
  // Whether every byte the engine holds during training fits `memory_bytes` per rank: the check
  // engine_options::memory_limit_bytes makes before each allocation passes throughout. With overlap,
  // a smaller limit may still train (overlap gives back what it holds): plan with memory_limit_bytes
  // set to it and ask fits() of that plan.
  bool fits(std::uint64_t memory_bytes) const { return peak_bytes <= memory_bytes; }
};


// The memory and traffic of engine<stage, *, optimizer, precision> on `ranks` ranks for `spec` with
// `options`, from the layout and the formulas alone: nothing is allocated. `overlapping`: whether the
// engine's backend overlaps (comm::counted<Comm>::overlaps(): comm::mpi, comm::modeled, any backend with
// the nonblocking interface of comm/nonblocking.hpp); with options.overlap on such a backend, reduces
// stay in flight with their buckets, stage 3 prefetches, and the transient peak grows accordingly
// (plan_for<Stage, Comm, Opt, Prec> reads it from the backend type). `order`: where the loop's backward
// pass releases each unit, after its reduce (the default) or before it. Throws zero::error
// (invalid_argument) for what the engine's constructor would refuse.
inline plan_report plan(const model_spec& spec, int world, int stage, plan_precision precision,
                        plan_optimizer optimizer, const engine_options& options = {}, bool overlapping = false,
                        release_order order = release_order::after_reduce) {
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "plan: no ZeRO stage ", stage, " (0-3)");
  ZERO_CHECK(world > 0, invalid_argument, "plan: world size must be positive, got ", world);
  // Replicated shard groups: ZeRO over S ranks, padded as at N, and the replicas' traffic on top.
  ZERO_CHECK(options.shard_group_size >= 0 && options.shard_group_size <= world &&
                 (options.shard_group_size == 0 || world % options.shard_group_size == 0),
             invalid_argument, "plan: shard_group_size ", options.shard_group_size, " does not divide the ", world,
             " data-parallel ranks (0: all of them)");
  const int ranks = options.shard_group_size == 0 ? world : options.shard_group_size;
  const int replicas = world / ranks;
  ZERO_CHECK(optimizer.slots >= 0, invalid_argument, "plan: optimizer '", optimizer.name, "' has ", optimizer.slots,
             " slots");
  ZERO_CHECK(options.micro_batches >= 1, invalid_argument, "plan: micro_batches must be >= 1, got ",
             options.micro_batches);
  ZERO_CHECK(options.prefetch_units >= 0, invalid_argument, "plan: prefetch_units must be >= 0, got ",
             options.prefetch_units);
  ZERO_CHECK(options.reduces_in_flight >= 1, invalid_argument, "plan: reduces_in_flight must be >= 1, got ",
             options.reduces_in_flight);
  const bool shards_states = stage >= 1, shards_grads = stage >= 2, shards_params = stage == 3;
  ZERO_CHECK(options.accumulate != accumulation::local_then_reduce || !shards_grads, invalid_argument,
             "plan: local_then_reduce accumulation needs full gradients; stage ", stage, " shards them");
  ZERO_CHECK(!options.fp32_grad_accumulation || shards_grads, invalid_argument,
             "plan: fp32_grad_accumulation applies to stages 2 and 3, not stage ", stage);
  const bool repro = options.reproducible;
  // Its reduces exchange the gradient values where they can (every backend of the library has all_to_all).
  const bool values = repro && formula::reproducible_exchanges_values(stage, ranks, replicas, true);
  ZERO_CHECK(!repro || (options.accumulate == accumulation::reduce_each_micro_batch && !options.fp32_grad_accumulation),
             invalid_argument,
             "plan: reproducible reduces every micro-batch on its own, without fp32_grad_accumulation");
  ZERO_CHECK(
      !repro || static_cast<std::uint64_t>(ranks) * static_cast<std::uint64_t>(options.micro_batches) <= (1u << 24),
      invalid_argument, "plan: reproducible averages over N x micro_batches, at most 2^24");
  // ZeRO++: the engine's refusals (its check_zeropp, the qgZ reducer's accept, its option checks).
  const zeropp_options& z = options.zeropp;
  const bool zeropp = z.qwz || z.qgz || z.hpz;
  ZERO_CHECK(z.node_size >= 0 && (z.node_size == 0 || ranks % z.node_size == 0), invalid_argument,
             "plan: zeropp.node_size ", z.node_size, " does not divide the world size ", ranks,
             " (a node holds node_size consecutive ranks; 0: one node holds them all)");
  ZERO_CHECK(!z.qwz || shards_params, invalid_argument,
             "plan: qwZ quantizes the parameter all-gathers of stage 3; ZeRO stage ", stage, " gathers no parameters");
  ZERO_CHECK(!z.hpz || shards_params, invalid_argument,
             "plan: hpZ keeps a secondary partition of stage 3's sharded parameters; ZeRO stage ", stage,
             " does not shard them");
  ZERO_CHECK(!z.qgz || shards_states, invalid_argument,
             "plan: qgZ replaces the gradient reduce-scatter of stages 1-3; ZeRO stage ", stage,
             " all-reduces every gradient");
  ZERO_CHECK(!z.qgz_error_feedback || z.qgz, invalid_argument,
             "plan: qgz_error_feedback compensates qgZ's quantization: it needs qgz");
  ZERO_CHECK(!z.hpz || (z.node_size > 0 && z.node_size < ranks), invalid_argument,
             "plan: hpZ needs nodes smaller than the world (node_size in [1, N) dividing N = ", ranks,
             "), got node_size ", z.node_size);
  if (z.qwz) quant::validate(z.weights, "plan: zeropp.weights");
  if (z.qgz) quant::validate(z.gradients, "plan: zeropp.gradients");
  ZERO_CHECK(options.persist_below_elements == 0 || !zeropp, invalid_argument,
             "plan: persist_below_elements and ZeRO++ (zeropp.qwz, qgz, hpz) cannot be combined");
  ZERO_CHECK(options.gather_bucket_elements == 0 || !(options.zeropp.qwz || options.zeropp.hpz), invalid_argument,
             "plan: gather_bucket_elements and ZeRO++'s gathers (zeropp.qwz, hpz) cannot be combined");
  ZERO_CHECK(!repro || !zeropp, invalid_argument,
             "plan: reproducible and ZeRO++ (zeropp.qwz, qgz, hpz) cannot be combined");
  const int node_size = z.node_size == 0 ? ranks : z.node_size;

  ZERO_CHECK(optimizer.tensor_sums == 0 || spec.tensor_parallel_parts() == 1, invalid_argument,
             "plan: optim::", optimizer.name,
             " needs each tensor's norms, which the engine does not combine over a tensor-parallel group yet");
  ZERO_CHECK(!optimizer.matrix_rule || spec.tensor_parallel_parts() == 1, invalid_argument,
             "plan: optim::", optimizer.name,
             " needs each weight matrix whole, which the engine does not gather over a "
             "tensor-parallel group yet");
  ZERO_CHECK(optimizer.tensor_sums >= 0 && optimizer.tensor_sums <= 4, invalid_argument, "plan: optimizer '",
             optimizer.name, "' has ", optimizer.tensor_sums, " sums per tensor (0 to 4)");
  ZERO_CHECK(options.offload.tier == offload_tier::none ||
                 (options.offload.slice_elements > 0 && options.offload.slice_elements % 1024 == 0),
             invalid_argument, "plan: offload.slice_elements must be a positive multiple of 1024 (4 KiB of fp32), got ",
             options.offload.slice_elements);

  // The layout alone decides how units split, the same for every stage, so one layout serves them all.
  const layout l = layout::make(spec, ranks, world);
  plan_report r;
  r.stage = stage;
  r.ranks = ranks;
  r.replicas = replicas;
  r.numel = l.numel();
  r.padded = l.padded();
  r.overlapping = overlapping && options.overlap;
  r.order = order;

  const std::uint64_t full = l.padded(), shard = l.shard_total();
  // Stage 3's persistent units keep a whole copy of their parameters (parameter_placement, engine/parameters.hpp).
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
  if (z.hpz)  // the secondary partition within the node
    r.model_states.params += formula::hpz_secondary_bytes(full, ranks, node_size, precision.param_bytes);
  r.model_states.grads = bytes(grads_sharded ? shard : full, stored_grad_bytes);
  if (z.qgz && z.qgz_error_feedback)  // the error feedback's fp32 error of every padded element
    r.model_states.grads += formula::qgz_error_state_bytes(full);
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
  // are sharded or several reduced micro-batches must be added up (the reducers' uses_bucket).
  const int reduces = options.accumulate == accumulation::reduce_each_micro_batch ? options.micro_batches : 1;
  const bool bucket = repro || shards_grads || reduces > 1;
  // An engine in a tensor-parallel mesh (spec is a rank's pieces) computes the norm at every step, and
  // its data-parallel collective carries the split and the replicated tensors' sums apart
  // (engine/tensor_parallel.hpp); the exchange over the tensor-parallel group is outside memory().
  const bool mesh = spec.tensor_parallel_parts() > 1;
  const bool norm = precision.separate_master || options.clip_norm > 0.0f || options.compute_grad_norm || repro || mesh;
  const std::uint64_t sums = mesh ? 2 : 1;
  std::size_t largest_tensor = 0;
  std::vector<detail::loop_replay::unit> replay_units;
  for (std::size_t u = 0; u < l.num_units(); ++u) {
    const unit_layout& ul = l.unit(unit_id{u});
    const int gathers = spec.units()[u].gathers;
    unit_plan up{spec.units()[u].name, ul.numel, ul.padded, ul.shard, gathers, persists(ul)};
    up.gathered_bytes = shards_params && !up.persistent ? bytes(ul.padded, precision.param_bytes) : 0;
    up.bucket_bytes = bucket ? bytes(ul.padded, precision.grad_bytes) : 0;
    // Reproducible: reduce(u) converts the bucket into words (both held at once), then frees the bucket;
    // where it exchanges values, it receives every rank's values of its slice beside the bucket.
    up.wire_bytes = repro ? ul.padded * (values ? precision.grad_bytes : formula::reproducible_wire_bytes) : 0;
    up.gather_wire_bytes = z.qwz ? formula::qwz_gather_wire_bytes(ul.shard, ranks, z.weights) : 0;
    up.reduce_wire_bytes =
        z.qgz ? formula::qgz_exchange_bytes(formula::qgz_slice_wire_bytes({ul.shard}, z.gradients), ranks) : 0;
    up.consolidation_bytes = shards_states ? ul.padded * sizeof(float) : 0;
    r.gathered_bytes = std::max(r.gathered_bytes, up.gathered_bytes);
    r.bucket_bytes = std::max(r.bucket_bytes, up.bucket_bytes);
    r.wire_bytes = std::max(r.wire_bytes, up.wire_bytes);
    r.consolidation_bytes = std::max(r.consolidation_bytes, up.consolidation_bytes);
    if (gathers > 1) r.shared_bucket_bytes += up.bucket_bytes;
    for (const auto& t : spec.units()[u].tensors) largest_tensor = std::max(largest_tensor, t.numel);
    replay_units.push_back({ul.padded, ul.shard, gathers, up.persistent});
    r.units.push_back(std::move(up));
  }
  // The norm's partial sums meet in one all-reduce where states are sharded (stage 0 adds them locally),
  // with the optimizer's fingerprint (engine/agreement.hpp: 8 doubles). Where the step has no such
  // collective, the fingerprint has an all-reduce of its own at N > 1, its wire outside memory().
  const std::uint64_t fingerprint = detail::fingerprint_words * sizeof(double);
  if (norm && shards_states && repro) {
    // The squares' summary and the optimizer's hash, then four words, of every rank, all-gathered
    // (the binned reducer's sum_of_squares, engine/reduce/binned.hpp).
    const auto n = static_cast<std::uint64_t>(ranks);
    r.norm_bytes = sums * 4 * sizeof(std::int64_t) * n;
    detail::plan_count(r.control_comm, comm::collective::all_gather, 2 * sizeof(std::int64_t) * n, ranks, 1, node_size);
    detail::plan_count(r.control_comm, comm::collective::all_gather, r.norm_bytes, ranks, 1, node_size);
  } else if (norm && shards_states) {
    r.norm_bytes = sums * sizeof(double) + fingerprint;
    detail::plan_count(r.control_comm, comm::collective::all_reduce, r.norm_bytes, ranks, 1, node_size);
  } else if (ranks > 1 && replicas == 1) {
    detail::plan_count(r.control_comm, comm::collective::all_reduce, fingerprint, ranks, 1, node_size);
  }
  // A tensor-wise optimizer's sums (engine/tensor_sums.hpp) where a shard boundary cuts a tensor: one
  // all-reduce of doubles, every leaf's sums and the cut leaves' and blocks' entries.
  if (optimizer.tensor_sums > 0 && shards_states && ranks > 1) {
    r.tensor_sums_bytes =
        tensor_sums::shape_of(l, shards_states).exchange_doubles(optimizer.tensor_sums) * sizeof(double);
    if (r.tensor_sums_bytes > 0)
      detail::plan_count(r.control_comm, comm::collective::all_reduce, r.tensor_sums_bytes, ranks, 1, node_size);
  }
  // A matrix optimizer's exchange (engine/matrix_owners.hpp): per unit with matrices at N > 1, each
  // matrix to its owner and back (two all_to_alls) where the states are sharded, or the owners' results
  // all-gathered (stage 0). The plan assumes a backend with all_to_all, as every backend of the library.
  if (optimizer.matrix_rule) {
    const matrix_owners owners(spec, l, [&](std::size_t u, std::size_t t) {
      const std::string& group = spec.units()[u].tensors[t].group;
      for (const param_group& g : options.param_groups)
        if (g.name == group && g.element_wise) return false;
      return true;
    });
    r.matrix_staged_bytes = owners.staged_elements(l, shards_states) * sizeof(float);
    r.matrix_exchange_bytes = owners.exchange_buffer_bytes(l, shards_states, true);
    owners.for_each_collective(l, shards_states, true, [&](comm::collective c, std::uint64_t buffer) {
      detail::plan_count(r.control_comm, c, buffer, ranks, 1, node_size);
    });
  }
  // An asynchronous checkpoint's snapshot: the largest data file of the (first) shard group's ranks; a
  // peer snapshot's: the largest file with its ring predecessor's.
  std::vector<std::uint64_t> file_bytes(static_cast<std::size_t>(ranks));
  for (int q = 0; q < ranks; ++q) {
    std::uint64_t elements = 0;
    for (std::size_t u = 0; u < spec.num_units(); ++u) elements += l.owned_real(unit_id{u}, q).size();
    file_bytes[static_cast<std::size_t>(q)] = elements * (1 + static_cast<std::uint64_t>(optimizer.slots)) * sizeof(float);
    r.checkpoint_snapshot_bytes = std::max(r.checkpoint_snapshot_bytes, file_bytes[static_cast<std::size_t>(q)]);
  }
  for (int q = 0; q < ranks && ranks > 1; ++q) {
    const std::uint64_t own = file_bytes[static_cast<std::size_t>(q)];
    r.peer_snapshot_bytes = std::max(r.peer_snapshot_bytes, own + file_bytes[static_cast<std::size_t>((q + ranks - 1) % ranks)]);
    r.peer_snapshot_wire_bytes = std::max(r.peer_snapshot_wire_bytes, own);
  }
  if (ranks == 1) r.peer_snapshot_bytes = r.checkpoint_snapshot_bytes;
  // Replicas: the fingerprint's own all-reduce over every data-parallel rank, at each step.
  if (replicas > 1) detail::plan_count(r.control_comm, comm::collective::all_reduce, fingerprint, world, 1, world);
  // The totals the report and zero_plan add up, checked once here so that none of them wraps.
  const auto sum = [](std::uint64_t a, std::uint64_t b) { return add_or_fail(a, b, "plan: total bytes"); };
  const std::uint64_t states = sum(sum(sum(r.model_states.params, r.model_states.grads),
                                       sum(r.model_states.master, r.model_states.optimizer_states)),
                                   r.model_states.offload);
  // The loop replayed: two steps (the first has no prefetch order yet; every later one is the second's).
  detail::loop_replay::setup setup;
  setup.stage = stage;
  setup.ranks = ranks;
  setup.node_size = node_size;
  setup.param_bytes = precision.param_bytes;
  setup.grad_bytes = precision.grad_bytes;
  setup.overlapping = r.overlapping;
  setup.repro = repro;
  setup.repro_values = values;
  setup.uses_bucket = bucket;
  setup.release_before_reduce = order == release_order::before_reduce;
  setup.model_states = states;
  setup.norm_bytes = r.norm_bytes;
  setup.tensor_sums_bytes = r.tensor_sums_bytes;
  setup.matrix_staged_bytes = r.matrix_staged_bytes;
  setup.matrix_exchange_bytes = r.matrix_exchange_bytes;
  setup.options = &options;
  detail::loop_replay replay(setup, std::move(replay_units));
  r.step_transient_peak = replay.run(2);
  r.step_comm = replay.last_step();
  if (replicas > 1) {
    // Each reduce's collective in the group is followed by an all-reduce of the rank's reduced part
    // across the groups (and in the reproducible mode an all-gather of its units' summaries before):
    // as many calls, formula::replica_comm_bytes_per_step's bytes, all of them between groups.
    using comm::collective;
    const auto i = static_cast<std::size_t>(stage == 0 ? collective::all_reduce : collective::reduce_scatter);
    const std::uint64_t calls = r.step_comm.calls[i];
    const std::uint64_t grads = formula::replica_comm_bytes_per_step(
        stage, l.padded(), ranks, replicas, repro ? formula::reproducible_wire_bytes : precision.grad_bytes, reduces);
    const auto add_to = [&](collective c, std::uint64_t b, std::uint64_t n) {
      const auto k = static_cast<std::size_t>(c);
      r.step_comm.bytes[k] = sum(r.step_comm.bytes[k], b);
      r.step_comm.inter[k] = sum(r.step_comm.inter[k], b);
      r.step_comm.calls[k] += n;
    };
    add_to(collective::all_reduce, grads, calls);
    if (repro)
      add_to(collective::all_gather,
             formula::replica_comm_bytes_per_step(stage, l.padded(), ranks, replicas, 0, reduces, l.num_units()),
             calls);
  }
  for (std::uint64_t b = 0; const auto bytes_of : r.step_comm.bytes) b = sum(b, bytes_of);
  r.peak_bytes = sum(states, r.step_transient_peak);
  sum(states, r.consolidation_bytes);  // zero_plan's peak of full_params()
  r.init_broadcast_bytes = std::min<std::uint64_t>(options.init_chunk_elements, largest_tensor) * sizeof(float);
  return r;
}

// The same for an engine's policy types: plan_for<stage2, optim::adamw, precision::bf16>(spec, N).
// On a backend that does not overlap (comm::threads): every collective completes in its call.
template <class P, Optimizer Opt, PrecisionPolicy Prec>
plan_report plan_for(const model_spec& spec, int ranks, const engine_options& options = {},
                     release_order order = release_order::after_reduce) {
  return plan(spec, ranks, P::stage, plan_precision::of<Prec>(), plan_optimizer::of<Opt>(), options, false, order);
}
// The same for engine<P, Comm, Opt, Prec>: whether it overlaps is the backend type's
// (comm::counted<Comm>::can_overlap). A backend that decides at run time (comm::any_backend) is
// refused: pass its overlaps() to plan().
template <class P, class Comm, Optimizer Opt, PrecisionPolicy Prec>
plan_report plan_for(const model_spec& spec, int ranks, const engine_options& options = {},
                     release_order order = release_order::after_reduce) {
  static_assert(!comm::overlap_decided_at_run_time<Comm>,
                "zero::plan_for: this backend decides at run time whether it overlaps (comm::any_backend): call "
                "zero::plan(..., options, backend.overlaps())");
  return plan(spec, ranks, P::stage, plan_precision::of<Prec>(), plan_optimizer::of<Opt>(), options,
              comm::counted<Comm>::can_overlap, order);
}

}  // namespace zero
