// Whether the GPU tests can run, skip, or must fail: the one rule of gpu_main.cpp and device_probe.cpp.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>

namespace gpu_test {

// A machine without a CUDA device skips the GPU tests (meson's exit code 77); a device that is there
// but cannot be used fails them. "Without a device" is exactly:
//   - cudaErrorNoDevice, or a device count of 0: a driver without a GPU;
//   - cudaErrorInsufficientDriver where the driver library (libcuda.so.1) cannot be loaded at all: no
//     NVIDIA driver is installed (the runtime reports that case as an insufficient driver).
// Anything else is a failure: an installed driver older than the runtime (insufficient driver with
// libcuda.so.1 present), a driver that cannot initialize, a device that is busy or unavailable.
enum class presence { usable, absent, broken };

inline presence probe_devices() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status == cudaSuccess) {
    if (devices > 0) return presence::usable;
    std::printf("no CUDA device (the driver reports 0 devices): GPU tests skipped\n");
    return presence::absent;
  }
  if (status == cudaErrorNoDevice) {
    std::printf("no CUDA device (%s): GPU tests skipped\n", cudaGetErrorName(status));
    return presence::absent;
  }
  if (status == cudaErrorInsufficientDriver) {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
      std::printf("no NVIDIA driver (libcuda.so.1 cannot be loaded: %s): GPU tests skipped\n", dlerror());
      return presence::absent;
    }
    dlclose(driver);
  }
  std::fprintf(stderr, "FAIL: the CUDA runtime cannot use the device: cudaGetDeviceCount: %s (%s)\n",
               cudaGetErrorName(status), cudaGetErrorString(status));
  return presence::broken;
}

// The exit code of a GPU test program that cannot run its tests: 77 (skipped) or 1 (failed).
inline int exit_code(presence p) { return p == presence::absent ? 77 : 1; }

}  // namespace gpu_test
