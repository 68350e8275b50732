// Correctly rounded float arithmetic that the compiler may not fuse, so host and device agree bit for bit.
#pragma once

#include <cmath>

#include "zero/config.hpp"

// Why these wrappers: an optimizer rule is written once and must give the same bits on every
// backend. nvcc contracts a*b+c into an FMA unless told otherwise, so on the device each operation
// is an explicitly rounded intrinsic. On the host the zero dependency compiles with
// -ffp-contract=off (GCC and Clang would otherwise fuse under -mfma), and sqrt/div are IEEE.
namespace zero::fp {

ZERO_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ZERO_HD inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ZERO_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ZERO_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// The one NaN of each width that a stored result carries: positive, quiet, no payload. Hardware
// disagrees on the NaN an invalid operation makes (x86: 0xffc00000, CUDA: 0x7fffffff) and x86
// propagates an input NaN's payload, so every NaN a rule or a sum stores is replaced by this one, and
// host and device results stay bit-identical even in a step that overflows.
inline constexpr unsigned canonical_nan_bits32 = 0x7fc00000u;
inline constexpr unsigned long long canonical_nan_bits64 = 0x7ff8000000000000ull;
ZERO_HD inline float canonical(float x) { return x != x ? __builtin_bit_cast(float, canonical_nan_bits32) : x; }
ZERO_HD inline double canonical(double x) { return x != x ? __builtin_bit_cast(double, canonical_nan_bits64) : x; }

// c ? a : b, written as a function so that a rule can branch per lane on a simd::pack (core/simd.hpp).
ZERO_HD inline float select(bool c, float a, float b) { return c ? a : b; }

ZERO_HD inline float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace zero::fp
