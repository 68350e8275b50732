// comm::detail::combine: acc op= x over a range, the rank-ordered step of the host backends' reductions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "zero/core/reduce_op.hpp"
#include "zero/core/simd.hpp"
#include "zero/sys/host_loop.hpp"

namespace zero::comm::detail {

template <class T>
void combine(T* acc, const T* x, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
}

// acc = a op b: the first step of a reduction, fused with the copy of the first input.
template <class T>
void combine_pair(T* acc, const T* a, const T* b, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] = a[i] + b[i];
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(a[i], b[i]);
}

template <class A, class T>
void combine_widened(A* acc, const T* x, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(x[i]);
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], static_cast<A>(x[i]));
}

// The sum of one group of a reduction: out[j] = in[0][at + j] + in[1][at + j] + ... + in[n - 1][at + j] for
// j < g, added in rank order, each lane as the scalar additions add it (the same bits). Returns whether a
// floating-point sum is a NaN anywhere (the caller makes it canonical). Why packs written out: the
// trainers and many users build at -O1, where no compiler vectorizes the loops above, and a reduction's
// group would then cost a scalar load, add and store per element and input; on packs the group's sums
// stay in registers while every input is added (sys/host_loop.hpp: the same run-time choice of ISA).
template <class T>
bool sum_group(T* out, const void* const* in, std::size_t n, std::size_t at, std::size_t g);

#if defined(ZERO_HOST_SIMD)
template <int Bytes, class T>
ZERO_SIMD_INLINE bool sum_packs(T* out, const void* const* in, std::size_t n, std::size_t at, std::size_t g) {
  constexpr int W = Bytes / static_cast<int>(sizeof(T));
  using pack = typename simd::lanes_of<T, W>::type;
  using mask = decltype(pack{} != pack{});
  mask nan{};
  std::size_t j = 0;
  for (; j + W <= g; j += W) {
    pack v, x;
    std::memcpy(&v, static_cast<const T*>(in[0]) + at + j, Bytes);
    for (std::size_t k = 1; k < n; ++k) {
      std::memcpy(&x, static_cast<const T*>(in[k]) + at + j, Bytes);
      v += x;
    }
    if constexpr (std::is_floating_point_v<T>) nan |= v != v;
    std::memcpy(out + j, &v, Bytes);
  }
  bool any = false;
  if constexpr (std::is_floating_point_v<T>)
    for (int l = 0; l < W; ++l) any = any || nan[l] != 0;
  for (; j < g; ++j) {
    T s = static_cast<const T*>(in[0])[at + j];
    for (std::size_t k = 1; k < n; ++k) s += static_cast<const T*>(in[k])[at + j];
    if constexpr (std::is_floating_point_v<T>) any = any || std::isnan(s);
    out[j] = s;
  }
  return any;
}
template <class T>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) bool sum_group_avx512(
    T* out, const void* const* in, std::size_t n, std::size_t at, std::size_t g) {
  const bool nan = sum_packs<64>(out, in, n, at, g);
  _mm256_zeroupper();  // as sys/host_loop.hpp's wide loops: a caller at -O0/-O1 would not
  return nan;
}
template <class T>
__attribute__((target("avx2"), flatten)) bool sum_group_avx2(T* out, const void* const* in, std::size_t n,
                                                            std::size_t at, std::size_t g) {
  const bool nan = sum_packs<32>(out, in, n, at, g);
  _mm256_zeroupper();
  return nan;
}
template <class T>
__attribute__((flatten)) bool sum_group_sse2(T* out, const void* const* in, std::size_t n, std::size_t at,
                                             std::size_t g) {
  return sum_packs<16>(out, in, n, at, g);
}
#endif

template <class T>
bool sum_group(T* out, const void* const* in, std::size_t n, std::size_t at, std::size_t g) {
#if defined(ZERO_HOST_SIMD)
  switch (sys::host_loop::active()) {
    case sys::host_loop::isa::avx512: return sum_group_avx512(out, in, n, at, g);
    case sys::host_loop::isa::avx2: return sum_group_avx2(out, in, n, at, g);
    case sys::host_loop::isa::sse2: return sum_group_sse2(out, in, n, at, g);
    case sys::host_loop::isa::scalar: break;
  }
#endif
  bool any = false;
  for (std::size_t j = 0; j < g; ++j) {
    T s = static_cast<const T*>(in[0])[at + j];
    for (std::size_t k = 1; k < n; ++k) s += static_cast<const T*>(in[k])[at + j];
    if constexpr (std::is_floating_point_v<T>) any = any || std::isnan(s);
    out[j] = s;
  }
  return any;
}

}  // namespace zero::comm::detail
