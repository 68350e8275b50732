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

// The scales of blocks [0, count).
template <int W, class T>
ZERO_SIMD_INLINE void scales(std::size_t count, const quant::scale_rule<T>& r) {
  using u32 = simd::lanes<std::uint32_t, W>;
  for (std::size_t b = 0; b < count; ++b) {
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
}

// Bytes 0, Step, 2 Step, ... of a vector (the low byte of each of its Step-byte lanes: a truncation,
// as static_cast<std::uint8_t>), by one byte shuffle (N and Bytes given: not deducible through lanes): a narrowing
// conversion is one instruction on AVX-512 only, and the compiler lowers it lane by lane for AVX2 and SSE2.
template <int Step, int N, int Bytes, std::size_t... I>
ZERO_SIMD_INLINE void low_bytes(simd::lanes<std::uint8_t, N>& r, const simd::lanes<std::uint8_t, Bytes>& b,
                                std::index_sequence<I...>) {
  r = __builtin_shufflevector(b, b, (Step * static_cast<int>(I))...);
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

// Code bytes of values [0, values): per block, whole packs, then the rule's scalar code.
template <int W, class T>
ZERO_SIMD_INLINE void encode_codes(std::size_t values, const quant::encode_rule<T>& r) {
  const float qm = quant::qmax(r.bits);
  const simd::pack<W> q_max(qm);
  for (std::size_t begin = 0; begin < values; begin += r.block) {
    const std::size_t end = begin + r.block < values ? begin + r.block : values;
    const float s = r.scales[begin / r.block];
    if (!(s > 0.0f) || !is_finite(s)) {  // a zero or non-finite block: every code 0 (int4: begin is even)
      const std::size_t first = r.bits == 8 ? begin : begin / 2, last = r.bits == 8 ? end : (end + 1) / 2;
      std::memset(r.codes + first, 0, last - first);
      continue;
    }
    const simd::pack<W> scale(s);
    std::size_t i = begin;
    if (r.bits == 8) {
      for (; i + W <= end; i += W) {
        simd::lanes<std::int32_t, W> q;
        codes_of<W>(q, r.x + i, scale, q_max);
        simd::lanes<std::uint8_t, W> c;
        low_bytes<4, W, 4 * W>(c, reinterpret_cast<const simd::lanes<std::uint8_t, 4 * W>&>(q),
                               std::make_index_sequence<W>{});
        std::memcpy(r.codes + i, &c, W);
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
        simd::lanes<std::uint8_t, W / 2> c;
        low_bytes<8, W / 2, 4 * W>(c, reinterpret_cast<const simd::lanes<std::uint8_t, 4 * W>&>(byte),
                                   std::make_index_sequence<W / 2>{});
        std::memcpy(r.codes + i / 2, &c, W / 2);
      }
      for (; i < end; i += 2) {
        const int lo = encode(static_cast<float>(r.x[i]), s, qm);
        const int hi = i + 1 < r.n ? encode(static_cast<float>(r.x[i + 1]), s, qm) : 0;
        r.codes[i / 2] = static_cast<std::uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
      }
    }
  }
}

// Values [j, j + W) of a wire's codes (j even for int4), before the scale: exact small integers.
template <int W>
ZERO_SIMD_INLINE simd::pack<W> decode_codes(const std::uint8_t* codes, std::size_t j, int bits) {
  simd::lanes<std::int32_t, W> q;
  if (bits == 8) {
    simd::lanes<std::int8_t, W> c;
    std::memcpy(&c, codes + j, W);
    q = __builtin_convertvector(c, simd::lanes<std::int32_t, W>);
  } else {
    using u64 = simd::lanes<std::uint64_t, W / 2>;
    simd::lanes<std::uint8_t, W / 2> c;
    std::memcpy(&c, codes + j / 2, W / 2);
    const u64 b = __builtin_convertvector(c, u64);
    const u64 pair = (b & 0xfu) | ((b & 0xf0u) << 28);                          // nibbles into lanes 2k and 2k + 1
    q = (reinterpret_cast<const simd::lanes<std::int32_t, W>&>(pair) ^ 8) - 8;  // sign-extended
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
  scales<W>(count, r);
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

// Whether run() has a packed loop for this rule: the quantizer's four rules over float, bf16 or fp16.
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

#else

template <class Rule>
concept vectorized = false;
template <class Rule>
void run(std::size_t count, const Rule& rule) {
  for (std::size_t j = 0; j < count; ++j) rule(j);
}

#endif

}  // namespace zero::sys::host_quantize
