// optim::adamw_bf16: AdamW whose two moments are kept as bf16 in one 32-bit slot, stochastically rounded (K = 8 bytes,
// not 12).
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
#include "zero/core/stochastic_rounding.hpp"
#include "zero/core/value_checks.hpp"
#include "zero/optim/adamw.hpp"

namespace zero::optim {

// The step is AdamW's, in fp32, from the moments widened from bf16; the new moments are then rounded
// to bf16 stochastically (core/stochastic_rounding.hpp), with random bits hashed from the element's
// weight before the step, the new moments and the step number. So the rounding is unbiased (a moment
// that changes by less than half a bf16 ulp per step still moves, on average, at the right rate) and
// is a function of the element's values and the step only: every rank, stage, world size and system
// rounds it the same way, and the engine's results stay bit-identical across them.
//
// The slot "m_v_bf16" holds m's bf16 in its upper 16 bits and v's in its lower 16 (read as a float it
// is m to bf16 precision); a non-finite m makes it the canonical NaN. Per parameter the model states
// are the fp32 master weight and this one slot: K = 8 bytes against AdamW's 12, so the optimizer's
// share of a rank's memory falls by a third.
struct adamw_bf16 {
  static constexpr int slots = 1;
  static constexpr std::string_view name = "adamw_bf16";
  static constexpr std::array<std::string_view, slots> slot_names = {"m_v_bf16"};

  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;

  static constexpr auto hyper_parameters() {
    return std::tuple{field("lr", &adamw_bf16::lr), field("beta1", &adamw_bf16::beta1),
                      field("beta2", &adamw_bf16::beta2), field("eps", &adamw_bf16::eps),
                      field("weight_decay", &adamw_bf16::weight_decay)};
  }

  struct step_constants {
    adamw::step_constants adam;
    std::uint32_t key;  // stochastic::step_key(t)
  };

  step_constants constants(std::uint64_t t) const {
    return {adamw{lr, beta1, beta2, eps, weight_decay}.constants(t), stochastic::step_key(t)};
  }

  // AdamW's ranges, named for this optimizer.
  void validate() const {
    detail::require_non_negative("optim::adamw_bf16", "lr", lr);
    detail::require_unit_interval("optim::adamw_bf16", "beta1", beta1);
    detail::require_unit_interval("optim::adamw_bf16", "beta2", beta2);
    detail::require_positive("optim::adamw_bf16", "eps", eps);
    detail::require_non_negative("optim::adamw_bf16", "weight_decay", weight_decay);
  }

  // m, v <- the slot; AdamW's moments and step in fp32; the slot <- m, v rounded to bf16.
  template <class V>
  ZERO_HD_INLINE static void update(const step_constants& c, V& w, std::type_identity_t<V> g, V* s) {
    using namespace zero::fp;
    V mv[2];
    stochastic::unpack_pair(s[0], mv[0], mv[1]);
    adamw::advance_moments<V>(c.adam, g, mv);
    const V before = w;
    w = sub(w, mul(c.adam.lr, adamw::direction<V>(c.adam, w, mv)));
    typename stochastic::bits_of<V>::type random;
    stochastic::hash(before, mv[0], mv[1], c.key, random);
    s[0] = stochastic::pack_pair(mv[0], mv[1], random);
  }
};
static_assert(OptimizerState<adamw_bf16>);

}  // namespace zero::optim
