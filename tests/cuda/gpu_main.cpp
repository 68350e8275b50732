// The doctest main of the GPU suites: exits 77 (meson's "skipped") when no CUDA device can be used.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    // No driver, no GPU, or a driver older than the runtime: nothing here can run.
    std::printf("no usable CUDA device (%s): GPU tests skipped\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
