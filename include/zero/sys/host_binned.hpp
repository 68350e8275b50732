// sys::host_binned: the reproducible mode's host passes (summary, cut into words, merge, rounding) on SIMD packs, the
// scalar code's bits.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "zero/core/binned.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/sys/host_loop.hpp"

// Why these are exact: the scalar rules are integer arithmetic on the values' bits, and each packed
// pass computes the same integers. The summary, the merge and the fallback rounding do it in integer
// lanes (the largest magnitude's bits, int64 additions, 128-bit steps). The cut and the common
// rounding do it in double lanes where every operation is exact or its rounding is the one the rule
// needs: a float times a power of two, truncations, differences a double holds, sums below 2^53, and
// a rounding to odd then to nearest (add_words, round_words_odd), under MXCSR's IEEE default
// (ieee_default). Where a rounded sum has no store and its values lie within few enough binades, it
// skips the words: their sum in doubles is exact there, and its float conversion the rule's rounding
// (sum_in_doubles). The one float operation of the rules themselves, the square summary's division by
// the divisor, is the IEEE division lane by lane. The summary runs on packs at every level; the cut,
// merge and rounding on AVX-512 only, whose 64-bit lanes have the conversions and widths they need
// (with AVX2 and SSE2 the packed cut and merge measured slower than the scalar loop), so other levels
// run the rules one element at a time. The loops are compiled per ISA and picked at run time as in
// sys/host_loop.hpp.
namespace zero::sys::host_binned {

#if defined(ZERO_HOST_SIMD)

namespace detail {

template <class T, int W>
using lanes = simd::lanes<T, W>;

// MXCSR at the IEEE default (round to nearest, subnormals read and written, every exception masked)
// for the object's life, the caller's state restored after it, flags included. The cut's conversion
// and the rounding's arithmetic in double lanes are exact only there: with denormals-are-zero a
// subnormal gradient would be cut as zero, with flush-to-zero a subnormal sum would round to zero.
class ieee_default {
 public:
  ieee_default() : saved_(_mm_getcsr()) {
    if ((saved_ & ~flags) != standard) _mm_setcsr(standard);
  }
  // Restored whenever anything differs, the flags too: a float conversion of a double sum that is
  // not a float (sum_in_doubles) raises the inexact flag, which the caller's state need not have.
  ~ieee_default() {
    if (_mm_getcsr() != saved_) _mm_setcsr(saved_);
  }
  ieee_default(const ieee_default&) = delete;
  ieee_default& operator=(const ieee_default&) = delete;

 private:
  static constexpr unsigned standard = 0x1f80, flags = 0x3f;  // the power-on state; the sticky exception flags
  unsigned saved_;
};

// The powers of two a cut at `top` multiplies by: scale[k] = 2^-(lsb + 32 k), where lsb is the weight
// of the lowest kept bin's lowest bit (bin top - 2). Normal doubles for every top.
// `above`: the bits of the least float magnitude with bits above the top bin, 2^(lsb + 96) (every
// float is at or above a subnormal's bits; none is above where that power passes the largest finite).
struct cut_scales {
  lanes<double, 8> scale[binned::words + 1];
  double factor[binned::words + 1];  // the same, one lane's
  std::uint32_t above;
  explicit cut_scales(int top) {
    using fmt = binned::format<float>;
    const int lsb = binned::word_bits * (top - binned::words + 1) + fmt::lowest;
    for (int k = 0; k <= binned::words; ++k) {
      factor[k] = __builtin_ldexp(1.0, -(lsb + binned::word_bits * k));
      scale[k] = lanes<double, 8>{} + factor[k];
    }
    const int e = lsb + binned::word_bits * binned::words;  // at least -128, past float's subnormals
    above = e > 127     ? 0x7f800000u
            : e >= -126 ? static_cast<std::uint32_t>(e + 127) << 23
                        : 1u << (e - fmt::min_exponent);
  }
};

// binned::to_words for K = 3 on 8 values, in double lanes, added to d (d[0] the top bin's word). With
// t_k = trunc(x 2^-(lsb + 32 k)), the word of bin top - 2 + k is t_k - 2^32 t_(k+1): t_k holds x's bits
// from that bin up, less those above it, which is an integer below 2^32 in magnitude. Every step is
// exact: x (24 significant bits) times a power of two stays far inside double's range, a truncation
// drops bits only, and a difference whose exact value a double holds is that value. Truncation is odd,
// so a negative value's words are its magnitude's negated, as to_words signs them; an infinity or a NaN
// is cut as zero, as to_words has it. Sums of up to 2^21 values' words stay below 2^53: exact. The
// conversion reads subnormals only under the IEEE default of MXCSR (ieee_default above), which every
// loop here runs in. Written out in intrinsics (GCC -O2 kept a loop over the products, its values on
// the stack), not always_inline (as floor_lanes below).
//
// The bits above the top bin drop as to_words drops them: t_3 is subtracted from the top word. A cut
// at the agreed top never has such bits, so Above = false leaves t_3 out (10 operations on 8 doubles
// instead of 13, where the same cut in 64-bit integer shifts took about 30 instructions) and returns
// the lanes that do have them, which the caller cuts again with Above = true.
template <bool Above>
__attribute__((target("avx512f,avx512dq,avx512vl"))) inline unsigned add_words_of(lanes<double, 8> (&d)[binned::words],
                                                                                  const lanes<std::uint32_t, 8>& bits,
                                                                                  const cut_scales& c) {
  constexpr int trunc = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  __m256i u;
  std::memcpy(&u, &bits, sizeof u);
  const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __mmask8 finite = _mm256_cmplt_epu32_mask(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m512d x = _mm512_maskz_cvtps_pd(finite, _mm256_castsi256_ps(u));  // an infinity or NaN: no bits
  __m512d s[binned::words + 1];
  std::memcpy(s, c.scale, sizeof s);
  const __m512d t0 = _mm512_maskz_roundscale_pd(0xff, _mm512_mul_pd(x, s[0]), trunc);
  const __m512d t1 = _mm512_maskz_roundscale_pd(0xff, _mm512_mul_pd(x, s[1]), trunc);
  const __m512d t2 = _mm512_maskz_roundscale_pd(0xff, _mm512_mul_pd(x, s[2]), trunc);
  const __m512d base = _mm512_set1_pd(0x1p32);
  __m512d w[binned::words];
  std::memcpy(w, d, sizeof w);
  __mmask8 above = 0;
  if constexpr (Above) {
    const __m512d t3 = _mm512_maskz_roundscale_pd(0xff, _mm512_mul_pd(x, s[3]), trunc);
    w[0] = _mm512_add_pd(w[0], _mm512_fnmadd_pd(t3, base, t2));  // t2 - 2^32 t3, exact: fused or not
  } else {
    above = _mm256_mask_cmpge_epu32_mask(finite, magnitude, _mm256_set1_epi32(static_cast<int>(c.above)));
    w[0] = _mm512_add_pd(w[0], t2);
  }
  w[1] = _mm512_add_pd(w[1], _mm512_fnmadd_pd(t2, base, t1));
  w[2] = _mm512_add_pd(w[2], _mm512_fnmadd_pd(t1, base, t0));
  std::memcpy(d, w, sizeof w);
  return above;
}
// The same on 4 values with AVX2 (AVX's truncation; no FMA needed: 2^32 t is exact, so is the difference).
template <bool Above>
__attribute__((target("avx2"))) inline unsigned add_words_of(lanes<double, 4> (&d)[binned::words],
                                                             const lanes<std::uint32_t, 4>& bits, const cut_scales& c) {
  constexpr int trunc = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  __m128i u;
  std::memcpy(&u, &bits, sizeof u);
  const __m128i magnitude = _mm_and_si128(u, _mm_set1_epi32(0x7fffffff));
  // (signed comparisons: every magnitude's bits are below 2^31)
  const __m128i finite = _mm_cmplt_epi32(magnitude, _mm_set1_epi32(0x7f800000));
  const __m256d x = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_and_si128(u, finite)));  // an infinity or NaN: +0
  const __m256d t0 = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(c.factor[0])), trunc);
  const __m256d t1 = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(c.factor[1])), trunc);
  const __m256d t2 = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(c.factor[2])), trunc);
  const __m256d base = _mm256_set1_pd(0x1p32);
  __m256d w[binned::words];
  std::memcpy(w, d, sizeof w);
  unsigned above = 0;
  if constexpr (Above) {
    const __m256d t3 = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(c.factor[3])), trunc);
    w[0] = _mm256_add_pd(w[0], _mm256_sub_pd(t2, _mm256_mul_pd(t3, base)));
  } else {
    const __m128i high = _mm_cmpgt_epi32(magnitude, _mm_set1_epi32(static_cast<int>(c.above - 1)));
    above = static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(_mm_and_si128(high, finite))));
    w[0] = _mm256_add_pd(w[0], t2);
  }
  w[1] = _mm256_add_pd(w[1], _mm256_sub_pd(t1, _mm256_mul_pd(t2, base)));
  w[2] = _mm256_add_pd(w[2], _mm256_sub_pd(t0, _mm256_mul_pd(t1, base)));
  std::memcpy(d, w, sizeof w);
  return above;
}
// Integer-valued double lanes below 2^51 in magnitude as int64 lanes: AVX-512DQ's conversion, or on
// AVX2 the bits of x + 1.5 2^52 (whose ulp is 1 there, so the sum is exact) less that constant's.
ZERO_SIMD_INLINE void to_int64(lanes<std::int64_t, 8>& out, const lanes<double, 8>& x) {
  out = __builtin_convertvector(x, lanes<std::int64_t, 8>);
}
ZERO_SIMD_INLINE void to_int64(lanes<std::int64_t, 4>& out, const lanes<double, 4>& x) {
  constexpr double magic = 0x1.8p52;
  const lanes<double, 4> shifted = x + magic;
  lanes<std::int64_t, 4> bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  out = bits - std::bit_cast<std::int64_t>(magic);
}

