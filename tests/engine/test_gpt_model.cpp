// The GPT example's model: its backward pass against finite differences, the protocol calls it makes (the tied unit's),
// and its tensor-parallel layout (tp = 2 trains tp = 1's model; a mislabeled tensor is refused).
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../engine_instances.hpp"
#include "gpt.hpp"
#include "zero/comm/mesh.hpp"

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
  gpt::forward(c, gpt::tp_group{}, gpt::gathered(e), a);
  const int rows = c.batch * c.context;
  std::vector<float> dlogits(static_cast<std::size_t>(rows) * c.vocab);
  int correct = 0;
  const double sum = gpt::kernels::cross_entropy(a.logits.data(), a.targets.data(), dlogits.data(),
                                                 1.0f / static_cast<float>(rows), rows, c.vocab, correct);
  if (backward) gpt::backward(e, c, gpt::tp_group{}, a, dlogits);
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

namespace {

using zero::comm::threads;

// A corpus in memory for train_step: the vocabulary's bytes and a token sequence with some structure.
gpt::corpus tiny_corpus(const gpt::config& c) {
  gpt::corpus data;
  data.id.fill(-1);
  for (int k = 0; k < c.vocab; ++k) {
    data.vocab.push_back(static_cast<char>('a' + k));
    data.id[static_cast<std::size_t>('a' + k)] = k;
  }
  for (int i = 0; i < 200; ++i) data.tokens.push_back(static_cast<std::uint8_t>((i * i + i / 3) % c.vocab));
  data.train_end = data.tokens.size();
  return data;
}

// Rebuilds `whole` with one tensor's tensor-parallel layout replaced: a planted mistake.
zero::model_spec relabeled(const zero::model_spec& whole, const std::string& unit, const std::string& tensor,
                           zero::tensor_parallel layout) {
  zero::model_spec s;
  for (const auto& u : whole.units()) {
    auto b = s.unit(u.name);
    for (const auto& t : u.tensors) b.tensor(t.name, t.shape, u.name == unit && t.name == tensor ? layout : t.tp);
    b.gathers(u.gathers);
  }
  return s;
}

struct tp_run {
  std::vector<float> whole;  // full_model_params() after one step
  double loss = 0;           // the step's loss
  std::uint64_t block_bytes = 0;  // what rank 0's blocks kept for the backward pass
};

// One SGD step (lr 100, no momentum: the update is 100 x the gradient, far above the parameters'
// rounding) of the GPT on a 1 x tp mesh of threads, stage 0 (in a mesh every stage is the same bits).
tp_run one_step(const gpt::config& c, int tp, const zero::model_spec& spec, bool sequence_parallel = false) {
  const gpt::corpus data = tiny_corpus(c);
  tp_run out;
  threads::launch(tp, [&](threads& comm) {
    zero::comm::mesh<threads> m(comm, {1, tp});
    zero::optim::sgd opt;
    opt.lr = 100.0f;
    opt.momentum = 0.0f;
    zero::engine<zero::stage0, threads, zero::optim::sgd> e(m, spec, opt);
    e.initialize(zero::from_whole_tensors(gpt::initializer(c)));
    const gpt::tp_group group(m.tp(), sequence_parallel);
    const gpt::step_result r = gpt::train_step(e, c, group, data, 0, 0, 1, 1);
    std::vector<float> whole = e.full_model_params();
    if (comm.rank() == 0) out = {std::move(whole), r.loss, r.block_activation_bytes};
  });
  return out;
}

}  // namespace

