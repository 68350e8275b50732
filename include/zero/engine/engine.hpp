// engine: one rank's ZeRO protocol (gather, release, grads, reduce, step) over four policies.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <variant>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/counted.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/concepts/precision_policy.hpp"
#include "zero/core/binned.hpp"
#include "zero/core/checked.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/formulas.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/hash.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/link_formulas.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/core/quantize.hpp"
#include "zero/core/value_checks.hpp"
#include "zero/engine/agreement.hpp"
#include "zero/engine/init.hpp"
#include "zero/engine/memory_check.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/reduce/catalog.hpp"
#include "zero/engine/reduce/context.hpp"
#include "zero/engine/reports.hpp"
#include "zero/engine/tensor_view.hpp"
#include "zero/engine/zeropp.hpp"
#include "zero/error.hpp"
#include "zero/offload/state_store.hpp"
#include "zero/precision/fp32.hpp"
#include "zero/precision/loss_scaler.hpp"

namespace zero {

template <Partitioner P, CommBackend Comm, OptimizerState Opt, PrecisionPolicy Prec = precision::fp32>
class engine {
 public:
  using partitioner = P;
  using comm_backend = Comm;
  using optimizer = Opt;
  using precision = Prec;
  using system = typename Comm::system;
  using param_type = typename Prec::param_type;
  using grad_type = typename Prec::grad_type;
  static_assert(CommBackendFor<Comm, typename Prec::comm_type>,
                "zero::engine: the comm backend has no all_reduce, reduce_scatter or all_gather for the precision "
                "policy's comm_type (bf16 and fp16 precisions send 2-byte elements): give the backend those "
                "collectives for that type, or use a precision whose comm_type it moves");
  static_assert(CommBackendForSettingsCheck<Comm>,
                "zero::engine: the settings agreement check at construction all-gathers std::int64_t words: give the "
                "backend all_gather for std::int64_t (concepts/comm_backend.hpp, CommBackendForEngine)");
  static_assert(comm::overlap_complete_for<Comm, typename Prec::comm_type>,
                "zero::engine: overlap: the backend names part of the nonblocking interface of comm/nonblocking.hpp "
                "but not all of it for the types the engine starts; a misspelled member would turn overlap off: "
                "static_assert(zero::comm::check_nonblocking<Backend, comm_type>()) names the missing one");

  class gathered;
  class grad_buffers;
  class evaluation_scope;

