// Each optimizer of the library against golden values computed in double precision from its published equations
// (tests/core/optimizer_golden.py).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "optimizer_golden.hpp"
#include "zero/zero.hpp"

namespace {

// How far a float32 rule may land from the double-precision equations: about ten roundings of 2^-24
// per step over five steps, relative to weights of order 1, stays below 1e-6; 1e-5 leaves room for
// error growth through AdamW's division and stays far below what a formula error costs (the cases'
// rates and decays move the weights by 1e-3 or more per step).
constexpr double tolerance = 1e-5;

// The optimizer with a case's settings, each set through the optimizer's own hyper_parameters()
// list; a setting the case does not give fails the test (the golden data must cover every one).
template <class Opt>
Opt configured(const golden::optimizer_case& gc) {
  Opt o{};
  zero::for_each_hyper_parameter(Opt::hyper_parameters(), [&](const auto& h) {
    using T = typename std::remove_cvref_t<decltype(h)>::type;
    const golden::setting* s = nullptr;
    for (const auto& x : gc.settings)
      if (h.name == x.name) s = &x;
    REQUIRE_MESSAGE(s != nullptr, "the golden case '", gc.label, "' does not set ", std::string(h.name));
    if constexpr (std::is_same_v<T, bool>) o.*(h.member) = s->value != 0.0;
    else o.*(h.member) = static_cast<T>(s->value);
  });
  CHECK(gc.settings.size() == std::tuple_size_v<decltype(Opt::hyper_parameters())>);
  zero::validate_optimizer(o);
  return o;
}

// A tensor-wise, matrix or whole-tensor optimizer's case through a 1-rank engine (stage 0, fp32) over a model whose one
// unit holds the case's tensors, of its sizes or shapes (or, with `one_tensor`, all of its elements as one
// tensor): each step hands
// the case's gradient to grads() and steps. Returns the largest distance from the golden weights.
template <class Opt>
double tensorwise_distance(const golden::optimizer_case& gc, const Opt& opt, bool one_tensor) {
  zero::model_spec spec;
  auto unit = spec.unit("u");
  if (one_tensor) {
    unit.tensor("all", {gc.w0.size()});
  } else if (!gc.shapes.empty()) {
    for (std::size_t t = 0; t < gc.shapes.size(); ++t)
      unit.tensor("t" + std::to_string(t), std::vector<std::size_t>(gc.shapes[t].begin(), gc.shapes[t].end()));
  } else {
    for (std::size_t t = 0; t < gc.tensors.size(); ++t)
      unit.tensor("t" + std::to_string(t), {static_cast<std::size_t>(gc.tensors[t])});
  }
  double worst = 0.0;
  zero::comm::threads::launch(1, [&](zero::comm::threads& c) {
    zero::engine<zero::stage0, zero::comm::threads, Opt> e(c, spec, opt);
    e.initialize([&](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
      std::size_t at = 0;  // the tensor's first element in the case's weights
      for (std::size_t k = 0; &u.tensors[k] != &t; ++k) at += u.tensors[k].numel;
      std::copy(gc.w0.begin() + static_cast<std::ptrdiff_t>(at),
                gc.w0.begin() + static_cast<std::ptrdiff_t>(at + v.size()), v.begin());
    });
    for (std::size_t t = 0; t < gc.grads.size(); ++t) {
      CAPTURE(t + 1);
      auto g = e.grads(zero::unit_id{0});
      std::copy(gc.grads[t].begin(), gc.grads[t].end(), g.view().data());
      e.reduce(zero::unit_id{0});
      e.step();
      const std::vector<float> w = e.full_params();
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double want = gc.weights[t][i];
        worst = std::fmax(worst, std::fabs(static_cast<double>(w[i]) - want) / std::fmax(1.0, std::fabs(want)));
      }
    }
  });
  return worst;
}

