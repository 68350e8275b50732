// sys::host_quantize: the quantizer's index rules (core/quantize.hpp) on simd::packs of the widest ISA the CPU has,
// with their bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "zero/core/quantize.hpp"
#include "zero/sys/host_loop.hpp"

// How the bytes stay those of the rules: every float operation is the rule's IEEE operation lane by
// lane. The division x / scale is a vector division (divps: correctly rounded, the scalar quotient
// in each lane), not a multiplication by 1 / scale, which rounds twice and differs in the last bit
// for some x. The clamp is the rule's two comparisons as selects (NaN cannot reach it: a block with
// one has a NaN scale and is all zero codes), the rounding the same add and subtract of 1.5 x 2^23,
// and the float to int conversion truncates an integral value, exact. A block's largest magnitude is
// the largest of the finite values' bit patterns without the sign: for non-negative floats (subnormals
// and zeros included) integer order is float order, and -0 becomes +0, the value the rule's m keeps.
// The scale itself (one division per block) and every tail shorter than a pack run the rule's scalar
// code. Loads and stores of bf16/fp16 go through simd::load_lanes/store_lanes, the conversions
// tests/core/test_host_loops.cpp holds equal to the scalar ones.
namespace zero::sys::host_quantize {

#if defined(ZERO_HOST_SIMD)

namespace detail {

using quant::encode;
using quant::is_finite;
using quant::magnitude;

// Lane-wise reductions of a pack's lanes (once per block: a plain loop).
template <int W>
ZERO_SIMD_INLINE std::uint32_t lanes_max(const simd::lanes<std::uint32_t, W>& v) {
  std::uint32_t r = 0;
  for (int i = 0; i < W; ++i) r = v[i] > r ? v[i] : r;
  return r;
}
template <int W>
ZERO_SIMD_INLINE std::uint32_t lanes_or(const simd::lanes<std::uint32_t, W>& v) {
  std::uint32_t r = 0;
  for (int i = 0; i < W; ++i) r |= v[i];
  return r;
}

// The scale of block b.
template <int W, class T>
ZERO_SIMD_INLINE void scale_of(std::size_t b, const quant::scale_rule<T>& r) {
  using u32 = simd::lanes<std::uint32_t, W>;
  const std::size_t begin = b * r.block, end = begin + r.block < r.n ? begin + r.block : r.n;
  u32 largest = {}, non_finite = {};
  std::size_t i = begin;
  for (; i + W <= end; i += W) {
    const u32 a = simd::load_lanes<W>(r.x + i).bits() & 0x7fffffffu;
    const simd::lanes<std::int32_t, W> special = a >= 0x7f800000u;  // an infinity or a NaN
    non_finite |= reinterpret_cast<const u32&>(special);
    u32 finite = a;
    simd::assign_where<W>(finite, special, u32{});
    simd::assign_where<W>(largest, finite > largest, finite);
  }
  float m = __builtin_bit_cast(float, lanes_max<W>(largest));
  bool finite = lanes_or<W>(non_finite) == 0;
  for (; i < end; ++i) {  // the rule's loop
    const float a = magnitude(static_cast<float>(r.x[i]));
    if (!is_finite(a))
      finite = false;
    else if (a > m)
      m = a;
  }
  r.scales[b] = finite ? fp::div(m, r.q_max) : __builtin_bit_cast(float, fp::canonical_nan_bits32);
}

// Bytes 0, Step, 2 Step, ... of a vector (the low byte of each of its Step-byte lanes: a truncation,
// as static_cast<std::uint8_t>), by one byte shuffle (N and Bytes given: not deducible through lanes): a narrowing
// conversion is one instruction on AVX-512 only (store_low_bytes below), and the compiler lowers it lane by lane
// for AVX2 and SSE2.
template <int Step, int N, int Bytes, std::size_t... I>
ZERO_SIMD_INLINE void low_bytes(simd::lanes<std::uint8_t, N>& r, const simd::lanes<std::uint8_t, Bytes>& b,
                                std::index_sequence<I...>) {
  r = __builtin_shufflevector(b, b, (Step * static_cast<int>(I))...);
}

// The low byte of each lane stored, with AVX-512's narrowing (vpmovdb, vpmovqb: one instruction, where
// the byte shuffle of low_bytes took four; 14% of the int8 quantizer's time on a Zen 4). Inlined
// into the AVX-512 loop by its flatten, as widen_bytes below.
__attribute__((target("avx512f"))) inline void store_low_bytes(std::uint8_t* out,
                                                               const simd::lanes<std::int32_t, 16>& q) {
  __m512i v;
  std::memcpy(&v, &q, sizeof v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_maskz_cvtepi32_epi8(0xffff, v));
}
__attribute__((target("avx512f"))) inline void store_low_bytes(std::uint8_t* out,
                                                               const simd::lanes<std::uint64_t, 8>& q) {
  __m512i v;
  std::memcpy(&v, &q, sizeof v);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm512_maskz_cvtepi64_epi8(0xff, v));
}
// The codes of x[i, i + W) under one finite, positive scale, as int32 lanes (an out parameter: no
// bare vector crosses a function boundary, see core/simd.hpp).
template <int W, class T>
ZERO_SIMD_INLINE void codes_of(simd::lanes<std::int32_t, W>& q, const T* x, const simd::pack<W>& scale,
                               const simd::pack<W>& q_max) {
  const simd::pack<W> neg_max = sub(simd::pack<W>(0.0f), q_max);
  const simd::pack<W> magic(12582912.0f);  // quant::round_even's 1.5 x 2^23
  simd::pack<W> v = div(simd::load_lanes<W>(x), scale);
  v = select(v > q_max, q_max, select(v < neg_max, neg_max, v));
  v = sub(add(v, magic), magic);
  q = __builtin_convertvector(v.v, simd::lanes<std::int32_t, W>);
}

// Code bytes of the values [begin, end) of one block: whole packs, then the rule's scalar code.
template <int W, class T>
ZERO_SIMD_INLINE void encode_block(std::size_t begin, std::size_t end, const quant::encode_rule<T>& r) {
  const float qm = quant::qmax(r.bits);
  const simd::pack<W> q_max(qm);
  const float s = r.scales[begin / r.block];
  if (!(s > 0.0f) || !is_finite(s)) {  // a zero or non-finite block: every code 0 (int4: begin is even)
    const std::size_t first = r.bits == 8 ? begin : begin / 2, last = r.bits == 8 ? end : (end + 1) / 2;
    std::memset(r.codes + first, 0, last - first);
    return;
  }
  const simd::pack<W> scale(s);
  std::size_t i = begin;
  if (r.bits == 8) {
    for (; i + W <= end; i += W) {
      simd::lanes<std::int32_t, W> q;
      codes_of<W>(q, r.x + i, scale, q_max);
      if constexpr (W == 16) {
        store_low_bytes(r.codes + i, q);
      } else {
        simd::lanes<std::uint8_t, W> c;
        low_bytes<4, W, 4 * W>(c, reinterpret_cast<const simd::lanes<std::uint8_t, 4 * W>&>(q),
                               std::make_index_sequence<W>{});
        std::memcpy(r.codes + i, &c, W);
      }
    }
    for (; i < end; ++i)
      r.codes[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(encode(static_cast<float>(r.x[i]), s, qm)));
  } else {
    // Lanes 2k and 2k + 1 are the low and high halves of 64-bit lane k (x86 is little-endian): one
    // byte each, low nibble from the even value.
    using u64 = simd::lanes<std::uint64_t, W / 2>;
    for (; i + W <= end; i += W) {
      simd::lanes<std::int32_t, W> q;
      codes_of<W>(q, r.x + i, scale, q_max);
      const u64 pair = reinterpret_cast<const u64&>(q);
      const u64 byte = (pair & 0xfu) | ((pair >> 28) & 0xf0u);
      if constexpr (W == 16) {
        store_low_bytes(r.codes + i / 2, byte);
      } else {
        simd::lanes<std::uint8_t, W / 2> c;
        low_bytes<8, W / 2, 4 * W>(c, reinterpret_cast<const simd::lanes<std::uint8_t, 4 * W>&>(byte),
                                   std::make_index_sequence<W / 2>{});
        std::memcpy(r.codes + i / 2, &c, W / 2);
      }
    }
    for (; i < end; i += 2) {
      const int lo = encode(static_cast<float>(r.x[i]), s, qm);
      const int hi = i + 1 < r.n ? encode(static_cast<float>(r.x[i + 1]), s, qm) : 0;
      r.codes[i / 2] = static_cast<std::uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
    }
  }
}

// Code bytes of values [0, values).
template <int W, class T>
ZERO_SIMD_INLINE void encode_codes(std::size_t values, const quant::encode_rule<T>& r) {
  for (std::size_t begin = 0; begin < values; begin += r.block)
    encode_block<W>(begin, begin + r.block < values ? begin + r.block : values, r);
}

// Both rules block by block: a block's values are read from memory once, for its scale, and are still
// in cache when its codes are computed. Each block's codes need only its own scale: the same bytes.
template <class T>
struct scale_and_encode {
  quant::scale_rule<T> scale;
  quant::encode_rule<T> codes;
  // Block b with the rules themselves (the loop of isa::scalar).
  void operator()(std::size_t b) const {
    scale(b);
    const std::size_t end = (b + 1) * scale.block < scale.n ? (b + 1) * scale.block : scale.n;
    const std::size_t first = codes.bits == 8 ? b * scale.block : b * scale.block / 2;
    const std::size_t last = codes.bits == 8 ? end : (end + 1) / 2;
    for (std::size_t j = first; j < last; ++j) codes(j);
  }
};

// The first W bytes of x zero-extended to 32-bit lanes, with the instruction of each width: GCC 12
// lowers __builtin_convertvector from bytes lane by lane. The wider two are not always_inline (see
// sqrt_lanes in core/simd.hpp) and are inlined into the loop of their target by its flatten.
ZERO_SIMD_INLINE void widen_bytes(simd::lanes<std::int32_t, 4>& r, __m128i x) {
  const __m128i zero = _mm_setzero_si128();
  x = _mm_unpacklo_epi16(_mm_unpacklo_epi8(x, zero), zero);
  std::memcpy(&r, &x, sizeof r);
}
__attribute__((target("avx2"))) inline void widen_bytes(simd::lanes<std::int32_t, 8>& r, __m128i x) {
  const __m256i y = _mm256_cvtepu8_epi32(x);
  std::memcpy(&r, &y, sizeof r);
}
__attribute__((target("avx512f"))) inline void widen_bytes(simd::lanes<std::int32_t, 16>& r, __m128i x) {
  const __m512i y = _mm512_maskz_cvtepu8_epi32(0xffff, x);  // (the unmasked form: GCC 12 warns, see sqrt_lanes)
  std::memcpy(&r, &y, sizeof r);
}

// N bytes at p in the low bytes of a register, the rest zero, with one load of their size (bytes
// copied into a register in memory would be read back wider than written: a stalled store forward).
template <int N>
ZERO_SIMD_INLINE __m128i load_bytes(const std::uint8_t* p) {
  if constexpr (N == 16) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else if constexpr (N == 8) {
    return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  } else {
    static_assert(N == 4 || N == 2, "the code bytes of a pack of 4, 8 or 16 values");
    std::conditional_t<N == 4, std::uint32_t, std::uint16_t> v;
    std::memcpy(&v, p, N);
    return _mm_cvtsi32_si128(static_cast<int>(v));
  }
}

// Values [j, j + W) of a wire's codes (j even for int4), before the scale: exact small integers.
template <int W>
ZERO_SIMD_INLINE simd::pack<W> decode_codes(const std::uint8_t* codes, std::size_t j, int bits) {
  using i32 = simd::lanes<std::int32_t, W>;
  i32 q;
  if (bits == 8) {
    widen_bytes(q, load_bytes<W>(codes + j));
    q = (q ^ 0x80) - 0x80;  // sign-extended
  } else {
    const __m128i x = load_bytes<W / 2>(codes + j / 2);
    widen_bytes(q, _mm_unpacklo_epi8(x, x));  // byte k in lanes 2k and 2k + 1
    i32 odd;
    for (int i = 0; i < W; ++i) odd[i] = i % 2 ? -1 : 0;  // (a constant)
    q = (((q >> 4) & odd) | (q & ~odd)) & 0xf;            // the low nibble in even lanes, the high one in odd lanes
    q = (q ^ 8) - 8;
  }
  simd::pack<W> r;
  r.v = __builtin_convertvector(q, typename simd::pack<W>::f32);
  return r;
}

// Values [0, count) of one wire.
template <int W, class T>
ZERO_SIMD_INLINE void decode_values(std::size_t count, const quant::decode_rule<T>& r) {
  for (std::size_t begin = 0; begin < count; begin += r.block) {
    const std::size_t end = begin + r.block < count ? begin + r.block : count;
    const simd::pack<W> scale(r.scales[begin / r.block]);
    std::size_t i = begin;
    for (; i + W <= end; i += W) simd::store_lanes<W>(r.y + i, mul(decode_codes<W>(r.codes, i, r.bits), scale));
    for (; i < end; ++i) r(i);
  }
}

// Values [0, count) summed over the sources, in source order.
template <int W, class T>
ZERO_SIMD_INLINE void decode_sum_values(std::size_t count, const quant::decode_sum_rule<T>& r) {
  const std::size_t nb = (r.n + r.block - 1) / r.block;
  for (std::size_t begin = 0; begin < count; begin += r.block) {
    const std::size_t end = begin + r.block < count ? begin + r.block : count;
    std::size_t i = begin;
    for (; i + W <= end; i += W) {
      simd::pack<W> acc(0.0f);
      for (int k = 0; k < r.sources; ++k) {
        const std::uint8_t* w = r.base + static_cast<std::size_t>(k) * r.stride;
        float s;
        std::memcpy(&s, w + 4 * (begin / r.block), 4);
        const simd::pack<W> v = mul(decode_codes<W>(w + 4 * nb, i, r.bits), simd::pack<W>(s));
        acc = k == 0 ? v : add(acc, v);
      }
      simd::store_lanes<W>(r.y + i, acc);
    }
    for (; i < end; ++i) r(i);
  }
}

template <int W, class T>
ZERO_SIMD_INLINE void loop(std::size_t count, const quant::scale_rule<T>& r) {
  for (std::size_t b = 0; b < count; ++b) scale_of<W>(b, r);
}
template <int W, class T>
ZERO_SIMD_INLINE void loop(std::size_t blocks, const scale_and_encode<T>& r) {
  const std::size_t n = r.scale.n, block = r.scale.block;
  for (std::size_t b = 0; b < blocks; ++b) {
    // Four blocks ahead, a cache line at a time: the hardware prefetcher alone left this loop at a
    // third of memcpy's bandwidth on arrays beyond the cache (measured, AVX-512).
    const std::size_t ahead = (b + 4) * block, stop = ahead + block < n ? ahead + block : n;
    for (std::size_t i = ahead; i < stop; i += 64 / sizeof(T)) __builtin_prefetch(r.scale.x + i);
    scale_of<W>(b, r.scale);
    encode_block<W>(b * block, (b + 1) * block < n ? (b + 1) * block : n, r.codes);
  }
}
template <int W, class T>
ZERO_SIMD_INLINE void loop(std::size_t count, const quant::encode_rule<T>& r) {
  encode_codes<W>(r.bits == 8 ? count : (2 * count < r.n ? 2 * count : r.n), r);
}
template <int W, class T>
ZERO_SIMD_INLINE void loop(std::size_t count, const quant::decode_rule<T>& r) {
  decode_values<W>(count, r);
}
template <int W, class T>
ZERO_SIMD_INLINE void loop(std::size_t count, const quant::decode_sum_rule<T>& r) {
  decode_sum_values<W>(count, r);
}

template <class Rule>
struct packed : std::false_type {};
template <class T>
struct packed<quant::scale_rule<T>> : std::bool_constant<simd::lane_type<T>> {};
template <class T>
struct packed<scale_and_encode<T>> : std::bool_constant<simd::lane_type<T>> {};
template <class T>
struct packed<quant::encode_rule<T>> : std::bool_constant<simd::lane_type<T>> {};
template <class T>
struct packed<quant::decode_rule<T>> : std::bool_constant<simd::lane_type<T>> {};
template <class T>
struct packed<quant::decode_sum_rule<T>> : std::bool_constant<simd::lane_type<T>> {};

// One copy per ISA, as sys/host_loop.hpp's (the same target attributes, flatten, vzeroupper).
template <class Rule>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void run_avx512(std::size_t count,
                                                                                       const Rule& rule) {
  loop<16>(count, rule);
  _mm256_zeroupper();
}
template <class Rule>
__attribute__((target("avx2"), flatten)) void run_avx2(std::size_t count, const Rule& rule) {
  loop<8>(count, rule);
  _mm256_zeroupper();
}
template <class Rule>
__attribute__((flatten)) void run_sse2(std::size_t count, const Rule& rule) {
  loop<4>(count, rule);
}

}  // namespace detail

