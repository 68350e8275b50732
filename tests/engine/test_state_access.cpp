// Optimizer-state access: a snapshot taken in one stage and world size loads into any other and continues exactly.
#include <doctest/doctest.h>

#include <cstring>

#include "../toy_model.hpp"

namespace {

using adamw = zero::optim::adamw;

// The model's master weights and optimizer slots as global, unpadded arrays (unit after unit).
struct snapshot {
  std::vector<float> master, m, v;
  zero::training_state state;
};

template <class Stage>
snapshot train_and_snapshot(int n, int steps) {
  const auto spec = toy::spec();
  const auto base = toy::unit_bases(spec);
  snapshot snap;
  snap.master.assign(spec.numel(), 0.0f);
  snap.m = snap.v = snap.master;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, adamw> e(comm, spec);
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    for (std::size_t u = 0; u < spec.num_units(); ++u) {
      const auto r = e.canonical_range(zero::unit_id{u});  // disjoint across ranks: no race
      const std::size_t at = base[u] + r.begin;
      float* slots[2] = {snap.m.data() + at, snap.v.data() + at};
      e.read_state(zero::unit_id{u}, r, snap.master.data() + at, slots);
    }
    if (comm.rank() == 0) snap.state = e.state();
  });
  return snap;
}

template <class Stage>
std::vector<float> resume(const snapshot& snap, int n, int first_step, int steps) {
  const auto spec = toy::spec();
  const auto base = toy::unit_bases(spec);
  std::vector<float> out;
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, adamw> e(comm, spec);
    for (std::size_t u = 0; u < spec.num_units(); ++u) {
      const auto r = e.held_range(zero::unit_id{u});
      const std::size_t at = base[u] + r.begin;
      const float* slots[2] = {snap.m.data() + at, snap.v.data() + at};
      e.write_state(zero::unit_id{u}, r, snap.master.data() + at, slots);
    }
    e.finish_load(snap.state);
    CHECK(e.steps() == snap.state.step);
    for (int t = first_step; t < first_step + steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("snapshots are the same whatever the stage and world size they were read from") {
  const auto a = train_and_snapshot<zero::stage3>(4, 6);
  const auto b = train_and_snapshot<zero::stage0>(4, 6);
  const auto c = train_and_snapshot<zero::stage2>(4, 6);
  CHECK(bit_equal(a.master, b.master));
  CHECK(bit_equal(a.m, b.m));
  CHECK(bit_equal(a.v, c.v));
  CHECK(a.state.step == 6);
}

TEST_CASE_TEMPLATE("a stage-3 snapshot resumed in any stage at the same N continues bit-identically", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  const int n = 4;
  const auto snap = train_and_snapshot<zero::stage3>(n, 6);
  const auto uninterrupted = toy::run<zero::stage3>(n, 12, adamw{}).params;
  CHECK(bit_equal(resume<Stage>(snap, n, 6, 6), uninterrupted));
}

TEST_CASE("a snapshot loads at other world sizes with identical state") {
  const auto snap = train_and_snapshot<zero::stage3>(4, 5);
  for (int n : {1, 2, 3, 8}) {
    CAPTURE(n);
    const auto p = resume<zero::stage1>(snap, n, 5, 0);  // zero further steps: params are the master
    CHECK(bit_equal(p, snap.master));
  }
}

TEST_CASE("state access outside the held range is refused") {
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, adamw> e(comm, toy::spec());
    const zero::unit_id u{0};
    const auto held = e.held_range(u);
    std::vector<float> buf(toy::spec().numel());
    float* slots[2] = {buf.data(), buf.data()};
    const zero::range outside = comm.rank() == 0 ? zero::range{held.end, held.end + 1} : zero::range{0, 1};
    CHECK_THROWS_WITH_AS(e.read_state(u, outside, buf.data(), slots), doctest::Contains("outside the held range"),
                         zero::error);
  });
}