  engine(Comm& comm, const model_spec& spec, Opt opt = {}, engine_options options = {})
      : sys_(system_of(comm)),
        comm_(comm),
        other_comm_(comm),
        control_comm_(comm),
        eval_comm_(comm),
        spec_(spec),
        layout_(layout::make(spec, comm.size())),
        opt_(validated(opt, comm.rank())),
        options_(validated(options, comm.rank())),
        scaler_(Prec::loss_scaling ? options.loss_scale : loss_scale_options{.dynamic = false, .initial = 1.0f}),
        rank_(comm.rank()),
        units_(spec.num_units()) {
    acct_.configure(rank_, options_.memory_limit_bytes);  // every buffer below is held to the budget
    ctx_.make_room = [this](std::size_t bytes) { make_room(bytes); };
    reduce::accept_chosen(ctx_);  // the gradient reducer the options choose (engine/reduce/catalog.hpp)
    check_zeropp();
    const std::size_t full = layout_.padded(), shard = layout_.shard_total();
    const std::size_t param_elems = P::shards_parameters ? shard : full;
    const std::size_t grad_elems = reduce::chosen_store_sharded<reduce_context>(options_) ? shard : full;
    const std::size_t state_elems = P::shards_optimizer_states ? shard : full;
    const std::size_t grad_bytes = reduce::chosen_grad_bytes<reduce_context>(options_);
    place_persistent_units();
    // Offloaded master weights and slots are not in the system's memory; what the tier holds in host
    // memory is, where host memory is the system's (offload::state_store::counted_host_bytes).
    const std::size_t in_system = options_.offload.tier == offload_tier::none ? state_elems : 0;
    check_memory(model_state_plan{(param_elems + persistent_elems_ + secondary_elements()) * sizeof(param_type),
                                  grad_elems * grad_bytes + reduce::chosen_extra_state_bytes<reduce_context>(options_, full), Prec::separate_master ? in_system * sizeof(float) : 0,
                                  static_cast<std::size_t>(Opt::slots) * in_system * sizeof(float),
                                  offload::state_store<system>::counted_host_bytes(options_.offload, state_arrays,
                                                                                   state_elems)});
    check_settings_agree();  // every rank's options and optimizer, before the model states are allocated
    params_ = buffer<param_type, system>(param_elems, mem_category::params, acct_);
    if (persistent_elems_ > 0) persistent_ = buffer<param_type, system>(persistent_elems_, mem_category::params, acct_);
    if (zpp().hpz) secondary_ = buffer<param_type, system>(secondary_elements(), mem_category::params, acct_);
    reduce::emplace_chosen(reducer_, ctx_);  // its gradient store
    std::array<mem_category, state_arrays> categories{};
    for (int a = 0; a < state_arrays; ++a)
      categories[static_cast<std::size_t>(a)] = a < master_arrays ? mem_category::master : mem_category::optimizer_states;
    store_ = offload::state_store<system>(options_.offload, rank_, state_arrays, state_elems, categories.data(), acct_);
    connect_nodes();
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // ---- set-up ------------------------------------------------------------------------------

  // Fills every tensor from fn; a collective. With every_rank, every rank produces every value, so
  // the engine then checks that they agree (check_init_agreement: one hash per tensor, all-gathered;
  // engine_options::verify_init) and throws on every rank, naming the first tensor that differs.
  void initialize(const init_fn& fn, init_source source = init_source::every_rank) {
    complete_parameter_gathers();
    std::vector<float> host;
    const bool check = options_.verify_init && source == init_source::every_rank && layout_.ranks() > 1;
    std::vector<std::uint64_t> hashes;
    for (std::size_t u = 0; u < spec_.num_units(); ++u) {
      const unit_spec& us = spec_.units()[u];
      for (std::size_t t = 0; t < us.tensors.size(); ++t) {
        const tensor_spec& ts = us.tensors[t];
        host.assign(ts.numel, 0.0f);
        if (source == init_source::every_rank || rank_ == 0) fn(us, ts, std::span<float>(host));
        if (check) hashes.push_back(run_hash64(host.data(), host.size() * sizeof(float)));
        if (source == init_source::broadcast_from_rank0) {
          const auto l = label("init", unit_id{u});
          buffer<float, system> wire(ts.numel, mem_category::transient, acct_);
          sys_.copy_from_host(wire.data(), host.data(), ts.numel * sizeof(float));
          other_comm_.broadcast(wire.data(), wire.data(), ts.numel, 0);
          sys_.copy_to_host(host.data(), wire.data(), ts.numel * sizeof(float));
        }
        store(unit_id{u}, layout_.unit(unit_id{u}).tensors[t], host.data());
      }
    }
    if (check) check_init_agreement(hashes);
  }

  // Fills what this rank keeps from fn, chunk by chunk (at most options().init_chunk_elements values
  // per call, which bounds the host staging); a collective. With every_rank, each rank asks only for
  // the elements whose master weights it holds (held_range: its owned slice where optimizer states are
  // sharded), so the work and the staging per rank fall with N; stages 1 and 2, which replicate the
  // parameters, then all-gather them as step() does, rather than every rank producing all of them.
  // With broadcast_from_rank0, rank 0 produces every chunk and broadcasts it, and every rank keeps its
  // part. Either way the result equals initialize() with the same values as whole tensors, bit for bit.
  // With every_rank, a value is produced by more than one rank only where the master weights are
  // replicated (stage 0: every rank produces the whole model); there the engine checks agreement as
  // the whole-tensor form does. In stages 1-3 each element is produced by exactly one rank (its
  // owner) and reaches the others, if at all, by the all-gather: nothing can disagree, nothing is checked.
  void initialize(const init_range_fn& fn, init_source source = init_source::every_rank) {
    complete_parameter_gathers();
    const std::size_t chunk = options_.init_chunk_elements;
    std::vector<float> host;
    const bool broadcast = source == init_source::broadcast_from_rank0;
    const bool check = options_.verify_init && !broadcast && !P::shards_optimizer_states && layout_.ranks() > 1;
    std::vector<std::uint64_t> hashes;
    buffer<float, system> wire;
    for (std::size_t u = 0; u < spec_.num_units(); ++u) {
      const unit_spec& us = spec_.units()[u];
      const unit_layout& ul = layout_.unit(unit_id{u});
      const range keep = broadcast ? range{0, ul.numel} : held_range(unit_id{u});
      for (std::size_t t = 0; t < us.tensors.size(); ++t) {
        const range tr = ul.tensors[t];
        // The tensor's hash, chained over its chunks in order (the chunks are the same on every rank).
        std::uint64_t h = 0;
        for_each_chunk(intersect(tr, keep), chunk, [&](range c) {
          const range local{c.begin - tr.begin, c.end - tr.begin};  // what the init function sees
          host.resize(std::max(host.size(), c.size()));
          if (!broadcast || rank_ == 0) fn(us, us.tensors[t], local, std::span<float>(host.data(), c.size()));
          if (broadcast) {
            if (wire.empty())
              wire = buffer<float, system>(std::min(chunk, largest_tensor()), mem_category::transient, acct_);
            sys_.copy_from_host(wire.data(), host.data(), c.size() * sizeof(float));
            const auto l = label("init", unit_id{u});
            other_comm_.broadcast(wire.data(), wire.data(), c.size(), 0);
            sys_.copy_to_host(host.data(), wire.data(), c.size() * sizeof(float));
          }
          if (check) h = run_hash64(host.data(), c.size() * sizeof(float), h);
          store(unit_id{u}, c, host.data());
        });
        if (check) hashes.push_back(h);
      }
    }
    if (check) check_init_agreement(hashes);
    // Each rank stored only what it keeps: the units kept whole gather the other ranks' slices.
    if (!broadcast) refresh_whole_parameters(other_comm_, "parameter refresh");
  }

  // ---- the protocol --------------------------------------------------------------------------
  //
  // Which calls are collectives (every rank must make them, in the same order):
  //   the constructor     at N > 1 (the all-gather of the settings, agreement.hpp)
  //   gather(u)           stage 3 only (an all-gather of the unit); a local view in stages 0-2
  //   release(u)          never
  //   grads(u)            never
  //   reduce(u)           every stage (all-reduce in stage 0, reduce-scatter in 1-3); the step's first
  //                       also starts the fingerprint's all-reduce where step() has no norm all-reduce
  //   step()              stages 1-2 (the all-gather of the updated parameters), and in stages 1-3
  //                       whenever the gradient norm is computed (one all-reduce, with the fingerprint)
  //   full_params()       stages 1-3, which shard the master weights (an all-gather per unit)
  //   initialize()        with broadcast_from_rank0 (a broadcast per tensor or chunk); the range form
  //                       with every_rank in stages 1-2 (the parameter all-gather)
  //   finish_load()       stages 1-2 (the parameter all-gather)
  //   evaluation()        not a collective, nor is the end of its scope; the gathers inside it are
  //                       (stage 3), so every rank runs the same forward passes, empty ones included.
  //
  // A unit is gathered in each forward and each backward pass of every micro-batch, `gathers` times
  // per pass (unit_spec::gathers: 1, or 2 for a tied embedding that is also the output layer): at most
  // 2 x gathers x micro_batches times per step, the count the traffic formula assumes; one more is a
  // protocol error naming the unit. Forward-only passes between steps belong in an evaluation() scope,
  // whose gathers are counted apart (comm().evaluation) and not against the step.

  // Makes unit u's parameters available in full until release(u) (or the handle's destruction).
  gathered gather(unit_id u) {
    unit_state& s = state(u, "gather");
    ZERO_CHECK(!s.gathered, protocol, where(u), "gather of a unit that is already gathered; release it first");
    if (!evaluating_) {
      const int declared = spec_.units()[u.index].gathers;  // both ints: the product in 64 bits
      const std::int64_t limit = std::int64_t{2} * declared * options_.micro_batches;
      ZERO_CHECK(s.step_gathers < limit, protocol, where(u), "gathered ", s.step_gathers + 1,
                 " times in this step, but it is declared to be gathered ", declared,
                 " time(s) per pass: at most 2 passes x ", declared, " x ", options_.micro_batches,
                 " micro-batch(es) = ", limit, " per step (declare a shared unit with unit_builder::gathers(n); run "
                 "forward-only passes inside an evaluation() scope)");
    }
    const unit_layout& ul = layout_.unit(u);
    if constexpr (P::shards_parameters) {
      if (persistent(u)) {
        complete_parameter_gather(s);  // a view of the unit's persistent copy, once step()'s gather is done
      } else if (evaluating_) {
        s.full_params = buffer<param_type, system>(ul.padded, mem_category::transient, acct_);
        buffer<std::uint8_t, system> wire;
        auto r = start_gather(eval_comm_, u, s.full_params.data(), wire, false);
        finish_gather(eval_comm_, r, u, s.full_params.data(), wire, false, false);
      } else {
        gather_in_step(u, s, ul);
      }
    } else {
      complete_parameter_gather(s);  // the last step's all-gather of this unit, if still in flight
    }
    // Counted once it succeeded: a gather refused for memory leaves the engine as it was.
    if (!evaluating_) {
      ++s.step_gathers;
      step_started_ = true;
    }
    s.gathered = true;
    ++s.gather_epoch;
    return gathered(*this, u, s.gather_epoch);
  }

  void release(unit_id u) {
    unit_state& s = state(u, "release");
    ZERO_CHECK(s.gathered, protocol, where(u), "release of a unit that is not gathered");
    s.gathered = false;
    s.full_params.reset();
  }

  // The unit's gradient buffer for this step, zero at its first use in a step; kernels write or
  // accumulate into it until reduce(u). A shared unit takes its grads() in each place it is used and
  // is reduced once: where gradients go to a transient bucket (stages 2-3, or several reduced
  // micro-batches), that bucket stays allocated from the first grads(u) to reduce(u), on top of the
  // units gathered in between (zero::plan counts it).
  grad_buffers grads(unit_id u) {
    unit_state& s = state(u, "grads");
    ZERO_CHECK(!evaluating_, protocol, where(u), "grads() inside an evaluation() scope (forward-only passes take no "
               "gradients; end the scope first)");
    ZERO_CHECK(!s.reduced(reduces_per_step()), protocol, where(u), "grads of a unit already reduced in this step",
               reduce_count_text(s.reduces));
    with_reducer([&](auto& r) { r.open(u); });
    step_started_ = true;
    return grad_buffers(*this, u, s.reduce_epoch);
  }

  // Sums unit u's gradients over ranks (each rank keeps what its shard needs). Every rank calls it
  // in the same unit order, once per unit per micro-batch (reduce_each_micro_batch) or once per step.
  void reduce(unit_id u) {
    unit_state& s = state(u, "reduce");
    ZERO_CHECK(!evaluating_, protocol, where(u), "reduce() inside an evaluation() scope (forward-only passes take no "
               "gradients; end the scope first)");
    ZERO_CHECK(!s.reduced(reduces_per_step()), protocol, where(u), "reduce of a unit already reduced in this step",
               reduce_count_text(s.reduces));
    with_reducer([&](auto& r) { r.open(u); });  // (a reduce without grads() reduces zeros)
    start_agreement_check();
    const bool first = s.reduces == 0;
    ++s.reduces;
    ++s.reduce_epoch;
    step_started_ = true;
    with_reducer([&](auto& r) { r.reduce(u, first); });
  }

  // Applies the optimizer to the owned shard and refreshes the parameters. Every unit must have been
  // reduced (M times under reduce_each_micro_batch) and released. When the global gradient norm is
  // not finite on any rank, every rank skips the update and the loss scale adjusts identically.
  step_report step() {
    ZERO_CHECK(!evaluating_, protocol, "rank ", rank_, ": step() inside an evaluation() scope; end the scope first");
    for (std::size_t u = 0; u < units_.size(); ++u) {
      ZERO_CHECK(units_[u].reduced(reduces_per_step()), protocol, where(unit_id{u}),
                 "step() before every unit was reduced (this one was not", reduce_count_text(units_[u].reduces), ")");
      ZERO_CHECK(!units_[u].gathered, protocol, where(unit_id{u}), "step() while this unit is still gathered");
    }
    // Every collective of the step completes first: the norm and the update read the gradients, and
    // the update writes the parameters that a unit never gathered in this step may still be receiving.
    with_reducer([](auto& r) { r.complete_all(); });
    complete_parameter_gathers();
    drop_prefetches();
    finish_agreement_check();
    gather_order_ = std::move(step_order_);  // the next step's prefetch follows this one's gathers
    step_order_.clear();
    next_prefetch_ = 0;
    order_holds_ = true;
    step_report r;
    r.loss_scale = scaler_.scale();
    // The gradient the optimizer sees: the rank-ordered sum divided by N and by the loss scale, in
    // one IEEE division (N x scale is exact: the scale is a power of two). Reproducible: the exact sum
    // rounded once, divided by the global number of micro-batches N x M and the scale (N x M <= 2^24,
    // checked at construction, so the product is exact too).
    const float divisor = fp::mul(static_cast<float>(with_reducer([](auto& red) { return red.averaging_count(); })), scaler_.scale());
    float coef = 1.0f;
    if (needs_norm()) {
      const norm_result n = with_reducer(
          [&](auto& red) { return red.sum_of_squares(divisor, agreement_terms{fingerprint_.data(), optimizer_hash_}); });
      if (!n.optimizers_agree) optimizers_disagree();
      const double sq = n.sum_of_squares;
      r.grad_norm = fp::canonical(std::sqrt(sq));  // a NaN norm reports the same bits on every system
      r.skipped = !std::isfinite(sq);
      if (!r.skipped && options_.clip_norm > 0.0f && r.grad_norm > options_.clip_norm)
        coef = static_cast<float>(static_cast<double>(options_.clip_norm) / (r.grad_norm + 1e-6));
    }
    if (!r.skipped) {
      ++step_;
      const auto c = opt_.constants(step_);
      update_and_gather_params(c, divisor, coef);
    } else {
      ++skipped_;
    }
    scaler_.update(r.skipped);
    with_reducer([](auto& red) { red.clear(); });
    for (auto& s : units_) {
      s.reduces = s.step_gathers = 0;
      s.secondary_ready = false;  // the update changed the parameters: the next step's first gather refills it
    }
    step_started_ = false;

    r.step = step_;
    r.comm = protocol_stats() - at_step_start_;
    last_step_ = r.comm;
    at_step_start_ = protocol_stats();
    return r;
  }

  // Opens a forward-only scope (held-out loss, sampling): gathers inside it are counted in
  // comm().evaluation, not in the next step's report, nor against the units' gathers per step, and
  // grads(), reduce() and step() are protocol errors until the scope ends. It must begin between
  // steps (not after a gather, grads or reduce of a step that has not reached step()), and scopes do
  // not nest. Neither its start nor its end is a collective; its end releases the units still gathered.
  [[nodiscard]] evaluation_scope evaluation() {
    ZERO_CHECK(!evaluating_, protocol, "rank ", rank_, ": evaluation() inside another evaluation() scope");
    if (step_started_) {
      std::size_t u = 0;  // the first unit the step has touched, to name in the message
      while (u + 1 < units_.size() && units_[u].step_gathers == 0 && units_[u].reduces == 0) ++u;
      fail(error_kind::protocol, where(unit_id{u}), "evaluation() in the middle of a step (this unit gathered ",
           units_[u].step_gathers, " and reduced ", units_[u].reduces,
           " time(s) since the last step(), after a gather, grads or reduce of the step); call step() first");
    }
    evaluating_ = true;
    return evaluation_scope(*this);
  }
  bool evaluating() const { return evaluating_; }

  // ---- hyper-parameters between steps --------------------------------------------------------

  // Replaces the optimizer's hyper-parameters; the next step() uses them (the step counter, the
  // moments and the loss scale carry on, so AdamW's bias correction continues at the same t).
  // Validated exactly as at construction (the same errors, naming the rank); a refused value leaves
  // the old ones. Refused (protocol) in the middle of a step: while any unit is gathered or has been
  // reduced since the last step(), the state finish_load() refuses too. grads() alone leaves no mark
  // (in stages 0-1 it hands out the persistent gradient), so a change after grads() and before the
  // first reduce() is accepted, harmlessly: only step() reads the optimizer. Not a collective, but a
  // rank updates its own slice with its own values: every rank must make the same change.
  void set_optimizer(const Opt& o) {
    for (std::size_t u = 0; u < units_.size(); ++u)
      ZERO_CHECK(!units_[u].gathered && units_[u].reduces == 0, protocol, where(unit_id{u}),
                 "set_optimizer() in the middle of a step (this unit is ",
                 units_[u].gathered ? "gathered" : "reduced in this step",
                 "); change hyper-parameters between step() and the next step's first gather or reduce");
    opt_ = validated(o, rank_);
    fingerprint_optimizer();
  }
  // The learning rate alone, for optimizers that have one (a member `lr`), e.g. from a schedule
  // (zero/core/schedule.hpp); set_optimizer's rules. lr 0 is accepted by the library's optimizers
  // and leaves each weight's value unchanged (w - 0 x d, d finite; the states still advance); the one bit
  // pattern it can change is a weight of -0, which becomes +0 where its update direction d is negative.
  void set_learning_rate(float lr)
    requires requires(Opt& o, float x) { o.lr = x; }
  {
    Opt o = opt_;
    o.lr = lr;
    set_optimizer(o);
  }

  // The factor user kernels multiply the loss by (1 unless the precision policy scales the loss).
  float loss_scale() const { return scaler_.scale(); }
  const engine_options& options() const { return options_; }

  // ---- results and reports -------------------------------------------------------------------

  // The fp32 (master) parameters of the whole model, unpadded, tensors in declaration order. A
  // collective in stages that shard the master weights.
  std::vector<float> full_params() {
    complete_parameter_gathers();
    std::vector<float> out(layout_.numel());
    std::size_t at = 0;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      copy_full_params(unit_id{u}, out.data() + at);
      at += layout_.unit(unit_id{u}).numel;
    }
    return out;
  }
  // The same for one unit: host memory for one unit at a time (a streaming hash, an export).
  std::vector<float> full_params(unit_id u) {
    state_check(u);
    complete_parameter_gathers();
    std::vector<float> out(layout_.unit(u).numel);
    copy_full_params(u, out.data());
    return out;
  }

  // ---- optimizer-state access (checkpoints) -------------------------------------------------

