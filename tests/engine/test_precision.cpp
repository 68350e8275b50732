// Mixed precision: bf16/fp16 stage equivalence, K = 12 memory, loss scaling, overflow skips, clipping, accumulation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "../toy_model.hpp"

namespace {

using adamw = zero::optim::adamw;

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Single-process reference for a precision policy: parameters are the master rounded to the
// parameter type; each rank's gradient of the scaled loss is rounded to the gradient type; the N of
// them are summed in fp32 in rank order and rounded once; the optimizer sees sum / (N x scale).
template <class Prec>
std::vector<float> reference(int n, int steps, adamw opt, float scale) {
  using G = typename Prec::grad_type;
  using Pt = typename Prec::param_type;
  const zero::model_spec s = toy::spec();
  std::vector<float> w(s.numel()), m(w.size(), 0.0f), v(w.size(), 0.0f);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = toy::initial(i);  // the master starts unrounded
  const float divisor = static_cast<float>(n) * scale;
  for (int t = 0; t < steps; ++t) {
    const auto c = opt.constants(static_cast<std::uint64_t>(t) + 1);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float p = static_cast<float>(static_cast<Pt>(w[i]));
      float acc = static_cast<float>(static_cast<G>(toy::gradient(p, 0, static_cast<std::uint64_t>(t), i) * scale));
      for (int r = 1; r < n; ++r)
        acc += static_cast<float>(static_cast<G>(toy::gradient(p, r, static_cast<std::uint64_t>(t), i) * scale));
      const float g = static_cast<float>(static_cast<G>(acc)) / divisor;
      float st[2] = {m[i], v[i]};
      adamw::update(c, w[i], g, st);
      m[i] = st[0];
      v[i] = st[1];
    }
  }
  return w;
}

// The toy gradients reach 0.9; summed over 4 ranks they must stay below fp16's 65504 once scaled.
zero::engine_options toy_scale() {
  zero::engine_options o;
  o.loss_scale.initial = 1024.0f;
  return o;
}

template <class Prec>
void check_stages_against_reference() {
  adamw opt;
  opt.lr = 3e-3f;
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    const float scale = Prec::loss_scaling ? toy_scale().loss_scale.initial : 1.0f;
    const auto ref = reference<Prec>(n, 20, opt, scale);
    const auto s0 = toy::run<zero::stage0, adamw, Prec>(n, 20, opt, toy_scale());
    const auto s1 = toy::run<zero::stage1, adamw, Prec>(n, 20, opt, toy_scale());
    const auto s2 = toy::run<zero::stage2, adamw, Prec>(n, 20, opt, toy_scale());
    const auto s3 = toy::run<zero::stage3, adamw, Prec>(n, 20, opt, toy_scale());
    CHECK(bit_equal(s0.params, ref));
    CHECK(bit_equal(s1.params, ref));
    CHECK(bit_equal(s2.params, ref));
    CHECK(bit_equal(s3.params, ref));
    // The norm is computed every step and is the same double on every rank and in every stage.
    for (int r = 0; r < n; ++r)
      for (std::size_t t = 0; t < 20; ++t) {
        const double g0 = s0.reports[0][t].grad_norm;
        CHECK(std::isfinite(g0));
        CHECK(s1.reports[static_cast<std::size_t>(r)][t].grad_norm == g0);
        CHECK(s2.reports[static_cast<std::size_t>(r)][t].grad_norm == g0);
        CHECK(s3.reports[static_cast<std::size_t>(r)][t].grad_norm == g0);
        CHECK_FALSE(s3.reports[static_cast<std::size_t>(r)][t].skipped);
      }
  }
}

}  // namespace

TEST_CASE("bf16: stages 0-3 are bit-identical to the fp32-accumulating reference") {
  check_stages_against_reference<zero::precision::bf16>();
}

TEST_CASE("fp16 with a loss scale: stages 0-3 are bit-identical to the reference") {
  check_stages_against_reference<zero::precision::fp16>();
}

