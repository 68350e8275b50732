// Overlap of communication with computation: the same bits as the blocking protocol, with reduces in
// flight, stage 3 prefetches and the stage 1-2 parameter gather overlapped, counted exactly.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "../deferred_comm.hpp"
#include "../toy_model.hpp"
#include "zero/comm/backends/modeled.hpp"
#include "zero/comm/verified.hpp"

namespace {

static_assert(zero::comm::nonblocking<testing::deferred<zero::comm::threads>>);
static_assert(!zero::comm::nonblocking<zero::comm::threads>);
static_assert(zero::comm::check_nonblocking<testing::deferred<zero::comm::threads>>());

template <class C>
using deferred = testing::deferred<C>;

constexpr int steps = 6;

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

zero::engine_options overlap(bool on) {
  zero::engine_options o;
  o.overlap = on;
  return o;
}

// The toy model has 4 units, gathered forward 0..3 and backward 3..0 in each step.
constexpr std::uint64_t units = 4;

}  // namespace

TEST_CASE("overlap on a nonblocking backend: stages 0-3 bit-identical to the reference, traffic = formula") {
  const zero::optim::adamw opt;
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto ref = toy::reference(n, steps, opt);
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(Stage::stage);
      const auto r = toy::run<Stage, zero::optim::adamw, zero::precision::fp32, deferred>(n, steps, opt, overlap(true));
      CHECK(bit_equal(r.params, ref));
      for (const auto& c : r.comm) CHECK(c.last_step.total_bytes() == r.comm_formula);
    });
  }
}

TEST_CASE("overlap on and off give the same bits with bf16 and clipping, every stage") {
  zero::optim::adamw opt;
  opt.lr = 3e-3f;
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    auto on = overlap(true), off = overlap(false);
    on.clip_norm = off.clip_norm = 0.05f;
    using bf16 = zero::precision::bf16;
    const auto a = toy::run<Stage, zero::optim::adamw, bf16, deferred>(4, steps, opt, on);
    const auto b = toy::run<Stage, zero::optim::adamw, bf16, deferred>(4, steps, opt, off);
    const auto c = toy::run<Stage, zero::optim::adamw, bf16>(4, steps, opt, off);
    CHECK(bit_equal(a.params, b.params));
    CHECK(bit_equal(a.params, c.params));
    for (std::size_t r = 0; r < 4; ++r)
      for (int t = 0; t < steps; ++t) {
        const auto& x = a.reports[r][static_cast<std::size_t>(t)];
        const auto& y = c.reports[r][static_cast<std::size_t>(t)];
        CHECK(std::memcmp(&x.grad_norm, &y.grad_norm, sizeof(double)) == 0);
      }
  });
}

// The counts follow from the rules of prefetch_ahead (engine.hpp): the first step has no recorded
// order; later steps, with 2 units ahead, prefetch every gather but the step's first (forward 1, 2,
// 3; backward 3, started while the forward still holds it, then 2, 1, 0): 2 x units - 1, all taken.
TEST_CASE("stage 3 prefetch: every gather after the first step's follows the recorded order and hits") {
  zero::stages::for_each([&]<class Stage>() {
    if constexpr (Stage::stage == 3) {
      const auto r = toy::run<Stage, zero::optim::adamw, zero::precision::fp32, deferred>(2, steps, {}, overlap(true));
      for (const auto& c : r.comm) CHECK(c.last_step.total_bytes() == r.comm_formula);
    }
  });
  zero::comm::threads::launch(2, [&](zero::comm::threads& base) {
    deferred<zero::comm::threads> comm(base);
    zero::engine<zero::stage3, deferred<zero::comm::threads>, zero::optim::adamw> e(comm, toy::spec(), {}, overlap(true));
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    const auto o = e.overlap();
    CHECK(o.active);
    CHECK(o.prefetches == (steps - 1) * (2 * units - 1));
    CHECK(o.prefetch_hits == o.prefetches);
    CHECK(o.prefetch_misses == 0);
    CHECK(o.reduces_started == steps * units);
    CHECK(o.max_reduces_in_flight == units);  // the default limit, 4, holds every unit's reduce
    CHECK(comm.pending() == 0);               // step() waited for everything
  });
}

