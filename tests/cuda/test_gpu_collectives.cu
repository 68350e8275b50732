// Device collectives: the conformance suite on comm::cuda_threads and comm::nccl, 2-byte sums against comm::threads, faults.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/comm/conformance.hpp"
#include "zero/zero_cuda.cuh"

namespace {

using zero::comm::counted;
using zero::comm::cuda_threads;

template <int N>
struct cuda_threads_world {
  template <class F>
  static void launch(F f) {
    cuda_threads::launch(N, [&](cuda_threads& c) { f(c); });
  }
};
template <int N>
struct counted_cuda_world {
  template <class F>
  static void launch(F f) {
    cuda_threads::launch(N, [&](cuda_threads& t) {
      counted<cuda_threads> c(t);
      f(c);
    });
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// splitmix64 values spread over magnitudes, so the summation order shows in the low bits.
float spread(int rank, std::size_t i) { return zero::conformance::value<float>(rank, i, 0x77); }

// all_reduce and reduce_scatter of a 2-byte type on N ranks of a backend, rank `me`'s results on the host.
template <class T, class Comm>
std::vector<std::vector<T>> half_sums(Comm& c, std::size_t count) {
  using S = typename Comm::system;
  const int n = c.size(), me = c.rank();
  std::vector<T> mine(count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = T(spread(me, i));
  const std::size_t bytes = mine.size() * sizeof(T);
  T* send = static_cast<T*>(S::allocate(bytes));
  T* recv = static_cast<T*>(S::allocate(bytes));
  S::copy(send, mine.data(), bytes);
  std::vector<std::vector<T>> out(3, std::vector<T>(mine.size()));
  c.all_reduce(send, recv, mine.size(), zero::reduce_op::sum);
  S::copy(out[0].data(), recv, bytes);
  c.reduce_scatter(send, recv, count, zero::reduce_op::sum);
  out[1].resize(count);
  S::copy(out[1].data(), recv, count * sizeof(T));
  c.all_reduce(send, recv, mine.size(), zero::reduce_op::max);
  S::copy(out[2].data(), recv, bytes);
  S::deallocate(send, bytes);
  S::deallocate(recv, bytes);
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TYPE_TO_STRING_AS("cuda_threads x1", cuda_threads_world<1>);
TYPE_TO_STRING_AS("cuda_threads x2", cuda_threads_world<2>);
TYPE_TO_STRING_AS("cuda_threads x3", cuda_threads_world<3>);
TYPE_TO_STRING_AS("cuda_threads x4", cuda_threads_world<4>);
TYPE_TO_STRING_AS("counted<cuda_threads> x3", counted_cuda_world<3>);

#define ZERO_CUDA_WORLDS \
  cuda_threads_world<1>, cuda_threads_world<2>, cuda_threads_world<3>, cuda_threads_world<4>, counted_cuda_world<3>

TEST_CASE_TEMPLATE("GPU conformance: all_reduce", W, ZERO_CUDA_WORLDS) {
  W::launch([](auto& c) { zero::conformance::all_reduce(c); });
}
TEST_CASE_TEMPLATE("GPU conformance: reduce_scatter", W, ZERO_CUDA_WORLDS) {
  W::launch([](auto& c) { zero::conformance::reduce_scatter(c); });
}
TEST_CASE_TEMPLATE("GPU conformance: all_gather", W, ZERO_CUDA_WORLDS) {
  W::launch([](auto& c) { zero::conformance::all_gather(c); });
}
TEST_CASE_TEMPLATE("GPU conformance: broadcast", W, ZERO_CUDA_WORLDS) {
  W::launch([](auto& c) { zero::conformance::broadcast(c); });
}
TEST_CASE_TEMPLATE("GPU conformance: barrier", W, ZERO_CUDA_WORLDS) {
  W::launch([](auto& c) { zero::conformance::barrier(c); });
}
TEST_CASE_TEMPLATE("GPU conformance: determinism", W, ZERO_CUDA_WORLDS) {
  W::launch([](auto& c) { zero::conformance::determinism(c); });
}

TEST_CASE_TEMPLATE("GPU: 2-byte sums equal comm::threads' (fp32 accumulation in rank order, one rounding)", T,
                   zero::bf16, zero::fp16) {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    for (std::size_t count : {std::size_t{1}, std::size_t{13}, std::size_t{1024}, std::size_t{3001}}) {
      CAPTURE(count);
      std::vector<std::vector<std::vector<T>>> host(static_cast<std::size_t>(n)), dev(static_cast<std::size_t>(n));
      zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
        host[static_cast<std::size_t>(c.rank())] = half_sums<T>(c, count);
      });
      cuda_threads::launch(n, [&](cuda_threads& c) { dev[static_cast<std::size_t>(c.rank())] = half_sums<T>(c, count); });
      for (int r = 0; r < n; ++r)
        for (int k = 0; k < 3; ++k) {
          CAPTURE(r);
          CAPTURE(k);
          CHECK(same_bits(dev[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)],
                          host[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)]));
        }
    }
  }
}

