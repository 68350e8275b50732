// gpu::for_each_chunk: the one vectorized grid-stride launcher of every element-wise kernel (128-bit accesses where aligned).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "zero/sys/cuda/check.cuh"

namespace zero::gpu {

// Elements a thread handles per step on the vector path: 16 bytes of a 2-byte type, 32 of fp32. One
// width for every operand of a kernel, so the operands of one element stay in one thread.
inline constexpr int chunk_elements = 8;
inline constexpr int block_threads = 256;

// W consecutive elements of one operand, held in registers. alignas(16): the chunk moves as whole
// 128-bit words when W * sizeof(T) is a multiple of 16.
template <class T, int W>
struct alignas(16) chunk {
  T v[W];
};

template <int W, class T>
__device__ __forceinline__ void load(const T* src, chunk<std::remove_const_t<T>, W>& c) {
  if constexpr (W * sizeof(T) % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(c.v);
#pragma unroll
    for (int k = 0; k < static_cast<int>(W * sizeof(T) / 16); ++k) d[k] = s[k];
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) c.v[i] = src[i];
  }
}

template <int W, class T>
__device__ __forceinline__ void store(T* dst, const chunk<T, W>& c) {
  if constexpr (W * sizeof(T) % 16 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(c.v);
    uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int k = 0; k < static_cast<int>(W * sizeof(T) / 16); ++k) d[k] = s[k];
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) dst[i] = c.v[i];
  }
}

// Body::apply<W>(base) processes elements [base, base + W). On the vector path every thread takes
// chunks of V elements (W = V); the ragged tail, and everything when some operand is not 16-byte
// aligned, goes one element at a time (W = 1). Which elements a thread handles never affects the
// result: every element's arithmetic is independent of the others.
template <int V, class Body>
__global__ void __launch_bounds__(block_threads) chunked_kernel(const Body body, std::size_t n, bool vectorized) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t done = 0;
  if (vectorized) {
    const std::size_t chunks = n / V;
    for (std::size_t c = thread; c < chunks; c += stride) body.template apply<V>(c * V);
    done = chunks * V;
  }
  for (std::size_t j = done + thread; j < n; j += stride) body.template apply<1>(j);
}

inline bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Launches body over [0, n) on `stream`. `aligned`: every pointer the body touches is 16-byte
// aligned at element 0, so whole chunks may move as 128-bit words.
template <class Body>
void for_each_chunk(cudaStream_t stream, int multiprocessors, std::size_t n, bool aligned, const Body& body) {
  if (n == 0) return;
  const std::size_t per_block = static_cast<std::size_t>(block_threads) * (aligned ? chunk_elements : 1);
  const std::size_t wanted = (n + per_block - 1) / per_block;
  // Eight resident blocks of 256 threads fill an SM (2048 threads); the grid-stride loop covers any n
  // beyond that without launching more blocks than can run at once.
  const std::size_t cap = static_cast<std::size_t>(multiprocessors > 0 ? multiprocessors : 1) * 8;
  const auto grid = static_cast<unsigned>(wanted < cap ? wanted : cap);
  chunked_kernel<chunk_elements><<<grid, block_threads, 0, stream>>>(body, n, aligned);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::gpu
