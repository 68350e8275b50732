// Shared (tied) units and evaluation scopes: a tied embedding's gathers counted by the formulas, stages bit-identical, forward-only passes reported apart.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../engine_instances.hpp"
#include "zero/zero.hpp"

namespace {

constexpr std::size_t V = 7, C = 5;  // vocabulary, width: awkward sizes, padded differently for each N

// A tied embedding: `embed` maps a token to a row (input) and, as the output head, the hidden state
// to V logits (the same tensor, gathered twice per pass); `mix` is a dense layer between them.
zero::model_spec tied_spec(int embed_gathers = 2) {
  zero::model_spec s;
  s.unit("embed").tensor("w", {V, C}).gathers(embed_gathers);
  s.unit("mix").tensor("w", {C, C}).tensor("b", {C});
  return s;
}
constexpr zero::unit_id embed{0}, mix{1};

float initial(std::size_t unit, std::size_t i) {
  return 0.3f * std::sin(0.7f * static_cast<float>(i) + 1.3f * static_cast<float>(unit));
}
zero::init_fn initializer() {
  return [](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
    const std::size_t unit = u.name == "embed" ? 0 : (t.name == "w" ? 1 : 2);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial(unit, j);
  };
}

// A unit's parameters (or gradients) widened to fp32, and the way back (rounded once).
template <class T>
std::vector<float> widen(const T* p, std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
  return out;
}
template <class View>
void add_into(const View& g, const std::vector<float>& d, std::size_t offset = 0) {
  using G = std::remove_cvref_t<decltype(*g.data())>;
  for (std::size_t i = 0; i < d.size(); ++i)
    g.data()[offset + i] = static_cast<G>(static_cast<float>(g.data()[offset + i]) + d[i]);
}

struct activations {
  std::size_t token = 0;
  std::vector<float> h, z, logits;
};

// Forward: h = E[token]; z = W h + b; logits = E z. The embedding is gathered twice.
template <class Engine>
void forward(Engine& e, activations& a) {
  {
    auto p = e.gather(embed);
    const auto w = widen(p["w"].data(), V * C);
    a.h.assign(w.begin() + static_cast<std::ptrdiff_t>(a.token * C), w.begin() + static_cast<std::ptrdiff_t>((a.token + 1) * C));
  }
  {
    auto p = e.gather(mix);
    const auto w = widen(p["w"].data(), C * C), b = widen(p["b"].data(), C);
    a.z.assign(C, 0.0f);
    for (std::size_t i = 0; i < C; ++i) {
      float acc = b[i];
      for (std::size_t j = 0; j < C; ++j) acc += w[i * C + j] * a.h[j];
      a.z[i] = acc;
    }
  }
  {
    auto p = e.gather(embed);  // the output head: the tied weight again
    const auto w = widen(p["w"].data(), V * C);
    a.logits.assign(V, 0.0f);
    for (std::size_t v = 0; v < V; ++v)
      for (std::size_t j = 0; j < C; ++j) a.logits[v] += w[v * C + j] * a.z[j];
  }
}

// Backward of loss = 0.5 |logits - target|^2 (times the loss scale), units in reverse. The tied
// weight's gradient comes from the head (first) and the input (last), written into the same
// grads(embed) buffer, which is reduced once, after both.
template <class Engine>
void backward(Engine& e, const activations& a, const std::vector<float>& target) {
  const float scale = e.loss_scale();
  std::vector<float> dlogits(V), dz(C, 0.0f), dh(C, 0.0f);
  for (std::size_t v = 0; v < V; ++v) dlogits[v] = (a.logits[v] - target[v]) * scale;
  {
    auto p = e.gather(embed);
    auto g = e.grads(embed);
    const auto w = widen(p["w"].data(), V * C);
    std::vector<float> dw(V * C);
    for (std::size_t v = 0; v < V; ++v)
      for (std::size_t j = 0; j < C; ++j) {
        dw[v * C + j] = dlogits[v] * a.z[j];
        dz[j] += w[v * C + j] * dlogits[v];
      }
    add_into(g["w"], dw);
  }
  {
    auto p = e.gather(mix);
    auto g = e.grads(mix);
    const auto w = widen(p["w"].data(), C * C);
    std::vector<float> dw(C * C);
    for (std::size_t i = 0; i < C; ++i)
      for (std::size_t j = 0; j < C; ++j) {
        dw[i * C + j] = dz[i] * a.h[j];
        dh[j] += w[i * C + j] * dz[i];
      }
    add_into(g["w"], dw);
    add_into(g["b"], dz);
    e.reduce(mix);
  }
  {
    auto p = e.gather(embed);
    auto g = e.grads(embed);
    add_into(g["w"], dh, a.token * C);
    e.reduce(embed);
  }
}

// This rank's sample of micro-batch m of step t.
activations sample(int rank, std::uint64_t t, int m) {
  activations a;
  a.token = (static_cast<std::size_t>(rank) * 3 + static_cast<std::size_t>(t) * 2 + static_cast<std::size_t>(m)) % V;
  return a;
}
std::vector<float> target_of(int rank, std::uint64_t t, int m) {
  std::vector<float> y(V);
  for (std::size_t v = 0; v < V; ++v) y[v] = std::cos(static_cast<float>(v + 2 * rank + m) + 0.5f * static_cast<float>(t));
  return y;
}

// Forward-only passes on held-out tokens, inside an evaluation scope.
template <class Engine>
void evaluate(Engine& e, int passes) {
  auto ev = e.evaluation();
  for (int k = 0; k < passes; ++k) {
    activations a;
    a.token = static_cast<std::size_t>(k + e.rank()) % V;
    forward(e, a);
  }
}

struct run_result {
  std::vector<std::uint32_t> bits;  // rank 0's full_params() at the end, as bits
  std::vector<std::uint64_t> formula, eval_formula, measured, evaluation, transient_peak;  // per rank
  std::vector<std::uint64_t> plan_peak, plan_bytes;
  std::uint64_t embed_padded = 0, padded = 0;
  std::vector<int> eval_left_params_unchanged;  // per rank: full_params() equal before and after each scope
};

// `steps` steps of the tied model on N thread ranks; `eval_passes` forward-only passes inside an
// evaluation scope before every step but the first (0: none).
template <class Stage, class Prec>
run_result run(int n, int steps, int micro_batches, int eval_passes) {
  run_result res;
  const auto ranks = static_cast<std::size_t>(n);
  for (auto* v : {&res.formula, &res.eval_formula, &res.measured, &res.evaluation, &res.transient_peak})
    v->assign(ranks, 0);
  res.eval_left_params_unchanged.assign(ranks, 1);
  const zero::model_spec spec = tied_spec();
  zero::engine_options options;
  options.micro_batches = micro_batches;
  const auto plan = zero::plan_for<Stage, zero::optim::adamw, Prec>(spec, n, options);
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, zero::optim::adamw, Prec> e(comm, spec, {}, options);
    e.initialize(initializer());
    const int rank = comm.rank();
    const auto r = static_cast<std::size_t>(rank);
    for (int t = 0; t < steps; ++t) {
      if (t > 0 && eval_passes > 0) {
        const auto before = e.full_params();
        evaluate(e, eval_passes);
        if (e.full_params() != before) res.eval_left_params_unchanged[r] = 0;
      }
      for (int m = 0; m < micro_batches; ++m) {
        activations a = sample(rank, static_cast<std::uint64_t>(t), m);
        forward(e, a);
        backward(e, a, target_of(rank, static_cast<std::uint64_t>(t), m));
      }
      const auto report = e.step();
      // Every step's traffic, not only the last: an evaluation before it must not leak in.
      CHECK(report.comm.total_bytes() == e.comm_formula_bytes());
    }
    res.formula[r] = e.comm_formula_bytes();
    res.eval_formula[r] = e.eval_comm_formula_bytes();
    res.measured[r] = e.comm().last_step.total_bytes();
    res.evaluation[r] = e.comm().evaluation.total_bytes();
    res.transient_peak[r] = e.memory().peak_bytes(zero::mem_category::transient);
    auto full = e.full_params();
    if (rank == 0) {
      for (float x : full) res.bits.push_back(std::bit_cast<std::uint32_t>(x));
      res.embed_padded = e.layout().unit(embed).padded;
      res.padded = e.layout().padded();
    }
  });
  res.plan_peak.assign(1, plan.step_transient_peak);
  res.plan_bytes.assign(1, plan.step_bytes_sent());
  return res;
}

