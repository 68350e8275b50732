// comm::mpi's nonblocking collectives under mpirun: the blocking calls' bits in any wait order, the recorder, and the engine overlapping on MPI.
#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../../examples/mlp.hpp"
#include "zero/comm/conformance.hpp"
#include "../deferred_comm.hpp"
#include "zero/comm/backends/mpi.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/zero.hpp"

// As in test_mpi.cpp: every rank issues the same collectives whatever its checks find, and a failure
// inside a collective sequence goes through comm::mpi::run, which aborts the job.

namespace {

using zero::comm::mpi;
using zero::comm::mpi_mode;
using std::chrono::milliseconds;

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
bool all_ranks(bool v) {
  int x = v ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return x == 1;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::vector<zero::bf16> bf16_input(int rank, std::size_t n, std::uint64_t salt) {
  const auto f = zero::conformance::input<float>(rank, n, salt);
  std::vector<zero::bf16> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = zero::bf16(f[i]);
  return v;
}

// The buffers of a fixed set of collectives: three all_reduces (two in place; one bf16), two
// reduce_scatters (one in place: recv inside send), two all_gathers (one in place, one bf16).
struct buffers {
  std::vector<float> ar1, ar2_in, ar2_out, ar3;
  std::vector<zero::bf16> arh, agh_in, agh_out;
  std::vector<float> rs1;  // in place: this rank's slice of rs1 receives
  std::vector<double> rs2_in, rs2_out;
  std::vector<float> ag1;  // in place
  std::vector<float> ag2_in, ag2_out;
  std::vector<float> blocking;

  buffers(int r, std::size_t n) {
    ar1 = zero::conformance::input<float>(r, 1001, 1);
    ar2_in = zero::conformance::input<float>(r, 7, 2);
    ar2_out.assign(7, 0.0f);
    ar3 = zero::conformance::input<float>(r, 4096 + 3, 3);
    arh = bf16_input(r, 999, 4);
    rs1 = zero::conformance::input<float>(r, 333 * n, 5);
    rs2_in = zero::conformance::input<double>(r, 129 * n, 6);
    rs2_out.assign(129, 0.0);
    ag1.assign(257 * n, 0.0f);
    const auto mine = zero::conformance::input<float>(r, 257, 7);
    std::memcpy(ag1.data() + 257 * static_cast<std::size_t>(r), mine.data(), 257 * sizeof(float));
    ag2_in = zero::conformance::input<float>(r, 65, 8);
    ag2_out.assign(65 * n, 0.0f);
    agh_in = bf16_input(r, 31, 9);
    agh_out.assign(31 * n, zero::bf16(0.0f));
    blocking = zero::conformance::input<float>(r, 100, 10);
  }
  bool operator==(const buffers& o) const {
    return same_bits(ar1, o.ar1) && same_bits(ar2_out, o.ar2_out) && same_bits(ar3, o.ar3) && same_bits(arh, o.arh) &&
           same_bits(rs1, o.rs1) && same_bits(rs2_out, o.rs2_out) && same_bits(ag1, o.ag1) &&
           same_bits(ag2_out, o.ag2_out) && same_bits(agh_out, o.agh_out) && same_bits(blocking, o.blocking);
  }
};

// The collectives of `buffers` through the blocking calls.
void run_blocking(mpi& c, buffers& b) {
  const auto r = static_cast<std::size_t>(c.rank());
  c.all_reduce(b.ar1.data(), b.ar1.data(), b.ar1.size(), zero::reduce_op::sum);
  c.reduce_scatter(b.rs1.data(), b.rs1.data() + 333 * r, 333, zero::reduce_op::sum);
  c.all_gather(b.ag1.data() + 257 * r, b.ag1.data(), 257);
  c.all_reduce(b.ar2_in.data(), b.ar2_out.data(), 7, zero::reduce_op::max);
  c.all_reduce(b.blocking.data(), b.blocking.data(), b.blocking.size(), zero::reduce_op::sum);
  c.all_reduce(b.arh.data(), b.arh.data(), b.arh.size(), zero::reduce_op::sum);
  c.reduce_scatter(b.rs2_in.data(), b.rs2_out.data(), 129, zero::reduce_op::sum);
  c.all_gather(b.ag2_in.data(), b.ag2_out.data(), 65);
  c.all_reduce(b.ar3.data(), b.ar3.data(), b.ar3.size(), zero::reduce_op::sum);
  c.all_gather(b.agh_in.data(), b.agh_out.data(), 31);
}

// The same collectives started, with a blocking all_reduce and a barrier among them, and waited for
// in an order that differs between ranks (rotated by the rank). Returns how many were in flight.
std::size_t run_started(mpi& c, buffers& b) {
  const auto r = static_cast<std::size_t>(c.rank());
  std::vector<mpi::request> q;
  q.push_back(c.start_all_reduce(b.ar1.data(), b.ar1.data(), b.ar1.size(), zero::reduce_op::sum));
  q.push_back(c.start_reduce_scatter(b.rs1.data(), b.rs1.data() + 333 * r, 333, zero::reduce_op::sum));
  q.push_back(c.start_all_gather(b.ag1.data() + 257 * r, b.ag1.data(), 257));
  q.push_back(c.start_all_reduce(b.ar2_in.data(), b.ar2_out.data(), 7, zero::reduce_op::max));
  c.all_reduce(b.blocking.data(), b.blocking.data(), b.blocking.size(), zero::reduce_op::sum);
  q.push_back(c.start_all_reduce(b.arh.data(), b.arh.data(), b.arh.size(), zero::reduce_op::sum));
  q.push_back(c.start_reduce_scatter(b.rs2_in.data(), b.rs2_out.data(), 129, zero::reduce_op::sum));
  q.push_back(c.start_all_gather(b.ag2_in.data(), b.ag2_out.data(), 65));
  c.barrier();
  q.push_back(c.start_all_reduce(b.ar3.data(), b.ar3.data(), b.ar3.size(), zero::reduce_op::sum));
  q.push_back(c.start_all_gather(b.agh_in.data(), b.agh_out.data(), 31));
  const std::size_t in_flight = c.in_flight();
  // Newest first on rank 0; on rank k, starting k from the end, wrapping.
  for (std::size_t i = 0; i < q.size(); ++i) c.wait(q[(2 * q.size() - 1 - i - r) % q.size()]);
  return in_flight;
}

struct mode_case {
  const char* name;
  zero::comm::mpi_options backend;
};
// The fast mode with timeout 0 is left out: its blocking calls are MPI_Allreduce and
// MPI_Reduce_scatter_block, whose algorithm (and so the last bits) may differ from the nonblocking
// forms that start_* posts.
const mode_case modes[] = {
    {"deterministic", {}},
    {"deterministic, blocking", {.timeout = milliseconds(0)}},
    {"deterministic, verified", {.verify = true}},
    {"fast", {.mode = mpi_mode::fast}},
};

}  // namespace

TEST_CASE("comm::mpi nonblocking: started collectives give the blocking calls' bits, waited for in any order") {
  static_assert(zero::comm::nonblocking<mpi>);
  const int n = world_size();
  for (const auto& m : modes) {
    const std::string mode = m.name;
    CAPTURE(mode);
    bool same = false;
    std::size_t in_flight = 0, left = 1, pooled = 0, released = 1;
    mpi::run(
        [&](mpi& c) {
          buffers want(c.rank(), static_cast<std::size_t>(n)), got = want;
          run_blocking(c, want);
          in_flight = run_started(c, got);
          same = got == want;
          left = c.in_flight();
          pooled = c.scratch_bytes();
          c.release_scratch();
          released = c.scratch_bytes();
        },
        m.backend);
    CHECK(same);
    CHECK(in_flight == 9);
    CHECK(left == 0);
    // Exchange buffers of started collectives are kept for reuse, then released (deterministic
    // mode: all_reduce and reduce_scatter use one each; the fast mode's reduce_scatter is not in place).
    if (m.backend.mode == mpi_mode::deterministic && n > 1) CHECK(pooled > 0);
    CHECK(released == 0);
    CHECK(all_ranks(same));
  }
}

namespace {
std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t k = 0;
  for (std::size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++k;
  return k;
}
}  // namespace

TEST_CASE("comm::mpi nonblocking: the flight recorder shows the started collectives until they complete") {
  const auto n = static_cast<std::size_t>(world_size());
  std::string started, after;
  std::size_t in_flight = 0;
  bool late = false;
  mpi::run([&](mpi& c) {
    std::vector<float> a(300, 1.0f), b(40 * n, 2.0f), d(40), e(40 * n);
    c.barrier();  // #0
    // Rank 1 starts late, so that on the other ranks none of the three can have completed when
    // they look (each start also polls the collectives in flight).
    late = c.rank() == 1;
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto r1 = c.start_all_reduce(a.data(), a.data(), a.size(), zero::reduce_op::sum);
    auto r2 = c.start_reduce_scatter(b.data(), d.data(), 40, zero::reduce_op::sum);
    auto r3 = c.start_all_gather(a.data() + 260, e.data(), 40);
    started = c.report();
    in_flight = c.in_flight();
    c.wait(r2);
    c.wait(r3);
    c.wait(r1);
    after = c.report();
  });
  CAPTURE(started);
  CAPTURE(after);
  CHECK(in_flight == 3);
  CHECK(started.find("#0 barrier: +") != std::string::npos);
  for (const char* call : {"#1 all_reduce(float x 300, sum): +", "#2 reduce_scatter(float x 40, sum): +",
                           "#3 all_gather(float x 40): +"}) {
    CAPTURE(call);
    const auto at = started.find(call);
    REQUIRE(at != std::string::npos);
    if (!late) CHECK(started.substr(at, started.find('\n', at) - at).find(" s, not ended") != std::string::npos);
    CHECK(after.find(call) != std::string::npos);
  }
  if (!late) CHECK(count_of(started, "not ended") == 3);
  CHECK(count_of(after, "not ended") == 0);
  CHECK(count_of(after, " to +") == 4);
}

TEST_CASE("comm::mpi nonblocking: a dropped request completes in its destructor; the backend completes what is left") {
  const int n = world_size();
  std::vector<float> x = zero::conformance::input<float>(0, 500, 21), y = x, z = x;
  bool ok = false;
  mpi::run([&](mpi& c) {
    {
      mpi::request moved;
      {
        auto r = c.start_all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
        moved = std::move(r);
        CHECK(!r.pending());
      }
      CHECK(moved.pending());
      CHECK(c.in_flight() == 1);
    }  // waits here
    ok = c.in_flight() == 0;
    c.all_reduce(y.data(), y.data(), y.size(), zero::reduce_op::sum);
    mpi::request empty;
    c.wait(empty);  // a default request is complete
  });
  CHECK(ok);
  CHECK(same_bits(x, y));  // every rank had the same input: n times it, in both
  CHECK(x[0] == z[0] * static_cast<float>(n));
  {
    mpi c;
    auto kept = c.start_all_reduce(z.data(), z.data(), z.size(), zero::reduce_op::sum);
    mpi moved(std::move(c));  // the request follows the backend
    moved.wait(kept);
    CHECK(moved.in_flight() == 0);
  }
  CHECK(same_bits(z, y));
}

// ---- the engine over comm::mpi with overlap ---------------------------------------------------

namespace {

constexpr int steps = 5;

mlp::config small_mlp() {
  mlp::config cfg;
  cfg.layers = 3;
  cfg.hidden = 45;
  cfg.in = 19;
  cfg.classes = 7;
  cfg.batch = 24;  // divisible by 2, 3 and 4
  cfg.seed = 5;
  return cfg;
}

struct trained {
  std::vector<float> params;
  zero::overlap_report overlap;
  std::array<std::size_t, zero::mem_category_count> current{};  // memory() after the steps
  std::size_t transient_peak = 0, peak_total = 0;
  zero::comm::comm_stats last_step;
};

template <class Stage, class Prec, class Comm>
trained train(Comm& comm, bool overlap) {
  const mlp::config cfg = small_mlp();
  zero::optim::adamw opt;
  opt.lr = 1e-2f;
  zero::engine_options o;
  o.overlap = overlap;
  zero::engine<Stage, Comm, zero::optim::adamw, Prec> e(comm, mlp::make_spec(cfg), opt, o);
  e.initialize(mlp::initializer(cfg));
  for (std::uint64_t t = 0; t < steps; ++t) mlp::train_step(e, cfg, t, comm.rank(), comm.size());
  // Read before full_params(), whose consolidation buffers are not the loop's.
  trained r;
  r.overlap = e.overlap();
  r.current = e.memory().current;
  r.transient_peak = e.memory().peak_bytes(zero::mem_category::transient);
  r.peak_total = e.memory().peak_total;
  r.last_step = e.comm().last_step;
  r.params = e.full_params();
  return r;
}

// zero::plan for the engine over Comm (which says whether it overlaps) equals what it measured.
template <class Stage, class Prec, class Comm>
void check_plan(const trained& t, int n, bool overlap) {
  zero::engine_options o;
  o.overlap = overlap;
  const auto p = zero::plan_for<Stage, Comm, zero::optim::adamw, Prec>(mlp::make_spec(small_mlp()), n, o);
  CHECK(p.overlapping == overlap);
  CHECK(p.model_states.params == t.current[static_cast<int>(zero::mem_category::params)]);
  CHECK(p.model_states.grads == t.current[static_cast<int>(zero::mem_category::grads)]);
  CHECK(p.model_states.master == t.current[static_cast<int>(zero::mem_category::master)]);
  CHECK(p.model_states.optimizer_states == t.current[static_cast<int>(zero::mem_category::optimizer_states)]);
  CHECK(p.step_transient_peak == t.transient_peak);
  CHECK(p.peak_bytes == t.peak_total);
  for (int c = 0; c < zero::comm::collective_count; ++c) {
    CHECK(p.step_comm.bytes[static_cast<std::size_t>(c)] == t.last_step.bytes[static_cast<std::size_t>(c)]);
    CHECK(p.step_comm.calls[static_cast<std::size_t>(c)] == t.last_step.calls[static_cast<std::size_t>(c)]);
  }
}

bool same_report(const zero::overlap_report& a, const zero::overlap_report& b) {
  return a.active == b.active && a.prefetches == b.prefetches && a.prefetch_hits == b.prefetch_hits &&
         a.prefetch_misses == b.prefetch_misses && a.reduces_started == b.reduces_started &&
         a.max_reduces_in_flight == b.max_reduces_in_flight;
}

}  // namespace

TEST_CASE("engine over comm::mpi: overlap on gives the bits of overlap off, every stage, fp32 and bf16") {
  const int n = world_size();
  REQUIRE(24 % n == 0);
  const std::uint64_t units = static_cast<std::uint64_t>(small_mlp().layers);
  auto each = [&]<class Prec>(const char* precision) {
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(precision);
      CAPTURE(Stage::stage);
      trained on, off;
      mpi::run([&](mpi& c) {
        on = train<Stage, Prec>(c, true);
        off = train<Stage, Prec>(c, false);
      });
      CHECK(same_bits(on.params, off.params));
      CHECK(on.overlap.active);
      CHECK(!off.overlap.active);
      // zero::plan with overlap on comm::mpi (prefetches, reduces in flight) and off: the engine's bytes.
      check_plan<Stage, Prec, mpi>(on, n, true);
      check_plan<Stage, Prec, mpi>(off, n, false);
      CHECK(on.overlap.reduces_started == steps * units);
      if constexpr (Stage::stage == 3) {
        // The gathers after the first step's follow the recorded order: prefetched (how many, the
        // engine's rules decide: compared with threads below), and every prefetch hits.
        CHECK(on.overlap.prefetches >= (steps - 1) * (2 * units - 2));
        CHECK(on.overlap.prefetch_hits == on.overlap.prefetches);
        CHECK(on.overlap.prefetch_misses == 0);
      }
      // The same counts as the nonblocking test backend over comm::threads (tests/engine/test_overlap.cpp).
      trained ref;
      zero::comm::threads::launch(n, [&](zero::comm::threads& base) {
        testing::deferred<zero::comm::threads> comm(base);
        auto r = train<Stage, Prec>(comm, true);
        if (base.rank() == 0) ref = std::move(r);
      });
      CHECK(same_report(on.overlap, ref.overlap));
      CHECK(same_bits(on.params, ref.params));  // and the same bits, as the deterministic mode promises
      CHECK(all_ranks(same_bits(on.params, off.params)));
    });
  };
  each.operator()<zero::precision::fp32>("fp32");
  each.operator()<zero::precision::bf16>("bf16");
}

TEST_CASE("engine over comm::mpi, fast mode: overlap on gives the bits of overlap off, every stage") {
  const int n = world_size();
  REQUIRE(24 % n == 0);
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    trained on, off;
    mpi::run(
        [&](mpi& c) {
          on = train<Stage, zero::precision::fp32>(c, true);
          off = train<Stage, zero::precision::fp32>(c, false);
        },
        {.mode = mpi_mode::fast});
    CHECK(on.overlap.active);
    CHECK(same_bits(on.params, off.params));
    CHECK(all_ranks(same_bits(on.params, off.params)));
  });
}
