// The device kernels: any element-wise rule and the rank-ordered sums through gpu::for_each_chunk, and the CUB gradient norm.
#pragma once

#include <cuda_runtime.h>

#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>
#include <cuda/std/tuple>
#include <cuda/std/utility>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstddef>
#include <type_traits>
#include <vector>

#include "zero/core/reduce_op.hpp"
#include "zero/config.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/numeric.hpp"
#include "zero/gpu/context.cuh"
#include "zero/gpu/launch.cuh"

namespace zero::gpu {

// ---- element-wise rules ------------------------------------------------------------------------

using elementwise::operand;

// Adapts a rule written for one element of plain arrays (rule(j, arrays...), the same functions the
// host loops call) to chunks: each operand's W elements are loaded into registers, the rule runs on
// those register arrays for j = 0..W-1, and the written operands are stored back. The rule therefore
// performs exactly the floating-point operations it performs on the host.
template <class Rule, class... Ts>
struct elementwise_body {
  Rule rule;
  cuda::std::tuple<operand<Ts>...> ops;

  template <int W, int U, bool S>
  __device__ void apply(std::size_t base, std::size_t step) const {
    apply_chunks<W, U, S>(base, step, cuda::std::index_sequence_for<Ts...>{});
  }

 private:
  // Chunks base + u * step for u < U: every operand of every chunk is loaded before the rule runs,
  // so U chunks' loads are in flight together.
  template <int W, int U, bool S, std::size_t... I>
  __device__ void apply_chunks(std::size_t base, std::size_t step, cuda::std::index_sequence<I...>) const {
    cuda::std::tuple<chunk<std::remove_const_t<Ts>, W>...> local[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      (load_operand<W, S>(cuda::std::get<I>(ops), base + u * step, cuda::std::get<I>(local[u])), ...);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < W; ++i)
        rule(static_cast<std::size_t>(i), local_array(cuda::std::get<I>(ops), cuda::std::get<I>(local[u]))...);
#pragma unroll
    for (int u = 0; u < U; ++u)
      (store_operand<W, S>(cuda::std::get<I>(ops), base + u * step, cuda::std::get<I>(local[u])), ...);
  }
  template <int W, bool S, class T, class C>
  __device__ static void load_operand(const operand<T>& o, std::size_t base, C& c) {
    if (o.read) load<W, S>(o.data + base, c);
  }
  template <int W, bool S, class T, class C>
  __device__ static void store_operand(const operand<T>& o, std::size_t base, const C& c) {
    if constexpr (!std::is_const_v<T>)
      if (o.write) store<W, S>(o.data + base, c);
  }
  template <class T, class C>
  __device__ static auto local_array(const operand<T>&, C& c) -> decltype(&c.v[0]) {
    return c.v;
  }
};

// Runs rule(j, operands...) for j in [0, n) on `stream`, vectorized when every operand is aligned.
// Shape: launch.cuh's launch_shape; only the bench and the tests choose another than the default.
template <class Shape = default_shape, class Rule, class... Ts>
void launch_elementwise(cudaStream_t stream, int multiprocessors, std::size_t n, const Rule& rule,
                        operand<Ts>... ops) {
  const bool aligned = (aligned_16(ops.data) && ...);
  for_each_chunk<Shape>(stream, multiprocessors, n, aligned, elementwise_body<Rule, Ts...>{rule, {ops...}});
}

// ---- index rules ---------------------------------------------------------------------------------

// Adapts a rule called with the global index (rule(j), the rule holding its arrays, as
// core/quantize.hpp's rules) to the launcher: each j runs once, on one thread.
template <class Rule>
struct index_body {
  Rule rule;
  template <int W, int U, bool S>
  __device__ void apply(std::size_t base, std::size_t step) const {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < W; ++i) rule(base + static_cast<std::size_t>(u) * step + static_cast<std::size_t>(i));
  }
};

// Runs rule(j) for j in [0, n) on `stream`: the launcher's element path (no vector words: the rule
// reads its own arrays).
template <class Rule>
void launch_indexed(cudaStream_t stream, int multiprocessors, std::size_t n, const Rule& rule) {
  for_each_chunk(stream, multiprocessors, n, false, index_body<Rule>{rule});
}

// ---- rank-ordered reductions (the device collectives) ------------------------------------------

// The most ranks whose buffers one reduction kernel addresses through a table in its parameters.
inline constexpr int max_peer_ranks = 64;

// acc op x exactly as the host backends compute it: sum in the accumulation type (one IEEE add, no
// contraction), max as std::max(acc, x).
template <class A>
ZERO_HD inline A combine(A acc, A x, reduce_op op) {
  if (op == reduce_op::max) return acc < x ? x : acc;
  if constexpr (std::is_same_v<A, float>) return fp::add(acc, x);
  else return acc + x;
}

// Buffers of the ranks, addressed by rank: a table of pointers (ranks that share a device read each
// other's buffers), or equal slices of one buffer (what NCCL's send/recv put in a staging buffer).
template <class T>
struct peer_table {
  T* p[max_peer_ranks];
  int n;
  __device__ T* operator[](int k) const { return p[k]; }
};
template <class T>
struct peer_slices {
  T* base;
  std::size_t stride;
  int n;
  __device__ T* operator[](int k) const { return base + static_cast<std::size_t>(k) * stride; }
};

