// plan: an engine's memory per rank (by category, with its transient peaks) and traffic per step, before anything runs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
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
#include "zero/engine/activation_store.hpp"
#include "zero/engine/agreement.hpp"
#include "zero/engine/matrix_owners.hpp"
#include "zero/engine/memory_check.hpp"
#include "zero/engine/options.hpp"
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

namespace detail {

// Counts one collective as comm::counted does (bus bytes, the inter-node part, one call), checked:
// a shape or micro_batches from a model file must not wrap the bytes per step.
inline void plan_count(comm::comm_stats& s, comm::collective c, std::uint64_t buffer_bytes, int ranks,
                       std::uint64_t times = 1, int node_size = 0) {
  const auto n = static_cast<std::uint64_t>(ranks);
  const auto g = static_cast<std::uint64_t>(node_size == 0 ? ranks : node_size);
  std::uint64_t bytes = 0, inter = 0;
  if (n > 1) {
    const std::uint64_t factor = c == comm::collective::all_reduce ? 2 : 1;
    bytes = mul_or_fail(factor * (n - 1), buffer_bytes, "plan: bytes") / n;
    if (g < n) inter = mul_or_fail(factor * (n - g), buffer_bytes, "plan: bytes") / n;
  }
  const auto i = static_cast<std::size_t>(c);
  s.bytes[i] = add_or_fail(s.bytes[i], mul_or_fail(times, bytes, "plan: bytes per step"), "plan: bytes per step");
  s.inter[i] = add_or_fail(s.inter[i], mul_or_fail(times, inter, "plan: bytes per step"), "plan: bytes per step");
  s.calls[i] += times;
}

// The engine's schedule replayed over the plan's loop, allocation by allocation: what each call of
// the protocol allocates and frees (gathers, prefetches, gradient buckets, the reduces in flight and
// their wires, the norm's buffer), with the decisions the engine makes from the calls alone (the
// prefetch order, reduces_in_flight, max_live_parameters, and memory_limit_bytes's make_room), and
// the protocol's collectives as comm::counted counts them. Nothing here depends on timing: the
// engine decides from the calls, never from whether a collective has completed.
class loop_replay {
 public:
  struct unit {
    std::uint64_t padded = 0, shard = 0;
    int gathers = 1;
    bool persistent = false;
  };
  struct setup {
    int stage = 0, ranks = 1, node_size = 1;  // node_size: G (N where one node)
    std::size_t param_bytes = 4, grad_bytes = 4;
    bool overlapping = false, repro = false, uses_bucket = false;
    release_order order = release_order::after_reduce;
    std::uint64_t model_states = 0;  // what the account holds besides transients (memory_limit_bytes counts it)
    std::uint64_t norm_bytes = 0;
    std::uint64_t tensor_sums_bytes = 0;  // a tensor-wise optimizer's larger wire (its words), after the norm's
    std::uint64_t matrix_staged_bytes = 0, matrix_exchange_bytes = 0;  // a matrix optimizer's, after those
    const engine_options* options = nullptr;
  };

  loop_replay(setup s, std::vector<unit> units)
      : s_(s), o_(*s.options), units_(std::move(units)), live_(units_.size()) {}

  // Replays `steps` steps of the loop; returns the transient peak; last_step() is the last one's traffic.
  std::uint64_t run(int steps) {
    const int m = o_.micro_batches;
    const bool once = o_.accumulate == accumulation::local_then_reduce;
    const std::size_t n = units_.size();
    for (int t = 0; t < steps; ++t) {
      step_comm_ = {};
      for (int k = 0; k < m; ++k) {
        for (std::size_t u = 0; u < n; ++u) use(u, false, false);
        for (std::size_t u = 0; u < n; ++u)  // a shared unit's further uses: the output layer of a tied embedding
          for (int g = 1; g < units_[u].gathers; ++g) use(u, false, false);
        for (std::size_t u = n; u-- > 0;)  // backward: those uses first, their gradients held in the bucket
          for (int g = 1; g < units_[u].gathers; ++g) use(u, true, false);
        for (std::size_t u = n; u-- > 0;) use(u, true, !once || k + 1 == m);
      }
      step();
    }
    return peak_;
  }
  const comm::comm_stats& last_step() const { return step_comm_; }

