// precision::bf16: bf16 parameters, gradients and messages; fp32 master weights and optimizer states (K = 12 with AdamW).
#pragma once

#include <string_view>

#include "zero/concepts/precision_policy.hpp"
#include "zero/core/half_types.hpp"

namespace zero::precision {

// bf16 has fp32's exponent range, so no loss scale is needed; gradient sums are accumulated in fp32
// in rank order and rounded to bf16 once.
struct bf16 {
  using param_type = zero::bf16;
  using grad_type = zero::bf16;
  using master_type = float;
  using comm_type = zero::bf16;
  static constexpr bool separate_master = true;
  static constexpr bool loss_scaling = false;
  static constexpr std::string_view name = "bf16";
};
static_assert(PrecisionPolicy<bf16>);

}  // namespace zero::precision