// Runs the case through the engine's element-wise update on the host system (divisor 1, no
// clipping: the gradient reaches the rule as given) and compares every weight after every step.
template <class Opt>
void check_case(const golden::optimizer_case& gc) {
  CAPTURE(gc.label);
  const Opt opt = configured<Opt>(gc);
  if constexpr (zero::TensorwiseOptimizer<Opt>) {
    REQUIRE_MESSAGE(!gc.tensors.empty(), "a tensor-wise optimizer's golden case names its tensors");
    CHECK(tensorwise_distance(gc, opt, false) <= tolerance);
  } else if constexpr (zero::WholeTensorOptimizer<Opt>) {
    REQUIRE_MESSAGE(!gc.shapes.empty(), "a whole-tensor optimizer's golden case gives its tensors' shapes");
    CHECK(tensorwise_distance(gc, opt, false) <= tolerance);
  } else if constexpr (zero::MatrixOptimizer<Opt>) {
    REQUIRE_MESSAGE(!gc.shapes.empty(), "a matrix optimizer's golden case gives its tensors' shapes");
    CHECK(tensorwise_distance(gc, opt, false) <= tolerance);
  } else {
    std::vector<float> w = gc.w0;
    const std::size_t n = w.size();
    std::vector<std::vector<float>> state(static_cast<std::size_t>(Opt::slots), std::vector<float>(n, 0.0f));
    float* slots[Opt::slots > 0 ? Opt::slots : 1] = {};
    for (int k = 0; k < Opt::slots; ++k) slots[k] = state[static_cast<std::size_t>(k)].data();
    for (std::size_t t = 0; t < gc.grads.size(); ++t) {
      CAPTURE(t + 1);
      REQUIRE(gc.grads[t].size() == n);
      const auto c = opt.constants(t + 1);
      zero::elementwise::update<Opt>(zero::sys::host{}, c, gc.grads[t].data(), 1.0f, 1.0f, w.data(), slots,
                                     static_cast<float*>(nullptr), n);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        const double want = gc.weights[t][i];
        const double err = std::fabs(static_cast<double>(w[i]) - want);
        if (gc.bits)
          CHECK_MESSAGE(static_cast<double>(w[i]) == want, "weight ", w[i], ", the emulation gives ", want);
        else
          CHECK_MESSAGE(err <= tolerance * std::fmax(1.0, std::fabs(want)), "weight ", static_cast<double>(w[i]),
                        ", the equations give ", want);
      }
    }
  }
}

}  // namespace

// An optimizer added to zero/catalog.hpp without golden values fails here.
TEST_CASE_TEMPLATE_DEFINE("each optimizer follows its published equations over several steps", Opt, golden_cases) {
  CAPTURE(Opt::name);
  int found = 0;
  for (const auto& gc : golden::cases())
    if (Opt::name == gc.optimizer) {
      check_case<Opt>(gc);
      ++found;
    }
  CHECK_MESSAGE(found > 0, "no golden values for this optimizer: add its equations to tests/core/optimizer_golden.py");
}
TEST_CASE_TEMPLATE_APPLY(golden_cases, zero::optimizers::tuple);
// The library's optimizers outside zero/catalog.hpp (each through a kind of its own, not in the trainers).
using outside_catalog = zero::type_list<zero::optim::adafactor>;
TEST_CASE_TEMPLATE_APPLY(golden_cases, outside_catalog::tuple);

TEST_CASE("every optimizer with golden values is in the library's list") {
  for (const auto& gc : golden::cases()) {
    const std::string name = gc.optimizer;
    CAPTURE(name);
    bool listed = false;
    zero::optimizers::for_each([&]<class O>() { listed = listed || O::name == gc.optimizer; });
    outside_catalog::for_each([&]<class O>() { listed = listed || O::name == gc.optimizer; });
    CHECK(listed);
  }
}

TEST_CASE("the golden values discriminate: a weight decay applied as L2 instead of decoupled fails") {
  // AdamW's first case run as Adam with L2 decay (the decay added to the gradient): the result moves
  // away from the golden values by far more than the tolerance, so the check above can fail.
  const golden::optimizer_case* gc = nullptr;
  for (const auto& x : golden::cases())
    if (std::string(x.optimizer) == "adamw") {
      gc = &x;
      break;
    }
  REQUIRE(gc != nullptr);
  const auto opt = configured<zero::optim::adamw>(*gc);
  REQUIRE(opt.weight_decay > 0.0f);
  zero::optim::adamw no_decay = opt;
  no_decay.weight_decay = 0.0f;
  std::vector<float> w = gc->w0, m(w.size(), 0.0f), v(w.size(), 0.0f);
  double worst = 0.0;
  for (std::size_t t = 0; t < gc->grads.size(); ++t) {
    const auto c = no_decay.constants(t + 1);
    for (std::size_t i = 0; i < w.size(); ++i) {
      float s[2] = {m[i], v[i]};
      zero::optim::adamw::update(c, w[i], gc->grads[t][i] + opt.weight_decay * w[i], s);
      m[i] = s[0];
      v[i] = s[1];
      worst = std::fmax(worst, std::fabs(static_cast<double>(w[i]) - gc->weights[t][i]));
    }
  }
  CHECK(worst > 100 * tolerance);
}

TEST_CASE("the golden values discriminate: Lion's direction interpolated with beta2 instead of beta1 fails") {
  // The paper's one subtle point: the sign is taken of b1 m + (1 - b1) g, while the momentum kept is
  // b2 m + (1 - b2) g. A rule that updates m first and steps along sign(m) gives other weights.
  const golden::optimizer_case* gc = nullptr;
  for (const auto& x : golden::cases())
    if (std::string(x.optimizer) == "lion") {
      gc = &x;
      break;
    }
  REQUIRE(gc != nullptr);
  const auto opt = configured<zero::optim::lion>(*gc);
  REQUIRE(opt.beta1 != opt.beta2);
  std::vector<float> w = gc->w0, m(w.size(), 0.0f);
  double worst = 0.0;
  for (std::size_t t = 0; t < gc->grads.size(); ++t) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = opt.beta2 * m[i] + (1.0f - opt.beta2) * gc->grads[t][i];
      w[i] = w[i] - opt.lr * (zero::optim::lion::sign(m[i]) + opt.weight_decay * w[i]);
      worst = std::fmax(worst, std::fabs(static_cast<double>(w[i]) - gc->weights[t][i]));
    }
  }
  CHECK(worst > 100 * tolerance);
}