// Independent of zero::formula: stage 3 all-gathers every unit once per pass and the embedding once
// more, in forward and backward of every micro-batch, and reduce-scatters once per micro-batch; the
// other stages send the paper's 2M (stage 0) or M + 1 (stages 1-2) passes of Psi.
std::uint64_t expected_step_bytes(int stage, std::uint64_t psi, std::uint64_t embed_padded, std::uint64_t n,
                                  std::uint64_t m, std::uint64_t elem) {
  switch (stage) {
    case 0: return 2 * m * psi * (n - 1) / n * elem;
    case 1:
    case 2: return (m + 1) * psi * (n - 1) / n * elem;
    default: return (3 * m * psi + 2 * m * embed_padded) * (n - 1) / n * elem;
  }
}

template <class Prec>
void check_stages(int n, int micro_batches) {
  constexpr int steps = 3;
  std::vector<std::uint32_t> first;
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    const auto res = run<Stage, Prec>(n, steps, micro_batches, 0);
    if (Stage::stage == 0) first = res.bits;
    CHECK(res.bits == first);  // bit-identical to stage 0
    const std::uint64_t elem = sizeof(typename Prec::comm_type);
    const std::uint64_t want = expected_step_bytes(Stage::stage, res.padded, res.embed_padded,
                                                   static_cast<std::uint64_t>(n),
                                                   static_cast<std::uint64_t>(micro_batches), elem);
    CHECK(res.plan_bytes[0] == want);
    for (std::size_t r = 0; r < res.formula.size(); ++r) {
      CAPTURE(r);
      CHECK(res.formula[r] == want);
      CHECK(res.measured[r] == want);
      CHECK(res.evaluation[r] == 0);
      // The tied bucket lives from the head's grads() to the embedding's reduce(): plan counts it.
      CHECK(res.transient_peak[r] == res.plan_peak[0]);
    }
    if (Stage::stage == 3) {  // the declaration is what makes them agree: the paper alone is short
      CHECK(want > zero::formula::comm_bytes_per_step(3, res.padded, n, static_cast<std::size_t>(elem), micro_batches));
    }
  });
  // Training moved the parameters (the comparison above is not of untouched initial values).
  std::vector<float> init;
  for (std::size_t j = 0; j < V * C; ++j) init.push_back(initial(0, j));
  for (std::size_t j = 0; j < C * C; ++j) init.push_back(initial(1, j));
  for (std::size_t j = 0; j < C; ++j) init.push_back(initial(2, j));
  REQUIRE(first.size() == init.size());
  bool moved = false;
  for (std::size_t i = 0; i < init.size(); ++i) moved |= first[i] != std::bit_cast<std::uint32_t>(init[i]);
  CHECK(moved);
}

}  // namespace

