// Matrix products in a fixed order of fp32 operations on the host, on packs of the widest ISA the machine has: what a
// matrix optimizer's orthogonalization multiplies with (optim/newton_schulz.hpp).
#pragma once

#include <algorithm>
#include <cstddef>

#include "zero/sys/host_gemm.hpp"
#include "zero/sys/host_loop.hpp"

namespace zero::sys {

// C (n x m) = A (n x k) B (k x m), row-major, each C(i, j) summed from +0 over q = 0, 1, ..., k - 1,
// every product and sum rounded, every NaN canonical: the order newton_schulz::ordered_products
// defines, with the same bits (each lane of a pack is the same IEEE operation as on a float), blocked
// and packed as a BLAS is (sys/host_gemm.hpp).
//
// `rows(count, f)` runs f(begin, end) over ranges of [0, count): the rank's threads (thread_pool::run,
// which cuts ranges of elements), or one call. The count is C's n m elements, and a range computes
// the tiles of rows of C whose first element falls in it: each element of C is then summed by one
// thread, whole, in the one order, so the bits do not depend on how the range is cut. (A count of
// elements, not of row tiles: the pool cuts ranges of at least 1024, so the 128 tiles of 1024 rows
// would all stay on one thread.)
//
// A product of fewer than min_parallel_madds multiply-adds runs on the calling thread: waking the
// pool's threads costs more than they save on it. 2^22, about 80 us of one AVX-512 core: on Zen 4 (a
// 2-vCPU guest) a pass of the pool cost 25-60 us, and 2 threads broke even at 4.2M multiply-adds
// (128 x 256 x 128), gained 1.1-1.3x at 7M and 1.5-1.7x at 17M. A test sets 0 to cut every product.
template <class RowRunner>
struct host_products {
  RowRunner rows;
  std::size_t min_parallel_madds = std::size_t{1} << 22;
  void multiply(const float* A, const float* B, float* C, std::size_t n, std::size_t k, std::size_t m) const {
    if (n == 0 || m == 0) return;
#if defined(ZERO_HOST_SIMD)
    const host_loop::isa level = host_loop::active();  // read once: every range runs the same level
#else
    const host_loop::isa level = host_loop::isa::scalar;
#endif
    const std::size_t tile = host_gemm::tile_rows(level), tile_elements = tile * m;
    const auto range = [&](std::size_t begin, std::size_t end) {
      const std::size_t first = (begin + tile_elements - 1) / tile_elements * tile;
      const std::size_t last = std::min(n, (end + tile_elements - 1) / tile_elements * tile);
      host_gemm::multiply_rows(level, A, B, C, k, m, first, last);
    };
    const double madds = static_cast<double>(n) * static_cast<double>(m) * static_cast<double>(k);
    if (madds < static_cast<double>(min_parallel_madds))
      range(0, n * m);
    else
      rows(n * m, range);
  }
};
// host_products{runner} and {runner, min_parallel_madds}: spelled out, since aggregate deduction is C++20's and
// clang before 17 lacks it.
template <class RowRunner>
host_products(RowRunner) -> host_products<RowRunner>;
template <class RowRunner>
host_products(RowRunner, std::size_t) -> host_products<RowRunner>;

}  // namespace zero::sys
