// A kind of optimizer from outside the library, through engine/sweep_kind.hpp's seam alone: SGD with each tensor's
// gradient normalized by its own norm, which needs sums over tensors that ZeRO cuts across ranks.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "zero/comm/backends/threads.hpp"
#include "zero/engine/tensor_sums.hpp"
#include "zero/zero.hpp"

namespace {

// w <- w - lr g / ||g||, the norm over the tensor's averaged gradient (the weight unchanged where it is 0).
// Its element-wise rule, plain SGD, is what an engine without the kind would run: the tests tell them apart.
struct normalized_sgd {
  float lr = 0.05f;
  static constexpr int slots = 0;
  static constexpr std::string_view name = "normalized_sgd";
  static constexpr std::array<std::string_view, 0> slot_names{};
  struct step_constants {
    float lr;
  };
  step_constants constants(std::uint64_t) const { return {lr}; }
  static void update(const step_constants& c, float& w, float g, float*) { w = zero::fp::sub(w, zero::fp::mul(c.lr, g)); }
  static constexpr auto hyper_parameters() { return std::tuple{zero::field("lr", &normalized_sgd::lr)}; }
};

// The kind: each tensor's sum of squares in the fixed order of engine/tensor_sums.hpp (its pieces on other
// ranks completed by one all-reduce on the control link), then each weight. Only optimizer_sweep's pieces.
template <class Ctx, class Opt>
class normalized_sweep {
 public:
  explicit normalized_sweep(Ctx& ctx) : ctx_(ctx) {}

  void plan(zero::optimizer_sweep<Ctx, Opt>&, const zero::param_group_map&) {
    ZERO_CHECK(ctx_.options.param_groups.empty(), invalid_argument, "rank ", ctx_.rank,
               ": normalized_sgd takes no parameter groups");
  }
  std::uint64_t exchange_bytes(const zero::optimizer_sweep<Ctx, Opt>&) const { return 0; }

  template <class Gradients, class Done>
  void update(zero::optimizer_sweep<Ctx, Opt>& sweep, zero::parameter_placement<Ctx>& params,
              const zero::param_group_map&, const std::vector<typename Opt::step_constants>& c, float divisor,
              float coef, const Gradients& gradients, Done done) {
    static_assert(!Ctx::precision::separate_master, "the test's kind updates fp32 parameters in place");
    const zero::layout& l = ctx_.layout;
    constexpr bool sharded_states = Ctx::partitioner::shards_optimizer_states;
    if (!sums_) sums_ = std::make_unique<zero::tensor_sums>(l, sharded_states, ctx_.rank, 1);
    sums_->begin_step();
    std::vector<std::size_t> first_tensor{0};  // the global index of each unit's first tensor
    for (std::size_t u = 0; u < l.num_units(); ++u)
      first_tensor.push_back(first_tensor.back() + l.unit(zero::unit_id{u}).tensors.size());
    // f(global tensor, piece, the piece's first element in its tensor) for every tensor piece of a segment.
    const auto pieces = [&](zero::unit_id u, std::size_t i, std::size_t n, auto&& f) {
      const zero::unit_layout& ul = l.unit(u);
      for (std::size_t t = 0; t < ul.tensors.size(); ++t) {
        const zero::range piece = zero::intersect(ul.tensors[t], zero::range{i, i + n});
        if (!piece.empty()) f(first_tensor[u.index] + t, piece, piece.begin - ul.tensors[t].begin);
      }
    };
    // The averaged gradient of unit-local elements `piece`; `clear` zeroes what it read, as a host update must.
    const auto averaged = [&](zero::unit_id u, zero::range piece, bool clear) {
      std::vector<float> g(piece.size());
      gradients([&]<class T>(T* store, bool sharded) {
        T* at = store + zero::element_index(l.unit(u), piece.begin, sharded, ctx_.rank);
        for (std::size_t j = 0; j < g.size(); ++j) {
          g[j] = zero::fp::mul(zero::fp::div(static_cast<float>(at[j]), divisor), coef);
          if (clear) at[j] = T{};
        }
      });
      return g;
    };
    sweep.store().begin_step();
    sweep.for_each_held_segment(
        [&](zero::unit_id u, std::size_t i, std::size_t n, float* const*) {
          pieces(u, i, n, [&](std::size_t t, zero::range piece, std::size_t local) {
            const std::vector<float> g = averaged(u, piece, false);
            zero::tensor_sums::adder adder(*sums_, t);
            adder.add(ctx_.sys, 0, local, g.data(), g.size());
            adder.finish();
          });
        },
        false, [](zero::unit_id) {});
    std::vector<double>& cut = sums_->exchange();  // the same size on every rank: they agree on the layout
    if (!cut.empty()) ctx_.control.all_reduce(cut.data(), cut.data(), cut.size(), zero::reduce_op::sum);
    sums_->complete();
    sweep.for_each_held_segment(
        [&](zero::unit_id u, std::size_t i, std::size_t n, float* const*) {
          pieces(u, i, n, [&](std::size_t t, zero::range piece, std::size_t) {
            const std::vector<float> g = averaged(u, piece, true);
            const double norm = std::sqrt(sums_->sum(t, 0));
            const float f = norm > 0.0 ? static_cast<float>(static_cast<double>(c[0].lr) / norm) : 0.0f;
            auto* w = reinterpret_cast<float*>(params.element(l.unit(u), piece.begin));
            for (std::size_t j = 0; j < g.size(); ++j) w[j] = zero::fp::sub(w[j], zero::fp::mul(f, g[j]));
          });
        },
        true, done);
    sweep.store().end_step();
  }

 private:
  Ctx& ctx_;
  std::unique_ptr<zero::tensor_sums> sums_;  // kept between steps
};

}  // namespace

