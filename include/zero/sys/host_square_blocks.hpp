// sys::host_square_blocks: whole 64-value blocks' sums of squares on SIMD packs, in core/square_blocks.hpp's order (its
// bits), from values in memory or from a pass's registers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/simd.hpp"
#include "zero/core/square_blocks.hpp"
#include "zero/sys/host_loop.hpp"

namespace zero::sys::host_square_blocks {

#if defined(ZERO_HOST_SIMD)

namespace detail {

// The 16 lanes of the order as packs of doubles: two of 8 (AVX-512) or four of 4 (AVX2), pack p holding
// lanes p W .. p W + W - 1. Each pack adds its four rows' squares in row order; then the packs and their
// halves are added as the order adds its lanes pairwise (l + 8, + 4, + 2, + 1). Intrinsics, not vector
// extensions: GCC's Zen 4 tuning split the 8-wide conversion into two halves and kept the pairwise
// additions in memory, which made the blocks cost as much as the whole moments pass. The zero-masked
// forms with every lane kept: GCC 12's unmasked ones start from an undefined register, which
// -Wuninitialized reports in every file that includes this.
// A block's 16 lanes after the first pairwise step: lane l + lane l + 8, in 8 doubles.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline __m512d eight_lanes_avx512(const float* x) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (std::size_t row = 0; row < square_blocks::size; row += square_blocks::lanes) {
    const __m512d lo = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + row)), hi = _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(x + row + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);  // a float's square is exact in double: the bits of a product and a sum
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  return _mm512_add_pd(a0, a1);
}
// A block's sum from its 16 lanes after the first pairwise step (l + (l + 8), in 8 doubles).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline double from_eight_lanes_avx512(__m512d s8) {
  const __m256d s4 = _mm256_add_pd(_mm512_maskz_extractf64x4_pd(0xf, s8, 0), _mm512_maskz_extractf64x4_pd(0xf, s8, 1));  // l + (l + 4)
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));      // + 2
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));                                 // + 1
}
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline double block_avx512(const float* x) {
  return from_eight_lanes_avx512(eight_lanes_avx512(x));
}
// Eight blocks' last three pairwise steps at once, transposed: the same additions of the same lanes
// (one block's chain alone is a dozen dependent operations).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline void eight_blocks_avx512(const float* x,
                                                                                            double* out) {
  __m512d s[8];
  for (int b = 0; b < 8; ++b) s[b] = eight_lanes_avx512(x + static_cast<std::size_t>(b) * square_blocks::size);
  // l + (l + 4): blocks 2i and 2i + 1 side by side, 4 lanes each.
  __m512d u[4];
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_pd(_mm512_maskz_shuffle_f64x2(0xff, s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_maskz_shuffle_f64x2(0xff, s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // + 2: four blocks side by side, 2 lanes each.
  __m512d t[2];
  for (int i = 0; i < 2; ++i)
    t[i] = _mm512_add_pd(_mm512_maskz_shuffle_f64x2(0xff, u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_maskz_shuffle_f64x2(0xff, u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // + 1: blocks 0, 4, 1, 5, 2, 6, 3, 7, put back in order.
  const __m512d r = _mm512_add_pd(_mm512_maskz_unpacklo_pd(0xff, t[0], t[1]), _mm512_maskz_unpackhi_pd(0xff, t[0], t[1]));
  _mm512_storeu_pd(out, _mm512_maskz_permutexvar_pd(0xff, _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0), r));
}
// A block's sum from its 16 lanes in four packs of 4 doubles (pack p: lanes 4 p .. 4 p + 3).
__attribute__((target("avx2"))) inline double from_lanes_avx2(const __m256d* a) {
  const __m256d s4 = _mm256_add_pd(_mm256_add_pd(a[0], a[2]), _mm256_add_pd(a[1], a[3]));  // + 8, then + 4
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));  // + 2
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));                             // + 1
}
__attribute__((target("avx2,fma"))) inline double block_avx2(const float* x) {
  __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  for (std::size_t row = 0; row < square_blocks::size; row += square_blocks::lanes)
    for (int p = 0; p < 4; ++p) {
      const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + row + 4 * p));
      a[p] = _mm256_fmadd_pd(v, v, a[p]);  // exact squares: the bits of a product and a sum
    }
  return from_lanes_avx2(a);
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) inline void blocks_avx512(const float* x,
                                                                                      std::size_t count,
                                                                                      double* out) {
  std::size_t b = 0;
  for (; b + 8 <= count; b += 8) eight_blocks_avx512(x + b * square_blocks::size, out + b);
  for (; b < count; ++b) out[b] = block_avx512(x + b * square_blocks::size);
  _mm256_zeroupper();
}
__attribute__((target("avx2,fma"))) inline void blocks_avx2(const float* x, std::size_t count, double* out) {
  for (std::size_t b = 0; b < count; ++b) out[b] = block_avx2(x + b * square_blocks::size);
  _mm256_zeroupper();
}

