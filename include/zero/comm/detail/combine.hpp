// comm::detail::combine: acc op= x over a range, the rank-ordered step of the host backends' reductions.
#pragma once

#include <algorithm>
#include <cstddef>

#include "zero/core/reduce_op.hpp"

namespace zero::comm::detail {

template <class T>
void combine(T* acc, const T* x, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
}

// acc = a op b: the first step of a reduction, fused with the copy of the first input.
template <class T>
void combine_pair(T* acc, const T* a, const T* b, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] = a[i] + b[i];
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(a[i], b[i]);
}

template <class A, class T>
void combine_widened(A* acc, const T* x, std::size_t n, reduce_op op) {
  if (op == reduce_op::sum)
    for (std::size_t i = 0; i < n; ++i) acc[i] += static_cast<A>(x[i]);
  else
    for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], static_cast<A>(x[i]));
}

}  // namespace zero::comm::detail
