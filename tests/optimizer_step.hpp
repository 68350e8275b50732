// One optimizer step over a tensor's elements in host memory, for either kind of optimizer: what the suites' references
// and rule checks call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/binned.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/sys/host.hpp"
#include "zero/sys/host_products.hpp"

namespace testing {

// n elements that make one whole tensor, the averaged gradient g already divided: an element-wise
// optimizer's rule on each (elementwise::update), a tensor-wise optimizer's three parts with the
// tensor's exact sums by their definition (binned_sum_of_squares), or, for a matrix optimizer and a tensor of
// shape (..., rows, cols), its three parts on each rows x cols matrix, as a 1-rank engine runs them
// (a shape of one dimension, or none, takes its element-wise rule). p: the parameter copy, or nullptr.
// A tensor's exact sum of squares by its definition, one value at a time (the engine's tensor_sums
// takes it block by block, in any split): each square, exact in double, cut into words below the
// top bin (one above the largest square's) by binned::to_words, the words added, carried, and rounded
// once; NaN where a value is NaN, else infinity where one is infinite.
inline double binned_sum_of_squares(const std::vector<float>& xs) {
  float largest = 0.0f;
  bool nan = false, infinite = false;
  for (float x : xs) {
    nan |= x != x;
    infinite |= std::isinf(x);
    if (std::isfinite(x)) largest = std::max(largest, std::fabs(x));
  }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (infinite) return std::numeric_limits<double>::infinity();
  if (largest == 0.0f) return 0.0;
  constexpr int K = zero::binned::words + 1;
  const int top = zero::binned::summary_of(static_cast<double>(largest) * largest).bin + 1;
  std::int64_t acc[K] = {};
  for (float x : xs) {
    std::int64_t w[K];
    zero::binned::to_words(static_cast<double>(x) * x, top, w);
    for (int k = 0; k < K; ++k) acc[k] += w[k];
  }
  zero::binned::carry(acc);
  return zero::binned::round<double>(acc, top);
}

template <class Opt, class G, class P>
void tensor_step(const typename Opt::step_constants& c, const G* g, float* w, float* const* slots, P* p, std::size_t n,
                 const std::vector<std::size_t>* shape = nullptr) {
  const zero::sys::host host;
  if constexpr (zero::MatrixOptimizer<Opt>) {
    if (shape && shape->size() >= 2) {
      const std::size_t rows = (*shape)[shape->size() - 2], cols = shape->back();
      constexpr int ms = Opt::matrix_slot;
      zero::elementwise::advance<Opt>(host, c, g, 1.0f, 1.0f, w, slots, n);
      std::vector<float> o(slots[ms], slots[ms] + n);
      typename Opt::workspace ws;
      for (std::size_t at = 0; at < n; at += rows * cols)
        Opt::orthogonalize(o.data() + at, rows, cols, ws,
                           zero::sys::host_products{[](std::size_t k, auto&& f) { f(std::size_t{0}, k); }});
      const float* read[Opt::slots] = {};
      for (int k = 0; k < Opt::slots; ++k) read[k] = slots[k];
      read[ms] = o.data();
      zero::elementwise::apply_factor<Opt>(host, c, Opt::matrix_factor(c, rows, cols), w, read, p, n);
      return;
    }
  }
  if constexpr (zero::OptimizerState<Opt>) {
    zero::elementwise::update<Opt>(host, c, g, 1.0f, 1.0f, w, slots, p, n);
  } else {
    constexpr std::size_t K = static_cast<std::size_t>(Opt::tensor_sums);
    zero::elementwise::advance<Opt>(host, c, g, 1.0f, 1.0f, w, slots, n);
    const auto terms = [&](std::size_t j, auto&& see) {
      float s[Opt::slots > 0 ? Opt::slots : 1] = {};
      for (int k = 0; k < Opt::slots; ++k) s[k] = slots[k][j];
      float x[K];
      Opt::norm_terms(c, w[j], static_cast<const float*>(s), x);
      for (std::size_t k = 0; k < K; ++k) see(k, x[k]);
    };
    std::vector<float> xs[K];
    for (std::size_t j = 0; j < n; ++j) terms(j, [&](std::size_t k, float x) { xs[k].push_back(x); });
    double sq[K];
    for (std::size_t k = 0; k < K; ++k) sq[k] = binned_sum_of_squares(xs[k]);
    const float* read[Opt::slots > 0 ? Opt::slots : 1] = {};
    for (int k = 0; k < Opt::slots; ++k) read[k] = slots[k];
    zero::elementwise::apply_factor<Opt>(host, c, Opt::tensor_factor(c, sq), w, read, p, n);
  }
}

}  // namespace testing