// ---- a pass fused with its values' block sums ----
// Why: a tensor-wise optimizer's first pass is bound by memory and these sums by the conversions to
// double; run one after the other over a block of elements in cache, the sums cost two thirds of what
// the pass itself does, while added to the pass's registers they take pipes the pass leaves idle.
// The rule's advance_terms(j, x, p...) runs the pass at element j and leaves its K values in x; each
// block of 64 is four rows of 16, row after row, as the order adds them.
template <int K, class Rule, class... Ts>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void summing_avx512(
    std::size_t blocks, const Rule& caller_rule, double* const* sums, std::uint32_t reads, Ts*... p) {
  const Rule rule = caller_rule;  // a local copy: its constants stay in registers (host_loop::blocks)
  for (std::size_t b = 0; b < blocks; ++b) {
    __m512d lo[K], hi[K];  // lanes 0-7 and 8-15 of each value's block
    for (int k = 0; k < K; ++k) lo[k] = hi[k] = _mm512_setzero_pd();
    for (std::size_t row = 0; row < square_blocks::size; row += square_blocks::lanes) {
      const std::size_t j = b * square_blocks::size + row;
      int a = 0;
      (host_loop::prefetch_ahead(p, j, (reads >> a++) & 1u, &rule), ...);
      simd::pack<16> x[K];
      rule.template advance_terms<simd::pack<16>>(j, x, p...);
      for (int k = 0; k < K; ++k) {
        const __m512 v = reinterpret_cast<const __m512&>(x[k].v);
        const __m512d l = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, v, 0));
        const __m512d h = _mm512_maskz_cvtps_pd(0xff, _mm512_maskz_extractf32x8_ps(0xff, v, 1));
        lo[k] = _mm512_fmadd_pd(l, l, lo[k]);  // exact squares: the bits of a product and a sum
        hi[k] = _mm512_fmadd_pd(h, h, hi[k]);
      }
    }
    for (int k = 0; k < K; ++k) sums[k][b] = from_eight_lanes_avx512(_mm512_add_pd(lo[k], hi[k]));
  }
  _mm256_zeroupper();
}
template <int K, class Rule, class... Ts>
__attribute__((target("avx2,fma"), flatten)) void summing_avx2(std::size_t blocks, const Rule& caller_rule,
                                                         double* const* sums, std::uint32_t reads, Ts*... p) {
  const Rule rule = caller_rule;
  for (std::size_t b = 0; b < blocks; ++b) {
    __m256d a[K][4];  // each value's block, lanes 4 q .. 4 q + 3 in a[k][q]
    for (int k = 0; k < K; ++k)
      for (int q = 0; q < 4; ++q) a[k][q] = _mm256_setzero_pd();
    for (std::size_t row = 0; row < square_blocks::size; row += square_blocks::lanes) {
      const std::size_t j = b * square_blocks::size + row;
      int i = 0;
      (host_loop::prefetch_ahead(p, j, (reads >> i++) & 1u, &rule), ...);
      for (int half = 0; half < 2; ++half) {
        simd::pack<8> x[K];
        rule.template advance_terms<simd::pack<8>>(j + 8 * static_cast<std::size_t>(half), x, p...);
        for (int k = 0; k < K; ++k) {
          const __m256 v = reinterpret_cast<const __m256&>(x[k].v);
          const __m256d l = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), h = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
          a[k][2 * half] = _mm256_fmadd_pd(l, l, a[k][2 * half]);  // exact squares, as above
          a[k][2 * half + 1] = _mm256_fmadd_pd(h, h, a[k][2 * half + 1]);
        }
      }
    }
    for (int k = 0; k < K; ++k) sums[k][b] = from_lanes_avx2(a[k]);
  }
  _mm256_zeroupper();
}

}  // namespace detail

// The rule's pass over `blocks` whole blocks of square_blocks::size elements, fused with the block
// sums of the K values it leaves per element (sums[k][b]: the same bits as blocks() over stored
// values); false, with nothing done, where the CPU has neither AVX-512 nor AVX2.
template <int K, class Rule, class... Ts>
bool summing(std::size_t blocks, const Rule& rule, double* const* sums, std::uint32_t reads, Ts*... p) {
  switch (host_loop::active()) {
    case host_loop::isa::avx512:
      detail::summing_avx512<K>(blocks, rule, sums, reads, p...);
      return true;
    case host_loop::isa::avx2:
      detail::summing_avx2<K>(blocks, rule, sums, reads, p...);
      return true;
    default:
      return false;
  }
}

// out[b] = the sum of block b of x (count whole blocks of square_blocks::size values); false where the
// CPU has neither AVX-512 nor AVX2 (the caller runs square_blocks::sum).
inline bool blocks(const float* x, std::size_t count, double* out) {
  switch (host_loop::active()) {
    case host_loop::isa::avx512:
      detail::blocks_avx512(x, count, out);
      return true;
    case host_loop::isa::avx2:
      detail::blocks_avx2(x, count, out);
      return true;
    default:
      return false;
  }
}

#else

inline bool blocks(const float*, std::size_t, double*) { return false; }
template <int K, class Rule, class... Ts>
bool summing(std::size_t, const Rule&, double* const*, std::uint32_t, Ts*...) {
  return false;
}

#endif

}  // namespace zero::sys::host_square_blocks
