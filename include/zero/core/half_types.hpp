// Host/device 2-byte float types zero::bf16 and zero::fp16, bit-compatible with CUDA's __nv_bfloat16 and __half.
#pragma once

#include <cstdint>
#include <type_traits>

#include "zero/config.hpp"

namespace zero {

// The one NaN each 2-byte type is narrowed to: positive, quiet, no payload. The same invalid
// operation gives different NaN bits on different hardware (x86's default NaN is 0xffc00000, CUDA's
// 0x7fffffff), so a payload or sign carried over from the float would make host and device results
// differ in exactly the steps that overflow.
inline constexpr std::uint16_t canonical_bf16_nan = 0x7fc0;
inline constexpr std::uint16_t canonical_fp16_nan = 0x7e00;

namespace detail {

// __builtin_bit_cast instead of std::bit_cast: std::bit_cast is a host-only
// function under nvcc, while the builtin is understood (and constexpr) in
// g++, clang and nvcc alike, on host and device.
ZERO_HD constexpr std::uint32_t float_to_u32(float f) noexcept { return __builtin_bit_cast(std::uint32_t, f); }

ZERO_HD constexpr float u32_to_float(std::uint32_t u) noexcept { return __builtin_bit_cast(float, u); }

// All conversions below are pure integer bit manipulation, so they do not
// depend on the FPU rounding mode, flush-to-zero settings or fast-math flags,
// and give identical results on host and device.

ZERO_HD constexpr std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t u = float_to_u32(f);
  // NaN must be handled before rounding: a NaN whose payload lies only in
  // the low 16 bits would otherwise truncate to the Inf pattern, and the
  // rounding add can carry out of 0x7fffffff into the sign bit. Every NaN
  // becomes the one canonical quiet NaN (see canonical_bf16_nan).
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return canonical_bf16_nan;
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit, so an exact
  // tie only rounds up when the kept part is odd. A carry out of the
  // mantissa correctly bumps the exponent, and finite values at or above
  // max + half ulp carry into the Inf pattern 0x7f80 as RNE requires.
  const std::uint32_t lsb = (u >> 16) & 1u;
  return static_cast<std::uint16_t>((u + 0x7fffu + lsb) >> 16);
}

ZERO_HD constexpr float bf16_bits_to_float(std::uint16_t b) noexcept {
  // bf16 is the upper half of a binary32, so widening is exact.
  return u32_to_float(static_cast<std::uint32_t>(b) << 16);
}

ZERO_HD constexpr std::uint16_t float_to_fp16_bits(float f) noexcept {
  const std::uint32_t u = float_to_u32(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;

  // NaN first: its magnitude bits compare above every threshold below and
  // would otherwise become Inf. Every NaN becomes the canonical quiet NaN.
  if (a > 0x7f800000u) {
    return canonical_fp16_nan;
  }
  // 0x477ff000 is 65520 = 65504 (max finite) + half an ulp. The tie goes to
  // the even neighbour, which is Inf, so ">=" is correct. Also covers Inf.
  if (a >= 0x477ff000u) {
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  // Normal result (|f| >= 2^-14): rebias the exponent (127 - 15 = 112) and
  // round the 13 dropped bits to nearest even in one add. A mantissa carry
  // bumps the exponent; the threshold above keeps the result below Inf.
  if (a >= 0x38800000u) {
    const std::uint32_t lsb = (a >> 13) & 1u;
    return static_cast<std::uint16_t>(sign | ((a - 0x38000000u + 0x0fffu + lsb) >> 13));
  }
  // Subnormal result: the value is q * 2^-24. Float exponents below 102
  // (|f| < 2^-25, which includes float zeros and subnormals) are below half
  // the smallest subnormal and round to a signed zero.
  const std::uint32_t exp = a >> 23;
  if (exp < 102u) {
    return static_cast<std::uint16_t>(sign);
  }
  // |f| = mant * 2^(exp - 150), so q = mant >> (126 - exp); shift is 14..24.
  const std::uint32_t mant = (a & 0x007fffffu) | 0x00800000u;
  const std::uint32_t shift = 126u - exp;
  const std::uint32_t q = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  const std::uint32_t up = (rem > half || (rem == half && (q & 1u) != 0u)) ? 1u : 0u;
  // q + up may reach 0x400, which is exactly the smallest normal 2^-14.
  return static_cast<std::uint16_t>(sign | (q + up));
}

ZERO_HD constexpr float fp16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t exp = (static_cast<std::uint32_t>(h) >> 10) & 0x1fu;
  std::uint32_t mant = static_cast<std::uint32_t>(h) & 0x03ffu;
  if (exp == 0x1fu) {
    // Inf or NaN; the NaN payload is carried over unchanged.
    return u32_to_float(sign | 0x7f800000u | (mant << 13));
  }
  if (exp != 0u) {
    return u32_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
  if (mant == 0u) {
    return u32_to_float(sign);
  }
  // fp16 subnormals are normal floats: shift the leading one up to the
  // implicit-bit position, lowering the exponent from that of 2^-14 (113).
  // A loop (at most 10 steps) instead of a count-leading-zeros intrinsic
  // keeps this constexpr and identical on host and device.
  std::uint32_t e = 113u;
  while ((mant & 0x0400u) == 0u) {
    mant <<= 1;
    --e;
  }
  return u32_to_float(sign | (e << 23) | ((mant & 0x03ffu) << 13));
}

}  // namespace detail

// bfloat16: 1 sign, 8 exponent, 7 mantissa bits; same layout as __nv_bfloat16.
struct bf16 {
  std::uint16_t bits;

  bf16() = default;

  ZERO_HD constexpr explicit bf16(float f) noexcept : bits(detail::float_to_bf16_bits(f)) {}

  ZERO_HD static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 r{};
    r.bits = b;
    return r;
  }

  ZERO_HD constexpr std::uint16_t to_bits() const noexcept { return bits; }

  ZERO_HD constexpr explicit operator float() const noexcept { return detail::bf16_bits_to_float(bits); }
};

// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits; same layout as __half.
struct fp16 {
  std::uint16_t bits;

  fp16() = default;

  ZERO_HD constexpr explicit fp16(float f) noexcept : bits(detail::float_to_fp16_bits(f)) {}

  ZERO_HD static constexpr fp16 from_bits(std::uint16_t b) noexcept {
    fp16 r{};
    r.bits = b;
    return r;
  }

  ZERO_HD constexpr std::uint16_t to_bits() const noexcept { return bits; }

  ZERO_HD constexpr explicit operator float() const noexcept { return detail::fp16_bits_to_float(bits); }
};

ZERO_HD constexpr float to_float(bf16 x) noexcept { return detail::bf16_bits_to_float(x.bits); }
ZERO_HD constexpr float to_float(fp16 x) noexcept { return detail::fp16_bits_to_float(x.bits); }

// These types are memcpy'd to and from device buffers of __nv_bfloat16 / __half.
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);
static_assert(sizeof(fp16) == 2 && alignof(fp16) == 2);
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);
static_assert(std::is_trivially_copyable_v<fp16> && std::is_standard_layout_v<fp16>);
static_assert(std::is_trivially_default_constructible_v<bf16>);
static_assert(std::is_trivially_default_constructible_v<fp16>);

}  // namespace zero
