// Parameter groups (engine_options::param_groups): per-group lr scale and weight decay, the same bits in every stage.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "../engine_instances.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/zero.hpp"

namespace {

using zero::comm::threads;

// Three units; the biases and the norm gain take no weight decay, the embedding half the lr.
zero::model_spec grouped_model() {
  zero::model_spec s;
  s.unit("embed").tensor("wte", {61, 16}).group("embedding");
  s.unit("block").tensor("w", {16, 48}).tensor("b", {48}).group("no_decay").tensor("g", {48}).group("no_decay");
  s.unit("head").tensor("w", {48, 10}).tensor("b", {10}).group("no_decay");
  return s;
}
// The same model without groups.
zero::model_spec plain_model() {
  zero::model_spec s;
  s.unit("embed").tensor("wte", {61, 16});
  s.unit("block").tensor("w", {16, 48}).tensor("b", {48}).tensor("g", {48});
  s.unit("head").tensor("w", {48, 10}).tensor("b", {10});
  return s;
}

std::vector<zero::param_group> recipe() {
  return {{.name = "no_decay", .weight_decay = 0.0f}, {.name = "embedding", .lr_scale = 0.5f}};
}

// Trains `steps` steps (gradients from the gathered parameters, so a parameter's bits show) and returns
// the consolidated parameters. `lr`: set_learning_rate before the last step, where > 0.
template <class Stage, class Prec = zero::precision::fp32, class Opt = zero::optim::adamw>
std::vector<float> trained(const zero::model_spec& spec, int ranks, Opt opt, zero::engine_options eo, int steps = 3,
                           float lr = 0.0f) {
  std::vector<float> out;
  threads::launch(ranks, [&](threads& c) {
    zero::engine<Stage, threads, Opt, Prec> e(c, spec, opt, eo);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
      for (std::size_t j = 0; j < v.size(); ++j)
        v[j] = 0.1f * std::sin(0.37f * static_cast<float>(r.begin + j) + static_cast<float>(t.numel % 5));
    });
    for (int step = 0; step < steps; ++step) {
      if (lr > 0.0f && step == steps - 1) e.set_learning_rate(lr);
      for (std::size_t u = e.spec().units().size(); u-- > 0;) {
        const zero::unit_id id{u};
        auto w = e.gather(id);
        auto g = e.grads(id);
        for (std::size_t j = 0; j < e.layout().unit(id).numel; ++j) {
          const float x = static_cast<float>(w.view().data()[j]);
          const float v = std::cos(2.0f * x + 0.03f * static_cast<float>(j) + static_cast<float>(step + c.rank()));
          g.view().data()[j] = static_cast<typename decltype(e)::grad_type>(v * e.loss_scale());
        }
        e.reduce(id);
      }
      e.step();
    }
    const std::vector<float> p = e.full_params();
    if (c.rank() == 0) out = p;
  });
  return out;
}

// The reproducible mode's run: a global batch of 12 samples per step, rank r of N taking samples
// [12 r / N, 12 (r + 1) / N) as its micro-batches, so every N sums the same gradients.
template <class Stage, class Opt>
std::vector<float> trained_global(const zero::model_spec& spec, int ranks, Opt opt, zero::engine_options eo) {
  constexpr int samples = 12;
  eo.reproducible = true;
  eo.micro_batches = samples / ranks;
  std::vector<float> out;
  threads::launch(ranks, [&](threads& c) {
    zero::engine<Stage, threads, Opt> e(c, spec, opt, eo);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
      for (std::size_t j = 0; j < v.size(); ++j)
        v[j] = 0.1f * std::sin(0.37f * static_cast<float>(r.begin + j) + static_cast<float>(t.numel % 5));
    });
    for (int step = 0; step < 2; ++step) {
      for (int m = 0; m < eo.micro_batches; ++m) {
        const int sample = c.rank() * eo.micro_batches + m;
        for (std::size_t u = e.spec().units().size(); u-- > 0;) {
          const zero::unit_id id{u};
          auto w = e.gather(id);
          auto g = e.grads(id);
          for (std::size_t j = 0; j < e.layout().unit(id).numel; ++j) {
            const float x = w.view().data()[j];
            g.view().data()[j] = std::cos(2.0f * x + 0.03f * static_cast<float>(j) + static_cast<float>(step + sample));
          }
          e.reduce(id);
        }
      }
      e.step();
    }
    const std::vector<float> p = e.full_params();
    if (c.rank() == 0) out = p;
  });
  return out;
}

// Elements [begin, end) of the flat parameters of grouped_model(), per tensor.
struct span_of {
  std::size_t begin, end;
};
const span_of wte{0, 976}, block_w{976, 1744}, block_bg{1744, 1840}, head_w{1840, 2320}, head_b{2320, 2330};

bool same(const std::vector<float>& a, const std::vector<float>& b, span_of s) {
  return std::equal(a.begin() + static_cast<std::ptrdiff_t>(s.begin), a.begin() + static_cast<std::ptrdiff_t>(s.end),
                    b.begin() + static_cast<std::ptrdiff_t>(s.begin));
}

}  // namespace

