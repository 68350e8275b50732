// ZeRO++ over comm::mpi under mpirun: all_to_all and split, and qwZ/qgZ/hpZ training bit-identical to comm::threads, overlap on and off, stages alike.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "../../examples/mlp.hpp"
#include "zero/comm/backends/mpi.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/core/hash.hpp"
#include "zero/zero.hpp"

// As in test_mpi.cpp: every rank issues the same collectives whatever its checks find.

namespace {

using zero::comm::mpi;

int size_of_world() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
bool on_all_ranks(bool v) {
  int x = v ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return x == 1;
}

zero::engine_options zeropp(bool qwz, bool qgz, bool hpz, int node_size, bool overlap) {
  zero::engine_options o;
  o.overlap = overlap;
  o.zeropp.qwz = qwz;
  o.zeropp.qgz = qgz;
  o.zeropp.hpz = hpz;
  o.zeropp.node_size = node_size;
  o.zeropp.weights = {8, 32};
  o.zeropp.gradients = {4, 32};
  return o;
}

template <class Stage, class Comm>
std::vector<float> trained(Comm& comm, const zero::engine_options& o) {
  mlp::config cfg;
  cfg.layers = 3;
  cfg.hidden = 45;
  cfg.in = 19;
  cfg.classes = 7;
  cfg.batch = 24;
  cfg.seed = 5;
  zero::optim::adamw opt;
  opt.lr = 1e-2f;
  zero::engine<Stage, Comm, zero::optim::adamw> e(comm, mlp::make_spec(cfg), opt, o);
  e.initialize(mlp::initializer(cfg));
  for (std::uint64_t t = 0; t < 4; ++t) mlp::train_step(e, cfg, t, comm.rank(), comm.size());
  CHECK(e.comm().last_step.total_bytes() == e.comm_formula_bytes());
  CHECK(e.comm().last_step.inter_node_bytes() == e.comm_formula_by_level().inter);
  // zero::plan for this engine (over Comm, which says whether it overlaps): its bytes and traffic.
  const auto p =
      zero::plan_for<Stage, Comm, zero::optim::adamw, zero::precision::fp32>(mlp::make_spec(cfg), comm.size(), o);
  const auto& m = e.memory();
  CHECK(p.model_states.params == m.current[static_cast<int>(zero::mem_category::params)]);
  CHECK(p.model_states.grads == m.current[static_cast<int>(zero::mem_category::grads)]);
  CHECK(p.step_transient_peak == m.peak_bytes(zero::mem_category::transient));
  CHECK(p.peak_bytes == m.peak_total);
  CHECK(p.step_comm.total_bytes() == e.comm().last_step.total_bytes());
  CHECK(p.step_comm.inter_node_bytes() == e.comm().last_step.inter_node_bytes());
  return e.full_params();
}

int c_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("comm::mpi: all_to_all and split") {
  const int n = size_of_world();
  mpi::run([&](mpi& c) {
    const auto N = static_cast<std::size_t>(n), r = static_cast<std::size_t>(c.rank());
    std::vector<std::uint8_t> send(N * 3), recv(N * 3), recv2(N * 3);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::uint8_t>(r * 40 + i);
    c.all_to_all(send.data(), recv.data(), 3);
    auto req = c.start_all_to_all(send.data(), recv2.data(), 3);
    c.wait(req);
    bool ok = recv == recv2;
    for (std::size_t s = 0; s < N; ++s)
      for (std::size_t i = 0; i < 3; ++i) ok = ok && recv[s * 3 + i] == static_cast<std::uint8_t>(s * 40 + r * 3 + i);
    auto odd = c.split(c.rank() % 2);
    ok = ok && odd->size() == (n + 1 - c.rank() % 2) / 2 && odd->rank() == c.rank() / 2;
    double x = c.rank(), y = 0;
    odd->all_reduce(&x, &y, 1, zero::reduce_op::sum);
    double want = 0;
    for (int k = c.rank() % 2; k < n; k += 2) want += k;
    ok = ok && y == want;
    CHECK(on_all_ranks(ok));
  });
}

TEST_CASE("ZeRO++ on comm::mpi: the bits of comm::threads, overlap on and off; qgZ alike in stages 1-3") {
  const int n = size_of_world();
  const int g = n % 2 == 0 ? n / 2 : 1;  // two nodes where N is even (two-hop qgZ from N = 4), else nodes of 1
  // qgZ alone (stages 1-3 alike), and all three.
  for (const bool all : {false, true}) {
    const bool hpz = all, qwz = all;
    CAPTURE(all);
    const auto on = zeropp(qwz, true, hpz, g, true), off = zeropp(qwz, true, hpz, g, false);
    std::vector<float> a, b, s1, s2;
    mpi::run([&](mpi& c) {
      a = trained<zero::stage3>(c, on);
      b = trained<zero::stage3>(c, off);
      if (!all) {
        s1 = trained<zero::stage1>(c, on);
        s2 = trained<zero::stage2>(c, on);
      }
    });
    // comm::threads' run, on rank 0, its hash sent to every rank.
    std::uint64_t ref = 0;
    if (c_rank() == 0)
      zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
        auto p = trained<zero::stage3>(c, off);
        if (c.rank() == 0) ref = zero::fnv1a64(p.data(), p.size() * sizeof(float));
      });
    MPI_Bcast(&ref, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    const auto hash = [](const std::vector<float>& p) { return zero::fnv1a64(p.data(), p.size() * sizeof(float)); };
    CHECK(on_all_ranks(hash(a) == ref && same(a, b)));
    if (!all) CHECK(on_all_ranks(same(s1, a) && same(s2, a)));
  }
}