template <bool Above, int L, class G>
ZERO_SIMD_INLINE unsigned add_words(std::size_t j, const cut_scales& c, const G* g,
                                    lanes<double, L> (&d)[binned::words]) {
  return add_words_of<Above>(d, simd::load_lanes<L>(g + j).bits(), c);
}
template <int L, class G>
ZERO_SIMD_INLINE void to_bins_words(std::size_t j, const cut_scales& c, const G* g,
                                    lanes<std::int64_t, L> (&out)[binned::words]) {
  lanes<double, L> d[binned::words] = {};
  if (add_words<false, L>(j, c, g, d) != 0) {
    for (auto& x : d) x = lanes<double, L>{};
    add_words<true, L>(j, c, g, d);
  }
  for (int k = 0; k < binned::words; ++k) to_int64(out[k], d[k]);
}
template <int L, class G>
ZERO_SIMD_INLINE void to_bins(std::size_t j, const cut_scales& c, const G* g, std::int64_t* const* w) {
  lanes<std::int64_t, L> words[binned::words];
  to_bins_words<L>(j, c, g, words);
  for (int k = 0; k < binned::words; ++k) std::memcpy(w[k] + j, &words[k], sizeof words[k]);
}

// The cut's lanes in a W-float loop: 8 doubles with AVX-512, 4 with AVX2; SSE2 runs the rule (0).
template <int W>
inline constexpr int cut_lanes = W == 16  ? 8
                                 : W == 8 ? 4
                                          : 0;

// The cut is packed with AVX-512 and AVX2, the merge and the rounding with AVX-512 only (W == 16,
// eight 64-bit lanes): with AVX2 and SSE2 their integer forms measured slower than the scalar loop
// (AVX2 has no conversion between doubles and 64-bit integers, and its 64-bit lanes no variable
// shifts both ways).
template <int W, class G>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::to_bins_rule& r, const G* g, std::int64_t* w0,
                           std::int64_t* w1, std::int64_t* w2) {
  constexpr int L = cut_lanes<W>;
  std::int64_t* const w[3] = {w0, w1, w2};
  std::size_t j = 0;
  if constexpr (L > 0) {
    const cut_scales c(r.top);
    for (; j + L <= n; j += L) to_bins<L>(j, c, g, w);
  }
  for (; j < n; ++j) r(j, g, w0, w1, w2);
}

