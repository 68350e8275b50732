// simd::pack<W>: W float lanes with the IEEE operations of zero::fp, so one rule runs on a pack as on a float.
#pragma once

// Why a pack type instead of relying on the auto-vectorizer: the user's flags are -O2 without
// -march and without -fno-math-errno; GCC does not vectorize at -O2 before version 12, and
// std::sqrt's errno path keeps every compiler from vectorizing a loop that calls it. A pack is
// written with GCC/Clang vector extensions (which either compiler lowers to the widest registers
// the enclosing function's target allows: SSE2, AVX2 or AVX-512, see sys/host_loop.hpp), so
// add, sub, mul and div are the same IEEE operations as on a float, lane by lane: not one bit
// changes. sqrt is the sqrtps instruction of the pack's width: IEEE (correctly rounded), no errno.
//
// The operations are hidden friends, found by argument-dependent lookup: a rule that calls
// add(mul(c.beta1, m), ...) unqualified (with `using namespace zero::fp` for the float overloads)
// compiles for V = float and for V = pack<W>, and a float operand (a step constant) converts to a
// pack of W copies. Host only: nvcc never sees a pack.
#if (defined(__x86_64__) || defined(__i386__)) && !defined(__CUDACC__) && (defined(__GNUC__) || defined(__clang__))
#define ZERO_HOST_SIMD 1

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "zero/core/fp.hpp"

#define ZERO_SIMD_INLINE inline __attribute__((always_inline))

// No function here takes or returns a bare vector by value, and packs are passed by reference: the
// register convention of such a call depends on the target (GCC and Clang warn, -Wpsabi, in every
// file that includes this), even though every call is inlined into one function compiled for one
// target (sys/host_loop.hpp) and no such call is ever made.
namespace zero::simd {

// W lanes of T as a GCC/Clang vector (through a class so that the size stays a dependent type:
// GCC drops a dependent vector_size written on an alias template's type). may_alias: the bits of
// a float vector are read as an integer vector of the same size, as the intrinsics' types allow.
template <class T, int W>
struct lanes_of {
  using type [[gnu::vector_size(sizeof(T) * W), gnu::may_alias]] = T;
};
template <class T, int W>
using lanes = typename lanes_of<T, W>::type;

// r[i] = a[i] where c[i] (a comparison's all-ones lane), bit for bit, on W 32-bit lanes. (W is
// given: it cannot be deduced through the lanes alias.)
template <int W>
ZERO_SIMD_INLINE void assign_where(lanes<std::uint32_t, W>& r, const lanes<std::int32_t, W>& c,
                                   const lanes<std::uint32_t, W>& a) {
  const lanes<std::uint32_t, W> m = reinterpret_cast<const lanes<std::uint32_t, W>&>(c);
  r = (m & a) | (~m & r);
}

// IEEE sqrt (correctly rounded, no errno) of 4, 8 or 16 lanes with the instruction of that width.
// The wider two are compiled for AVX and AVX-512 and are not always_inline: GCC refuses to inline
// an always_inline function of a wider target into a caller of the baseline target (an optimizer's
// update<pack<16>>), while `flatten` in sys/host_loop.hpp inlines them into the loop of their
// target. Arguments by reference, so that a call that stays a call has one convention on every
// target. Only the loop of that width calls each, after checking that the CPU has the instructions.
// `flatten` reaches them only where no function between the loop and the sqrt was compiled on its
// own: GCC marks a baseline function's call of a wider-target function as not inlinable and keeps
// that mark when the function is later inlined into the loop. So a rule's functions that compute a
// square root are ZERO_HD_INLINE (config.hpp): without it AdamW's AVX2 loop called the sqrt, spilling
// every live register around it (1.07 against 1.64 G elem/s, Zen 4).
ZERO_SIMD_INLINE void sqrt_lanes(lanes<float, 4>& r, const lanes<float, 4>& a) {
  __m128 x;
  std::memcpy(&x, &a, sizeof x);
  x = _mm_sqrt_ps(x);
  std::memcpy(&r, &x, sizeof x);
}
__attribute__((target("avx2"))) inline void sqrt_lanes(lanes<float, 8>& r, const lanes<float, 8>& a) {
  __m256 x;
  std::memcpy(&x, &a, sizeof x);
  x = _mm256_sqrt_ps(x);
  std::memcpy(&r, &x, sizeof x);
}
__attribute__((target("avx512f"))) inline void sqrt_lanes(lanes<float, 16>& r, const lanes<float, 16>& a) {
  __m512 x;
  std::memcpy(&x, &a, sizeof x);
  x = _mm512_mask_sqrt_ps(x, 0xffff, x);  // the unmasked form reads an undefined register (GCC 12 warns)
  std::memcpy(&r, &x, sizeof x);
}

// A lane-wise comparison result: all ones (true) or zero (false) per lane.
template <int W>
struct mask {
  lanes<std::int32_t, W> m;
  mask(const lanes<std::int32_t, W>& c) : m(c) {}
  mask(const mask& o) : m(o.m) {}  // passed through memory on every target, as a pack (below)
};

template <int W>
struct pack {
  static_assert(W == 4 || W == 8 || W == 16, "the widths of SSE, AVX and AVX-512 registers");
  static constexpr int width = W;
  using f32 = lanes<float, W>;
  using i32 = lanes<std::int32_t, W>;
  using u32 = lanes<std::uint32_t, W>;
  f32 v;