  // The unit-local, unpadded range of master weights and optimizer slots this rank holds: its owned
  // slice when optimizer states are sharded, the whole unit otherwise.
  range held_range(unit_id u) const {
    state_check(u);
    return P::shards_optimizer_states ? layout_.owned_real(u, rank_) : range{0, layout_.unit(u).numel};
  }
  // The slice this rank is responsible for writing to a checkpoint: owned_real in every stage, so
  // the N ranks write disjoint slices that cover the model even where states are replicated.
  range canonical_range(unit_id u) const {
    state_check(u);
    return layout_.owned_real(u, rank_);
  }

  // Copies master weights (fp32) and each optimizer slot of unit-local range r (within
  // held_range(u)) to host memory: master[r.size()], slots[k][r.size()] for k < Opt::slots.
  // Needs no wait for step()'s parameter all-gathers still in flight (stages 1-2): it reads only this
  // rank's own slice, which those collectives send from and never write.
  // From any offload tier (the disk's reads go through its staging blocks). A null pointer skips
  // its array (a checkpoint streams one array at a time).
  void read_state(unit_id u, range r, float* master, float* const* slots) const {
    const unit_layout& ul = checked_state_range(u, r, "read_state");
    if (r.empty()) return;
    const std::size_t at = state_index(ul, r.begin);
    if (master) {
      if constexpr (Prec::separate_master) store_.read(sys_, 0, at, r.size(), master);
      else sys_.copy_to_host(master, param_element(ul, r.begin), r.size() * sizeof(float));
    }
    for (int k = 0; k < Opt::slots; ++k)
      if (slots[k]) store_.read(sys_, slot_array(k), at, r.size(), slots[k]);
  }

  // Stores master weights and optimizer slots of unit-local range r (within held_range(u)). The
  // parameters follow only at finish_load().
  void write_state(unit_id u, range r, const float* master, const float* const* slots) {
    const unit_layout& ul = checked_state_range(u, r, "write_state");
    complete_parameter_gathers();
    if (r.empty()) return;
    const std::size_t at = state_index(ul, r.begin);
    if constexpr (Prec::separate_master) store_.write(sys_, 0, at, r.size(), master);
    else sys_.copy_from_host(param_element(ul, r.begin), master, r.size() * sizeof(float));
    for (int k = 0; k < Opt::slots; ++k) store_.write(sys_, slot_array(k), at, r.size(), slots[k]);
  }

  // After write_state() on every held range: restores the step counter and training state and
  // refreshes the parameters from the master weights (a collective in stages 1 and 2).
  void finish_load(const training_state& ts) {
    for (std::size_t u = 0; u < units_.size(); ++u)
      ZERO_CHECK(!units_[u].gathered && units_[u].reduces == 0, protocol, where(unit_id{u}),
                 "finish_load() in the middle of a step");
    ZERO_CHECK(ts.step <= training_state::max_steps && ts.skipped_steps <= training_state::max_steps - ts.step &&
                   ts.clean_steps <= training_state::max_steps,
               invalid_argument, "rank ", rank_, ": finish_load: step ", ts.step, ", skipped_steps ", ts.skipped_steps,
               " or clean_steps ", ts.clean_steps, " is more than a run can reach (training_state::max_steps, 2^53)");
    complete_parameter_gathers();
    for (auto& s : units_) {
      s.step_gathers = 0;  // a loaded engine starts a step afresh
      s.secondary_ready = false;
    }
    step_started_ = false;
    step_ = ts.step;
    skipped_ = ts.skipped_steps;
    if constexpr (Prec::loss_scaling) scaler_.restore(ts.loss_scale, ts.clean_steps, ts.hysteresis_left);
    if constexpr (Prec::separate_master) cast_master_into_params();
    refresh_whole_parameters(other_comm_, "parameter refresh");
  }

  // Everything besides the tensors that a resumed run needs to continue identically.
  training_state state() const {
    return training_state{step_, scaler_.scale(), scaler_.clean_steps(), scaler_.hysteresis_left(), skipped_};
  }

  const memory_report& memory() const { return acct_.report(); }
  // What overlapping communication with computation did so far (engine_options::overlap).
  overlap_report overlap() const {
    overlap_report r = overlap_;
    r.active = overlapping();
    return r;
  }
  comm_report comm() const {
    return comm_report{protocol_stats(),       last_step_,       other_comm_.stats(),
                       control_comm_.stats(), step_ + skipped_, eval_comm_.stats()};
  }

  // The per-parameter sizes the paper's equations need for this engine's policies.
  // (Reproducible: grad_bytes is the binned store's formula::reproducible_grad_bytes per element it holds.)
  formula::state_sizes state_sizes() const {
    const std::size_t g = reduce::chosen_grad_bytes<reduce_context>(options_);
    return {sizeof(param_type), g,
            (Prec::separate_master ? sizeof(float) : 0) + static_cast<std::size_t>(Opt::slots) * sizeof(float)};
  }
  // The model-state bytes in the system's memory: with offload, without the offloaded K bytes; plus
  // hpZ's secondary shard (Psi / node_size parameters).
  std::uint64_t model_state_formula_bytes() const {
    formula::state_sizes z = state_sizes();
    if (store_.offloaded()) z.k_bytes = 0;
    const std::uint64_t states =
        options_.reproducible
            ? formula::reproducible_model_state_bytes(P::stage, layout_.padded(), layout_.ranks(), z, persistent_elems_)
            : formula::model_state_bytes(P::stage, layout_.padded(), layout_.ranks(), z, persistent_elems_);
    return states + reduce::chosen_extra_state_bytes<reduce_context>(options_, layout_.padded()) +
           (zpp().hpz ? formula::hpz_secondary_bytes(layout_.padded(), layout_.ranks(), node_size(), sizeof(param_type))
                      : 0);
  }
  // What the offload tier holds and moves (engine_options::offload), and its formulas: the tier's
  // bytes, and the bytes moved by one step that updates.
  const offload_report& offload() const { return store_.report(); }
  std::uint64_t offload_formula_bytes() const {
    if (!store_.offloaded()) return 0;
    return formula::offloaded_state_bytes(P::stage, layout_.padded(), layout_.ranks(),
                                          static_cast<std::size_t>(state_arrays), on_disk());
  }
  offload_traffic offload_formula_traffic() const {
    if (!store_.offloaded()) return {};
    // The optimizer reads the gradient store: the fp32 rounding of the binned sums in the reproducible mode.
    const std::size_t grad_read = options_.reproducible ? sizeof(float) : state_sizes().grad_bytes;
    const auto t = formula::offload_bytes_per_step(P::stage, layout_.padded(), layout_.ranks(),
                                                   static_cast<std::size_t>(state_arrays), on_disk(), host_memory_system,
                                                   held_real_elements(), grad_read,
                                                   Prec::separate_master ? sizeof(param_type) : 0);
    return {t.disk_read, t.disk_written, t.to_host, t.from_host};
  }
  // The paper's bytes per step, with the extra gathers of shared units (unit_spec::gathers) in stage 3;
  // reproducible: formula::reproducible_comm_bytes_per_step; with ZeRO++ on, zero::formula::bytes_per_step's
  // (core/link_formulas.hpp).
  std::uint64_t comm_formula_bytes() const {
    if (options_.reproducible)
      return formula::reproducible_comm_bytes_per_step(P::stage, layout_.padded(), layout_.ranks(), sizeof(param_type),
                                                       reduces_per_step(), units_.size(), extra_gathered_elements(),
                                                       persistent_elems_);
    if (zeropp_on()) return comm_formula_by_level().total;
    return formula::comm_bytes_per_step(P::stage, layout_.padded(), layout_.ranks(), sizeof(typename Prec::comm_type),
                                        reduces_per_step(), extra_gathered_elements(), persistent_elems_);
  }
  // The same per link level: the total and the part sent between nodes (engine_options::zeropp's
  // node_size; comm_stats::inter counts it), by zero::formula::bytes_per_step.
  formula::link_bytes comm_formula_by_level() const {
    return formula::bytes_per_step(P::stage, unit_extents(), layout_.ranks(), sizeof(typename Prec::comm_type),
                                   reduces_per_step(), traffic_options());
  }
  // Bytes of one forward-only pass inside evaluation() (every unit gathered `gathers` times): stage 3
  // only.
  std::uint64_t eval_comm_formula_bytes() const {
    if (zeropp_on())
      return formula::eval_bytes_per_pass(P::stage, unit_extents(), layout_.ranks(), sizeof(typename Prec::comm_type),
                                          traffic_options())
          .total;
    return formula::eval_comm_bytes_per_pass(P::stage, layout_.padded(), layout_.ranks(),
                                             sizeof(typename Prec::comm_type), extra_gathered_elements(),
                                             persistent_elems_);
  }
  // Padded elements gathered per pass beyond once per unit: the sum of (gathers - 1) x padded over
  // the units that are gathered (a persistent unit's uses are views).
  std::uint64_t extra_gathered_elements() const {
    std::uint64_t n = 0;
    for (std::size_t u = 0; u < units_.size(); ++u)
      if (!persistent(unit_id{u}))
        n = add_or_fail(n,
                        mul_or_fail(static_cast<std::uint64_t>(spec_.units()[u].gathers - 1),
                                    std::uint64_t{layout_.unit(unit_id{u}).padded}, "formula: extra gathered elements"),
                        "formula: extra gathered elements");
    return n;
  }
  // Stage 3: whether unit u keeps its gathered parameters between steps (persist_below_elements),
  // and the padded elements of all such units (Psi_p of the formulas).
  bool persistent(unit_id u) const { return persistent_at_[u.index] != not_persistent; }
  std::uint64_t persistent_elements() const { return persistent_elems_; }

  const model_spec& spec() const { return spec_; }
  const zero::layout& layout() const { return layout_; }
  // The optimizer's current hyper-parameters (as built, or as last set): what a checkpoint records.
  const Opt& optimizer_state() const { return opt_; }
  int rank() const { return rank_; }
  int world_size() const { return layout_.ranks(); }
  std::uint64_t steps() const { return step_; }

  // ---- handles -------------------------------------------------------------------------------

  // An evaluation() scope: ends when destroyed (movable, not copyable).
  class evaluation_scope {
   public:
    evaluation_scope(evaluation_scope&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
    evaluation_scope& operator=(evaluation_scope&&) = delete;
    evaluation_scope(const evaluation_scope&) = delete;
    ~evaluation_scope() { end(); }
    // Ends the scope before the destructor would.
    void end() {
      if (e_) e_->end_evaluation();
      e_ = nullptr;
    }

   private:
    friend class engine;
    explicit evaluation_scope(engine& e) : e_(&e) {}
    engine* e_;
  };

  // A unit's gathered parameters; releases the unit when destroyed unless released already.
  class gathered {
   public:
    gathered(gathered&& o) noexcept : e_(o.e_), u_(o.u_), epoch_(o.epoch_) { o.e_ = nullptr; }
    gathered& operator=(gathered&&) = delete;
    gathered(const gathered&) = delete;
    ~gathered() {
      if (live()) e_->release(u_);
    }
    tensor_view<param_type> operator[](std::string_view tensor) const { return view()[tensor]; }
    unit_view<param_type> view() const {
      ZERO_CHECK(live(), protocol, e_ ? e_->where(u_) : std::string("engine: "),
                 "access to parameters of a released unit (gather it again)");
      return unit_view<param_type>(e_->full_params_of(u_), e_->spec_.units()[u_.index], e_->layout_.unit(u_),
                                   e_->rank_);
    }
    unit_id unit() const { return u_; }
    void release() {
      ZERO_CHECK(live(), protocol, e_ ? e_->where(u_) : std::string("engine: "), "release of a released unit");
      e_->release(u_);
    }

