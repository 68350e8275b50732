// Range checks of user-given numbers (hyper-parameters, options) that name the field and its valid range.
#pragma once

#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

#include "zero/error.hpp"

namespace zero::detail {

// The shortest text that reads back as the same float ("1e+39" becomes "inf" only when it is inf),
// so a message never shows 1 for a value that is a hair above it.
inline std::string show(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// `owner` names the struct ("optim::adamw", "engine_options"), `field` the member.
[[noreturn]] inline void bad_value(std::string_view owner, std::string_view field, std::string_view range, float v) {
  fail(error_kind::invalid_argument, owner, ": ", field, " must be ", range, ", got ", show(v));
}

// finite and >= 0
inline void require_non_negative(std::string_view owner, std::string_view field, float v) {
  if (!(std::isfinite(v) && v >= 0.0f)) bad_value(owner, field, "finite and >= 0", v);
}
// finite and > 0
inline void require_positive(std::string_view owner, std::string_view field, float v) {
  if (!(std::isfinite(v) && v > 0.0f)) bad_value(owner, field, "finite and > 0", v);
}
// in [0, 1): a decay rate whose powers shrink (1 - beta^t is never 0)
inline void require_unit_interval(std::string_view owner, std::string_view field, float v) {
  if (!(v >= 0.0f && v < 1.0f)) bad_value(owner, field, "in [0, 1)", v);
}
// a finite power of two (2^k for any integer k): scaling by it is exact
inline void require_power_of_two(std::string_view owner, std::string_view field, float v) {
  int exponent = 0;
  if (!(std::isfinite(v) && v > 0.0f && std::frexp(v, &exponent) == 0.5f))
    bad_value(owner, field, "a finite power of two (..., 0.5, 1, 2, ...)", v);
}

}  // namespace zero::detail
