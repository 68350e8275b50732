// Where one rank's parameters live: its shard or the whole model, stage 3's persistent units, hpZ's secondary
// partition.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "zero/concepts/partitioner.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/gather_transports.hpp"

namespace zero {

// The parameters in the system's memory and how a unit's whole parameters are assembled:
//   the rank's own part   every unit whole (stages 0-2) or the rank's shard of each (stage 3)
//   persistent units      stage 3's units of at most persist_below_elements, kept whole between steps
//   the secondary shard   hpZ: each unit partitioned among the node's ranks (Psi / node_size)
// A gather (stage 3) travels by one transport (gather_transports.hpp): the exact shards, qwZ's codes,
// or the secondary partition; the whole units of stages 1-2 and the persistent units are refreshed
// by an all-gather of the updated shard after each update, load or initialization by slices.
template <class Ctx>
class parameter_placement {
 public:
  using P = typename Ctx::partitioner;
  using system = typename Ctx::system;
  using param_type = typename Ctx::param_type;
  using request = typename Ctx::request;
  using link = typename Ctx::link;
  using wire_buffer = buffer<std::uint8_t, system>;
  static constexpr std::size_t not_persistent = static_cast<std::size_t>(-1);

  // Decides which units persist (nothing is allocated yet: the engine checks the memory first).
  explicit parameter_placement(Ctx& c) : ctx_(c), secondary_ready_(c.spec.num_units(), false) {
    persistent_at_.assign(c.spec.num_units(), not_persistent);
    if constexpr (P::shards_parameters) {  // (constexpr: elsewhere nvcc warns of an unreachable loop)
      if (c.options.persist_below_elements == 0) return;
      for (std::size_t u = 0; u < persistent_at_.size(); ++u) {
        const unit_layout& ul = c.layout.unit(unit_id{u});
        if (ul.numel > c.options.persist_below_elements) continue;
        persistent_at_[u] = persistent_elems_;
        persistent_elems_ += ul.padded;
      }
    }
  }
  parameter_placement(const parameter_placement&) = delete;
  parameter_placement& operator=(const parameter_placement&) = delete;

  // The elements it will hold: the rank's part, the persistent units, the secondary shard.
  std::size_t own_elements() const { return P::shards_parameters ? ctx_.layout.shard_total() : ctx_.layout.padded(); }
  std::size_t elements() const { return own_elements() + persistent_elems_ + secondary_elements(); }
  void allocate() {
    params_ = buffer<param_type, system>(own_elements(), mem_category::params, ctx_.acct);
    if (persistent_elems_ > 0)
      persistent_ = buffer<param_type, system>(persistent_elems_, mem_category::params, ctx_.acct);
    if (ctx_.options.zeropp.hpz)
      secondary_ = buffer<param_type, system>(secondary_elements(), mem_category::params, ctx_.acct);
  }

  // Visits every buffer allocate() made, in one order (engine::release_memory parks them).
  template <class F>
  void for_each_buffer(F&& f) {
    f(params_);
    f(persistent_);
    f(secondary_);
  }

  // Stage 3: whether unit u keeps its gathered parameters between steps, and Psi_p of the formulas.
  bool persistent(unit_id u) const { return persistent_at_[u.index] != not_persistent; }
  std::uint64_t persistent_elements() const { return persistent_elems_; }
  std::size_t secondary_elements() const {
    return ctx_.options.zeropp.hpz ? ctx_.layout.padded() / static_cast<std::size_t>(ctx_.node_size()) : 0;
  }

  // Unit-local element i of the rank's own part (one it holds).
  param_type* element(const unit_layout& ul, std::size_t i) const {
    return params_.data() + element_index(ul, i, P::shards_parameters, ctx_.rank);
  }
  const param_type* shard_of(unit_id u) const {
    const unit_layout& ul = ctx_.layout.unit(u);
    return params_.data() + element_index(ul, ctx_.layout.owned(u, ctx_.rank).begin, true, ctx_.rank);
  }
  // Where a unit kept whole lives: in the rank's part (stages 0-2) or its persistent copy (stage 3).
  param_type* whole(unit_id u) const {
    if constexpr (P::shards_parameters)
      return persistent_.data() + persistent_at_[u.index];
    else
      return params_.data() + ctx_.layout.unit(u).offset;
  }

  // Whether unit u's parameters are held whole on every rank and so must be all-gathered after each
  // update: every unit in stages 1-2 (in place), the persistent units in stage 3 (into their copy).
  bool keeps_whole(unit_id u) const {
    if constexpr (gathers_parameters_after_update<P>)
      return true;
    else
      return P::shards_parameters && persistent(u);
  }
  // The all-gather of unit u's parameter shard into its whole copy, on `via`.
  request start_whole_gather(link& via, unit_id u) {
    const unit_layout& ul = ctx_.layout.unit(u);
    if constexpr (P::shards_parameters)
      return via.start_all_gather(shard_of(u), whole(u), ul.shard);
    else
      return via.start_all_gather(
          params_.data() + element_index(ul, static_cast<std::size_t>(ctx_.rank) * ul.shard, false, ctx_.rank),
          params_.data() + ul.offset, ul.shard);
  }
  // The same all-gathers, completed at once, after an initialization or a load wrote only this rank's
  // slices (counted on `via`, the set-up counter): every unit in stages 1-2, the persistent units in
  // stage 3, nothing elsewhere.
  void refresh_whole(link& via, const char* phase) {
    for (std::size_t u = 0; u < persistent_at_.size(); ++u) {
      if (!keeps_whole(unit_id{u})) continue;
      const auto l = ctx_.label(phase, unit_id{u});
      auto r = start_whole_gather(via, unit_id{u});
      via.wait(r);
    }
  }

