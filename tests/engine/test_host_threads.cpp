// engine_options::host_threads: the host update over a rank's thread pool, the same bits at any thread count.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "../engine_instances.hpp"
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
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto& units = e.spec().units();
      for (std::size_t u = units.size(); u-- > 0;) {
        const zero::unit_id id{u};
        auto w = e.gather(id);
        auto g = e.grads(id);
        const std::size_t n = e.layout().unit(id).numel;
        for (std::size_t j = 0; j < n; ++j) {
          const float x = static_cast<float>(w.view().data()[j]);
          const float v = std::cos(3.0f * x + 0.01f * static_cast<float>(j) + static_cast<float>(step + c.rank()));
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

}  // namespace

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