 private:
  struct in_flight {
    std::vector<std::size_t> units;
    std::uint64_t bucket = 0, wire = 0;  // held until it completes
    std::uint64_t slice_elements = 0, slice_wire = 0;
    std::uint64_t reserve = 0;  // what completing it allocates beyond them, kept free while in flight
  };
  struct unit_state {
    bool gathered = false, prefetching = false, secondary_ready = false;
    std::uint64_t held = 0;                           // the gathered unit's buffer
    std::uint64_t prefetched = 0, prefetch_wire = 0;  // a prefetch's buffer and qwZ wire
    std::size_t gather_bucket = no_bucket;            // the gather bucket it arrives in (gather_wires_)
    std::uint64_t bucket = 0;                         // grads(u)'s bucket until reduce(u)
  };
  static constexpr std::size_t no_bucket = static_cast<std::size_t>(-1);

  bool qgz() const { return o_.zeropp.qgz; }
  bool hierarchical() const { return qgz() && s_.node_size > 1 && s_.node_size < s_.ranks; }
  std::uint64_t nodes() const { return static_cast<std::uint64_t>(s_.ranks / s_.node_size); }
  bool sharded_params(std::size_t u) const { return s_.stage == 3 && !units_[u].persistent; }
  bool prefetching() const { return s_.stage == 3 && s_.overlapping && o_.prefetch_units > 0 && order_holds_; }
  bool bucketing() const { return s_.stage == 3 && o_.gather_bucket_elements > 0; }

  void alloc(std::uint64_t b) {
    cur_ = add_or_fail(cur_, b, "plan: transient bytes");
    peak_ = std::max(peak_, cur_);
  }
  void release(std::uint64_t& b) {
    cur_ -= b;
    b = 0;
  }
  std::uint64_t total() const { return s_.model_states + cur_; }
  // engine::has_room, negated: beside the reserves of the reduces in flight.
  bool over(std::uint64_t b) const {
    return o_.memory_limit_bytes > 0 && total() + reserved_ + b > o_.memory_limit_bytes;
  }
  void count(comm::collective c, std::uint64_t buffer, int ranks, int node_size = 0) {
    plan_count(step_comm_, c, buffer, ranks, 1, node_size);
  }

  // engine::make_room: completes reduces in flight, oldest first, then drops the prefetches.
  void make_room(std::uint64_t b) {
    if (o_.memory_limit_bytes == 0) return;
    while (!pending_.empty() && over(b)) complete_oldest();
    if (over(b)) {
      bool any = false;
      for (const auto& t : live_) any = any || t.prefetching;
      if (any) {
        drop_prefetches();
        order_holds_ = false;
      }
    }
  }

  // A gather, grads and reduce (or a gather alone) of unit u, and its release before or after the reduce.
  void use(std::size_t u, bool backward, bool reduces) {
    gather(u);
    if (backward) open(u);
    const bool first = s_.order == release_order::before_reduce;
    if (first) release_unit(u);
    if (backward && reduces) reduce(u);
    if (!first) release_unit(u);
  }
  void release_unit(std::size_t u) {
    unit_state& t = live_[u];
    t.gathered = false;
    release(t.held);
  }

  std::uint64_t gather_bytes(std::size_t u, bool secondary) const {
    const unit& ul = units_[u];
    const std::uint64_t wire =
        o_.zeropp.qwz && !secondary ? formula::qwz_gather_wire_bytes(ul.shard, s_.ranks, o_.zeropp.weights) : 0;
    return ul.padded * s_.param_bytes + wire;
  }
  // Starts a gather of u into a buffer of its own; returns its wire (qwZ), held until it completes.
  std::uint64_t start_gather(std::size_t u, bool secondary, std::uint64_t& buffer) {
    const unit& ul = units_[u];
    buffer = ul.padded * s_.param_bytes;
    alloc(buffer);
    if (secondary) {
      count(comm::collective::all_gather, buffer, s_.node_size);  // the node's link: one node
      return 0;
    }
    if (!o_.zeropp.qwz) {
      count(comm::collective::all_gather, buffer, s_.ranks, s_.node_size);
      return 0;
    }
    const std::uint64_t wire = formula::qwz_gather_wire_bytes(ul.shard, s_.ranks, o_.zeropp.weights);
    alloc(wire);
    count(comm::collective::all_gather, wire, s_.ranks, s_.node_size);
    return wire;
  }