TEST_CASE("GPU cuda_threads: a rank that throws fails the others' pending collectives, well before the timeout") {
  const auto t0 = std::chrono::steady_clock::now();
  zero::comm::cuda_threads_options o;
  o.timeout = std::chrono::seconds(60);
  std::vector<std::string> errors(3);
  CHECK_THROWS_WITH_AS(cuda_threads::launch(
                           3,
                           [&](cuda_threads& c) {
                             if (c.rank() == 1) throw std::runtime_error("rank 1 gives up");
                             float* p = static_cast<float*>(zero::sys::cuda::allocate(64));
                             try {
                               c.all_reduce(p, p, 16, zero::reduce_op::sum);
                             } catch (const zero::error& e) {
                               errors[static_cast<std::size_t>(c.rank())] = e.what();
                               zero::sys::cuda::deallocate(p, 64);
                               throw;
                             }
                           },
                           o),
                       "rank 1 gives up", std::runtime_error);
  CHECK(seconds_since(t0) < 30.0);
  for (int r : {0, 2}) CHECK(errors[static_cast<std::size_t>(r)].find("comm::cuda_threads rank") != std::string::npos);
}

TEST_CASE("GPU cuda_threads: ranks that disagree on a collective all get an error") {
  CHECK_THROWS_AS(cuda_threads::launch(2,
                                       [](cuda_threads& c) {
                                         float* p = static_cast<float*>(zero::sys::cuda::allocate(256));
                                         if (c.rank() == 0) c.all_reduce(p, p, 16, zero::reduce_op::sum);
                                         else c.all_gather(p, p, 8);
                                         zero::sys::cuda::deallocate(p, 256);
                                       }),
                  zero::error);
}

TEST_CASE("GPU cuda_threads: a world larger than one kernel can address is refused") {
  CHECK_THROWS_AS(cuda_threads::launch(cuda_threads::max_ranks + 1, [](cuda_threads&) {}), zero::error);
}

#if ZERO_WITH_NCCL
namespace {

std::vector<int> all_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  std::vector<int> d;
  for (int i = 0; i < n; ++i) d.push_back(i);
  return d;
}

}  // namespace

TEST_CASE("GPU conformance: nccl, one rank, both ways of creating in-process communicators") {
  for (bool nonblocking : {true, false}) {
    CAPTURE(nonblocking);
    zero::comm::nccl_options o;
    o.nonblocking = nonblocking;
    zero::comm::nccl::launch({0}, [](zero::comm::nccl& c) { zero::conformance::all(c); }, o);
  }
}

TEST_CASE("GPU conformance: nccl over every device of this machine, deterministic and fast modes") {
  const auto devices = all_devices();
  if (devices.size() < 2) {
    MESSAGE("one device: the multi-GPU NCCL conformance needs two or more");
    return;
  }
  zero::comm::nccl::launch(devices, [](zero::comm::nccl& c) { zero::conformance::all(c); });
  zero::comm::nccl_options fast;
  fast.deterministic = false;
  zero::comm::nccl::launch(devices, [](zero::comm::nccl& c) { zero::conformance::all(c, {.rank_ordered = false}); }, fast);
}

TEST_CASE("GPU nccl: a unique id and an explicit rank make a communicator; 2-byte sums are exact on one rank") {
  const ncclUniqueId id = zero::comm::nccl::unique_id();
  zero::comm::nccl c(id, 0, 1, 0);
  const auto got = half_sums<zero::bf16>(c, 100);
  std::vector<zero::bf16> mine(100);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = zero::bf16(spread(0, i));
  CHECK(same_bits(got[0], mine));
  CHECK(same_bits(got[1], mine));
}
#endif
