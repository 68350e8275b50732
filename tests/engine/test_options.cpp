// Optimizer hyper-parameters and engine options out of range are refused by a zero::error naming field and range.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

#include "../toy_model.hpp"

namespace {

constexpr float infinity = std::numeric_limits<float>::infinity();
constexpr float not_a_number = std::numeric_limits<float>::quiet_NaN();

template <class Opt>
std::string validate_message(const Opt& o) {
  try {
    o.validate();
  } catch (const zero::error& e) {
    CHECK(e.kind() == zero::error_kind::invalid_argument);
    return e.what();
  }
  return "(accepted)";
}

// Builds one stage-3 engine on one rank; returns the error message, or "(accepted)".
template <class Opt, class Prec = zero::precision::fp32>
std::string engine_message(const Opt& opt, const zero::engine_options& options = {}) {
  try {
    zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
      zero::engine<zero::stage3, zero::comm::threads, Opt, Prec> e(comm, toy::spec(), opt, options);
    });
  } catch (const zero::error& e) {
    CHECK(e.kind() == zero::error_kind::invalid_argument);
    return e.what();
  }
  return "(accepted)";
}

// An optimizer of the user's own, without validate(): still an OptimizerState, still usable.
struct plain_sgd {
  static constexpr int slots = 0;
  static constexpr std::string_view name = "plain_sgd";
  static constexpr std::array<std::string_view, slots> slot_names = {};
  float lr = -1.0f;  // nonsense, but nobody checks it: the optimizer has no validate()
  static constexpr auto hyper_parameters() { return std::tuple{zero::field("lr", &plain_sgd::lr)}; }
  struct step_constants {
    float lr;
  };
  step_constants constants(std::uint64_t) const { return {lr}; }
  ZERO_HD static void update(const step_constants& c, float& w, float g, float*) {
    w = zero::fp::sub(w, zero::fp::mul(c.lr, g));
  }
};
static_assert(zero::OptimizerState<plain_sgd>);

// One with its own validate(): the engine calls it.
struct picky_sgd : plain_sgd {
  void validate() const { ZERO_CHECK(lr >= 0.0f, invalid_argument, "picky_sgd: lr must be >= 0, got ", lr); }
};
static_assert(zero::OptimizerState<picky_sgd>);

}  // namespace

TEST_CASE("optim::sgd: lr, momentum, weight decay and Nesterov are checked") {
  using sgd = zero::optim::sgd;
  CHECK(validate_message(sgd{}) == "(accepted)");
  CHECK(validate_message(sgd{.lr = 0.0f}) == "(accepted)");  // lr 0 holds the weights still (schedules)
  CHECK(validate_message(sgd{.momentum = 0.0f}) == "(accepted)");
  CHECK(validate_message(sgd{.lr = infinity}) == "optim::sgd: lr must be finite and >= 0, got inf");
  CHECK(validate_message(sgd{.lr = not_a_number}) == "optim::sgd: lr must be finite and >= 0, got nan");
  CHECK(validate_message(sgd{.lr = -1e-3f}) == "optim::sgd: lr must be finite and >= 0, got -0.001");
  CHECK(validate_message(sgd{.momentum = 1.0f}) == "optim::sgd: momentum must be in [0, 1), got 1");
  CHECK(validate_message(sgd{.momentum = -0.5f}) == "optim::sgd: momentum must be in [0, 1), got -0.5");
  CHECK(validate_message(sgd{.momentum = not_a_number}) == "optim::sgd: momentum must be in [0, 1), got nan");
  CHECK(validate_message(sgd{.weight_decay = -1.0f}) == "optim::sgd: weight_decay must be finite and >= 0, got -1");
  CHECK(validate_message(sgd{.weight_decay = infinity}) == "optim::sgd: weight_decay must be finite and >= 0, got inf");
  CHECK(validate_message(sgd{.momentum = 0.0f, .nesterov = true}) ==
        "optim::sgd: nesterov needs momentum > 0, got momentum 0");
  CHECK(validate_message(sgd{.momentum = 0.5f, .nesterov = true}) == "(accepted)");
}

