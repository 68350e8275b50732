// expect: zero::PrecisionPolicy<bf16_params_fp32_grads>
// expect: same_as<typename P::grad_type, typename P::param_type>
#include "zero/zero.hpp"

// A precision that reduces gradients in fp32 next to bf16 parameters: the engine writes, reduces and
// sends gradients in the parameter type, so the concept refuses it where it is defined.
struct bf16_params_fp32_grads {
  using param_type = zero::bf16;
  using grad_type = float;
  using master_type = float;
  using comm_type = zero::bf16;
  static constexpr bool separate_master = true;
  static constexpr bool loss_scaling = false;
  static constexpr std::string_view name = "mixed";
};
static_assert(zero::PrecisionPolicy<bf16_params_fp32_grads>);
