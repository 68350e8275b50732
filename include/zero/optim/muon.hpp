// optim::muon: momentum orthogonalized per weight matrix by Newton-Schulz (Jordan et al. 2024, "Muon: An optimizer for
// hidden layers in neural networks"), AdamW for every other tensor.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/config.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/hyper_parameter.hpp"
#include "zero/core/value_checks.hpp"
#include "zero/optim/adamw.hpp"
#include "zero/optim/newton_schulz.hpp"

namespace zero::optim {

// For a matrix, a tensor of shape (rows, cols) (or each matrix of a stack, shape (..., rows, cols)):
//   m = mu m + (1 - mu) g;   u = (1 - mu) g + mu m  (Nesterov; u = m without)
//   O = NewtonSchulz5(u);    w = (1 - lr wd) w - lr sqrt(max(1, rows / cols)) O
// the reference implementation's update and scale. Every other tensor (1-D gains and biases, and the
// tensors of a parameter group with element_wise set: embeddings, the output head) takes AdamW with
// lr x adamw_lr_scale and the same weight decay (a group's override applies to both rules).
// A matrix optimizer (concepts/optimizer_state.hpp): the engine advances the slots, brings each
// matrix's u together on one rank, orthogonalizes it there and hands each rank its part of O.
// Slots: m (the momentum; AdamW's first moment), v (AdamW's second moment; for a matrix, the step's u,
// which Muon keeps no second moment in).
struct muon {
  static constexpr int slots = 2;
  static constexpr std::string_view name = "muon";
  static constexpr std::array<std::string_view, slots> slot_names = {"m", "v"};
  static constexpr int matrix_slot = 1;  // the slot that carries a matrix's u
  using workspace = newton_schulz::workspace;

  float lr = 0.02f, momentum = 0.95f, weight_decay = 0.0f;
  bool nesterov = true;
  // The element-wise tensors' AdamW: its lr is lr x adamw_lr_scale (one fp32 multiplication, so a schedule
  // scales both rules alike), with these moments.
  float adamw_lr_scale = 0.15f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;

  static constexpr auto hyper_parameters() {
    return std::tuple{field("lr", &muon::lr),
                      field("momentum", &muon::momentum),
                      field("weight_decay", &muon::weight_decay),
                      field("nesterov", &muon::nesterov),
                      field("adamw_lr_scale", &muon::adamw_lr_scale),
                      field("beta1", &muon::beta1),
                      field("beta2", &muon::beta2),
                      field("eps", &muon::eps)};
  }

  struct step_constants {
    adamw::step_constants adam;  // the element-wise tensors' rule
    float lr, momentum, one_minus_momentum;
    float decay;  // 1 - lr wd, one rounding of each operation
    bool nesterov;
  };

  step_constants constants(std::uint64_t t) const {
    const adamw a{
        .lr = fp::mul(lr, adamw_lr_scale), .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay};
    return {a.constants(t), lr, momentum, 1.0f - momentum, fp::sub(1.0f, fp::mul(lr, weight_decay)), nesterov};
  }

  void validate() const {
    detail::require_non_negative("optim::muon", "lr", lr);
    detail::require_unit_interval("optim::muon", "momentum", momentum);
    detail::require_non_negative("optim::muon", "weight_decay", weight_decay);
    detail::require_non_negative("optim::muon", "adamw_lr_scale", adamw_lr_scale);
    detail::require_unit_interval("optim::muon", "beta1", beta1);
    detail::require_unit_interval("optim::muon", "beta2", beta2);
    detail::require_positive("optim::muon", "eps", eps);
  }

  // The element-wise tensors: AdamW.
  template <class V>
  ZERO_HD_INLINE static void update(const step_constants& c, V& w, std::type_identity_t<V> g, V* s) {
    adamw::update<V>(c.adam, w, g, s);
  }

  // A matrix's first pass: the momentum from the gradient, and u into the matrix slot.
  template <class V>
  ZERO_HD static void advance(const step_constants& c, const V&, std::type_identity_t<V> g, V* s) {
    using namespace zero::fp;
    s[0] = add(mul(c.momentum, s[0]), mul(c.one_minus_momentum, g));
    s[matrix_slot] = c.nesterov ? add(mul(c.one_minus_momentum, g), mul(c.momentum, s[0])) : s[0];
  }
  // The matrix's u (rows x cols, the whole matrix, on its owner rank) replaced by its orthogonalization,
  // with the system's fixed-order products.
  template <class Products>
  static void orthogonalize(float* u, std::size_t rows, std::size_t cols, workspace& w, const Products& products) {
    newton_schulz::orthogonalize(u, rows, cols, w, products);
  }
  // The factor of a matrix's step: lr sqrt(max(1, rows / cols)), the scale in double and rounded once.
  static float matrix_factor(const step_constants& c, std::size_t rows, std::size_t cols) {
    const double ratio = static_cast<double>(rows) / static_cast<double>(cols);
    return fp::mul(c.lr, static_cast<float>(std::sqrt(ratio > 1.0 ? ratio : 1.0)));
  }
  // The last pass: w = (1 - lr wd) w - f O, where s[matrix_slot] is O (the engine passes it there).
  template <class V>
  ZERO_HD static void apply(const step_constants& c, float f, V& w, const V* s) {
    using namespace zero::fp;
    w = sub(mul(c.decay, w), mul(f, s[matrix_slot]));
  }
};
static_assert(MatrixOptimizer<muon>);

}  // namespace zero::optim