TEST_CASE("optim::adamw: lr, betas, eps and weight decay are checked") {
  using adamw = zero::optim::adamw;
  CHECK(validate_message(adamw{}) == "(accepted)");
  CHECK(validate_message(adamw{.lr = 0.0f}) == "(accepted)");
  CHECK(validate_message(adamw{.beta1 = 0.0f, .beta2 = 0.0f}) == "(accepted)");
  CHECK(validate_message(adamw{.lr = infinity}) == "optim::adamw: lr must be finite and >= 0, got inf");
  CHECK(validate_message(adamw{.lr = not_a_number}) == "optim::adamw: lr must be finite and >= 0, got nan");
  // beta = 1 makes the bias correction 1 - beta^t zero: a division by zero.
  CHECK(validate_message(adamw{.beta1 = 1.0f}) == "optim::adamw: beta1 must be in [0, 1), got 1");
  CHECK(validate_message(adamw{.beta2 = 1.0f}) == "optim::adamw: beta2 must be in [0, 1), got 1");
  CHECK(validate_message(adamw{.beta2 = 1.0000001f}) == "optim::adamw: beta2 must be in [0, 1), got 1.0000001");
  CHECK(validate_message(adamw{.beta1 = -0.1f}) == "optim::adamw: beta1 must be in [0, 1), got -0.1");
  CHECK(validate_message(adamw{.eps = 0.0f}) == "optim::adamw: eps must be finite and > 0, got 0");
  CHECK(validate_message(adamw{.eps = infinity}) == "optim::adamw: eps must be finite and > 0, got inf");
  CHECK(validate_message(adamw{.weight_decay = not_a_number}) ==
        "optim::adamw: weight_decay must be finite and >= 0, got nan");
  CHECK(validate_message(adamw{.weight_decay = -0.01f}) ==
        "optim::adamw: weight_decay must be finite and >= 0, got -0.01");
}

TEST_CASE("optim::lion: lr, betas and weight decay are checked") {
  using lion = zero::optim::lion;
  CHECK(validate_message(lion{}) == "(accepted)");
  CHECK(validate_message(lion{.lr = 0.0f}) == "(accepted)");
  CHECK(validate_message(lion{.beta1 = 0.0f, .beta2 = 0.0f}) == "(accepted)");
  CHECK(validate_message(lion{.lr = infinity}) == "optim::lion: lr must be finite and >= 0, got inf");
  CHECK(validate_message(lion{.lr = -1e-3f}) == "optim::lion: lr must be finite and >= 0, got -0.001");
  CHECK(validate_message(lion{.beta1 = 1.0f}) == "optim::lion: beta1 must be in [0, 1), got 1");
  CHECK(validate_message(lion{.beta2 = not_a_number}) == "optim::lion: beta2 must be in [0, 1), got nan");
  CHECK(validate_message(lion{.weight_decay = -0.5f}) == "optim::lion: weight_decay must be finite and >= 0, got -0.5");
}

TEST_CASE("the engine refuses a bad optimizer at construction, naming the rank") {
  CHECK(engine_message(zero::optim::adamw{.beta1 = 1.0f}) == "rank 0: optim::adamw: beta1 must be in [0, 1), got 1");
  CHECK(engine_message(zero::optim::sgd{.momentum = 0.0f, .nesterov = true}) ==
        "rank 0: optim::sgd: nesterov needs momentum > 0, got momentum 0");
  CHECK(engine_message(picky_sgd{}) == "rank 0: picky_sgd: lr must be >= 0, got -1");
  CHECK(engine_message(plain_sgd{}) == "(accepted)");  // no validate(): nothing to call
}