// Element i of the result is x_0[i] op x_1[i] op ... op x_{N-1}[i], left to right in rank order
// (acc = x0; acc += x1; ...), 2-byte floats accumulated in fp32 and rounded once, written to every
// output, NaNs canonical as on the host. A chunk is read completely before anything is written, so an
// output may alias an input.
template <class T, class Inputs, class Outputs>
struct rank_sum_body {
  Inputs inputs;
  Outputs outputs;
  reduce_op op;

  // U chunks base + u * step: each input rank's U chunks are loaded together, then added in.
  template <int W, int U, bool S>
  __device__ void apply(std::size_t base, std::size_t step) const {
    using A = accumulate_as_t<T>;
    chunk<T, W> x[U];
    A acc[U][W];
#pragma unroll
    for (int u = 0; u < U; ++u) load<W, S>(inputs[0] + base + u * step, x[u]);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < W; ++i) acc[u][i] = static_cast<A>(x[u].v[i]);
    for (int k = 1; k < inputs.n; ++k) {
#pragma unroll
      for (int u = 0; u < U; ++u) load<W, S>(inputs[k] + base + u * step, x[u]);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int i = 0; i < W; ++i) acc[u][i] = combine(acc[u][i], static_cast<A>(x[u].v[i]), op);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      chunk<T, W> y;
#pragma unroll
      for (int i = 0; i < W; ++i) y.v[i] = store_as<T>(acc[u][i]);
      for (int k = 0; k < outputs.n; ++k) store<W, S>(outputs[k] + base + u * step, y);
    }
  }
};

template <class T, class Inputs, class Outputs>
void launch_rank_sum(cudaStream_t stream, int multiprocessors, std::size_t n, const Inputs& inputs,
                     const Outputs& outputs, reduce_op op, bool aligned) {
  for_each_chunk(stream, multiprocessors, n, aligned, rank_sum_body<T, Inputs, Outputs>{inputs, outputs, op});
}

// ---- the gradient norm -------------------------------------------------------------------------

// Element j's square through the shared rule, so the per-element value is the host's exactly.
template <class G>
struct square_of {
  const G* g;
  float divisor;
  __host__ __device__ double operator()(std::size_t j) const { return elementwise::square(g, divisor, j); }
};

// For each segment k, sum_j (g_k[j] / divisor)^2 in double by cub::DeviceReduce on the context's
// compute stream; the per-segment sums are copied to the host once (one wait for all of them) and
// added there in segment order, starting from 0, as the host loop adds them. A non-finite element
// makes the sum non-finite (the engine's overflow check). CUB reduces in a fixed tree whose shape
// depends only on n and the device, never on timing, so the same segment on the same GPU gives the
// same bits on every run; the order differs from the host's left-to-right sum, so CPU and GPU norms
// agree to rounding, not bit for bit (docs/gpu.md).
template <class G>
double sum_of_squares(context& ctx, const G* const* segments, const std::size_t* sizes, std::size_t count,
                      float divisor) {
  if (count == 0) return 0.0;
  using items_t = thrust::transform_iterator<square_of<G>, thrust::counting_iterator<std::size_t>>;
  auto items = [&](std::size_t k) {
    return items_t(thrust::counting_iterator<std::size_t>(0), square_of<G>{segments[k], divisor});
  };
  std::size_t temp_bytes = 0;
  for (std::size_t k = 0; k < count; ++k) {
    if (sizes[k] == 0) continue;
    std::size_t t = 0;
    ZERO_CUDA_CHECK(cub::DeviceReduce::Reduce(nullptr, t, items(k), static_cast<double*>(nullptr), sizes[k],
                                              cuda::std::plus<double>{}, 0.0, ctx.compute()));
    temp_bytes = t > temp_bytes ? t : temp_bytes;
  }
  // The results first (one double per segment, rounded up to 256 bytes), CUB's temporary storage after.
  const std::size_t result_bytes = (count * sizeof(double) + 255) / 256 * 256;
  auto* scratch = static_cast<unsigned char*>(ctx.compute_scratch(result_bytes + temp_bytes));
  auto* results = reinterpret_cast<double*>(scratch);
  ZERO_CUDA_CHECK(cudaMemsetAsync(results, 0, count * sizeof(double), ctx.compute()));
  for (std::size_t k = 0; k < count; ++k) {
    if (sizes[k] == 0) continue;
    std::size_t t = temp_bytes;
    ZERO_CUDA_CHECK(cub::DeviceReduce::Reduce(scratch + result_bytes, t, items(k), results + k, sizes[k],
                                              cuda::std::plus<double>{}, 0.0, ctx.compute()));
  }
  double total = 0.0;
  if (count == 1) {
    ZERO_CUDA_CHECK(cudaMemcpyAsync(ctx.host_scalar(), results, sizeof(double), cudaMemcpyDeviceToHost, ctx.compute()));
    ctx.wait_compute();
    total += *ctx.host_scalar();
  } else {
    std::vector<double> host(count);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(host.data(), results, count * sizeof(double), cudaMemcpyDeviceToHost, ctx.compute()));
    ctx.wait_compute();
    for (double v : host) total += v;
  }
  return total;
}

}  // namespace zero::gpu
