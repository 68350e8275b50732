// A global batch of 12 samples split over the ranks, for engine tests whose bits must not depend on N: the initial
// values and one step of the protocol (suites of the optimizer kinds: Muon, Adafactor).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "zero/zero.hpp"

namespace testing {

inline void init_values(const zero::unit_spec&, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
  for (std::size_t j = 0; j < v.size(); ++j)
    v[j] = 0.1f * std::sin(0.37f * static_cast<float>(r.begin + j) + static_cast<float>(t.numel % 5));
}

// One step of a global batch of 12 samples, rank r of N taking samples [12 r / N, 12 (r + 1) / N)
// (micro_batches = 12 / N), so that the reproducible mode sums the same gradients at every N.
template <class E>
zero::step_report global_step(E& e, int rank, int step) {
  const int per_rank = e.options().micro_batches;
  for (int m = 0; m < per_rank; ++m) {
    const int sample = rank * per_rank + m;
    for (std::size_t u = e.spec().units().size(); u-- > 0;) {
      const zero::unit_id id{u};
      auto w = e.gather(id);
      auto g = e.grads(id);
      for (std::size_t j = 0; j < e.layout().unit(id).numel; ++j) {
        const float x = static_cast<float>(w.view().data()[j]);
        g.view().data()[j] = static_cast<typename E::grad_type>(
            std::cos(2.0f * x + 0.03f * static_cast<float>(j) + static_cast<float>(step + sample)));
      }
      e.reduce(id);
    }
  }
  return e.step();
}

}  // namespace testing
