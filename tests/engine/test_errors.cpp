// Bad input and protocol misuse throw zero::error naming rank, unit and tensor; a failing rank never hangs the rest.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../toy_model.hpp"
#include "zero/comm/verified.hpp"

namespace {

using adamw = zero::optim::adamw;
template <class Stage>
using engine = zero::engine<Stage, zero::comm::threads, adamw>;

// Runs fn on one rank with a fresh stage-S engine over the toy model.
template <class Stage, class Fn>
void on_one_rank(Fn fn) {
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    engine<Stage> e(comm, toy::spec());
    e.initialize(toy::initializer());
    fn(e);
  });
}

}  // namespace

TEST_CASE_TEMPLATE("protocol misuse is refused with a message naming rank and unit", Stage, zero::stage0,
                   zero::stage1, zero::stage2, zero::stage3) {
  const zero::unit_id embed{0}, head{3};
  SUBCASE("an unknown tensor name lists the unit's tensors") {
    on_one_rank<Stage>([&](auto& e) {
      auto p = e.gather(head);
      CHECK_THROWS_WITH_AS(p["bias"], "rank 0: unit 'head' has no tensor 'bias' (it has: w, b)", zero::error);
      auto g = e.grads(head);
      CHECK_THROWS_WITH_AS(g["x"], doctest::Contains("unit 'head' has no tensor 'x'"), zero::error);
    });
  }
  SUBCASE("a unit index out of range") {
    on_one_rank<Stage>([&](auto& e) {
      CHECK_THROWS_WITH_AS(e.gather(zero::unit_id{9}), "rank 0: gather of unit index 9, but the model has 4 units",
                           zero::error);
    });
  }
  SUBCASE("access to a released unit's parameters") {
    on_one_rank<Stage>([&](auto& e) {
      auto p = e.gather(embed);
      p.release();
      CHECK_THROWS_WITH_AS(p["w"], doctest::Contains("rank 0, unit 'embed': access to parameters of a released unit"),
                           zero::error);
      CHECK_THROWS_WITH_AS(p.release(), doctest::Contains("release of a released unit"), zero::error);
      CHECK_THROWS_WITH_AS(e.release(embed), doctest::Contains("release of a unit that is not gathered"), zero::error);
    });
  }
  SUBCASE("gathering a unit twice") {
    on_one_rank<Stage>([&](auto& e) {
      auto p = e.gather(embed);
      CHECK_THROWS_WITH_AS(e.gather(embed), doctest::Contains("unit 'embed': gather of a unit that is already gathered"),
                           zero::error);
    });
  }
  SUBCASE("the handle releases the unit when it goes out of scope") {
    on_one_rank<Stage>([&](auto& e) {
      { auto p = e.gather(embed); }
      CHECK_NOTHROW(e.gather(embed).release());
    });
  }
  SUBCASE("step before every unit was reduced names the first one missing") {
    on_one_rank<Stage>([&](auto& e) {
      e.reduce(head);
      CHECK_THROWS_WITH_AS(e.step(), "rank 0, unit 'embed': step() before every unit was reduced (this one was not)",
                           zero::error);
    });
  }
  SUBCASE("step while a unit is gathered") {
    on_one_rank<Stage>([&](auto& e) {
      for (std::size_t u = 0; u < 4; ++u) e.reduce(zero::unit_id{u});
      auto p = e.gather(head);
      CHECK_THROWS_WITH_AS(e.step(), doctest::Contains("unit 'head': step() while this unit is still gathered"),
                           zero::error);
    });
  }
  SUBCASE("reducing twice, and gradients after the reduce") {
    on_one_rank<Stage>([&](auto& e) {
      auto g = e.grads(head);
      e.reduce(head);
      CHECK_THROWS_WITH_AS(e.reduce(head), doctest::Contains("reduce of a unit already reduced in this step"),
                           zero::error);
      CHECK_THROWS_WITH_AS(e.grads(head), doctest::Contains("grads of a unit already reduced in this step"),
                           zero::error);
      CHECK_THROWS_WITH_AS(g["w"], doctest::Contains("access to gradients after the unit was reduced"), zero::error);
    });
  }
  SUBCASE("errors carry their kind") {
    on_one_rank<Stage>([&](auto& e) {
      try {
        e.step();
        FAIL("step() without reduces did not throw");
      } catch (const zero::error& err) {
        CHECK(err.kind() == zero::error_kind::protocol);
      }
    });
  }
}

