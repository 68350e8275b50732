// Exits 0 when a CUDA device can be used and 77 (meson's "skipped") otherwise: the guard of the GPU scripts.
#include <cuda_runtime.h>

int main() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0 ? 0 : 77;
}
