// Matrix products in a fixed order of fp32 operations on the host, on packs of the widest ISA the machine has: what a
// matrix optimizer's orthogonalization multiplies with (optim/newton_schulz.hpp).
#pragma once

#include <cstddef>

#include "zero/core/elementwise.hpp"
#include "zero/core/fp.hpp"
#include "zero/sys/host_loop.hpp"

namespace zero::sys {

// Columns j of R rows of C = A B (A's rows `a`, its row length k; B's rows of m): each of the R sums
// kept in a register from +0 over q = 0, 1, ..., k - 1, every product and sum rounded, then stored
// once. Arrays: the R rows of C. Keeping a block of C in registers across the whole sum is what makes
// the product fast (a row of B loaded once for R rows of C, and C neither read nor written in the
// loop), and the order of each sum is the one the definition gives.
template <int R>
struct product_rows_rule {
  const float* a;
  std::size_t k;
  const float* b;
  std::size_t m;
  template <class... C>
  ZERO_HD void operator()(std::size_t j, C*... c) const {
    apply<float>(j, c...);
  }
  template <class V, class... C>
  ZERO_HD void apply(std::size_t j, C*... c) const {
    static_assert(sizeof...(C) == R, "one row of C per register block");
    using namespace zero::fp;
    V acc[R];
    for (int r = 0; r < R; ++r) acc[r] = V(0.0f);
    for (std::size_t q = 0; q < k; ++q) {
      const V bq = elementwise::load<V>(b + q * m, j);
      for (int r = 0; r < R; ++r) acc[r] = add(acc[r], mul(V(a[static_cast<std::size_t>(r) * k + q]), bq));
    }
    int r = 0;
    (elementwise::store(c, j, acc[r++]), ...);
  }
};

// C (n x m) = A (n x k) B (k x m), row-major, each C(i, j) summed from +0 over q = 0, 1, ..., k - 1,
// every product and sum rounded, every NaN canonical: the order newton_schulz::ordered_products
// defines, with the same bits (each lane of a pack is the same IEEE operation as on a float). Blocks
// of 8 rows of C (then single rows), each over the m columns on packs (sys/host_loop.hpp's dispatch).
// `rows(n, f)` runs f(begin, end) over ranges of [0, n), here of those blocks: the rank's threads, or one call.
template <class RowRunner>
struct host_products {
  static constexpr std::size_t block = 8;
  RowRunner rows;
  void multiply(const float* A, const float* B, float* C, std::size_t n, std::size_t k, std::size_t m) const {
    const std::size_t blocks = (n + block - 1) / block;
    rows(blocks, [&](std::size_t begin, std::size_t end) {
      for (std::size_t blk = begin; blk < end; ++blk) {
        const std::size_t i = blk * block;
        float* c = C + i * m;
        if (i + block <= n)
          host_loop::run(m, product_rows_rule<8>{A + i * k, k, B, m}, 0, c, c + m, c + 2 * m, c + 3 * m, c + 4 * m,
                         c + 5 * m, c + 6 * m, c + 7 * m);
        else
          for (std::size_t r = i; r < n; ++r) host_loop::run(m, product_rows_rule<1>{A + r * k, k, B, m}, 0, C + r * m);
      }
    });
  }
};
// host_products{runner}: spelled out, since aggregate deduction is C++20's and clang before 17 lacks it.
template <class RowRunner>
host_products(RowRunner) -> host_products<RowRunner>;

}  // namespace zero::sys
