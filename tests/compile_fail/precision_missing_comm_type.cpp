// expect: concept zero::PrecisionPolicy
// expect: required type .typename P::comm_type
#include "zero/zero.hpp"

// A precision policy that does not name its wire type.
struct no_comm_type {
  using param_type = float;
  using grad_type = float;
  using master_type = float;
  static constexpr bool separate_master = false;
  static constexpr bool loss_scaling = false;
  static constexpr std::string_view name = "x";
};
static_assert(zero::PrecisionPolicy<no_comm_type>);
