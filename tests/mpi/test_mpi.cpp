// comm::mpi under mpirun: the collective conformance suite, bit-identity with comm::threads, errors, stage equivalence.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../examples/mlp.hpp"
#include "../tp_model.hpp"
#include "zero/comm/backends/mpi.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/comm/conformance.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/core/hash.hpp"
#include "zero/zero.hpp"

// Every test case issues the same collectives on every rank, whatever its checks find, and checks
// only afterwards: a rank that skipped a collective would leave the others blocked. Failures inside
// a collective sequence go through comm::mpi::run, which prints the rank and cause and aborts.

namespace {

using zero::comm::mpi;
using zero::comm::mpi_mode;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Each rank's value, on every rank.
std::vector<std::uint64_t> gather_u64(std::uint64_t v) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}
bool all_ranks(bool v) {
  int x = v ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return x == 1;
}

struct mode_case {
  const char* name;
  zero::comm::mpi_options backend;
  zero::conformance::options checks;
};
// The fast mode leaves the summation order to MPI, so it is held to the rounding bound only. A zero
// timeout selects MPI's blocking collectives, a positive one the nonblocking ones.
using std::chrono::milliseconds;
const mode_case modes[] = {
    {"deterministic", {}, {true}},
    {"deterministic, blocking", {.timeout = milliseconds(0)}, {true}},
    {"deterministic, verified", {.verify = true}, {true}},
    {"fast", {.mode = mpi_mode::fast}, {false}},
    {"fast, blocking", {.mode = mpi_mode::fast, .timeout = milliseconds(0)}, {false}},
};

template <class Suite>
void in_every_mode(Suite suite) {
  for (const auto& m : modes) {
    CAPTURE(m.name);
    mpi::run(
        [&](mpi& c) {
          try {
            suite(c, m.checks);
          } catch (const std::exception& e) {
            throw std::runtime_error(std::string("comm::mpi in ") + m.name + " mode: " + e.what());
          }
        },
        m.backend);
    CHECK(all_ranks(true));  // every rank came through (a failure would have aborted the job)
  }
}

}  // namespace

TEST_CASE("comm::mpi: a duplicate communicator with MPI_ERRORS_RETURN, the caller's left alone") {
  static_assert(zero::CommBackend<mpi>);
  MPI_Errhandler before = MPI_ERRHANDLER_NULL, ours = MPI_ERRHANDLER_NULL, after = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &before);
  int relation = MPI_UNEQUAL, rank = -1, size = 0;
  {
    mpi c;
    MPI_Comm_get_errhandler(c.handle(), &ours);
    MPI_Comm_compare(c.handle(), MPI_COMM_WORLD, &relation);
    rank = c.rank();
    size = c.size();
  }
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &after);
  CHECK(ours == MPI_ERRORS_RETURN);
  CHECK(after == before);
  CHECK(relation == MPI_CONGRUENT);  // same group and order, a different context
  CHECK(rank == world_rank());
  CHECK(size == world_size());
  for (MPI_Errhandler* h : {&before, &ours, &after}) MPI_Errhandler_free(h);
}

TEST_CASE("conformance: all_reduce") {
  in_every_mode([](mpi& c, zero::conformance::options o) { zero::conformance::all_reduce(c, o); });
}
TEST_CASE("conformance: reduce_scatter") {
  in_every_mode([](mpi& c, zero::conformance::options o) { zero::conformance::reduce_scatter(c, o); });
}
TEST_CASE("conformance: all_gather") {
  in_every_mode([](mpi& c, zero::conformance::options o) { zero::conformance::all_gather(c, o); });
}
TEST_CASE("conformance: broadcast") {
  in_every_mode([](mpi& c, zero::conformance::options o) { zero::conformance::broadcast(c, o); });
}
TEST_CASE("conformance: barrier") {
  in_every_mode([](mpi& c, zero::conformance::options o) { zero::conformance::barrier(c, o); });
}
TEST_CASE("conformance: determinism") {
  in_every_mode([](mpi& c, zero::conformance::options o) { zero::conformance::determinism(c, o); });
}
TEST_CASE("conformance: the engine's other types (int64, bytes, all_to_all)") {
  in_every_mode([](mpi& c, zero::conformance::options o) { zero::conformance::engine_types(c, o); });
}
TEST_CASE("conformance: canonical NaNs (deterministic modes; the fast mode's NaNs are MPI's)") {
  in_every_mode([](mpi& c, zero::conformance::options o) {
    if (o.rank_ordered) zero::conformance::nan_canonical(c, o);
  });
}