TEST_CASE_TEMPLATE("model-state bytes equal the K = 12 formulas for 2-byte precisions", Prec, zero::precision::bf16,
                   zero::precision::fp16) {
  for (int n : {1, 2, 4, 8}) {
    CAPTURE(n);
    const auto N = static_cast<std::uint64_t>(n);
    auto bytes = [](const toy::run_result& r) { return r.memory[0].model_state_bytes(); };
    const auto s0 = toy::run<zero::stage0, adamw, Prec>(n, 1, {});
    const std::uint64_t psi = s0.padded;
    CHECK(bytes(s0) == 16 * psi);
    CHECK(bytes(toy::run<zero::stage1, adamw, Prec>(n, 1, {})) == 4 * psi + 12 * psi / N);
    CHECK(bytes(toy::run<zero::stage2, adamw, Prec>(n, 1, {})) == 2 * psi + 14 * psi / N);
    CHECK(bytes(toy::run<zero::stage3, adamw, Prec>(n, 1, {})) == 16 * psi / N);
    // An fp32 gradient shard costs 2 Psi/N more, and the engine's formula says so.
    zero::engine_options o;
    o.fp32_grad_accumulation = true;
    const auto s2 = toy::run<zero::stage2, adamw, Prec>(n, 1, {}, o);
    CHECK(bytes(s2) == 2 * psi + 16 * psi / N);
    CHECK(s2.model_state_formula == bytes(s2));
    const auto s3 = toy::run<zero::stage3, adamw, Prec>(n, 1, {}, o);
    CHECK(bytes(s3) == 18 * psi / N);
    CHECK(s3.model_state_formula == bytes(s3));
    // Bytes are counted in the type actually sent: 2 per element.
    const auto two_steps = toy::run<zero::stage3, adamw, Prec>(n, 2, {});
    const auto& c = two_steps.comm[0];
    CHECK(c.last_step.total_bytes() == 3 * psi * (N - 1) / N * 2);
    // One all-reduce per step: the norm's 8 bytes and the optimizer's fingerprint (64 bytes).
    CHECK(c.control.total_bytes() == 2 * (2 * (N - 1) * 72 / N));
  }
}

TEST_CASE("loss_scaler: growth after the interval, halving after `hysteresis` overflows, bounds") {
  zero::loss_scale_options o;
  o.initial = 1024.0f;
  o.growth_interval = 3;
  o.hysteresis = 2;
  o.min_scale = 256.0f;
  o.max_scale = 4096.0f;
  zero::loss_scaler s(o);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 1024.0f);
  s.update(false);
  CHECK(s.scale() == 2048.0f);  // 3 clean steps
  CHECK(s.clean_steps() == 0);
  s.update(true);
  CHECK(s.scale() == 2048.0f);  // first overflow: hysteresis absorbs it
  CHECK(s.hysteresis_left() == 1);
  s.update(true);
  CHECK(s.scale() == 1024.0f);  // second: halved
  CHECK(s.hysteresis_left() == 2);
  for (int i = 0; i < 6; ++i) s.update(true);
  CHECK(s.scale() == 256.0f);  // not below min_scale
  for (int i = 0; i < 30; ++i) s.update(false);
  CHECK(s.scale() == 4096.0f);  // not above max_scale
  zero::loss_scale_options fixed = o;
  fixed.dynamic = false;
  zero::loss_scaler st(fixed);
  st.update(true);
  st.update(true);
  CHECK(st.scale() == 1024.0f);
  o.min_scale = 2048.0f;
  CHECK_THROWS_AS(zero::loss_scaler{o}, zero::error);
}