TEST_CASE("the golden values discriminate: adamw_bf16 with its moments rounded to nearest fails") {
  // The same step, with the moments kept as bf16 rounded to nearest even instead of stochastically:
  // some weight of the five steps differs from the emulated bits.
  for (const auto& gc : golden::cases()) {
    if (std::string(gc.optimizer) != "adamw_bf16") continue;
    CAPTURE(gc.label);
    const auto opt = configured<zero::optim::adamw_bf16>(gc);
    const zero::optim::adamw fp32{opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay};
    std::vector<float> w = gc.w0, m(w.size(), 0.0f), v(w.size(), 0.0f);
    int differ = 0;
    for (std::size_t t = 0; t < gc.grads.size(); ++t) {
      const auto c = fp32.constants(t + 1);
      for (std::size_t i = 0; i < w.size(); ++i) {
        float s[2] = {m[i], v[i]};
        zero::optim::adamw::update(c, w[i], gc.grads[t][i], s);
        m[i] = static_cast<float>(zero::bf16(s[0]));
        v[i] = static_cast<float>(zero::bf16(s[1]));
        differ += static_cast<double>(w[i]) != gc.weights[t][i];
      }
    }
    CHECK(differ > 0);
  }
}

TEST_CASE("the golden values discriminate: LAMB with one norm over all elements instead of per tensor fails") {
  for (const auto& gc : golden::cases()) {
    if (std::string(gc.optimizer) != "lamb") continue;
    CAPTURE(gc.label);
    REQUIRE(gc.tensors.size() > 1);
    const auto opt = configured<zero::optim::lamb>(gc);
    CHECK(tensorwise_distance(gc, opt, true) > 100 * tolerance);
  }
}

TEST_CASE("the golden values discriminate: Adafactor with a moment per element in one tensor instead of factored fails") {
  int cases = 0;
  for (const auto& gc : golden::cases()) {
    if (std::string(gc.optimizer) != "adafactor") continue;
    CAPTURE(gc.label);
    REQUIRE(gc.shapes.size() > 1);
    const auto opt = configured<zero::optim::adafactor>(gc);
    CHECK(tensorwise_distance(gc, opt, true) > 100 * tolerance);
    ++cases;
  }
  CHECK(cases == 2);
}

TEST_CASE("optim::lamb refuses a clamp whose ends are out of order, naming both") {
  zero::optim::lamb o;
  o.phi_min = 3.0f;
  o.phi_max = 2.0f;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("phi_min 3 is above phi_max 2"), zero::error);
  o.phi_max = 0.0f;
  o.phi_min = 0.0f;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("phi_max"), zero::error);
}

TEST_CASE("the gradient's divisor: a power of two multiplies by its exact reciprocal, with the division's bits") {
  using zero::elementwise::gradient_divisor;
  // Values whose quotients cover normals, subnormals (rounded), zeros of both signs, infinities,
  // NaN and the largest and smallest floats.
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 3.0f, 0.1f, -7.3e-3f, 1e30f, -1e-30f,
                           std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(), 1.5e-39f, -2.9e-42f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (std::uint32_t b = 0x00000001u; b < 0x7f800000u; b += 0x00a3c5b7u) xs.push_back(std::bit_cast<float>(b));
  int by_inverse = 0;
  for (int k = -130; k <= 130; ++k) {
    for (const float d : {std::ldexp(1.0f, k), std::ldexp(1.5f, k), std::ldexp(1.0f, k) * 3.0f, 65536.0f * 3.0f}) {
      if (!(d > 0.0f) || !std::isfinite(d)) continue;
      const gradient_divisor g(d);
      by_inverse += g.by_inverse ? 1 : 0;
      // Only a normal power of two takes the reciprocal, and only where the reciprocal is normal too.
      int e = 0;
      const bool pow2 = std::frexp(d, &e) == 0.5f;
      CHECK(g.by_inverse == (pow2 && std::isnormal(d) && std::isnormal(1.0f / d)));
      for (const float x : xs) {
        const float want = x / d, got = g.divide(x);
        CAPTURE(x);
        CAPTURE(d);
        CHECK(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want));
      }
    }
  }
  CHECK(by_inverse > 200);  // the multiply is what most divisors (powers of two) take
  CHECK(std::isnan(gradient_divisor(4.0f).divide(std::numeric_limits<float>::quiet_NaN())));
}