// to_bins_adding_rule: the cut, then the store's planes re-expressed for the cut's top (plane k takes
// plane k - d, or nothing) added before the words are stored (where the store may be the output).
template <int W, class G>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::to_bins_adding_rule& r, const G* g, const std::int64_t* s0,
                           const std::int64_t* s1, const std::int64_t* s2, std::int64_t* w0, std::int64_t* w1,
                           std::int64_t* w2) {
  constexpr int K = binned::words, L = cut_lanes<W>;
  const int d = r.store_top == r.top ? 0 : r.store_top < 0 ? K : r.top - r.store_top;  // binned::realign's
  std::size_t j = 0;
  if constexpr (L > 0) {
    if (d >= 0) {
      const cut_scales c(r.top);
      const std::int64_t* const st[K] = {s0, s1, s2};
      std::int64_t* const out[K] = {w0, w1, w2};
      for (; j + L <= n; j += L) {
        lanes<std::int64_t, L> words[K], kept[K];
        to_bins_words<L>(j, c, g, words);
        // every store plane loaded before any is written: the output may be the store itself
        for (int k = 0; k < K; ++k) std::memcpy(&kept[k], st[k] + j, sizeof kept[k]);
        for (int k = 0; k < K; ++k) {
          if (k - d >= 0) words[k] += kept[k - d];
          std::memcpy(out[k] + j, &words[k], sizeof words[k]);
        }
      }
    }
  }
  for (; j < n; ++j) r(j, g, s0, s1, s2, w0, w1, w2);
}

// merge_bins_rule: each of the store's and the incoming words re-expressed for the common top (plane
// k takes plane k - d, or zero), then added. d is the same for every element, so the planes are chosen
// once; each pack loads all six planes before it stores, as the rule reads all before it writes.
template <int W>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::merge_bins_rule& r, std::int64_t* s0, std::int64_t* s1,
                           std::int64_t* s2, const std::int64_t* w0, const std::int64_t* w1, const std::int64_t* w2) {
  using i64 = lanes<std::int64_t, 8>;
  constexpr int K = binned::words;
  const auto shift = [&](int from) { return from == r.to ? 0 : from < 0 ? K : r.to - from; };  // binned::realign's d
  const int ds = shift(r.store_top), dw = shift(r.in_top);
  std::size_t j = 0;
  if (W == 16 && ds >= 0 && dw >= 0) {
    std::int64_t* const st[K] = {s0, s1, s2};
    const std::int64_t* const in[K] = {w0, w1, w2};
    for (; j + 8 <= n; j += 8) {
      i64 a[K], b[K];
      for (int k = 0; k < K; ++k) {
        std::memcpy(&a[k], st[k] + j, sizeof(i64));
        std::memcpy(&b[k], in[k] + j, sizeof(i64));
      }
      for (int k = 0; k < K; ++k) {
        i64 sum = i64{};
        if (k - ds >= 0) sum += a[k - ds];
        if (k - dw >= 0) sum += b[k - dw];
        std::memcpy(st[k] + j, &sum, sizeof(i64));
      }
    }
  }
  for (; j < n; ++j) r(j, s0, s1, s2, w0, w1, w2);
}