TEST_CASE_TEMPLATE("an Inf on one rank makes every rank skip the same step and update the scale alike", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  const int n = 4;
  std::vector<std::vector<zero::step_report>> reports(n);
  std::vector<std::vector<float>> before(n), after(n);
  std::vector<zero::training_state> states(n);
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, adamw, zero::precision::fp16> e(comm, toy::spec(), adamw{}, toy_scale());
    e.initialize(toy::initializer());
    const auto r = static_cast<std::size_t>(comm.rank());
    reports[r].push_back(toy::train_step(e, comm.rank(), 0));
    before[r] = e.full_params();
    for (int bad = 0; bad < 2; ++bad) {  // two poisoned steps: the second halves the scale (hysteresis 2)
      for (std::size_t u = e.spec().num_units(); u-- > 0;) {
        auto g = e.grads(zero::unit_id{u});
        if (comm.rank() == 2 && u == 1) g["scale"][0] = zero::fp16(INFINITY);
        e.reduce(zero::unit_id{u});
      }
      reports[r].push_back(e.step());
    }
    after[r] = e.full_params();
    states[r] = e.state();
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    const auto& rep = reports[static_cast<std::size_t>(r)];
    CHECK_FALSE(rep[0].skipped);
    CHECK(rep[1].skipped);
    CHECK(rep[2].skipped);
    CHECK(rep[1].loss_scale == 1024.0f);
    CHECK(rep[2].loss_scale == 1024.0f);
    CHECK(rep[2].step == 1);  // skipped steps do not advance the optimizer
    CHECK(bit_equal(after[static_cast<std::size_t>(r)], before[static_cast<std::size_t>(r)]));
    CHECK(states[static_cast<std::size_t>(r)].loss_scale == 512.0f);
    CHECK(states[static_cast<std::size_t>(r)].skipped_steps == 2);
  }
}

TEST_CASE("clipping: the global norm equals the single-process norm and the clipped result is stage-independent") {
  const int n = 4;
  adamw opt;
  zero::engine_options o;
  o.clip_norm = 0.05f;  // below the toy model's gradient norm, so every step clips
  const auto s0 = toy::run<zero::stage0, adamw>(n, 5, opt, o);
  const auto s1 = toy::run<zero::stage1, adamw>(n, 5, opt, o);
  const auto s2 = toy::run<zero::stage2, adamw>(n, 5, opt, o);
  const auto s3 = toy::run<zero::stage3, adamw>(n, 5, opt, o);
  CHECK(bit_equal(s0.params, s3.params));
  CHECK(bit_equal(s1.params, s3.params));
  CHECK(bit_equal(s2.params, s3.params));
  const auto unclipped = toy::run<zero::stage3, adamw>(n, 5, opt);
  CHECK_FALSE(bit_equal(unclipped.params, s3.params));

  // The first step's norm, recomputed in one process in double from the full averaged gradient.
  const zero::model_spec s = toy::spec();
  double sq = 0.0;
  for (std::size_t i = 0; i < s.numel(); ++i) {
    float acc = toy::gradient(toy::initial(i), 0, 0, i);
    for (int r = 1; r < n; ++r) acc += toy::gradient(toy::initial(i), r, 0, i);
    const double g = static_cast<double>(acc) / n;
    sq += g * g;
  }
  const double expected = std::sqrt(sq);
  CHECK(expected > 0.05);
  for (int r = 0; r < n; ++r) {
    const double got = s3.reports[static_cast<std::size_t>(r)][0].grad_norm;
    CHECK(std::abs(got - expected) <= 1e-6 * expected);
    CHECK(got == s0.reports[0][0].grad_norm);
  }
}

