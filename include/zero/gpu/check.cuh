// ZERO_CUDA_CHECK: turns a failed CUDA runtime call into zero::error (kind device) with cudaGetErrorString.
#pragma once

#include <cuda_runtime.h>

#include "zero/error.hpp"

namespace zero::gpu {

// Throws zero::error naming the call, where it was made and CUDA's own description. The error is
// also cleared from the runtime's last-error slot, so that one failure is not reported twice.
inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(error_kind::device, "CUDA: ", call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), ": ",
       cudaGetErrorString(status));
}

// Whether a device can run our kernels: false (never an exception) without a driver or a GPU, so
// tests and tools can skip cleanly on a build machine.
inline bool device_available() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace zero::gpu

#define ZERO_CUDA_CHECK(call) ::zero::gpu::check((call), #call, __FILE__, __LINE__)