  // engine::gather_in_step, stage 3's gathered units only (elsewhere a gather is a view).
  void gather(std::size_t u) {
    unit_state& t = live_[u];
    if (!sharded_params(u)) {
      t.gathered = true;
      return;
    }
    const std::size_t position = step_order_.size();
    if (order_holds_ && (position >= gather_order_.size() || gather_order_[position] != u)) {
      order_holds_ = false;
      drop_prefetches();
    }
    const bool secondary = o_.zeropp.hpz && t.secondary_ready;
    std::uint64_t wire = 0;
    if (t.prefetching) {
      if (t.gather_bucket != no_bucket) release(gather_wires_[t.gather_bucket]);  // copied out, freed
      t.gather_bucket = no_bucket;
      t.held = t.prefetched;
      wire = t.prefetch_wire;
      t.prefetched = t.prefetch_wire = 0;
      t.prefetching = false;
    } else {
      make_room(gather_bytes(u, secondary));
      if (bucketing() && order_holds_) {  // (no qwZ, no hpZ: the exact shards on the data-parallel link)
        t.held = units_[u].padded * s_.param_bytes;
        alloc(t.held);
        const auto others = bucket_after(position, units_[u].padded, t.held);
        if (others.empty())
          count(comm::collective::all_gather, t.held, s_.ranks, s_.node_size);
        else
          release(gather_wires_[start_bucket(units_[u].padded, others)]);  // taken now: copied out, freed
      } else {
        wire = start_gather(u, secondary, t.held);
      }
    }
    step_order_.push_back(u);
    if (order_holds_ && next_prefetch_ <= position) next_prefetch_ = position + 1;
    t.gathered = true;
    if (prefetching()) prefetch_ahead();
    release(wire);  // finish_gather: dequantized, the wire freed
    if (o_.zeropp.hpz) t.secondary_ready = true;
    if (o_.zeropp.hpz && prefetching()) prefetch_ahead();
  }

  // engine::prefetch_ahead.
  void prefetch_ahead() {
    if (step_order_.empty()) return;
    const std::size_t last = step_order_.size() - 1;
    const std::size_t end = std::min(gather_order_.size(), last + 1 + static_cast<std::size_t>(o_.prefetch_units));
    while (next_prefetch_ < end) {
      const std::size_t v = gather_order_[next_prefetch_];
      unit_state& t = live_[v];
      if (t.prefetching) return;
      const bool secondary = o_.zeropp.hpz && first_position_[v] < next_prefetch_;
      if (secondary && !t.secondary_ready) return;
      if (o_.max_live_parameters > 0 && live_parameters() + units_[v].padded > o_.max_live_parameters) return;
      if (over(gather_bytes(v, secondary))) return;
      const auto others = bucketing() ? bucket_after(next_prefetch_, units_[v].padded, 0) : std::vector<std::size_t>{};
      if (others.empty()) {
        t.prefetch_wire = start_gather(v, secondary, t.prefetched);
      } else {
        t.prefetched = units_[v].padded * s_.param_bytes;
        alloc(t.prefetched);
        t.gather_bucket = start_bucket(units_[v].padded, others);
      }
      t.prefetching = true;
      next_prefetch_ += 1 + others.size();
    }
  }
  // engine's gather_schedule::bucket_after: the units a gather bucket at `position` takes besides its first.
  std::vector<std::size_t> bucket_after(std::size_t position, std::uint64_t first_padded, std::uint64_t credit) const {
    std::vector<std::size_t> others;
    const std::uint64_t live = live_parameters() + first_padded;
    std::uint64_t elements = first_padded, added = 0;
    for (std::size_t p = position + 1; p < gather_order_.size(); ++p) {
      const std::size_t v = gather_order_[p];
      const std::uint64_t padded = units_[v].padded;
      if (v == gather_order_[position] || std::find(others.begin(), others.end(), v) != others.end()) break;
      if (live_[v].gathered || live_[v].prefetching) break;
      if (elements + padded > o_.gather_bucket_elements) break;
      if (o_.max_live_parameters > 0 && live + added + padded > o_.max_live_parameters) break;
      if (over(2 * (elements + padded) * s_.param_bytes - credit)) break;
      others.push_back(v);
      elements += padded;
      added += padded;
    }
    return others;
  }
  // engine's gather_schedule::start_bucket, after the first unit's buffer: the others' buffers (each
  // then prefetched) and the wire of every member, one all-gather; returns the wire's index.
  std::size_t start_bucket(std::uint64_t first_padded, const std::vector<std::size_t>& others) {
    std::uint64_t elements = first_padded;
    for (std::size_t v : others) {
      unit_state& t = live_[v];
      t.prefetched = units_[v].padded * s_.param_bytes;
      alloc(t.prefetched);
      elements += units_[v].padded;
    }
    const std::uint64_t wire = elements * s_.param_bytes;
    alloc(wire);
    count(comm::collective::all_gather, wire, s_.ranks, s_.node_size);
    gather_wires_.push_back(wire);
    for (std::size_t v : others) {
      live_[v].gather_bucket = gather_wires_.size() - 1;
      live_[v].prefetching = true;
    }
    return gather_wires_.size() - 1;
  }
  std::uint64_t live_parameters() const {
    std::uint64_t n = 0;
    for (std::size_t u = 0; u < units_.size(); ++u)
      if (!units_[u].persistent)
        n += (std::uint64_t{live_[u].gathered} + std::uint64_t{live_[u].prefetching}) * units_[u].padded;
    return n;
  }
  void drop_prefetches() {
    for (auto& t : live_)
      if (t.prefetching) {
        release(t.prefetched);
        release(t.prefetch_wire);
        if (t.gather_bucket != no_bucket) release(gather_wires_[t.gather_bucket]);  // (once: then 0)
        t.gather_bucket = no_bucket;
        t.prefetching = false;
      }
  }

