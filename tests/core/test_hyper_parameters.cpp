// Hyper-parameters between steps: set_optimizer / set_learning_rate equal rebuilding the engine, lr 0 freezes, checks and checkpoints.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "../checkpoint/checkpoint_helpers.hpp"
#include "../optimizer_step.hpp"
#include "zero/core/schedule.hpp"

using namespace ckpt_test;

namespace {

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Settings away from the defaults, with weight decay (which lr multiplies in every optimizer here).
template <class Opt>
Opt settings() {
  Opt o{};
  o.weight_decay = 0.02f;
  if constexpr (std::is_same_v<Opt, zero::optim::sgd>) o.lr = 0.05f;
  return o;
}

// The learning rates of the runs below, one per step: warm-up and cosine decay down to 0 at the end.
template <class Opt>
zero::warmup_cosine schedule_for(int steps) {
  const float peak = settings<Opt>().lr * 4.0f;
  return zero::warmup_cosine{.peak = peak, .min = 0.0f, .warmup = 2, .total = static_cast<std::uint64_t>(steps - 1)};
}

// Trains the toy model `steps` steps with the schedule's rate set before each step on one engine.
template <class Stage, class Opt>
std::vector<float> scheduled(int n, int steps) {
  const auto sched = schedule_for<Opt>(steps);
  std::vector<float> out;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, Opt> e(comm, toy::spec(), settings<Opt>());
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) {
      e.set_learning_rate(sched.at(e.steps()));
      toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    }
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

// The same schedule without any setter: before each step a new engine is built with that step's
// optimizer, and the previous engine's master weights, slots and training state are moved into it
// (read_state / write_state / finish_load over this rank's held ranges).
template <class Stage, class Opt>
std::vector<float> rebuilt_per_step(int n, int steps) {
  const auto sched = schedule_for<Opt>(steps);
  std::vector<float> out;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    using engine = zero::engine<Stage, zero::comm::threads, Opt>;
    const zero::model_spec spec = toy::spec();
    std::vector<std::vector<float>> master(spec.num_units());
    std::vector<std::vector<std::vector<float>>> slots(spec.num_units());
    zero::training_state state{};
    for (int t = 0; t < steps; ++t) {
      Opt o = settings<Opt>();
      o.lr = sched.at(static_cast<std::uint64_t>(t));
      engine e(comm, spec, o);
      if (t == 0) {
        e.initialize(toy::initializer());
      } else {
        for (std::size_t u = 0; u < spec.num_units(); ++u) {
          std::vector<const float*> s;
          for (auto& k : slots[u]) s.push_back(k.data());
          e.write_state(zero::unit_id{u}, e.held_range(zero::unit_id{u}), master[u].data(), s.data());
        }
        e.finish_load(state);
      }
      toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
      for (std::size_t u = 0; u < spec.num_units(); ++u) {
        const zero::range h = e.held_range(zero::unit_id{u});
        master[u].assign(h.size(), 0.0f);
        slots[u].assign(Opt::slots, std::vector<float>(h.size()));
        std::vector<float*> s;
        for (auto& k : slots[u]) s.push_back(k.data());
        e.read_state(zero::unit_id{u}, h, master[u].data(), s.data());
      }
      state = e.state();
      if (t + 1 == steps) {
        auto p = e.full_params();
        if (comm.rank() == 0) out = std::move(p);
      }
    }
  });
  return out;
}