TEST_CASE("tied embedding: stages 0-3 bit-identical, bytes sent per step equal the formula (fp32, bf16)") {
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    check_stages<zero::precision::fp32>(n, 1);
    check_stages<zero::precision::bf16>(n, 1);
  }
}

TEST_CASE("tied embedding with two reduced micro-batches: 2 x gathers x M gathers per step, formula exact") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    check_stages<zero::precision::fp32>(n, 2);
    check_stages<zero::precision::bf16>(n, 2);
  }
}

TEST_CASE("a unit gathered more often in a step than declared is a protocol error naming it and the counts") {
  for (int micro_batches : {1, 2}) {
    CAPTURE(micro_batches);
    zero::engine_options options;
    options.micro_batches = micro_batches;
    const zero::model_spec undeclared = tied_spec(1);  // the tied embedding declared as an ordinary unit
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(Stage::stage);
      zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
        zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(comm, undeclared, {}, options);
        e.initialize(initializer());
        // The limit is 2 x 1 x M gathers per step: the embedding's (2M + 1)-th gather is refused (in
        // the backward of M = 1, the second micro-batch's forward of M = 2), before any collective.
        const std::string want = "rank " + std::to_string(comm.rank()) + ", unit 'embed': gathered " +
                                 std::to_string(2 * micro_batches + 1) + " times in this step";
        try {
          for (int m = 0; m < micro_batches; ++m) {
            activations a = sample(comm.rank(), 0, m);
            forward(e, a);
            backward(e, a, target_of(comm.rank(), 0, m));
          }
          FAIL("no error for the over-gathered unit");
        } catch (const zero::error& err) {
          CHECK(err.kind() == zero::error_kind::protocol);
          const std::string msg = err.what();
          CHECK(msg.find(want) != std::string::npos);
          CHECK(msg.find("= " + std::to_string(2 * micro_batches) + " per step") != std::string::npos);
        }
      });
    });
  }
  CHECK_THROWS_WITH_AS(zero::model_spec().unit("x").tensor("w", {1}).gathers(0),
                       "model_spec: unit 'x': gathers(0): a unit is gathered at least once per pass", zero::error);
}

