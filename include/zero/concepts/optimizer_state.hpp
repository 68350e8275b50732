// The OptimizerState concept: per-element state slots, hyper-parameters, and one element-wise update rule.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zero/core/hyper_parameter.hpp"

namespace zero {

// Requirements:
//   O::slots                    constexpr int, fp32 state values kept per parameter element
//   O::name                     constexpr std::string_view, e.g. "adamw"
//   typename O::step_constants  what one step's update needs (learning rate, bias corrections...),
//                               computed once per step on the host and passed to every element
//   o.constants(t) -> step_constants, for the 1-based step number t
//   O::update(c, w, g, s)       ZERO_HD static: updates master weight w (float&) in place from the
//                               averaged gradient g (float) and the element's state s (float[slots])
//   O::slot_names               constexpr std::array<std::string_view, slots>: what a checkpoint calls
//                               each slot ("m", "v"), unique, none "master"
//   O::hyper_parameters()       static constexpr: a std::tuple of zero::field("lr", &O::lr), ... for
//                               every setting (core/hyper_parameter.hpp; float, double or bool), which
//                               a checkpoint saves and optimizer_from() reads back; std::tuple{} if none
// The metadata is required, not detected: an optimizer without it would train, then checkpoint its
// slots unnamed and its settings not at all.
// The rule is applied to the owned, unpadded elements only; it must use zero::fp operations so
// every backend performs the same floating-point operations.
//
// Optional:
//   o.validate()                checks the hyper-parameters and throws zero::error (invalid_argument)
//                               naming the field and its valid range. The engine calls it at
//                               construction and in set_optimizer(), where it exists (detected with
//                               `requires`, see validate_optimizer below), so an optimizer written
//                               without one still works; it is not part of the concept for that reason.
template <class O>
concept OptimizerState = requires(const O& o, std::uint64_t t, float& w, float g, float* s,
                                  const typename O::step_constants& c) {
  { O::slots } -> std::convertible_to<int>;
  { O::name } -> std::convertible_to<std::string_view>;
  { o.constants(t) } -> std::same_as<typename O::step_constants>;
  O::update(c, w, g, s);
  { O::slot_names } -> std::convertible_to<std::array<std::string_view, static_cast<std::size_t>(O::slots)>>;
  { O::hyper_parameters() } -> hyper_parameter_list<O>;
}
&&(O::slots >= 0);

// Calls o.validate() where the optimizer has one; nothing otherwise.
template <OptimizerState O>
void validate_optimizer(const O& o) {
  if constexpr (requires { o.validate(); }) o.validate();
}

}  // namespace zero
