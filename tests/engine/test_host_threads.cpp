// engine_options::host_threads: the host update over a rank's thread pool, the same bits at any thread count.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../engine_instances.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/core/thread_pool.hpp"
#include "zero/zero.hpp"

namespace {

using zero::comm::threads;

// Units large enough that the update is cut into several ranges (thread_pool::min_range_elements),
// with sizes that leave uneven tails.
zero::model_spec model() {
  zero::model_spec s;
  s.unit("big").tensor("w", {150, 203}).tensor("b", {203});
  s.unit("small").tensor("w", {37});
  s.unit("mid").tensor("w", {41, 129});
  return s;
}

// Steps of gradients that depend on the parameters the step gathers (so a parameter's bits show).
template <class Engine>
void train_steps(Engine& e, int rank, std::uint64_t steps) {
  for (std::uint64_t step = 0; step < steps; ++step) {
    const auto& units = e.spec().units();
    for (std::size_t u = units.size(); u-- > 0;) {
      const zero::unit_id id{u};
      auto w = e.gather(id);
      auto g = e.grads(id);
      const std::size_t n = e.layout().unit(id).numel;
      for (std::size_t j = 0; j < n; ++j) {
        const float x = static_cast<float>(w.view().data()[j]);
        const float v = std::cos(3.0f * x + 0.01f * static_cast<float>(j) + static_cast<float>(step + rank));
        g.view().data()[j] = static_cast<typename Engine::grad_type>(v * e.loss_scale());
      }
      e.reduce(id);
    }
    e.step();
  }
}

// Every unit's gathered parameters, widened to float (a forward-only scope).
template <class Engine>
std::vector<float> gathered_parameters(Engine& e) {
  std::vector<float> out;
  auto scope = e.evaluation();
  for (std::size_t u = 0; u < e.spec().units().size(); ++u) {
    auto w = e.gather(zero::unit_id{u});
    for (std::size_t j = 0; j < e.layout().unit(zero::unit_id{u}).numel; ++j)
      out.push_back(static_cast<float>(w.view().data()[j]));
  }
  return out;
}

template <class Stage, class Prec>
std::vector<float> trained(int ranks, int host_threads, zero::offload_tier tier = zero::offload_tier::none) {
  zero::engine_options eo;
  eo.host_threads = host_threads;
  eo.offload.tier = tier;
  eo.clip_norm = 0.5f;
  std::vector<float> out;
  threads::launch(ranks, [&](threads& c) {
    zero::engine<Stage, threads, zero::optim::adamw, Prec> e(c, model(), {}, eo);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
      for (std::size_t j = 0; j < v.size(); ++j)
        v[j] = 0.05f * std::sin(0.7f * static_cast<float>(r.begin + j) + static_cast<float>(t.numel % 7));
    });
    train_steps(e, c.rank(), 3);
    const std::vector<float> p = e.full_params();
    if (c.rank() == 0) out = p;
  });
  return out;
}

// The nonzero elements grads() hands out at a unit's first grads() of a step, summed over the ranks,
// over 4 steps whose kernels add their gradient into what they are given; the second step's gradient
// is infinite on rank 0 (skipped). The host update zeroes the store as it reads it and clear() the
// rest: any element left over would show here at the next step.
template <class Stage, class Prec>
int nonzero_gradients_handed_out(int ranks, const zero::engine_options& eo) {
  std::atomic<int> nonzero{0};
  threads::launch(ranks, [&](threads& c) {
    zero::engine<Stage, threads, zero::optim::adamw, Prec> e(c, model(), {}, eo);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, zero::range r, std::span<float> v) {
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = 0.01f * static_cast<float>((r.begin + j) % 13);
    });
    bool skipped_one = false;
    for (std::uint64_t step = 0; step < 4; ++step) {
      const auto& units = e.spec().units();
      for (std::size_t u = units.size(); u-- > 0;) {
        const zero::unit_id id{u};
        auto w = e.gather(id);
        auto g = e.grads(id);
        auto* d = g.view().data();
        const std::size_t n = e.layout().unit(id).numel;
        for (std::size_t j = 0; j < n; ++j) {
          if (static_cast<float>(d[j]) != 0.0f) ++nonzero;
          const float v = std::sin(static_cast<float>(j + step) + static_cast<float>(w.view().data()[j]));
          d[j] = static_cast<typename decltype(e)::grad_type>(static_cast<float>(d[j]) + v * e.loss_scale());
        }
        if (step == 1 && u == 0 && c.rank() == 0)
          d[n / 2] = static_cast<typename decltype(e)::grad_type>(std::numeric_limits<float>::infinity());
        e.reduce(id);
      }
      skipped_one = e.step().skipped || skipped_one;
    }
    CHECK(skipped_one);
  });
  return nonzero.load();
}

}  // namespace

