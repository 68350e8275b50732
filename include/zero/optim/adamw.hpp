// optim::adamw: Adam with bias correction and decoupled weight decay (Loshchilov & Hutter).
#pragma once

#include <array>
#include <cmath>
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

struct adamw {
  static constexpr int slots = 2;
  static constexpr std::string_view name = "adamw";
  static constexpr std::array<std::string_view, slots> slot_names = {"m", "v"};  // first and second moments

  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;

  static constexpr auto hyper_parameters() {
    return std::tuple{field("lr", &adamw::lr), field("beta1", &adamw::beta1), field("beta2", &adamw::beta2),
                      field("eps", &adamw::eps), field("weight_decay", &adamw::weight_decay)};
  }

  struct step_constants {
    float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay;
    float bias_correction1, bias_correction2;  // 1 - beta^t, computed in double once per step
  };

  step_constants constants(std::uint64_t t) const {
    const double td = static_cast<double>(t);
    return {lr,
            beta1,
            1.0f - beta1,
            beta2,
            1.0f - beta2,
            eps,
            weight_decay,
            static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), td)),
            static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), td))};
  }

  // Called by the engine at construction. lr 0 is allowed (a schedule may hold the weights still
  // for some steps; the moments still advance). A beta of 1 makes the bias correction 1 - beta^t
  // zero, a division by zero; eps 0 divides by zero where a gradient has been 0 so far.
  void validate() const {
    detail::require_non_negative("optim::adamw", "lr", lr);
    detail::require_unit_interval("optim::adamw", "beta1", beta1);
    detail::require_unit_interval("optim::adamw", "beta2", beta2);
    detail::require_positive("optim::adamw", "eps", eps);
    detail::require_non_negative("optim::adamw", "weight_decay", weight_decay);
  }

  // w <- w - lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)
  // Written over a value type V: float, or a simd::pack of floats in the host loop (same IEEE
  // operations lane by lane, found unqualified; core/elementwise.hpp).
  template <class V>
  ZERO_HD_INLINE static void update(const step_constants& c, V& w, std::type_identity_t<V> g, V* s) {
    using namespace zero::fp;
    advance_moments<V>(c, g, s);
    w = sub(w, mul(c.lr, direction<V>(c, w, s)));
  }
  // The two halves of the update, which optim::lamb shares: the moments from the gradient, and the
  // step's direction m_hat / (sqrt(v_hat) + eps) + wd * w from the advanced moments.
  template <class V>
  ZERO_HD_INLINE static void advance_moments(const step_constants& c, std::type_identity_t<V> g, V* s) {
    using namespace zero::fp;
    s[0] = add(mul(c.beta1, s[0]), mul(c.one_minus_beta1, g));
    s[1] = add(mul(c.beta2, s[1]), mul(c.one_minus_beta2, mul(g, g)));
  }
  template <class V>
  ZERO_HD_INLINE static V direction(const step_constants& c, const V& w, const V* s) {
    using namespace zero::fp;
    const V m_hat = div(s[0], c.bias_correction1);
    const V v_hat = div(s[1], c.bias_correction2);
    return add(div(m_hat, add(sqrt(v_hat), c.eps)), mul(c.weight_decay, w));
  }
};
static_assert(OptimizerState<adamw>);

}  // namespace zero::optim