// floor(log2 x) of 8 non-zero 64-bit lanes read as unsigned: the exponent of x converted to double
// rounding toward zero, which is exact (a conversion to nearest can round up to the next power of 2).
// AVX-512DQ's conversion. This and the shifts below are not always_inline, as core/simd.hpp's
// sqrt_lanes, and are inlined into the AVX-512 loop by its flatten.
__attribute__((target("avx512f,avx512dq"))) inline void log2_lanes(lanes<std::int64_t, 8>& r,
                                                                   const lanes<std::int64_t, 8>& x) {
  __m512i v;
  std::memcpy(&v, &x, sizeof v);
  const __m512i d = _mm512_castpd_si512(_mm512_cvt_roundepu64_pd(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
  std::memcpy(&r, &d, sizeof r);
  r = (r >> 52) - 1023;
}

// x << c (Left) and x >> c (logical) per lane, 0 where c is outside [0, 64) (a negative c is a huge
// unsigned count): the instructions' own rule, where a vector shift in C++ would be undefined. (The
// masked form: the unmasked one reads an undefined register, GCC 12 warns.)
template <bool Left>
__attribute__((target("avx512f"))) inline void shift(lanes<std::int64_t, 8>& r, const lanes<std::int64_t, 8>& x,
                                                     const lanes<std::int64_t, 8>& c) {
  __m512i a, n;
  std::memcpy(&a, &x, sizeof a);
  std::memcpy(&n, &c, sizeof n);
  a = Left ? _mm512_mask_sllv_epi64(a, 0xff, a, n) : _mm512_mask_srlv_epi64(a, 0xff, a, n);
  std::memcpy(&r, &a, sizeof a);
}
inline constexpr bool shl = true, shr = false;  // shift<shl>, shift<shr>

// binned::round_128<float> for K = 3 on 8 elements, step by step: the 128-bit two's complement
// value, its sign and magnitude, the leading bit, the quantum (24 bits down, or the subnormals'),
// the significand q with round to nearest even from the half bit and the sticky bits, and
// from_quantum's bits. Integers only (the one conversion rounds toward zero explicitly), so neither
// the rounding mode nor flush-to-zero can change a bit. Every condition is a mask of all ones or
// zeros made from a sign bit (x >> 63, arithmetic), not a comparison, which GCC 12 lowers lane by
// lane for 64-bit lanes; a lane's unsigned 64 bits are held in int64 lanes.
// (The result through a reference: a vector returned by value from a function of the baseline ISA
// would change its ABI.)
ZERO_SIMD_INLINE void round_words(lanes<std::uint32_t, 8>& out, int top, const lanes<std::int64_t, 8>& a,
                                  const lanes<std::int64_t, 8>& b, const lanes<std::int64_t, 8>& c) {
  using i64 = lanes<std::int64_t, 8>;
  using fmt = binned::format<float>;
  // v = a 2^64 + b 2^32 + c as hi 2^64 + lo (hi signed); the carry out of the low halves' sum
  const i64 b_low = b << 32;
  const i64 lo = c + b_low;
  const i64 carry = (((c & b_low) | ((c | b_low) & ~lo)) >> 63) & 1;
  const i64 hi = a + (b >> 32) + (c >> 63) + carry;
  // the magnitude: 0 - (hi 2^64 + lo) = (0 - hi - [lo != 0]) 2^64 + (0 - lo) where negative
  const i64 negative = hi >> 63;  // all ones or zero
  const i64 lo_nonzero = (lo | -lo) >> 63;
  const i64 mlo = ((-lo) & negative) | (lo & ~negative);
  const i64 mhi = ((-hi + lo_nonzero) & negative) | (hi & ~negative);
  i64 lead_hi, lead_lo;
  log2_lanes(lead_hi, mhi);
  log2_lanes(lead_lo, mlo);
  const i64 hi_nonzero = (mhi | -mhi) >> 63;
  const i64 lead = ((lead_hi + 64) & hi_nonzero) | (lead_lo & ~hi_nonzero);
  const int lsb = binned::word_bits * (top - binned::words + 1) + fmt::lowest;
  const i64 unclamped = lead + (lsb - (fmt::precision - 1));
  const i64 subnormal = (unclamped - fmt::min_exponent) >> 63;
  const i64 quantum = (fmt::min_exponent & subnormal) | (unclamped & ~subnormal);
  const i64 r = quantum - lsb;  // bits below the quantum
  // r > 0: q = the bits from r up (none above the leading one), rounded by bit r - 1 and the ones below
  i64 from_lo, from_hi_up, from_hi_down;
  shift<shr>(from_lo, mlo, r);
  shift<shl>(from_hi_up, mhi, 64 - r);
  shift<shr>(from_hi_down, mhi, r - 64);
  i64 q = from_lo | from_hi_up | from_hi_down;
  i64 half_lo, half_hi;
  shift<shr>(half_lo, mlo, r - 1);
  shift<shr>(half_hi, mhi, r - 65);
  const i64 half = (half_lo | half_hi) & 1;
  // sticky: any bit below r - 1 (r - 1 <= 64: in lo alone, all of it at 64; above: all of lo and the
  // low r - 65 bits of hi)
  const i64 one = i64{} + 1;
  i64 one_lo, one_hi;
  shift<shl>(one_lo, one, r - 1);
  shift<shl>(one_hi, one, r - 65);
  const i64 in_lo = (r - 65) >> 63;
  const i64 lo_mask = ((one_lo - 1) & in_lo) | ~in_lo;
  const i64 hi_mask = (one_hi - 1) & ~((r - 66) >> 63);
  const i64 rest = (mlo & lo_mask) | (mhi & hi_mask);
  const i64 sticky = (rest | -rest) >> 63;
  q += half & (sticky | -(q & 1));
  // r <= 0: exact, q = lo << -r
  i64 exact;
  shift<shl>(exact, mlo, -r);
  const i64 not_positive = (r - 1) >> 63;
  q = (exact & not_positive) | (q & ~not_positive);
  // from_quantum: q 2^quantum with the sign; from the largest finite value up, infinity
  const i64 e = quantum - fmt::min_exponent;
  i64 bits = (e << 23) + q;
  const i64 infinite = ~((e - 256) >> 63) | ~((bits - 0x7f800000) >> 63);
  bits = (0x7f800000 & infinite) | (bits & ~infinite);
  bits |= negative & 0x80000000;
  const i64 all = mlo | mhi;
  bits &= (all | -all) >> 63;  // an exact zero is +0
  out = __builtin_convertvector(bits, lanes<std::uint32_t, 8>);
}
// binned::round_128<float> on 8 lanes through doubles, for packs whose magnitude is below 2^116 (any
// sum of up to 2^19 terms: their top words' digits are below 2^32). The sum a 2^64 + b 2^32 + c is
// normalized to hi 2^64 + lo (the carries of c and b moved up with arithmetic shifts, lo below 2^64),
// its magnitude is H 2^64 + L, and it is rounded to odd in 53 bits: H is exact as a double, L and then
// H 2^64 + L are rounded toward zero, and the lowest bit is set where either dropped a bit (the sum's
// drop measured exactly: S - H 2^64 is exact by Sterbenz's lemma). Toward zero twice is toward zero
// once, as H 2^64 lies on the sum's grid while the sum is below 2^117. Scaled by 2^lsb (exact) and
// converted to float to nearest: a value rounded to odd with two or more extra bits rounds as the value
// itself (Boldo and Melquiond), subnormal results and overflow to infinity included. Every operation's
// rounding is given in the instruction, not read from MXCSR. About 30 operations, where round_words'
// 128-bit steps take about 80. Returns false, having written nothing, where a lane's H is 2^52 or more.
__attribute__((target("avx512f,avx512dq,avx512vl"))) inline bool round_words_odd(lanes<std::uint32_t, 8>& out, int top,
                                                                                 const lanes<std::int64_t, 8>& a,
                                                                                 const lanes<std::int64_t, 8>& b,
                                                                                 const lanes<std::int64_t, 8>& c) {
  constexpr int zero_ward = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC,
                nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  constexpr __mmask8 all = 0xff;  // (the masked forms: see shift above)
  __m512i av, bv, cv;
  std::memcpy(&av, &a, sizeof av);
  std::memcpy(&bv, &b, sizeof bv);
  std::memcpy(&cv, &c, sizeof cv);
  const __m512i carried = _mm512_add_epi64(bv, _mm512_maskz_srai_epi64(all, cv, 32));
  const __m512i lo =
      _mm512_or_si512(_mm512_maskz_slli_epi64(all, carried, 32), _mm512_and_si512(cv, _mm512_set1_epi64(0xffffffff)));
  const __m512i hi = _mm512_add_epi64(av, _mm512_maskz_srai_epi64(all, carried, 32));
  // the magnitude: 0 - (hi 2^64 + lo) = (~hi + [lo == 0]) 2^64 + (0 - lo) where negative
  const __mmask8 negative = _mm512_movepi64_mask(hi);
  const __m512i mlo = _mm512_mask_sub_epi64(lo, negative, _mm512_setzero_si512(), lo);
  __m512i mhi = _mm512_mask_xor_epi64(hi, negative, hi, _mm512_set1_epi64(-1));
  mhi = _mm512_mask_add_epi64(mhi, negative & _mm512_testn_epi64_mask(lo, lo), mhi, _mm512_set1_epi64(1));
  if (_mm512_cmpge_epu64_mask(mhi, _mm512_set1_epi64(std::int64_t{1} << 52)) != 0) return false;
  const __m512d high = _mm512_mul_pd(_mm512_maskz_cvtepu64_pd(all, mhi), _mm512_set1_pd(0x1p64));  // exact
  const __m512d low = _mm512_maskz_cvt_roundepu64_pd(all, mlo, zero_ward);
  __mmask8 inexact = _mm512_cmpneq_epu64_mask(_mm512_maskz_cvtt_roundpd_epu64(all, low, _MM_FROUND_NO_EXC), mlo);
  const __m512d sum = _mm512_maskz_add_round_pd(all, high, low, zero_ward);
  inexact |= _mm512_cmp_pd_mask(_mm512_maskz_sub_round_pd(all, sum, high, nearest), low, _CMP_NEQ_OQ);
  const __m512i odd =
      _mm512_mask_or_epi64(_mm512_castpd_si512(sum), inexact, _mm512_castpd_si512(sum), _mm512_set1_epi64(1));
  const int lsb = binned::word_bits * (top - binned::words + 1) + binned::format<float>::lowest;
  const __m512i power = _mm512_set1_epi64(static_cast<std::int64_t>(1023 + lsb) << 52);  // 2^lsb, a normal double
  const __m512d scaled = _mm512_mul_pd(_mm512_castsi512_pd(odd), _mm512_castsi512_pd(power));
  __m256i bits = _mm256_castps_si256(_mm512_maskz_cvt_roundpd_ps(all, scaled, nearest));
  bits = _mm256_mask_or_epi32(bits, negative, bits, _mm256_set1_epi32(std::int32_t{-2147483647 - 1}));
  std::memcpy(&out, &bits, sizeof out);
  return true;
}
// The rounding of 8 lanes: round_words_odd, or round_words where its magnitude is too large.
ZERO_SIMD_INLINE void round_pack(lanes<std::uint32_t, 8>& out, int top, const lanes<std::int64_t, 8>& a,
                                 const lanes<std::int64_t, 8>& b, const lanes<std::int64_t, 8>& c) {
  if (!round_words_odd(out, top, a, b, c)) round_words(out, top, a, b, c);
}
ZERO_SIMD_INLINE void round_bins(std::size_t j, int top, float* g, const std::int64_t* w0, const std::int64_t* w1,
                                 const std::int64_t* w2) {
  lanes<std::int64_t, 8> a, b, c;
  std::memcpy(&a, w0 + j, sizeof a);
  std::memcpy(&b, w1 + j, sizeof b);
  std::memcpy(&c, w2 + j, sizeof c);
  lanes<std::uint32_t, 8> out;
  round_pack(out, top, a, b, c);
  std::memcpy(g + j, &out, sizeof out);
}

template <int W>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::round_bins_rule& r, float* g, const std::int64_t* w0,
                           const std::int64_t* w1, const std::int64_t* w2) {
  std::size_t j = 0;
  if constexpr (W == 16)  // AVX-512 only: AVX2 has neither the 64-bit lanes' conversion nor their width
    for (; j + 8 <= n; j += 8) round_bins(j, r.top, g, w0, w1, w2);
  for (; j < n; ++j) r(j, g, w0, w1, w2);
}

// Eight lanes' sums rounded in registers (round_pack); four rounded one at a time (binned::round: AVX2
// has neither the 64-bit lanes' conversions nor their width for round_words).
ZERO_SIMD_INLINE void round_lanes(float* out, int top, const lanes<std::int64_t, 8> (&w)[binned::words]) {
  lanes<std::uint32_t, 8> bits;
  round_pack(bits, top, w[0], w[1], w[2]);
  std::memcpy(out, &bits, sizeof bits);
}
ZERO_SIMD_INLINE void round_lanes(float* out, int top, const lanes<std::int64_t, 4> (&w)[binned::words]) {
  for (int i = 0; i < 4; ++i) {
    const std::int64_t lane[binned::words] = {w[0][i], w[1][i], w[2][i]};
    out[i] = binned::round<float>(lane, top);
  }
}

// to_bins_rounding_rule: the cut, the store's words added (to_bins_adding_rule's loop; none where the
// store is empty), rounded in registers: the words never reach memory.
template <int W, class G>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::to_bins_rounding_rule& r, const G* g,
                           const std::int64_t* s0, const std::int64_t* s1, const std::int64_t* s2, float* out) {
  constexpr int K = binned::words, L = cut_lanes<W>;
  const int d = r.store_top == r.top ? 0 : r.store_top < 0 ? K : r.top - r.store_top;  // binned::realign's
  std::size_t j = 0;
  if constexpr (L > 0) {
    if (d >= 0) {
      const cut_scales c(r.top);
      const std::int64_t* const st[K] = {s0, s1, s2};
      for (; j + L <= n; j += L) {
        lanes<std::int64_t, L> words[K];
        to_bins_words<L>(j, c, g, words);
        for (int k = d; k < K; ++k) {
          lanes<std::int64_t, L> kept;
          std::memcpy(&kept, st[k - d] + j, sizeof kept);
          words[k] += kept;
        }
        round_lanes(out + j, r.top, words);
      }
    }
  }
  for (; j < n; ++j) r(j, g, s0, s1, s2, out);
}

