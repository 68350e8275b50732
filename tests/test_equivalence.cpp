// Bit-exact equivalence: stages 0-3 give identical parameters, equal to a single-process reference.
#include <doctest/doctest.h>

#include <cstring>

#include "toy_model.hpp"

namespace {

constexpr int steps = 20;

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return a.size();
}

template <class Opt>
void check_all_stages(Opt opt) {
  for (int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    const auto ref = toy::reference(n, steps, opt);
    REQUIRE(ref.size() == toy::spec().numel());
    // Every stage of zero/catalog.hpp.
    int stages = 0;
    zero::stages::for_each([&]<class Stage>() {
      const auto s = toy::run<Stage>(n, steps, opt).params;
      CHECK_MESSAGE(bit_equal(s, ref), "stage ", Stage::stage, " differs first at ", first_difference(s, ref));
      ++stages;
    });
    CHECK(stages == 4);  // stages 0-3, as the test cases say
  }
}

}  // namespace

TEST_CASE("AdamW: stages 0-3 are bit-identical to the rank-ordered single-process reference") {
  zero::optim::adamw opt;
  opt.lr = 3e-3f;
  opt.weight_decay = 0.05f;
  check_all_stages(opt);
}

TEST_CASE("SGD with momentum and weight decay: stages 0-3 are bit-identical to the reference") {
  zero::optim::sgd opt;
  opt.lr = 0.03f;
  opt.momentum = 0.9f;
  opt.weight_decay = 1e-3f;
  check_all_stages(opt);
}

TEST_CASE("SGD with Nesterov momentum: stages 0-3 are bit-identical to the reference") {
  zero::optim::sgd opt;
  opt.lr = 0.02f;
  opt.nesterov = true;
  check_all_stages(opt);
}

// Every optimizer of the library with its default settings: a new one is in this matrix by being in
// zero/catalog.hpp.
TEST_CASE_TEMPLATE_DEFINE("stages 0-3 are bit-identical to the reference (each optimizer, default settings)", Opt,
                          equivalence_per_optimizer) {
  CAPTURE(Opt::name);
  check_all_stages(Opt{});
}
TEST_CASE_TEMPLATE_APPLY(equivalence_per_optimizer, zero::optimizers::tuple);

TEST_CASE("the reference is sensitive to the summation order, so the equality above means something") {
  // Summing the same gradients in reverse rank order changes some bits after training.
  const int n = 4;
  zero::optim::adamw opt;
  const auto ref = toy::reference(n, steps, opt);
  const zero::model_spec s = toy::spec();
  std::vector<float> w(s.numel());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = toy::initial(i);
  std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f);
  for (int t = 0; t < steps; ++t) {
    const auto c = opt.constants(static_cast<std::uint64_t>(t) + 1);
    for (std::size_t i = 0; i < w.size(); ++i) {
      float acc = toy::gradient(w[i], n - 1, static_cast<std::uint64_t>(t), i);
      for (int r = n - 2; r >= 0; --r) acc += toy::gradient(w[i], r, static_cast<std::uint64_t>(t), i);
      float st[2] = {m[i], v[i]};
      zero::optim::adamw::update(c, w[i], acc / static_cast<float>(n), st);
      m[i] = st[0];
      v[i] = st[1];
    }
  }
  CHECK_FALSE(bit_equal(w, ref));
}