// The same optimizer at its starting rate throughout: what the schedule must differ from.
template <class Stage, class Opt>
std::vector<float> constant_rate(int n, int steps) {
  std::vector<float> out;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, Opt> e(comm, toy::spec(), settings<Opt>());
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

// An optimizer without a learning rate (nothing to schedule): set_learning_rate must not exist for it.
struct no_rate {
  static constexpr int slots = 0;
  static constexpr std::string_view name = "no_rate";
  static constexpr std::array<std::string_view, 0> slot_names = {};
  static constexpr auto hyper_parameters() { return std::tuple{}; }
  struct step_constants {};
  step_constants constants(std::uint64_t) const { return {}; }
  static void update(const step_constants&, float&, float, float*) {}
};
static_assert(zero::OptimizerState<no_rate>);
template <class Opt>
constexpr bool has_set_learning_rate =
    requires(zero::engine<zero::stage3, zero::comm::threads, Opt>& e) { e.set_learning_rate(1.0f); };
static_assert(has_set_learning_rate<zero::optim::sgd> && has_set_learning_rate<zero::optim::adamw> &&
              has_set_learning_rate<zero::optim::lion>);
static_assert(!has_set_learning_rate<no_rate>);
static_assert(requires(zero::engine<zero::stage3, zero::comm::threads, no_rate>& e) { e.set_optimizer(no_rate{}); });

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("a per-step schedule through set_learning_rate equals rebuilding the engine each step, "
                          "bit for bit, stages 0-3, N = 2-4",
                          Opt, schedule_equals_rebuild) {
  CAPTURE(Opt::name);
  const int steps = 7;
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(Stage::stage);
      const auto a = scheduled<Stage, Opt>(n, steps);
      REQUIRE(a.size() == toy::spec().numel());
      CHECK(bits_equal(a, rebuilt_per_step<Stage, Opt>(n, steps)));
      // The schedule changed the result, so the equality above is about the rates.
      CHECK_FALSE(bits_equal(a, constant_rate<Stage, Opt>(n, steps)));
    });
  }
}
TEST_CASE_TEMPLATE_APPLY(schedule_equals_rebuild, zero::optimizers::tuple);

TEST_CASE_TEMPLATE_DEFINE("lr 0 leaves the parameters bit-identical while the optimizer states advance", Opt,
                          lr_zero_freezes) {
  CAPTURE(Opt::name);
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    for (int n : {2, 3}) {
      CAPTURE(n);
      zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
        zero::engine<Stage, zero::comm::threads, Opt> e(comm, toy::spec(), settings<Opt>());
        e.initialize(toy::initializer());
        // Some steps first, so the weights have moved and the states are not zero.
        for (int t = 0; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
        e.set_learning_rate(0.0f);
        CHECK(e.optimizer_settings().lr == 0.0f);
        const auto before = e.full_params();
        const zero::unit_id u{0};
        const zero::range h = e.held_range(u);
        std::vector<float> m0(h.size()), m1(h.size());
        std::vector<std::vector<float>> s0(Opt::slots, std::vector<float>(h.size())), s1 = s0;
        std::vector<float*> p0, p1;
        for (int k = 0; k < Opt::slots; ++k) p0.push_back(s0[k].data()), p1.push_back(s1[k].data());
        e.read_state(u, h, m0.data(), p0.data());
        for (int t = 3; t < 6; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
        e.read_state(u, h, m1.data(), p1.data());
        CHECK(e.steps() == 6);
        CHECK(bits_equal(e.full_params(), before));
        CHECK(bits_equal(m1, m0));
        for (int k = 0; k < Opt::slots; ++k) CHECK_FALSE(bits_equal(s1[k], s0[k]));  // the moments moved on
        // The gathered parameters (what kernels compute with) are the same bits as the master.
        for (std::size_t v = 0; v < e.spec().num_units(); ++v) {
          auto g = e.gather(zero::unit_id{v});
          const auto unit = e.full_params(zero::unit_id{v});
          CHECK(std::memcmp(g.view().data(), unit.data(), unit.size() * sizeof(float)) == 0);
        }
      });
    }
  });
}
TEST_CASE_TEMPLATE_APPLY(lr_zero_freezes, zero::optimizers::tuple);

TEST_CASE("lr 0 under bf16: master weights and the bf16 parameters both stay") {
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage2, zero::comm::threads, zero::optim::adamw, zero::precision::bf16> e(comm, toy::spec());
    e.initialize(toy::initializer());
    toy::train_step(e, comm.rank(), 0);
    e.set_learning_rate(0.0f);
    const auto master = e.full_params();
    std::vector<zero::bf16> params;
    {
      const auto look = e.evaluation();  // a look between steps, not one of the next step's gathers
      auto g = e.gather(zero::unit_id{2});
      params.assign(g.view().data(), g.view().data() + g.view().size());
    }
    for (int t = 1; t < 4; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    CHECK(bits_equal(e.full_params(), master));
    const auto look = e.evaluation();
    auto h = e.gather(zero::unit_id{2});
    CHECK(std::memcmp(h.view().data(), params.data(), params.size() * sizeof(zero::bf16)) == 0);
  });
}