TEST_CASE("stages 1-2: step() leaves the parameter all-gathers in flight; gather(u) waits for its own") {
  zero::stages::for_each([&]<class Stage>() {
    if constexpr (Stage::stage == 1 || Stage::stage == 2) {
      CAPTURE(Stage::stage);
      zero::comm::threads::launch(2, [&](zero::comm::threads& base) {
        deferred<zero::comm::threads> comm(base);
        zero::engine<Stage, deferred<zero::comm::threads>, zero::optim::adamw> e(comm, toy::spec(), {}, overlap(true));
        e.initialize(toy::initializer());
        toy::train_step(e, comm.rank(), 0);
        CHECK(comm.pending() == units);  // one all-gather per unit, not yet run
        e.gather(zero::unit_id{0}).release();
        CHECK(comm.pending() == units - 1);  // unit 0's (the oldest) ran; deferred runs in start order
        e.gather(zero::unit_id{3}).release();
        CHECK(comm.pending() == 0);
        CHECK(e.overlap().parameter_gathers_started == units);
        e.full_params();  // between steps: nothing in flight, a plain read
      });
    }
  });
}

TEST_CASE("a step that gathers in another order drops the prefetches (counted) and keeps the bits") {
  std::vector<float> with_overlap, blocking;
  for (bool on : {true, false}) {
    zero::comm::threads::launch(2, [&](zero::comm::threads& base) {
      deferred<zero::comm::threads> comm(base);
      zero::engine<zero::stage3, deferred<zero::comm::threads>, zero::optim::adamw> e(comm, toy::spec(), {}, overlap(on));
      e.initialize(toy::initializer());
      toy::train_step(e, comm.rank(), 0);
      toy::train_step(e, comm.rank(), 1);
      // A forward pass that skips unit 2: at the third gather (unit 3 where the order says 2) the
      // prefetches of units 2 and 3 are dropped, and the rest of the step gathers without prefetch.
      for (std::size_t u : {0u, 1u, 3u}) e.gather(zero::unit_id{u}).release();
      const auto base_of = toy::unit_bases(e.spec());
      for (std::size_t u = units; u-- > 0;) {
        const zero::unit_id id{u};
        auto p = e.gather(id);
        auto g = e.grads(id);
        const auto pv = p.view();
        const auto gv = g.view();
        for (std::size_t j = 0; j < pv.size(); ++j) gv.data()[j] = toy::gradient(pv.data()[j], comm.rank(), 2, base_of[u] + j);
        e.reduce(id);
      }
      e.step();
      const auto o = e.overlap();
      if (on) {
        CHECK(o.prefetch_misses == 2);
        CHECK(o.prefetch_hits == o.prefetches - o.prefetch_misses);
      } else {
        CHECK(!o.active);
        CHECK(o.prefetches == 0);
      }
      auto full = e.full_params();
      if (comm.rank() == 0) (on ? with_overlap : blocking) = std::move(full);
    });
  }
  CHECK(bit_equal(with_overlap, blocking));
}

