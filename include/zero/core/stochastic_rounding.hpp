// Stochastic rounding to bf16 whose random bits are a hash of values, and two bf16 values in one 32-bit word.
#pragma once

// Why a hash of values and not a random generator: the engine's results must not depend on the rank,
// the stage, the world size or the system. An element's values (its weight and the values being
// rounded) and the step are the same wherever the element is updated, so bits drawn from them are
// too; a generator's position, a thread's or a rank's, is not. Why a hand-written hash: it runs per
// element inside the optimizer's rule, on a float, on a host SIMD pack's lanes and on the device, as
// a handful of integer operations; the library's file hash (XXH3) is none of these.

#include <cstdint>
#include <type_traits>

#include "zero/config.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/half_types.hpp"
#include "zero/core/simd.hpp"

namespace zero::stochastic {

// lowbias32 (C. Wellons, "hash-prospector"): a bijection of 32 bits whose output bits each flip with
// probability close to 1/2 when any input bit flips. Written once over U, std::uint32_t or a host SIMD
// vector of them (the same wrapping multiplies and shifts, lane by lane); in place, because a bare
// vector is never passed by value (core/simd.hpp).
template <class U>
ZERO_HD constexpr void mix32(U& x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
}

// The key of step t (1-based): the hash input every element's bits are mixed with in that step.
inline constexpr std::uint32_t step_key(std::uint64_t t) {
  std::uint32_t k = static_cast<std::uint32_t>(t) ^ (static_cast<std::uint32_t>(t >> 32) * 0x9e3779b9u);
  mix32(k);
  return k;
}

// A value type's bits: a float's, or each lane's of a simd::pack (V of an optimizer's rule).
template <class V>
struct bits_of;
template <>
struct bits_of<float> {
  using type = std::uint32_t;
  ZERO_HD static type get(float x) { return detail::float_to_u32(x); }
  ZERO_HD static float make(type u) { return detail::u32_to_float(u); }
};
#if defined(ZERO_HOST_SIMD)
template <int W>
struct bits_of<simd::pack<W>> {
  using type = typename simd::pack<W>::u32;
  ZERO_SIMD_INLINE static const type& get(const simd::pack<W>& x) { return x.bits(); }
  ZERO_SIMD_INLINE static simd::pack<W> make(const type& u) { return simd::pack<W>::from_bits(u); }
};
#endif

// h = 32 random bits for the values of one element at the step of `key`: a hash of the bits of w, a
// and b. Equal inputs give equal bits; any other input gives unrelated ones.
template <class V>
ZERO_HD void hash(const V& w, const V& a, const V& b, std::uint32_t key, typename bits_of<V>::type& h) {
  using B = bits_of<V>;
  h = B::get(w) ^ key;
  mix32(h);
  h ^= B::get(b);
  mix32(h);
  h ^= B::get(a);
  mix32(h);
}

// x (a float's bits) rounded to a bf16's (the low 16 bits cleared), up in magnitude with probability
// equal to the fraction dropped: (low 16 bits of x + the low 16 bits of r) carries into the kept part
// exactly then, for r uniform. So the result's expectation is x: the rounding errors of a value
// updated every step average out instead of stalling it, which round-to-nearest does once an update
// is below half a bf16 ulp. For finite x; a finite x within one bf16 ulp of the largest float may
// round to infinity, as rounding up there must.
template <class U>
ZERO_HD constexpr void round_to_bf16_bits(U& x, const U& r) {
  x = (x + (r & 0xffffu)) & 0xffff0000u;
}

// Two values kept as bf16 in one 32-bit word: `hi` in the upper half, `lo` in the lower. Read as a
// float the word is hi to bf16 precision, so it is finite exactly when hi is; where hi is not finite
// or lo is NaN the word is the canonical NaN (hi NaN, lo +0), so a NaN in a slot is always canonical.
// Each value is rounded stochastically with 16 bits of r: hi with the upper, lo with the lower.
template <class V>
ZERO_HD V pack_pair(const V& hi, const V& lo, const typename bits_of<V>::type& r) {
  using B = bits_of<V>;
  using U = typename B::type;
  const U h = B::get(hi), l = B::get(lo);
  const U r_hi = r >> 16;
  U h_rounded = h, l_rounded = l;
  round_to_bf16_bits(h_rounded, r_hi);
  round_to_bf16_bits(l_rounded, r);
  U word = h_rounded | (l_rounded >> 16);
  // Where the word must be the canonical NaN, all ones (bitwise, without comparisons: a comparison of
  // integer lanes has no instruction at SSE2 or AVX-512F, and the compiler would split it lane by lane):
  // an all-ones exponent is Inf or NaN, hi's before rounding (a NaN's bits plus r may carry into the
  // sign, or wrap) and after (a finite hi may round to Inf); lo is NaN where its magnitude is above
  // Inf's (lo Inf, or rounded to Inf, stays: the word is still finite).
  // (An exponent plus 1 carries into bit 8 exactly where it is all ones.)
  const U inf_or_nan_hi = ((((h >> 23) & 0xffu) + 1u) | (((h_rounded >> 23) & 0xffu) + 1u)) >> 8;
  const U nan_lo = ((U{} + 0x7f800000u) - (l & 0x7fffffffu)) >> 31;
  const U bad = U{} - (inf_or_nan_hi | nan_lo);
  word = (word & ~bad) | (bad & static_cast<std::uint32_t>(fp::canonical_nan_bits32));
  return B::make(word);
}
template <class V>
ZERO_HD void unpack_pair(const V& word, V& hi, V& lo) {
  using B = bits_of<V>;
  const typename B::type u = B::get(word);
  hi = B::make(u & 0xffff0000u);
  lo = B::make(u << 16);
}

}  // namespace zero::stochastic
