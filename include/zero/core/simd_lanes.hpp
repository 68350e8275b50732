// simd::load_lanes / store_lanes: W elements of a float, bf16 or fp16 array as a pack, converted exactly as one element is.
#pragma once

#include "zero/core/simd.hpp"

#if defined(ZERO_HOST_SIMD)
#include <type_traits>

#include "zero/core/half_types.hpp"

// Each conversion is the lane-wise transcription of its scalar twin in core/half_types.hpp and
// of store_as (core/numeric.hpp): the same integer steps on 32-bit lanes, each branch computed for
// every lane and chosen by a mask. tests/core/test_host_loops.cpp compares them with the scalar ones
// over every 2-byte pattern and the float classes (NaN payloads, infinities, subnormals, ties).
namespace zero::simd {

// The element types a pack loads and stores; a rule over any other falls back to the scalar loop.
template <class T>
concept lane_type = std::is_same_v<std::remove_const_t<T>, float> || std::is_same_v<std::remove_const_t<T>, bf16> ||
                    std::is_same_v<std::remove_const_t<T>, fp16>;

namespace detail {

// W 2-byte patterns widened to 32-bit lanes, and back (every lane below 2^16: exact).
template <int W>
ZERO_SIMD_INLINE void load_u16(typename pack<W>::u32& r, const void* p) {
  lanes<std::uint16_t, W> h;
  std::memcpy(&h, p, sizeof h);
  r = __builtin_convertvector(h, typename pack<W>::u32);
}
template <int W>
ZERO_SIMD_INLINE void store_u16(void* p, const typename pack<W>::u32& x) {
  const lanes<std::uint16_t, W> h = __builtin_convertvector(x, lanes<std::uint16_t, W>);
  std::memcpy(p, &h, sizeof h);
}

// detail::bf16_bits_to_float: the upper half of a binary32.
template <int W>
ZERO_SIMD_INLINE pack<W> load_bf16(const void* p) {
  typename pack<W>::u32 b;
  load_u16<W>(b, p);
  return pack<W>::from_bits(b << 16);
}

// detail::float_to_bf16_bits: every NaN the canonical one, otherwise round to nearest even.
template <int W>
ZERO_SIMD_INLINE void store_bf16(void* p, const pack<W>& f) {
  using u32 = typename pack<W>::u32;
  const u32& u = f.bits();
  u32 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  assign_where<W>(r, (u & 0x7fffffffu) > 0x7f800000u, u32{} + std::uint32_t{canonical_bf16_nan});
  store_u16<W>(p, r);
}

// detail::fp16_bits_to_float. The subnormal branch is one exact multiplication instead of the
// scalar loop: the value is mant x 2^-24 with mant < 2^10, a normal float whatever the rounding
// mode or flush-to-zero setting, so the bits are those the loop assembles.
template <int W>
ZERO_SIMD_INLINE pack<W> load_fp16(const void* p) {
  using u32 = typename pack<W>::u32;
  using i32 = typename pack<W>::i32;
  u32 h;
  load_u16<W>(h, p);
  const u32 sign = (h & 0x8000u) << 16;
  const u32 exp = (h >> 10) & 0x1fu;
  const u32 mant = h & 0x03ffu;
  u32 biased = exp + 112u;
  assign_where<W>(biased, exp == 0x1fu, u32{} + 0xffu);  // Inf/NaN: the payload is carried over
  u32 r = sign | (biased << 23) | (mant << 13);
  const typename pack<W>::f32 sub_value =
      __builtin_convertvector(reinterpret_cast<const i32&>(mant), typename pack<W>::f32) * 0x1p-24f;
  assign_where<W>(r, exp == 0u, sign | reinterpret_cast<const u32&>(sub_value));
  return pack<W>::from_bits(r);
}

// detail::float_to_fp16_bits: the subnormal, normal, overflow and NaN results, each computed for
// every lane and assigned where it applies, the scalar function's first test last.
template <int W>
ZERO_SIMD_INLINE void store_fp16(void* p, const pack<W>& f) {
  using u32 = typename pack<W>::u32;
  const u32& u = f.bits();
  const u32 sign = (u >> 16) & 0x8000u;
  const u32 a = u & 0x7fffffffu;
  // Subnormal result q (+1 when rounding up): shift 126 - exp is 14..24 for the lanes that use it;
  // other lanes shift by 14 so that no lane shifts by 32 or more.
  const u32 exp = a >> 23;
  u32 shift = u32{} + 14u;
  assign_where<W>(shift, (exp >= 102u) & (exp < 113u), 126u - exp);
  const u32 mant = (a & 0x007fffffu) | 0x00800000u;
  const u32 q = mant >> shift;
  const u32 rem = mant & (((u32{} + 1u) << shift) - 1u);
  const u32 half = (u32{} + 1u) << (shift - 1u);
  const auto up = (rem > half) | ((rem == half) & ((q & 1u) != 0u));
  u32 r = sign | (q + (reinterpret_cast<const u32&>(up) & 1u));
  assign_where<W>(r, exp < 102u, sign);  // below half the smallest subnormal: a signed zero
  // Normal result: rebias and round the 13 dropped bits to nearest even in one add.
  assign_where<W>(r, a >= 0x38800000u, sign | ((a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13));
  assign_where<W>(r, a >= 0x477ff000u, sign | 0x7c00u);
  assign_where<W>(r, a > 0x7f800000u, u32{} + std::uint32_t{canonical_fp16_nan});
  store_u16<W>(p, r);
}

}  // namespace detail

// Elements p[0..W) widened to float, exactly as static_cast<float>(p[i]).
template <int W, lane_type T>
ZERO_SIMD_INLINE pack<W> load_lanes(const T* p) {
  using E = std::remove_const_t<T>;
  if constexpr (std::is_same_v<E, float>) return pack<W>::load(p);
  else if constexpr (std::is_same_v<E, bf16>) return detail::load_bf16<W>(p);
  else return detail::load_fp16<W>(p);
}

// x stored into p[0..W) exactly as p[i] = store_as<T>(x[i]): rounded to T, every NaN canonical.
template <int W, lane_type T>
ZERO_SIMD_INLINE void store_lanes(T* p, const pack<W>& x) {
  if constexpr (std::is_same_v<T, float>) canonical(x).store(p);
  else if constexpr (std::is_same_v<T, bf16>) detail::store_bf16<W>(p, x);
  else detail::store_fp16<W>(p, x);
}

}  // namespace zero::simd

#endif
