// The guard of the GPU scripts: exits 0 with a usable CUDA device, 77 (meson's "skipped") on a machine
// without one, 1 on any other CUDA error (tests/cuda/device_presence.hpp).
#include "device_presence.hpp"

int main() {
  const gpu_test::presence p = gpu_test::probe_devices();
  return p == gpu_test::presence::usable ? 0 : gpu_test::exit_code(p);
}
