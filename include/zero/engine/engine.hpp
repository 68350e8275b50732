// engine: one rank's ZeRO protocol (gather, release, grads, reduce, step) over four policies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zero/comm/call_label.hpp"
#include "zero/comm/counted.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/concepts/precision_policy.hpp"
#include "zero/core/formulas.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/link_formulas.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/agreement.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/formula_report.hpp"
#include "zero/engine/gather_transports.hpp"
#include "zero/engine/handles.hpp"
#include "zero/engine/init.hpp"
#include "zero/engine/initializer.hpp"
#include "zero/engine/memory_check.hpp"
#include "zero/engine/links.hpp"
#include "zero/engine/option_checks.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/protocol_ledger.hpp"
#include "zero/engine/rank_agreement.hpp"
#include "zero/engine/reduce/catalog.hpp"
#include "zero/engine/reports.hpp"
#include "zero/engine/schedule.hpp"
#include "zero/engine/state_movers.hpp"
#include "zero/engine/step_gathers.hpp"
#include "zero/engine/step_verdict.hpp"
#include "zero/engine/sweep.hpp"
#include "zero/engine/tensor_parallel.hpp"
#include "zero/engine/zeropp.hpp"
#include "zero/error.hpp"
#include "zero/offload/state_store.hpp"
#include "zero/precision/fp32.hpp"
#include "zero/precision/loss_scaler.hpp"

namespace zero {

template <Partitioner P, CommBackend Comm, Optimizer Opt, PrecisionPolicy Prec = precision::fp32>
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

  // ---- handles (engine/handles.hpp) ----------------------------------------------------------

  // An evaluation() scope: ends when destroyed (movable, not copyable); end() ends it before.
  using evaluation_scope = detail::evaluation_scope_handle<engine>;
  // A unit's gathered parameters: operator[](tensor), view(), unit(), release(); releases the unit
  // when destroyed unless released already.
  using gathered = detail::gathered_handle<engine>;
  // A unit's gradient buffers for the current step (operator[](tensor), view(), unit()); valid until
  // the unit is reduced.
  using grad_buffers = detail::grad_buffers_handle<engine>;

  engine(Comm& comm, const model_spec& spec, Opt opt = {}, engine_options options = {})
      : engine(comm, nullptr, nullptr, spec, spec, std::move(opt), options) {}

  // An engine in a tensor-parallel mesh (comm::mesh, docs/parallelism.md): ZeRO over the mesh's
  // data-parallel group, over this rank's pieces of `model` (model_spec::piece: each tp_split tensor
  // cut along its dimension, each replicated tensor whole). spec() is the pieces, model() the model.
  // The gradient norm, the skip decision, the loss scale, the optimizer and settings checks and the
  // init check are the whole mesh's (engine/tensor_parallel.hpp); the norm is computed at every step.
  // A collective on the whole mesh. At tp = 1 it is the plain engine over dp(), bit for bit.
  template <class Mesh>
    requires comm::is_mesh_over<Mesh, Comm>
  engine(Mesh& mesh, const model_spec& model, Opt opt = {}, engine_options options = {})
      : engine(mesh.dp(), mesh.shape().tp > 1 ? &mesh.tp() : nullptr, mesh.shape().tp > 1 ? &mesh.world() : nullptr,
               model.piece(mesh.shape().tp, mesh.coordinates().tp), model, std::move(opt), options) {}
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

