// One optimizer step over a tensor's elements in host memory, for either kind of optimizer: what the suites' references
// and rule checks call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/sys/host.hpp"
#include "zero/sys/host_products.hpp"

namespace testing {

// A tensor's sum of squares by its definition (engine/tensor_sums.hpp's order), one value at a time:
// in each block of 64, lane l (of 16) adds the squares of elements l, l + 16, l + 32, l + 48 from 0.0
// and the lanes are added pairwise (l + 8, + 4, + 2, + 1); a leaf of 64 blocks adds their sums in
// order from 0.0; the tensor adds its leaves' sums in order from 0.0.
inline double ordered_sum_of_squares(const std::vector<float>& xs) {
  double total = 0.0;
  for (std::size_t leaf = 0; leaf < xs.size(); leaf += 4096) {
    double leaf_sum = 0.0;
    for (std::size_t b = leaf; b < std::min(leaf + 4096, xs.size()); b += 64) {
      double lane[16] = {};
      for (std::size_t j = b; j < std::min(b + 64, xs.size()); ++j)
        lane[(j - b) % 16] += static_cast<double>(xs[j]) * static_cast<double>(xs[j]);
      for (int h = 8; h >= 1; h /= 2)
        for (int l = 0; l < h; ++l) lane[l] += lane[l + h];
      leaf_sum += lane[0];
    }
    total += leaf_sum;
  }
  return total;
}

// n elements that make one whole tensor, the averaged gradient g already divided: an element-wise
// optimizer's rule on each (elementwise::update), a tensor-wise optimizer's three parts with the
// tensor's sums by their definition (ordered_sum_of_squares), or, for a matrix optimizer and a tensor of
// shape (..., rows, cols), its three parts on each rows x cols matrix, as a 1-rank engine runs them
// (a shape of one dimension, or none, takes its element-wise rule). p: the parameter copy, or nullptr.
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
    for (std::size_t k = 0; k < K; ++k) sq[k] = ordered_sum_of_squares(xs[k]);
    const float* read[Opt::slots > 0 ? Opt::slots : 1] = {};
    for (int k = 0; k < Opt::slots; ++k) read[k] = slots[k];
    zero::elementwise::apply_factor<Opt>(host, c, Opt::tensor_factor(c, sq), w, read, p, n);
  }
}

}  // namespace testing
