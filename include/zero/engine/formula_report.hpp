// The engine's formulas: what the paper's equations (and ZeRO++'s, the reproducible mode's, the offload tier's) give
// for one engine.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "zero/core/checked.hpp"
#include "zero/core/formulas.hpp"
#include "zero/core/link_formulas.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/memory_check.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/reduce/catalog.hpp"
#include "zero/engine/sweep.hpp"
#include "zero/offload/state_store.hpp"

namespace zero {

// Reads the policies, the layout, the options and what the parts decided (persistent units, the
// chosen reducer's store, the offload tier) and evaluates core/formulas.hpp and core/link_formulas.hpp
// for them: the engine's reports (model_state_formula_bytes, comm_formula_bytes, ...) are these, and
// its memory check asks the same for every stage.
template <class Ctx, class Opt>
class formula_report {
  using P = typename Ctx::partitioner;
  using Prec = typename Ctx::precision;
  using param_type = typename Ctx::param_type;
  static constexpr int state_arrays = optimizer_sweep<Ctx, Opt>::state_arrays;

 public:
  formula_report(const Ctx& c, const parameter_placement<Ctx>& placement, const optimizer_sweep<Ctx, Opt>& sweep)
      : ctx_(c), placement_(placement), sweep_(sweep) {}

  // What the engine's constructor is about to allocate, from each part's own statement of its bytes
  // (the memory check's input, before anything is allocated): the placement's parameters, the chosen
  // reducer's store and extra state, and the sweep's master weights and slots where they are in the
  // system's memory (an offload tier's are not; what the tier holds in host memory is, where host
  // memory is the system's: offload::state_store::counted_host_bytes).
  model_state_plan allocation() const {
    const std::size_t full = ctx_.layout.padded(), shard = ctx_.layout.shard_total();
    const std::size_t grad_elems = reduce::chosen_store_sharded<Ctx>(ctx_.options) ? shard : full;
    const std::size_t in_system = ctx_.options.offload.tier == offload_tier::none ? sweep_.elements() : 0;
    return {placement_.elements() * sizeof(param_type),
            grad_elems * reduce::chosen_grad_bytes<Ctx>(ctx_.options) +
                reduce::chosen_extra_state_bytes<Ctx>(ctx_.options, full),
            Prec::separate_master ? in_system * sizeof(float) : 0,
            static_cast<std::size_t>(Opt::slots) * in_system * sizeof(float) + sweep_.kind_state_bytes(),
            offload::state_store<typename Ctx::system>::counted_host_bytes(ctx_.options.offload, state_arrays,
                                                                           sweep_.elements())};
  }
  // The per-parameter sizes the paper's equations need for this engine's policies. (Reproducible:
  // grad_bytes is the binned store's formula::reproducible_grad_bytes per element it holds.)
  formula::state_sizes sizes() const {
    const std::size_t g = reduce::chosen_grad_bytes<Ctx>(ctx_.options);
    return {sizeof(param_type), g,
            (Prec::separate_master ? sizeof(float) : 0) + static_cast<std::size_t>(Opt::slots) * sizeof(float)};
  }
  // Stage s's model-state bytes with these sizes (the engine's own stage: persistent units counted),
  // the offloaded K bytes left out where `offloaded`.
  std::uint64_t stage_model_state_bytes(int s, formula::state_sizes z) const {
    const std::uint64_t persistent = s == 3 ? placement_.persistent_elements() : 0;
    if (ctx_.options.reproducible) return formula::reproducible_model_state_bytes(s, padded(), ranks(), z, persistent);
    return formula::model_state_bytes(s, padded(), ranks(), z, persistent);
  }
  // The model-state bytes in the system's memory: with offload, without the offloaded K bytes; plus
  // the reducer's extra state (qgZ's error buffer), hpZ's secondary shard (Psi / node_size parameters)
  // and what the optimizer's kind keeps of its own (engine/sweep_kind.hpp).
  std::uint64_t model_state_bytes() const {
    formula::state_sizes z = sizes();
    if (sweep_.offloaded()) z.k_bytes = 0;
    return stage_model_state_bytes(P::stage, z) + reduce::chosen_extra_state_bytes<Ctx>(ctx_.options, padded()) +
           sweep_.kind_state_bytes() +
           (zpp().hpz ? formula::hpz_secondary_bytes(padded(), ranks(), ctx_.node_size(), sizeof(param_type)) : 0);
  }
  // What the offload tier holds, and the bytes one step that updates moves.
  std::uint64_t offload_bytes() const {
    if (!sweep_.offloaded()) return 0;
    return formula::offloaded_state_bytes(P::stage, padded(), ranks(), static_cast<std::size_t>(state_arrays),
                                          on_disk());
  }
  offload_traffic offload_step_traffic() const {
    if (!sweep_.offloaded()) return {};
    // The optimizer reads the gradient store: the fp32 rounding of the binned sums in the reproducible mode.
    const std::size_t grad_read = ctx_.options.reproducible ? sizeof(float) : sizes().grad_bytes;
    // The passes over the tier: a tensor-wise optimizer or a matrix optimizer reads and writes it twice
    // (the sums and the exchange work in between, on the first pass's results).
    const std::uint64_t reads = TensorwiseOptimizer<Opt> || MatrixOptimizer<Opt> ? 2 : 1;
    const std::uint64_t writes = TensorwiseOptimizer<Opt> || MatrixOptimizer<Opt> ? 2 : 1;
    const auto t = formula::offload_bytes_per_step(P::stage, padded(), ranks(), static_cast<std::size_t>(state_arrays),
                                                   on_disk(), Ctx::host_memory, sweep_.held_real_elements(), grad_read,
                                                   Prec::separate_master ? sizeof(param_type) : 0, reads, writes);
    return {t.disk_read, t.disk_written, t.to_host, t.from_host};
  }
  // The paper's bytes per step, with the extra gathers of shared units (unit_spec::gathers) in stage 3;
  // reproducible: formula::reproducible_comm_bytes_per_step (the values' bytes where the reduce exchanges
  // them); with ZeRO++ on, formula::bytes_per_step's.
  // With replicated shard groups, the formulas at S ranks within the group plus
  // formula::replica_comm_bytes_per_step across the groups.
  std::uint64_t comm_bytes() const {
    if (ctx_.options.reproducible)
      return formula::reproducible_comm_bytes_per_step(
                 P::stage, padded(), ranks(), sizeof(param_type), ctx_.reduces_per_step(), ctx_.spec.num_units(),
                 extra_gathered_elements(), placement_.persistent_elements(),
                 reduce::binned_method<Ctx>::exchanges_values(ctx_) ? sizeof(typename Ctx::grad_type) : 0) +
             replica_bytes();
    if (zeropp_on()) return comm_by_level().total;
    return formula::comm_bytes_per_step(P::stage, padded(), ranks(), sizeof(comm_type), ctx_.reduces_per_step(),
                                        extra_gathered_elements(), placement_.persistent_elements()) +
           replica_bytes();
  }
  // The same per link level: the total and the part sent between nodes (zeropp_options::node_size;
  // with replicated shard groups a group is a node, and what crosses the groups is inter-node).
  formula::link_bytes comm_by_level() const {
    formula::link_bytes b = formula::bytes_per_step(P::stage, unit_extents(), ranks(), sizeof(comm_type),
                                                    ctx_.reduces_per_step(), traffic());
    b += formula::link_bytes{replica_bytes(), replica_bytes()};
    return b;
  }
  // What crosses the replicated shard groups per step (0 without them).
  std::uint64_t replica_bytes() const {
    if (ctx_.replica_count == 1) return 0;
    const bool binned = ctx_.options.reproducible;
    return formula::replica_comm_bytes_per_step(P::stage, padded(), ranks(), ctx_.replica_count,
                                                binned ? formula::reproducible_wire_bytes : sizeof(comm_type),
                                                ctx_.reduces_per_step(), binned ? ctx_.spec.num_units() : 0);
  }
  // Bytes of one forward-only pass inside evaluation() (every unit gathered `gathers` times): stage 3 only.
  std::uint64_t eval_comm_bytes() const {
    if (zeropp_on())
      return formula::eval_bytes_per_pass(P::stage, unit_extents(), ranks(), sizeof(comm_type), traffic()).total;
    return formula::eval_comm_bytes_per_pass(P::stage, padded(), ranks(), sizeof(comm_type), extra_gathered_elements(),
                                             placement_.persistent_elements());
  }
  // What the offload tier `o` holds in the system's memory (counted in memory_limit_bytes) for stage
  // s's held elements: Psi in stage 0, Psi / N after.
  std::uint64_t tier_host_bytes(int s, const offload_options& o) const {
    const std::size_t held = s >= 1 ? ctx_.layout.shard_total() : padded();
    return offload::state_store<typename Ctx::system>::counted_host_bytes(o, state_arrays, held);
  }
  // What each stage would need per rank with this engine's sizes and offload: the memory check's
  // refusal names the stages that would fit.
  std::array<std::uint64_t, 4> every_stage_model_state_bytes() const {
    const bool offloaded = ctx_.options.offload.tier != offload_tier::none;
    std::array<std::uint64_t, 4> bytes{};
    for (int s = 0; s < 4; ++s) {
      formula::state_sizes z = sizes();
      if (offloaded) z.k_bytes = 0;  // the other stages with the same offload
      // fp32 gradient accumulation exists in stages 2-3 only
      if (!ctx_.options.reproducible && s < 2) z.grad_bytes = sizeof(typename Ctx::grad_type);
      bytes[static_cast<std::size_t>(s)] =
          stage_model_state_bytes(s, z) + (offloaded ? tier_host_bytes(s, ctx_.options.offload) : 0);
    }
    return bytes;
  }
  // For a refusal to suggest, where `need` would not fit: what the master weights and slots would cost
  // offloaded (on a CPU system the disk tier, whose slices and checksums stay in this memory; on a
  // device system host memory). A small state is staged whole with the default slice: then the
  // smallest slice is suggested, also to an engine that offloads to disk already.
  offload_alternative offload_suggestion(const model_state_plan& need, const std::optional<memory_info>& m) const {
    const offload_options& now = ctx_.options.offload;
    const bool offloaded = now.tier != offload_tier::none, disk = now.tier == offload_tier::disk;
    offload_alternative alternative;
    if (state_arrays == 0 || !(!offloaded || (disk && now.slice_elements > 1024))) return alternative;
    offload_options o = now;
    if (!offloaded) o.tier = Ctx::host_memory ? offload_tier::disk : offload_tier::host;
    for (std::size_t slice : {offloaded ? std::size_t{1024} : o.slice_elements, std::size_t{1024}}) {
      o.slice_elements = slice;
      alternative = {to_string(o.tier), 0, tier_host_bytes(P::stage, o), slice};
      alternative.bytes = need.params + need.grads + alternative.staging;
      if (alternative.bytes >= need.total()) alternative.tier.clear();  // no better than what was asked
      if (detail::model_states_fit(alternative.bytes, ctx_.options.memory_limit_bytes, m)) break;
    }
    return alternative;
  }
  // Padded elements gathered per pass beyond once per unit: the sum of (gathers - 1) x padded over
  // the units that are gathered (a persistent unit's uses are views).
  std::uint64_t extra_gathered_elements() const {
    std::uint64_t n = 0;
    for (std::size_t u = 0; u < ctx_.spec.num_units(); ++u)
      if (!placement_.persistent(unit_id{u}))
        n = add_or_fail(
            n,
            mul_or_fail(static_cast<std::uint64_t>(ctx_.spec.units()[u].gathers - 1),
                        std::uint64_t{ctx_.layout.unit(unit_id{u}).padded}, "formula: extra gathered elements"),
            "formula: extra gathered elements");
    return n;
  }

 private:
  using comm_type = typename Prec::comm_type;
  std::size_t padded() const { return ctx_.layout.padded(); }
  int ranks() const { return ctx_.layout.ranks(); }
  bool on_disk() const { return ctx_.options.offload.tier == offload_tier::disk; }
  const zeropp_options& zpp() const { return ctx_.options.zeropp; }
  bool zeropp_on() const { return zpp().qwz || zpp().qgz || zpp().hpz; }
  std::vector<formula::unit_extent> unit_extents() const {
    std::vector<formula::unit_extent> v;
    for (std::size_t u = 0; u < ctx_.spec.num_units(); ++u)
      v.push_back({ctx_.layout.unit(unit_id{u}).padded, ctx_.spec.units()[u].gathers});
    return v;
  }
  formula::traffic_options traffic() const {
    return {zpp().qwz, zpp().qgz, zpp().hpz, zpp().weights, zpp().gradients, ctx_.node_size()};
  }

  const Ctx& ctx_;
  const parameter_placement<Ctx>& placement_;
  const optimizer_sweep<Ctx, Opt>& sweep_;
};

}  // namespace zero