TEST_CASE("lr 0 is accepted and leaves the weights where they were, bit for bit") {
  const auto initial = toy::run<zero::stage3>(2, 0, zero::optim::adamw{}).params;
  const auto adamw = toy::run<zero::stage3>(2, 3, zero::optim::adamw{.lr = 0.0f}).params;
  const auto sgd = toy::run<zero::stage3>(2, 3, zero::optim::sgd{.lr = 0.0f}).params;
  const auto lion = toy::run<zero::stage3>(2, 3, zero::optim::lion{.lr = 0.0f, .weight_decay = 0.5f}).params;
  REQUIRE(adamw.size() == initial.size());
  REQUIRE(sgd.size() == initial.size());
  REQUIRE(lion.size() == initial.size());
  for (std::size_t i = 0; i < initial.size(); ++i) {
    CAPTURE(i);
    CHECK(std::bit_cast<std::uint32_t>(adamw[i]) == std::bit_cast<std::uint32_t>(initial[i]));
    CHECK(std::bit_cast<std::uint32_t>(sgd[i]) == std::bit_cast<std::uint32_t>(initial[i]));
    CHECK(std::bit_cast<std::uint32_t>(lion[i]) == std::bit_cast<std::uint32_t>(initial[i]));
  }
}

TEST_CASE("engine_options: clip_norm, micro_batches, accumulate and the loss scale are checked") {
  const zero::optim::adamw adamw{};
  auto with = [](auto change) {
    zero::engine_options o;
    change(o);
    return o;
  };
  CHECK(engine_message(adamw, with([](auto& o) { o.clip_norm = infinity; })) ==
        "rank 0: engine_options: clip_norm must be finite and >= 0, got inf");
  CHECK(engine_message(adamw, with([](auto& o) { o.clip_norm = not_a_number; })) ==
        "rank 0: engine_options: clip_norm must be finite and >= 0, got nan");
  CHECK(engine_message(adamw, with([](auto& o) { o.clip_norm = -1.0f; })) ==
        "rank 0: engine_options: clip_norm must be finite and >= 0, got -1");
  CHECK(engine_message(adamw, with([](auto& o) { o.micro_batches = 0; })) ==
        "rank 0: engine_options: micro_batches must be >= 1, got 0");
  CHECK(engine_message(adamw, with([](auto& o) { o.accumulate = static_cast<zero::accumulation>(7); })) ==
        "rank 0: engine_options: accumulate is not an accumulation value (7)");
  // The loss scale is checked under every precision, used or not; fp16 is where it matters.
  using fp16 = zero::precision::fp16;
  CHECK(engine_message<zero::optim::adamw, fp16>(adamw, with([](auto& o) { o.loss_scale.initial = 1000.0f; })) ==
        "rank 0: loss_scale_options: initial must be a finite power of two (..., 0.5, 1, 2, ...), got 1000");
  CHECK(engine_message(adamw, with([](auto& o) { o.loss_scale.initial = infinity; })) ==
        "rank 0: loss_scale_options: initial must be a finite power of two (..., 0.5, 1, 2, ...), got inf");
  CHECK(engine_message(adamw, with([](auto& o) { o.loss_scale.min_scale = 0.0f; })) ==
        "rank 0: loss_scale_options: min_scale must be a finite power of two (..., 0.5, 1, 2, ...), got 0");
  CHECK(engine_message(adamw, with([](auto& o) { o.loss_scale.max_scale = not_a_number; })) ==
        "rank 0: loss_scale_options: max_scale must be a finite power of two (..., 0.5, 1, 2, ...), got nan");
  CHECK(engine_message(adamw, with([](auto& o) { o.loss_scale.initial = 0.5f; })) ==
        "rank 0: loss_scale_options: need min_scale <= initial <= max_scale, got min_scale 1, initial 0.5, "
        "max_scale 16777216");
  CHECK(engine_message(adamw, with([](auto& o) { o.loss_scale.hysteresis = 0; })) ==
        "rank 0: loss_scale_options: hysteresis must be >= 1, got 0");
  CHECK(engine_message(adamw, with([](auto& o) { o.loss_scale.growth_interval = 0; })) ==
        "rank 0: loss_scale_options: growth_interval must be >= 1, got 0");
  CHECK(engine_message<zero::optim::adamw, fp16>(
            adamw, with([](auto& o) { o.loss_scale = {.initial = 0.25f, .min_scale = 0.125f, .max_scale = 8.0f}; })) ==
        "(accepted)");
}