// The one bit pattern lr 0 can change, by every optimizer's own rule w - lr x d: a weight of -0
// whose direction d is negative becomes +0 (0 x d = -0, and -0 - (-0) = +0 in IEEE arithmetic);
// with a positive direction it stays -0. Equal as numbers, so the model computes the same.
TEST_CASE_TEMPLATE_DEFINE("lr 0 and a weight of -0: the sign of zero follows the update direction", Opt,
                          lr_zero_negative_zero) {
  CAPTURE(Opt::name);
  Opt o = settings<Opt>();
  o.lr = 0.0f;
  const auto c = o.constants(1);
  const auto bits = [](float x) {
    std::uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
  };
  float s[Opt::slots > 0 ? Opt::slots : 1] = {};
  float w = -0.0f;
  const auto update = [&](float& x, float g, float* st) {
    float* slots[Opt::slots > 0 ? Opt::slots : 1] = {};
    for (int k = 0; k < Opt::slots; ++k) slots[k] = st + k;
    testing::tensor_step<Opt>(c, &g, &x, slots, static_cast<float*>(nullptr), 1);
  };
  update(w, -1.0f, s);  // gradient -1: the direction is negative in every optimizer here
  CHECK(bits(w) == bits(0.0f));
  float s2[Opt::slots > 0 ? Opt::slots : 1] = {};
  w = -0.0f;
  update(w, 1.0f, s2);
  CHECK(bits(w) == bits(-0.0f));
  // Any nonzero weight keeps its bits.
  for (float x : {1.5f, -2.25e-3f, std::numeric_limits<float>::denorm_min()}) {
    float s3[Opt::slots > 0 ? Opt::slots : 1] = {};
    w = x;
    update(w, -0.75f, s3);
    CHECK(bits(w) == bits(x));
  }
}
TEST_CASE_TEMPLATE_APPLY(lr_zero_negative_zero, zero::optimizers::tuple);

TEST_CASE("set_optimizer validates as the constructor does, names the rank, and keeps the old values") {
  using adamw_engine = zero::engine<zero::stage1, zero::comm::threads, zero::optim::adamw>;
  zero::optim::adamw bad;
  bad.beta1 = 1.0f;
  std::mutex mu;
  std::vector<std::string> at_construction(3), at_set(3);
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::string c, s;
    try {
      adamw_engine e(comm, toy::spec(), bad);
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::invalid_argument);
      c = x.what();
    }
    adamw_engine e(comm, toy::spec(), settings<zero::optim::adamw>());
    const zero::optim::adamw before = e.optimizer_settings();
    try {
      e.set_optimizer(bad);
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::invalid_argument);
      s = x.what();
    }
    CHECK(std::memcmp(&e.optimizer_settings(), &before, sizeof before) == 0);
    for (float lr : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      CAPTURE(lr);
      CHECK_THROWS_WITH_AS(e.set_learning_rate(lr),
                           doctest::Contains(("rank " + std::to_string(r) + ": optim::adamw: lr must be finite and >= 0").c_str()),
                           zero::error);
      CHECK(e.optimizer_settings().lr == before.lr);
    }
    e.set_learning_rate(0.0f);  // allowed: it holds the weights still
    CHECK(e.optimizer_settings().lr == 0.0f);
    e.set_learning_rate(2e-3f);
    CHECK(e.optimizer_settings().lr == 2e-3f);
    CHECK(e.optimizer_settings().beta2 == before.beta2);  // only the rate changed
    const std::lock_guard<std::mutex> lock(mu);
    at_construction[r] = c;
    at_set[r] = s;
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(at_set[r] == at_construction[r]);
    CHECK(at_set[r] == "rank " + std::to_string(r) + ": optim::adamw: beta1 must be in [0, 1), got 1");
  }
  // The same for SGD's cross-field rule.
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage0, zero::comm::threads, zero::optim::sgd> e(comm, toy::spec());
    zero::optim::sgd s;
    s.momentum = 0.0f;
    s.nesterov = true;
    CHECK_THROWS_WITH_AS(e.set_optimizer(s), "rank 0: optim::sgd: nesterov needs momentum > 0, got momentum 0",
                         zero::error);
    CHECK(e.optimizer_settings().momentum == zero::optim::sgd{}.momentum);
  });
}

