// gpu::for_each_chunk: the one vectorized grid-stride launcher of every element-wise kernel, and the launch shapes it takes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "zero/gpu/check.cuh"

namespace zero::gpu {

// The granularity a caller may rely on for the vector path: a slice that starts at a multiple of
// chunk_elements elements of a 16-byte aligned buffer is 16-byte aligned, and whole for every launch
// shape (the collectives cut their per-rank chunks at multiples of it).
inline constexpr int chunk_elements = 8;
inline constexpr int block_threads = 256;

// How a launch spreads elements over threads, chosen by bench/gpu_optimizer's sweep
// (docs/performance.md); no choice changes a bit, since every element's arithmetic is independent.
// - Chunk: consecutive elements a thread moves at once per operand (4: 16 bytes of fp32, 8 of a 2-byte
//   type; 8: 32 and 16), as 128-bit (or 64-bit) words. One width for every operand of a kernel, so
//   the operands of one element stay in one thread.
// - Unroll: chunks a thread loads (a grid apart) before it computes and stores any of them, so that
//   many are in flight per thread: a streaming kernel needs bytes in flight to reach the copy
//   bandwidth.
// - Streaming: loads and stores with the evict-first cache hint (ld.global.cs / st.global.cs): the
//   optimizer's and the collectives' data is touched once per step and should not displace the rest.
template <int Chunk, int Unroll, bool Streaming>
struct launch_shape {
  static_assert(Chunk == 4 || Chunk == 8, "gpu::launch_shape: Chunk is 4 or 8 elements");
  static_assert(Unroll >= 1 && Unroll <= 8, "gpu::launch_shape: Unroll is 1 to 8 chunks");
  static constexpr int chunk = Chunk, unroll = Unroll;
  static constexpr bool streaming = Streaming;
};
// Measured on an H200 (docs/performance.md): 16-byte chunks of fp32, two in flight per thread, with
// streaming hints reach 0.91 of the copy bandwidth for a plain copy and 0.93 / 0.91 for AdamW fp32 /
// bf16, against 0.74 / 0.81 / 0.81 for one 32-byte chunk without hints.
using default_shape = launch_shape<4, 2, true>;

// W consecutive elements of one operand, held in registers. alignas(16): the chunk moves as whole
// 128-bit (or 64-bit) words when W * sizeof(T) is a multiple of 16 (or 8).
template <class T, int W>
struct alignas(16) chunk {
  T v[W];
};

template <int W, bool Streaming, class T>
__device__ __forceinline__ void load(const T* src, chunk<std::remove_const_t<T>, W>& c) {
  constexpr std::size_t bytes = W * sizeof(T);
  if constexpr (bytes % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(c.v);
#pragma unroll
    for (int k = 0; k < static_cast<int>(bytes / 16); ++k) d[k] = Streaming ? __ldcs(s + k) : s[k];
  } else if constexpr (bytes % 8 == 0) {
    const uint2* s = reinterpret_cast<const uint2*>(src);
    uint2* d = reinterpret_cast<uint2*>(c.v);
#pragma unroll
    for (int k = 0; k < static_cast<int>(bytes / 8); ++k) d[k] = Streaming ? __ldcs(s + k) : s[k];
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) c.v[i] = src[i];
  }
}

template <int W, bool Streaming, class T>
__device__ __forceinline__ void store(T* dst, const chunk<T, W>& c) {
  constexpr std::size_t bytes = W * sizeof(T);
  if constexpr (bytes % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(c.v);
    uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int k = 0; k < static_cast<int>(bytes / 16); ++k) {
      if constexpr (Streaming) __stcs(d + k, s[k]);
      else d[k] = s[k];
    }
  } else if constexpr (bytes % 8 == 0) {
    const uint2* s = reinterpret_cast<const uint2*>(c.v);
    uint2* d = reinterpret_cast<uint2*>(dst);
#pragma unroll
    for (int k = 0; k < static_cast<int>(bytes / 8); ++k) {
      if constexpr (Streaming) __stcs(d + k, s[k]);
      else d[k] = s[k];
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) dst[i] = c.v[i];
  }
}

// Body::apply<W, U, Streaming>(base, step) processes the U chunks of W elements at base, base + step,
// ..., loading all of them before storing any. On the vector path every thread takes groups of
// Unroll chunks, then single chunks; the ragged tail, and everything when some operand is not 16-byte
// aligned, goes one element at a time (W = 1). Which elements a thread handles, and in which group,
// never affects the result: every element's arithmetic is independent of the others.
template <class Shape, class Body>
__global__ void __launch_bounds__(block_threads) chunked_kernel(const Body body, std::size_t n, bool vectorized) {
  constexpr int V = Shape::chunk, U = Shape::unroll;
  constexpr bool S = Shape::streaming;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (vectorized) {
    const std::size_t chunks = n / V;
    std::size_t c = thread;
    if constexpr (U > 1)
      for (; c + static_cast<std::size_t>(U - 1) * stride < chunks; c += static_cast<std::size_t>(U) * stride)
        body.template apply<V, U, S>(c * V, stride * V);
    for (; c < chunks; c += stride) body.template apply<V, 1, S>(c * V, 0);
    done = chunks * V;
  }
  for (std::size_t j = done + thread; j < n; j += stride) body.template apply<1, 1, S>(j, 0);
}

inline bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Blocks of this kernel that fit on one multiprocessor at once (registers and threads permitting),
// asked once per kernel from the occupancy API: the grid is one full wave of resident blocks, and
// the grid-stride loop covers any n beyond it.
template <class Shape, class Body>
int resident_blocks_per_sm() {
  static const int blocks = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, chunked_kernel<Shape, Body>, block_threads, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      b = 0;
    }
    return b > 0 ? b : 1;
  }();
  return blocks;
}

// Launches body over [0, n) on `stream`. `aligned`: every pointer the body touches is 16-byte
// aligned at element 0, so whole chunks may move as vector words.
template <class Shape = default_shape, class Body>
void for_each_chunk(cudaStream_t stream, int multiprocessors, std::size_t n, bool aligned, const Body& body) {
  if (n == 0) return;
  const std::size_t per_block = static_cast<std::size_t>(block_threads) * (aligned ? Shape::chunk : 1);
  const std::size_t wanted = (n + per_block - 1) / per_block;
  const std::size_t cap = static_cast<std::size_t>(multiprocessors > 0 ? multiprocessors : 1) *
                          static_cast<std::size_t>(resident_blocks_per_sm<Shape, Body>());
  const auto grid = static_cast<unsigned>(wanted < cap ? wanted : cap);
  chunked_kernel<Shape><<<grid, block_threads, 0, stream>>>(body, n, aligned);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::gpu
