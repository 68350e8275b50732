// optim::adafactor: Adafactor's factored second moment (Shazeer & Stern 2018), in the form of torch.optim.Adafactor: row and column statistics per weight matrix instead of a moment per element.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/hyper_parameter.hpp"
#include "zero/core/value_checks.hpp"

namespace zero::optim {

// At step t (1-based), for a tensor W with gradient G (torch.optim.Adafactor's update, maximize off):
//   beta = t^beta2_decay (one minus the second moment's decay: 1 at t = 1);  rho = min(lr, 1 / sqrt(t))
//   alpha = max(eps2, RMS(W)) rho                                 (W before this step)
//   W = (1 - lr wd) W
//   a matrix (shape (..., rows, cols), each matrix of a stack with its own statistics):
//     R = lerp(R, mean over cols of G^2, beta);  C = lerp(C, mean over rows of G^2, beta)
//     V = R C^T / max(mean(R), eps1)
//   any other tensor:  V = lerp(V, G^2, beta)
//   U = G / sqrt(max(V, eps1^2));  W = W - alpha / max(1, RMS(U) / d) U
// where RMS is over the whole tensor and lerp(a, b, w) is torch's (a + w (b - a) for w < 0.5, else
// b - (b - a)(1 - w)). The state is per tensor: rows + cols values per matrix (a stack's matrices one
// after the other, R then C for each), numel values for any other tensor; no per-element slot.
//
// Its update needs each tensor whole (the means, the RMS): it is a whole-tensor optimizer
// (kinds/whole_tensor_sweep.hpp), which an engine runs through that kind: include
// "zero/kinds/whole_tensor_sweep.hpp" (zero/zero.hpp does) before the engine is instantiated.
// The sums are taken in double over each tensor's elements in index order and rounded once, so the
// result depends on the tensor's values only: the same bits at every stage, N and thread count.
struct adafactor {
  static constexpr int slots = 0;
  static constexpr std::string_view name = "adafactor";
  static constexpr std::array<std::string_view, slots> slot_names = {};

  // torch.optim.Adafactor's defaults; eps1's None there is float32's machine epsilon.
  float lr = 1e-2f, beta2_decay = -0.8f, eps1 = 1.1920929e-07f, eps2 = 1e-3f, d = 1.0f, weight_decay = 0.0f;

  static constexpr auto hyper_parameters() {
    return std::tuple{field("lr", &adafactor::lr),     field("beta2_decay", &adafactor::beta2_decay),
                      field("eps1", &adafactor::eps1), field("eps2", &adafactor::eps2),
                      field("d", &adafactor::d),       field("weight_decay", &adafactor::weight_decay)};
  }

  struct step_constants {
    float beta;   // t^beta2_decay, the statistics' interpolation weight
    double rho;   // min(lr, 1 / sqrt(t))
    float eps1, eps1_squared, eps2, d;
    float decay;  // 1 - lr wd
  };

  step_constants constants(std::uint64_t t) const {
    const double step = static_cast<double>(t);
    return {static_cast<float>(std::pow(step, static_cast<double>(beta2_decay))),
            std::min(static_cast<double>(lr), 1.0 / std::sqrt(step)),
            eps1,
            fp::mul(eps1, eps1),
            eps2,
            d,
            fp::sub(1.0f, fp::mul(lr, weight_decay))};
  }

  void validate() const {
    detail::require_non_negative("optim::adafactor", "lr", lr);
    if (!(std::isfinite(beta2_decay) && beta2_decay <= 0.0f))
      detail::bad_value("optim::adafactor", "beta2_decay", "finite and <= 0", beta2_decay);
    detail::require_non_negative("optim::adafactor", "eps1", eps1);
    detail::require_non_negative("optim::adafactor", "eps2", eps2);
    detail::require_positive("optim::adafactor", "d", d);
    detail::require_non_negative("optim::adafactor", "weight_decay", weight_decay);
  }

  // Whether a tensor of this shape takes the factored statistics: two or more dimensions.
  static bool factored(std::span<const std::size_t> shape) { return shape.size() >= 2; }
  // The state values of a tensor of this shape.
  static std::size_t tensor_state_size(std::span<const std::size_t> shape) {
    std::size_t numel = 1;
    for (std::size_t x : shape) numel *= x;
    if (!factored(shape) || numel == 0) return numel;
    const std::size_t rows = shape[shape.size() - 2], cols = shape.back();
    return numel / (rows * cols) * (rows + cols);
  }