 private:
  engine(Comm& comm, Comm* tp_group, Comm* world, const model_spec& spec, const model_spec& model, Opt opt,
         engine_options options)
      : sys_(system_of(comm)),
        links_(comm, tp_group, options.shard_group_size),
        spec_(spec),
        model_(model),
        layout_(layout::make(spec, links_.groups().size(), comm.size())),
        opt_(validated(opt, comm.rank())),
        options_(detail::checked_options<P>(options, comm.rank())),
        scaler_(Prec::loss_scaling ? options.loss_scale : loss_scale_options{.dynamic = false, .initial = 1.0f}),
        rank_(links_.groups().rank_in_group()),
        units_(spec.num_units()) {
    links_.enter(ctx_, world);  // the tensor-parallel group and the replicas' place (engine/links.hpp)
    acct_.configure(rank_, options_.memory_limit_bytes);  // every buffer below is held to the budget
    ctx_.make_room = [this](std::size_t bytes) { make_room(bytes); };
    ctx_.has_room = [this](std::size_t bytes) { return has_room(bytes); };
    reduce::accept_chosen(ctx_);  // the gradient reducer the options choose (engine/reduce/catalog.hpp)
    // ZeRO++ (engine/zeropp.hpp) changes how gathers and reduces travel, never the protocol: what the
    // backend and the system cannot serve is refused here, so an engine without them still compiles.
    detail::check_zeropp<P>(options_, layout_.ranks(), rank_, gather::quantized<context>::usable,
                            comm::splittable<Comm>);
    check_memory(formulas_.allocation());  // what the parts below will allocate, before any of it
    agreement_.check_settings(opt_);  // every rank's options and optimizer, before the model states are allocated
    param_groups_ = param_group_map::make<Opt>(spec_, layout_, options_.param_groups, rank_);  // agreed on above
    sweep_.plan_kind(param_groups_);  // the optimizer kind's refusals and plans (engine/sweep_kind.hpp), alike on every rank
    links_.connect_replicas(ctx_);  // the shard groups' split, agreed on above
    placement_.allocate();
    reducer_ = reduce::make_chosen(ctx_);  // its gradient store
    sweep_.allocate();
    links_.connect_nodes(ctx_);
  }

 public:
  // ---- set-up ------------------------------------------------------------------------------

  // Fills every tensor from fn; a collective. With every_rank, every rank produces every value, so
  // the engine then checks that they agree (check_init_agreement: one hash per tensor, all-gathered;
  // engine_options::verify_init) and throws on every rank, naming the first tensor that differs.
  void initialize(const init_fn& fn, init_source source = init_source::every_rank) {
    check_held("initialize");
    step_gathers_.complete_all();
    initializer_.whole(fn, source);
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
    check_held("initialize");
    step_gathers_.complete_all();
    initializer_.by_range(fn, source);
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
    ledger_.check_gather(u);
    const unit_layout& ul = layout_.unit(u);
    if constexpr (P::shards_parameters) {
      if (persistent(u)) {
        step_gathers_.complete(u);  // a view of the unit's persistent copy, once step()'s gather is done
      } else if (ledger_.evaluating()) {
        s.full_params = buffer<param_type, system>(ul.padded, mem_category::transient, acct_);
        buffer<std::uint8_t, system> wire;
        auto r = placement_.start_gather(links_.eval(), u, s.full_params.data(), wire, false);
        placement_.finish_gather(links_.eval(), r, u, s.full_params.data(), wire, false, false);
      } else {
        gather_in_step(u, s);
      }
    } else {
      step_gathers_.complete(u);  // the last step's all-gather of this unit, if still in flight
    }
    // Counted once it succeeded: a gather refused for memory leaves the engine as it was.
    return gathered(*this, u, ledger_.record_gather(u));
  }

  void release(unit_id u) {
    unit_state& s = state(u, "release");
    ledger_.record_release(u);
    s.full_params.reset();
  }

  // The unit's gradient buffer for this step, zero at its first use in a step; kernels write or
  // accumulate into it until reduce(u). A shared unit takes its grads() in each place it is used and
  // is reduced once: where gradients go to a transient bucket (stages 2-3, or several reduced
  // micro-batches), that bucket stays allocated from the first grads(u) to reduce(u), on top of the
  // units gathered in between (zero::plan counts it).
  grad_buffers grads(unit_id u) {
    state(u, "grads");
    ledger_.check_gradients(u, "grads");
    reducer().open(u);
    return grad_buffers(*this, u, ledger_.record_grads(u));
  }

  // Sums unit u's gradients over ranks (each rank keeps what its shard needs). Every rank calls it
  // in the same unit order, once per unit per micro-batch (reduce_each_micro_batch) or once per step.
  void reduce(unit_id u) {
    state(u, "reduce");
    ledger_.check_gradients(u, "reduce");
    reducer().open(u);  // (a reduce without grads() reduces zeros)
    agreement_.start(detail::separate_agreement_check<P, Prec>(ctx_));
    reducer().reduce(u, ledger_.record_reduce(u));
  }