// The rounded sum of slices whose store is empty, where it is exact in doubles: the common case of a
// unit's only reduce of the step (or the second, its first one's values held), whose values lie within
// a few binades of each other. Where, in every lane, (1) each value is whole at the cut (its lowest
// bit's weight, 2^(f - 150) for its exponent field f (1 for a subnormal), is at least the cut's lowest
// bit 2^lsb: the cut drops none of its bits), (2) none reaches above the top bin, and (3) the fields
// of the largest and the least nonzero magnitude differ by at most 29 - ceil(log2 count): every value
// is a multiple of 2^(lo - 150) below 2^(hi - 126), so every partial sum of the count values is an
// integer multiple of 2^(lo - 150) below 2^53 of them, which a double holds. The double sum is then
// the exact sum of the cut, the words' value, and its conversion to float (to nearest, MXCSR's IEEE
// default) is binned::round's rounding of it; an exact zero is +0 as there, the sum starting from +0.
// The least field is taken from the magnitude less one (a zero's is then the largest of all, a
// power of two's one field lower): at most the true one, which only makes the checks stricter.
struct exact_sum_bounds {
  std::int32_t span = -1;         // the largest difference of fields (3); -1: never exact
  std::int32_t lowest_field = 0;  // the least field whose values are whole at the cut (1)
  std::uint32_t above = 0;        // cut_scales::above (2)
  exact_sum_bounds(int top, std::size_t count, std::uint32_t above_bits) : above(above_bits) {
    int log2_count = 0;
    while (log2_count < 30 && (std::size_t{1} << log2_count) < count) ++log2_count;
    span = count == 0 ? -1 : 29 - log2_count;
    using fmt = binned::format<float>;
    lowest_field = binned::word_bits * (top - binned::words + 1) + fmt::lowest + 1 - fmt::min_exponent;
  }
};
// Whether every one of 8 (or 4) comparison lanes is set.
__attribute__((target("avx"))) inline bool all_set(const lanes<std::int32_t, 8>& c) {
  __m256 m;
  std::memcpy(&m, &c, sizeof m);
  return _mm256_movemask_ps(m) == 0xff;
}
inline bool all_set(const lanes<std::int32_t, 4>& c) {
  __m128 m;
  std::memcpy(&m, &c, sizeof m);
  return _mm_movemask_ps(m) == 0xf;
}
// Elements j..j+L of the slices summed in double lanes and rounded to out, where exact_sum_bounds
// allows it in every lane; false (nothing written) elsewhere.
template <int L, class G>
ZERO_SIMD_INLINE bool sum_in_doubles(std::size_t j, const G* const* slices, std::size_t count,
                                     const exact_sum_bounds& b, float* out) {
  using u32 = lanes<std::uint32_t, L>;
  using i32 = lanes<std::int32_t, L>;
  lanes<double, L> sum = {};  // +0
  u32 largest = {}, least = u32{} - 1u;
  for (std::size_t k = 0; k < count; ++k) {
    const simd::pack<L> x = simd::load_lanes<L>(slices[k] + j);
    const u32 magnitude = x.bits() & 0x7fffffffu, less = magnitude - 1u;
    largest = magnitude > largest ? magnitude : largest;
    least = less < least ? less : least;
    sum += __builtin_convertvector(x.v, lanes<double, L>);
  }
  const i32 hi = __builtin_convertvector(largest >> 23, i32), lo = __builtin_convertvector(least >> 23, i32);
  const i32 exact = (hi - lo <= b.span) & (lo >= b.lowest_field) & (largest < b.above);
  if (!all_set(exact)) return false;
  const lanes<float, L> rounded = __builtin_convertvector(sum, lanes<float, L>);
  std::memcpy(out + j, &rounded, sizeof rounded);
  return true;
}

