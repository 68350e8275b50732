// optim::lion: the sign-of-momentum optimizer of Chen et al. 2023 ("Symbolic Discovery of Optimization Algorithms"), one slot.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/config.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/hyper_parameter.hpp"
#include "zero/core/value_checks.hpp"

namespace zero::optim {

// Lion keeps one momentum m and moves every weight by exactly lr (plus the decay) per step:
//   c = b1 m + (1 - b1) g;  w = w - lr (sign(c) + wd w);  m = b2 m + (1 - b2) g
// The step's size does not depend on the gradient's, so Lion's rates are some 3-10x smaller than
// AdamW's (the paper's advice; the default 1e-4 is its common choice) and its decay correspondingly
// larger. Half the state of AdamW: K = 4 bytes per parameter in fp32, 8 with a separate fp32 master.
struct lion {
  static constexpr int slots = 1;
  static constexpr std::string_view name = "lion";
  static constexpr std::array<std::string_view, slots> slot_names = {"m"};  // the momentum

  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.0f;

  static constexpr auto hyper_parameters() {
    return std::tuple{field("lr", &lion::lr), field("beta1", &lion::beta1), field("beta2", &lion::beta2),
                      field("weight_decay", &lion::weight_decay)};
  }

  struct step_constants {
    float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay;
  };

  step_constants constants(std::uint64_t) const {
    return {lr, beta1, 1.0f - beta1, beta2, 1.0f - beta2, weight_decay};
  }

  // Called by the engine at construction. lr 0 is allowed (the momentum still advances). A beta of
  // 1 would never let the gradient in (beta2: the momentum stays 0; beta1: the direction is the
  // old momentum only), so both are in [0, 1) as AdamW's.
  void validate() const {
    detail::require_non_negative("optim::lion", "lr", lr);
    detail::require_unit_interval("optim::lion", "beta1", beta1);
    detail::require_unit_interval("optim::lion", "beta2", beta2);
    detail::require_non_negative("optim::lion", "weight_decay", weight_decay);
  }

  // sign(0) is 0, as torch.sign: an element whose interpolated direction is exactly zero only decays.
  // A NaN stays NaN (the engine skips a step whose gradient norm is not finite, and canonicalizes).
  // Over a value type V as update (select: per lane on a pack).
  template <class V>
  ZERO_HD static V sign(V x) {
    using fp::select;
    return select(x > V(0.0f), V(1.0f), select(x < V(0.0f), V(-1.0f), x));
  }

  // w <- w - lr * (sign(b1 m + (1 - b1) g) + wd * w);  m <- b2 m + (1 - b2) g
  // Over a value type V as optim::adamw's.
  template <class V>
  ZERO_HD static void update(const step_constants& c, V& w, std::type_identity_t<V> g, V* s) {
    using namespace zero::fp;
    const V m = s[0];
    const V direction = add(mul(c.beta1, m), mul(c.one_minus_beta1, g));
    w = sub(w, mul(c.lr, add(sign(direction), mul(c.weight_decay, w))));
    s[0] = add(mul(c.beta2, m), mul(c.one_minus_beta2, g));
  }
};
static_assert(OptimizerState<lion>);

}  // namespace zero::optim