namespace {

// A fixed sequence of collectives; returns the hash of everything this rank received.
template <class Comm>
std::uint64_t collective_fingerprint(Comm& c) {
  const auto n = static_cast<std::size_t>(c.size());
  const int r = c.rank();
  std::uint64_t h = zero::fnv1a64(nullptr, 0);
  auto absorb = [&h](const auto& v) { h = zero::fnv1a64(v.data(), v.size() * sizeof(v[0]), h); };
  for (std::size_t count : {std::size_t{1}, std::size_t{1001}, std::size_t{3001}}) {
    auto f = zero::conformance::input<float>(r, count * n, 11 + count);
    auto d = zero::conformance::input<double>(r, count, 13 + count);
    std::vector<float> fs(count);
    c.all_reduce(f.data(), f.data(), f.size(), zero::reduce_op::sum);
    absorb(f);
    c.all_reduce(d.data(), d.data(), d.size(), zero::reduce_op::sum);
    absorb(d);
    f = zero::conformance::input<float>(r, count * n, 17 + count);
    c.reduce_scatter(f.data(), fs.data(), count, zero::reduce_op::sum);
    absorb(fs);
    c.reduce_scatter(f.data(), fs.data(), count, zero::reduce_op::max);
    absorb(fs);
  }
  return h;
}

}  // namespace

TEST_CASE("mesh: every dp x tp shape of the job's ranks over comm::mpi, and a shape that does not fit refused") {
  zero::comm::mpi world;
  const int n = world.size();
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0) continue;
    const zero::comm::mesh_shape shape{n / tp, tp};
    CAPTURE(tp);
    zero::comm::mesh<zero::comm::mpi> m(world, shape);
    const zero::comm::mesh_coordinates at = m.coordinates();
    CHECK(at == zero::comm::mesh_coordinates{world.rank() / tp, world.rank() % tp});
    CHECK(m.tp().size() == tp);
    CHECK(m.dp().size() == n / tp);
    const std::int64_t me = world.rank();
    std::vector<std::int64_t> tp_members(static_cast<std::size_t>(tp)), dp_members(static_cast<std::size_t>(n / tp));
    m.tp().all_gather(&me, tp_members.data(), 1);
    m.dp().all_gather(&me, dp_members.data(), 1);
    for (int k = 0; k < tp; ++k) CHECK(tp_members[static_cast<std::size_t>(k)] == at.dp * tp + k);
    for (int k = 0; k < n / tp; ++k) CHECK(dp_members[static_cast<std::size_t>(k)] == k * tp + at.tp);
  }
  CHECK_THROWS_WITH_AS(zero::comm::mesh<zero::comm::mpi>(world, {n + 1, 1}), doctest::Contains("ranks but the world has"),
                       zero::error);
  world.barrier();  // the refusal left every rank able to go on
}