TEST_CASE("max_live_parameters and prefetch_units bound the prefetch; reduces_in_flight bounds the reduces") {
  const auto ref = toy::run<zero::stage3, zero::optim::adamw>(2, steps, {}).params;
  const zero::layout l = zero::layout::make(toy::spec(), 2);
  std::size_t largest = 0;
  for (std::size_t u = 0; u < units; ++u) largest = std::max(largest, l.unit(zero::unit_id{u}).padded);
  struct row {
    int prefetch_units;
    std::size_t max_live;
    int reduces;
  };
  for (const row w : {row{0, 0, 1}, row{1, 0, 2}, row{2, largest, 4}, row{8, 0, 8}}) {
    CAPTURE(w.prefetch_units);
    CAPTURE(w.max_live);
    zero::engine_options o = overlap(true);
    o.prefetch_units = w.prefetch_units;
    o.max_live_parameters = w.max_live;
    o.reduces_in_flight = w.reduces;
    const auto r = toy::run<zero::stage3, zero::optim::adamw, zero::precision::fp32, deferred>(2, steps, {}, o);
    CHECK(bit_equal(r.params, ref));
    zero::comm::threads::launch(2, [&](zero::comm::threads& base) {
      deferred<zero::comm::threads> comm(base);
      zero::engine<zero::stage3, deferred<zero::comm::threads>, zero::optim::adamw> e(comm, toy::spec(), {}, o);
      e.initialize(toy::initializer());
      std::size_t peak_transient = 0;
      for (int t = 0; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
      peak_transient = e.memory().peak[static_cast<int>(zero::mem_category::transient)];
      const auto ov = e.overlap();
      CHECK(ov.max_reduces_in_flight == std::min<std::uint64_t>(units, static_cast<std::uint64_t>(w.reduces)));
      if (w.prefetch_units == 0) CHECK(ov.prefetches == 0);
      if (w.max_live > 0) {
        // One unit gathered and nothing else live at a time, besides the reduce buckets.
        CHECK(ov.prefetches < (steps - 1) * (2 * units - 1));
      }
      if (w.prefetch_units >= 2 && w.max_live == 0) CHECK(ov.prefetches == (steps - 1) * (2 * units - 1));
      CHECK(peak_transient > 0);
    });
  }
}

TEST_CASE("gradient accumulation with reduces in flight: the micro-batches add up in order, bit-identical") {
  // M = 3 micro-batches per step, each reduced: buckets in flight for the same unit complete oldest first.
  auto train = [](bool on, auto stage_tag) {
    using Stage = decltype(stage_tag);
    std::vector<float> out;
    zero::comm::threads::launch(3, [&](zero::comm::threads& base) {
      deferred<zero::comm::threads> comm(base);
      zero::engine_options o = overlap(on);
      o.micro_batches = 3;
      o.reduces_in_flight = 16;
      zero::engine<Stage, deferred<zero::comm::threads>, zero::optim::adamw> e(comm, toy::spec(), {}, o);
      e.initialize(toy::initializer());
      const auto base_of = toy::unit_bases(e.spec());
      for (std::uint64_t t = 0; t < 4; ++t) {
        for (int m = 0; m < 3; ++m) {
          for (std::size_t u = 0; u < units; ++u) e.gather(zero::unit_id{u}).release();
          for (std::size_t u = units; u-- > 0;) {
            const zero::unit_id id{u};
            auto p = e.gather(id);
            auto g = e.grads(id);
            const auto pv = p.view();
            const auto gv = g.view();
            for (std::size_t j = 0; j < pv.size(); ++j)
              gv.data()[j] = toy::gradient(pv.data()[j], comm.rank() * 3 + m, t, base_of[u] + j);
            e.reduce(id);
          }
        }
        e.step();
      }
      if (on) CHECK(e.overlap().max_reduces_in_flight == 3 * units);
      auto full = e.full_params();
      if (comm.rank() == 0) out = std::move(full);
    });
    return out;
  };
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    CHECK(bit_equal(train(true, Stage{}), train(false, Stage{})));
  });
}

TEST_CASE("a blocking backend: overlap changes nothing and reports itself inactive") {
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, overlap(true));
    e.initialize(toy::initializer());
    for (int t = 0; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    const auto o = e.overlap();
    CHECK(!o.active);
    CHECK(o.prefetches == 0);
    CHECK(o.reduces_started == 0);
  });
}

TEST_CASE("engine_options: prefetch_units and reduces_in_flight are checked") {
  auto message = [](auto change) {
    std::string m;
    zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
      zero::engine_options o;
      change(o);
      try {
        zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, o);
      } catch (const zero::error& e) {
        m = e.what();
      }
    });
    return m;
  };
  CHECK(message([](auto& o) { o.prefetch_units = -1; }) ==
        "rank 0: engine_options: prefetch_units must be >= 0 (0: no prefetch), got -1");
  CHECK(message([](auto& o) { o.reduces_in_flight = 0; }) ==
        "rank 0: engine_options: reduces_in_flight must be >= 1, got 0");
}