TEST_CASE_TEMPLATE("set_optimizer is refused while a unit is gathered or reduced in this step", Stage, zero::stage0,
                   zero::stage1, zero::stage2, zero::stage3) {
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    const float lr0 = e.optimizer_settings().lr;
    const std::string rank = "rank " + std::to_string(comm.rank());
    const zero::unit_id head{3}, block{2};
    {
      auto p = e.gather(head);
      CHECK_THROWS_WITH_AS(e.set_learning_rate(1e-2f),
                           doctest::Contains((rank + ", unit 'head': set_optimizer() in the middle of a step (this unit "
                                              "is gathered)").c_str()),
                           zero::error);
      try {
        e.set_optimizer(zero::optim::adamw{});
      } catch (const zero::error& x) {
        CHECK(x.kind() == zero::error_kind::protocol);
      }
      CHECK(e.optimizer_settings().lr == lr0);
      p.release();
    }
    // Released, nothing reduced: between steps, so accepted (an evaluation pass leaves this state).
    e.set_learning_rate(1e-2f);
    CHECK(e.optimizer_settings().lr == 1e-2f);
    {
      auto g = e.grads(head);  // grads() alone leaves no mark: accepted, as documented
      (void)g;
      e.set_learning_rate(2e-2f);
    }
    e.reduce(head);
    CHECK_THROWS_WITH_AS(e.set_learning_rate(3e-2f),
                         doctest::Contains((rank + ", unit 'head': set_optimizer() in the middle of a step (this unit "
                                            "is reduced in this step)").c_str()),
                         zero::error);
    for (std::size_t u = 3; u-- > 0;) {
      e.grads(zero::unit_id{u});
      e.reduce(zero::unit_id{u});
    }
    CHECK_THROWS_AS(e.set_learning_rate(3e-2f), zero::error);
    CHECK(e.optimizer_settings().lr == 2e-2f);
    e.step();
    e.set_learning_rate(3e-2f);  // after step(): accepted
    CHECK(e.optimizer_settings().lr == 3e-2f);
    (void)block;
  });
}

TEST_CASE("a checkpoint saved after set_learning_rate records the new rate; load keeps the engine's own") {
  const temp_dir dir("hyper");
  const float new_lr = 7.5e-4f;
  std::vector<float> straight, resumed;
  // One run: 3 steps at the default rate, then the new one for 3 more; saved at the switch.
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    for (int t = 0; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    e.set_learning_rate(new_lr);
    ckpt::save(e, comm, dir.path);
    for (int t = 3; t < 6; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto p = e.full_params();
    if (comm.rank() == 0) straight = std::move(p);
  });
  const ckpt::manifest m = ckpt::verify(dir.path);
  CHECK(m.hyper_parameters.at("lr").get<double>() == static_cast<double>(new_lr));
  CHECK(ckpt::optimizer_from<adamw>(m).lr == new_lr);
  // Resumed in another stage (the same N: the toy's gradients depend on the ranks) into an engine
  // built with the defaults: load() restores tensors and training state, not the hyper-parameters;
  // the saved ones are in the result, for set_optimizer.
  zero::comm::threads::launch(3, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage1, zero::comm::threads, adamw> e(comm, toy::spec());
    const auto r = ckpt::load(e, comm, dir.path);
    CHECK(e.optimizer_settings().lr == adamw{}.lr);
    e.set_optimizer(ckpt::optimizer_from<adamw>(r.info));
    CHECK(e.optimizer_settings().lr == new_lr);
    for (int t = 3; t < 6; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto p = e.full_params();
    if (comm.rank() == 0) resumed = std::move(p);
  });
  REQUIRE(straight.size() == toy::spec().numel());
  CHECK(bits_equal(resumed, straight));
}

TEST_CASE("warmup_cosine: warm-up, the cosine, the floor, and its checks") {
  const zero::warmup_cosine s{.peak = 1e-3f, .min = 1e-5f, .warmup = 4, .total = 14};
  s.validate();
  CHECK(s.at(0) == static_cast<float>(1e-3 * 1 / 4));
  CHECK(s.at(3) == 1e-3f);  // the last warm-up step reaches the peak
  CHECK(s.at(4) == 1e-3f);  // the cosine starts at the peak
  CHECK(s.at(9) == static_cast<float>(1e-5 + (1e-3 - 1e-5) * 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5))));
  CHECK(s.at(14) == 1e-5f);
  CHECK(s.at(1000) == 1e-5f);
  for (std::uint64_t t = 4; t < 14; ++t) CHECK(s.at(t + 1) <= s.at(t));  // decreasing after the warm-up
  const zero::warmup_cosine none{.peak = 2e-3f, .min = 0.0f, .warmup = 0, .total = 10};
  CHECK(none.at(0) == 2e-3f);
  CHECK(none.at(10) == 0.0f);
  CHECK_THROWS_WITH_AS((zero::warmup_cosine{.peak = 1e-3f, .min = 1e-2f}.validate()),
                       "warmup_cosine: min must be <= peak, got min 0.01 and peak 0.001", zero::error);
  CHECK_THROWS_WITH_AS((zero::warmup_cosine{.warmup = 5, .total = 4}.validate()),
                       "warmup_cosine: warmup must be <= total, got warmup 5 and total 4", zero::error);
  CHECK_THROWS_WITH_AS((zero::warmup_cosine{.peak = std::numeric_limits<float>::quiet_NaN()}.validate()),
                       "warmup_cosine: peak must be finite and >= 0, got nan", zero::error);
  CHECK_THROWS_AS((zero::warmup_cosine{.total = 0}.validate()), zero::error);
}