TEST_CASE("comm::mpi: the deterministic mode is bit-identical to comm::threads with the same N") {
  const int n = world_size();
  const auto got = gather_u64(mpi::run([](mpi& c) { return collective_fingerprint(c); }));
  std::vector<std::uint64_t> reference(static_cast<std::size_t>(n));
  if (world_rank() == 0)
    zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
      reference[static_cast<std::size_t>(c.rank())] = collective_fingerprint(c);
    });
  MPI_Bcast(reference.data(), n, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<std::size_t>(r)] == reference[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("comm::mpi: the verified mode turns a mismatched call into an error on every rank naming both calls") {
  REQUIRE(world_size() >= 2);
  // Rank 1 deviates from the others in one respect per case; `names` must appear in the message.
  struct deviation {
    const char* name;
    const char* field;
    void (*call)(mpi&, bool deviate);
    const char* names = "";
  };
  const deviation cases[] = {
      {"count", "the count",
       [](mpi& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         c.all_reduce(x.data(), x.data(), dev ? 5 : 4, zero::reduce_op::sum);
       },
       "calls #0 all_reduce(float x 4, sum), rank 1 calls #0 all_reduce(float x 5, sum) (they differ in the count)"},
      {"op", "the reduction op",
       [](mpi& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         c.all_reduce(x.data(), x.data(), 4, dev ? zero::reduce_op::max : zero::reduce_op::sum);
       }},
      {"collective", "the operation",
       [](mpi& c, bool dev) {
         std::vector<float> x(4 * static_cast<std::size_t>(c.size()), 1.0f);
         if (dev) c.all_gather(x.data(), x.data(), 4);
         else c.all_reduce(x.data(), x.data(), 4, zero::reduce_op::sum);
       }},
      {"element type", "the element type",
       [](mpi& c, bool dev) {
         std::vector<float> f(8, 1.0f);
         std::vector<double> d(8, 1.0);
         if (dev) c.all_reduce(d.data(), d.data(), 4, zero::reduce_op::sum);
         else c.all_reduce(f.data(), f.data(), 4, zero::reduce_op::sum);
       }},
      {"element type of the same size", "the element type",
       [](mpi& c, bool dev) {
         std::vector<float> f(8, 1.0f);
         std::vector<std::int32_t> i(8, 1);
         if (dev) c.all_reduce(i.data(), i.data(), 4, zero::reduce_op::sum);
         else c.all_reduce(f.data(), f.data(), 4, zero::reduce_op::sum);
       },
       "rank 1 calls #0 all_reduce(int32 x 4, sum)"},
      // Issue 9, case 11 on MPI: calls of equal shape for different units.
      {"label", "the label",
       [](mpi& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         const zero::comm::scoped_label l(c, "reduce", dev ? "fc1" : "fc2");
         c.all_reduce(x.data(), x.data(), 4, zero::reduce_op::sum);
       },
       "calls #0 all_reduce(float x 4, sum) for reduce unit 'fc2', rank 1 calls #0 all_reduce(float x 4, sum) for "
       "reduce unit 'fc1' (they differ in the label)"},
      {"root", "the root",
       [](mpi& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         c.broadcast(x.data(), x.data(), 4, dev ? 1 : 0);
       }},
  };
  for (const auto& d : cases) {
    CAPTURE(d.name);
    // A fresh communicator per case: every case starts at sequence number 0.
    mpi c(MPI_COMM_WORLD, {.verify = true});
    std::string what;
    bool comm_kind = false;
    try {
      d.call(c, c.rank() == 1);
    } catch (const zero::error& e) {
      what = e.what();
      comm_kind = e.kind() == zero::error_kind::comm;
    }
    CAPTURE(what);
    CHECK(comm_kind);
    CHECK(what.find("ranks disagree on the collective: rank 0 calls #0 ") != std::string::npos);
    CHECK(what.find(d.field) != std::string::npos);
    CHECK(what.find(d.names) != std::string::npos);
    CHECK(what.find("last collectives of rank " + std::to_string(c.rank())) != std::string::npos);
    CHECK(all_ranks(comm_kind));
  }
  mpi c(MPI_COMM_WORLD, {.verify = true});
  // The communicator is still usable: the check refused the call before any data moved.
  std::vector<double> x(3, 1.0);
  c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
  CHECK(x[2] == static_cast<double>(c.size()));
}

// Issue 9, case 11 on MPI: ranks that reduce equal-size units in different orders. The engine labels
// its calls; in verify mode the mismatch is an error on every rank naming both, before any data moves.
TEST_CASE("comm::mpi: in verify mode, reducing equal-size units in different orders is an error naming both") {
  REQUIRE(world_size() >= 2);
  zero::model_spec spec;
  spec.unit("a").tensor("w", {64});
  spec.unit("b").tensor("w", {64});
  mpi c(MPI_COMM_WORLD, {.verify = true});
  zero::engine<zero::stage2, mpi, zero::optim::sgd> e(c, spec);
  e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5f;
  });
  std::string what;
  try {
    const std::size_t first = c.rank() == 1 ? 0 : 1;
    for (std::size_t u : {first, 1 - first}) {
      auto g = e.grads(zero::unit_id{u});
      for (std::size_t i = 0; i < 64; ++i) g["w"].data()[i] = 1.0f;
      e.reduce(zero::unit_id{u});
    }
  } catch (const zero::error& err) {
    what = err.what();
  }
  CAPTURE(what);
  // #0: the constructor's settings check, #1: the initialization check, #2: the step's fingerprint
  // (stage 2 without a norm has an all-reduce of its own for it, started by the first reduce).
  CHECK(what.find("ranks disagree on the collective: rank 0 calls #3 reduce_scatter(float x ") != std::string::npos);
  CHECK(what.find(", sum) for reduce unit 'b', rank 1 calls #3 reduce_scatter(float x ") != std::string::npos);
  CHECK(what.find(", sum) for reduce unit 'a' (they differ in the label)") != std::string::npos);
  CHECK(all_ranks(!what.empty()));
}

