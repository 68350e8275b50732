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
// magnitude, the words' shifts and signs, the merge's int64 additions), which a lane does as the
// scalar code does, and the one float operation, the square summary's division by the divisor, is
// the IEEE division lane by lane. The rounding (binned::round) stays the scalar function: it is
// per element, branchy 128-bit arithmetic, and a lane-wise copy would be a second implementation to
// keep equal. The element loops are compiled per ISA and picked at run time as in
// sys/host_loop.hpp; a rule over other operand types runs the plain loop.
namespace zero::sys::host_binned {

#if defined(ZERO_HOST_SIMD)

namespace detail {

template <class T, int W>
using lanes = simd::lanes<T, W>;

// binned::to_words for K = 3 on W floats at once. Word k of a value is its bits in bin top - k: with
// |x| = m 2^e (m < 2^24) and s = e - (32 (top - k) + lowest), the word is m << s for 0 <= s < 32,
// m >> -s for -32 < s < 0, and 0 otherwise (all of m's bits outside the bin), which is the 32-bit
// part of to_words' 128-bit window that the word takes (the same bits dropped above the top bin and
// below the lowest kept one). Shift counts are masked to 0..31 so that no lane shifts out of range.
template <int W, class G>
ZERO_SIMD_INLINE void to_bins(std::size_t j, int top, const G* g, std::int64_t* const* w) {
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
  for (int k = 0; k < binned::words; ++k) {
    const i32 s = e - (binned::word_bits * (top - k) + fmt::lowest);
    const u32 left = __builtin_convertvector(s & 31, u32), right = __builtin_convertvector((-s) & 31, u32);
    u32 word = u32{};
    simd::assign_where<W>(word, (s >= 0) & (s < 32), m << left);
    simd::assign_where<W>(word, (s < 0) & (s > -32), m >> right);
    const i64 v = (__builtin_convertvector(word, i64) ^ sign) - sign;
    std::memcpy(w[k] + j, &v, sizeof v);
  }
}

template <int W, class G>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::to_bins_rule& r, const G* g, std::int64_t* w0,
                           std::int64_t* w1, std::int64_t* w2) {
  std::int64_t* const w[3] = {w0, w1, w2};
  std::size_t j = 0;
  for (; j + W <= n; j += W) to_bins<W>(j, r.top, g, w);
  for (; j < n; ++j) r(j, g, w0, w1, w2);
}

// merge_bins_rule: each of the store's and the incoming words re-expressed for the common top (plane
// k takes plane k - d, or zero), then added. d is the same for every element, so the planes are chosen
// once; each pack loads all six planes before it stores, as the rule reads all before it writes.
template <int W>
ZERO_SIMD_INLINE void loop(std::size_t n, const elementwise::merge_bins_rule& r, std::int64_t* s0, std::int64_t* s1,
                           std::int64_t* s2, const std::int64_t* w0, const std::int64_t* w1, const std::int64_t* w2) {
  using i64 = lanes<std::int64_t, W>;
  constexpr int K = binned::words;
  const auto shift = [&](int from) { return from == r.to ? 0 : from < 0 ? K : r.to - from; };  // binned::realign's d
  const int ds = shift(r.store_top), dw = shift(r.in_top);
  std::size_t j = 0;
  if (ds >= 0 && dw >= 0) {
    std::int64_t* const st[K] = {s0, s1, s2};
    const std::int64_t* const in[K] = {w0, w1, w2};
    for (; j + W <= n; j += W) {
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

// The largest magnitude's bits and the non-finite flags of g[0, n) (over g / divisor when Divide): the
// lane-wise form of sys::host::largest_magnitude's loop. Returns how many elements it covered (whole
// packs); the caller runs the rest.
template <int W, bool Divide, class G>
ZERO_SIMD_INLINE std::size_t magnitudes(const G* g, std::size_t n, float divisor, std::uint32_t& largest,
                                        std::uint32_t& infinite, std::uint32_t& nan) {
  using u32 = lanes<std::uint32_t, W>;
  u32 big = u32{}, inf = u32{}, not_a_number = u32{};
  const simd::pack<W> d(divisor);
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

template <class Rule, class... Ts>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void run_avx512(std::size_t n, const Rule& rule,
                                                                                       Ts*... p) {
  loop<16>(n, rule, p...);
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

template <class Rule, class... Ts>
struct packed : std::false_type {};
template <class G>
struct packed<elementwise::to_bins_rule, G, std::int64_t, std::int64_t, std::int64_t>
    : std::bool_constant<simd::lane_type<G>> {};
template <>
struct packed<elementwise::merge_bins_rule, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
              std::int64_t> : std::true_type {};

}  // namespace detail

// Whether run() has a packed loop for this rule over these operand types (those of sys::host::for_each):
// the cut (from float, bf16 or fp16 gradients) and the merge. (An operand may be const or not.)
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

#else

template <class Rule, class... Ts>
concept vectorized = false;
template <class Rule, class... Ts>
void run(std::size_t n, const Rule& rule, Ts*... p) {
  for (std::size_t j = 0; j < n; ++j) rule(j, p...);
}
template <class G>
std::size_t magnitudes(const G*, std::size_t, bool, float, std::uint32_t&, std::uint32_t&, std::uint32_t&) {
  return 0;
}

#endif

}  // namespace zero::sys::host_binned
