// optim::lamb: Adam's update scaled per tensor by a trust ratio ||w|| / ||update|| (You et al. 2020, "Large Batch
// Optimization for Deep Learning").
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/config.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/hyper_parameter.hpp"
#include "zero/core/value_checks.hpp"
#include "zero/error.hpp"
#include "zero/optim/adamw.hpp"

namespace zero::optim {

// LAMB (the paper's Algorithm 2, with Adam's bias correction and decoupled weight decay):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  r = m^ / (sqrt(v^) + eps) + wd w
//   w = w - lr phi(||w||) / ||r|| r,  phi(z) = min(max(z, phi_min), phi_max)
// with both norms over the whole tensor. Where phi(||w||) or ||r|| is 0 (a tensor of zeros, or one
// whose update is zero) the ratio is 1, as the reference implementations take it. A tensor-wise
// optimizer (concepts/optimizer_state.hpp): the engine runs the moments, then the norms (exact sums,
// combined over the ranks that hold the tensor), then the step.
struct lamb {
  static constexpr int slots = 2;
  static constexpr std::string_view name = "lamb";
  static constexpr std::array<std::string_view, slots> slot_names = {"m", "v"};  // first and second moments
  static constexpr int tensor_sums = 2;                                          // ||w||^2 and ||r||^2

  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f, weight_decay = 0.01f;
  float phi_min = 0.0f, phi_max = 10.0f;  // the clamp of ||w|| in the trust ratio

  static constexpr auto hyper_parameters() {
    return std::tuple{field("lr", &lamb::lr),
                      field("beta1", &lamb::beta1),
                      field("beta2", &lamb::beta2),
                      field("eps", &lamb::eps),
                      field("weight_decay", &lamb::weight_decay),
                      field("phi_min", &lamb::phi_min),
                      field("phi_max", &lamb::phi_max)};
  }

  // AdamW's constants (its moments and direction are LAMB's), and the clamp.
  struct step_constants {
    adamw::step_constants adam;
    float phi_min, phi_max;
  };

  step_constants constants(std::uint64_t t) const {
    return {adamw{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay}.constants(t),
            phi_min, phi_max};
  }

  // AdamW's ranges, and a clamp whose upper end is positive and not below its lower one.
  void validate() const {
    detail::require_non_negative("optim::lamb", "lr", lr);
    detail::require_unit_interval("optim::lamb", "beta1", beta1);
    detail::require_unit_interval("optim::lamb", "beta2", beta2);
    detail::require_positive("optim::lamb", "eps", eps);
    detail::require_non_negative("optim::lamb", "weight_decay", weight_decay);
    detail::require_non_negative("optim::lamb", "phi_min", phi_min);
    detail::require_positive("optim::lamb", "phi_max", phi_max);
    ZERO_CHECK(phi_min <= phi_max, invalid_argument, "optim::lamb: phi_min ", detail::show(phi_min),
               " is above phi_max ", detail::show(phi_max), " (the trust ratio's clamp of ||w||)");
  }

  // The moments from the gradient (the weight is not needed, nor changed), as AdamW's.
  template <class V>
  ZERO_HD_INLINE static void advance(const step_constants& c, const V&, std::type_identity_t<V> g, V* s) {
    adamw::advance_moments<V>(c.adam, g, s);
  }
  // r = m^ / (sqrt(v^) + eps) + wd w: AdamW's direction, before the trust ratio.
  template <class V>
  ZERO_HD_INLINE static V direction(const step_constants& c, const V& w, const V* s) {
    return adamw::direction<V>(c.adam, w, s);
  }
  template <class V>
  ZERO_HD_INLINE static void norm_terms(const step_constants& c, const V& w, const V* s, V* x) {
    x[weight_term] = w;
    x[direction_term] = direction(c, w, s);
  }
  // Which term is the weight (concepts/optimizer_state.hpp: TensorwiseWeightTerm).
  static constexpr int weight_term = 0;
  // phi(||w||) / ||r||, in double from the exact sums, rounded once; 1 where either is 0. A sum that is
  // not finite (a NaN or infinite weight or update) gives NaN: the tensor's weights become NaN, as an
  // element-wise rule's would.
  static float tensor_factor(const step_constants& c, const double* sq) {
    if (!std::isfinite(sq[0]) || !std::isfinite(sq[1])) return std::numeric_limits<float>::quiet_NaN();
    const double w_norm = std::sqrt(sq[0]), r_norm = std::sqrt(sq[1]);
    const double phi = std::fmin(std::fmax(w_norm, static_cast<double>(c.phi_min)), static_cast<double>(c.phi_max));
    if (phi == 0.0 || r_norm == 0.0) return 1.0f;
    return static_cast<float>(phi / r_norm);
  }
  // w = w - (lr f) r.
  template <class V>
  ZERO_HD_INLINE static void apply(const step_constants& c, float f, V& w, const V* s) {
    apply_direction(c, f, w, direction(c, w, s));
  }
  // The same from r kept by the first pass (concepts/optimizer_state.hpp: TensorwiseDirection).
  static constexpr int direction_term = 1;
  template <class V>
  ZERO_HD_INLINE static void apply_direction(const step_constants& c, float f, V& w, const V& r) {
    using namespace zero::fp;
    w = sub(w, mul(fp::mul(c.adam.lr, f), r));
  }
};
static_assert(TensorwiseDirection<lamb> && TensorwiseWeightTerm<lamb>);

}  // namespace zero::optim