TEST_CASE("comm::mpi: an MPI failure becomes zero::error with MPI's text, the operation and the rank") {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(MPI_ERR_TRUNCATE, text, &len);
  std::string what;
  zero::error_kind kind = zero::error_kind::io;
  try {
    zero::comm::detail::mpi_check(MPI_ERR_TRUNCATE, "MPI_Bcast", "broadcast", 3, 4);
  } catch (const zero::error& e) {
    what = e.what();
    kind = e.kind();
  }
  CHECK(kind == zero::error_kind::comm);
  CHECK(what.find("comm::mpi rank 3 of 4: broadcast failed in MPI_Bcast: ") != std::string::npos);
  CHECK(what.find(std::string(text, static_cast<std::size_t>(len))) != std::string::npos);
  CHECK_NOTHROW(zero::comm::detail::mpi_check(MPI_SUCCESS, "MPI_Bcast", "broadcast", 3, 4));
}

TEST_CASE("comm::mpi: a broadcast root outside the world is refused on every rank before any message") {
  mpi c;
  std::vector<float> x(4);
  bool refused = false;
  try {
    c.broadcast(x.data(), x.data(), x.size(), c.size());
  } catch (const zero::error& e) {
    refused = e.kind() == zero::error_kind::invalid_argument;
  }
  CHECK(all_ranks(refused));
}

TEST_CASE("comm::mpi: the exchange buffer holds one full buffer and can be released") {
  mpi c;
  const auto n = static_cast<std::size_t>(c.size());
  std::vector<double> x(100 * n, 1.0), y(100);
  c.reduce_scatter(x.data(), y.data(), 100, zero::reduce_op::sum);
  CHECK(c.scratch_bytes() == (n > 1 ? 100 * n * sizeof(double) : 0));
  c.release_scratch();
  CHECK(c.scratch_bytes() == 0);
  c.reduce_scatter(x.data(), y.data(), 100, zero::reduce_op::sum);  // allocates again
  CHECK(y[99] == static_cast<double>(n));
}

// ---- stage equivalence ------------------------------------------------------------------------