   private:
    friend class engine;
    gathered(engine& e, unit_id u, std::uint64_t epoch) : e_(&e), u_(u), epoch_(epoch) {}
    bool live() const {
      return e_ && e_->units_[u_.index].gathered && e_->units_[u_.index].gather_epoch == epoch_;
    }
    engine* e_;
    unit_id u_;
    std::uint64_t epoch_;
  };

  // A unit's gradient buffers for the current step; valid until the unit is reduced.
  class grad_buffers {
   public:
    tensor_view<grad_type> operator[](std::string_view tensor) const { return view()[tensor]; }
    unit_view<grad_type> view() const {
      const auto& s = e_->units_[u_.index];
      ZERO_CHECK(s.reduce_epoch == epoch_, protocol, e_->where(u_),
                 "access to gradients after the unit was reduced (call grads() again for the next micro-batch "
                 "or step)");
      return unit_view<grad_type>(e_->full_grads_of(u_), e_->spec_.units()[u_.index], e_->layout_.unit(u_), e_->rank_);
    }
    unit_id unit() const { return u_; }

   private:
    friend class engine;
    grad_buffers(engine& e, unit_id u, std::uint64_t epoch) : e_(&e), u_(u), epoch_(epoch) {}
    engine* e_;
    unit_id u_;
    std::uint64_t epoch_;
  };

 private:
  using request = typename comm::counted<Comm>::request;
  using reduce_context = reduce::context<P, Comm, Prec>;

  // Calls f with the engine's reducer (whichever the options chose) and returns what it returns.
  template <class F>
  decltype(auto) with_reducer(F&& f) {
    using R = decltype(f(std::declval<reduce::exact_reducer<reduce_context>&>()));
    return std::visit(
        [&](auto& r) -> R {
          if constexpr (std::is_same_v<std::decay_t<decltype(r)>, std::monostate>)
            fail(error_kind::protocol, "rank ", rank_, ": engine: no gradient reducer (the constructor failed)");
          else return f(r);
        },
        reducer_);
  }
  template <class F>
  decltype(auto) with_reducer(F&& f) const {
    using R = decltype(f(std::declval<const reduce::exact_reducer<reduce_context>&>()));
    return std::visit(
        [&](const auto& r) -> R {
          if constexpr (std::is_same_v<std::decay_t<decltype(r)>, std::monostate>)
            fail(error_kind::protocol, "rank ", rank_, ": engine: no gradient reducer (the constructor failed)");
          else return f(r);
        },
        reducer_);
  }

  struct unit_state {
    bool gathered = false;
    int reduces = 0;  // reduce() calls in the current step
    int step_gathers = 0;  // gather() calls in the current step, outside evaluation()
    std::uint64_t gather_epoch = 0, reduce_epoch = 0;
    bool reduced(int per_step) const { return reduces >= per_step; }
    buffer<param_type, system> full_params;  // stage 3: the gathered unit
    // Stage 3: an all-gather started before gather(u) asked for it (declared after its buffer, so
    // the request, whose destructor waits, is destroyed first).
    buffer<param_type, system> prefetched;
    buffer<std::uint8_t, system> prefetch_wire;  // qwZ: the prefetch's quantized shards
    request prefetch;
    bool prefetching = false;
    bool prefetch_secondary = false;  // hpZ: the prefetch reads the secondary partition (node_comm_)
    bool secondary_ready = false;     // hpZ: this step's first gather has filled the secondary shard
    // Stages 1-2: the all-gather of the unit's updated parameters, started by step().
    request parameter_gather;
    bool parameter_gather_pending = false;
  };

  bool overlapping() const { return options_.overlap && comm::counted<Comm>::overlaps; }
  bool prefetching() const {
    return P::shards_parameters && overlapping() && options_.prefetch_units > 0 && order_holds_ && !evaluating_;
  }

  // Under memory_limit_bytes, completes reduces in flight (oldest first) and then drops prefetches
  // until `bytes` more fit, so that overlap never needs more memory than the blocking protocol: what
  // it holds beyond that is given back before an allocation would fail. The same decisions on every
  // rank (their accounts are equal).
  void make_room(std::size_t bytes) {
    if (acct_.limit() == 0) return;
    while (with_reducer([](auto& r) { return r.in_flight(); }) > 0 && acct_.total() + bytes > acct_.limit())
      with_reducer([](auto& r) { r.complete_oldest(); });
    if (acct_.total() + bytes > acct_.limit()) {
      bool any = false;
      for (auto& t : units_) any = any || t.prefetching;
      if (any) {
        drop_prefetches();
        order_holds_ = false;  // dropped: gather on demand for the rest of the step
      }
    }
  }

  const param_type* shard_of_params(const unit_layout& ul, unit_id u) const {
    return element<param_type, true>(params_, ul, layout_.owned(u, rank_).begin);
  }

  // Stage 3's gather(u) inside a step: takes the unit's prefetch when the step follows the recorded
  // order, else gathers now; either way starts the prefetches that the order allows next.
  void gather_in_step(unit_id u, unit_state& s, const unit_layout& ul) {
    const std::size_t position = step_order_.size();
    if (order_holds_ && (position >= gather_order_.size() || gather_order_[position] != u.index)) {
      // This step departs from the last one's order: what was prefetched is not what is asked for.
      order_holds_ = false;
      drop_prefetches();
    }
    request r{};
    buffer<std::uint8_t, system> wire;
    // hpZ: a unit already gathered in this step reads the secondary partition, inside the node.
    const bool secondary = zpp().hpz && s.secondary_ready;
    if (s.prefetching && s.prefetch_secondary != secondary) drop_prefetch(s);  // (cannot happen: same rule)
    if (s.prefetching) {
      s.full_params = std::move(s.prefetched);
      wire = std::move(s.prefetch_wire);
      r = std::move(s.prefetch);
      s.prefetching = false;
      ++overlap_.prefetch_hits;
    } else {
      make_room(gather_bytes(ul, secondary));
      s.full_params = buffer<param_type, system>(ul.padded, mem_category::transient, acct_);
      r = start_gather(comm_, u, s.full_params.data(), wire, secondary);
    }
    step_order_.push_back(u.index);
    if (order_holds_ && next_prefetch_ <= position) next_prefetch_ = position + 1;
    s.gathered = true;  // counted as live by prefetch_ahead
    try {
      if (prefetching()) prefetch_ahead();
      finish_gather(comm_, r, u, s.full_params.data(), wire, secondary, true);
      // hpZ: the walk stops at a secondary gather whose primary had not completed (this one's, for the
      // backward pass's first unit); now it has.
      if (zpp().hpz && prefetching()) prefetch_ahead();
    } catch (...) {
      s.gathered = false;
      s.full_params.reset();
      throw;
    }
  }

  // Starts the all-gathers of the units the recorded order gathers next, in that order, up to
  // prefetch_units ahead of the last gather, while each fits max_live_parameters and the memory
  // budget. A unit gathered now may be prefetched for its next gather (into a buffer of its own: the
  // backward pass gathers the last layer again right after the forward released it), but a unit
  // already prefetched stops the walk until that prefetch is taken. The decisions depend only on the
  // calls, which every rank makes alike, so the ranks start the same collectives in the same order.
  void prefetch_ahead() {
    if (step_order_.empty()) return;
    const std::size_t last = step_order_.size() - 1;
    const std::size_t end = std::min(gather_order_.size(), last + 1 + static_cast<std::size_t>(options_.prefetch_units));
    for (; next_prefetch_ < end; ++next_prefetch_) {
      const unit_id v{gather_order_[next_prefetch_]};
      unit_state& t = units_[v.index];
      if (t.prefetching) return;
      // hpZ: the gather at this position reads the secondary partition when the order gathered the unit
      // before it (as the gather itself will decide); its source must be filled first.
      const bool secondary = zpp().hpz && gathered_before(v.index, next_prefetch_);
      if (secondary && !t.secondary_ready) return;
      const unit_layout& ul = layout_.unit(v);
      if (options_.max_live_parameters > 0 && live_parameters() + ul.padded > options_.max_live_parameters) return;
      const std::size_t bytes = gather_bytes(ul, secondary);
      if (acct_.limit() > 0 && acct_.total() + bytes > acct_.limit()) return;
      t.prefetched = buffer<param_type, system>(ul.padded, mem_category::transient, acct_);
      t.prefetch = start_gather(comm_, v, t.prefetched.data(), t.prefetch_wire, secondary);
      t.prefetch_secondary = secondary;
      t.prefetching = true;
      ++overlap_.prefetches;
    }
  }
  // Elements of units gathered or being prefetched now (a unit that is both counts twice: two buffers).
  std::size_t live_parameters() const {
    std::size_t n = 0;
    for (std::size_t u = 0; u < units_.size(); ++u)
      if (!persistent(unit_id{u}))
        n += (std::size_t{units_[u].gathered} + std::size_t{units_[u].prefetching}) * layout_.unit(unit_id{u}).padded;
    return n;
  }
  // Completes and frees the prefetches no gather took (the order changed, or the step ended).
  void drop_prefetches() {
    for (auto& t : units_)
      if (t.prefetching) drop_prefetch(t);
  }
  void drop_prefetch(unit_state& t) {
    if (t.prefetch_secondary) node_comm_->wait(t.prefetch);
    else comm_.wait(t.prefetch);
    t.prefetched.reset();
    t.prefetch_wire.reset();
    t.prefetching = false;
    ++overlap_.prefetch_misses;
  }

