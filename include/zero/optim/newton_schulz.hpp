// The quintic Newton-Schulz iteration that orthogonalizes a matrix (Muon's step), in fp32 with every sum in a fixed
// order, so that any rank, system and thread count that runs it gives the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "zero/core/fp.hpp"

namespace zero::optim {

// Why fixed-order products: Muon's bits must not depend on which rank orthogonalizes a matrix, nor on
// the stage or N, and a BLAS sums a dot product in an order that depends on its kernel, the ISA and its
// threads. Here element (i, j) of a product is sum_k a(i, k) b(k, j), added from k = 0 upward in fp32
// from +0, each product and sum rounded (zero::fp), an order any system can repeat bit for bit: the
// iteration takes its products from the caller (`products.multiply`), the engine passing the
// system's (sys/host_products.hpp: the same order on packs of the host's widest ISA).
struct newton_schulz {
  // The published quintic's coefficients (Jordan et al. 2024) and its five iterations.
  static constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  static constexpr int steps = 5;
  // Added to the Frobenius norm before the first division, as the reference implementation does.
  static constexpr double norm_eps = 1e-7;

  // The order itself, one element at a time: the reference every system's products equal.
  struct ordered_products {
    // C (n x m) = A (n x k) B (k x m), row-major; C must not alias A or B.
    void multiply(const float* A, const float* B, float* C, std::size_t n, std::size_t k, std::size_t m) const {
      for (std::size_t i = 0; i < n; ++i) {
        float* ci = C + i * m;
        std::fill(ci, ci + m, 0.0f);
        for (std::size_t q = 0; q < k; ++q)
          for (std::size_t j = 0; j < m; ++j)
            ci[j] = fp::canonical(fp::add(ci[j], fp::mul(A[i * k + q], B[q * m + j])));
      }
    }
  };

  // The workspace of one orthogonalization: reused across matrices, grown to the largest.
  struct workspace {
    std::vector<float> x, xt, a, aa, bx;
  };

  // x (rows x cols, row-major) replaced by its orthogonalization: X = x / (||x||_F + 1e-7), worked on as
  // the wide orientation (fewer rows than columns, transposed where it is tall), then five times
  //   A = X X^T;  B = b A + c A A;  X = a X + B X
  // and back to rows x cols. Every NaN it stores is the canonical one (zero::fp::canonical).
  template <class Products>
  static void orthogonalize(float* x, std::size_t rows, std::size_t cols, workspace& w, const Products& products) {
    const bool tall = rows > cols;
    const std::size_t n = tall ? cols : rows, m = tall ? rows : cols;
    const std::size_t nm = n * m;
    w.x.resize(nm);
    w.xt.resize(nm);
    w.a.resize(n * n);
    w.aa.resize(n * n);
    w.bx.resize(nm);
    float* X = w.x.data();
    if (tall)
      transpose(x, X, rows, cols);
    else
      std::copy(x, x + nm, X);
    // The norm in double, in index order (each square of a float is exact in double), rounded once.
    double sq = 0.0;
    for (std::size_t i = 0; i < nm; ++i) sq += static_cast<double>(X[i]) * X[i];
    const float denom = static_cast<float>(std::sqrt(sq) + norm_eps);
    for (std::size_t i = 0; i < nm; ++i) X[i] = fp::canonical(fp::div(X[i], denom));
    float* XT = w.xt.data();
    float* A = w.a.data();
    float* AA = w.aa.data();
    float* BX = w.bx.data();
    for (int s = 0; s < steps; ++s) {
      transpose(X, XT, n, m);
      products.multiply(X, XT, A, n, m, n);  // A = X X^T
      products.multiply(A, A, AA, n, n, n);  // A A
      for (std::size_t i = 0; i < n * n; ++i) AA[i] = fp::canonical(fp::add(fp::mul(b, A[i]), fp::mul(c, AA[i])));
      products.multiply(AA, X, BX, n, n, m);  // B X
      for (std::size_t i = 0; i < nm; ++i) X[i] = fp::canonical(fp::add(fp::mul(a, X[i]), BX[i]));
    }
    if (tall)
      transpose(X, x, n, m);
    else
      std::copy(X, X + nm, x);
  }
  static void orthogonalize(float* x, std::size_t rows, std::size_t cols, workspace& w) {
    orthogonalize(x, rows, cols, w, ordered_products{});
  }

 private:
  static void transpose(const float* from, float* to, std::size_t r, std::size_t c) {
    for (std::size_t i = 0; i < r; ++i)
      for (std::size_t j = 0; j < c; ++j) to[j * r + i] = from[i * c + j];
  }
};

}  // namespace zero::optim
