// optim::sgd: stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay (as PyTorch).
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
#include "zero/error.hpp"

namespace zero::optim {

struct sgd {
  // The momentum buffer; kept even when momentum is 0 so the state size does not depend on a value.
  static constexpr int slots = 1;
  static constexpr std::string_view name = "sgd";
  static constexpr std::array<std::string_view, slots> slot_names = {"momentum"};

  float lr = 1e-2f, momentum = 0.9f, weight_decay = 0.0f;
  bool nesterov = false;

  static constexpr auto hyper_parameters() {
    return std::tuple{field("lr", &sgd::lr), field("momentum", &sgd::momentum),
                      field("weight_decay", &sgd::weight_decay), field("nesterov", &sgd::nesterov)};
  }

  struct step_constants {
    float lr, momentum, weight_decay;
    bool nesterov, first_step;  // PyTorch starts the buffer at the first gradient, not at mu*0 + g
  };

  step_constants constants(std::uint64_t t) const { return {lr, momentum, weight_decay, nesterov, t == 1}; }

  // Called by the engine at construction. lr 0 is allowed (a schedule may hold the weights still
  // for some steps; the momentum buffer still advances); momentum 1 or more would never decay.
  void validate() const {
    detail::require_non_negative("optim::sgd", "lr", lr);
    detail::require_unit_interval("optim::sgd", "momentum", momentum);
    detail::require_non_negative("optim::sgd", "weight_decay", weight_decay);
    // As PyTorch: Nesterov's look-ahead is the momentum term; without momentum it is a silent no-op.
    ZERO_CHECK(!nesterov || momentum > 0.0f, invalid_argument, "optim::sgd: nesterov needs momentum > 0, got momentum ",
               detail::show(momentum));
  }

  // g' = g + wd*w; buf = mu*buf + g' (buf = g' on the first step); d = nesterov ? g' + mu*buf : buf;
  // w <- w - lr*d. Over a value type V as optim::adamw's.
  template <class V>
  ZERO_HD static void update(const step_constants& c, V& w, std::type_identity_t<V> g, V* s) {
    using namespace zero::fp;
    const V gd = add(g, mul(c.weight_decay, w));
    const V buf = c.first_step ? gd : add(mul(c.momentum, s[0]), gd);
    s[0] = buf;
    const V d = c.nesterov ? add(gd, mul(c.momentum, buf)) : buf;
    w = sub(w, mul(c.lr, d));
  }
};
static_assert(OptimizerState<sgd>);

}  // namespace zero::optim
