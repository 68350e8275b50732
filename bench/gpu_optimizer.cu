// gpu_optimizer: sys::cuda's optimizer-kernel bandwidth as a fraction of the copy bandwidth measured in the same run (JSON lines).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "zero/zero_cuda.cuh"

// The optimizer step is memory-bound: per element it reads the gradient and reads and writes the
// master weight and the state slots (and writes a parameter copy in mixed precision), with a few
// dozen flops in between. Its ceiling is therefore the device's streaming bandwidth, which a large
// cudaMemcpy between device buffers measures on the same device, in the same run, under the same
// clocks. The figure of merit is the kernel's bytes per second over the copy's (targets: 0.92 for the
// launcher's plain copy, 0.9 for AdamW).

namespace {

struct timer {
  cudaEvent_t start = nullptr, stop = nullptr;
  timer() {
    ZERO_CUDA_CHECK(cudaEventCreate(&start));
    ZERO_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~timer() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  // Median seconds of `reps` runs of f on stream s, after two warm-up runs.
  template <class F>
  double median(cudaStream_t s, int reps, F f) {
    for (int i = 0; i < 2; ++i) f();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      ZERO_CUDA_CHECK(cudaEventRecord(start, s));
      f();
      ZERO_CUDA_CHECK(cudaEventRecord(stop, s));
      ZERO_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      ZERO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      t.push_back(ms * 1e-3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

// A device array from the rank's pool, filled with a small pattern (values that keep AdamW finite).
template <class T>
class filled {
 public:
  filled(std::size_t n, float base) : n_(n), p_(static_cast<T*>(zero::sys::cuda::allocate(n * sizeof(T)))) {
    std::vector<T> host(std::min<std::size_t>(n, 1 << 20));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<T>(base + 1e-3f * static_cast<float>(i % 997));
    for (std::size_t at = 0; at < n; at += host.size())
      zero::sys::cuda::copy(p_ + at, host.data(), std::min(host.size(), n - at) * sizeof(T));
  }
  filled(const filled&) = delete;
  filled& operator=(const filled&) = delete;
  ~filled() { zero::sys::cuda::deallocate(p_, n_ * sizeof(T)); }
  T* data() const { return p_; }

 private:
  std::size_t n_;
  T* p_;
};

template <class Shape>
void line(const char* kernel, const std::string& device, std::size_t n, double bytes_per_elem, double seconds,
          double copy_gbps) {
  const double gbps = bytes_per_elem * static_cast<double>(n) / seconds * 1e-9;
  std::printf(
      "{\"bench\": \"gpu_optimizer\", \"kernel\": \"%s\", \"chunk\": %d, \"unroll\": %d, \"streaming\": %s, "
      "\"default\": %s, \"device\": \"%s\", \"elements\": %zu, \"bytes_per_element\": %.0f, \"seconds\": %.6e, "
      "\"gbps\": %.1f, \"copy_gbps\": %.1f, \"fraction_of_copy\": %.3f}\n",
      kernel, Shape::chunk, Shape::unroll, Shape::streaming ? "true" : "false",
      std::is_same_v<Shape, zero::gpu::default_shape> ? "true" : "false", device.c_str(), n, bytes_per_elem, seconds,
      gbps, copy_gbps, gbps / copy_gbps);
}

// The launcher in one launch shape: a plain fp32 copy (the cast rule), and the AdamW step in fp32
// (master = parameters) and bf16 (bf16 gradient in, bf16 parameter copy out).
template <class Shape>
void sweep(zero::gpu::context& ctx, timer& tm, std::size_t n, int reps, const std::string& device, double copy_gbps) {
  const cudaStream_t s = ctx.compute();
  const int sms = ctx.multiprocessors();
  {
    const filled<float> a(n, 1.0f), b(n, 2.0f);
    const double secs = tm.median(s, reps, [&] {
      zero::gpu::launch_elementwise<Shape>(s, sms, n, zero::elementwise::cast_rule{}, zero::elementwise::out(b.data()),
                                            zero::elementwise::in(static_cast<const float*>(a.data())));
    });
    line<Shape>("launcher_copy_fp32", device, n, 8.0, secs, copy_gbps);
  }
  zero::optim::adamw opt;
  const auto c = opt.constants(10);
  {
    const filled<float> g(n, 0.01f), w(n, 0.5f), m(n, 0.0f), v(n, 0.001f);
    const double secs = tm.median(s, reps, [&] {
      zero::gpu::launch_elementwise<Shape>(s, sms, n, zero::elementwise::update_in_place_rule<zero::optim::adamw>{c, 4.0f, 1.0f},
                                            zero::elementwise::in(static_cast<const float*>(g.data())),
                                            zero::elementwise::inout(w.data()), zero::elementwise::inout(m.data()),
                                            zero::elementwise::inout(v.data()));
    });
    line<Shape>("adamw_fp32", device, n, 4.0 + 3 * 8.0, secs, copy_gbps);  // g read; w, m, v read and written
  }
  {
    const filled<zero::bf16> g(n, 0.01f), p(n, 0.0f);
    const filled<float> w(n, 0.5f), m(n, 0.0f), v(n, 0.001f);
    const double secs = tm.median(s, reps, [&] {
      zero::gpu::launch_elementwise<Shape>(s, sms, n, zero::elementwise::update_rule<zero::optim::adamw>{{c, 4.0f, 1.0f}},
                                            zero::elementwise::in(static_cast<const zero::bf16*>(g.data())),
                                            zero::elementwise::inout(w.data()), zero::elementwise::out(p.data()),
                                            zero::elementwise::inout(m.data()), zero::elementwise::inout(v.data()));
    });
    line<Shape>("adamw_bf16", device, n, 2.0 + 3 * 8.0 + 2.0, secs, copy_gbps);  // + bf16 parameter written
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = std::size_t{1} << 28;  // 2^28 elements: 1 GiB per fp32 array, far beyond any cache
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--elements") == 0) n = std::strtoull(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: gpu_optimizer [--elements N] [--reps K]\n");
      return 2;
    }
  }
  if (!zero::gpu::device_available()) {
    std::fprintf(stderr, "gpu_optimizer: no usable CUDA device\n");
    return 77;
  }
  try {
    zero::gpu::context ctx(0);
    const zero::gpu::context::binding bind(ctx);
    zero::sys::cuda sys(ctx);
    cudaDeviceProp prop{};
    ZERO_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const std::string device = prop.name;
    timer tm;

    // The reference: one large device-to-device copy, counted as read + write.
    const std::size_t copy_bytes = n * sizeof(float);
    const filled<float> a(n, 1.0f), b(n, 2.0f);
    const double copy_secs = tm.median(sys.stream(), reps, [&] {
      ZERO_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), copy_bytes, cudaMemcpyDeviceToDevice, sys.stream()));
    });
    const double copy_gbps = 2.0 * static_cast<double>(copy_bytes) / copy_secs * 1e-9;
    std::printf("{\"bench\": \"gpu_optimizer\", \"kernel\": \"memcpy_d2d\", \"device\": \"%s\", \"bytes\": %zu, "
                "\"seconds\": %.6e, \"gbps\": %.1f}\n",
                device.c_str(), copy_bytes, copy_secs, copy_gbps);
    // The same copy through the element-wise launcher (a cast from fp32 to fp32): the launcher's own
    // ceiling, separate from the optimizer's arithmetic; then AdamW. Each in several launch shapes
    // (chunk width, chunks in flight per thread, streaming cache hints); "default": the library's.
    using zero::gpu::launch_shape;
    sweep<launch_shape<8, 1, false>>(ctx, tm, n, reps, device, copy_gbps);
    sweep<launch_shape<8, 2, false>>(ctx, tm, n, reps, device, copy_gbps);
    sweep<launch_shape<8, 4, false>>(ctx, tm, n, reps, device, copy_gbps);
    sweep<launch_shape<4, 2, false>>(ctx, tm, n, reps, device, copy_gbps);
    sweep<launch_shape<4, 4, false>>(ctx, tm, n, reps, device, copy_gbps);
    sweep<launch_shape<8, 2, true>>(ctx, tm, n, reps, device, copy_gbps);
    sweep<launch_shape<4, 2, true>>(ctx, tm, n, reps, device, copy_gbps);
    sweep<launch_shape<4, 4, true>>(ctx, tm, n, reps, device, copy_gbps);
    sys.synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_optimizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