namespace {

// One step of M micro-batches on this rank: micro-batch k's gradient is toy::gradient at step t*M+k.
template <class Engine>
void micro_batch_step(Engine& e, int rank, int t, int m, bool local) {
  const auto& s = e.spec();
  const auto base = toy::unit_bases(s);
  for (int k = 0; k < m; ++k) {
    for (std::size_t u = s.num_units(); u-- > 0;) {
      const zero::unit_id id{u};
      auto p = e.gather(id);
      auto g = e.grads(id);
      const auto pv = p.view();
      const auto gv = g.view();
      const auto mt = static_cast<std::uint64_t>(t * m + k);
      for (std::size_t j = 0; j < pv.size(); ++j)
        gv.data()[j] += toy::gradient(pv.data()[j], rank, mt, base[u] + j);  // accumulate in place
      if (!local || k + 1 == m) e.reduce(id);
    }
  }
  e.step();
}

template <class Stage>
std::vector<float> run_accumulated(int n, int m, zero::accumulation policy, int steps) {
  std::vector<float> out;
  zero::engine_options o;
  o.micro_batches = m;
  o.accumulate = policy;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, adamw> e(comm, toy::spec(), adamw{}, o);
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t)
      micro_batch_step(e, comm.rank(), t, m, policy == zero::accumulation::local_then_reduce);
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

// The single-process order of reduce_each_micro_batch: per micro-batch, the rank-ordered sum; the
// micro-batch sums added in order; then / N.
std::vector<float> reduce_each_reference(int n, int m, int steps) {
  const zero::model_spec s = toy::spec();
  std::vector<float> w(s.numel()), mo(w.size(), 0.0f), v(w.size(), 0.0f);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = toy::initial(i);
  adamw opt;
  for (int t = 0; t < steps; ++t) {
    const auto c = opt.constants(static_cast<std::uint64_t>(t) + 1);
    for (std::size_t i = 0; i < w.size(); ++i) {
      float total = 0.0f;
      for (int k = 0; k < m; ++k) {
        const auto mt = static_cast<std::uint64_t>(t * m + k);
        float acc = toy::gradient(w[i], 0, mt, i);
        for (int r = 1; r < n; ++r) acc += toy::gradient(w[i], r, mt, i);
        total = k == 0 ? acc : total + acc;
      }
      float st[2] = {mo[i], v[i]};
      adamw::update(c, w[i], total / static_cast<float>(n), st);
      mo[i] = st[0];
      v[i] = st[1];
    }
  }
  return w;
}

}  // namespace

TEST_CASE("accumulation: reduce_each_micro_batch is stage-independent and equals its reference") {
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    const auto ref = reduce_each_reference(n, 3, 4);
    CHECK(bit_equal(run_accumulated<zero::stage0>(n, 3, zero::accumulation::reduce_each_micro_batch, 4), ref));
    CHECK(bit_equal(run_accumulated<zero::stage1>(n, 3, zero::accumulation::reduce_each_micro_batch, 4), ref));
    CHECK(bit_equal(run_accumulated<zero::stage2>(n, 3, zero::accumulation::reduce_each_micro_batch, 4), ref));
    CHECK(bit_equal(run_accumulated<zero::stage3>(n, 3, zero::accumulation::reduce_each_micro_batch, 4), ref));
  }
}

TEST_CASE("accumulation: local_then_reduce over M micro-batches equals one batch summed in the same order") {
  const int n = 4, m = 3, steps = 4;
  const auto s0 = run_accumulated<zero::stage0>(n, m, zero::accumulation::local_then_reduce, steps);
  const auto s1 = run_accumulated<zero::stage1>(n, m, zero::accumulation::local_then_reduce, steps);
  CHECK(bit_equal(s0, s1));
  // The same gradients written by one "big batch" step per rank: acc = g_0 + g_1 + g_2, reduced once.
  std::vector<float> big;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    const auto& s = e.spec();
    const auto base = toy::unit_bases(s);
    for (int t = 0; t < steps; ++t) {
      for (std::size_t u = s.num_units(); u-- > 0;) {
        auto p = e.gather(zero::unit_id{u});
        auto g = e.grads(zero::unit_id{u});
        for (std::size_t j = 0; j < p.view().size(); ++j) {
          float acc = 0.0f;
          for (int k = 0; k < m; ++k)
            acc += toy::gradient(p.view().data()[j], comm.rank(), static_cast<std::uint64_t>(t * m + k), base[u] + j);
          g.view().data()[j] = acc;
        }
        e.reduce(zero::unit_id{u});
      }
      e.step();
    }
    auto p = e.full_params();
    if (comm.rank() == 0) big = std::move(p);
  });
  CHECK(bit_equal(s0, big));
}

