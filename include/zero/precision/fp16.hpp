// precision::fp16: fp16 parameters, gradients and messages, fp32 master weights, and a dynamic loss scale.
#pragma once

#include <string_view>

#include "zero/concepts/precision_policy.hpp"
#include "zero/core/half_types.hpp"

namespace zero::precision {

// fp16's range ends at 65504 and its subnormals at 6e-8: gradients are computed from the loss times
// the scale (engine::loss_scale()), and the engine divides it out before the optimizer.
struct fp16 {
  using param_type = zero::fp16;
  using grad_type = zero::fp16;
  using master_type = float;
  using comm_type = zero::fp16;
  static constexpr bool separate_master = true;
  static constexpr bool loss_scaling = true;
  static constexpr std::string_view name = "fp16";
};
static_assert(PrecisionPolicy<fp16>);

}  // namespace zero::precision
