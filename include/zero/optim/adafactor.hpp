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
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/config.hpp"
#include "zero/core/elementwise.hpp"
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
// The sums are taken in double over each tensor's elements in an order its size fixes (sum_of_squares)
// and rounded once, so the result depends on the tensor's values only: the same bits at every stage, N
// and thread count.
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
  // state (tensor_state_size values, zero before the first step), with the host system's loop (`sys`:
  // sys::host, or the engine's host system).
  template <class System>
  static void update_tensor(const System& sys, const step_constants& c, std::span<const std::size_t> shape,
                            const float* g, float* w, float* state) {
    std::size_t numel = 1;
    for (std::size_t x : shape) numel *= x;
    if (numel == 0) return;
    const double squares = sum_of_squares(w, numel);
    const double alpha = std::max(static_cast<double>(c.eps2), std::sqrt(squares / static_cast<double>(numel))) * c.rho;
    // The statistics advance; then the update U from them, in index order: its RMS, then the weights.
    if (factored(shape))
      advance_factored(c, shape, g, state);
    else
      for (std::size_t i = 0; i < numel; ++i) state[i] = lerp(state[i], fp::mul(g[i], g[i]), c.beta);
    // U computed once (a square root and a division per element: what the step costs), kept for the
    // weights' pass.
    thread_local std::vector<float> us;
    us.resize(numel);
    compute_u(sys, c, shape, g, state, us.data());
    const double u_squares = sum_of_squares(us.data(), numel);
    const double denominator = std::max(1.0, std::sqrt(u_squares / static_cast<double>(numel)) / c.d);
    const auto f = static_cast<float>(alpha / denominator);
    for (std::size_t i = 0; i < numel; ++i) w[i] = fp::canonical(fp::sub(fp::mul(c.decay, w[i]), fp::mul(f, us[i])));
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
  // The squares of x[0..n) summed in double in a fixed order: element i into lane i mod 8 (each lane in
  // ascending order), then the lanes added pairwise (0 + 4, 1 + 5, ...; then 0 + 2, 1 + 3; then 0 + 1).
  // Eight independent sums, so the additions overlap; the order depends on n alone.
  static double sum_of_squares(const float* x, std::size_t n) {
    double lane[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (std::size_t l = 0; l < 8; ++l) lane[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
    for (std::size_t l = 0; i < n; ++i, ++l) lane[l] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    for (std::size_t h = 4; h >= 1; h /= 2)
      for (std::size_t l = 0; l < h; ++l) lane[l] += lane[l + h];
    return lane[0];
  }
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
        const double sum = sum_of_squares(m + i * cols, cols);
        r[i] = lerp(r[i], static_cast<float>(sum / static_cast<double>(cols)), c.beta);
      }
      // Each column's sum over the rows in ascending order, taken row by row (in memory order).
      thread_local std::vector<double> sums;
      sums.assign(cols, 0.0);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) sums[j] += static_cast<double>(m[i * cols + j]) * m[i * cols + j];
      for (std::size_t j = 0; j < cols; ++j)
        col[j] = lerp(col[j], static_cast<float>(sums[j] / static_cast<double>(rows)), c.beta);
    }
  }
  // U of one run of elements: u = g / sqrt(max(v, floor)) with v = r c / mean (a factored row: r and mean
  // scalars, c the column statistics) or v the element's own statistic (mean = 0: v = c). A rule of the
  // host loop (core/elementwise.hpp): on packs where the CPU has them, each operation correctly rounded,
  // so the bits are the scalar loop's.
  struct u_rule {
    float r, mean, floor;
    template <class V>
    ZERO_HD void apply(std::size_t j, float* u, const float* g, const float* c) const {
      using namespace zero::fp;
      using elementwise::load;
      using elementwise::store;
      V v = load<V>(c, j);
      if (mean != 0.0f) v = div(mul(V(r), v), V(mean));
      v = select(v < V(floor), V(floor), v);
      store(u, j, mul(load<V>(g, j), div(V(1.0f), sqrt(v))));
    }
    ZERO_HD void operator()(std::size_t j, float* u, const float* g, const float* c) const { apply<float>(j, u, g, c); }
  };
  // U for every element into u, from the advanced statistics, on the system's loop.
  template <class System>
  static void compute_u(const System& sys, const step_constants& c, std::span<const std::size_t> shape,
                        const float* g, const float* state, float* u) {
    using elementwise::in;
    using elementwise::out;
    const float floor = c.eps1_squared;
    if (!factored(shape)) {
      std::size_t numel = 1;
      for (std::size_t x : shape) numel *= x;
      sys.for_each(numel, u_rule{1.0f, 0.0f, floor}, out(u), in(g), in(state));
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
        sys.for_each(cols, u_rule{r[i], mean, floor}, out(u + s * size + i * cols), in(g + s * size + i * cols),
                     in(col));
    }
  }
};

}  // namespace zero::optim
