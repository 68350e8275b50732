// Element types the collectives move, and the type each is summed in.
#pragma once

#include <type_traits>

#include "zero/config.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/half_types.hpp"

namespace zero {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// Types a collective may carry: arithmetic types and the two 2-byte floats.
template <class T>
inline constexpr bool is_wire_type_v = std::is_arithmetic_v<T> || is_half_v<T>;

// 2-byte floats are summed in fp32 and rounded once at the end: N-1 roundings to 8 or 11 bits
// would lose the gradient. Everything else is summed in its own type.
template <class T>
struct accumulate_as {
  using type = T;
};
template <>
struct accumulate_as<bf16> {
  using type = float;
};
template <>
struct accumulate_as<fp16> {
  using type = float;
};
template <class T>
using accumulate_as_t = typename accumulate_as<T>::type;

// An accumulated value stored as T: 2-byte floats rounded once, float and double as they are, and
// every NaN the canonical one of T (fp::canonical, canonical_bf16_nan, canonical_fp16_nan), so a sum
// or a rule stores the same bits on every system.
template <class T, class A>
ZERO_HD inline T store_as(A x) {
  if constexpr (std::is_floating_point_v<T>) return fp::canonical(static_cast<T>(x));
  else return static_cast<T>(x);
}

}  // namespace zero
