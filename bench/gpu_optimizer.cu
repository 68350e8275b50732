// gpu_optimizer: sys::cuda's optimizer-kernel bandwidth as a fraction of the copy bandwidth measured in the same run (JSON lines).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "zero/zero_cuda.cuh"

// The optimizer step is memory-bound: per element it reads the gradient and reads and writes the
// master weight and the state slots (and writes a parameter copy in mixed precision), with a few
// dozen flops in between. Its ceiling is therefore the device's streaming bandwidth, which a large
// cudaMemcpy between device buffers measures on the same device, in the same run, under the same
// clocks. The figure of merit is the kernel's bytes per second over the copy's (issue target: 0.85).

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

void line(const char* kernel, const std::string& device, std::size_t n, double bytes_per_elem, double seconds,
          double copy_gbps) {
  const double gbps = bytes_per_elem * static_cast<double>(n) / seconds * 1e-9;
  std::printf(
      "{\"bench\": \"gpu_optimizer\", \"kernel\": \"%s\", \"device\": \"%s\", \"elements\": %zu, "
      "\"bytes_per_element\": %.0f, \"seconds\": %.6e, \"gbps\": %.1f, \"copy_gbps\": %.1f, "
      "\"fraction_of_copy\": %.3f}\n",
      kernel, device.c_str(), n, bytes_per_elem, seconds, gbps, copy_gbps, gbps / copy_gbps);
}

template <class G, class P>
void adamw_case(const char* name, zero::sys::cuda& sys, timer& tm, std::size_t n, int reps, const std::string& device,
                double copy_gbps, bool copy_out) {
  const filled<G> g(n, 0.01f);
  const filled<float> w(n, 0.5f), m(n, 0.0f), v(n, 0.001f);
  const filled<P> p(copy_out ? n : 0, 0.0f);
  float* slots[2] = {m.data(), v.data()};
  zero::optim::adamw opt;
  const auto c = opt.constants(10);
  const double secs = tm.median(sys.stream(), reps, [&] {
    sys.apply_update<zero::optim::adamw>(c, g.data(), 4.0f, 1.0f, w.data(), slots, copy_out ? p.data() : nullptr, n);
  });
  // g read; w, m, v read and written; p written.
  const double bytes = sizeof(G) + 3.0 * 2 * sizeof(float) + (copy_out ? sizeof(P) : 0);
  line(name, device, n, bytes, secs, copy_gbps);
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
    // ceiling, separate from the optimizer's arithmetic.
    const double cast_secs = tm.median(sys.stream(), reps, [&] { sys.cast_from_float(b.data(), a.data(), n); });
    line("launcher_copy_fp32", device, n, 8.0, cast_secs, copy_gbps);

    adamw_case<float, float>("adamw_fp32", sys, tm, n, reps, device, copy_gbps, false);
    adamw_case<zero::bf16, zero::bf16>("adamw_bf16", sys, tm, n, reps, device, copy_gbps, true);
    sys.synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_optimizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