  // The reducer's open(u): the unit's bucket, zero, where the method writes one.
  void open(std::size_t u) {
    unit_state& t = live_[u];
    if (!s_.uses_bucket || t.bucket != 0) return;
    const std::uint64_t b = units_[u].padded * s_.grad_bytes;
    make_room(b);
    t.bucket = b;
    alloc(b);
  }
  // The reducer's reduce(u): fused into an open bucket of reduce_bucket_elements, or started alone.
  void reduce(std::size_t u) {
    open(u);
    const bool fuses = o_.reduce_bucket_elements > 0 && s_.uses_bucket && s_.stage >= 1;
    if (!fuses) {
      launched(start({u}));
      return;
    }
    const std::uint64_t padded = units_[u].padded;
    if (!fusing_.empty() && fusing_elements_ + padded > o_.reduce_bucket_elements) flush();
    fusing_elements_ += padded;
    fusing_.push_back(u);
    if (fusing_elements_ >= o_.reduce_bucket_elements) flush();
  }
  void flush() {
    std::vector<std::size_t> parts = std::move(fusing_);
    fusing_.clear();
    fusing_elements_ = 0;
    if (!parts.empty()) launched(start(parts));
  }
  void launched(in_flight f) {
    reserved_ += f.reserve;
    pending_.push_back(std::move(f));
    const std::size_t limit = s_.overlapping ? static_cast<std::size_t>(o_.reduces_in_flight) : 0;
    while (pending_.size() > limit) complete_oldest();
  }

  // The method's start: the binned words, or a summing reduce over the exact or quantized wire.
  in_flight start(const std::vector<std::size_t>& parts) {
    const auto n = static_cast<std::uint64_t>(s_.ranks);
    in_flight f;
    f.units = parts;
    std::uint64_t shard_sum = 0;
    std::vector<std::uint64_t> shards;
    for (std::size_t u : parts) {
      shard_sum += units_[u].shard;
      shards.push_back(units_[u].shard);
    }
    if (s_.repro) {
      // One summary per unit and rank, all-gathered; then the words (three planes of the shards).
      std::uint64_t summaries = parts.size() * n * formula::reproducible_summary_bytes;
      make_room(summaries);
      alloc(summaries);
      count(comm::collective::all_gather, summaries, s_.ranks, s_.node_size);
      release(summaries);
      f.wire = shard_sum * n * formula::reproducible_wire_bytes;
      make_room(f.wire);
      alloc(f.wire);
      for (std::size_t u : parts) release(live_[u].bucket);
      count(s_.stage == 0 ? comm::collective::all_reduce : comm::collective::reduce_scatter, f.wire, s_.ranks,
            s_.node_size);
      return f;
    }
    if (parts.size() == 1) {
      f.bucket = live_[parts[0]].bucket;
      live_[parts[0]].bucket = 0;
    } else {
      f.bucket = shard_sum * n * s_.grad_bytes;
      make_room(f.bucket);
      alloc(f.bucket);
      for (std::size_t u : parts) release(live_[u].bucket);
    }
    if (s_.stage == 0) {
      count(comm::collective::all_reduce, units_[parts[0]].padded * s_.grad_bytes, s_.ranks, s_.node_size);
      return f;
    }
    if (!qgz()) {
      count(comm::collective::reduce_scatter, shard_sum * n * s_.grad_bytes, s_.ranks, s_.node_size);
      return f;
    }
    f.slice_elements = shard_sum;
    f.slice_wire = formula::qgz_slice_wire_bytes(shards, o_.zeropp.gradients);
    f.wire = formula::qgz_exchange_bytes(f.slice_wire, s_.ranks);
    if (hierarchical()) f.reserve = formula::qgz_completion_bytes(shard_sum, f.slice_wire, s_.ranks, nodes());
    make_room(f.wire + f.reserve);
    alloc(f.wire);
    if (hierarchical())  // the first hop, on the node's link (one node)
      count(comm::collective::all_to_all, f.slice_wire * n, s_.node_size);
    else
      count(comm::collective::all_to_all, f.slice_wire * n, s_.ranks, s_.node_size);
    if (o_.zeropp.qgz_error_feedback) {  // the codes sent, dequantized slice by slice
      std::uint64_t sent = formula::qgz_feedback_transient_bytes(shard_sum);
      make_room(sent);
      alloc(sent);
      release(sent);
    }
    return f;
  }