// binned_cut_sum_rule: each slice's pack cut and summed in registers (in double lanes, exact: see
// add_words_of; in groups of 2^21 slices, 2^18 for AVX2's conversion), the store's words added, then
// stored or rounded, L elements at a time.
template <int W, class G>
ZERO_SIMD_INLINE void cut_sum(std::size_t n, const elementwise::binned_cut_sum_rule<G>& r) {
  constexpr int K = binned::words, L = cut_lanes<W>;
  constexpr std::size_t group = std::size_t{1} << (L == 8 ? 21 : 18);
  const int d = r.store_top == r.top ? 0 : r.store_top < 0 ? K : r.top - r.store_top;  // binned::realign's
  std::int64_t* const st[K] = {r.s0, r.s1, r.s2};
  std::size_t j = 0;
  if constexpr (L > 0) {
    if (d >= 0) {
      const cut_scales c(r.top);
      // A rounded sum without a store: exact in doubles where its values' binades allow (sum_in_doubles).
      const bool in_doubles = r.rounded && d == K;
      const exact_sum_bounds bounds(r.top, in_doubles ? r.count : 0, c.above);
      for (; j + L <= n; j += L) {
        if (in_doubles && sum_in_doubles<L>(j, r.slices, r.count, bounds, r.rounded)) continue;
        lanes<std::int64_t, L> sum[K] = {};
        for (std::size_t first = 0; first < r.count; first += group) {
          const std::size_t last = std::min(r.count, first + group);
          lanes<double, L> words[K] = {};
          unsigned above = 0;
          for (std::size_t k = first; k < last; ++k) above |= add_words<false, L>(j, c, r.slices[k], words);
          if (above != 0) {  // bits above the top bin (never at the agreed top): the full cut
            for (auto& x : words) x = lanes<double, L>{};
            for (std::size_t k = first; k < last; ++k) add_words<true, L>(j, c, r.slices[k], words);
          }
          for (int b = 0; b < K; ++b) {
            lanes<std::int64_t, L> x;
            to_int64(x, words[b]);
            sum[b] += x;
          }
        }
        for (int b = d; b < K; ++b) {
          lanes<std::int64_t, L> kept;
          std::memcpy(&kept, st[b - d] + j, sizeof kept);
          sum[b] += kept;
        }
        if (r.rounded)
          round_lanes(r.rounded + j, r.top, sum);
        else
          for (int b = 0; b < K; ++b) std::memcpy(st[b] + j, &sum[b], sizeof sum[b]);
      }
    }
  }
  for (; j < n; ++j) r(j);
}

// The largest magnitude's bits and the non-finite flags of g[0, n) (over g / divisor when Divide): the
// lane-wise form of sys::host::largest_magnitude's loop. Returns how many elements it covered (whole
// packs); the caller runs the rest.
template <int W, bool Divide, class G>
ZERO_SIMD_INLINE std::size_t magnitudes(const G* g, std::size_t n, float divisor, std::uint32_t& largest,
                                        std::uint32_t& infinite, std::uint32_t& nan) {
  using u32 = lanes<std::uint32_t, W>;
  const simd::pack<W> d(divisor);
  // First the largest magnitude's bits of all values, one unsigned max per pack (two chains): where it
  // is below an infinity's, every value is finite and it is the answer. Only a set with an infinity or
  // a NaN takes the second loop, which keeps the finite largest and the flags apart.
  {
    u32 big0 = u32{}, big1 = u32{};
    std::size_t j = 0;
    for (; j + 2 * W <= n; j += 2 * W) {
      simd::pack<W> v0 = simd::load_lanes<W>(g + j), v1 = simd::load_lanes<W>(g + j + W);
      if constexpr (Divide) {
        v0 = div(v0, d);
        v1 = div(v1, d);
      }
      const u32 a0 = v0.bits() & 0x7fffffffu, a1 = v1.bits() & 0x7fffffffu;
      big0 = a0 > big0 ? a0 : big0;
      big1 = a1 > big1 ? a1 : big1;
    }
    for (; j + W <= n; j += W) {
      simd::pack<W> v = simd::load_lanes<W>(g + j);
      if constexpr (Divide) v = div(v, d);
      const u32 a = v.bits() & 0x7fffffffu;
      big0 = a > big0 ? a : big0;
    }
    std::uint32_t top = 0;
    for (int i = 0; i < W; ++i) {
      top = big0[i] > top ? big0[i] : top;
      top = big1[i] > top ? big1[i] : top;
    }
    if (top < 0x7f800000u) {
      largest = top > largest ? top : largest;
      return j;
    }
  }
  u32 big = u32{}, inf = u32{}, not_a_number = u32{};
  std::size_t j = 0;
  for (; j + W <= n; j += W) {
    simd::pack<W> v = simd::load_lanes<W>(g + j);
    if constexpr (Divide) v = div(v, d);
    const u32 a = v.bits() & 0x7fffffffu;
    inf |= __builtin_convertvector(a == 0x7f800000u, u32);  // all ones where true
    not_a_number |= __builtin_convertvector(a > 0x7f800000u, u32);
    u32 finite = a;
    simd::assign_where<W>(finite, a >= 0x7f800000u, u32{});
    simd::assign_where<W>(big, finite > big, finite);
  }
  for (int i = 0; i < W; ++i) {
    largest = big[i] > largest ? big[i] : largest;
    infinite |= inf[i] & 1u;
    nan |= not_a_number[i] & 1u;
  }
  return j;
}

