// precision::fp32: parameters, gradients and messages in fp32; the parameters are the master weights.
#pragma once

#include <string_view>

#include "zero/concepts/precision_policy.hpp"

namespace zero::precision {

struct fp32 {
  using param_type = float;
  using grad_type = float;
  using master_type = float;
  using comm_type = float;
  static constexpr bool separate_master = false;
  static constexpr bool loss_scaling = false;
  static constexpr std::string_view name = "fp32";
};
static_assert(PrecisionPolicy<fp32>);

}  // namespace zero::precision
