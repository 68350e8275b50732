// Blockwise symmetric int8/int4 quantization (ZeRO++'s qwZ and qgZ): the wire format and its ZERO_HD rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "zero/config.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/numeric.hpp"
#include "zero/error.hpp"

// The format. n values are cut into blocks of `block` consecutive values (the last block may be
// short); each block has one fp32 scale and one signed code per value:
//   m     = max |x| over the block, in fp32 (exact: a comparison)
//   scale = m / qmax                     (one IEEE division; qmax = 127 for int8, 7 for int4)
//   q     = clamp(rne(x / scale), -qmax, qmax)  (one IEEE division, round to nearest even)
//   x'    = q x scale                    (one IEEE multiplication; the dequantized value)
// Special blocks, so that nothing is hidden and nothing divides by zero:
//   - every value zero (or the scale underflows to 0: m below 127 or 7 times the smallest
//     subnormal): scale 0, every q 0, every x' +0 (a -0 becomes +0);
//   - any value NaN or infinite: scale NaN, every q 0, every x' NaN (the canonical one when stored).
//     An overflowed gradient stays an overflow after quantization: the engine's norm sees it and the
//     step is skipped, as without quantization.
// Every operation is an explicitly rounded zero::fp call on the device and the same IEEE operation
// on the host (-ffp-contract=off), so host and device produce the same bytes, and every rank that
// dequantizes the same bytes gets the same values.
//
// The wire bytes of n values: the scales first (4 bytes each, so that a wire buffer's floats are
// aligned), then the codes (1 byte per value for int8, two per byte for int4: element 2i in the low
// nibble, 2i + 1 in the high one, two's complement), padded to a multiple of 4 bytes. A buffer of
// several slices (one per rank) puts the slices' wires one after the other.
namespace zero::quant {

struct format {
  int bits = 8;               // 8 (int8) or 4 (int4, two codes per byte)
  std::size_t block = 256;    // values per scale; even for int4 (a byte never straddles two blocks)
};

inline bool operator==(const format& a, const format& b) { return a.bits == b.bits && a.block == b.block; }

// Refuses a format the rules cannot represent; `what` names the setting in the message.
inline void validate(const format& f, const char* what) {
  ZERO_CHECK(f.bits == 8 || f.bits == 4, invalid_argument, what, ": quantization bits must be 8 or 4, got ", f.bits);
  ZERO_CHECK(f.block >= 1, invalid_argument, what, ": the quantization block must hold at least 1 value, got ",
             f.block);
  ZERO_CHECK(f.bits == 8 || f.block % 2 == 0, invalid_argument, what,
             ": int4 packs two values per byte, so the block must be even, got ", f.block);
}

ZERO_HD constexpr float qmax(int bits) { return bits == 8 ? 127.0f : 7.0f; }

inline std::size_t blocks(std::size_t n, const format& f) { return (n + f.block - 1) / f.block; }
// Bytes of the codes of n values (before the padding to 4).
inline std::size_t code_bytes(std::size_t n, const format& f) { return f.bits == 8 ? n : (n + 1) / 2; }
// Bytes of the wire of n values: scales, then codes, padded to a multiple of 4.
inline std::size_t wire_bytes(std::size_t n, const format& f) {
  return 4 * blocks(n, f) + (code_bytes(n, f) + 3) / 4 * 4;
}

// ---- the rules (index rules: rule(j) for j in [0, count), each owning its arrays) -----------------
//
// The element-wise rules of core/elementwise.hpp see one element of each operand; a scale needs a
// whole block, and a code needs its block's scale. These rules therefore hold their arrays and are
// run by the systems' index loop (for_each_index: rule(j) with the global j, on the host a loop over
// SIMD packs with the rules' bytes, sys/host_quantize.hpp, on the device the one launcher,
// gpu/launch.cuh), which gives each j to one thread. Each rule writes only its own outputs (scale j,
// code byte j, value j), so any order gives the same bytes.

// |x| without a library call (the same on host and device); NaN stays NaN.
ZERO_HD inline float magnitude(float x) { return x < 0.0f ? -x : x; }
ZERO_HD inline bool is_finite(float x) { return magnitude(x) <= 3.40282347e38f; }

// Round to nearest, ties to even, of |v| <= 2^22: adding and subtracting 1.5 x 2^23 leaves the
// integer part in the float's last bit, rounded by the addition itself (no rounding-mode call, the
// same two IEEE operations on host and device).
ZERO_HD inline float round_even(float v) {
  constexpr float magic = 12582912.0f;  // 1.5 x 2^23
  return fp::sub(fp::add(v, magic), magic);
}

// The scale of block b of x[0, n).
template <class T>
struct scale_rule {
  const T* x;
  std::size_t n, block;
  float q_max;
  float* scales;
  ZERO_HD void operator()(std::size_t b) const {
    const std::size_t begin = b * block, end = begin + block < n ? begin + block : n;
    float m = 0.0f;
    bool finite = true;
    for (std::size_t i = begin; i < end; ++i) {
      const float a = magnitude(static_cast<float>(x[i]));
      if (!is_finite(a)) finite = false;
      else if (a > m) m = a;
    }
    scales[b] = finite ? fp::div(m, q_max) : __builtin_bit_cast(float, fp::canonical_nan_bits32);
  }
};

// The signed code of value x under `scale` (0 for a zero or non-finite scale).
ZERO_HD inline int encode(float x, float scale, float q_max) {
  if (!(scale > 0.0f) || !is_finite(scale)) return 0;  // a zero block, or NaN: every code 0
  float v = fp::div(x, scale);
  // |x| <= m, so |v| exceeds q_max by a rounding at most; the clamp also keeps the rounding exact.
  v = v > q_max ? q_max : (v < -q_max ? -q_max : v);
  return static_cast<int>(round_even(v));
}

// Code byte j of x[0, n) (int8: value j; int4: values 2j and 2j + 1, the second 0 past n).
template <class T>
struct encode_rule {
  const T* x;
  std::size_t n, block;
  int bits;
  const float* scales;
  std::uint8_t* codes;
  ZERO_HD void operator()(std::size_t j) const {
    const float q_max = qmax(bits);
    if (bits == 8) {
      codes[j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(encode(static_cast<float>(x[j]), scales[j / block], q_max)));
      return;
    }
    const std::size_t i = 2 * j;
    const int lo = encode(static_cast<float>(x[i]), scales[i / block], q_max);
    const int hi = i + 1 < n ? encode(static_cast<float>(x[i + 1]), scales[(i + 1) / block], q_max) : 0;
    codes[j] = static_cast<std::uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
  }
};

// The dequantized value of element j of a wire (codes and scales of one slice).
ZERO_HD inline float decode(const std::uint8_t* codes, const float* scales, std::size_t j, std::size_t block, int bits) {
  int q;
  if (bits == 8) {
    q = static_cast<std::int8_t>(codes[j]);
  } else {
    const int nibble = (codes[j / 2] >> (4 * (j % 2))) & 0xf;
    q = nibble >= 8 ? nibble - 16 : nibble;
  }
  return fp::mul(static_cast<float>(q), scales[j / block]);
}

// Value j of a slice, stored as T (rounded once, NaN canonical).
template <class T>
struct decode_rule {
  const std::uint8_t* codes;
  const float* scales;
  std::size_t block;
  int bits;
  T* y;
  ZERO_HD void operator()(std::size_t j) const { y[j] = store_as<T>(decode(codes, scales, j, block, bits)); }
};

// Value j summed over `sources` slices `stride` bytes apart (each one wire of n values), in source
// order, in fp32 (acc = x'_0; acc += x'_1; ...), stored as T once: the rank-ordered sum of qgZ.
template <class T>
struct decode_sum_rule {
  const std::uint8_t* base;
  std::size_t stride, n, block;
  int bits, sources;
  T* y;
  ZERO_HD void operator()(std::size_t j) const {
    const std::size_t nb = (n + block - 1) / block;
    float acc = 0.0f;
    for (int k = 0; k < sources; ++k) {
      const std::uint8_t* w = base + static_cast<std::size_t>(k) * stride;
      const float v = decode(w + 4 * nb, reinterpret_cast<const float*>(w), j, block, bits);
      acc = k == 0 ? v : fp::add(acc, v);
    }
    y[j] = store_as<T>(acc);
  }
};

// ---- on a system ------------------------------------------------------------------------------------
//
// System: any system with for_each_index(count, rule) (sys::host, sys::cuda). The wire of n values
// is written or read at `wire` (4-byte aligned, wire_bytes(n, f) bytes).

template <class System, class T>
void quantize(const System& sys, const T* x, std::size_t n, const format& f, std::uint8_t* wire) {
  if (n == 0) return;
  const std::size_t nb = blocks(n, f);
  float* scales = reinterpret_cast<float*>(wire);
  std::uint8_t* codes = wire + 4 * nb;
  const scale_rule<T> scale{x, n, f.block, qmax(f.bits), scales};
  const encode_rule<T> code{x, n, f.block, f.bits, scales, codes};
  // A system may fuse the two loops block by block (sys::host: a block is read from memory once).
  if constexpr (requires { sys.quantize_blocks(nb, scale, code); }) {
    sys.quantize_blocks(nb, scale, code);
  } else {
    sys.for_each_index(nb, scale);
    sys.for_each_index(code_bytes(n, f), code);
  }
  // The padding bytes are sent too: zero, so that a wire is a pure function of its values.
  const std::size_t pad = wire_bytes(n, f) - 4 * nb - code_bytes(n, f);
  if (pad) sys.fill_zero(codes + code_bytes(n, f), pad);
}

template <class System, class T>
void dequantize(const System& sys, const std::uint8_t* wire, std::size_t n, const format& f, T* y) {
  if (n == 0) return;
  const std::size_t nb = blocks(n, f);
  sys.for_each_index(n, decode_rule<T>{wire + 4 * nb, reinterpret_cast<const float*>(wire), f.block, f.bits, y});
}

// y = the sum, in source order, of `sources` wires of n values each, `stride` bytes apart (a wire
// of n values is wire_bytes(n, f); a larger stride skips other data between them).
template <class System, class T>
void dequantize_sum(const System& sys, const std::uint8_t* wires, std::size_t stride, int sources, std::size_t n,
                    const format& f, T* y) {
  if (n == 0) return;
  sys.for_each_index(n, decode_sum_rule<T>{wires, stride, n, f.block, f.bits, sources, y});
}

}  // namespace zero::quant