  // The oldest reduce in flight completed: qgZ's second hop, then its wires and bucket freed.
  void complete_oldest() {
    in_flight f = std::move(pending_.front());
    pending_.pop_front();
    reserved_ -= f.reserve;
    if (hierarchical() && !s_.repro) {
      const std::uint64_t k = nodes();
      std::uint64_t partial = formula::qgz_node_sums_bytes(f.slice_elements, k);
      alloc(partial);
      release(f.wire);
      std::uint64_t send = k * f.slice_wire;
      alloc(send);
      release(partial);
      std::uint64_t recv = k * f.slice_wire;
      alloc(recv);
      count(comm::collective::all_to_all, k * f.slice_wire, static_cast<int>(k), 1);  // across nodes: all of it
      release(send);
      release(recv);
    }
    release(f.wire);
    release(f.bucket);
  }

  // step(): every reduce completed, the prefetches dropped, the norm's buffer, the parameters' all-gathers.
  void step() {
    flush();
    while (!pending_.empty()) complete_oldest();
    drop_prefetches();
    gather_order_ = std::move(step_order_);
    step_order_.clear();
    first_position_.assign(units_.size(), gather_order_.size());
    for (std::size_t i = gather_order_.size(); i-- > 0;) first_position_[gather_order_[i]] = i;
    next_prefetch_ = 0;
    order_holds_ = true;
    for (std::uint64_t b : {s_.norm_bytes, s_.tensor_sums_bytes}) {
      if (b == 0) continue;
      alloc(b);
      release(b);
    }
    // A matrix optimizer's staged values, held over its exchanges, one unit's at a time.
    if (std::uint64_t staged = s_.matrix_staged_bytes, exchange = s_.matrix_exchange_bytes; staged + exchange > 0) {
      alloc(staged);
      alloc(exchange);
      release(exchange);
      release(staged);
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
      live_[u].secondary_ready = false;
      // Stages 1-2, and stage 3's persistent units: the updated slices to every rank, in place.
      if ((s_.stage == 1 || s_.stage == 2) || (s_.stage == 3 && units_[u].persistent))
        count(comm::collective::all_gather, units_[u].padded * s_.param_bytes, s_.ranks, s_.node_size);
    }
  }

  setup s_;
  const engine_options& o_;
  std::vector<unit> units_;
  std::vector<unit_state> live_;
  std::uint64_t cur_ = 0, peak_ = 0;
  comm::comm_stats step_comm_;
  std::deque<in_flight> pending_;
  std::uint64_t reserved_ = 0;  // the reserves of pending_
  std::vector<std::size_t> fusing_;
  std::uint64_t fusing_elements_ = 0;
  std::vector<std::size_t> gather_order_, step_order_, first_position_;
  std::vector<std::uint64_t> gather_wires_;  // each gather bucket's wire, 0 once copied out or dropped
  std::size_t next_prefetch_ = 0;
  bool order_holds_ = true;
};

}  // namespace detail

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
  ZERO_CHECK(replicas == 1 || !zeropp, invalid_argument,
             "plan: shard_group_size and ZeRO++ (zeropp.qwz, qgz, hpz) cannot be combined yet");
  ZERO_CHECK(replicas == 1 || spec.tensor_parallel_parts() == 1, invalid_argument,
             "plan: shard_group_size inside a tensor-parallel mesh is not supported yet");

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
    // Reproducible: reduce(u) converts the bucket into words (both held at once), then frees the bucket.
    up.wire_bytes = repro ? ul.padded * formula::reproducible_wire_bytes : 0;
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
  setup.uses_bucket = bucket;
  setup.order = order;
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

