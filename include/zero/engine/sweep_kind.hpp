// sweep_kind: how an optimizer's step goes over the rank's state arrays, chosen by its kind; the seam a new kind of optimizer enters by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/layout.hpp"
#include "zero/engine/matrix_sweep.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/tensorwise_sweep.hpp"
#include "zero/offload/state_store.hpp"

namespace zero {

template <class Ctx, class Opt>
class optimizer_sweep;

// A kind is a class template K<Ctx, Opt>, built once per engine from its context (engine/context.hpp)
// and kept with the state arrays, so that what it reuses between steps (buffers, plans) lives in it:
//
//   explicit K(Ctx&);
//   // At construction, after the parameter groups and the ranks' settings are agreed on and before
//   // the model states are allocated: the kind's refusals (thrown on every rank alike) and plans.
//   void plan(optimizer_sweep<Ctx, Opt>&, const param_group_map&);
//   // One step over every held element: `gradients(f)` calls f(T* store, bool sharded) with the
//   // reducer's gradient store; each element's gradient is divided by `divisor` (N x loss scale) and
//   // multiplied by `coef` (clipping) before the rule; c[g] are parameter group g's constants;
//   // done(u) is called once per unit, in unit order, when the unit's weights are final (the engine
//   // then starts its parameter all-gather). Where the host updates (optimizer_sweep::
//   // update_zeroes_gradients) every gradient element it reads is left zero.
//   template <class Gradients, class Done>
//   void update(optimizer_sweep<Ctx, Opt>&, parameter_placement<Ctx>&, const param_group_map&,
//               const std::vector<typename Opt::step_constants>& c, float divisor, float coef,
//               const Gradients& gradients, Done done);
//   // Its traffic of one step on the control link, in bus bytes (formula_report, the counters).
//   std::uint64_t exchange_bytes(const optimizer_sweep<Ctx, Opt>&) const;
//
// A kind may keep optimizer state of its own beside the per-element slots (per-tensor statistics such
// as a factored second moment), in buffers of the system's memory it allocates in plan(). It then states
// them with two optional members (optimizer_sweep detects them):
//   // The bytes of that state, known at construction: the memory check before anything is allocated,
//   // memory_limit_bytes and model_state_formula_bytes count them under optimizer_states.
//   std::uint64_t state_bytes() const;
//   // Hands each of those buffers (zero::buffer) to f: release_memory() parks and restores them.
//   template <class F> void for_each_state_buffer(F&& f);
//   // Optional: the whole of that state as floats, the same on every rank of the engine and of a
//   // length that depends on the model alone (not on N or the stage): a checkpoint saves one copy
//   // and a load at any world size hands it to every rank (engine::optimizer_kind_state).
//   std::span<float> checkpointed_state();
// Without checkpointed_state() the checkpoint calls refuse an engine whose kind keeps state of its own
// (engine::checkpoints_optimizer_state), rather than save part of it.
//
// optimizer_sweep gives it the pieces: the state arrays segment by segment (for_each_held_segment,
// store().begin_step()/end_step()), the element-wise rule over a segment (update_segment), the pool,
// the layout and the links (context()). The bits a kind produces must not depend on N, the stage or
// the thread count, as the element-wise rule's do: tests/engine/test_equivalence.cpp holds every
// kind the library ships to that.
//
// The element-wise kind: each element's rule alone, segment by segment, cut where an element's
// parameter group changes.
template <class Ctx, class Opt>
class elementwise_sweep {
 public:
  explicit elementwise_sweep(Ctx&) {}
  void plan(optimizer_sweep<Ctx, Opt>&, const param_group_map&) {}
  std::uint64_t exchange_bytes(const optimizer_sweep<Ctx, Opt>&) const { return 0; }

  template <class Gradients, class Done>
  void update(optimizer_sweep<Ctx, Opt>& sweep, parameter_placement<Ctx>& params, const param_group_map& groups,
              const std::vector<typename Opt::step_constants>& c, float divisor, float coef, const Gradients& gradients,
              Done done) {
    using sweep_type = optimizer_sweep<Ctx, Opt>;
    sweep.store().begin_step();
    sweep.for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* held) {
          // The segment cut where its elements' group changes (one piece where the unit has one group).
          for (const group_run& run : groups.runs(u)) {
            const range piece = intersect(run.elements, range{i, i + n});
            if (piece.empty()) continue;
            float* at[offload::state_store<typename Ctx::system>::max_arrays] = {};
            for (int a = 0; a < sweep_type::state_arrays; ++a) at[a] = held[a] + (piece.begin - i);
            sweep.update_segment(params, u, piece.begin, piece.size(), at, c[run.group], divisor, coef, gradients);
          }
        },
        true, done);
    sweep.store().end_step();
  }
};

// The kind of optimizer Opt: its template kind<Ctx>. An optimizer of a kind the library does not know
// brings its own by specializing this trait (before the engine that uses it is instantiated), e.g.
//   template <> struct zero::sweep_kind_of<my_optimizer> {
//     template <class Ctx> using kind = my_sweep<Ctx, my_optimizer>;
//   };
// and nothing in the engine changes.
template <class Opt>
struct sweep_kind_of {
  template <class Ctx>
  using kind = elementwise_sweep<Ctx, Opt>;
};
template <class Opt>
  requires TensorwiseOptimizer<Opt> && (!MatrixOptimizer<Opt>)
struct sweep_kind_of<Opt> {
  template <class Ctx>
  using kind = tensorwise_sweep<Ctx, Opt>;
};
template <MatrixOptimizer Opt>
struct sweep_kind_of<Opt> {
  template <class Ctx>
  using kind = matrix_sweep<Ctx, Opt>;
};

template <class Ctx, class Opt>
using sweep_kind_t = typename sweep_kind_of<Opt>::template kind<Ctx>;

}  // namespace zero