template <>
struct zero::sweep_kind_of<normalized_sgd> {
  template <class Ctx>
  using kind = normalized_sweep<Ctx, normalized_sgd>;
};

namespace {

using zero::comm::threads;

zero::model_spec model() {
  zero::model_spec s;
  s.unit("a").tensor("w", {7, 9}).tensor("b", {9});
  s.unit("b").tensor("w", {130}).tensor("v", {3});
  return s;
}

void init_values(const zero::unit_spec&, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
  for (std::size_t j = 0; j < v.size(); ++j)
    v[j] = 0.2f * std::sin(0.41f * static_cast<float>(r.begin + j) + static_cast<float>(t.numel % 7));
}

// The gradient of global micro-batch `sample` at a step: a function of the weights, the element and the sample.
float gradient(float w, std::size_t j, int step, int sample) {
  return std::cos(3.0f * w + 0.05f * static_cast<float>(j) + static_cast<float>(step + 2 * sample));
}

// Steps of a global batch of 12 micro-batches, rank r of N taking 12 / N of them.
template <class Stage>
std::vector<float> trained(int ranks, bool reproducible, int steps = 3) {
  zero::engine_options eo;
  eo.reproducible = reproducible;
  eo.micro_batches = 12 / ranks;
  std::vector<float> out;
  threads::launch(ranks, [&](threads& c) {
    zero::engine<Stage, threads, normalized_sgd> e(c, model(), {}, eo);
    e.initialize(init_values);
    for (int s = 0; s < steps; ++s) {
      for (int m = 0; m < eo.micro_batches; ++m)
        for (std::size_t u = e.spec().units().size(); u-- > 0;) {
          const zero::unit_id id{u};
          auto w = e.gather(id);
          auto g = e.grads(id);
          for (std::size_t j = 0; j < e.layout().unit(id).numel; ++j)
            g.view().data()[j] += gradient(w.view().data()[j], j, s, c.rank() * eo.micro_batches + m);
          e.reduce(id);
        }
      e.step();
    }
    const std::vector<float> p = e.full_params();
    if (c.rank() == 0) out = p;
  });
  return out;
}

}  // namespace

TEST_CASE("sweep kind: an optimizer's own kind trains the same bits in every stage at N = 1..4, reproducibly") {
  const auto one = trained<zero::stage0>(1, true);
  REQUIRE(one.size() == 63 + 9 + 130 + 3);
  for (int ranks : {1, 2, 3, 4}) {
    CAPTURE(ranks);
    CHECK(trained<zero::stage0>(ranks, true) == one);
    CHECK(trained<zero::stage1>(ranks, true) == one);
    CHECK(trained<zero::stage2>(ranks, true) == one);
    CHECK(trained<zero::stage3>(ranks, true) == one);
  }
  for (int ranks : {2, 4}) {  // without the reproducible mode: every stage the same bits at one N
    CAPTURE(ranks);
    const auto s0 = trained<zero::stage0>(ranks, false);
    CHECK(trained<zero::stage1>(ranks, false) == s0);
    CHECK(trained<zero::stage3>(ranks, false) == s0);
  }
}

TEST_CASE("sweep kind: one step is the kind's rule (each tensor's gradient over its norm), not the element-wise one") {
  std::vector<float> w0, w1;
  threads::launch(1, [&](threads& c) {
    zero::engine<zero::stage2, threads, normalized_sgd> e(c, model(), {}, {});
    e.initialize(init_values);
    w0 = e.full_params();
    for (std::size_t u = 0; u < e.spec().units().size(); ++u) {
      const zero::unit_id id{u};
      auto w = e.gather(id);
      auto g = e.grads(id);
      for (std::size_t j = 0; j < e.layout().unit(id).numel; ++j) g.view().data()[j] = gradient(w.view().data()[j], j, 0, 0);
      e.reduce(id);
    }
    e.step();
    w1 = e.full_params();
  });
  // The expected weights in double, tensor by tensor, in declaration order.
  std::size_t at = 0, tensor_elements_in_unit = 0;
  const std::vector<std::size_t> tensors{63, 9, 130, 3};
  bool differs_from_sgd = false;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    tensor_elements_in_unit = t == 2 ? 0 : tensor_elements_in_unit;  // the unit-local index restarts in unit "b"
    double sq = 0.0;
    for (std::size_t j = 0; j < tensors[t]; ++j) {
      const double g = gradient(w0[at + j], tensor_elements_in_unit + j, 0, 0);
      sq += g * g;
    }
    for (std::size_t j = 0; j < tensors[t]; ++j) {
      const double g = gradient(w0[at + j], tensor_elements_in_unit + j, 0, 0);
      CAPTURE(t);
      CAPTURE(j);
      CHECK(w1[at + j] == doctest::Approx(w0[at + j] - 0.05 * g / std::sqrt(sq)).epsilon(1e-6));
      if (std::abs(static_cast<double>(w1[at + j]) - (w0[at + j] - 0.05 * g)) > 1e-4) differs_from_sgd = true;
    }
    at += tensors[t];
    tensor_elements_in_unit += tensors[t];
  }
  CHECK(differs_from_sgd);
}

TEST_CASE("sweep kind: its plan runs at construction, and its refusal reaches the caller") {
  zero::engine_options eo;
  eo.param_groups = {{.name = "slow", .lr_scale = 0.5f}};
  zero::model_spec s;
  s.unit("a").tensor("w", {7, 9}).group("slow").tensor("b", {9});
  threads::launch(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS((zero::engine<zero::stage1, threads, normalized_sgd>(c, s, {}, eo)),
                         doctest::Contains("normalized_sgd takes no parameter groups"), zero::error);
  });
}
