// The PrecisionPolicy concept: the storage types of parameters, gradients, master weights and messages.
#pragma once

#include <concepts>
#include <string_view>

namespace zero {

// Requirements:
//   typename P::param_type    what gather() hands to user kernels
//   typename P::grad_type     what grads() hands to user kernels, and what is reduced
//   typename P::master_type   the optimizer's copy of the weights (float)
//   typename P::comm_type     the element type on the wire
//   P::separate_master        constexpr bool: a master copy exists apart from the parameters (K
//                             then includes sizeof(master_type) bytes per parameter)
//   P::loss_scaling           constexpr bool: gradients arrive multiplied by a dynamic loss scale
//   P::name                   constexpr std::string_view
// What the engine supports of these, required here rather than refused inside the engine:
//   master_type is float; without a separate master the parameters are the master, so param_type
//   is float too; grad_type and comm_type equal param_type (gradients are written, reduced and sent
//   in the parameters' type: the roles have names, the engine does not yet cast between them).
template <class P>
concept PrecisionPolicy = requires {
  typename P::param_type;
  typename P::grad_type;
  typename P::master_type;
  typename P::comm_type;
  { P::separate_master } -> std::convertible_to<bool>;
  { P::loss_scaling } -> std::convertible_to<bool>;
  { P::name } -> std::convertible_to<std::string_view>;
} && std::same_as<typename P::master_type, float> && (P::separate_master || std::same_as<typename P::param_type, float>) &&
                          std::same_as<typename P::grad_type, typename P::param_type> &&
                          std::same_as<typename P::comm_type, typename P::param_type>;

}  // namespace zero
