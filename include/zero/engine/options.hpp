// engine_options: clipping, norm, accumulation, loss-scale, initialization and memory settings of an engine.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "zero/engine/zeropp.hpp"
#include "zero/offload/options.hpp"
#include "zero/precision/loss_scaler.hpp"

namespace zero {

// How M micro-batches per step are accumulated.
enum class accumulation {
  // reduce(u) after every micro-batch; the reduced result is added into the rank's gradient shard.
  // Works in every stage; sends M times the gradient traffic.
  reduce_each_micro_batch,
  // Kernels accumulate into grads(u) over the micro-batches and reduce(u) is called once. Needs the
  // full gradient kept between micro-batches, so stages 0 and 1 only.
  local_then_reduce,
};

// A parameter group's hyper-parameters: the tensors the model spec puts in group `name`
// (unit_builder::group) take them in place of the optimizer's. Every other tensor takes the
// optimizer's own.
struct param_group {
  std::string name{};
  // Multiplies the optimizer's lr for the group's tensors, whatever sets it (set_learning_rate and a
  // schedule too): the group's lr is lr x lr_scale, one fp32 multiplication. >= 0 and finite; an
  // optimizer without an lr takes 1 only.
  float lr_scale = 1.0f;
  // Replaces the optimizer's weight_decay for the group's tensors (>= 0 and finite), e.g. 0 for
  // biases, norm gains and embeddings; none: the optimizer's. Refused for an optimizer without one.
  std::optional<float> weight_decay{};
  // For an optimizer with a matrix rule (optim::muon): the group's tensors take its element-wise rule
  // (AdamW), whatever their shape, as a recipe keeps embeddings and the output head. Refused for an
  // optimizer without one.
  bool element_wise = false;
};

struct engine_options {
  float clip_norm = 0.0f;          // clip the global gradient L2 norm to this value; 0: no clipping
  bool compute_grad_norm = false;  // compute the norm even without clipping (always done for bf16/fp16)
  int micro_batches = 1;           // M: reduce(u) calls per unit per step under reduce_each_micro_batch
  accumulation accumulate = accumulation::reduce_each_micro_batch;
  bool fp32_grad_accumulation = false;  // stages 2-3: the gradient shard is fp32 (+2 Psi/N bytes for 2-byte grads)
  loss_scale_options loss_scale{};      // used when the precision policy scales the loss
  // initialize(init_range_fn): the most elements one call of the init function fills, which bounds
  // the host staging (4 bytes plus one parameter per element, plus a broadcast buffer of the chunk).
  std::size_t init_chunk_elements = std::size_t{1} << 22;
  // The most bytes this rank's engine may hold in its system's memory; 0: no limit. The model states
  // are checked before anything is allocated (a refusal names each category and the stages that would
  // fit); transient buffers are checked when they are allocated.
  std::size_t memory_limit_bytes = 0;
  // initialize(..., init_source::every_rank): where more than one rank produced a value (every tensor
  // of the whole-tensor form; stage 0 of the range form), compare a hash of each tensor across ranks
  // and throw on every rank, naming the first tensor that differs. Costs one run_hash64 pass (core/hash.hpp) over
  // the values each rank produced (measured: docs/design.md, Initialization) and one all-gather of 16
  // bytes per tensor per rank (comm().other); false skips both, for an init function known to agree.
  bool verify_init = true;