// The activation checkpoints of an activation_store on one rank, planned: L layers, each a checkpoint
// of E elements of b bytes, on a tensor-parallel group of tp ranks, for the loop of activation
// checkpointing: save every layer in the forward pass, then in the backward pass restore, recompute and
// release one layer at a time (in any order). With `prefetch_next` the backward pass prefetches the next
// layer's checkpoint once it has restored this one (restore(l), prefetch(l - 1), recompute, release(l)),
// so that its transfer overlaps the recomputation: two restored checkpoints are then held at once.
// Every field equals what the store then measures.
struct activation_plan {
  activation_mode mode = activation_mode::none;
  int tp = 1;
  std::uint64_t layers = 0, elements = 0;
  std::size_t element_bytes = 2;
  std::uint64_t kept_elements = 0;  // per checkpoint and rank: E (none) or ceil(E / tp)
  // Held once the forward pass is done: = memory().peak_saved and memory().peak_host.
  std::uint64_t saved_bytes = 0;        // in the system's memory (none: L E b; Pa: L ceil(E/tp) b; Pa+cpu: 0)
  std::uint64_t host_bytes = 0;         // in host memory (Pa+cpu: L ceil(E/tp) b)
  bool prefetch_next = false;
  std::uint64_t restore_bytes = 0;        // one restored checkpoint, padded (Pa, Pa+cpu)
  std::uint64_t peak_restored_bytes = 0;  // one restore, or two with prefetch_next: = memory().peak_restored
  std::uint64_t peak_system_bytes = 0;    // saved + peak_restored, at the first restore: = memory().peak_system
  // Per backward pass: the restores' all-gathers (bus bytes and calls, = traffic().gather), and the
  // Pa+cpu copies to host memory (forward) and back (backward).
  comm::comm_stats gather;
  std::uint64_t to_host_bytes = 0, from_host_bytes = 0;
};

inline activation_plan plan_activations(std::uint64_t layers, std::uint64_t elements, std::size_t element_bytes, int tp,
                                        activation_mode mode, bool prefetch_next = false) {
  ZERO_CHECK(tp >= 1, invalid_argument, "plan_activations: a tensor-parallel group of ", tp, " ranks");
  ZERO_CHECK(elements >= 1 && element_bytes >= 1, invalid_argument, "plan_activations: checkpoints of ", elements,
             " elements of ", element_bytes, " bytes");
  const bool partitioned = mode != activation_mode::none, host = mode == activation_mode::partitioned_cpu;
  activation_plan p;
  p.mode = mode;
  p.tp = tp;
  p.layers = layers;
  p.elements = elements;
  p.element_bytes = element_bytes;
  p.prefetch_next = prefetch_next;
  p.kept_elements = partitioned ? formula::activation_slice_elements(elements, tp) : elements;
  const formula::activation_bytes held =
      formula::activation_checkpoint_bytes(layers, elements, element_bytes, tp, partitioned, host);
  p.saved_bytes = held.system;
  p.host_bytes = held.host;
  p.restore_bytes = layers > 0 ? formula::activation_restore_bytes(elements, element_bytes, tp, partitioned) : 0;
  p.peak_restored_bytes = prefetch_next && layers > 1
                              ? add_or_fail(p.restore_bytes, p.restore_bytes, "plan_activations: bytes")
                              : p.restore_bytes;
  p.peak_system_bytes = add_or_fail(p.saved_bytes, p.peak_restored_bytes, "plan_activations: bytes");
  if (partitioned && layers > 0) {
    detail::plan_count(p.gather, comm::collective::all_gather, p.restore_bytes, tp, layers);
    if (host) p.to_host_bytes = p.from_host_bytes = held.host;
  }
  return p;
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