TEST_CASE("an engine over an empty model or a world size of 0 is refused") {
  zero::model_spec empty;
  CHECK_THROWS_WITH_AS(zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
                         engine<zero::stage3> e(comm, empty);
                       }),
                       "model_spec: the model has no units", zero::error);
  CHECK_THROWS_WITH_AS(zero::comm::threads::launch(0, [](zero::comm::threads&) {}),
                       doctest::Contains("world size must be positive"), zero::error);
}

TEST_CASE_TEMPLATE("a rank that throws mid-step ends the run with an error on every rank, without a hang", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<std::string> seen(static_cast<std::size_t>(n));
    const auto start = std::chrono::steady_clock::now();
    zero::comm::threads::options opts;
    opts.timeout = std::chrono::seconds(60);  // the abort, not the timeout, must end the others
    CHECK_THROWS_WITH_AS(
        zero::comm::threads::launch(
            n,
            [&](zero::comm::threads& comm) {
              engine<Stage> e(comm, toy::spec());
              e.initialize(toy::initializer());
              try {
                toy::train_step(e, comm.rank(), 0);
                // Step 2: the last rank fails in its own computation, the others go on into collectives.
                if (comm.rank() == n - 1) throw std::runtime_error("injected failure in backward");
                toy::train_step(e, comm.rank(), 1);
              } catch (const std::exception& ex) {
                seen[static_cast<std::size_t>(comm.rank())] = ex.what();
                throw;
              }
            },
            opts),
        "injected failure in backward", std::runtime_error);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(secs < 10.0);
    for (int r = 0; r + 1 < n; ++r) {
      CAPTURE(r);
      CHECK(seen[static_cast<std::size_t>(r)].find("aborted: rank " + std::to_string(n - 1) +
                                                   " failed: injected failure in backward") != std::string::npos);
    }
  }
}

// Issue 9, case 11: ranks that reduce different units of equal size in different orders used to
// exchange each other's gradients silently (kind, count and type agreed). The engine labels its calls,
// so the fingerprints differ and every rank gets an error naming both calls.
TEST_CASE_TEMPLATE("ranks that reduce equal-size units in different orders get an error naming both calls", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  zero::model_spec spec;
  spec.unit("a").tensor("w", {64});
  spec.unit("b").tensor("w", {64});
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::string> seen(static_cast<std::size_t>(n));
    zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
      engine<Stage> e(comm, spec);
      e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i);
      });
      for (std::size_t u : {0, 1}) e.gather(zero::unit_id{u}).release();
      // Rank 1 goes backwards in the other order.
      const std::size_t order[2][2] = {{1, 0}, {0, 1}};
      try {
        for (std::size_t u : order[comm.rank() == 1 ? 1 : 0]) {
          auto g = e.grads(zero::unit_id{u});
          for (std::size_t i = 0; i < 64; ++i) g["w"].data()[i] = static_cast<float>(comm.rank() + 1);
          e.reduce(zero::unit_id{u});
        }
        e.step();
      } catch (const zero::error& err) {
        CHECK(err.kind() == zero::error_kind::comm);
        seen[static_cast<std::size_t>(comm.rank())] = err.what();
      }
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const std::string& w = seen[static_cast<std::size_t>(r)];
      CAPTURE(w);
      CHECK(w.find("ranks disagree on the collective: rank 0 calls #") != std::string::npos);
      CHECK(w.find("for reduce unit 'b', rank 1 calls #") != std::string::npos);
      CHECK(w.find("for reduce unit 'a' (they differ in the label)") != std::string::npos);
    }
  }
}

// ---- comm::verified under the engine -------------------------------------------------------------

