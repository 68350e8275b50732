// What the CUDA parts do without a usable device (the build machine): clear zero::errors, never a crash or a hang.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

#include "zero/zero_cuda.cuh"

TEST_CASE("ZERO_CUDA_CHECK turns a CUDA error into zero::error (kind device) with CUDA's own words") {
  try {
    ZERO_CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL("no exception");
  } catch (const zero::error& e) {
    CHECK(e.kind() == zero::error_kind::device);
    const std::string what = e.what();
    CHECK(what.find("cudaErrorMemoryAllocation") != std::string::npos);
    CHECK(what.find(cudaGetErrorString(cudaErrorMemoryAllocation)) != std::string::npos);
    CHECK(what.find("test_cuda_errors.cu") != std::string::npos);
  }
  CHECK_NOTHROW(ZERO_CUDA_CHECK(cudaSuccess));
}

TEST_CASE("sys::cuda outside a rank names the missing context") {
  CHECK_THROWS_WITH_AS(zero::sys::cuda::allocate(16), doctest::Contains("no gpu::context is bound to this thread"),
                       zero::error);
  CHECK_NOTHROW(zero::sys::cuda::deallocate(nullptr, 0));
}

TEST_CASE("comm::cuda_threads refuses bad world sizes, and a missing device is an error, not a crash") {
  CHECK_THROWS_WITH_AS(zero::comm::cuda_threads::launch(0, [](zero::comm::cuda_threads&) {}),
                       doctest::Contains("world size must be in [1, 64]"), zero::error);
  if (!zero::gpu::device_available()) {
    bool ran = false;
    CHECK_THROWS_AS(zero::comm::cuda_threads::launch(2, [&](zero::comm::cuda_threads&) { ran = true; }), zero::error);
    CHECK_FALSE(ran);
  }
}

#if ZERO_WITH_NCCL
TEST_CASE("comm::nccl maps zero's types to NCCL's and refuses a rank outside its world") {
  static_assert(zero::comm::detail::nccl_type<float>() == ncclFloat32);
  static_assert(zero::comm::detail::nccl_type<double>() == ncclFloat64);
  static_assert(zero::comm::detail::nccl_type<zero::bf16>() == ncclBfloat16);
  static_assert(zero::comm::detail::nccl_type<zero::fp16>() == ncclFloat16);
  const ncclUniqueId id{};
  CHECK_THROWS_WITH_AS(zero::comm::nccl(id, 3, 2, 0), doctest::Contains("rank 3 is not in a world of size 2"),
                       zero::error);
  if (!zero::gpu::device_available()) {
    // The rank's context cannot be made: a device error, before NCCL is asked to wait for peers.
    CHECK_THROWS_AS(zero::comm::nccl(id, 0, 1, 0), zero::error);
  }
}
#endif