TEST_CASE("param groups: each group's tensors train as under an optimizer with the group's values") {
  zero::optim::adamw opt;
  opt.lr = 1e-2f;
  opt.weight_decay = 0.1f;
  zero::engine_options eo;
  eo.param_groups = recipe();
  const auto grouped = trained<zero::stage1>(grouped_model(), 2, opt, eo);
  const auto plain = trained<zero::stage1>(plain_model(), 2, opt, {});
  REQUIRE(grouped.size() == plain.size());
  REQUIRE(grouped.size() == head_b.end);
  auto no_decay = opt;
  no_decay.weight_decay = 0.0f;
  const auto without_decay = trained<zero::stage1>(plain_model(), 2, no_decay, {});
  auto half_lr = opt;
  half_lr.lr = zero::fp::mul(opt.lr, 0.5f);
  const auto half = trained<zero::stage1>(plain_model(), 2, half_lr, {});
  // The ungrouped tensors: the optimizer's own values.
  CHECK(same(grouped, plain, block_w));
  CHECK(same(grouped, plain, head_w));
  // no_decay: weight decay 0; the embedding: half the lr.
  CHECK(same(grouped, without_decay, block_bg));
  CHECK(same(grouped, without_decay, head_b));
  CHECK(same(grouped, half, wte));
  CHECK_FALSE(same(grouped, plain, block_bg));  // the groups did change something
  CHECK_FALSE(same(grouped, plain, wte));
  // Overrides equal to the optimizer's own values change no bit.
  eo.param_groups = {{.name = "no_decay", .lr_scale = 1.0f, .weight_decay = 0.1f}};
  CHECK(trained<zero::stage1>(grouped_model(), 2, opt, eo) == plain);
}

TEST_CASE("param groups: set_learning_rate scales every group's lr") {
  zero::optim::adamw opt;
  opt.lr = 1e-2f;
  zero::engine_options eo;
  eo.param_groups = {{.name = "embedding", .lr_scale = 0.25f}};
  const auto grouped = trained<zero::stage2>(grouped_model(), 2, opt, eo, 3, 4e-3f);
  const auto plain = trained<zero::stage2>(plain_model(), 2, opt, {}, 3, 4e-3f);
  auto quarter = opt;
  quarter.lr = zero::fp::mul(opt.lr, 0.25f);
  const auto slow = trained<zero::stage2>(plain_model(), 2, quarter, {}, 3, zero::fp::mul(4e-3f, 0.25f));
  CHECK(same(grouped, plain, block_w));
  CHECK(same(grouped, slow, wte));
  CHECK_FALSE(same(grouped, plain, wte));
}

TEST_CASE_TEMPLATE("param groups: every stage trains the same bits, and the reproducible mode at any N", Opt,
                   zero::optim::adamw, zero::optim::sgd, zero::optim::lion, zero::optim::lamb) {
  Opt opt;
  opt.weight_decay = 0.05f;
  zero::engine_options eo;
  eo.param_groups = recipe();
  eo.clip_norm = 0.5f;
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    const auto s0 = trained<zero::stage0, zero::precision::fp32, Opt>(grouped_model(), ranks, opt, eo);
    CHECK(trained<zero::stage1, zero::precision::fp32, Opt>(grouped_model(), ranks, opt, eo) == s0);
    CHECK(trained<zero::stage2, zero::precision::fp32, Opt>(grouped_model(), ranks, opt, eo) == s0);
    CHECK(trained<zero::stage3, zero::precision::fp32, Opt>(grouped_model(), ranks, opt, eo) == s0);
    const auto b0 = trained<zero::stage0, zero::precision::bf16, Opt>(grouped_model(), ranks, opt, eo);
    CHECK(trained<zero::stage3, zero::precision::bf16, Opt>(grouped_model(), ranks, opt, eo) == b0);
  }
  const auto one = trained_global<zero::stage2, Opt>(grouped_model(), 1, opt, eo);
  auto without = eo;
  without.param_groups.clear();
  CHECK(one != trained_global<zero::stage2, Opt>(plain_model(), 1, opt, without));
  for (int ranks : {2, 3, 4}) {
    CAPTURE(ranks);
    CHECK(trained_global<zero::stage1, Opt>(grouped_model(), ranks, opt, eo) == one);
    CHECK(trained_global<zero::stage2, Opt>(grouped_model(), ranks, opt, eo) == one);
    CHECK(trained_global<zero::stage3, Opt>(grouped_model(), ranks, opt, eo) == one);
    CHECK(trained_global<zero::stage0, Opt>(grouped_model(), ranks, opt, eo) == one);
  }
}