TEST_CASE("accumulation settings that cannot work are refused") {
  zero::engine_options local;
  local.accumulate = zero::accumulation::local_then_reduce;
  CHECK_THROWS_WITH_AS((toy::run<zero::stage2, adamw>(1, 1, {}, local)),
                       doctest::Contains("ZeRO stage 2 shards gradients, so use reduce_each_micro_batch"), zero::error);
  zero::engine_options fp32acc;
  fp32acc.fp32_grad_accumulation = true;
  CHECK_THROWS_WITH_AS((toy::run<zero::stage1, adamw>(1, 1, {}, fp32acc)),
                       doctest::Contains("fp32_grad_accumulation applies to the gradient shard of stages 2 and 3"),
                       zero::error);
  zero::engine_options zero_mb;
  zero_mb.micro_batches = 0;
  CHECK_THROWS_AS((toy::run<zero::stage0, adamw>(1, 1, {}, zero_mb)), zero::error);
  // Stepping after 2 of 3 micro-batch reduces names the count.
  zero::engine_options three;
  three.micro_batches = 3;
  CHECK_THROWS_WITH_AS(zero::comm::threads::launch(1,
                                                   [&](zero::comm::threads& comm) {
                                                     zero::engine<zero::stage2, zero::comm::threads, adamw> e(
                                                         comm, toy::spec(), adamw{}, three);
                                                     for (std::size_t u = 0; u < 4; ++u) {
                                                       e.reduce(zero::unit_id{u});
                                                       e.reduce(zero::unit_id{u});
                                                     }
                                                     e.step();
                                                   }),
                       doctest::Contains("(this one was not: 2 of 3 micro-batch reduces)"), zero::error);
}

namespace {

// fp16 training of w toward a target with gradients of magnitude `size`; returns the master weights
// after `steps` steps and the number of skipped steps.
std::pair<std::vector<float>, std::uint64_t> fp16_train(float size, zero::loss_scale_options ls, int steps) {
  zero::model_spec spec;
  spec.unit("u").tensor("w", {64});
  zero::engine_options o;
  o.loss_scale = ls;
  std::vector<float> out;
  std::uint64_t skipped = 0;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::optim::adamw opt;
    opt.weight_decay = 0.0f;
    zero::engine<zero::stage2, zero::comm::threads, zero::optim::adamw, zero::precision::fp16> e(comm, spec, opt, o);
    for (int t = 0; t < steps; ++t) {
      auto g = e.grads(zero::unit_id{0});
      for (auto& x : g["w"]) x = zero::fp16(size * e.loss_scale());
      e.reduce(zero::unit_id{0});
      const bool skip = e.step().skipped;
      if (comm.rank() == 0 && skip) ++skipped;
    }
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  return {out, skipped};
}

}  // namespace

TEST_CASE("fp16: gradients that vanish without a loss scale train with one") {
  zero::loss_scale_options none;
  none.dynamic = false;
  none.initial = 1.0f;
  const auto [unscaled, s0] = fp16_train(1e-8f, none, 5);  // below fp16's smallest subnormal: flushed to 0
  for (float w : unscaled) CHECK(w == 0.0f);
  const auto [scaled, s1] = fp16_train(1e-8f, zero::loss_scale_options{}, 5);
  CHECK(s1 == 0);
  for (float w : scaled) CHECK(w < -1e-4f);  // Adam moves each weight by about lr per step
}

TEST_CASE("fp16: a scale that overflows is halved until training proceeds; a static one skips forever") {
  zero::loss_scale_options high;
  high.initial = 16777216.0f;  // 2^24 x 0.5 = 8e6 > 65504: every step overflows at first
  const auto [dyn, skipped] = fp16_train(0.5f, high, 30);
  // Halved every 2 overflows until the two ranks' sum, 2 x 0.5 x scale, fits: 2^24 -> 2^15 is 9 halvings.
  CHECK(skipped == 18);
  for (float w : dyn) CHECK(w < -1e-3f);
  high.dynamic = false;
  const auto [stat, all] = fp16_train(0.5f, high, 30);
  CHECK(all == 30);
  for (float w : stat) CHECK(w == 0.0f);
}
