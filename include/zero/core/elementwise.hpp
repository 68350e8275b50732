// The element-wise steps of the engine, written once (ZERO_HD) for every system: host loops and device kernels call these.
#pragma once

#include <cstddef>

#include "zero/config.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/numeric.hpp"

namespace zero::elementwise {

// Element j of the optimizer step: the averaged, unscaled (and clipped) gradient, the rule, and
// the cast of the master weight into a separate parameter copy (p == nullptr: the master is the
// parameter). The gradient is divided by N x loss scale in one IEEE division. Every value stored is
// NaN-canonical (store_as), so a step that produces a NaN stores the same bits on every system.
template <class Opt, class G, class P>
ZERO_HD inline void update(const typename Opt::step_constants& c, const G* g, float divisor, float coef, float* w,
                           float* const* slots, P* p, std::size_t j) {
  float gj = fp::div(static_cast<float>(g[j]), divisor);
  if (coef != 1.0f) gj = fp::mul(gj, coef);
  float s[Opt::slots > 0 ? Opt::slots : 1];
  for (int k = 0; k < Opt::slots; ++k) s[k] = slots[k][j];
  float wj = w[j];
  Opt::update(c, wj, gj, s);
  wj = fp::canonical(wj);
  w[j] = wj;
  for (int k = 0; k < Opt::slots; ++k) slots[k][j] = fp::canonical(s[k]);
  if (p) p[j] = store_as<P>(wj);
}

// Element j of gradient accumulation: the first micro-batch is stored (a copy: 0 + (-0) would turn a
// negative zero positive), later ones added in fp32 and rounded once to the store's type.
template <class D, class S>
ZERO_HD inline void accumulate(D* dst, const S* src, bool first, std::size_t j) {
  dst[j] = first ? store_as<D>(static_cast<float>(src[j]))
                 : store_as<D>(fp::add(static_cast<float>(dst[j]), static_cast<float>(src[j])));
}

// Element j of a cast from fp32 (master weights into a parameter copy after a checkpoint load).
template <class D>
ZERO_HD inline void cast(D* dst, const float* src, std::size_t j) {
  dst[j] = store_as<D>(src[j]);
}

// The square of element j of the averaged, unscaled gradient, in double.
template <class G>
ZERO_HD inline double square(const G* g, float divisor, std::size_t j) {
  const double x = fp::div(static_cast<float>(g[j]), divisor);
  return x * x;
}

}  // namespace zero::elementwise