namespace {

// A few AdamW steps of a small MLP whose units are not multiples of N (so padding is exercised);
// returns the hash of the consolidated fp32 parameters.
template <class Stage, class Comm>
std::uint64_t trained_hash(Comm& comm, const zero::engine_options& eo = {}, int hidden = 45) {
  mlp::config cfg;
  cfg.layers = 3;
  cfg.hidden = hidden;
  cfg.in = 19;
  cfg.classes = 7;
  cfg.batch = 24;  // divisible by 2, 3 and 4
  cfg.seed = 5;
  zero::optim::adamw opt;
  opt.lr = 1e-2f;
  zero::engine<Stage, Comm, zero::optim::adamw> e(comm, mlp::make_spec(cfg), opt, eo);
  e.initialize(mlp::initializer(cfg));
  for (std::uint64_t t = 0; t < 6; ++t) mlp::train_step(e, cfg, t, comm.rank(), comm.size());
  const auto p = e.full_params();
  return zero::fnv1a64(p.data(), p.size() * sizeof(float));
}

template <class Comm>
std::vector<std::uint64_t> stage_hashes(Comm& comm) {
  return {trained_hash<zero::stage0>(comm), trained_hash<zero::stage1>(comm), trained_hash<zero::stage2>(comm),
          trained_hash<zero::stage3>(comm)};
}

}  // namespace

