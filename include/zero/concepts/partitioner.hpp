// The Partitioner concept: which model states a ZeRO stage shards, and how a unit's flat extent is split.
#pragma once

#include <concepts>
#include <cstddef>

#include "zero/core/layout.hpp"

namespace zero {

// Requirements:
//   P::stage                     constexpr int, the ZeRO stage number (0..3)
//   P::shards_optimizer_states   constexpr bool: master weights and optimizer slots are 1/N per rank
//   P::shards_gradients          constexpr bool: gradients are 1/N per rank (reduced from a transient bucket)
//   P::shards_parameters         constexpr bool: parameters are 1/N per rank and gathered per unit
//   P::padded_extent(numel, ranks, alignment) -> size_t, a multiple of ranks * alignment, >= numel
//   P::owned(padded, rank, ranks) -> zero::range, rank's slice of the unit, rank-ordered and even
// A stage that shards gradients must shard optimizer states, and one that shards parameters must
// shard both: the engine's data flow depends on that nesting.
template <class P>
concept Partitioner = requires(std::size_t n, int r) {
  { P::stage } -> std::convertible_to<int>;
  { P::shards_optimizer_states } -> std::convertible_to<bool>;
  { P::shards_gradients } -> std::convertible_to<bool>;
  { P::shards_parameters } -> std::convertible_to<bool>;
  { P::padded_extent(n, r, n) } -> std::convertible_to<std::size_t>;
  { P::owned(n, r, r) } -> std::same_as<range>;
} && (!P::shards_gradients || P::shards_optimizer_states) && (!P::shards_parameters || P::shards_gradients);

}  // namespace zero