TEST_CASE("evaluation between steps: reported apart, formula exact, parameters untouched, same bits as without") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    constexpr int steps = 3, passes = 2;
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(Stage::stage);
      const auto plain = run<Stage, zero::precision::bf16>(n, steps, 1, 0);
      const auto with_eval = run<Stage, zero::precision::bf16>(n, steps, 1, passes);
      CHECK(with_eval.bits == plain.bits);
      CHECK(with_eval.eval_left_params_unchanged == std::vector<int>(static_cast<std::size_t>(n), 1));
      const auto N = static_cast<std::uint64_t>(n);
      // Independent of zero::formula: stage 3 all-gathers every unit once per use (the embedding twice).
      const std::uint64_t per_pass =
          Stage::stage == 3 ? (with_eval.padded + with_eval.embed_padded) * (N - 1) / N * 2 : 0;
      for (std::size_t r = 0; r < with_eval.formula.size(); ++r) {
        CAPTURE(r);
        CHECK(with_eval.measured[r] == with_eval.formula[r]);  // the step after an evaluation is not polluted
        CHECK(with_eval.measured[r] == plain.measured[r]);
        CHECK(with_eval.eval_formula[r] == per_pass);
        CHECK(with_eval.evaluation[r] == per_pass * (steps - 1) * passes);
      }
    });
  }
}

TEST_CASE("evaluation scope: grads, reduce and step refused inside; not in the middle of a step; not nested") {
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
      zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(comm, tied_spec(), {});
      e.initialize(initializer());
      const std::string rank = "rank " + std::to_string(comm.rank());
      {
        auto ev = e.evaluation();
        CHECK(e.evaluating());
        CHECK_THROWS_WITH_AS(e.grads(mix), doctest::Contains((rank + ", unit 'mix': grads() inside an evaluation() scope").c_str()),
                             zero::error);
        CHECK_THROWS_WITH_AS(e.reduce(mix), doctest::Contains((rank + ", unit 'mix': reduce() inside an evaluation()").c_str()),
                             zero::error);
        CHECK_THROWS_WITH_AS(e.step(), doctest::Contains((rank + ": step() inside an evaluation() scope").c_str()), zero::error);
        CHECK_THROWS_WITH_AS((void)e.evaluation(), doctest::Contains("evaluation() inside another evaluation()"),
                             zero::error);
        auto p = e.gather(embed);  // left gathered: the scope's end releases it
      }
      CHECK_FALSE(e.evaluating());
      // A training step starts with its first gather: no evaluation until step().
      activations a = sample(comm.rank(), 0, 0);
      forward(e, a);
      try {
        (void)e.evaluation();
        FAIL("evaluation() in the middle of a step was accepted");
      } catch (const zero::error& err) {
        CHECK(err.kind() == zero::error_kind::protocol);
        CHECK(std::string(err.what()).find(rank + ", unit 'embed': evaluation() in the middle of a step (this unit "
                                           "gathered 2") != std::string::npos);
      }
      backward(e, a, target_of(comm.rank(), 0, 0));
      e.step();
      auto ev = e.evaluation();  // between steps again
      ev.end();
      CHECK_FALSE(e.evaluating());
    });
  });
}
