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
ZERO_HD inline float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace zero::fp