TEST_CASE("reduce buckets: consecutive units share one reduce-scatter, the same bits and bytes") {
  const zero::optim::adamw opt;
  const auto ref = toy::reference(3, steps, opt);
  const zero::layout l = zero::layout::make(toy::spec(), 3);
  std::size_t total = 0;
  for (std::size_t u = 0; u < units; ++u) total += l.unit(zero::unit_id{u}).padded;
  zero::stages::for_each([&]<class Stage>() {
    if constexpr (Stage::stage >= 2) {
      for (std::size_t bucket : {std::size_t{1}, std::size_t{100}, std::size_t{500}, total}) {
        CAPTURE(Stage::stage);
        CAPTURE(bucket);
        for (bool on : {true, false}) {
          zero::engine_options o = overlap(on);
          o.reduce_bucket_elements = bucket;
          const auto a = toy::run<Stage, zero::optim::adamw, zero::precision::fp32, deferred>(3, steps, opt, o);
          const auto b = toy::run<Stage, zero::optim::adamw>(3, steps, opt, o);
          CHECK(bit_equal(a.params, ref));
          CHECK(bit_equal(b.params, ref));
          for (const auto& c : b.comm) {
            CHECK(c.last_step.total_bytes() == b.comm_formula);
            const auto calls = c.last_step.calls[static_cast<int>(zero::comm::collective::reduce_scatter)];
            if (bucket == total) CHECK(calls == 1);   // the whole backward in one collective
            if (bucket == 1) CHECK(calls == units);  // every unit fills a bucket of its own
          }
        }
      }
    }
  });
  // Stage 1 fuses only where it reduces buckets: with several reduced micro-batches (test below).
}

TEST_CASE("reduce buckets with micro-batches in stage 1-3: a unit's micro-batches add up in order") {
  auto train = [](std::size_t bucket, auto stage_tag) {
    using Stage = decltype(stage_tag);
    std::vector<float> out;
    zero::comm::threads::launch(2, [&](zero::comm::threads& base) {
      deferred<zero::comm::threads> comm(base);
      zero::engine_options o = overlap(true);
      o.micro_batches = 2;
      o.reduce_bucket_elements = bucket;
      zero::engine<Stage, deferred<zero::comm::threads>, zero::optim::adamw> e(comm, toy::spec(), {}, o);
      e.initialize(toy::initializer());
      const auto base_of = toy::unit_bases(e.spec());
      for (std::uint64_t t = 0; t < 3; ++t) {
        for (int m = 0; m < 2; ++m)
          for (std::size_t u = units; u-- > 0;) {
            const zero::unit_id id{u};
            auto p = e.gather(id);
            auto g = e.grads(id);
            const auto pv = p.view();
            const auto gv = g.view();
            for (std::size_t j = 0; j < pv.size(); ++j)
              gv.data()[j] = toy::gradient(pv.data()[j], comm.rank() * 2 + m, t, base_of[u] + j);
            e.reduce(id);
          }
        e.step();
      }
      if (bucket > 0 && Stage::stage >= 1) CHECK(e.overlap().fused_reduces > 0);
      auto full = e.full_params();
      if (comm.rank() == 0) out = std::move(full);
    });
    return out;
  };
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    const auto plain = train(0, Stage{});
    CHECK(bit_equal(train(1u << 20, Stage{}), plain));  // both micro-batches of every unit in one bucket
    CHECK(bit_equal(train(700, Stage{}), plain));
  });
}

namespace {
// comm::modeled over a link of 20 us and 5 GB/s: a nonblocking backend whose waits are the link's.
template <class C>
struct linked : zero::comm::modeled<C> {
  explicit linked(C& inner) : zero::comm::modeled<C>(inner, zero::comm::link_model::of(20, 5)) {}
};
}  // namespace

TEST_CASE("comm::modeled overlaps: every stage bit-identical to the reference with the link's waits moved") {
  static_assert(zero::comm::nonblocking<zero::comm::modeled<zero::comm::threads>>);
  const zero::optim::adamw opt;
  const auto ref = toy::reference(2, 3, opt);
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    const auto r = toy::run<Stage, zero::optim::adamw, zero::precision::fp32, linked>(2, 3, opt, overlap(true));
    CHECK(bit_equal(r.params, ref));
    for (const auto& c : r.comm) CHECK(c.last_step.total_bytes() == r.comm_formula);
  });
}