  // One step of a whole tensor: its weights w (updated in place) from its averaged gradient g and its
  // state (tensor_state_size values, zero before the first step).
  static void update_tensor(const step_constants& c, std::span<const std::size_t> shape, const float* g, float* w,
                            float* state) {
    std::size_t numel = 1;
    for (std::size_t x : shape) numel *= x;
    if (numel == 0) return;
    double squares = 0.0;
    for (std::size_t i = 0; i < numel; ++i) squares += static_cast<double>(w[i]) * static_cast<double>(w[i]);
    const double alpha = std::max(static_cast<double>(c.eps2), std::sqrt(squares / static_cast<double>(numel))) * c.rho;
    // The statistics advance; then the update U, from them, twice in index order by the same
    // operations: for its RMS, then for the weights.
    if (factored(shape))
      advance_factored(c, shape, g, state);
    else
      for (std::size_t i = 0; i < numel; ++i) state[i] = lerp(state[i], fp::mul(g[i], g[i]), c.beta);
    double u_squares = 0.0;
    for_each_u(c, shape, g, state, [&](std::size_t, float u) { u_squares += static_cast<double>(u) * u; });
    const double denominator = std::max(1.0, std::sqrt(u_squares / static_cast<double>(numel)) / c.d);
    const auto f = static_cast<float>(alpha / denominator);
    for_each_u(c, shape, g, state, [&](std::size_t i, float u) {
      w[i] = fp::canonical(fp::sub(fp::mul(c.decay, w[i]), fp::mul(f, u)));
    });
  }

  // The element-wise rule the concept names: Adafactor has none (its update needs whole tensors), so
  // instantiating it is a compile-time error that says what to include.
  template <class V>
  static void update(const step_constants&, V&, std::type_identity_t<V>, V*) {
    static_assert(sizeof(V) == 0,
                  "optim::adafactor updates whole tensors: include zero/kinds/whole_tensor_sweep.hpp (zero/zero.hpp "
                  "does) before the engine is instantiated, and run it on a host system");
  }

 private:
  // torch.lerp's formula.
  static float lerp(float a, float b, float w) {
    return w < 0.5f ? fp::add(a, fp::mul(w, fp::sub(b, a))) : fp::sub(b, fp::mul(fp::sub(b, a), fp::sub(1.0f, w)));
  }
  // Each matrix's R and C advanced from its rows' and columns' mean squares.
  static void advance_factored(const step_constants& c, std::span<const std::size_t> shape, const float* g,
                               float* state) {
    const std::size_t rows = shape[shape.size() - 2], cols = shape.back(), size = rows * cols;
    std::size_t stacks = 1;
    for (std::size_t k = 0; k + 2 < shape.size(); ++k) stacks *= shape[k];
    for (std::size_t s = 0; s < stacks; ++s) {
      const float* m = g + s * size;
      float* r = state + s * (rows + cols);
      float* col = r + rows;
      for (std::size_t i = 0; i < rows; ++i) {
        double sum = 0.0;
        for (std::size_t j = 0; j < cols; ++j) sum += static_cast<double>(m[i * cols + j]) * m[i * cols + j];
        r[i] = lerp(r[i], static_cast<float>(sum / static_cast<double>(cols)), c.beta);
      }
      for (std::size_t j = 0; j < cols; ++j) {
        double sum = 0.0;
        for (std::size_t i = 0; i < rows; ++i) sum += static_cast<double>(m[i * cols + j]) * m[i * cols + j];
        col[j] = lerp(col[j], static_cast<float>(sum / static_cast<double>(rows)), c.beta);
      }
    }
  }
  // Calls use(i, U_i) for every element in index order, from the advanced statistics.
  template <class Use>
  static void for_each_u(const step_constants& c, std::span<const std::size_t> shape, const float* g,
                         const float* state, Use&& use) {
    const auto u_of = [&](float gi, float v) {
      return fp::mul(gi, fp::div(1.0f, fp::sqrt(std::max(v, c.eps1_squared))));
    };
    if (!factored(shape)) {
      std::size_t numel = 1;
      for (std::size_t x : shape) numel *= x;
      for (std::size_t i = 0; i < numel; ++i) use(i, u_of(g[i], state[i]));
      return;
    }
    const std::size_t rows = shape[shape.size() - 2], cols = shape.back(), size = rows * cols;
    std::size_t stacks = 1;
    for (std::size_t k = 0; k + 2 < shape.size(); ++k) stacks *= shape[k];
    for (std::size_t s = 0; s < stacks; ++s) {
      const float* r = state + s * (rows + cols);
      const float* col = r + rows;
      double sum = 0.0;
      for (std::size_t i = 0; i < rows; ++i) sum += r[i];
      const float mean = std::max(static_cast<float>(sum / static_cast<double>(rows)), c.eps1);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) {
          const std::size_t at = s * size + i * cols + j;
          use(at, u_of(g[at], fp::div(fp::mul(r[i], col[j]), mean)));
        }
    }
  }
};

}  // namespace zero::optim