namespace {

// Runs `body` on N thread ranks and returns each rank's zero::error message ("" where none).
std::vector<std::string> errors_of(int n, const std::function<void(zero::comm::threads&)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::mutex mu;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    try {
      body(comm);
    } catch (const zero::error& e) {
      const std::lock_guard<std::mutex> lock(mu);
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  return errors;
}

// Every rank ended in the agreement error: its own rank, the field, and the odd rank's value.
void check_every_rank(const std::vector<std::string>& errors, const std::string& field, const std::string& odd) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    CAPTURE(r);
    CAPTURE(errors[r]);
    CHECK(errors[r].rfind("rank " + std::to_string(r) + ": ", 0) == 0);
    CHECK(errors[r].find(field) != std::string::npos);
    CHECK(errors[r].find(odd) != std::string::npos);
  }
}

}  // namespace

// The last rank's clip_norm or micro_batches differ at construction, or its learning rate is changed
// by set_learning_rate on it alone: every rank ends in an error naming the field and that rank, in
// every stage and N = 2..4, whether the step's fingerprint rides on the norm's all-reduce (clipping,
// the reproducible mode's all-gather) or on an all-reduce of its own (stage 0, no norm).
TEST_CASE_TEMPLATE("ranks whose settings differ end in an error naming the field, on every rank", Stage, zero::stage0,
                   zero::stage1, zero::stage2, zero::stage3) {
  using engine = zero::engine<Stage, zero::comm::threads, zero::optim::adamw>;
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const std::string odd = "on rank " + std::to_string(n - 1);
    check_every_rank(errors_of(n,
                               [&](zero::comm::threads& comm) {
                                 zero::engine_options o;
                                 o.clip_norm = comm.rank() == n - 1 ? 0.5f : 1.0f;
                                 engine e(comm, toy::spec(), {}, o);
                               }),
                     "engine_options::clip_norm is 1 on rank 0 but 0.5 " + odd, "");
    check_every_rank(errors_of(n,
                               [&](zero::comm::threads& comm) {
                                 zero::engine_options o;
                                 o.micro_batches = comm.rank() == n - 1 ? 3 : 2;
                                 engine e(comm, toy::spec(), {}, o);
                               }),
                     "engine_options::micro_batches is 2 on rank 0 but 3 " + odd, "");
    zero::engine_options clipped, reproducible;
    clipped.clip_norm = 1.0f;
    reproducible.reproducible = true;
    for (const auto& options : {zero::engine_options{}, clipped, reproducible}) {
      CAPTURE(options.clip_norm);
      CAPTURE(options.reproducible);
      const auto errors = errors_of(n, [&](zero::comm::threads& comm) {
        engine e(comm, toy::spec(), {}, options);
        e.initialize(toy::initializer());
        toy::train_step(e, comm.rank(), 0);
        if (comm.rank() == n - 1) e.set_learning_rate(0.25f);
        toy::train_step(e, comm.rank(), 1);  // refused before any rank updates
      });
      check_every_rank(errors,
                       "step(): the ranks' optimizer hyper-parameters differ: optim::adamw::lr is 0.001 on "
                       "rank 0 but 0.25 " +
                           odd,
                       "no rank applied");
    }
  }
}

// A change every rank makes is no error, and costs no collective beyond the step's own.
TEST_CASE("a learning rate set on every rank passes the step's check") {
  const auto errors = errors_of(3, [](zero::comm::threads& comm) {
    zero::engine<zero::stage2, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    for (int t = 0; t < 3; ++t) {
      e.set_learning_rate(1e-3f * static_cast<float>(t + 1));
      toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    }
    CHECK(e.steps() == 3);
  });
  for (const auto& m : errors) CHECK(m.empty());
}