TEST_CASE("param groups: refused, naming the group, before any model state exists") {
  const auto refused = [](std::vector<zero::param_group> groups, const std::string& what) {
    threads::launch(2, [&](threads& c) {
      zero::engine_options eo;
      eo.param_groups = groups;
      CHECK_THROWS_WITH_AS((zero::engine<zero::stage2, threads, zero::optim::adamw>(c, grouped_model(), {}, eo)),
                           doctest::Contains(what.c_str()), zero::error);
    });
  };
  refused({{.name = "no_decy"}},
          "group 'no_decy' is given to no tensor of the model (its groups: 'embedding', "
          "'no_decay')");
  refused({{.name = "no_decay"}, {.name = "no_decay"}}, "group 'no_decay' is given twice");
  refused({{.name = ""}}, "a group name must not be empty");
  refused({{.name = "embedding", .lr_scale = -1.0f}}, "param_groups['embedding']: lr_scale must be finite and >= 0");
  refused({{.name = "embedding", .weight_decay = std::nanf("")}},
          "param_groups['embedding']: weight_decay must be finite and >= 0");
  threads::launch(1, [](threads& c) {
    zero::engine_options eo;
    eo.param_groups = {{.name = "no_decay"}};
    CHECK_THROWS_WITH_AS((zero::engine<zero::stage1, threads, zero::optim::adamw>(c, plain_model(), {}, eo)),
                         doctest::Contains("the model spec puts no tensor in a group"), zero::error);
  });
  // In the spec: a tensor in two groups, and a group before any tensor.
  zero::model_spec s;
  auto u = s.unit("u");
  CHECK_THROWS_WITH_AS(u.group("x"), doctest::Contains("before any tensor"), zero::error);
  u.tensor("w", {4}).group("a");
  CHECK_THROWS_WITH_AS(u.group("b"), doctest::Contains("tensor 'w' is put in group 'b' but is in group 'a' already"),
                       zero::error);
}

TEST_CASE("param groups: ranks with other groups are refused on every rank, naming the setting") {
  threads::launch(2, [](threads& c) {
    zero::engine_options eo;
    eo.param_groups = {{.name = "no_decay", .weight_decay = c.rank() == 0 ? 0.0f : 0.01f}};
    CHECK_THROWS_WITH_AS((zero::engine<zero::stage1, threads, zero::optim::adamw>(c, grouped_model(), {}, eo)),
                         doctest::Contains("engine_options::param_groups (their names and values, hashed)"),
                         zero::error);
  });
  threads::launch(2, [](threads& c) {
    zero::model_spec s;
    s.unit("u").tensor("w", {8, 8}).tensor("b", {8});
    if (c.rank() == 1)
      s.unit("v").tensor("b", {8}).group("no_decay");
    else
      s.unit("v").tensor("b", {8});
    CHECK_THROWS_WITH_AS((zero::engine<zero::stage1, threads, zero::optim::adamw>(c, s)),
                         doctest::Contains("model_spec's tensor groups"), zero::error);
  });
}

TEST_CASE("param groups: kept in the checkpoint's manifest, and a run resumed with them continues bit for bit") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero_test_param_groups";
  std::filesystem::remove_all(dir);
  zero::optim::adamw opt;
  opt.weight_decay = 0.1f;
  zero::engine_options eo;
  eo.param_groups = recipe();
  const auto init = [](const zero::unit_spec&, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    for (std::size_t j = 0; j < v.size(); ++j)
      v[j] = 0.05f * std::cos(0.21f * static_cast<float>(r.begin + j + t.numel));
  };
  const auto step = [](auto& e, int rank, int k) {
    for (std::size_t u = e.spec().units().size(); u-- > 0;) {
      const zero::unit_id id{u};
      auto w = e.gather(id);
      auto g = e.grads(id);
      for (std::size_t j = 0; j < e.layout().unit(id).numel; ++j)
        g.view().data()[j] = std::sin(3.0f * w.view().data()[j] + static_cast<float>(j % 7 + k + rank));
      e.reduce(id);
    }
    e.step();
  };
  std::vector<float> uninterrupted;
  threads::launch(2, [&](threads& c) {
    zero::engine<zero::stage3, threads, zero::optim::adamw> e(c, grouped_model(), opt, eo);
    e.initialize(init);
    for (int k = 0; k < 4; ++k) {
      if (k == 2) zero::checkpoint::save(e, c, dir);
      step(e, c.rank(), k);
    }
    const auto p = e.full_params();
    if (c.rank() == 0) uninterrupted = p;
  });
  const zero::checkpoint::manifest m = zero::checkpoint::verify(dir);
  REQUIRE(m.param_groups.size() == 2);
  CHECK(m.param_groups[0].name == "no_decay");
  CHECK(m.param_groups[0].lr_scale == 1.0f);
  CHECK(m.param_groups[0].weight_decay == 0.0f);
  CHECK(m.param_groups[1].name == "embedding");
  CHECK(m.param_groups[1].lr_scale == 0.5f);
  CHECK_FALSE(m.param_groups[1].weight_decay.has_value());
  threads::launch(2, [&](threads& c) {
    zero::engine_options resumed;
    resumed.param_groups = m.param_groups;
    zero::engine<zero::stage1, threads, zero::optim::adamw> e(
        c, grouped_model(), zero::checkpoint::optimizer_from<zero::optim::adamw>(m), resumed);
    zero::checkpoint::load(e, c, dir);
    for (int k = 2; k < 4; ++k) step(e, c.rank(), k);
    CHECK(e.full_params() == uninterrupted);
  });
  std::filesystem::remove_all(dir);
}
