// The GPT example's model: its backward pass against finite differences, and the protocol calls it makes (the tied unit's).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "gpt.hpp"

namespace {

// Stands in for the engine with one rank: a flat parameter and gradient buffer per unit, and a log
// of the protocol calls, so the test can move one parameter at a time and read every gradient.
struct recording_engine {
  zero::model_spec spec;
  zero::layout lay;
  std::vector<float> params, gradients;
  std::map<std::string, int> calls;  // "gather wte" -> count
  std::vector<bool> gathered;

  explicit recording_engine(const zero::model_spec& s)
      : spec(s), lay(zero::layout::make(s, 1)), params(lay.padded()), gradients(lay.padded()),
        gathered(s.num_units(), false) {}

  struct handle {
    recording_engine* e;
    zero::unit_id u;
    float* base;
    zero::unit_view<float> view() const { return {base, e->spec.units()[u.index], e->lay.unit(u), 0}; }
    void release() {
      REQUIRE(e->gathered[u.index]);
      e->gathered[u.index] = false;
      e->log("release", u);
    }
  };
  void log(const char* call, zero::unit_id u) { ++calls[std::string(call) + " " + spec.units()[u.index].name]; }
  handle gather(zero::unit_id u) {
    REQUIRE_FALSE(gathered[u.index]);  // the engine refuses a second gather before the release
    gathered[u.index] = true;
    log("gather", u);
    return {this, u, params.data() + lay.unit(u).offset};
  }
  handle grads(zero::unit_id u) {
    log("grads", u);
    return {this, u, gradients.data() + lay.unit(u).offset};
  }
  void reduce(zero::unit_id u) { log("reduce", u); }
  float loss_scale() const { return 1.0f; }
  int rank() const { return 0; }
};

gpt::config small() {
  gpt::config c;
  c.vocab = 7;
  c.context = 5;
  c.embd = 8;
  c.heads = 2;
  c.layers = 2;
  c.batch = 2;
  return c;
}

// Mean cross-entropy of a fixed batch, and its gradient in e.gradients when `backward`.
double loss(recording_engine& e, const gpt::config& c, bool backward) {
  gpt::activations a;
  a.rows = c.batch;
  a.t_len = c.context;
  for (int i = 0; i < c.batch * c.context; ++i) {
    a.tokens.push_back((i * 3 + 1) % c.vocab);
    a.targets.push_back((i * 5 + 2) % c.vocab);
  }
  gpt::forward(c, gpt::gathered(e), a);
  const int rows = c.batch * c.context;
  std::vector<float> dlogits(static_cast<std::size_t>(rows) * c.vocab);
  int correct = 0;
  const double sum = gpt::kernels::cross_entropy(a.logits.data(), a.targets.data(), dlogits.data(),
                                                 1.0f / static_cast<float>(rows), rows, c.vocab, correct);
  if (backward) gpt::backward(e, c, a, dlogits);
  return sum / rows;
}

}  // namespace

TEST_CASE("gpt backward equals central differences of the loss, every tensor, the tied one included") {
  const gpt::config c = small();
  recording_engine e(gpt::make_spec(c));
  // Weights large enough that every path carries a visible gradient (GPT-2's 0.02 leaves the deep
  // ones near zero), layer-norm gains around 1.
  for (std::size_t u = 0; u < e.spec.num_units(); ++u) {
    const auto& us = e.spec.units()[u];
    const auto& ul = e.lay.unit(zero::unit_id{u});
    for (std::size_t t = 0; t < us.tensors.size(); ++t)
      for (std::size_t i = ul.tensors[t].begin; i < ul.tensors[t].end; ++i) {
        const float r = 0.4f * mlp::uniform(mlp::key(11, u, t, i));
        e.params[ul.offset + i] = us.tensors[t].name.find("ln_") != std::string::npos || us.name == "ln_f"
                                      ? (us.tensors[t].name.ends_with("weight") ? 1.0f + r : r)
                                      : r;
      }
  }
  loss(e, c, true);
  const std::vector<float> analytic = e.gradients;
  const float eps = 1e-2f;
  for (std::size_t u = 0; u < e.spec.num_units(); ++u) {
    const auto& us = e.spec.units()[u];
    const auto& ul = e.lay.unit(zero::unit_id{u});
    for (std::size_t t = 0; t < us.tensors.size(); ++t) {
      const zero::range tr = ul.tensors[t];
      double diff2 = 0.0, norm2 = 0.0;
      const std::size_t stride = std::max<std::size_t>(1, tr.size() / 9);  // about ten elements per tensor
      for (std::size_t i = tr.begin; i < tr.end; i += stride) {
        float& w = e.params[ul.offset + i];
        const float w0 = w;
        w = w0 + eps;
        const double up = loss(e, c, false);
        w = w0 - eps;
        const double down = loss(e, c, false);
        w = w0;
        const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
        const double a = analytic[ul.offset + i];
        diff2 += (numeric - a) * (numeric - a);
        norm2 += a * a;
      }
      INFO("unit ", us.name, " tensor ", us.tensors[t].name, ": |numeric - analytic| = ", std::sqrt(diff2),
           ", |analytic| = ", std::sqrt(norm2));
      CHECK(norm2 > 0.0);
      // With fp32 forward passes the central difference agrees to about 2e-4 of the gradient's norm
      // here; a wrong term in a backward kernel is off by far more than 2e-3.
      CHECK(std::sqrt(diff2) <= 2e-3 * std::sqrt(norm2));
    }
  }
}

TEST_CASE("gpt step protocol: the tied unit is gathered twice per pass, its grads taken twice, reduced once") {
  const gpt::config c = small();
  recording_engine e(gpt::make_spec(c));
  loss(e, c, true);
  CHECK(e.calls["gather wte"] == 4);
  CHECK(e.calls["release wte"] == 4);
  CHECK(e.calls["grads wte"] == 2);
  CHECK(e.calls["reduce wte"] == 1);
  for (const char* u : {"wpe", "h.0", "h.1", "ln_f"}) {
    INFO("unit ", u);
    CHECK(e.calls[std::string("gather ") + u] == 2);
    CHECK(e.calls[std::string("release ") + u] == 2);
    CHECK(e.calls[std::string("grads ") + u] == 1);
    CHECK(e.calls[std::string("reduce ") + u] == 1);
  }
  for (std::size_t u = 0; u < e.gathered.size(); ++u) CHECK_FALSE(e.gathered[u]);
}
