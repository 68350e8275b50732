// square_blocks: the sum of the squares of a block of at most 64 floats in double, in one fixed order: what a tensor-wise
// optimizer's per-tensor sums are built from (engine/tensor_sums.hpp).
#pragma once

#include <cstddef>

namespace zero::square_blocks {

// Why this order: it is the one a pack computes fast and a single value can follow. Lane l of 16
// (l = 0..15) adds the squares of elements l, l + 16, l + 32, l + 48 in that order, starting from
// 0.0; then the lanes are added pairwise, lane l + (l + 8), then l + (l + 4), + 2, + 1. A float's
// square is exact in double, so a fused multiply-add gives the same bits as a product and a sum. A
// block shorter than 64 (a tensor's last) adds nothing where its values end: adding +0.0 to a sum
// of squares (+0.0 or more, or NaN) leaves its bits.
inline constexpr std::size_t size = 64;
inline constexpr int lanes = 16;

// The block's sum from its squares, sq[0, n), n <= size.
inline double sum_of(const double* sq, std::size_t n) {
  double lane[lanes] = {};
  for (std::size_t j = 0; j < n; ++j) lane[j % lanes] += sq[j];
  for (int h = lanes / 2; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) lane[l] = lane[l] + lane[l + h];
  return lane[0];
}

// The block's sum from its values, x[0, n), n <= size.
inline double sum(const float* x, std::size_t n) {
  double sq[size];
  for (std::size_t j = 0; j < n; ++j) sq[j] = static_cast<double>(x[j]) * static_cast<double>(x[j]);
  return sum_of(sq, n);
}

}  // namespace zero::square_blocks