TEST_CASE("gpt at tp = 2 (heads and MLP columns split, partial sums added over the group) trains tp = 1's model") {
  gpt::config c = small();
  c.heads = 4;  // two heads per tensor-parallel rank
  const zero::model_spec spec = gpt::make_spec(c);
  const tp_run one = one_step(c, 1, spec), two = one_step(c, 2, spec);
  // The forward's sums are grouped differently (each rank's half, then the two halves), so the loss and
  // gradients agree to float rounding, not bit for bit: about 1e-7 relative here, against 1e-4 below.
  CHECK(std::abs(two.loss - one.loss) <= 1e-6 * one.loss);
  std::vector<float> start(spec.numel());
  {  // the initial values, in the same flat order: the update of each tensor is start - after
    std::size_t at = 0;
    const auto init = gpt::initializer(c);
    for (const auto& u : spec.units())
      for (const auto& t : u.tensors) {
        init(u, t, zero::range{0, t.numel}, std::span<float>(start.data() + at, t.numel));
        at += t.numel;
      }
  }
  REQUIRE(one.whole.size() == start.size());
  REQUIRE(two.whole.size() == start.size());
  std::size_t at = 0;
  for (const auto& u : spec.units())
    for (const auto& t : u.tensors) {
      double diff2 = 0, norm2 = 0;
      for (std::size_t i = at; i < at + t.numel; ++i) {
        const double u1 = static_cast<double>(start[i]) - one.whole[i];
        const double u2 = static_cast<double>(start[i]) - two.whole[i];
        diff2 += (u2 - u1) * (u2 - u1);
        norm2 += u1 * u1;
      }
      at += t.numel;
      INFO(u.name, ".", t.name, ": |update(tp 2) - update(tp 1)| = ", std::sqrt(diff2),
           ", |update| = ", std::sqrt(norm2));
      CHECK(norm2 > 0.0);
      CHECK(std::sqrt(diff2) <= 1e-4 * std::sqrt(norm2));
    }
}

TEST_CASE("gpt at tp = 2: a tensor declared with the wrong tensor-parallel layout is refused at the first step") {
  gpt::config c = small();
  c.heads = 4;
  const zero::model_spec spec = gpt::make_spec(c);
  // A split tensor declared replicated (each rank would hold all of c_fc's bias), and a replicated
  // one declared split (each rank half of the row-parallel bias, which is zero at initialization: the
  // engine's init check sees a valid layout either way).
  const auto failure = [&](const zero::model_spec& planted) -> std::string {
    try {
      one_step(c, 2, planted);
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::invalid_argument);
      return x.what();
    }
    return "no error";
  };
  const std::string replicated = failure(relabeled(spec, "h.1", "mlp.c_fc.bias", zero::tp_replicated));
  CHECK(replicated.find("tensor 'h.1.mlp.c_fc.bias' is held as [32], piece 0 of 1; at tensor-parallel rank ") !=
        std::string::npos);
  CHECK(replicated.find(" of 2 the model computes with [16], split") != std::string::npos);
  const std::string split = failure(relabeled(spec, "h.0", "attn.c_proj.bias", zero::tp_split(0)));
  CHECK(split.find("tensor 'h.0.attn.c_proj.bias' is held as [4], piece ") != std::string::npos);
  CHECK(split.find(" of 2 the model computes with [8], replicated (piece 0 of 1)") != std::string::npos);
  CHECK(failure(spec) == "no error");
}

TEST_CASE("gpt with sequence parallelism: the same bits as tp alone, the row-split activations divided by tp") {
  gpt::config c = small();
  c.heads = 4;
  c.context = 6;  // 2 sequences of 6 positions: 12 rows, which 2 and 4 ranks divide
  const zero::model_spec spec = gpt::make_spec(c);
  for (int tp : {2, 4}) {
    CAPTURE(tp);
    const tp_run plain = one_step(c, tp, spec), sp = one_step(c, tp, spec, true);
    CHECK(sp.loss == plain.loss);
    REQUIRE(sp.whole.size() == plain.whole.size());
    CHECK(std::memcmp(sp.whole.data(), plain.whole.data(), sp.whole.size() * sizeof(float)) == 0);
    // Split by rows: the block's input, both norms' outputs, the residual after attention (C floats per
    // row each) and the norms' means and deviations (4 per row).
    const auto rows = static_cast<std::uint64_t>(c.batch) * static_cast<std::uint64_t>(c.context);
    const std::uint64_t split = static_cast<std::uint64_t>(c.layers) * rows * (4 * c.embd + 4) * sizeof(float);
    CHECK(plain.block_bytes - sp.block_bytes == split - split / static_cast<std::uint64_t>(tp));
  }
}