// Stage 3 persistent units (engine_options::persist_below_elements). The toy model's units have 407,
// 1, 407 and 150 elements: a threshold of 150 keeps "tiny" and "head" gathered, 1000 keeps them all.
TEST_CASE("stage 3 persistent units: the same bits, memory and traffic equal the formulas") {
  const zero::optim::adamw opt;
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto ref = toy::reference(n, steps, opt);
    const zero::layout l = zero::layout::make(toy::spec(), n);
    for (std::size_t threshold : {std::size_t{1}, std::size_t{150}, std::size_t{1000}}) {
      CAPTURE(threshold);
      std::uint64_t psi_p = 0;  // independent of the engine: the padded elements of the small units
      for (std::size_t u = 0; u < units; ++u)
        if (l.unit(zero::unit_id{u}).numel <= threshold) psi_p += l.unit(zero::unit_id{u}).padded;
      const std::uint64_t psi = l.padded(), N = static_cast<std::uint64_t>(n);
      for (bool on : {true, false}) {
        CAPTURE(on);
        zero::engine_options o = overlap(on);
        o.persist_below_elements = threshold;
        const auto r = toy::run<zero::stage3, zero::optim::adamw, zero::precision::fp32, deferred>(n, steps, opt, o);
        CHECK(bit_equal(r.params, ref));
        CHECK(r.model_state_formula == 16 * psi / N + 4 * psi_p);
        CHECK(r.comm_formula == (3 * (psi - psi_p) + 2 * psi_p) / N * (N - 1) * 4);
        for (std::size_t k = 0; k < r.comm.size(); ++k) {
          CHECK(r.memory[k].model_state_bytes() == r.model_state_formula);
          CHECK(r.memory[k].bytes(zero::mem_category::params) == 4 * (psi / N + psi_p));
          CHECK(r.comm[k].last_step.total_bytes() == r.comm_formula);
        }
      }
    }
  }
}

TEST_CASE("stage 3 persistent units: gathers are views, step() gathers them once, evaluation sends the rest") {
  zero::comm::threads::launch(2, [&](zero::comm::threads& base) {
    deferred<zero::comm::threads> comm(base);
    zero::engine_options o = overlap(true);
    o.persist_below_elements = 150;
    zero::engine<zero::stage3, deferred<zero::comm::threads>, zero::optim::adamw> e(comm, toy::spec(), {}, o);
    e.initialize(toy::range_initializer());  // each rank stores its slice; the persistent units gather the rest
    CHECK(e.persistent(zero::unit_id{1}));
    CHECK(e.persistent(zero::unit_id{3}));
    CHECK(!e.persistent(zero::unit_id{0}));
    const zero::layout& l = e.layout();
    CHECK(e.persistent_elements() == l.unit(zero::unit_id{1}).padded + l.unit(zero::unit_id{3}).padded);
    for (int t = 0; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    const auto ov = e.overlap();
    CHECK(ov.parameter_gathers_started == steps * 2);
    // Prefetch walks the two gathered units only: 2 x 2 - 1 per step after the first, all taken.
    CHECK(ov.prefetches == (steps - 1) * 3);
    CHECK(ov.prefetch_hits == ov.prefetches);
    {
      // The last step left the two persistent units' all-gathers in flight (unit 1's first); a
      // gather(u) waits for its own, and is a view: no traffic.
      auto ev = e.evaluation();
      CHECK(comm.pending() == 2);
      e.gather(zero::unit_id{1}).release();
      CHECK(comm.pending() == 1);
      e.gather(zero::unit_id{3}).release();
      CHECK(comm.pending() == 0);
      CHECK(e.comm().evaluation.total_bytes() == 0);
      e.gather(zero::unit_id{0}).release();
      e.gather(zero::unit_id{2}).release();
    }
    CHECK(e.comm().evaluation.total_bytes() == e.eval_comm_formula_bytes());
    const std::uint64_t gathered = l.unit(zero::unit_id{0}).padded + l.unit(zero::unit_id{2}).padded;
    CHECK(e.eval_comm_formula_bytes() == gathered / 2 * 4);
  });
}

TEST_CASE("stage 3 persistent units after a load: the copies are refreshed from the loaded shards") {
  // Engine a trains 2 steps; engine b (persistent units) takes a's state through read_state/write_state
  // and finish_load; both train 2 more steps: the same bits.
  std::vector<float> pa, pb;
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    zero::engine_options o;
    o.persist_below_elements = 1000;
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> a(comm, toy::spec(), {}, {});
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> b(comm, toy::spec(), {}, o);
    a.initialize(toy::initializer());
    for (std::uint64_t t = 0; t < 2; ++t) toy::train_step(a, comm.rank(), t);
    for (std::size_t u = 0; u < units; ++u) {
      const zero::range h = a.held_range(zero::unit_id{u});
      std::vector<float> master(h.size()), m1(h.size()), m2(h.size());
      float* slots[] = {m1.data(), m2.data()};
      a.read_state(zero::unit_id{u}, h, master.data(), slots);
      const float* in[] = {m1.data(), m2.data()};
      b.write_state(zero::unit_id{u}, h, master.data(), in);
    }
    b.finish_load(a.state());
    for (std::uint64_t t = 2; t < 4; ++t) {
      toy::train_step(a, comm.rank(), t);
      toy::train_step(b, comm.rank(), t);
    }
    auto fa = a.full_params();
    auto fb = b.full_params();
    if (comm.rank() == 0) {
      pa = std::move(fa);
      pb = std::move(fb);
    }
  });
  CHECK(bit_equal(pa, pb));
  CHECK(bit_equal(pa, toy::reference(3, 4, zero::optim::adamw{})));
}