// Whether run() has a packed loop for this rule: the quantizer's four rules over float, bf16 or fp16
// (and the fused scale and encode below).
template <class Rule>
concept vectorized = detail::packed<Rule>::value;

// rule(j) for j in [0, count), on packs of the active level (host_loop::active(); isa::scalar: one
// index at a time, the rule itself). The count is the one core/quantize.hpp gives each rule.
template <vectorized Rule>
void run(std::size_t count, const Rule& rule) {
  switch (host_loop::active()) {
    case host_loop::isa::avx512:
      return detail::run_avx512(count, rule);
    case host_loop::isa::avx2:
      return detail::run_avx2(count, rule);
    case host_loop::isa::sse2:
      return detail::run_sse2(count, rule);
    case host_loop::isa::scalar:
      break;
  }
  for (std::size_t j = 0; j < count; ++j) rule(j);
}

// quant::quantize's two index loops, scale_rule over `blocks` and then encode_rule, fused per block
// where the element type has packs (the same bytes); at isa::scalar, the two loops.
template <class T>
void quantize_blocks(std::size_t blocks, const quant::scale_rule<T>& scale, const quant::encode_rule<T>& codes) {
  if constexpr (simd::lane_type<T>) {
    if (host_loop::active() != host_loop::isa::scalar) return run(blocks, detail::scale_and_encode<T>{scale, codes});
  }
  for (std::size_t b = 0; b < blocks; ++b) scale(b);
  for (std::size_t j = 0; j < quant::code_bytes(scale.n, quant::format{codes.bits, codes.block}); ++j) codes(j);
}

#else

template <class T>
void quantize_blocks(std::size_t blocks, const quant::scale_rule<T>& scale, const quant::encode_rule<T>& codes) {
  for (std::size_t b = 0; b < blocks; ++b) scale(b);
  for (std::size_t j = 0; j < quant::code_bytes(scale.n, quant::format{codes.bits, codes.block}); ++j) codes(j);
}
template <class Rule>
concept vectorized = false;
template <class Rule>
void run(std::size_t count, const Rule& rule) {
  for (std::size_t j = 0; j < count; ++j) rule(j);
}

#endif

}  // namespace zero::sys::host_quantize
