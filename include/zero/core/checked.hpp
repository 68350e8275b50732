// Checked unsigned arithmetic for sizes and counts that come from outside (shapes, manifests, options).
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>

#include "zero/error.hpp"

namespace zero {

// a x b and a + b, or nothing where the result does not fit in T (no wrap-around).
template <std::unsigned_integral T>
constexpr std::optional<T> checked_mul(T a, T b) {
  T r{};
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
template <std::unsigned_integral T>
constexpr std::optional<T> checked_add(T a, T b) {
  T r{};
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The same, throwing invalid_argument where the result would wrap; `what...` names the quantity
// ("plan: unit 'fc1': gathered bytes") and the message shows the operands.
template <std::unsigned_integral T, class... What>
T mul_or_fail(T a, T b, const What&... what) {
  if (const auto r = checked_mul(a, b)) return *r;
  fail(error_kind::invalid_argument, what..., ": ", a, " x ", b, " does not fit in ", 8 * sizeof(T), " bits");
}
template <std::unsigned_integral T, class... What>
T add_or_fail(T a, T b, const What&... what) {
  if (const auto r = checked_add(a, b)) return *r;
  fail(error_kind::invalid_argument, what..., ": ", a, " + ", b, " does not fit in ", 8 * sizeof(T), " bits");
}

}  // namespace zero