TEST_CASE("stage 3 persistent units and ZeRO++ are refused together, naming both") {
  std::string m;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine_options o;
    o.persist_below_elements = 150;
    o.zeropp.qwz = true;
    try {
      zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, o);
    } catch (const zero::error& e) {
      if (comm.rank() == 0) m = e.what();
    }
  });
  CHECK(m.find("rank 0: engine_options: persist_below_elements") == 0);
  CHECK(m.find("ZeRO++") != std::string::npos);
}

namespace {
// comm::verified over the deferred backend, built from the rank's threads communicator.
struct deferred_member {
  explicit deferred_member(zero::comm::threads& t) : backend(t) {}
  deferred<zero::comm::threads> backend;
};
class verified_deferred : private deferred_member, public zero::comm::verified<deferred<zero::comm::threads>> {
 public:
  explicit verified_deferred(zero::comm::threads& t)
      : deferred_member(t), zero::comm::verified<deferred<zero::comm::threads>>(backend) {}
};
static_assert(zero::comm::check_nonblocking<verified_deferred>());
template <class>
using over_verified_deferred = verified_deferred;
}  // namespace

TEST_CASE("comm::verified over a nonblocking backend: stage 3 with reduces and prefetches in flight, the same bits") {
  const auto ref = toy::run<zero::stage3, zero::optim::adamw>(3, steps, {});
  const auto r = toy::run<zero::stage3, zero::optim::adamw, zero::precision::fp32, over_verified_deferred>(
      3, steps, {}, overlap(true));
  CHECK(bit_equal(r.params, ref.params));
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(r.comm[k].protocol.bytes == ref.comm[k].protocol.bytes);  // verification's own traffic is not counted
  }
}

namespace {
zero::engine_options gather_buckets(std::size_t elements, bool overlap_on) {
  zero::engine_options o = overlap(overlap_on);
  o.gather_bucket_elements = elements;
  return o;
}
std::uint64_t all_gathers(const zero::comm::comm_stats& s) {
  return s.calls[static_cast<std::size_t>(zero::comm::collective::all_gather)];
}
}  // namespace

TEST_CASE("stage 3 gather buckets: the reference's bits, the formula's bytes, with and without overlap") {
  const zero::optim::adamw opt;
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto ref = toy::reference(n, steps, opt);
    for (std::size_t budget : {std::size_t{1000}, std::size_t{1} << 20}) {
      CAPTURE(budget);
      const auto a = toy::run<zero::stage3, zero::optim::adamw>(n, steps, opt, gather_buckets(budget, false));
      const auto b = toy::run<zero::stage3, zero::optim::adamw, zero::precision::fp32, deferred>(
          n, steps, opt, gather_buckets(budget, true));
      CHECK(bit_equal(a.params, ref));
      CHECK(bit_equal(b.params, ref));
      for (const auto& c : a.comm) CHECK(c.last_step.total_bytes() == a.comm_formula);
      for (const auto& c : b.comm) CHECK(c.last_step.total_bytes() == b.comm_formula);
    }
  }
}

