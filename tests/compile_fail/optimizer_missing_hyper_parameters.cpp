// expect: concept zero::OptimizerState
// expect: O::hyper_parameters
#include "zero/zero.hpp"

// An optimizer that does not list its settings: a checkpoint would resume it with the defaults.
struct no_hyper_parameters {
  static constexpr int slots = 1;
  static constexpr std::string_view name = "no_hyper_parameters";
  static constexpr std::array<std::string_view, slots> slot_names = {"momentum"};
  float lr = 0.1f;
  struct step_constants {};
  step_constants constants(std::uint64_t) const { return {}; }
  static void update(const step_constants&, float&, float, float*) {}
};
static_assert(zero::OptimizerState<no_hyper_parameters>);
