// The gradient reducers an engine can run, and the one its options choose (once, at construction).
#pragma once

#include <cstddef>
#include <type_traits>
#include <variant>

#include "zero/concepts/gradient_reducer.hpp"
#include "zero/core/type_list.hpp"
#include "zero/engine/reduce/binned.hpp"
#include "zero/engine/reduce/error_feedback.hpp"
#include "zero/engine/reduce/exact.hpp"
#include "zero/engine/reduce/quantized.hpp"
#include "zero/error.hpp"

namespace zero::reduce {

// In order of choice: the first whose chosen(options) holds is the engine's. A new reducer is one
// file and one entry here (docs/extending.md, "A gradient reducer").
template <class Ctx>
using catalog = type_list<binned_reducer<Ctx>, feedback_reducer<Ctx>, quantized_reducer<Ctx>, exact_reducer<Ctx>>;

namespace detail {
// std::variant of the reducers of a list that are available on this backend and system: a reducer
// that is not (the binned one on a system without binned reductions) is not compiled into the engine.
template <class Variant, class... Rs>
struct available_variant {
  using type = Variant;
};
template <class... Vs, class R, class... Rs>
struct available_variant<std::variant<Vs...>, R, Rs...> {
  using type = typename available_variant<std::conditional_t<R::available, std::variant<Vs..., R>, std::variant<Vs...>>,
                                          Rs...>::type;
};
template <class List>
struct variant_of;
template <class... Rs>
struct variant_of<type_list<Rs...>> {
  using type = typename available_variant<std::variant<std::monostate>, Rs...>::type;
};
}  // namespace detail

// Where the engine keeps its reducer (std::monostate until chosen).
template <class Ctx>
using reducer_variant = typename detail::variant_of<catalog<Ctx>>::type;

// The chosen reducer's bytes per gradient element, and whether its store holds only this rank's
// slices: what the engine's memory check and formulas need before the reducer exists.
template <class Ctx>
std::size_t chosen_grad_bytes(const engine_options& o) {
  std::size_t bytes = 0;
  catalog<Ctx>::visit_first([&]<class R>() { return R::chosen(o); }, [&]<class R>() { bytes = R::grad_bytes(o); });
  return bytes;
}
template <class Ctx>
std::uint64_t chosen_extra_state_bytes(const engine_options& o, std::uint64_t padded) {
  std::uint64_t bytes = 0;
  catalog<Ctx>::visit_first([&]<class R>() { return R::chosen(o); },
                            [&]<class R>() { bytes = R::extra_state_bytes(o, padded); });
  return bytes;
}
template <class Ctx>
bool chosen_store_sharded(const engine_options& o) {
  bool sharded = false;
  catalog<Ctx>::visit_first([&]<class R>() { return R::chosen(o); }, [&]<class R>() { sharded = R::store_sharded; });
  return sharded;
}

// Checks that the reducer the options choose accepts this stage, world and backend (before anything
// is allocated); then, after the model states, builds it into v.
template <class Ctx>
void accept_chosen(const Ctx& c) {
  catalog<Ctx>::visit_first([&]<class R>() { return R::chosen(c.options); },
                            [&]<class R>() {
                              static_assert(GradientReducer<R>, "a catalog entry is not a GradientReducer");
                              R::accept(c);
                            });
}
template <class Ctx>
void emplace_chosen(reducer_variant<Ctx>& v, Ctx& c) {
  catalog<Ctx>::visit_first([&]<class R>() { return R::chosen(c.options); },
                            [&]<class R>() {
                              if constexpr (R::available)
                                v.template emplace<R>(c);
                              else
                                fail(error_kind::invalid_argument, "rank ", c.rank, ": the ", R::name,
                                     " gradient reducer is not available on this backend and system");
                            });
}

}  // namespace zero::reduce