  // Overlap of communication with computation, where the backend has nonblocking collectives
  // (comm/nonblocking.hpp; e.g. comm::modeled). The results are the same bits either way; on a
  // backend without them these settings change nothing (each collective completes in its call).
  //   reduce(u) returns with its collective in flight; step() and the limit below wait for it.
  //   Stage 3: gather(u) starts the next units' all-gathers in the order the previous step gathered
  //   them (prefetch). Stages 1-2: step() all-gathers a unit's parameters while it updates the next.
  bool overlap = true;
  // Stage 3: gathers started ahead of the unit being gathered, at most; 0 turns prefetch off.
  int prefetch_units = 2;
  // Stage 3: the most parameter elements gathered or prefetched at once (a prefetch that would pass
  // it waits until units are released); 0: bounded by prefetch_units only.
  std::size_t max_live_parameters = 0;
  // reduce(u) collectives in flight at once, at most (each holds its unit's gradient bucket in
  // stages 2-3 or with several micro-batches): the oldest is completed when one more starts.
  int reduces_in_flight = 4;
  // Stages 2-3 (and stage 1 with several reduced micro-batches): consecutive reduce(u) calls share
  // one reduce-scatter until their padded elements reach this many (fewer, larger collectives: one
  // latency instead of one per small unit; each gradient is copied once into the shared bucket, and
  // the bucket starts when full or at step()). Independent of `overlap`; the same bits. 0: every
  // unit is reduced on its own.
  std::size_t reduce_bucket_elements = 0;
  // Stage 3 (CB for the gathers): a gather that starts an all-gather, on demand or as a prefetch,
  // takes the units the last step's order gathers next into the same collective while their padded
  // elements reach at most this many (engine/schedule.hpp): one latency instead of one per small unit,
  // the same bytes and bits. The others wait gathered for their gather(u) (under max_live_parameters
  // and the memory budget); each rank's shards are copied into a wire of the bucket's elements and
  // out of it into each unit's buffer. From the second step (the first records the order). Not
  // combined with qwZ or hpZ. 0: every unit is gathered on its own; other stages: no effect.
  std::size_t gather_bucket_elements = 0;
  // Stage 3: units of at most this many (unpadded) elements keep their gathered parameters between
  // steps, as stages 1-2 keep all of them: gather(u) is a view, and step() all-gathers their updated
  // shards once (started as each unit is updated, in flight until its next gather). Small units cost
  // a latency per gather but few bytes, so this trades p x Psi_p bytes of memory for 2M fewer
  // gathers of them per step (zero::formula, "persistent"). The same bits. 0: none; other stages:
  // no effect (their parameters are whole already).
  std::size_t persist_below_elements = 0;

  // Master weights and optimizer slots in host memory or on disk instead of the system's memory
  // (ZeRO-Offload / ZeRO-Infinity): the same bits, memory() counts only what stays in the system,
  // offload() reports the tier's bytes and what moves per step.
  offload_options offload{};

  // ZeRO++: quantized gathers (qwZ) and reductions (qgZ), a secondary partition within nodes (hpZ),
  // and the nodes that decide what counts as inter-node traffic (engine/zeropp.hpp). Off by default.
  zeropp_options zeropp{};

  // Replicated shard groups (HSDP; engine/replica_groups.hpp, docs/parallelism.md): ZeRO within groups
  // of this many consecutive data-parallel ranks (a node's, say), the groups replicas of each other.
  // A rank holds 1/S of what its stage partitions; after the in-group reduce-scatter, each reduced
  // slice is all-reduced across the N / S groups, and the step averages over all N ranks. Needs a
  // backend with split(); not combined with ZeRO++ or a tensor-parallel mesh. 0 (or N): plain ZeRO
  // over all N ranks.
  int shard_group_size = 0;

  // The same bits at any world size (docs/reproducibility.md): gradients are reduced as exact binned
  // integer sums (three int64 words per element, core/binned.hpp) and rounded once to fp32 at step(),
  // and the gradient norm is exact before one rounding, so a fixed global batch of fixed-size
  // micro-batches trains to identical parameters whatever N and the micro-batches per rank M, in every
  // stage. The step averages over the N x M micro-batches (the kernels must not divide by M), the norm is
  // always computed (a non-finite gradient skips the step), and every micro-batch is reduced on its own.
  // Costs 24 bytes per gradient element on the wire and 28 per element the rank updates
  // (formula::reproducible_*). Host systems only for now.
  bool reproducible = false;

  // Threads of this rank's host update (zero/core/thread_pool.hpp): the optimizer's pass over the
  // rank's slice, in memory or offloaded to host memory, cut into contiguous ranges that the calling
  // thread and host_threads - 1 helpers of the rank's own pool update at once. The same bits at any
  // count (each element's update is the same operations), so the ranks need not agree on it. A run
  // uses ranks x host_threads threads in the update: with comm::threads give each rank cores / ranks;
  // under MPI, the cores of its slot. A device system's own update is its kernels'; there this
  // threads only an offloaded update. 1 to 1024.
  int host_threads = 1;

  // Hyper-parameter overrides per parameter group (param_group). Each name must be one the model spec
  // gives some tensor, and appear once; the ranks must agree (the settings check compares them).
  // Empty: every tensor takes the optimizer's hyper-parameters.
  std::vector<param_group> param_groups{};
};

}  // namespace zero
