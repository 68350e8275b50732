// sys::host_binned: the reproducible mode's host passes (summary, cut into words, merge, rounding) on SIMD packs, the
// scalar code's bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "zero/core/binned.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/sys/host_loop.hpp"

// Why these are exact: every pass is integer arithmetic on the values' bits (the summary's largest
// magnitude, the words' shifts and signs, the merge's int64 additions, the rounding's 128-bit
// steps), which a lane does as the scalar code does, and the one float operation, the square
// summary's division by the divisor, is the IEEE division lane by lane. The summary runs on packs at
// every level; the cut, merge and rounding on AVX-512 only, whose 64-bit lanes have the shifts,
// conversions and widths they need (with AVX2 and SSE2 the packed cut and merge measured slower than
// the scalar loop, and the rounding needs AVX-512DQ's conversion), so other levels run the rules one
// element at a time. The loops are compiled per ISA and picked at run time as in sys/host_loop.hpp.
namespace zero::sys::host_binned {

#if defined(ZERO_HOST_SIMD)

namespace detail {

template <class T, int W>
using lanes = simd::lanes<T, W>;

// The three words of a magnitude m 2^S on 8 lanes (m < 2^24, S the shift of m above the lowest kept
// bin's lowest bit, any int64): floor(m 2^S)'s bits [64, 96), [32, 64) and [0, 32), each with the sign
// `sign` (0 or -1), as to_bins_words' per-word shifts give them. AVX-512's 64-bit shifts give 0 where
// the count is outside [0, 64), so bits [0, 64) are m << S or m >> -S and bits [64, 96) are
// m >> (64 - S) or m << (S - 64), one of each pair zero, with no lane out of range. (The masked forms:
// the unmasked ones read an undefined register, GCC 12 warns.)
__attribute__((target("avx512f"))) inline void words_of(lanes<std::int64_t, 8> (&out)[binned::words],
                                                        const lanes<std::int64_t, 8>& m,
                                                        const lanes<std::int64_t, 8>& shift,
                                                        const lanes<std::int64_t, 8>& sign) {
  __m512i mv, sv, gv;
  std::memcpy(&mv, &m, sizeof mv);
  std::memcpy(&sv, &shift, sizeof sv);
  std::memcpy(&gv, &sign, sizeof gv);
  const __m512i zero = _mm512_setzero_si512(), low32 = _mm512_set1_epi64(0xffffffff);
  const __m512i above = _mm512_sub_epi64(sv, _mm512_set1_epi64(64));
  const __m512i lo = _mm512_or_si512(_mm512_maskz_sllv_epi64(0xff, mv, sv),
                                     _mm512_maskz_srlv_epi64(0xff, mv, _mm512_sub_epi64(zero, sv)));
  const __m512i hi = _mm512_or_si512(_mm512_maskz_sllv_epi64(0xff, mv, above),
                                     _mm512_maskz_srlv_epi64(0xff, mv, _mm512_sub_epi64(zero, above)));
  const __m512i words[binned::words] = {_mm512_and_si512(hi, low32), _mm512_maskz_srli_epi64(0xff, lo, 32),
                                        _mm512_and_si512(lo, low32)};
  for (int k = 0; k < binned::words; ++k) {
    const __m512i w = _mm512_sub_epi64(_mm512_xor_si512(words[k], gv), gv);
    std::memcpy(&out[k], &w, sizeof w);
  }
}

// binned::to_words for K = 3 on W floats at once. Word k of a value is its bits in bin top - k: with
// |x| = m 2^e (m < 2^24) and s = e - (32 (top - k) + lowest), the word is m << s for 0 <= s < 32,
// m >> -s for -32 < s < 0, and 0 otherwise (all of m's bits outside the bin), which is the 32-bit
// part of to_words' 128-bit window that the word takes (the same bits dropped above the top bin and
// below the lowest kept one). Shift counts are masked to 0..31 so that no lane shifts out of range.
template <int W, class G>
ZERO_SIMD_INLINE void to_bins_words(std::size_t j, int top, const G* g, lanes<std::int64_t, W> (&out)[binned::words]) {
  using u32 = lanes<std::uint32_t, W>;
  using i32 = lanes<std::int32_t, W>;
  using i64 = lanes<std::int64_t, W>;
  using fmt = binned::format<float>;
  const u32 u = simd::load_lanes<W>(g + j).bits();
  const u32 a = u & 0x7fffffffu, field = a >> 23;
  u32 m = a;  // a subnormal: its fraction
  simd::assign_where<W>(m, field != 0u, (a & 0x007fffffu) | 0x00800000u);
  simd::assign_where<W>(m, field == 0xffu, u32{});  // an infinity or NaN: no bits
  u32 biased = field;
  simd::assign_where<W>(biased, field == 0u, u32{} + 1u);
  const i32 e = reinterpret_cast<const i32&>(biased) + (fmt::min_exponent - 1);
  const i64 sign = __builtin_convertvector(reinterpret_cast<const i32&>(u) >> 31, i64);  // 0 or -1
  if constexpr (W == 8) {  // (the AVX-512 loops': all three words from two 64-bit shifts each)
    const i32 shift = e - (binned::word_bits * (top - binned::words + 1) + fmt::lowest);
    words_of(out, __builtin_convertvector(m, i64), __builtin_convertvector(shift, i64), sign);
    return;
  }
  for (int k = 0; k < binned::words; ++k) {
    const i32 s = e - (binned::word_bits * (top - k) + fmt::lowest);
    const u32 left = __builtin_convertvector(s & 31, u32), right = __builtin_convertvector((-s) & 31, u32);
    u32 word = u32{};
    simd::assign_where<W>(word, (s >= 0) & (s < 32), m << left);
    simd::assign_where<W>(word, (s < 0) & (s > -32), m >> right);
    out[k] = (__builtin_convertvector(word, i64) ^ sign) - sign;
  }
}
template <int W, class G>
ZERO_SIMD_INLINE void to_bins(std::size_t j, int top, const G* g, std::int64_t* const* w) {
  lanes<std::int64_t, W> words[binned::words];
  to_bins_words<W>(j, top, g, words);
  for (int k = 0; k < binned::words; ++k) std::memcpy(w[k] + j, &words[k], sizeof words[k]);
}

// The int64 lanes of a W-float register's loop: W / 2, so that a pack of words is one register (a
// vector twice the register's width is lowered to slow generic code), and at least 4 (a pack's least).
template <int W>
inline constexpr int word_lanes = W / 2 < 4 ? 4 : W / 2;

template <int W, class G>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::to_bins_rule& r, const G* g, std::int64_t* w0,
                           std::int64_t* w1, std::int64_t* w2) {
  constexpr int V = word_lanes<W>;
  std::int64_t* const w[3] = {w0, w1, w2};
  std::size_t j = 0;
  if constexpr (W == 16)  // measured slower than the scalar loop with AVX2 and SSE2 (their 64-bit lanes)
    for (; j + V <= n; j += V) to_bins<V>(j, r.top, g, w);
  for (; j < n; ++j) r(j, g, w0, w1, w2);
}

// to_bins_adding_rule: the cut, then the store's planes re-expressed for the cut's top (plane k takes
// plane k - d, or nothing) added before the words are stored (where the store may be the output).
template <int W, class G>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::to_bins_adding_rule& r, const G* g,
                           const std::int64_t* s0, const std::int64_t* s1, const std::int64_t* s2, std::int64_t* w0,
                           std::int64_t* w1, std::int64_t* w2) {
  constexpr int V = word_lanes<W>;
  constexpr int K = binned::words;
  const int d = r.store_top == r.top ? 0 : r.store_top < 0 ? K : r.top - r.store_top;  // binned::realign's
  std::size_t j = 0;
  if (W == 16 && d >= 0) {  // (as the cut: AVX-512 only)
    const std::int64_t* const st[K] = {s0, s1, s2};
    std::int64_t* const out[K] = {w0, w1, w2};
    for (; j + V <= n; j += V) {
      lanes<std::int64_t, V> words[K], kept[K];
      to_bins_words<V>(j, r.top, g, words);
      // every store plane loaded before any is written: the output may be the store itself
      for (int k = 0; k < K; ++k) std::memcpy(&kept[k], st[k] + j, sizeof kept[k]);
      for (int k = 0; k < K; ++k) {
        if (k - d >= 0) words[k] += kept[k - d];
        std::memcpy(out[k] + j, &words[k], sizeof words[k]);
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
  constexpr int V = word_lanes<W>;
  using i64 = lanes<std::int64_t, V>;
  constexpr int K = binned::words;
  const auto shift = [&](int from) { return from == r.to ? 0 : from < 0 ? K : r.to - from; };  // binned::realign's d
  const int ds = shift(r.store_top), dw = shift(r.in_top);
  std::size_t j = 0;
  if (W == 16 && ds >= 0 && dw >= 0) {  // (as the cut: AVX-512 only)
    std::int64_t* const st[K] = {s0, s1, s2};
    const std::int64_t* const in[K] = {w0, w1, w2};
    for (; j + V <= n; j += V) {
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
ZERO_SIMD_INLINE void round_bins(std::size_t j, int top, float* g, const std::int64_t* w0, const std::int64_t* w1,
                                 const std::int64_t* w2) {
  lanes<std::int64_t, 8> a, b, c;
  std::memcpy(&a, w0 + j, sizeof a);
  std::memcpy(&b, w1 + j, sizeof b);
  std::memcpy(&c, w2 + j, sizeof c);
  lanes<std::uint32_t, 8> out;
  round_words(out, top, a, b, c);
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

// to_bins_rounding_rule: the cut, the store's words added (to_bins_adding_rule's loop; none where the
// store is empty), rounded in registers (round_bins): the words never reach memory.
template <int W, class G>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::to_bins_rounding_rule& r, const G* g,
                           const std::int64_t* s0, const std::int64_t* s1, const std::int64_t* s2, float* out) {
  constexpr int K = binned::words;
  const int d = r.store_top == r.top ? 0 : r.store_top < 0 ? K : r.top - r.store_top;  // binned::realign's
  std::size_t j = 0;
  if constexpr (W == 16) {  // (as the cut and the rounding: AVX-512 only)
    if (d >= 0) {
      const std::int64_t* const st[K] = {s0, s1, s2};
      for (; j + 8 <= n; j += 8) {
        lanes<std::int64_t, 8> words[K];
        to_bins_words<8>(j, r.top, g, words);
        for (int k = d; k < K; ++k) {
          lanes<std::int64_t, 8> kept;
          std::memcpy(&kept, st[k - d] + j, sizeof kept);
          words[k] += kept;
        }
        lanes<std::uint32_t, 8> bits;
        round_words(bits, r.top, words[0], words[1], words[2]);
        std::memcpy(out + j, &bits, sizeof bits);
      }
    }
  }
  for (; j < n; ++j) r(j, g, s0, s1, s2, out);
}

// binned_cut_sum_rule: each slice's pack cut and summed in registers, the store's words added, then
// stored or rounded (round_words): the rule's integers, eight elements at a time.
template <int W, class G>
ZERO_SIMD_INLINE void cut_sum(std::size_t n, const elementwise::binned_cut_sum_rule<G>& r) {
  constexpr int K = binned::words;
  const int d = r.store_top == r.top ? 0 : r.store_top < 0 ? K : r.top - r.store_top;  // binned::realign's
  std::int64_t* const st[K] = {r.s0, r.s1, r.s2};
  std::size_t j = 0;
  if constexpr (W == 16) {  // (as the cut: AVX-512 only)
    if (d >= 0) {
      for (; j + 8 <= n; j += 8) {
        lanes<std::int64_t, 8> sum[K] = {}, words[K];
        for (std::size_t k = 0; k < r.count; ++k) {
          to_bins_words<8>(j, r.top, r.slices[k], words);
          for (int b = 0; b < K; ++b) sum[b] += words[b];
        }
        for (int b = d; b < K; ++b) {
          lanes<std::int64_t, 8> kept;
          std::memcpy(&kept, st[b - d] + j, sizeof kept);
          sum[b] += kept;
        }
        if (r.rounded) {
          lanes<std::uint32_t, 8> bits;
          round_words(bits, r.top, sum[0], sum[1], sum[2]);
          std::memcpy(r.rounded + j, &bits, sizeof bits);
        } else {
          for (int b = 0; b < K; ++b) std::memcpy(st[b] + j, &sum[b], sizeof sum[b]);
        }
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
  loop<16>(n, rule, p...);
  _mm256_zeroupper();
}
template <class G>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void cut_sum_avx512(
    std::size_t n, const elementwise::binned_cut_sum_rule<G>& rule) {
  cut_sum<16>(n, rule);
  _mm256_zeroupper();
}
template <class Rule, class... Ts>
__attribute__((target("avx2"), flatten)) void run_avx2(std::size_t n, const Rule& rule, Ts*... p) {
  loop<8>(n, rule, p...);
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
  if constexpr (simd::lane_type<G>)
    if (host_loop::active() == host_loop::isa::avx512) return detail::cut_sum_avx512(n, rule);
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