  // The update of each unit, and where a unit's parameters are kept whole (stages 1-2; stage 3's
  // persistent units) the all-gather of its updated shard, started as soon as it is updated so that it
  // runs while the next unit updates (overlap). Without overlap each completes at once. With overlap
  // they stay in flight after step() returns: the next step's gather(u) waits for its unit's (the
  // forward pass overlaps them), anything else that reads or writes the parameters for all of them
  // (complete_parameter_gathers).
  void update_and_gather_params(const typename Opt::step_constants& c, float divisor, float coef) {
    store_.begin_step();
    for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          update_segment(u, i, n, arrays, c, divisor, coef);
        },
        true,
        [&](unit_id u) {
          if (!keeps_parameters_whole(u)) return;
          unit_state& s = units_[u.index];
          {
            const auto l = label("step", u);
            s.parameter_gather = start_whole_parameter_gather(comm_, u);
          }
          s.parameter_gather_pending = true;
          if (!overlapping()) complete_parameter_gather(s);
          else ++overlap_.parameter_gathers_started;
        });
    store_.end_step();
  }
  // Whether unit u's parameters are held whole on every rank and so must be all-gathered after each
  // update: every unit in stages 1-2 (in place), the persistent units in stage 3 (into their copy).
  bool keeps_parameters_whole(unit_id u) const {
    if constexpr (gathers_parameters_after_update<P>) return true;
    else return P::shards_parameters && persistent(u);
  }
  // The all-gather of unit u's parameter shard into its whole copy, on `via`.
  request start_whole_parameter_gather(comm::counted<Comm>& via, unit_id u) {
    const unit_layout& ul = layout_.unit(u);
    if constexpr (P::shards_parameters)
      return via.start_all_gather(shard_of_params(ul, u), persistent_.data() + persistent_at_[u.index], ul.shard);
    else
      return via.start_all_gather(element<param_type, false>(params_, ul, static_cast<std::size_t>(rank_) * ul.shard),
                                  params_.data() + ul.offset, ul.shard);
  }
  // The same all-gathers, completed at once, after an initialization or a load wrote only this rank's
  // slices (counted on `via`, the set-up counter): every unit in stages 1-2, the persistent units in
  // stage 3, nothing elsewhere.
  void refresh_whole_parameters(comm::counted<Comm>& via, const char* phase) {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (!keeps_parameters_whole(unit_id{u})) continue;
      const auto l = label(phase, unit_id{u});
      auto r = start_whole_parameter_gather(via, unit_id{u});
      via.wait(r);
    }
  }
  // Stage 3: which units persist (persist_below_elements) and where each one's copy starts.
  void place_persistent_units() {
    persistent_at_.assign(units_.size(), not_persistent);
    if constexpr (P::shards_parameters) {  // (constexpr: elsewhere nvcc warns of an unreachable loop)
      if (options_.persist_below_elements == 0) return;
      for (std::size_t u = 0; u < units_.size(); ++u) {
        const unit_layout& ul = layout_.unit(unit_id{u});
        if (ul.numel > options_.persist_below_elements) continue;
        persistent_at_[u] = persistent_elems_;
        persistent_elems_ += ul.padded;
      }
    }
  }
  void complete_parameter_gather(unit_state& s) {
    if (!s.parameter_gather_pending) return;
    s.parameter_gather_pending = false;
    comm_.wait(s.parameter_gather);
  }
  // Before anything but gather(u) reads or writes the parameters (stages 1-2; nothing elsewhere).
  void complete_parameter_gathers() {
    for (auto& s : units_) complete_parameter_gather(s);
  }

  // The end of an evaluation() scope: releases what it left gathered (a local operation).
  void end_evaluation() noexcept {
    for (auto& s : units_)
      if (s.gathered) {
        s.gathered = false;
        s.full_params.reset();
      }
    evaluating_ = false;
  }

  // ---- ZeRO++ (engine_options::zeropp, engine/zeropp.hpp) --------------------------------------
  //
  // The protocol is unchanged: gather(u) still all-gathers (quantized under qwZ, from the secondary
  // partition under hpZ), reduce(u) still leaves each rank its reduced slice (through qgZ's
  // all-to-all), and every decision depends only on the calls, so every rank issues the same
  // collectives in the same order on each communicator.

  // What the backend and the system must offer for each technique (checked at construction, so an
  // engine on a backend without them compiles and refuses only the options it cannot serve).
  static constexpr bool has_index_loop =
      requires(const system& s, std::size_t n, quant::scale_rule<float> r) { s.for_each_index(n, r); };
  static constexpr bool can_qwz = comm::moves_bytes<Comm> && has_index_loop;
  static constexpr bool can_split = comm::splittable<Comm>;

  const zeropp_options& zpp() const { return options_.zeropp; }
  bool zeropp_on() const { return zpp().qwz || zpp().qgz || zpp().hpz; }
  int node_size() const { return zpp().node_size == 0 ? layout_.ranks() : zpp().node_size; }
  // qgZ in two hops: nodes of more than one rank, more than one node.
  bool hierarchical() const { return ctx_.hierarchical(); }
  std::size_t secondary_elements() const {
    return zpp().hpz ? layout_.padded() / static_cast<std::size_t>(node_size()) : 0;
  }

  // Before anything is allocated: options that mean nothing for this stage or world, formats the
  // quantizer cannot represent, backends without what a technique needs.
  void check_zeropp() const {
    const zeropp_options& z = zpp();
    const int n = layout_.ranks();
    const char* where = "engine_options::zeropp";
    ZERO_CHECK(z.node_size >= 0 && (z.node_size == 0 || n % z.node_size == 0), invalid_argument, "rank ", rank_, ": ",
               where, ": node_size ", z.node_size, " does not divide the world size ", n,
               " (a node holds node_size consecutive ranks; 0: one node holds them all)");
    ZERO_CHECK(!z.qwz || P::shards_parameters, invalid_argument, "rank ", rank_, ": ", where,
               ": qwZ quantizes the parameter all-gathers of stage 3; ZeRO stage ", P::stage, " gathers no parameters");
    ZERO_CHECK(!z.hpz || P::shards_parameters, invalid_argument, "rank ", rank_, ": ", where,
               ": hpZ keeps a secondary partition of stage 3's sharded parameters; ZeRO stage ", P::stage,
               " does not shard them");
    ZERO_CHECK(!z.qgz_error_feedback || z.qgz, invalid_argument, "rank ", rank_, ": ", where,
               ": qgz_error_feedback compensates qgZ's quantization: it needs qgz");
    ZERO_CHECK(!z.hpz || (z.node_size > 0 && z.node_size < n), invalid_argument, "rank ", rank_, ": ", where,
               ": hpZ needs nodes smaller than the world (node_size in [1, N) dividing N = ", n, "), got node_size ",
               z.node_size, ": with one node the secondary partition is the primary one");
    with_rank(rank_, [&] {
      if (z.qwz) quant::validate(z.weights, "engine_options::zeropp.weights");
    });
    ZERO_CHECK(!z.qwz || can_qwz, invalid_argument, "rank ", rank_, ": ", where,
               ": qwZ needs a backend with a byte all_gather (std::uint8_t) and a system with for_each_index");
    ZERO_CHECK(!z.hpz || can_split, invalid_argument, "rank ", rank_, ": ", where,
               ": hpZ needs a backend with split (comm/split.hpp)");
  }

  // After the model states exist: tells the counters where the nodes are, and splits the backend for
  // hpZ (the node's ranks) and two-hop qgZ (the node's ranks, and the ranks of this rank's position
  // in every node). The splits are collectives on the backend, made by every rank here.
  void connect_nodes() {
    const int g = node_size();
    for (auto* c : {&comm_, &other_comm_, &control_comm_, &eval_comm_}) c->set_node_size(g);
    if (!(zpp().hpz || hierarchical())) return;
    if constexpr (can_split) {
      node_backend_ = comm_.inner().split(rank_ / g);
      node_comm_.emplace(*node_backend_);  // one node: all of its traffic is intra-node
      ctx_.node_backend = node_backend_.get();
      ctx_.node = &*node_comm_;
      if (hierarchical()) {
        cross_backend_ = comm_.inner().split(rank_ % g);
        cross_comm_.emplace(*cross_backend_);
        cross_comm_->set_node_size(1);  // one rank per node: all of it is inter-node
        ctx_.cross_backend = cross_backend_.get();
        ctx_.cross = &*cross_comm_;
      }
    }
  }

  // The protocol's traffic on every communicator it uses.
  comm::comm_stats protocol_stats() const {
    comm::comm_stats s = comm_.stats();
    if (node_comm_) s = s + node_comm_->stats();
    if (cross_comm_) s = s + cross_comm_->stats();
    return s;
  }
  std::vector<formula::unit_extent> unit_extents() const {
    std::vector<formula::unit_extent> v;
    for (std::size_t u = 0; u < units_.size(); ++u)
      v.push_back({layout_.unit(unit_id{u}).padded, spec_.units()[u].gathers});
    return v;
  }
  formula::traffic_options traffic_options() const {
    return {zpp().qwz, zpp().qgz, zpp().hpz, zpp().weights, zpp().gradients, node_size()};
  }

  // Transient bytes a gather of unit ul holds until it completes: the unit, and qwZ's wire.
  std::size_t gather_bytes(const unit_layout& ul, bool secondary) const {
    const std::size_t wire = zpp().qwz && !secondary ? static_cast<std::size_t>(layout_.ranks()) *
                                                           quant::wire_bytes(ul.shard, zpp().weights)
                                                     : 0;
    return ul.padded * sizeof(param_type) + wire;
  }
  // Whether the recorded order gathers unit v before position `pos` (then that gather reads hpZ's secondary).
  bool gathered_before(std::size_t v, std::size_t pos) const {
    for (std::size_t i = 0; i < pos && i < gather_order_.size(); ++i)
      if (gather_order_[i] == v) return true;
    return false;
  }

  comm::scoped_label<Comm> label_on(Comm& c, const char* phase, unit_id u) {
    return comm::scoped_label<Comm>(c, phase, spec_.units()[u.index].name);
  }

  // Starts stage 3's all-gather of unit u into `full` (padded elements) on `via`: the exact shards;
  // under qwZ this rank's shard quantized into its slot of `wire` (N slots) and the wire all-gathered
  // in place; under hpZ's `secondary`, the node's secondary shards on node_comm_ (exact).
  request start_gather(comm::counted<Comm>& via, unit_id u, param_type* full, buffer<std::uint8_t, system>& wire,
                       bool secondary) {
    const unit_layout& ul = layout_.unit(u);
    if (secondary) {
      const std::size_t part = ul.padded / static_cast<std::size_t>(node_size());
      const auto l = label_on(*node_backend_, "gather", u);
      return node_comm_->start_all_gather(secondary_.data() + ul.offset / static_cast<std::size_t>(node_size()), full,
                                          part);
    }
    const auto l = label("gather", u);
    if (!zpp().qwz) return via.start_all_gather(shard_of_params(ul, u), full, ul.shard);
    if constexpr (can_qwz) {
      const std::size_t wb = quant::wire_bytes(ul.shard, zpp().weights), at = static_cast<std::size_t>(rank_) * wb;
      wire = buffer<std::uint8_t, system>(static_cast<std::size_t>(layout_.ranks()) * wb, mem_category::transient, acct_);
      quant::quantize(sys_, shard_of_params(ul, u), ul.shard, zpp().weights, wire.data() + at);
      return via.start_all_gather(wire.data() + at, wire.data(), wb);
    }
    fail(error_kind::invalid_argument, where(u), "qwZ on a backend without byte collectives");
  }
  // Completes start_gather: waits; under qwZ dequantizes every rank's slice, this rank's included,
  // from the same bytes (so every rank holds the same values); with `fill` (a gather in a step) and
  // hpZ, keeps this rank's part of the node's partition as its secondary shard.
  void finish_gather(comm::counted<Comm>& via, request& r, unit_id u, param_type* full,
                     buffer<std::uint8_t, system>& wire, bool secondary, bool fill) {
    const unit_layout& ul = layout_.unit(u);
    if (secondary) return node_comm_->wait(r);
    via.wait(r);
    if (!wire.empty()) {
      if constexpr (can_qwz) {
        const std::size_t wb = quant::wire_bytes(ul.shard, zpp().weights);
        for (std::size_t k = 0; k < static_cast<std::size_t>(layout_.ranks()); ++k)
          quant::dequantize(sys_, wire.data() + k * wb, ul.shard, zpp().weights, full + k * ul.shard);
      }
      wire.reset();
    }
    if (fill && zpp().hpz) {
      const auto g = static_cast<std::size_t>(node_size());
      const std::size_t part = ul.padded / g, local = static_cast<std::size_t>(rank_) % g;
      sys_.copy(secondary_.data() + ul.offset / g, full + local * part, part * sizeof(param_type));
      units_[u.index].secondary_ready = true;
    }
  }

  // A backend whose system carries state (a device stream) hands it out; host systems are stateless.
  static system system_of(Comm& c) {
    if constexpr (requires { c.make_system(); }) return c.make_system();
    else return system{};
  }

  // Names the collectives issued while the returned guard lives ("reduce unit 'fc2'") for backends
  // that put labels in their fingerprints (comm::threads, comm::mpi); a no-op for the others.
  comm::scoped_label<Comm> label(const char* phase, unit_id u) {
    return comm::scoped_label<Comm>(comm_.inner(), phase, spec_.units()[u.index].name);
  }

  std::string where(unit_id u) const {
    return detail::concat("rank ", rank_, ", unit '", spec_.units()[u.index].name, "': ");
  }
  unit_state& state(unit_id u, const char* call) {
    ZERO_CHECK(u.index < units_.size(), invalid_argument, "rank ", rank_, ": ", call, " of unit index ", u.index,
               ", but the model has ", units_.size(), " units");
    return units_[u.index];
  }

  param_type* full_params_of(unit_id u) {
    if constexpr (P::shards_parameters) {
      if (persistent(u)) return persistent_.data() + persistent_at_[u.index];
      return units_[u.index].full_params.data();
    } else {
      return params_.data() + layout_.unit(u).offset;
    }
  }
  grad_type* full_grads_of(unit_id u) {
    return with_reducer([&](auto& r) { return r.unit_gradient(u); });
  }

  // ---- gradient accumulation and norms ----

  // The optimizer's hyper-parameters (its validate(), where it has one) and the options, checked
  // before anything is allocated or the loss scaler is built; errors name the rank.
  static Opt validated(const Opt& opt, int rank) {
    with_rank(rank, [&] { validate_optimizer(opt); });
    return opt;
  }
  static engine_options validated(const engine_options& o, int rank) {
    ZERO_CHECK(o.micro_batches >= 1, invalid_argument, "rank ", rank,
               ": engine_options: micro_batches must be >= 1, got ", o.micro_batches);
    ZERO_CHECK(o.accumulate == accumulation::reduce_each_micro_batch || o.accumulate == accumulation::local_then_reduce,
               invalid_argument, "rank ", rank, ": engine_options: accumulate is not an accumulation value (",
               static_cast<int>(o.accumulate), ")");
    ZERO_CHECK(o.accumulate != accumulation::local_then_reduce || !P::shards_gradients, invalid_argument, "rank ",
               rank, ": local_then_reduce accumulation keeps every unit's full gradient until its single reduce; ZeRO "
               "stage ", P::stage, " shards gradients, so use reduce_each_micro_batch");
    ZERO_CHECK(!o.fp32_grad_accumulation || P::shards_gradients, invalid_argument, "rank ", rank,
               ": fp32_grad_accumulation applies to the gradient shard of stages 2 and 3; stage ", P::stage,
               " keeps full gradients in the precision's gradient type");
    ZERO_CHECK(!o.reproducible || o.accumulate == accumulation::reduce_each_micro_batch, invalid_argument, "rank ",
               rank,
               ": engine_options::reproducible sums every micro-batch's gradient exactly, so each must be "
               "reduced on its own: local_then_reduce would add them in fp32 first (use reduce_each_micro_batch)");
    ZERO_CHECK(!o.reproducible || !o.fp32_grad_accumulation, invalid_argument, "rank ", rank,
               ": engine_options::reproducible already keeps the gradient sum exact and rounds it once to fp32; "
               "fp32_grad_accumulation does not apply (turn it off)");
    with_rank(rank, [&] {
      detail::require_non_negative("engine_options", "clip_norm", o.clip_norm);
      // Checked whether or not the precision scales the loss: a bad value is a mistake either way.
      validate(o.loss_scale);
    });
    ZERO_CHECK(o.init_chunk_elements > 0, invalid_argument, "rank ", rank,
               ": engine_options: init_chunk_elements must be > 0, got ", o.init_chunk_elements);
    ZERO_CHECK(o.prefetch_units >= 0, invalid_argument, "rank ", rank,
               ": engine_options: prefetch_units must be >= 0 (0: no prefetch), got ", o.prefetch_units);
    ZERO_CHECK(o.reduces_in_flight >= 1, invalid_argument, "rank ", rank,
               ": engine_options: reduces_in_flight must be >= 1, got ", o.reduces_in_flight);
    ZERO_CHECK(o.persist_below_elements == 0 || !(o.zeropp.qwz || o.zeropp.qgz || o.zeropp.hpz), invalid_argument,
               "rank ", rank, ": engine_options: persist_below_elements (stage 3's persistent units) and ZeRO++ "
               "(zeropp.qwz, qgz, hpz) cannot be combined yet: a persistent unit's gathers and its traffic would "
               "bypass the quantized and hierarchical paths; set one of them");
    // qgZ replaces the exact sum by a quantized one, and qwZ quantizes each rank's shard (blocks that
    // move with N): neither keeps the bits at another world size. hpZ is exact but not yet carried
    // through the binned path and its formulas.
    ZERO_CHECK(!o.reproducible || !(o.zeropp.qwz || o.zeropp.qgz || o.zeropp.hpz), invalid_argument, "rank ", rank,
               ": engine_options: reproducible and ZeRO++ (zeropp.qwz, qgz, hpz) cannot be combined: qgZ's quantized "
               "gradient sum and qwZ's shard-wise quantization depend on the world size, and hpZ is not yet carried "
               "through the binned reduction; set one of them");
    const offload_options& f = o.offload;
    ZERO_CHECK(f.tier == offload_tier::none || f.tier == offload_tier::host || f.tier == offload_tier::disk,
               invalid_argument, "rank ", rank, ": engine_options: offload.tier is not an offload_tier value (",
               static_cast<int>(f.tier), ")");
    ZERO_CHECK(f.slice_elements > 0 && f.slice_elements % 1024 == 0, invalid_argument, "rank ", rank,
               ": engine_options: offload.slice_elements must be a positive multiple of 1024 (4 KiB of fp32, the "
               "unit of direct I/O), got ", f.slice_elements);
    ZERO_CHECK(f.tier != offload_tier::disk || !f.directory.empty(), invalid_argument, "rank ", rank,
               ": engine_options: offload to disk needs offload.directory, an existing directory on a local file "
               "system");
    return o;
  }
  // Runs f, prefixing "rank R: " to the message of a zero::error it throws.
  template <class F>
  static void with_rank(int rank, F f) {
    try {
      f();
    } catch (const error& e) {
      throw error(e.kind(), detail::concat("rank ", rank, ": ", e.what()));
    }
  }
  int reduces_per_step() const {
    return options_.accumulate == accumulation::reduce_each_micro_batch ? options_.micro_batches : 1;
  }
  std::string reduce_count_text(int done) const {
    if (reduces_per_step() == 1) return "";
    return detail::concat(": ", done, " of ", reduces_per_step(), " micro-batch reduces");
  }
  // The reproducible mode always computes it: it is the overflow check of an exact sum.
  bool needs_norm() const {
    return Prec::separate_master || options_.clip_norm > 0.0f || options_.compute_grad_norm || options_.reproducible;
  }

  // Pointer to element `i` (unit-local) of a buffer that holds either every unit in full or only
  // this rank's slices; only called for elements the buffer holds.
  template <class T, bool Sharded>
  T* element(const buffer<T, system>& b, const unit_layout& ul, std::size_t i) const {
    return b.data() + element_index(ul, i, Sharded, rank_);
  }

  void state_check(unit_id u) const {
    ZERO_CHECK(u.index < units_.size(), invalid_argument, "rank ", rank_, ": unit index ", u.index,
               " is out of range (the model has ", units_.size(), " units)");
  }
  const unit_layout& checked_state_range(unit_id u, range r, const char* call) const {
    const range held = held_range(u);
    ZERO_CHECK(r.empty() || (r.begin >= held.begin && r.end <= held.end), invalid_argument, where(u), call,
               " of elements [", r.begin, ", ", r.end, ") outside the held range [", held.begin, ", ", held.end, ")");
    return layout_.unit(u);
  }
  // Where the state arrays (master weights, slots: store_) keep unit-local element i, which this
  // rank must hold; and the parameter and gradient of element i in the system's memory.
  std::size_t state_index(const unit_layout& ul, std::size_t i) const {
    return element_index(ul, i, P::shards_optimizer_states, rank_);
  }
  param_type* param_element(const unit_layout& ul, std::size_t i) const {
    return element<param_type, P::shards_parameters>(params_, ul, i);
  }
  static constexpr int slot_array(int k) { return master_arrays + k; }
  // The rank's held state per unit in the state arrays' index space: [begin, end) of its owned
  // (padded) slice, or of the whole unit where states are replicated. Units follow each other.
  range state_span(unit_id u) const {
    const unit_layout& ul = layout_.unit(u);
    const range held = P::shards_optimizer_states ? layout_.owned(u, rank_) : range{0, ul.padded};
    const std::size_t b = state_index(ul, held.begin);
    return {b, b + held.size()};
  }
  // The unit-local elements the optimizer updates: the owned, unpadded slice, or the whole unit.
  range update_range(unit_id u) const {
    return P::shards_optimizer_states ? layout_.owned_real(u, rank_) : range{0, layout_.unit(u).numel};
  }
  std::size_t held_real_elements() const {
    std::size_t n = 0;
    for (std::size_t u = 0; u < units_.size(); ++u) n += update_range(unit_id{u}).size();
    return n;
  }
  bool on_disk() const { return options_.offload.tier == offload_tier::disk; }

  // The optimizer over elements [i, i + n) of unit u (within update_range(u)), whose master weights
  // and slots are at `arrays` (the state arrays' slice that holds them, element i first): in the
  // system's memory (no offload), or in host memory. The gradient is the rank-ordered sum divided by
  // N x loss scale, then multiplied by the clipping coefficient when clipping applies; the same rule
  // whichever memory runs it, so offloading changes no bit.
  void update_segment(unit_id u, std::size_t i, std::size_t n, float* const* arrays,
                      const typename Opt::step_constants& c, float divisor, float coef) {
    const unit_layout& ul = layout_.unit(u);
    param_type* p = param_element(ul, i);
    float* st[Opt::slots > 0 ? Opt::slots : 1] = {};
    for (int k = 0; k < Opt::slots; ++k) st[k] = arrays[slot_array(k)];
    const bool sharded = with_reducer([](const auto& r) { return r.sharded(); });
    with_reducer([&](const auto& r) { r.with_gradients([&]<class T>(const T* store) {
      const T* g = store + element_index(ul, i, sharded, rank_);
      if (!store_.offloaded()) {
        float* w = Prec::separate_master ? arrays[0] : reinterpret_cast<float*>(p);
        elementwise::update<Opt>(sys_, c, g, divisor, coef, w, st, Prec::separate_master ? p : nullptr, n);
      } else if constexpr (host_memory_system) {
        // Host memory all of it: the host loop updates in place.
        float* w = Prec::separate_master ? arrays[0] : reinterpret_cast<float*>(p);
        elementwise::update<Opt>(offload::host_loop{}, c, g, divisor, coef, w, st, Prec::separate_master ? p : nullptr, n);
      } else {
        // A device system: the gradients come to host memory, the host loop updates, and the new
        // parameters (the weights themselves in fp32) go back.
        staged_update(g, p, n, arrays, st, c, divisor, coef);
      }
    }); });
  }
  template <class T>
  void staged_update(const T* g, param_type* p, std::size_t n, float* const* arrays, float* const* st,
                     const typename Opt::step_constants& c, float divisor, float coef) {
    const std::size_t gb = n * sizeof(T), pb = n * sizeof(param_type);
    if (stage_g_.bytes() < gb) {
      store_.add_staging(gb - stage_g_.bytes());
      stage_g_ = offload::host_block<system>(gb);
    }
    if (stage_p_.bytes() < pb) {
      store_.add_staging(pb - stage_p_.bytes());
      stage_p_ = offload::host_block<system>(pb);
    }
    sys_.copy_to_host(stage_g_.data(), g, gb);
    auto* hp = static_cast<param_type*>(stage_p_.data());
    if constexpr (Prec::separate_master) {
      store_.count_transfer(gb, pb);
      elementwise::update<Opt>(offload::host_loop{}, c, static_cast<const T*>(stage_g_.data()), divisor, coef, arrays[0],
                               st, hp, n);
    } else {
      sys_.copy_to_host(hp, p, pb);  // the fp32 weights are the parameters
      store_.count_transfer(gb + pb, pb);
      elementwise::update<Opt>(offload::host_loop{}, c, static_cast<const T*>(stage_g_.data()), divisor, coef,
                               reinterpret_cast<float*>(hp), st, static_cast<param_type*>(nullptr), n);
    }
    sys_.copy_from_host(p, hp, pb);
  }

  // Offloaded master weights into the parameters after a load: slice by slice from the tier, cast
  // on the host, copied into the system's memory (the host loop's cast rule, the device's bits).
  void cast_master_into_params() {
    if (!store_.offloaded()) {
      for (std::size_t u = 0; u < units_.size(); ++u) {
        const unit_layout& ul = layout_.unit(unit_id{u});
        const range r = held_range(unit_id{u});
        sys_.for_each(r.size(), elementwise::cast_rule{}, elementwise::out(param_element(ul, r.begin)),
                      elementwise::in(static_cast<const float*>(store_.data(0) + state_index(ul, r.begin))));
      }
      return;
    }
    std::vector<param_type> cast;
    for_each_held_segment([&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
      cast.resize(n);
      offload::host_loop::for_each(n, elementwise::cast_rule{}, elementwise::out(cast.data()),
                                   elementwise::in(static_cast<const float*>(arrays[0])));
      sys_.copy_from_host(param_element(layout_.unit(u), i), cast.data(), n * sizeof(param_type));
    }, false);
  }

  // Calls f(u, i, n, arrays) for the elements [i, i + n) of unit u that the store's slices hold, in
  // order: every held element (held_range), arrays pointing at element i of each state array. Each
  // unit's segments end before the next unit's begin; `done(u)` is called once per unit in unit
  // order, as soon as its last segment is through (with its slice not yet written back).
  template <class F, class Done>
  void for_each_held_segment(F f, bool write_back, Done done) {
    std::size_t next = 0;  // the first unit not yet done
    store_.stream(
        [&](std::size_t begin, std::size_t end, float* const* arrays) {
          for (std::size_t u = next; u < units_.size(); ++u) {
            const range span = state_span(unit_id{u});
            if (span.begin >= end) break;
            const range r = update_range(unit_id{u});
            const unit_layout& ul = layout_.unit(unit_id{u});
            if (!r.empty()) {
              const std::size_t s0 = state_index(ul, r.begin);
              const std::size_t lo = std::max(s0, begin), hi = std::min(s0 + r.size(), end);
              if (lo < hi) {
                float* at[offload::state_store<system>::max_arrays] = {};
                for (int a = 0; a < state_arrays; ++a) at[a] = arrays[a] + (lo - begin);
                f(unit_id{u}, r.begin + (lo - s0), hi - lo, at);
              }
            }
            if (span.end <= end && next == u) {
              done(unit_id{u});
              next = u + 1;
            }
          }
        },
        write_back);
    // Units with nothing held (none here: every unit has a span) are done at the end, in order.
    for (; next < units_.size(); ++next) done(unit_id{next});
  }
  template <class F>
  void for_each_held_segment(F f, bool write_back) {
    for_each_held_segment(f, write_back, [](unit_id) {});
  }

  // Stores initial values of the unit-local elements r (values[i] is element r.begin + i) into
  // whatever part of them params and master this rank holds.
  void store(unit_id u, range r, const float* values) {
    const unit_layout& ul = layout_.unit(u);
    const range own = layout_.owned(u, rank_);
    auto put = [&](auto& buf, bool sharded) {
      using T = std::remove_pointer_t<decltype(buf.data())>;
      const range seg = sharded ? intersect(r, own) : r;
      if (seg.empty()) return;
      T* dst = sharded ? this->template element<T, true>(buf, ul, seg.begin)
                        : this->template element<T, false>(buf, ul, seg.begin);
      const float* src = values + (seg.begin - r.begin);
      if constexpr (std::same_as<T, float>) {
        sys_.copy_from_host(dst, src, seg.size() * sizeof(T));
      } else {
        std::vector<T> cast(seg.size());
        for (std::size_t i = 0; i < seg.size(); ++i) cast[i] = static_cast<T>(src[i]);
        sys_.copy_from_host(dst, cast.data(), seg.size() * sizeof(T));
      }
    };
    put(params_, P::shards_parameters);
    if constexpr (Prec::separate_master) {
      const range seg = P::shards_optimizer_states ? intersect(r, own) : r;
      if (!seg.empty()) store_.write(sys_, 0, state_index(ul, seg.begin), seg.size(), values + (seg.begin - r.begin));
    }
    if constexpr (P::shards_parameters) {
      // A persistent unit's whole copy takes every value given; a rank given only its own slice (the
      // range form) gathers the rest afterwards (refresh_whole_parameters).
      if (persistent(u) && !r.empty()) {
        std::vector<param_type> cast(r.size());
        for (std::size_t i = 0; i < r.size(); ++i) cast[i] = static_cast<param_type>(values[i]);
        sys_.copy_from_host(persistent_.data() + persistent_at_[u.index] + r.begin, cast.data(),
                            r.size() * sizeof(param_type));
      }
    }
  }

  // every_rank initialization: all-gathers every rank's per-tensor hashes (run_hash64 of the fp32
  // values it produced; two doubles of 32 bits each per hash, exact whatever its value) on the set-up
  // counter, comm().other. Every rank sees the same table and so decides the same: all return, or all
  // throw invalid_argument naming the first tensor, in declaration order, that some rank produced
  // differently from rank 0, and those ranks. The wire is taken from the system directly, outside
  // memory() (as a checkpoint's control collectives are): 16 bytes per tensor per rank, freed before
  // initialize() returns, so memory() and plan() keep describing the model states and the protocol.
  void check_init_agreement(const std::vector<std::uint64_t>& hashes) {
    if (hashes.empty()) return;  // no tensors: the same on every rank
    const std::size_t n = 2 * hashes.size(), ranks = static_cast<std::size_t>(layout_.ranks());
    const std::size_t mine = n * static_cast<std::size_t>(rank_), bytes = n * ranks * sizeof(double);
    std::vector<double> table(n * ranks);
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      table[mine + 2 * i] = static_cast<double>(hashes[i] >> 32);
      table[mine + 2 * i + 1] = static_cast<double>(hashes[i] & 0xffffffffu);
    }
    struct wire_free {
      std::size_t bytes;
      void operator()(double* p) const { system::deallocate(p, bytes); }
    };
    const std::unique_ptr<double, wire_free> wire(static_cast<double*>(system::allocate(bytes)), wire_free{bytes});
    sys_.copy_from_host(wire.get() + mine, table.data() + mine, n * sizeof(double));
    {
      const comm::scoped_label<Comm> l(comm_.inner(), "init check");
      other_comm_.all_gather(wire.get() + mine, wire.get(), n);
    }
    sys_.copy_to_host(table.data(), wire.get(), bytes);
    const auto hash_of = [&](std::size_t r, std::size_t i) {
      return (static_cast<std::uint64_t>(table[r * n + 2 * i]) << 32) |
             static_cast<std::uint64_t>(table[r * n + 2 * i + 1]);
    };
    std::size_t i = 0;
    for (const unit_spec& us : spec_.units()) {
      for (const tensor_spec& ts : us.tensors) {
        std::string differing;
        std::size_t first = 0;
        for (std::size_t r = 1; r < ranks; ++r)
          if (hash_of(r, i) != hash_of(0, i)) {
            differing += detail::concat(differing.empty() ? "" : ", ", r);
            if (first == 0) first = r;
          }
        ZERO_CHECK(differing.empty(), invalid_argument, "rank ", rank_, ": initialize (init_source::every_rank): unit '",
                   us.name, "', tensor '", ts.name, "': rank(s) ", differing,
                   " produced other values than rank 0 (hash of the values: ", hex(hash_of(0, i)), " on rank 0, ",
                   hex(hash_of(first, i)), " on rank ", first, "); every_rank needs an init function that gives "
                   "every rank the same values (deterministic, not seeded by rank), or use "
                   "init_source::broadcast_from_rank0. The parameters now disagree across ranks: initialize again "
                   "or load a checkpoint before training");
        ++i;
      }
    }
  }
  // ---- the ranks' agreement on their settings (agreement.hpp) ----

  // At construction: every rank's engine_options and optimizer hyper-parameters, all-gathered on the
  // backend itself (set-up, outside comm() and memory()); every rank throws invalid_argument naming
  // each field that differs and the ranks it differs on. Later changes (set_optimizer) are checked by
  // the step's fingerprint.
  void check_settings_agree() {
    ZERO_CHECK(layout_.ranks() <= detail::max_fingerprint_ranks, invalid_argument, "rank ", rank_,
               ": engine: ", layout_.ranks(),
               " ranks, more than the 2^21 whose settings fingerprint the step checks exactly");
    fingerprint_optimizer();
    if (layout_.ranks() == 1) return;
    detail::settings all = detail::options_settings(options_);
    all.append(detail::optimizer_settings(opt_));
    const std::string d = detail::disagreement(all, gather_words(all.words(), "settings check"), layout_.ranks());
    ZERO_CHECK(d.empty(), invalid_argument, "rank ", rank_, ": engine: the ranks' settings differ: ", d,
               " (every rank must build its engine with the same engine_options and optimizer hyper-parameters)");
  }
  void fingerprint_optimizer() {
    optimizer_hash_ = detail::hash_of(detail::optimizer_settings(opt_));
    detail::fingerprint_terms(optimizer_hash_, fingerprint_.data());
  }
  // The optimizer's fingerprint rides on the norm's all-reduce where the step makes one (stages 1-3
  // computing the norm); elsewhere (stage 0, or no norm) on an all-reduce of its own, started at the
  // step's first reduce() (nonblocking where the backend overlaps) and completed by step().
  bool separate_agreement_check() const { return layout_.ranks() > 1 && !(P::shards_optimizer_states && needs_norm()); }
  void start_agreement_check() {
    if (agreement_started_ || !separate_agreement_check()) return;
    agreement_started_ = true;
    double* wire = agreement_host_.data();  // host memory, or a wire taken from the system once
    if constexpr (!host_memory_system) {
      if (!agreement_wire_) agreement_wire_.reset(static_cast<double*>(system::allocate(sizeof fingerprint_)));
      wire = agreement_wire_.get();
    }
    sys_.copy_from_host(wire, fingerprint_.data(), sizeof fingerprint_);
    const comm::scoped_label<Comm> l(comm_.inner(), "settings check");
    agreement_request_ = control_comm_.start_all_reduce(wire, wire, fingerprint_.size(), reduce_op::sum);
  }
  void finish_agreement_check() {
    if (!agreement_started_) return;
    agreement_started_ = false;
    control_comm_.wait(agreement_request_);
    std::array<double, detail::fingerprint_words> sums{};
    sys_.copy_to_host(sums.data(), host_memory_system ? agreement_host_.data() : agreement_wire_.get(), sizeof sums);
    if (!detail::fingerprints_agree(fingerprint_.data(), sums.data(), layout_.ranks())) optimizers_disagree();
  }
  // Reached by every rank of a step whose fingerprints differ (they all see the same sums): gathers
  // the hyper-parameters to name the fields and ranks, and throws before any rank updates.
  [[noreturn]] void optimizers_disagree() {
    const detail::settings s = detail::optimizer_settings(opt_);
    const std::string d = detail::disagreement(s, gather_words(s.words(), "settings check"), layout_.ranks());
    fail(error_kind::invalid_argument, "rank ", rank_, ": step(): the ranks' optimizer hyper-parameters differ: ", d,
         "; set_optimizer() and set_learning_rate() must make the same change on every rank (no rank applied this "
         "step's update)");
  }
  // Every rank's words in rank order, all-gathered on the backend itself (through the system's memory
  // where it is not host memory), outside comm() and memory(): construction and failure paths only.
  std::vector<std::uint64_t> gather_words(const std::vector<std::uint64_t>& mine, const char* phase) {
    const std::size_t n = mine.size(), me = static_cast<std::size_t>(rank_);
    std::vector<std::uint64_t> all(n * static_cast<std::size_t>(layout_.ranks()));
    if constexpr (host_memory_system) {
      std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(me * n));
      auto* words = reinterpret_cast<std::int64_t*>(all.data());  // the signed view of the same words
      const comm::scoped_label<Comm> l(comm_.inner(), phase);
      comm_.inner().all_gather(words + me * n, words, n);
      return all;
    }
    const std::size_t bytes = all.size() * sizeof(std::int64_t);
    const std::unique_ptr<std::int64_t, system_free> wire(static_cast<std::int64_t*>(system::allocate(bytes)),
                                                          system_free{bytes});
    sys_.copy_from_host(wire.get() + me * n, mine.data(), n * sizeof(std::int64_t));
    {
      const comm::scoped_label<Comm> l(comm_.inner(), phase);
      comm_.inner().all_gather(wire.get() + me * n, wire.get(), n);
    }
    sys_.copy_to_host(all.data(), wire.get(), bytes);
    return all;
  }
  // Frees memory taken from the system directly (outside memory()); system::deallocate takes the size.
  struct system_free {
    std::size_t bytes = 0;
    void operator()(void* p) const { system::deallocate(p, bytes); }
  };

  static std::string hex(std::uint64_t h) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int k = 15; k >= 0; --k, h >>= 4) s[static_cast<std::size_t>(k)] = digits[h & 0xf];
    return s;
  }

  std::size_t largest_tensor() const {
    std::size_t m = 0;
    for (const auto& us : spec_.units())
      for (const auto& ts : us.tensors) m = std::max(m, ts.numel);
    return m;
  }

  // Unit u's master weights, unpadded, into host memory at out (all-gathered where sharded).
  void copy_full_params(unit_id u, float* out) {
    const unit_layout& ul = layout_.unit(u);
    const std::size_t own = static_cast<std::size_t>(rank_) * ul.shard;
    if constexpr (P::shards_optimizer_states) {
      buffer<float, system> full(ul.padded, mem_category::transient, acct_);
      if constexpr (Prec::separate_master) {
        // This rank's master slice into its place in the buffer (from any tier), then in place.
        std::vector<float> mine(ul.shard);
        store_.read(sys_, 0, state_index(ul, own), ul.shard, mine.data());
        sys_.copy_from_host(full.data() + own, mine.data(), ul.shard * sizeof(float));
        const auto l = label("full_params", u);
        other_comm_.all_gather(full.data() + own, full.data(), ul.shard);
      } else {
        const auto l = label("full_params", u);
        other_comm_.all_gather(param_element(ul, own), full.data(), ul.shard);
      }
      sys_.copy_to_host(out, full.data(), ul.numel * sizeof(float));
    } else if constexpr (Prec::separate_master) {
      store_.read(sys_, 0, ul.offset, ul.numel, out);
    } else {
      sys_.copy_to_host(out, params_.data() + ul.offset, ul.numel * sizeof(float));
    }
  }

  // Before anything is allocated: refuses model states that cannot fit (memory_check.hpp). A system
  // that reports its free memory (sys::cuda) is read by every rank before any rank allocates (the
  // barrier), so ranks sharing one device see the same free bytes, not their peers' model states.
  void check_memory(const model_state_plan& need) {
    std::optional<memory_info> m;
    if constexpr (requires(const system& s) { { s.available() } -> std::convertible_to<memory_info>; }) {
      const std::uint64_t free = sys_.available().free;
      other_comm_.barrier();
      // Read again for the sharers: past the barrier every rank sharing the memory exists.
      m = sys_.available();
      m->free = free;
    }
    const bool offloaded = options_.offload.tier != offload_tier::none;
    // What the offload tier holds in this memory for stage s's held elements (Psi in stage 0, Psi/N after).
    const auto tier_bytes = [&](int s, const offload_options& o) -> std::uint64_t {
      const std::size_t held = s >= 1 ? layout_.shard_total() : layout_.padded();
      return offload::state_store<system>::counted_host_bytes(o, state_arrays, held);
    };
    std::array<std::uint64_t, 4> stage_bytes{};
    for (int s = 0; s < 4; ++s) {
      formula::state_sizes z = state_sizes();
      if (offloaded) z.k_bytes = 0;  // the other stages with the same offload
      std::uint64_t& b = stage_bytes[static_cast<std::size_t>(s)];
      if (options_.reproducible) {
        b = formula::reproducible_model_state_bytes(s, layout_.padded(), layout_.ranks(), z, s == 3 ? persistent_elems_ : 0);
      } else {
        if (s < 2) z.grad_bytes = sizeof(grad_type);  // fp32 gradient accumulation exists in stages 2-3 only
        b = formula::model_state_bytes(s, layout_.padded(), layout_.ranks(), z, s == 3 ? persistent_elems_ : 0);
      }
      if (offloaded) b += tier_bytes(s, options_.offload);
    }
    // Without offload: what the master weights and slots would cost offloaded (on a CPU system the disk
    // tier, whose slices and checksums stay in this memory; on a device system host memory). A small
    // state is staged whole with the default slice: then the smallest slice is suggested, also to an
    // engine that offloads to disk already.
    offload_alternative alternative;
    const bool disk = options_.offload.tier == offload_tier::disk;
    if (state_arrays > 0 && (!offloaded || (disk && options_.offload.slice_elements > 1024))) {
      offload_options o = options_.offload;
      if (!offloaded) o.tier = host_memory_system ? offload_tier::disk : offload_tier::host;
      for (std::size_t slice : {offloaded ? std::size_t{1024} : o.slice_elements, std::size_t{1024}}) {
        o.slice_elements = slice;
        alternative = {to_string(o.tier), 0, tier_bytes(P::stage, o), slice};
        alternative.bytes = need.params + need.grads + alternative.staging;
        if (alternative.bytes >= need.total()) alternative.tier.clear();  // no better than what was asked
        if (detail::model_states_fit(alternative.bytes, options_.memory_limit_bytes, m)) break;
      }
    }
    detail::check_model_states_fit(rank_, P::stage, layout_.ranks(), need, options_.memory_limit_bytes, m, stage_bytes,
                                   alternative);
  }

  memory_accounting acct_;  // first: every buffer below reports to it and must die before it
  system sys_;              // where the buffers live and the element-wise loops run
  comm::counted<Comm> comm_;        // the protocol's traffic, what the formulas count
  comm::counted<Comm> other_comm_;  // set-up and consolidation traffic
  comm::counted<Comm> control_comm_;  // the step's norm all-reduce and the optimizer's fingerprint
  comm::counted<Comm> eval_comm_;     // gathers inside evaluation() scopes
  // ZeRO++ (engine_options::zeropp): the node's ranks (hpZ's secondary gathers, qgZ's first hop) and
  // the ranks of this rank's position in every node (qgZ's second hop), split from the backend at
  // construction; their traffic is protocol traffic (protocol_stats).
  std::unique_ptr<Comm> node_backend_, cross_backend_;
  std::optional<comm::counted<Comm>> node_comm_, cross_comm_;
  const model_spec spec_;
  const zero::layout layout_;
  Opt opt_;
  engine_options options_;
  loss_scaler scaler_;
  int rank_;
  buffer<param_type, system> params_;
  // The fp32 state arrays: the master weights (when kept apart from the parameters), then one per
  // optimizer slot, in the offload tier's memory (the system's own without offload). Mutable: a
  // read of the disk tier counts its bytes.
  static constexpr int master_arrays = Prec::separate_master ? 1 : 0;
  static constexpr int state_arrays = master_arrays + Opt::slots;
  mutable offload::state_store<system> store_;
  offload::host_block<system> stage_g_, stage_p_;  // a device system's operands of an offloaded update
  static constexpr bool host_memory_system = requires { requires system::host_addressable; };
  // Stage 3's persistent units (persist_below_elements): their whole parameters, and where each
  // unit's copy starts in it (not_persistent: gathered on demand).
  static constexpr std::size_t not_persistent = static_cast<std::size_t>(-1);
  buffer<param_type, system> persistent_;
  std::vector<std::size_t> persistent_at_;
  std::uint64_t persistent_elems_ = 0;
  buffer<param_type, system> secondary_;  // hpZ: the parameters partitioned within the node (Psi / node_size)
  std::vector<unit_state> units_;  // after the buffers: its requests wait before the buffers are freed
  // The gradient reducer the options chose (engine/reduce/), over the engine's services.
  reduce_context ctx_{sys_, acct_, layout_, spec_, options_, rank_, comm_, control_comm_, overlap_};
  reduce::reducer_variant<reduce_context> reducer_;
  std::uint64_t step_ = 0, skipped_ = 0;
  comm::comm_stats at_step_start_, last_step_;
  bool evaluating_ = false;     // inside an evaluation() scope
  bool step_started_ = false;   // a gather, grads or reduce since the last step() (outside evaluation)
  // Overlap (engine_options::overlap): stage 3's prefetch order (the reducer keeps its reduces in flight).
  std::vector<std::size_t> gather_order_;  // units in the order the last step gathered them
  std::vector<std::size_t> step_order_;    // the same for the step under way
  std::size_t next_prefetch_ = 0;          // the position in gather_order_ of the next prefetch
  bool order_holds_ = true;                // this step has followed gather_order_ so far
  overlap_report overlap_;
  // The optimizer's hash and fingerprint terms (agreement.hpp), and the separate check's wire and
  // request (declared after the wire: destroyed, and so waited for, first).
  std::uint64_t optimizer_hash_ = 0;
  std::array<double, detail::fingerprint_words> fingerprint_{};
  std::array<double, detail::fingerprint_words> agreement_host_{};
  std::unique_ptr<double, system_free> agreement_wire_{nullptr, system_free{sizeof(fingerprint_)}};
  request agreement_request_{};
  bool agreement_started_ = false;
};

}  // namespace zero