namespace {

// comm::threads with a defect planted in its reductions, chosen before a launch: each rank gathers
// every rank's send buffer and reduces it itself, in reverse rank order (all_reduce and
// reduce_scatter), or without the last rank's contribution (reduce_scatter: the gradients; an
// all_reduce that dropped a rank would also corrupt the step's settings fingerprint, which the engine
// checks, though under a message about the optimizer's settings).
enum class planted_defect { reversed_order, drops_last_rank };

class planted {
 public:
  using system = zero::sys::host;
  static inline std::atomic<planted_defect> defect{planted_defect::reversed_order};
  explicit planted(zero::comm::threads& t) : t_(&t) {}
  int rank() const { return t_->rank(); }
  int size() const { return t_->size(); }
  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, zero::reduce_op op) {
    if (defect == planted_defect::reversed_order) reduce(send, recv, count, 0, count, op);
    else t_->all_reduce(send, recv, count, op);
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, zero::reduce_op op) {
    reduce(send, recv, count * static_cast<std::size_t>(size()), count * static_cast<std::size_t>(rank()), count, op);
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    t_->all_gather(send, recv, count);
  }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    t_->broadcast(send, recv, count, root);
  }
  void barrier() { t_->barrier(); }

 private:
  // recv[i] = the defective reduction of element from + i of the ranks' send buffers (of `count`).
  template <class T>
  void reduce(const T* send, T* recv, std::size_t count, std::size_t from, std::size_t len, zero::reduce_op op) {
    const auto n = static_cast<std::size_t>(size());
    std::vector<T> all(n * count);
    t_->all_gather(send, all.data(), count);
    const bool reversed = defect == planted_defect::reversed_order;
    const std::size_t used = reversed || n == 1 ? n : n - 1;
    using A = zero::accumulate_as_t<T>;
    for (std::size_t i = 0; i < len; ++i) {
      const auto x = [&](std::size_t k) { return static_cast<A>(all[(reversed ? n - 1 - k : k) * count + from + i]); };
      A acc = x(0);
      for (std::size_t k = 1; k < used; ++k)
        acc = op == zero::reduce_op::sum ? static_cast<A>(acc + x(k)) : std::max(acc, x(k));
      recv[i] = zero::store_as<T>(acc);
    }
  }
  zero::comm::threads* t_;
};
static_assert(zero::CommBackendForEngine<planted, float>);

// A verified planted backend built from the rank's threads communicator (toy::run's wrappers are).
struct planted_member {
  explicit planted_member(zero::comm::threads& t) : backend(t) {}
  planted backend;
};
class verified_planted : private planted_member, public zero::comm::verified<planted> {
 public:
  explicit verified_planted(zero::comm::threads& t) : planted_member(t), zero::comm::verified<planted>(backend) {}
};

template <class>
using over_planted = planted;
template <class>
using over_verified_planted = verified_planted;
template <class C>
using over_verified = zero::comm::verified<C>;

}  // namespace

TEST_CASE("a backend that reduces out of rank order, or drops a rank, trains a different model; verified, it fails at "
          "the first reduce") {
  const auto reference = toy::run<zero::stage3, adamw>(4, 2, adamw{});
  for (planted_defect d : {planted_defect::reversed_order, planted_defect::drops_last_rank}) {
    CAPTURE(static_cast<int>(d));
    planted::defect = d;
    // Unverified, nothing fails: the model silently differs.
    const auto silent = toy::run<zero::stage3, adamw, zero::precision::fp32, over_planted>(4, 2, adamw{});
    CHECK(silent.params != reference.params);
    // Verified, the first reduce (the backward pass's first unit, 'head') fails on every rank.
    std::string what = "(no failure)";
    try {
      toy::run<zero::stage3, adamw, zero::precision::fp32, over_verified_planted>(4, 2, adamw{});
    } catch (const zero::error& e) {
      CHECK(e.kind() == zero::error_kind::comm);
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find("comm::verified rank ") == 0);
    CHECK(what.find(" reduce_scatter(float x 64, sum) for reduce unit 'head': the result of rank(s) ") !=
          std::string::npos);
    CHECK(what.find("is not the rank-ordered reduction of the ranks' inputs") != std::string::npos);
  }
}

