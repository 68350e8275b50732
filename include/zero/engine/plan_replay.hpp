// plan_replay: the engine's schedule replayed allocation by allocation, for plan(): transient peaks and traffic per step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "zero/comm/counted.hpp"
#include "zero/core/checked.hpp"
#include "zero/core/formulas.hpp"
#include "zero/core/link_formulas.hpp"
#include "zero/engine/options.hpp"

namespace zero {

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
    bool repro_values = false;           // its reduces exchange values (formula::reproducible_exchanges_values)
    bool release_before_reduce = false;  // the backward pass's order (plan(): release_order)
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
    int reduces = 0, pending = 0;                     // its reduces started this step, and those in flight
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
    const bool first = s_.release_before_reduce;
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

  // The bucket a reduce sends: a lone unit's own, or a fused bucket's units gathered into one (their
  // buckets freed).
  std::uint64_t sent_bucket(const std::vector<std::size_t>& parts, std::uint64_t shard_sum) {
    if (parts.size() == 1) return std::exchange(live_[parts[0]].bucket, 0);
    const std::uint64_t bucket = shard_sum * static_cast<std::uint64_t>(s_.ranks) * s_.grad_bytes;
    make_room(bucket);
    alloc(bucket);
    for (std::size_t u : parts) release(live_[u].bucket);
    return bucket;
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
    for (std::size_t u : parts) {
      ++live_[u].reduces;
      ++live_[u].pending;
    }
    if (s_.repro) {
      // One summary per unit and rank, all-gathered; then the words (three planes of the shards).
      std::uint64_t summaries = parts.size() * n * formula::reproducible_summary_bytes;
      make_room(summaries);
      alloc(summaries);
      count(comm::collective::all_gather, summaries, s_.ranks, s_.node_size);
      release(summaries);
      if (s_.repro_values) {  // the bucket sent, the values received
        f.bucket = sent_bucket(parts, shard_sum);
        f.wire = shard_sum * n * s_.grad_bytes;
        make_room(f.wire);
        alloc(f.wire);
        count(comm::collective::all_to_all, f.wire, s_.ranks, s_.node_size);
        return f;
      }
      f.wire = shard_sum * n * formula::reproducible_wire_bytes;
      make_room(f.wire);
      alloc(f.wire);
      for (std::size_t u : parts) release(live_[u].bucket);
      count(s_.stage == 0 ? comm::collective::all_reduce : comm::collective::reduce_scatter, f.wire, s_.ranks,
            s_.node_size);
      return f;
    }
    f.bucket = sent_bucket(parts, shard_sum);
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
    for (std::size_t u : f.units) {
      unit_state& t = live_[u];
      --t.pending;
      // Stage 0 exchanging values: at a unit's last reduce, its rounded fp32 gradient all-gathered in place.
      if (s_.repro_values && s_.stage == 0 && t.pending == 0 && t.reduces == o_.micro_batches)
        count(comm::collective::all_gather, units_[u].padded * formula::reproducible_gathered_bytes, s_.ranks,
              s_.node_size);
    }
  }

  // step(): every reduce completed, the prefetches dropped, the norm's buffer, the parameters' all-gathers.
  void step() {
    flush();
    while (!pending_.empty()) complete_oldest();
    for (unit_state& t : live_) t.reduces = 0;
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

}  // namespace zero