// The toy's units padded at N = 2 (multiples of 64): 448, 64, 448, 192. With a budget of 1000 the
// recorded order 0 1 2 3 | 3 2 1 0 gathers {0 1 2}, {3}, {3 2 1}, {0}: 4 all-gathers instead of 8, two
// of them buckets whose 4 further units are taken by their gather(u) (prefetch hits).
TEST_CASE("stage 3 gather buckets: the units the order gathers next, within the budget, in one all-gather") {
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {},
                                                                         gather_buckets(1000, false));
    e.initialize(toy::initializer());
    toy::train_step(e, comm.rank(), 0);
    CHECK(all_gathers(e.comm().last_step) == 2 * units);  // the first step records the order: unit by unit
    CHECK(e.overlap().gather_buckets == 0);
    for (int t = 1; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    CHECK(all_gathers(e.comm().last_step) == 4);
    const auto o = e.overlap();
    CHECK(!o.active);  // no overlap on threads: the buckets are the gathers' own
    CHECK(o.gather_buckets == (steps - 1) * 2);
    CHECK(o.prefetches == (steps - 1) * 4);
    CHECK(o.prefetch_hits == o.prefetches);
    CHECK(o.prefetch_misses == 0);
    CHECK(e.memory().bytes(zero::mem_category::transient) == 0);  // every bucket's buffers and wire freed
  });
}

TEST_CASE("stage 3 gather buckets: 100 small units gather in two all-gathers per step, the same bits") {
  zero::model_spec s;
  for (int u = 0; u < 100; ++u) s.unit("layer " + std::to_string(u)).tensor("w", {10});
  const auto init = [](const zero::unit_spec& u, const zero::tensor_spec&, std::span<float> v) {
    const auto k = static_cast<float>(std::stoi(u.name.substr(6)));
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = 0.01f * k - 0.001f * static_cast<float>(j);
  };
  std::vector<std::vector<float>> params(2);
  for (std::size_t budget : {std::size_t{0}, std::size_t{1} << 20}) {
    zero::comm::threads::launch(4, [&](zero::comm::threads& comm) {
      zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, s, {}, gather_buckets(budget, false));
      e.initialize(init);
      for (std::uint64_t t = 0; t < 3; ++t) {
        for (std::size_t u = 0; u < 100; ++u) e.gather(zero::unit_id{u}).release();
        for (std::size_t u = 100; u-- > 0;) {
          auto p = e.gather(zero::unit_id{u});
          auto g = e.grads(zero::unit_id{u});
          for (std::size_t j = 0; j < 10; ++j)
            g.view().data()[j] = toy::gradient(p.view().data()[j], comm.rank(), t, u * 10 + j);
          e.reduce(zero::unit_id{u});
        }
        e.step();
      }
      CHECK(all_gathers(e.comm().last_step) == (budget == 0 ? 200 : 2));
      auto full = e.full_params();
      if (comm.rank() == 0) params[budget == 0 ? 0 : 1] = std::move(full);
    });
  }
  CHECK(bit_equal(params[0], params[1]));
}

TEST_CASE("stage 3 gather buckets: max_live_parameters bounds a bucket; with qwZ or hpZ it is refused") {
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine_options o = gather_buckets(1 << 20, false);
    o.max_live_parameters = 600;  // the toy's units at N = 2: 448, 64, 448, 192
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, o);
    e.initialize(toy::initializer());
    for (int t = 0; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    // {0 1}, {2}, {3}, {3}, {2 1}, {0}: a bucket never holds more than 600 elements live.
    CHECK(all_gathers(e.comm().last_step) == 6);
    CHECK(e.overlap().gather_buckets == 2 * 2);
  });
  std::string m;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine_options o = gather_buckets(1000, false);
    o.zeropp.qwz = true;
    try {
      zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, o);
    } catch (const zero::error& e) {
      if (comm.rank() == 0) m = e.what();
    }
  });
  CHECK(m.find("rank 0: engine_options: gather_bucket_elements") == 0);
  CHECK(m.find("qwz") != std::string::npos);
}
