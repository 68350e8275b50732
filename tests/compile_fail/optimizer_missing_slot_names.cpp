// expect: concept zero::OptimizerState
// expect: required expression .O::slot_names
#include "zero/zero.hpp"

// An optimizer that does not name its state slots: a checkpoint could not say what it holds.
struct no_slot_names {
  static constexpr int slots = 1;
  static constexpr std::string_view name = "no_slot_names";
  float lr = 0.1f;
  struct step_constants {};
  step_constants constants(std::uint64_t) const { return {}; }
  static void update(const step_constants&, float&, float, float*) {}
  static constexpr auto hyper_parameters() { return std::tuple{zero::field("lr", &no_slot_names::lr)}; }
};
static_assert(zero::OptimizerState<no_slot_names>);
