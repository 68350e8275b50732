// The GradientReducer concept: how a unit's gradient becomes the reduced gradient the optimizer reads.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "zero/core/model_spec.hpp"

namespace zero {

struct engine_options;  // engine/options.hpp: the concept only passes it by reference

// What the optimizer's agreement check gives a reducer's norm collective to carry (engine/agreement.hpp):
// the fingerprint terms (summed over ranks) and the hash of this rank's optimizer hyper-parameters.
struct agreement_terms {
  const double* fingerprint = nullptr;  // detail::fingerprint_words terms
  std::uint64_t optimizer_hash = 0;
  // In a tensor-parallel mesh: whether the data-parallel group's own check (where the step made one
  // apart from the norm) found its optimizers equal; the norm's exchange carries the verdict across
  // the mesh, so that no group throws while another goes on.
  bool agreed = true;
};
// A reducer's global sum of squares, and whether the ranks' optimizers agreed on the way.
struct norm_result {
  double sum_of_squares = 0.0;
  bool optimizers_agree = true;
};

namespace detail {
// Stands in for the engine's update in the concept: takes the store's base pointer, whatever its type.
struct gradient_probe {
  template <class T>
  void operator()(const T*) const {}
};
}  // namespace detail

// Requirements (R is a reducer over one engine's context; engine/reduce/ holds the models):
//   typename R::context_type, typename R::grad_type
//   R::name                        constexpr const char*, what errors and reports call it
//   R::available                   constexpr bool: the backend and system have what it needs (a
//                                  reducer that is not is not compiled into the engine)
//   R::chosen(options)             whether engine_options select it (the catalog takes the first)
//   R::accept(ctx)                 refuses, with zero::error naming the option, what it cannot serve
//                                  for this stage, world and backend; before anything is allocated
//   R::grad_bytes(options)         bytes of its persistent gradient store per element it holds
//   R::extra_state_bytes(options, padded)   what else it keeps between steps (an error buffer) for a
//                                  model of `padded` elements: counted in memory() and the formulas
//   R r(ctx)                       allocates its store (memory_accounting, mem_category::grads)
//   r.open(u)                      before kernels write unit u: its bucket, zero, if it uses one
//   r.unit_gradient(u)             grad_type*: where kernels write u's gradient this micro-batch
//   r.reduce(u, first)             starts (or fuses) u's reduction; `first`: the step's first of u
//   r.flush()                      starts an open fused bucket
//   r.in_flight(), r.complete_oldest()   the reduces still pending, and completing the oldest
//   r.reserved_bytes()             the transient bytes completing the pending reduces will allocate
//                                  beyond the buffers they hold: the engine keeps them free under
//                                  memory_limit_bytes (a reduce in flight can always complete)
//   r.complete_all()               everything started and completed, the store readable
//   r.sum_of_squares(divisor, a)   norm_result: the sum of squares of store / divisor over the real
//                                  elements, identical on every rank and at every stage; in a
//                                  tensor-parallel mesh (ctx.tp_size > 1) that of the whole mesh's
//                                  model (engine/tensor_parallel.hpp)
//   r.averaging_count()            what the rank-ordered sum is divided by (with the loss scale)
//   r.sharded()                    whether the store holds only this rank's slices
//   r.with_gradients(f)            calls f(const T* base) with the store (element_index addresses it)
//   r.clear(updated_zeroed)        the store zero for the next step (updated_zeroed: the update
//                                  zeroed the elements it read, engine/reduce/reducer.hpp)
// Every decision depends only on the calls, which every rank makes alike, so all ranks start the same
// collectives in the same order. The bits of a reducer are its own contract (exact: rank-ordered
// sums; quantized: ZeRO++'s qgZ; binned: independent of the world size).
template <class R>
concept GradientReducer = requires(R& r, const R& cr, typename R::context_type& ctx, const engine_options& o, unit_id u,
                                   bool first, float divisor, const agreement_terms& a) {
  typename R::grad_type;
  { R::name } -> std::convertible_to<const char*>;
  { R::available } -> std::convertible_to<bool>;
  { R::chosen(o) } -> std::same_as<bool>;
  R::accept(ctx);
  { R::grad_bytes(o) } -> std::same_as<std::size_t>;
  { R::extra_state_bytes(o, std::uint64_t{}) } -> std::same_as<std::uint64_t>;
  r.open(u);
  { r.unit_gradient(u) } -> std::same_as<typename R::grad_type*>;
  r.reduce(u, first);
  r.flush();
  { cr.in_flight() } -> std::convertible_to<std::size_t>;
  { cr.reserved_bytes() } -> std::convertible_to<std::size_t>;
  r.complete_oldest();
  r.complete_all();
  { r.sum_of_squares(divisor, a) } -> std::same_as<norm_result>;
  { cr.averaging_count() } -> std::convertible_to<std::size_t>;
  { cr.sharded() } -> std::same_as<bool>;
  cr.with_gradients(detail::gradient_probe{});
  r.clear(first);
}
&&std::constructible_from<R, typename R::context_type&>;

}  // namespace zero