// floor of W double lanes (the instruction of that width: AVX-512's roundscale, AVX's round), not
// always_inline, as core/simd.hpp's sqrt_lanes: inlined by the loop's flatten.
__attribute__((target("avx512f"))) inline void floor_lanes(lanes<double, 8>& x) {
  __m512d v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm512_maskz_roundscale_pd(0xff, v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);  // (masked: see shift below)
  std::memcpy(&x, &v, sizeof v);
}
__attribute__((target("avx"))) inline void floor_lanes(lanes<double, 4>& x) {
  __m256d v;
  std::memcpy(&v, &x, sizeof v);
  v = _mm256_floor_pd(v);
  std::memcpy(&x, &v, sizeof v);
}

// The digits of the squares (in double, exact) of g[j] (of g[j] / divisor where Divide, an fp32
// division) in the bins top - 1, top - 2 and top - 3 of binned::format<double>, summed over whole
// packs of W into d[0], d[1] and d[2]: the words binned::to_words gives y * y below the top bin
// (whose own word is zero: top is above every square's bin), added up. In double arithmetic, every
// operation exact: with L the weight of bin top - 3's lowest bit (even), s = (y 2^(-L/2))^2 = y^2 2^-L
// is y^2 scaled by a power of 2 (48 significant bits, far from double's limits), below 2^96; t_k =
// floor(s 2^(-32 k)) keeps its bits from bin top - 3 + k up, which drops the bits below the window as
// to_words drops them; and the digit of bin top - 3 + k is t_k - 2^32 t_(k+1), below 2^32, exact (the
// two agree above bit 32). Digits are summed in double lanes, exact below 2^53: moved to d every 2^20
// pairs of packs (two sets of sums, each below 2^52 then, added exactly). Every value must be finite.
// Returns the elements covered. About 1.5 cycles a value on Zen 4 (AVX-512): the three floors and
// five products of 8 doubles, where the 64-bit integer shifts of the same cut took 45 instructions.
template <int W, bool Divide, class G>
ZERO_SIMD_INLINE std::size_t square_digits(const G* g, std::size_t n, float divisor, int top, std::int64_t* d) {
  static_assert(binned::words == 3, "three bins below the top");
  using f64 = lanes<double, W>;
  const int window = binned::word_bits * (top - binned::words) + binned::format<double>::lowest;
  const f64 scale = f64{} + __builtin_ldexp(1.0, -window / 2), down = f64{} + 0x1p-32, up = f64{} + 0x1p32;
  const simd::pack<W> dv(divisor);
  f64 a0 = f64{}, a1 = f64{}, a2 = f64{};  // the digit sums of bins top - 3, top - 2, top - 1
  const auto flush = [&] {
    const lanes<std::int64_t, W> i0 = __builtin_convertvector(a0, lanes<std::int64_t, W>),
                                 i1 = __builtin_convertvector(a1, lanes<std::int64_t, W>),
                                 i2 = __builtin_convertvector(a2, lanes<std::int64_t, W>);
    for (int i = 0; i < W; ++i) {
      d[0] += i2[i];
      d[1] += i1[i];
      d[2] += i0[i];
    }
    a0 = a1 = a2 = f64{};
  };
  constexpr std::size_t flush_every = std::size_t{1} << 20;
  // Adds the digits of pack v to accumulators b0..b2.
  const auto digits = [&](const simd::pack<W>& loaded, f64& b0, f64& b1, f64& b2) {
    simd::pack<W> v = loaded;
    if constexpr (Divide) v = div(v, dv);
    const f64 y = __builtin_convertvector(v.v, f64) * scale;
    f64 t0 = y * y;
    f64 t1 = t0 * down;
    f64 t2 = t1 * down;
    floor_lanes(t0);
    floor_lanes(t1);
    floor_lanes(t2);
    b2 += t2;
    b1 += t1 - t2 * up;
    b0 += t0 - t1 * up;
  };
  // Two packs at a time into two sets of sums: the additions' latency, not the arithmetic, bounded one.
  f64 c0 = f64{}, c1 = f64{}, c2 = f64{};
  std::size_t j = 0, since = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    const simd::pack<W> v0 = simd::load_lanes<W>(g + j), v1 = simd::load_lanes<W>(g + j + W);
    digits(v0, a0, a1, a2);
    digits(v1, c0, c1, c2);
    if (++since == flush_every) {
      a0 += c0;
      a1 += c1;
      a2 += c2;
      c0 = c1 = c2 = f64{};
      flush();
      since = 0;
    }
  }
  for (; j + W <= n; j += W) {
    const simd::pack<W> v = simd::load_lanes<W>(g + j);
    digits(v, a0, a1, a2);
  }
  a0 += c0;
  a1 += c1;
  a2 += c2;
  flush();
  return j;
}

template <class Rule, class... Ts>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void run_avx512(std::size_t n, const Rule& rule,
                                                                                       Ts*... p) {
  const ieee_default scope;
  loop<16>(n, rule, p...);
  _mm256_zeroupper();
}
template <class G>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void cut_sum_avx512(
    std::size_t n, const elementwise::binned_cut_sum_rule<G>& rule) {
  const ieee_default scope;
  cut_sum<16>(n, rule);
  _mm256_zeroupper();
}
template <class Rule, class... Ts>
__attribute__((target("avx2"), flatten)) void run_avx2(std::size_t n, const Rule& rule, Ts*... p) {
  const ieee_default scope;
  loop<8>(n, rule, p...);
  _mm256_zeroupper();
}
template <class G>
__attribute__((target("avx2"), flatten)) void cut_sum_avx2(std::size_t n,
                                                           const elementwise::binned_cut_sum_rule<G>& rule) {
  const ieee_default scope;
  cut_sum<8>(n, rule);
  _mm256_zeroupper();
}
template <class Rule, class... Ts>
__attribute__((flatten)) void run_sse2(std::size_t n, const Rule& rule, Ts*... p) {
  loop<4>(n, rule, p...);
}

