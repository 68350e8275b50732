// The doctest main of the GPU suites: skips (77) on a machine without a CUDA device, fails on other CUDA errors.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "device_presence.hpp"

int main(int argc, char** argv) {
  const gpu_test::presence p = gpu_test::probe_devices();
  if (p != gpu_test::presence::usable) return gpu_test::exit_code(p);
  doctest::Context context(argc, argv);
  return context.run();
}