  // Applies the optimizer to the owned shard and refreshes the parameters. Every unit must have been
  // reduced (M times under reduce_each_micro_batch) and released. When the global gradient norm is
  // not finite on any rank, every rank skips the update and the loss scale adjusts identically.
  step_report step() {
    check_held("step");
    ledger_.check_step();
    // Every collective of the step completes first: the norm and the update read the gradients, and
    // the update writes the parameters that a unit never gathered in this step may still be receiving.
    reducer().complete_all();
    step_gathers_.complete_all();
    schedule_.end_step();  // the next step's prefetch follows this one's gathers
    agreement_.finish(opt_);  // in a mesh, the verdict rides on the norm's exchange instead
    step_report r;
    r.loss_scale = scaler_.scale();
    const detail::step_verdict v = detail::judge_step<Prec>(ctx_, reducer(), agreement_, opt_, scaler_.scale());
    r.grad_norm = v.grad_norm;
    r.skipped = v.skipped;
    if (!r.skipped) {
      ++step_;
      const comm::comm_stats control_before = links_.control().stats();
      update_and_gather_params(group_constants(), v.divisor, v.coef);
      r.optimizer_exchange = links_.control().stats() - control_before;
    } else {
      ++skipped_;
    }
    scaler_.update(r.skipped);
    reducer().clear(!r.skipped && decltype(sweep_)::update_zeroes_gradients);
    ledger_.end_step();
    placement_.secondary_stale();  // the update changed the parameters: the next step's first gather refills it

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
    check_held("evaluation");
    ledger_.begin_evaluation();
    return evaluation_scope(*this);
  }
  bool evaluating() const { return ledger_.evaluating(); }

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
    ledger_.check_between_steps("set_optimizer",
                                "change hyper-parameters between step() and the next step's first gather or reduce");
    opt_ = validated(o, rank_);
    agreement_.fingerprint(opt_);
  }
  // The learning rate alone, for optimizers that have one (a member `lr`), e.g. from a schedule
  // (zero/core/schedule.hpp); set_optimizer's rules. lr 0 is accepted by the library's optimizers
  // and leaves each weight's value unchanged (w - 0 x d, d finite; the states still advance); the one bit
  // pattern it can change is a weight of -0, which becomes +0 where its update direction d is negative.
  void set_learning_rate(float lr) requires requires(Opt& o, float x) { o.lr = x; }
  {
    Opt o = opt_;
    o.lr = lr;
    set_optimizer(o);
  }

  // The factor user kernels multiply the loss by (1 unless the precision policy scales the loss).
  float loss_scale() const { return scaler_.scale(); }
  const engine_options& options() const { return options_; }

  // ---- memory released between phases ------------------------------------------------------

  // Moves this rank's model states out of the system's memory and frees them: the parameters and,
  // where they are in the system's memory (no offload tier), the master weights and optimizer slots
  // are copied to host memory or to a file without a name (release_options), and the gradient store,
  // all zeros between steps, is freed. memory() then holds none of them; what stays is an offload
  // tier's host memory and, for a host target on a CPU system, the released bytes themselves (both
  // under mem_category::offload). Every protocol call is refused until restore_memory(), which
  // allocates them again and copies them back: training then continues bit for bit as if nothing had
  // happened. Between steps only (not inside a step or an evaluation() scope); not a collective. With
  // the error-feedback reducer (qgZ), whose carried error is state too, it is refused.
  void release_memory(const release_options& o = {}) {
    movers_.check_releasable(ledger_, reduce::chosen_extra_state_bytes<context>(options_, layout_.padded()));
    step_gathers_.complete_all();
    movers_.release(ctx_.sys, o, [&](auto&& f) { for_each_released_buffer(f); });
    reducer_.reset();  // the gradient store: zeros between steps, made afresh by restore_memory()
    if constexpr (requires { system::release_spares(); }) system::release_spares();  // freed blocks it keeps
  }
  // Brings back what release_memory() moved out (allocating it again, so the system needs the room).
  // One that fails for memory leaves the engine released and can be called again once there is room;
  // one that finds the released file changed (an io error) leaves it unusable: load a checkpoint.
  void restore_memory() {
    movers_.restore([&](auto&& f) { for_each_released_buffer(f); });
    reducer_ = reduce::make_chosen(ctx_);
    movers_.restored();
  }
  release_report released() const { return movers_.report(); }

  // ---- results and reports -------------------------------------------------------------------

  // The fp32 (master) parameters of the whole model, unpadded, tensors in declaration order. A
  // collective in stages that shard the master weights.
  std::vector<float> full_params() {
    check_held("full_params");
    step_gathers_.complete_all();
    std::vector<float> out(layout_.numel());
    std::size_t at = 0;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      sweep_.consolidate(placement_, unit_id{u}, out.data() + at);
      at += layout_.unit(unit_id{u}).numel;
    }
    return out;
  }
  // The same for one unit: host memory for one unit at a time (a streaming hash, an export).
  std::vector<float> full_params(unit_id u) {
    state_check(u);
    check_held("full_params");
    step_gathers_.complete_all();
    std::vector<float> out(layout_.unit(u).numel);
    sweep_.consolidate(placement_, u, out.data());
    return out;
  }

  // The fp32 (master) parameters of the whole model() across the tensor-parallel group, unpadded,
  // tensors in declaration order with their whole shapes: each split tensor put together from its
  // pieces, each replicated tensor once (tp rank 0's; the ranks of a group hold the same bits). A
  // collective on the whole mesh (full_params() over the data-parallel group, then an all-gather of
  // the pieces over the tensor-parallel group, taken from the system outside memory()). full_params()
  // outside a mesh.
  std::vector<float> full_model_params() {
    std::vector<float> mine = full_params();
    if (ctx_.tp_size == 1) return mine;
    const std::vector<float> all = tensor_parallel_detail::over_group(ctx_, mine.data(), mine.size(), "consolidation");
    return tensor_parallel_detail::whole_model(spec_, all, ctx_.tp_size);
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
  // With replicated shard groups, the first group's ranks write it; the others' ranges are empty.
  range canonical_range(unit_id u) const {
    state_check(u);
    if (ctx_.replica_index > 0) return range{};
    return layout_.owned_real(u, rank_);
  }

  // Copies master weights (fp32) and each optimizer slot of unit-local range r (within
  // held_range(u)) to host memory: master[r.size()], slots[k][r.size()] for k < Opt::slots.
  // Needs no wait for step()'s parameter all-gathers still in flight (stages 1-2): it reads only this
  // rank's own slice, which those collectives send from and never write.
  // From any offload tier (the disk's reads go through its staging blocks). A null pointer skips
  // its array (a checkpoint streams one array at a time).
  void read_state(unit_id u, range r, float* master, float* const* slots) const {
    checked_state_range(u, r, "read_state");
    if (!r.empty()) sweep_.read(placement_, u, r, master, slots);
  }

  // Stores master weights and optimizer slots of unit-local range r (within held_range(u)). The
  // parameters follow only at finish_load().
  void write_state(unit_id u, range r, const float* master, const float* const* slots) {
    checked_state_range(u, r, "write_state");
    step_gathers_.complete_all();
    if (!r.empty()) sweep_.write(placement_, u, r, master, slots);
  }

  // After write_state() on every held range: restores the step counter and training state and
  // refreshes the parameters from the master weights (a collective in stages 1 and 2).
  void finish_load(const training_state& ts) {
    check_held("finish_load");
    ledger_.check_between_steps("finish_load");
    ZERO_CHECK(ts.step <= training_state::max_steps && ts.skipped_steps <= training_state::max_steps - ts.step &&
                   ts.clean_steps <= training_state::max_steps,
               invalid_argument, "rank ", rank_, ": finish_load: step ", ts.step, ", skipped_steps ", ts.skipped_steps,
               " or clean_steps ", ts.clean_steps, " is more than a run can reach (training_state::max_steps, 2^53)");
    step_gathers_.complete_all();
    ledger_.end_step();  // a loaded engine starts a step afresh
    placement_.secondary_stale();
    step_ = ts.step;
    skipped_ = ts.skipped_steps;
    if constexpr (Prec::loss_scaling) scaler_.restore(ts.loss_scale, ts.clean_steps, ts.hysteresis_left);
    if constexpr (Prec::separate_master) sweep_.cast_master_into(placement_);
    placement_.refresh_whole(links_.other(), "parameter refresh");
  }

  // Everything besides the tensors that a resumed run needs to continue identically.
  training_state state() const {
    return training_state{step_, scaler_.scale(), scaler_.clean_steps(), scaler_.hysteresis_left(), skipped_};
  }

  const memory_report& memory() const { return acct_.report(); }
  // Host memory for a copy of this rank's state (checkpoint::async_saver's snapshot), not filled
  // (the copy writes all of it), pinned where the system pins host memory. Counted under
  // mem_category::snapshot, and held to memory_limit_bytes, where host memory is the system's own; it
  // may outlive the engine. `reuse`, a block this engine gave before, is handed back as it is when it
  // has `bytes` (its pages already mapped: no page faults, no zeroing by the kernel), else freed first.
  snapshot_block snapshot_memory(std::size_t bytes, snapshot_block reuse = {}) {
    return movers_.snapshot(bytes, std::move(reuse));
  }
  // What overlapping communication with computation did so far (engine_options::overlap).
  overlap_report overlap() const {
    overlap_report r = overlap_;
    r.active = ctx_.overlapping();
    return r;
  }
  comm_report comm() const {
    return links_.report(last_step_, step_ + skipped_);
  }

  // The formulas for this engine (engine/formula_report.hpp): the per-parameter sizes of the paper's
  // equations; the model-state bytes in the system's memory (without the offloaded K bytes; with the
  // reducer's extra state and hpZ's secondary shard); what the offload tier holds and moves per step;
  // the bytes per step (reproducible, ZeRO++ and the extra gathers of shared units included), per link
  // level, and per forward-only pass inside evaluation().
  formula::state_sizes state_sizes() const { return formulas_.sizes(); }
  // The optimizer kind's exchange of each step on the control link, in bus bytes (a matrix optimizer's:
  // each matrix to its owner and its result back, engine/matrix_owners.hpp); 0 for the other kinds.
  std::uint64_t optimizer_exchange_formula_bytes() const { return sweep_.exchange_bytes(); }
  std::uint64_t model_state_formula_bytes() const { return formulas_.model_state_bytes(); }
  const offload_report& offload() const { return sweep_.store().report(); }
  std::uint64_t offload_formula_bytes() const { return formulas_.offload_bytes(); }
  offload_traffic offload_formula_traffic() const { return formulas_.offload_step_traffic(); }
  std::uint64_t comm_formula_bytes() const { return formulas_.comm_bytes(); }
  formula::link_bytes comm_formula_by_level() const { return formulas_.comm_by_level(); }
  std::uint64_t eval_comm_formula_bytes() const { return formulas_.eval_comm_bytes(); }
  std::uint64_t extra_gathered_elements() const { return formulas_.extra_gathered_elements(); }
  // Stage 3: whether unit u keeps its gathered parameters between steps (persist_below_elements),
  // and the padded elements of all such units (Psi_p of the formulas).
  bool persistent(unit_id u) const { return placement_.persistent(u); }
  std::uint64_t persistent_elements() const { return placement_.persistent_elements(); }

  // The units this engine trains: the model, or in a tensor-parallel mesh this rank's pieces of it.
  const model_spec& spec() const { return spec_; }
  // The model as declared (whole tensors); spec() outside a tensor-parallel mesh.
  const model_spec& model() const { return model_; }
  // The tensor-parallel group this engine's ranks belong to: 1 outside a mesh (or in a mesh of tp = 1).
  int tensor_parallel_size() const { return ctx_.tp_size; }
  int tensor_parallel_rank() const { return ctx_.tp_rank; }
  const zero::layout& layout() const { return layout_; }
  // Whether a checkpoint holds all of the optimizer's state: false where the optimizer's kind keeps
  // state beside the slots that it does not hand out (engine/sweep_kind.hpp); checkpoint calls refuse it.
  static constexpr bool checkpoints_optimizer_state =
      !optimizer_sweep<part_context<P, Comm, Prec>, Opt>::kind_state_lost;
  // That state, the same on every rank, where the kind hands it to checkpoints; empty otherwise.
  std::span<float> optimizer_kind_state() {
    check_held("optimizer_kind_state");
    return sweep_.kind_checkpointed_state();
  }
  // The optimizer's current hyper-parameters (as built, or as last set): what a checkpoint records.
  // (Its slots, the optimizer *state*, are read through read_state.)
  const Opt& optimizer_settings() const { return opt_; }
  [[deprecated("optimizer_state() returns the hyper-parameters: call optimizer_settings()")]] const Opt&
  optimizer_state() const {
    return opt_;
  }
  // This rank in the data-parallel group the engine was built over, and that group's size N (with
  // replicated shard groups: replica_index() x shard_group_size() + its rank in the group, and all
  // the groups' ranks).
  int rank() const { return ctx_.dp_rank(); }
  int world_size() const { return ctx_.dp_size(); }
  // The ranks ZeRO partitions over (layout().ranks()): N, or engine_options::shard_group_size.
  int shard_group_size() const { return layout_.ranks(); }
  // The groups that replicate each other (1 without shard_group_size), and this rank's group.
  int replicas() const { return ctx_.replica_count; }
  int replica_index() const { return ctx_.replica_index; }
  std::uint64_t steps() const { return step_; }

 private:
  friend evaluation_scope;
  friend gathered;
  friend grad_buffers;
  using context = part_context<P, Comm, Prec>;

  reduce::any_reducer<context>& reducer() const {
    if (!reducer_) fail(error_kind::protocol, "rank ", rank_, ": engine: no gradient reducer (the constructor failed)");
    return *reducer_;
  }

  // What a unit holds besides its counters (the ledger's).
  struct unit_state {
    buffer<param_type, system> full_params;  // stage 3: the gathered unit
  };

  // Whether `bytes` more fit under memory_limit_bytes beside the bytes the reduces in flight will
  // allocate to complete (their reserve: a reduce in flight must always be able to complete).
  bool has_room(std::size_t bytes) const {
    return acct_.limit() == 0 || acct_.total() + reducer().reserved_bytes() + bytes <= acct_.limit();
  }
  // Under memory_limit_bytes, completes reduces in flight (oldest first) and then drops prefetches
  // until `bytes` more fit beside the reserves of the reduces left in flight, so that overlap never
  // needs more memory than the blocking protocol: what it holds beyond that is given back before an
  // allocation would fail, and each reduce it holds can complete within the limit. The same
  // decisions on every rank (their accounts are equal).
  void make_room(std::size_t bytes) {
    if (acct_.limit() == 0) return;
    while (reducer().in_flight() > 0 && !has_room(bytes)) reducer().complete_oldest();
    if (!has_room(bytes)) schedule_.give_back();  // then gathers on demand for the step
  }

  // Stage 3's gather(u) inside a step: takes the unit's prefetch when the step follows the recorded
  // order, else gathers now; either way starts the prefetches that the order allows next.
  void gather_in_step(unit_id u, unit_state& s) {
    auto g = schedule_.start(u);
    s.full_params = std::move(g.full);
    ledger_.set_gathered(u, true);  // counted as live by the prefetches
    try {
      schedule_.prefetch_ahead();
      placement_.finish_gather(links_.protocol(), g.pending, u, s.full_params.data(), g.wire, g.from_secondary, true);
      // hpZ: the walk stops at a secondary gather whose primary had not completed (this one's, for the
      // backward pass's first unit); now it has.
      if (options_.zeropp.hpz) schedule_.prefetch_ahead();
    } catch (...) {
      ledger_.set_gathered(u, false);
      s.full_params.reset();
      throw;
    }
  }

  // The step's constants of each parameter group: the optimizer's own, then each override's.
  std::vector<typename Opt::step_constants> group_constants() const {
    std::vector<typename Opt::step_constants> c{opt_.constants(step_)};
    for (const param_group& g : options_.param_groups) c.push_back(group_optimizer(opt_, g).constants(step_));
    return c;
  }
  void update_and_gather_params(const std::vector<typename Opt::step_constants>& c, float divisor, float coef) {
    const bool sharded = reducer().sharded();
    const auto gradients = [&](auto f) {
      const auto v = reducer().gradients();
      if (v.in_fp32)
        f(v.fp32, sharded);
      else
        f(v.grad, sharded);
    };
    // Each unit's update, then its all-gather where it is kept whole (step_gathers.hpp).
    sweep_.update(placement_, param_groups_, c, divisor, coef, gradients, [&](unit_id u) { step_gathers_.start(u); });
  }

  // The end of an evaluation() scope: releases what it left gathered (a local operation).
  void end_evaluation() noexcept {
    for (std::size_t u = 0; u < units_.size(); ++u)
      if (ledger_.at(unit_id{u}).gathered) units_[u].full_params.reset();
    ledger_.end_evaluation();
  }

  comm::comm_stats protocol_stats() const { return links_.protocol_stats(); }

  // A backend whose system carries state (a device stream) hands it out; host systems are stateless.
  static system system_of(Comm& c) {
    if constexpr (requires { c.make_system(); })
      return c.make_system();
    else
      return system{};
  }

  std::string where(unit_id u) const { return ledger_.where(u); }
  unit_state& state(unit_id u, const char* call) {
    ledger_.check_index(u, call);
    check_held(call);
    return units_[u.index];
  }
  // Refuses a call that needs the model states while they are released.
  void check_held(const char* call) const { movers_.check_held(call); }
  // The buffers release_memory() moves, in one order: the parameters, the state arrays, the optimizer
  // kind's own state.
  template <class F>
  void for_each_released_buffer(F&& f) {
    placement_.for_each_buffer(f);
    sweep_.store().for_each_system_buffer(f);
    sweep_.for_each_kind_buffer(f);
  }

  param_type* full_params_of(unit_id u) {
    if constexpr (P::shards_parameters) {
      if (persistent(u)) return placement_.whole(u);
      return units_[u.index].full_params.data();
    } else {
      return placement_.whole(u);
    }
  }
  grad_type* full_grads_of(unit_id u) { return reducer().unit_gradient(u); }

  // ---- gradient accumulation and norms ----

  // The optimizer's hyper-parameters (its validate(), where it has one), checked before anything is
  // allocated; errors name the rank.
  static Opt validated(const Opt& opt, int rank) {
    detail::with_rank(rank, [&] { validate_optimizer(opt); });
    return opt;
  }
  void state_check(unit_id u) const {
    ZERO_CHECK(u.index < units_.size(), invalid_argument, "rank ", rank_, ": unit index ", u.index,
               " is out of range (the model has ", units_.size(), " units)");
  }
  const unit_layout& checked_state_range(unit_id u, range r, const char* call) const {
    check_held(call);
    const range held = held_range(u);
    ZERO_CHECK(r.empty() || (r.begin >= held.begin && r.end <= held.end), invalid_argument, where(u), call,
               " of elements [", r.begin, ", ", r.end, ") outside the held range [", held.begin, ", ", held.end, ")");
    return layout_.unit(u);
  }

  // Before anything is allocated: refuses model states that cannot fit (memory_check.hpp), in the free
  // memory every rank saw before any allocated.
  void check_memory(const model_state_plan& need) {
    const std::optional<memory_info> m = detail::memory_before_allocation(sys_, links_.other());
    detail::check_model_states_fit(rank_, P::stage, layout_.ranks(), need, options_.memory_limit_bytes, m,
                                   formulas_.every_stage_model_state_bytes(), formulas_.offload_suggestion(need, m));
  }

  memory_accounting acct_;            // first: every buffer below reports to it and must die before it
  system sys_;                        // where the buffers live and the element-wise loops run
  engine_links<context> links_;       // the groups and a counted link per kind of traffic (engine/links.hpp)
  const model_spec spec_;             // what this rank's units hold
  const model_spec model_;            // the model as declared (spec_ outside a tensor-parallel mesh)
  const zero::layout layout_;
  Opt opt_;
  engine_options options_;
  param_group_map param_groups_;  // each unit's runs of one parameter group (engine_options::param_groups)
  loss_scaler scaler_;
  int rank_;
  overlap_report overlap_;
  // The parts (engine/context.hpp): where the parameters live and how gathers travel, the optimizer
  // sweep over the state arrays, the ranks' agreement, the gradient reducer the options chose.
  context ctx_{sys_,   acct_, layout_, spec_, options_, rank_, links_.protocol(), links_.other(), links_.control(),
               links_.eval(), overlap_};
  detail::state_movers<system> movers_{acct_, rank_};  // release_memory() and snapshot_memory()
  parameter_placement<context> placement_{ctx_};
  step_gathers<context> step_gathers_{ctx_, placement_};  // after the parameters: waits before they are freed
  optimizer_sweep<context, Opt> sweep_{ctx_};
  formula_report<context, Opt> formulas_{ctx_, placement_, sweep_};
  rank_agreement<context, Opt> agreement_{ctx_};
  initializer<context, Opt> initializer_{ctx_, placement_, sweep_, agreement_};
  std::vector<unit_state> units_;
  protocol_ledger ledger_{spec_, options_, rank_};  // each unit's calls in the step, the evaluation scope
  gather_schedule<context> schedule_{ctx_, placement_, [this](unit_id u) { return ledger_.at(u).gathered; }};
  std::unique_ptr<reduce::any_reducer<context>> reducer_;  // the one the options chose (reduce/catalog.hpp)
  std::uint64_t step_ = 0, skipped_ = 0;
  comm::comm_stats at_step_start_, last_step_;
};

}  // namespace zero