  pack() = default;
  // User-provided, hence not trivial: the C++ ABI then passes and returns a pack through memory on
  // every target. A rule's own functions (an optimizer's update, lion::sign) take and return packs
  // and are not always inlined; passed in registers, a pack would travel in a zmm register from the
  // AVX-512 loop and be looked for in xmm registers or on the stack by a callee compiled for SSE2.
  ZERO_SIMD_INLINE pack(const pack& o) : v(o.v) {}
  ZERO_SIMD_INLINE pack& operator=(const pack& o) {
    v = o.v;
    return *this;
  }
  // W copies of x, bit for bit: an integer add of zeros (0.0f + x would turn -0 into +0; writing
  // lanes one by one into an unset vector reads it, which GCC -O3 miscompiled here).
  ZERO_SIMD_INLINE pack(float x) {
    const u32 b = u32{} + __builtin_bit_cast(std::uint32_t, x);
    v = reinterpret_cast<const f32&>(b);
  }

  ZERO_SIMD_INLINE const u32& bits() const { return reinterpret_cast<const u32&>(v); }
  ZERO_SIMD_INLINE static pack from_bits(const u32& b) {
    pack r;
    r.v = reinterpret_cast<const f32&>(b);
    return r;
  }

  // ---- memory: W consecutive floats at any alignment ----
  ZERO_SIMD_INLINE static pack load(const float* p) {
    pack r;
    std::memcpy(&r.v, p, sizeof r.v);
    return r;
  }
  ZERO_SIMD_INLINE void store(float* p) const { std::memcpy(p, &v, sizeof v); }

  // ---- the operations of zero::fp, lane by lane ----
  friend ZERO_SIMD_INLINE pack add(const pack& a, const pack& b) { return from_f32(a.v + b.v); }
  friend ZERO_SIMD_INLINE pack sub(const pack& a, const pack& b) { return from_f32(a.v - b.v); }
  friend ZERO_SIMD_INLINE pack mul(const pack& a, const pack& b) { return from_f32(a.v * b.v); }
  friend ZERO_SIMD_INLINE pack div(const pack& a, const pack& b) { return from_f32(a.v / b.v); }
  friend ZERO_SIMD_INLINE pack sqrt(const pack& a) {
    pack r;
    sqrt_lanes(r.v, a.v);
    return r;
  }
  friend ZERO_SIMD_INLINE mask<W> operator>(const pack& a, const pack& b) { return {a.v > b.v}; }
  friend ZERO_SIMD_INLINE mask<W> operator<(const pack& a, const pack& b) { return {a.v < b.v}; }
  // Per lane: c ? a : b, by bits (a NaN's payload passes through unchanged).
  friend ZERO_SIMD_INLINE pack select(const mask<W>& c, const pack& a, const pack& b) {
    u32 r = b.bits();
    assign_where<W>(r, c.m, a.bits());
    return from_bits(r);
  }
  // fp::canonical: every NaN lane becomes the canonical NaN.
  friend ZERO_SIMD_INLINE pack canonical(const pack& a) {
    u32 r = a.bits();
    assign_where<W>(r, a.v != a.v, u32{} + fp::canonical_nan_bits32);
    return from_bits(r);
  }

 private:
  ZERO_SIMD_INLINE static pack from_f32(const f32& x) {
    pack r;
    r.v = x;
    return r;
  }
};

}  // namespace zero::simd

#endif