TEST_CASE_TEMPLATE("host update: grads() hands out zeros after every step, taken or skipped", Stage, zero::stage0,
                   zero::stage1, zero::stage2, zero::stage3) {
  for (int ranks : {1, 2, 3}) {
    CAPTURE(ranks);
    zero::engine_options eo;
    eo.clip_norm = 0.5f;
    CHECK(nonzero_gradients_handed_out<Stage, zero::precision::fp32>(ranks, eo) == 0);
    CHECK(nonzero_gradients_handed_out<Stage, zero::precision::bf16>(ranks, eo) == 0);
    eo.offload.tier = zero::offload_tier::host;
    CHECK(nonzero_gradients_handed_out<Stage, zero::precision::bf16>(ranks, eo) == 0);
    eo.offload.tier = zero::offload_tier::none;
    if constexpr (Stage::shards_gradients) {  // an fp32 store beside the bf16 gradients: stages 2-3
      eo.fp32_grad_accumulation = true;
      CHECK(nonzero_gradients_handed_out<Stage, zero::precision::bf16>(ranks, eo) == 0);
      eo.fp32_grad_accumulation = false;
    }
    eo.reproducible = true;
    CHECK(nonzero_gradients_handed_out<Stage, zero::precision::fp32>(ranks, eo) == 0);
  }
}

TEST_CASE("thread_pool: ranges of whole lines, at least min_range_elements, every element once, errors rethrown") {
  using pool = zero::thread_pool;
  CHECK(pool::split_of(0, 4).parts == 1);
  CHECK(pool::split_of(1000, 4).parts == 1);  // below two ranges' worth: the caller alone
  const auto s = pool::split_of(10000, 3);
  CHECK(s.chunk % pool::line_elements == 0);
  CHECK(s.parts == 3);
  CHECK(s.chunk * 2 < 10000);
  pool p(3);
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{2047}, std::size_t{10000}, std::size_t{100001}}) {
    std::vector<std::atomic<int>> seen(n);
    p.run(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t j = b; j < e; ++j) seen[j].fetch_add(1);
    });
    for (std::size_t j = 0; j < n; ++j) REQUIRE(seen[j].load() == 1);
  }
  CHECK_THROWS_WITH_AS(p.run(100000,
                             [](std::size_t b, std::size_t) {
                               if (b > 0) throw std::runtime_error("range failed");
                             }),
                       "range failed", std::runtime_error);
  std::atomic<std::size_t> total{0};
  p.run(50000, [&](std::size_t b, std::size_t e) { total += e - b; });  // usable after a failure
  CHECK(total == 50000);
}

TEST_CASE_TEMPLATE("host_threads: 1, 2 and 3 threads train the same bits in every stage and precision", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  const auto fp32 = trained<Stage, zero::precision::fp32>(2, 1);
  CHECK(trained<Stage, zero::precision::fp32>(2, 2) == fp32);
  CHECK(trained<Stage, zero::precision::fp32>(2, 3) == fp32);
  const auto bf16 = trained<Stage, zero::precision::bf16>(2, 1);
  CHECK(trained<Stage, zero::precision::bf16>(2, 3) == bf16);
  const auto fp16 = trained<Stage, zero::precision::fp16>(1, 1);
  CHECK(trained<Stage, zero::precision::fp16>(1, 2) == fp16);
  // The offloaded update (host tier) too.
  CHECK(trained<Stage, zero::precision::bf16>(2, 2, zero::offload_tier::host) == bf16);
}

TEST_CASE("host_threads: a checkpoint's master weights cast into the parameters, the same bits at any thread count") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero_test_host_threads";
  std::filesystem::remove_all(dir);
  using bf16_engine = zero::engine<zero::stage1, threads, zero::optim::adamw, zero::precision::bf16>;
  std::vector<float> saved;
  threads::launch(2, [&](threads& c) {
    bf16_engine e(c, model());
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, zero::range r, std::span<float> v) {
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = 0.03f * std::sin(0.3f * static_cast<float>(r.begin + j));
    });
    train_steps(e, c.rank(), 2);
    zero::checkpoint::save(e, c, dir);
    const auto p = gathered_parameters(e);
    if (c.rank() == 0) saved = p;
  });
  for (int t : {1, 3})
    for (auto tier : {zero::offload_tier::none, zero::offload_tier::host}) {
      CAPTURE(t);
      threads::launch(2, [&](threads& c) {
        zero::engine_options eo;
        eo.host_threads = t;
        eo.offload.tier = tier;
        zero::engine<zero::stage3, threads, zero::optim::adamw, zero::precision::bf16> e(c, model(), {}, eo);
        zero::checkpoint::load(e, c, dir);
        CHECK(gathered_parameters(e) == saved);
      });
    }
  std::filesystem::remove_all(dir);
}

TEST_CASE("host_threads: refused below 1 or above 1024, naming the option") {
  threads::launch(1, [](threads& c) {
    for (int t : {-1, 0, 1025}) {
      zero::engine_options eo;
      eo.host_threads = t;
      CHECK_THROWS_WITH_AS((zero::engine<zero::stage1, threads, zero::optim::adamw>(c, model(), {}, eo)),
                           doctest::Contains("host_threads"), zero::error);
    }
  });
}