namespace {

// The tensor-parallel test model trained for 3 steps; the hash of the whole model's parameters.
template <class Stage, class Engine>
std::uint64_t tp_trained_hash(Engine& e, int dp_rank) {
  e.initialize(zero::from_whole_tensors(tp_model::whole_init()));
  for (std::uint64_t t = 0; t < 3; ++t) tp_model::mesh_step(e, dp_rank, t);
  const auto p = e.full_model_params();
  return zero::fnv1a64(p.data(), p.size() * sizeof(float));
}

// The reference: the whole test model trained by a plain engine of each stage on `ranks` threads, on
// rank 0 of the job, broadcast to every rank.
std::vector<std::uint64_t> tp_reference_hashes(int ranks, const zero::engine_options& eo) {
  std::vector<std::uint64_t> reference(4);
  if (world_rank() == 0)
    zero::comm::threads::launch(ranks, [&](zero::comm::threads& c) {
      std::size_t k = 0;
      zero::stages::for_each([&]<class Stage>() {
        zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(c, tp_model::model(), {}, eo);
        const std::uint64_t h = tp_trained_hash<Stage>(e, c.rank());
        if (c.rank() == 0) reference[k] = h;
        ++k;
      });
    });
  MPI_Bcast(reference.data(), 4, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return reference;
}

}  // namespace

TEST_CASE("tensor parallel: a dp x tp mesh over comm::mpi trains what a plain engine on threads trains, every stage") {
  // tp = 2 where the job's size is even (1 x 2, 2 x 2), else 3 (1 x 3): the model's split dimensions
  // take both; the reference is the whole model at tp = 1 on the same data-parallel size.
  const int n = world_size(), tp = n % 2 == 0 ? 2 : 3, dp = n / tp;
  REQUIRE(dp * tp == n);
  zero::engine_options clipped;
  clipped.clip_norm = 0.05f;
  clipped.reproducible = true;
  for (const zero::engine_options& eo : {zero::engine_options{}, clipped}) {
    CAPTURE(eo.reproducible);
    std::vector<std::uint64_t> mine;
    mpi::run([&](mpi& c) {
      zero::comm::mesh<mpi> m(c, {dp, tp});
      zero::stages::for_each([&]<class Stage>() {
        zero::engine<Stage, mpi, zero::optim::adamw> e(m, tp_model::model(), {}, eo);
        mine.push_back(tp_trained_hash<Stage>(e, m.coordinates().dp));
      });
    });
    const std::vector<std::uint64_t> reference = tp_reference_hashes(dp, eo);
    REQUIRE(mine.size() == 4);
    for (std::size_t s = 0; s < 4; ++s) {
      CAPTURE(s);
      for (auto h : gather_u64(mine[s])) CHECK(h == mine[s]);  // every rank of the mesh holds the same model
      CHECK(mine[s] == reference[s]);
    }
  }
}

TEST_CASE("replicated shard groups over comm::mpi: the reproducible bits of plain ZeRO on threads, every stage") {
  // Groups of 2 where the job's size is even (the replicas' all-reduce between them), else of 1.
  const int n = world_size(), s = n % 2 == 0 ? 2 : 1;
  zero::engine_options eo;
  eo.reproducible = true;
  std::vector<std::uint64_t> mine;
  zero::engine_options grouped = eo;
  grouped.shard_group_size = s;
  mpi::run([&](mpi& c) {
    zero::stages::for_each([&]<class Stage>() {
      zero::engine<Stage, mpi, zero::optim::adamw> e(c, tp_model::model(), {}, grouped);
      CHECK(e.replicas() == n / s);
      CHECK(e.comm().protocol.inter_node_bytes() == 0);
      mine.push_back(tp_trained_hash<Stage>(e, c.rank()));
      CHECK(e.comm().last_step.total_bytes() == e.comm_formula_bytes());
      CHECK(e.comm().last_step.inter_node_bytes() == e.comm_formula_by_level().inter);
    });
  });
  const std::vector<std::uint64_t> reference = tp_reference_hashes(n, eo);
  REQUIRE(mine.size() == 4);
  for (std::size_t k = 0; k < 4; ++k) {
    CAPTURE(k);
    for (auto h : gather_u64(mine[k])) CHECK(h == mine[k]);
    CHECK(mine[k] == reference[k]);
  }
}

TEST_CASE("host_threads over comm::mpi: 1 and 3 threads per rank train the same bits") {
  // Layers of 96 x 96: each rank's slice is cut into several of the pool's ranges.
  zero::engine_options three;
  three.host_threads = 3;
  mpi::run([&](mpi& c) {
    CHECK(trained_hash<zero::stage0>(c, three, 96) == trained_hash<zero::stage0>(c, {}, 96));
    CHECK(trained_hash<zero::stage2>(c, three, 96) == trained_hash<zero::stage2>(c, {}, 96));
  });
}

TEST_CASE("stage equivalence: stages 0-3 on comm::mpi give the same parameters as on comm::threads") {
  const int n = world_size();
  REQUIRE(24 % n == 0);
  const auto mine = mpi::run([](mpi& c) { return stage_hashes(c); });
  std::vector<std::uint64_t> reference(4);
  if (world_rank() == 0)
    zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
      const auto h = stage_hashes(c);
      if (c.rank() == 0) reference = h;
    });
  MPI_Bcast(reference.data(), 4, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    const auto across = gather_u64(mine[static_cast<std::size_t>(s)]);
    for (auto h : across) CHECK(h == mine[static_cast<std::size_t>(s)]);  // every rank consolidates the same
    CHECK(mine[static_cast<std::size_t>(s)] == mine[0]);                  // every stage trains the same
    CHECK(mine[static_cast<std::size_t>(s)] == reference[static_cast<std::size_t>(s)]);  // as on threads
  }
}

namespace {

// The reproducible mode (engine_options::reproducible): 24 rows per step in micro-batches of 2, so
// M = 12 / N per rank; returns the hash of the consolidated parameters after 6 clipped AdamW steps.
template <class Stage, class Prec, class Comm>
std::uint64_t reproducible_hash(Comm& comm) {
  mlp::config cfg;
  cfg.layers = 3;
  cfg.hidden = 45;
  cfg.in = 19;
  cfg.classes = 7;
  cfg.batch = 24;
  cfg.seed = 5;
  zero::optim::adamw opt;
  opt.lr = 1e-2f;
  zero::engine_options eo;
  eo.reproducible = true;
  eo.micro_batches = cfg.batch / (2 * comm.size());
  eo.clip_norm = 0.5f;
  zero::engine<Stage, Comm, zero::optim::adamw, Prec> e(comm, mlp::make_spec(cfg), opt, eo);
  e.initialize(mlp::initializer(cfg));
  for (std::uint64_t t = 0; t < 6; ++t) mlp::train_step(e, cfg, t, comm.rank(), comm.size(), eo.micro_batches);
  const auto p = e.full_params();
  return zero::fnv1a64(p.data(), p.size() * sizeof(float));
}

template <class Comm>
std::vector<std::uint64_t> reproducible_hashes(Comm& comm) {
  std::vector<std::uint64_t> h;
  zero::stages::for_each([&]<class Stage>() {
    h.push_back(reproducible_hash<Stage, zero::precision::fp32>(comm));
    h.push_back(reproducible_hash<Stage, zero::precision::bf16>(comm));
  });
  return h;
}

}  // namespace