TEST_CASE_TEMPLATE("verified<comm::threads> trains bit-identically to comm::threads, with the same byte counters",
                   Stage, zero::stage1, zero::stage3) {
  const auto plain = toy::run<Stage, adamw>(3, 3, adamw{});
  const auto checked = toy::run<Stage, adamw, zero::precision::fp32, over_verified>(3, 3, adamw{});
  CHECK(plain.params == checked.params);
  CHECK(plain.slots == checked.slots);
  const auto same = [](const zero::comm::comm_stats& a, const zero::comm::comm_stats& b) {
    return a.bytes == b.bytes && a.calls == b.calls && a.inter == b.inter;
  };
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(same(plain.comm[r].protocol, checked.comm[r].protocol));
    CHECK(same(plain.comm[r].last_step, checked.comm[r].last_step));
    CHECK(same(plain.comm[r].other, checked.comm[r].other));
    CHECK(same(plain.comm[r].control, checked.comm[r].control));
    CHECK(plain.comm[r].protocol.total_bytes() > 0);
  }
  if constexpr (std::is_same_v<Stage, zero::stage3>) {
    // ZeRO++ through it: byte all-gathers, all_to_all and split communicators, each checked.
    zero::engine_options o;
    o.zeropp.qwz = o.zeropp.qgz = o.zeropp.hpz = true;
    o.zeropp.node_size = 2;
    const auto quantized = toy::run<Stage, adamw>(4, 3, adamw{}, o);
    const auto quantized_checked = toy::run<Stage, adamw, zero::precision::fp32, over_verified>(4, 3, adamw{}, o);
    CHECK(quantized.params == quantized_checked.params);
    CHECK(quantized.params != toy::run<Stage, adamw>(4, 3, adamw{}).params);  // quantization did happen
  }
}

TEST_CASE("ranks that reduce units in different orders: silent over a backend without labels, named under verified") {
  // planted takes no call labels, so comm::threads under it sees unlabelled calls of equal shape and
  // lets them through; verified keeps the engine's labels in its own fingerprints.
  static_assert(!zero::comm::labels_calls<planted> && zero::comm::labels_calls<verified_planted>);
  zero::model_spec spec;
  spec.unit("a").tensor("w", {64});
  spec.unit("b").tensor("w", {64});
  const auto train = [&](auto& comm, std::vector<std::string>& seen) {
    zero::engine<zero::stage3, std::remove_reference_t<decltype(comm)>, adamw> e(comm, spec);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i);
    });
    for (std::size_t u : {0, 1}) e.gather(zero::unit_id{u}).release();
    const std::size_t order[2][2] = {{1, 0}, {0, 1}};  // rank 1 goes backwards in the other order
    try {
      for (std::size_t u : order[comm.rank() == 1 ? 1 : 0]) {
        auto g = e.grads(zero::unit_id{u});
        for (std::size_t i = 0; i < 64; ++i) g["w"].data()[i] = static_cast<float>(comm.rank() + 1);
        e.reduce(zero::unit_id{u});
      }
      e.step();
    } catch (const zero::error& err) {
      CHECK(err.kind() == zero::error_kind::comm);
      seen[static_cast<std::size_t>(comm.rank())] = err.what();
    }
  };
  std::vector<std::string> silent(3), named(3);
  zero::comm::threads::launch(3, [&](zero::comm::threads& base) {
    planted comm(base);
    train(comm, silent);
  });
  for (const std::string& w : silent) CHECK(w.empty());
  zero::comm::threads::launch(3, [&](zero::comm::threads& base) {
    verified_planted comm(base);
    train(comm, named);
  });
  for (const std::string& w : named) {
    CAPTURE(w);
    CHECK(w.find("the ranks' calls differ (in the label): rank(s) 0, 2 call #") != std::string::npos);
    CHECK(w.find(" for reduce unit 'b'; rank(s) 1 call #") != std::string::npos);
    CHECK(w.find(" for reduce unit 'a'; every rank must issue the same collectives") != std::string::npos);
  }
}
