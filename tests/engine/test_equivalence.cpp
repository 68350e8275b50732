// Bit-exact equivalence: stages 0-3 give the parameters and optimizer states of a single-process reference.
#include <doctest/doctest.h>

#include <cstring>

#include "../toy_model.hpp"

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

// Every stage's parameters and optimizer slots equal the rank-ordered reference's, bit for bit. The
// comparison includes the slots because the parameters alone cannot always see the order in which
// the gradients were summed: Lion moves each weight by exactly +-lr, so the low bits of its gradient
// reach only its momentum, and plain SGD's lr * g is often below half an ulp of the weight. At N >= 3
// (two summands commute exactly) the same training summed in reversed rank order must differ in what
// is compared, or the equality with the engine would say nothing about its reduction order.
template <class Opt>
void check_all_stages(Opt opt) {
  for (int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    const auto ref = toy::reference_with_state(n, steps, opt);
    REQUIRE(ref.params.size() == toy::spec().numel());
    if (n >= 3) {
      const auto reversed = toy::reference_with_state(n, steps, opt, toy::reduction_order::reversed);
      CHECK_MESSAGE(!(bit_equal(reversed.params, ref.params) && bit_equal(reversed.slots, ref.slots)),
                    "summing in reversed rank order gives the same parameters and slots: this case cannot see the "
                    "engine's reduction order");
    }
    // Every stage of zero/catalog.hpp.
    int stages = 0;
    zero::stages::for_each([&]<class Stage>() {
      const auto s = toy::run<Stage>(n, steps, opt);
      CHECK_MESSAGE(bit_equal(s.params, ref.params), "stage ", Stage::stage, " parameters differ first at ",
                    first_difference(s.params, ref.params));
      CHECK_MESSAGE(bit_equal(s.slots, ref.slots), "stage ", Stage::stage, " optimizer slots differ first at ",
                    first_difference(s.slots, ref.slots));
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
