// expect: concept zero::Partitioner
// expect: required expression .P::shards_gradients
#include "zero/zero.hpp"

// A partitioner that does not say whether it shards gradients.
struct no_flag {
  static constexpr int stage = 1;
  static constexpr bool shards_optimizer_states = true;
  static constexpr bool shards_parameters = false;
};
static_assert(zero::Partitioner<no_flag>);
