// sys::cuda: the device memory space, the element-wise loop and the norm as kernels, on one rank's streams.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "zero/error.hpp"
#include "zero/gpu/check.cuh"
#include "zero/gpu/context.cuh"
#include "zero/gpu/kernels.cuh"
#include "zero/gpu/launch.cuh"

namespace zero::sys {

// The system interface of sys::host (allocation, fills, copies, the element-wise loop, the norm) with
// device memory and kernels. Everything runs on the rank's compute stream (gpu::context) and returns
// before the device has finished, except where the host needs a value: copies to and from the host,
// synchronize() and sum_of_squares() wait, through the context's watchdog-guarded wait.
//
// An instance carries the rank's context (comm backends hand it to the engine through make_system()).
// The static members, which buffer<T, System> and the checkpoint code call without an instance, use
// the context bound to the calling thread: the rank's thread, bound by the backend.
struct cuda {
  // What every allocation is aligned to at least; the kernels take the 128-bit path whenever their
  // operands are 16-byte aligned, which every shard is (layout: 32-element shard alignment).
  static constexpr std::size_t alignment = 256;

  cuda() = default;
  explicit cuda(gpu::context& ctx) : ctx_(&ctx) {}

  gpu::context& context() const { return ctx_ ? *ctx_ : bound(); }
  // The stream user kernels that produce gradients or read gathered parameters run on.
  cudaStream_t stream() const { return context().compute(); }

  // ---- memory (static: buffer<T, cuda> and the checkpoint code call these) -----------------------

  // Out of device memory is error_kind::out_of_memory, naming the bytes asked and the device's free memory.
  static void* allocate(std::size_t bytes) { return bound().allocate(bytes); }
  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    if (gpu::context* c = gpu::context::current()) c->deallocate(p, bytes);
    else if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();  // off the rank's thread: a synchronous free
  }
  static void fill_zero(void* p, std::size_t bytes) {
    if (bytes) ZERO_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, bound().compute()));
  }
  // Page-locked host memory (an offload tier's arrays and staging, engine_options::offload): device
  // copies from and to it run at the link's speed, and asynchronously. Out of pinnable memory is
  // error_kind::out_of_memory.
  static constexpr bool host_addressable = false;
  static void* allocate_pinned(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(error_kind::out_of_memory, "sys::cuda: cudaMallocHost of ", bytes, " bytes of pinned host memory failed: ",
           cudaGetErrorString(e));
    }
    return p;
  }
  static void deallocate_pinned(void* p) noexcept {
    if (p && cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
  }
  // Any direction (host or device on either side); complete when it returns.
  static void copy(void* dst, const void* src, std::size_t bytes) { copy_on(bound(), dst, src, bytes); }

  void copy_to_host(void* dst, const void* src, std::size_t bytes) const { copy_on(context(), dst, src, bytes); }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) const { copy_on(context(), dst, src, bytes); }
  // The engine's check before it allocates its model states (zero/engine/memory_check.hpp): the device's
  // free memory (plus the rank's pool's unused blocks), its size, and how many ranks of this process
  // share it, since each of them allocates as much.
  memory_info available() const { return context().available(); }

  // Waits for everything the rank has enqueued on its compute stream (which, through the handshake
  // events, includes every collective it has issued).
  void synchronize() const { context().wait_compute(); }

  // ---- the element-wise loop and the norm (the rules of zero/core/elementwise.hpp) ---------------

  // rule(j, operands' arrays...) for j in [0, n), one kernel on the compute stream through the one
  // launcher (gpu/launch.cuh), vectorized when every operand is 16-byte aligned.
  template <class Rule, class... Ts>
  void for_each(std::size_t n, const Rule& rule, elementwise::operand<Ts>... ops) const {
    gpu::context& x = context();
    gpu::launch_elementwise(x.compute(), x.multiprocessors(), n, rule, ops...);
  }
  // rule(j) for j in [0, n) (rules that hold their arrays: core/quantize.hpp), one kernel on the
  // compute stream through the same launcher, one j per thread.
  template <class Rule>
  void for_each_index(std::size_t n, const Rule& rule) const {
    gpu::context& x = context();
    gpu::launch_indexed(x.compute(), x.multiprocessors(), n, rule);
  }
  template <class G>
  double sum_of_squares(const G* g, std::size_t n, float divisor) const {
    return gpu::sum_of_squares(context(), &g, &n, 1, divisor);
  }
  template <class G>
  double sum_of_squares(const G* const* segments, const std::size_t* sizes, std::size_t count, float divisor) const {
    return gpu::sum_of_squares(context(), segments, sizes, count, divisor);
  }

 private:
  static gpu::context& bound() {
    gpu::context* c = gpu::context::current();
    ZERO_CHECK(c != nullptr, invalid_argument,
               "sys::cuda: no gpu::context is bound to this thread; run the rank through comm::cuda_threads or "
               "comm::nccl (they bind one), or bind one with gpu::context::binding");
    return *c;
  }
  static void copy_on(gpu::context& c, void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return;
    // cudaMemcpyDefault: unified addressing tells host from device memory, so one call serves the
    // host-to-device, device-to-host and device-to-device copies the callers make.
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c.compute()));
    c.wait_compute();
  }

  gpu::context* ctx_ = nullptr;
};

}  // namespace zero::sys