template <bool Divide, class G>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) std::size_t magnitudes_avx512(
    const G* g, std::size_t n, float divisor, std::uint32_t& largest, std::uint32_t& infinite, std::uint32_t& nan) {
  const std::size_t done = magnitudes<16, Divide>(g, n, divisor, largest, infinite, nan);
  _mm256_zeroupper();
  return done;
}
template <bool Divide, class G>
__attribute__((target("avx2"), flatten)) std::size_t magnitudes_avx2(const G* g, std::size_t n, float divisor,
                                                                     std::uint32_t& largest, std::uint32_t& infinite,
                                                                     std::uint32_t& nan) {
  const std::size_t done = magnitudes<8, Divide>(g, n, divisor, largest, infinite, nan);
  _mm256_zeroupper();
  return done;
}
template <bool Divide, class G>
__attribute__((flatten)) std::size_t magnitudes_sse2(const G* g, std::size_t n, float divisor, std::uint32_t& largest,
                                                     std::uint32_t& infinite, std::uint32_t& nan) {
  return magnitudes<4, Divide>(g, n, divisor, largest, infinite, nan);
}

template <bool Divide, class G>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) std::size_t square_digits_avx512(
    const G* g, std::size_t n, float divisor, int top, std::int64_t* d) {
  const std::size_t done = square_digits<8, Divide>(g, n, divisor, top, d);
  _mm256_zeroupper();
  return done;
}
template <bool Divide, class G>
__attribute__((target("avx2"), flatten)) std::size_t square_digits_avx2(const G* g, std::size_t n, float divisor,
                                                                        int top, std::int64_t* d) {
  const std::size_t done = square_digits<4, Divide>(g, n, divisor, top, d);
  _mm256_zeroupper();
  return done;
}

template <class Rule, class... Ts>
struct packed : std::false_type {};
template <class G>
struct packed<elementwise::to_bins_rule, G, std::int64_t, std::int64_t, std::int64_t>
    : std::bool_constant<simd::lane_type<G>> {};
template <class G>
struct packed<elementwise::to_bins_adding_rule, G, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
              std::int64_t, std::int64_t> : std::bool_constant<simd::lane_type<G>> {};
template <>
struct packed<elementwise::round_bins_rule, float, std::int64_t, std::int64_t, std::int64_t> : std::true_type {};
template <class G>
struct packed<elementwise::to_bins_rounding_rule, G, std::int64_t, std::int64_t, std::int64_t, float>
    : std::bool_constant<simd::lane_type<G>> {};
template <>
struct packed<elementwise::merge_bins_rule, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
              std::int64_t> : std::true_type {};

}  // namespace detail

// Whether run() has a packed loop for this rule over these operand types (those of sys::host::for_each):
// the cut (from float, bf16 or fp16 gradients, with or without a store's words added, and rounded at
// once), the merge and the rounding. (An operand may be const or not.)
template <class Rule, class... Ts>
concept vectorized = detail::packed<Rule, std::remove_const_t<Ts>...>::value;

template <class Rule, class... Ts>
void run(std::size_t n, const Rule& rule, Ts*... p) {
  switch (host_loop::active()) {
    case host_loop::isa::avx512:
      return detail::run_avx512(n, rule, p...);
    case host_loop::isa::avx2:
      return detail::run_avx2(n, rule, p...);
    case host_loop::isa::sse2:
      return detail::run_sse2(n, rule, p...);
    case host_loop::isa::scalar:
      break;
  }
  for (std::size_t j = 0; j < n; ++j) rule(j, p...);
}

// The cut and sum of several slices (elementwise::binned_cut_sum_rule): on packs with AVX-512, one
// element at a time elsewhere (as the cut).
template <class G>
void cut_sum(std::size_t n, const elementwise::binned_cut_sum_rule<G>& rule) {
  if constexpr (simd::lane_type<G>) {
    if (host_loop::active() == host_loop::isa::avx512) return detail::cut_sum_avx512(n, rule);
    if (host_loop::active() == host_loop::isa::avx2) return detail::cut_sum_avx2(n, rule);
  }
  for (std::size_t j = 0; j < n; ++j) rule(j);
}

// The packed part of the summary loop over g[0, n) (g / divisor when divide): folds the whole packs
// into largest, infinite and nan and returns how many elements it covered (0 at isa::scalar, or for
// an element type without lanes).
template <class G>
std::size_t magnitudes(const G* g, std::size_t n, bool divide, float divisor, std::uint32_t& largest,
                       std::uint32_t& infinite, std::uint32_t& nan) {
  if constexpr (simd::lane_type<G>) {
    switch (host_loop::active()) {
      case host_loop::isa::avx512:
        return divide ? detail::magnitudes_avx512<true>(g, n, divisor, largest, infinite, nan)
                      : detail::magnitudes_avx512<false>(g, n, divisor, largest, infinite, nan);
      case host_loop::isa::avx2:
        return divide ? detail::magnitudes_avx2<true>(g, n, divisor, largest, infinite, nan)
                      : detail::magnitudes_avx2<false>(g, n, divisor, largest, infinite, nan);
      case host_loop::isa::sse2:
        return divide ? detail::magnitudes_sse2<true>(g, n, divisor, largest, infinite, nan)
                      : detail::magnitudes_sse2<false>(g, n, divisor, largest, infinite, nan);
      case host_loop::isa::scalar:
        break;
    }
  }
  return 0;
}

// The packed part of the squares' digits (detail::square_digits) over g[0, n): adds to d[0..3) and
// returns how many elements it covered (whole packs with AVX-512 and AVX2, whose floor instruction it
// needs; 0 at other levels or for an element type without lanes).
template <class G>
std::size_t square_digits(const G* g, std::size_t n, bool divide, float divisor, int top, std::int64_t* d) {
  if constexpr (simd::lane_type<G>) {
    switch (host_loop::active()) {
      case host_loop::isa::avx512:
        return divide ? detail::square_digits_avx512<true>(g, n, divisor, top, d)
                      : detail::square_digits_avx512<false>(g, n, divisor, top, d);
      case host_loop::isa::avx2:
        return divide ? detail::square_digits_avx2<true>(g, n, divisor, top, d)
                      : detail::square_digits_avx2<false>(g, n, divisor, top, d);
      default:
        break;
    }
  }
  return 0;
}

#else

template <class Rule, class... Ts>
concept vectorized = false;
template <class G>
void cut_sum(std::size_t n, const elementwise::binned_cut_sum_rule<G>& rule) {
  for (std::size_t j = 0; j < n; ++j) rule(j);
}
template <class Rule, class... Ts>
void run(std::size_t n, const Rule& rule, Ts*... p) {
  for (std::size_t j = 0; j < n; ++j) rule(j, p...);
}
template <class G>
std::size_t magnitudes(const G*, std::size_t, bool, float, std::uint32_t&, std::uint32_t&, std::uint32_t&) {
  return 0;
}
template <class G>
std::size_t square_digits(const G*, std::size_t, bool, float, int, std::int64_t*) {
  return 0;
}

#endif

}  // namespace zero::sys::host_binned
