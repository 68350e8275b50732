// The Partitioner concept: which model states a ZeRO stage shards, and the named facts the engine branches on.
#pragma once

#include <concepts>

namespace zero {

// Requirements:
//   P::stage                     constexpr int, the ZeRO stage number (0..3) that the flags describe
//   P::shards_optimizer_states   constexpr bool: master weights and optimizer slots are 1/N per rank
//   P::shards_gradients          constexpr bool: gradients are 1/N per rank (reduced from a transient bucket)
//   P::shards_parameters         constexpr bool: parameters are 1/N per rank and gathered per unit
// A stage that shards gradients must shard optimizer states, and one that shards parameters must
// shard both: the engine's data flow depends on that nesting. The stage number must be the one the
// flags make (the memory and communication formulas are written per stage).
//
// How a unit is split among ranks is not the partitioner's choice: the layout pads every unit to a
// multiple of N x 32 elements and cuts it into N equal, rank-ordered slices (core/layout.hpp), since
// the collectives use one count per unit and the checkpoint format addresses slices by that rule.
template <class P>
concept Partitioner = requires {
  { P::stage } -> std::convertible_to<int>;
  { P::shards_optimizer_states } -> std::convertible_to<bool>;
  { P::shards_gradients } -> std::convertible_to<bool>;
  { P::shards_parameters } -> std::convertible_to<bool>;
} && (!P::shards_gradients || P::shards_optimizer_states) && (!P::shards_parameters || P::shards_gradients) &&
                      (P::stage == (P::shards_parameters         ? 3
                                    : P::shards_gradients        ? 2
                                    : P::shards_optimizer_states ? 1
                                                                 : 0));

// The facts of a partitioner the engine branches on, named for what they mean rather than for a
// stage number.

// Every rank updates every element (optimizer states replicated): each needs the whole reduced
// gradient, so reduce() all-reduces; otherwise it reduce-scatters and a rank keeps its slice.
template <Partitioner P>
inline constexpr bool updates_every_element = !P::shards_optimizer_states;

// Parameters are replicated but each rank updates only its slice: after the update (and after a
// load or an initialization by slices) the slices are all-gathered into every rank's parameters.
template <Partitioner P>
inline constexpr bool gathers_parameters_after_update = P::shards_optimizer_states && !P::shards_parameters;

}  // namespace zero
