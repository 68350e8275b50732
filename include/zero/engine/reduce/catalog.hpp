// The gradient reducers an engine can run, and the one its options choose (once, at construction).
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>

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
// is allocated); then, after the model states, builds it. A reducer that is not available on this
// backend and system (the binned one without binned reductions) is not compiled into the engine.
template <class Ctx>
void accept_chosen(const Ctx& c) {
  catalog<Ctx>::visit_first([&]<class R>() { return R::chosen(c.options); },
                            [&]<class R>() {
                              static_assert(GradientReducer<R>, "a catalog entry is not a GradientReducer");
                              static_assert(std::is_base_of_v<any_reducer<Ctx>, R>,
                                            "a catalog entry implements reduce::any_reducer, the engine's view of it "
                                            "(build it on reduce::reducer, engine/reduce/reducer.hpp)");
                              R::accept(c);
                            });
}
template <class Ctx>
std::unique_ptr<any_reducer<Ctx>> make_chosen(Ctx& c) {
  std::unique_ptr<any_reducer<Ctx>> made;
  catalog<Ctx>::visit_first([&]<class R>() { return R::chosen(c.options); },
                            [&]<class R>() {
                              if constexpr (!R::available)
                                fail(error_kind::invalid_argument, "rank ", c.rank, ": the ", R::name,
                                     " gradient reducer is not available on this backend and system");
                              else
                                made = std::make_unique<R>(c);
                            });
  return made;
}

}  // namespace zero::reduce