  // Stores initial values of the unit-local elements r (values[i] is element r.begin + i) into what
  // this rank holds of them: its part and, in stage 3, a persistent unit's whole copy.
  void store_initial(unit_id u, range r, const float* values) {
    const unit_layout& ul = ctx_.layout.unit(u);
    const range seg = P::shards_parameters ? intersect(r, ctx_.layout.owned(u, ctx_.rank)) : r;
    if (!seg.empty()) put(element(ul, seg.begin), values + (seg.begin - r.begin), seg.size());
    if constexpr (P::shards_parameters) {
      // A persistent unit's whole copy takes every value given; a rank given only its own slice (the
      // range form) gathers the rest afterwards (refresh_whole).
      if (persistent(u) && !r.empty()) put(whole(u) + r.begin, values, r.size());
    }
  }

  // ---- stage 3's gathers ----

  // Transient bytes a gather of unit ul holds until it completes: the unit and its transport's wire.
  std::size_t gather_bytes(const unit_layout& ul, bool from_secondary) const {
    const std::size_t wire =
        ctx_.options.zeropp.qwz && !from_secondary ? gather::quantized<Ctx>::wire_bytes(ctx_, ul) : 0;
    return ul.padded * sizeof(param_type) + wire;
  }
  // Starts the all-gather of unit u into `full` (padded elements) on `via`, by the transport the
  // options and the call choose: hpZ's secondary partition for a unit already gathered in the step
  // (`from_secondary`), else qwZ's codes or the exact shards.
  request start_gather(link& via, unit_id u, param_type* full, wire_buffer& wire, bool from_secondary) {
    if (from_secondary) {
      const param_type* part =
          secondary_.data() + ctx_.layout.unit(u).offset / static_cast<std::size_t>(ctx_.node_size());
      return gather::secondary<Ctx>::start(ctx_, via, u, part, full, wire);
    }
    if (ctx_.options.zeropp.qwz) return gather::quantized<Ctx>::start(ctx_, via, u, shard_of(u), full, wire);
    return gather::exact<Ctx>::start(ctx_, via, u, shard_of(u), full, wire);
  }
  // Completes start_gather; with `fill` (a gather in a step) and hpZ, keeps this rank's part of the
  // node's partition as its secondary shard.
  void finish_gather(link& via, request& r, unit_id u, param_type* full, wire_buffer& wire, bool from_secondary,
                     bool fill) {
    if (from_secondary) return gather::secondary<Ctx>::finish(ctx_, via, r, u, full, wire);
    if (ctx_.options.zeropp.qwz)
      gather::quantized<Ctx>::finish(ctx_, via, r, u, full, wire);
    else
      gather::exact<Ctx>::finish(ctx_, via, r, u, full, wire);
    if (fill && ctx_.options.zeropp.hpz) {
      const unit_layout& ul = ctx_.layout.unit(u);
      const auto g = static_cast<std::size_t>(ctx_.node_size());
      const std::size_t part = ul.padded / g, local = static_cast<std::size_t>(ctx_.rank) % g;
      ctx_.sys.copy(secondary_.data() + ul.offset / g, full + local * part, part * sizeof(param_type));
      secondary_ready_[u.index] = true;
    }
  }
  // hpZ: whether this step's first gather of u has filled its secondary shard; stale after an update.
  bool secondary_ready(unit_id u) const { return secondary_ready_[u.index]; }
  void secondary_stale() { secondary_ready_.assign(secondary_ready_.size(), false); }

 private:
  // values (fp32) into n parameters of the system's memory, cast on the host.
  void put(param_type* dst, const float* src, std::size_t n) {
    if constexpr (std::same_as<param_type, float>) {
      ctx_.sys.copy_from_host(dst, src, n * sizeof(param_type));
    } else {
      std::vector<param_type> cast(n);
      for (std::size_t i = 0; i < n; ++i) cast[i] = static_cast<param_type>(src[i]);
      ctx_.sys.copy_from_host(dst, cast.data(), n * sizeof(param_type));
    }
  }

  Ctx& ctx_;
  buffer<param_type, system> params_;       // the rank's part
  buffer<param_type, system> persistent_;   // stage 3's persistent units, whole
  std::vector<std::size_t> persistent_at_;  // where each unit's copy starts in persistent_ (not_persistent: gathered)
  std::uint64_t persistent_elems_ = 0;
  buffer<param_type, system> secondary_;  // hpZ: the parameters partitioned within the node (Psi / node_size)
  std::vector<bool> secondary_ready_;
};

}  // namespace zero