TEST_CASE("reproducible: comm::mpi at this N, deterministic and fast modes, equals comm::threads at N = 1") {
  const int n = world_size();
  REQUIRE(12 % n == 0);
  const auto exact = mpi::run([](mpi& c) { return reproducible_hashes(c); });
  // The fast mode sums with MPI's own reductions in MPI's order: integer sums, so the same bits.
  const auto fast = mpi::run([](mpi& c) { return reproducible_hashes(c); }, {.mode = mpi_mode::fast});
  std::vector<std::uint64_t> reference(exact.size());
  if (world_rank() == 0)
    zero::comm::threads::launch(1, [&](zero::comm::threads& c) { reference = reproducible_hashes(c); });
  MPI_Bcast(reference.data(), static_cast<int>(reference.size()), MPI_UINT64_T, 0, MPI_COMM_WORLD);
  for (std::size_t i = 0; i < exact.size(); ++i) {
    CAPTURE(i);  // stage i / 2, fp32 (even) or bf16 (odd)
    CHECK(exact[i] == reference[i % 2]);
    CHECK(fast[i] == reference[i % 2]);
    CHECK(reference[i] == reference[i % 2]);  // every stage at N = 1 alike
  }
  CHECK(reference[0] != reference[1]);  // the precisions differ: the hashes mean something
}

namespace {

// One step of a small model with constant gradients; the last rank changes its learning rate before
// the second. Returns this rank's zero::error message ("" if none).
template <class Stage>
std::string diverging_rate(mpi& comm, float clip) {
  zero::model_spec s;
  for (int u = 0; u < 3; ++u) s.unit("u" + std::to_string(u)).tensor("w", {7, 5});
  zero::engine_options o;
  o.clip_norm = clip;
  try {
    zero::engine<Stage, mpi, zero::optim::adamw> e(comm, s, {}, o);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (auto& x : v) x = 0.25f;
    });
    for (int t = 0; t < 2; ++t) {
      if (t == 1 && comm.rank() == comm.size() - 1) e.set_learning_rate(0.5f);
      for (std::size_t u = 3; u-- > 0;) {
        auto p = e.gather(zero::unit_id{u});
        auto g = e.grads(zero::unit_id{u});
        for (auto& x : g["w"]) x = 1e-2f;
        e.reduce(zero::unit_id{u});
      }
      e.step();
    }
  } catch (const zero::error& x) {
    return x.what();
  }
  return "";
}

}  // namespace

TEST_CASE(
    "comm::mpi: a learning rate changed on one rank only ends in an error on every rank, naming lr and the rank") {
  const std::string odd = "0.5 on rank " + std::to_string(world_size() - 1);
  zero::stages::for_each([&]<class Stage>() {
    for (float clip : {0.0f, 1.0f}) {  // the fingerprint's own all-reduce, or the norm's
      CAPTURE(Stage::stage);
      CAPTURE(clip);
      const std::string m = mpi::run([&](mpi& c) { return diverging_rate<Stage>(c, clip); });
      CAPTURE(m);
      CHECK(m.find("optim::adamw::lr is 0.001 on rank 0 but " + odd) != std::string::npos);
      CHECK(all_ranks(!m.empty()));
    }
  });
}
