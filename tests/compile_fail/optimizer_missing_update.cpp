// expect: concept zero::OptimizerState
// expect: required expression .O::update
#include "zero/zero.hpp"

// An optimizer without its element-wise rule.
struct no_update {
  static constexpr int slots = 1;
  static constexpr std::string_view name = "no_update";
  struct step_constants {};
  step_constants constants(std::uint64_t) const { return {}; }
};
static_assert(zero::OptimizerState<no_update>);
