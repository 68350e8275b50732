// Out of memory, explained: refusals before allocation and failed allocations name rank, category and bytes.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "../deferred_comm.hpp"
#include "../toy_model.hpp"

namespace {

using zero::mem_category;

// sys::host whose allocate can be made to throw std::bad_alloc, per rank thread: at the k-th
// allocation, or for every allocation of at least some size. It counts the allocations made.
struct failing_host : zero::sys::host {
  static inline thread_local int calls = 0;
  static inline thread_local int fail_at = 0;                  // 1-based; 0: never
  static inline thread_local std::size_t fail_from_bytes = 0;  // 0: never
  static void* allocate(std::size_t bytes) {
    ++calls;
    if ((fail_at != 0 && calls == fail_at) || (fail_from_bytes != 0 && bytes >= fail_from_bytes))
      throw std::bad_alloc();
    return zero::sys::host::allocate(bytes);
  }
  static void reset() {
    calls = 0;
    fail_at = 0;
    fail_from_bytes = 0;
  }
};

// sys::host that reports the memory the test sets, as sys::cuda reports a device's.
struct reporting_host : zero::sys::host {
  static inline zero::memory_info info;
  zero::memory_info available() const { return info; }
};

// comm::threads with another system type: the collectives are forwarded unchanged.
template <class Sys>
class on_system {
 public:
  using system = Sys;
  explicit on_system(zero::comm::threads& inner) : inner_(&inner) {}
  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  template <class T>
  void all_reduce(const T* s, T* r, std::size_t n, zero::reduce_op op) {
    inner_->all_reduce(s, r, n, op);
  }
  template <class T>
  void reduce_scatter(const T* s, T* r, std::size_t n, zero::reduce_op op) {
    inner_->reduce_scatter(s, r, n, op);
  }
  template <class T>
  void all_gather(const T* s, T* r, std::size_t n) {
    inner_->all_gather(s, r, n);
  }
  template <class T>
  void broadcast(const T* s, T* r, std::size_t n, int root) {
    inner_->broadcast(s, r, n, root);
  }
  void barrier() { inner_->barrier(); }

 private:
  zero::comm::threads* inner_;
};
static_assert(zero::CommBackend<on_system<failing_host>>);
static_assert(zero::CommBackend<on_system<reporting_host>>);

// Model-state bytes per rank and category, written from the table of docs/design.md (not from the
// engine): stage s keeps params in full below 3, grads in full below 2, master and slots in full at 0.
struct categories {
  std::uint64_t params, grads, master, optimizer_states;
  std::uint64_t total() const { return params + grads + master + optimizer_states; }
};
template <class Prec>
categories expected(int stage, std::uint64_t psi, std::uint64_t n, int slots) {
  const std::uint64_t p = sizeof(typename Prec::param_type), shard = psi / n;
  return {p * (stage == 3 ? shard : psi), p * (stage >= 2 ? shard : psi),
          Prec::separate_master ? 4 * (stage >= 1 ? shard : psi) : 0,
          4 * static_cast<std::uint64_t>(slots) * (stage >= 1 ? shard : psi)};
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Constructs an engine on every rank of an N-rank world and returns each rank's error message ("" if
// the constructor succeeded), checking that a refusal is error_kind::out_of_memory and allocated nothing.
template <class Stage, class Prec, class Sys>
std::vector<std::string> construct(int n, zero::engine_options o) {
  std::vector<std::string> what(static_cast<std::size_t>(n));
  zero::comm::threads::launch(n, [&](zero::comm::threads& inner) {
    on_system<Sys> comm(inner);
    if constexpr (std::is_same_v<Sys, failing_host>) failing_host::reset();
    try {
      zero::engine<Stage, on_system<Sys>, zero::optim::adamw, Prec> e(comm, toy::spec(), {}, o);
    } catch (const zero::error& e) {
      CHECK(e.kind() == zero::error_kind::out_of_memory);
      if constexpr (std::is_same_v<Sys, failing_host>) CHECK(failing_host::calls == 0);  // refused before allocating
      what[static_cast<std::size_t>(inner.rank())] = e.what();
    }
  });
  return what;
}

template <class Stage, class Prec>
void check_budget_refusal() {
  constexpr int n = 4;
  CAPTURE(Stage::stage);
  const std::uint64_t psi = zero::layout::make(toy::spec(), n).padded();
  std::array<categories, 4> per_stage{};
  for (int s = 0; s < 4; ++s) per_stage[static_cast<std::size_t>(s)] = expected<Prec>(s, psi, n, 2);
  const categories need = per_stage[Stage::stage];
  // The formulas of zero::formula say the same.
  CHECK(need.total() ==
        zero::formula::model_state_bytes(Stage::stage, psi, n,
                                         {sizeof(typename Prec::param_type), sizeof(typename Prec::grad_type),
                                          (Prec::separate_master ? 4u : 0u) + 8u}));
  zero::engine_options o;
  o.memory_limit_bytes = need.total() - 1;
  const auto what = construct<Stage, Prec, failing_host>(n, o);
  for (int r = 0; r < n; ++r) {
    const std::string& w = what[static_cast<std::size_t>(r)];
    CAPTURE(w);
    REQUIRE(!w.empty());
    CHECK(has(w, "rank " + std::to_string(r) + ": out of memory"));
    CHECK(has(w, "ZeRO stage " + std::to_string(Stage::stage) + " at N = 4 need " + std::to_string(need.total()) +
                     " bytes on this rank"));
    CHECK(has(w, "(params " + std::to_string(need.params) + ", grads " + std::to_string(need.grads) + ", master " +
                     std::to_string(need.master) + ", optimizer_states " + std::to_string(need.optimizer_states) +
                     ")"));
    CHECK(has(w, "memory_limit_bytes budget of " + std::to_string(o.memory_limit_bytes) + " bytes"));
    CHECK(has(w, "nothing was allocated"));
    for (int s = 0; s < 4; ++s) {
      CAPTURE(s);
      const std::uint64_t b = per_stage[static_cast<std::size_t>(s)].total();
      CHECK(has(w, "stage " + std::to_string(s) + " (" + std::to_string(b) + " bytes)") == (b <= o.memory_limit_bytes));
    }
  }
  // The budget is inclusive: exactly the model states is enough.
  o.memory_limit_bytes = need.total();
  for (const auto& w : construct<Stage, Prec, failing_host>(n, o)) CHECK(w.empty());
}

}  // namespace

TEST_CASE_TEMPLATE("a budget the model states exceed is refused before allocation, with exact bytes per category",
                   Stage, zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  check_budget_refusal<Stage, zero::precision::fp32>();
  check_budget_refusal<Stage, zero::precision::bf16>();
}

TEST_CASE("when no stage fits, the refusal says so and what stage 3 would need") {
  zero::engine_options o;
  o.memory_limit_bytes = 1000;
  const std::uint64_t psi = zero::layout::make(toy::spec(), 2).padded();
  const auto what = construct<zero::stage1, zero::precision::fp32, failing_host>(2, o);
  for (const auto& w : what) {
    CAPTURE(w);
    CHECK(has(w, "would fit at N = 2: none (stage 3 needs " + std::to_string(16 * psi / 2) + " bytes per rank"));
  }
}

TEST_CASE("a memory that a system reports is shared by its ranks: N x the model states must be free") {
  constexpr int n = 4;
  const std::uint64_t psi = zero::layout::make(toy::spec(), n).padded();
  const std::uint64_t stage1 = expected<zero::precision::fp32>(1, psi, n, 2).total();
  const std::uint64_t stage2 = expected<zero::precision::fp32>(2, psi, n, 2).total();
  const std::uint64_t stage3 = expected<zero::precision::fp32>(3, psi, n, 2).total();
  REQUIRE(stage3 < stage2);
  // Exactly enough for four ranks of stage 3.
  reporting_host::info = zero::memory_info{n * stage3, 1000000, n, "test memory"};
  const auto what = construct<zero::stage1, zero::precision::fp32, reporting_host>(n, {});
  for (int r = 0; r < n; ++r) {
    const std::string& w = what[static_cast<std::size_t>(r)];
    CAPTURE(w);
    CHECK(has(w, "rank " + std::to_string(r) + ": out of memory"));
    CHECK(has(w, "test memory has " + std::to_string(n * stage3) +
                     " bytes free of 1000000 total, shared by 4 ranks "
                     "of this process that need 4 x " +
                     std::to_string(stage1) + " = " + std::to_string(4 * stage1) + " bytes"));
    CHECK(has(w, "would fit at N = 4: stage 3 (" + std::to_string(stage3) + " bytes)"));
    CHECK_FALSE(has(w, "stage 2 ("));
  }
  for (const auto& w : construct<zero::stage3, zero::precision::fp32, reporting_host>(n, {})) CHECK(w.empty());
  // Where nothing fits, more ranks help only if they do not share the memory.
  reporting_host::info.free = n * stage3 - 1;
  for (const auto& w : construct<zero::stage3, zero::precision::fp32, reporting_host>(n, {})) {
    CAPTURE(w);
    CHECK(has(w, "none (stage 3 needs " + std::to_string(stage3) +
                     " bytes per rank; more ranks, each on a memory of its own, would divide it)"));
  }
  // Alone on the memory, a rank needs only its own model states free.
  reporting_host::info = zero::memory_info{stage1, 1000000, 1, "test memory"};
  for (const auto& w : construct<zero::stage1, zero::precision::fp32, reporting_host>(n, {})) CHECK(w.empty());
  reporting_host::info.free = stage1 - 1;
  for (const auto& w : construct<zero::stage1, zero::precision::fp32, reporting_host>(n, {})) {
    CAPTURE(w);
    CHECK(has(w, "test memory has " + std::to_string(stage1 - 1) + " bytes free of 1000000 total;"));
  }
}

TEST_CASE("a transient buffer over the budget names the rank, the category and the bytes asked") {
  constexpr int n = 2;
  const zero::layout l = zero::layout::make(toy::spec(), n);
  const std::uint64_t unit0 = l.unit(zero::unit_id{0}).padded * sizeof(float);
  const std::uint64_t states3 = expected<zero::precision::fp32>(3, l.padded(), n, 2).total();
  std::vector<std::string> what(n);
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine_options o;
    o.memory_limit_bytes = states3;  // the model states fit exactly; nothing more does
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, toy::spec(), {}, o);
    e.initialize(toy::initializer());
    try {
      e.gather(zero::unit_id{0});
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::out_of_memory);
      what[static_cast<std::size_t>(comm.rank())] = x.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    const std::string& w = what[static_cast<std::size_t>(r)];
    CAPTURE(w);
    CHECK(has(w, "rank " + std::to_string(r) + ": out of memory: allocating " + std::to_string(unit0) +
                     " bytes of transient would hold " + std::to_string(states3 + unit0) +
                     " bytes, over the memory_limit_bytes budget of " + std::to_string(states3) + " bytes"));
    CHECK(has(w, "held now: " + std::to_string(states3) + " bytes (params "));
  }
}

TEST_CASE("a system whose allocation fails: transient buffers name rank, category and bytes; the engine goes on") {
  constexpr int n = 2;
  const zero::layout l = zero::layout::make(toy::spec(), n);
  const std::uint64_t unit0 = l.unit(zero::unit_id{0}).padded * sizeof(float);
  const categories held = expected<zero::precision::fp32>(3, l.padded(), n, 2);
  std::vector<std::string> gather_error(n), grads_error(n);
  std::vector<std::uint64_t> hash(n);
  zero::comm::threads::launch(n, [&](zero::comm::threads& inner) {
    on_system<failing_host> comm(inner);
    failing_host::reset();
    zero::engine<zero::stage3, on_system<failing_host>, zero::optim::adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    const auto r = static_cast<std::size_t>(comm.rank());
    failing_host::fail_from_bytes = unit0;  // the model states exist; the next unit-sized buffer fails
    try {
      e.gather(zero::unit_id{0});  // stage 3: the gathered unit
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::out_of_memory);
      gather_error[r] = x.what();
    }
    try {
      e.grads(zero::unit_id{0});  // stages 2-3: the gradient bucket
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::out_of_memory);
      grads_error[r] = x.what();
    }
    // Nothing was left half done: with memory back, a step runs.
    failing_host::fail_from_bytes = 0;
    toy::train_step(e, comm.rank(), 0);
    const auto p = e.full_params();
    hash[r] = zero::fnv1a64(p.data(), p.size() * sizeof(float));
  });
  const std::string held_text = "held now: " + std::to_string(held.total()) + " bytes (params " +
                                std::to_string(held.params) + ", grads " + std::to_string(held.grads) +
                                ", master 0, optimizer_states " + std::to_string(held.optimizer_states) +
                                ", transient 0, offload 0, snapshot 0)";
  for (int r = 0; r < n; ++r) {
    for (const std::string& w : {gather_error[static_cast<std::size_t>(r)], grads_error[static_cast<std::size_t>(r)]}) {
      CAPTURE(w);
      CHECK(has(w, "rank " + std::to_string(r) + ": out of memory: allocating " + std::to_string(unit0) +
                       " bytes of transient failed (std::bad_alloc)"));
      CHECK(has(w, held_text));
    }
  }
  CHECK(hash[0] == hash[1]);
  CHECK(hash[0] == [] {
    const auto p = toy::run<zero::stage3>(n, 1, zero::optim::adamw{}).params;
    return zero::fnv1a64(p.data(), p.size() * sizeof(float));
  }());
}

TEST_CASE("a model-state allocation that fails names its category and what was already held") {
  constexpr int n = 2;
  const zero::layout l = zero::layout::make(toy::spec(), n);
  const std::uint64_t shard = l.shard_total() * sizeof(float);
  std::vector<std::string> what(n);
  zero::comm::threads::launch(n, [&](zero::comm::threads& inner) {
    on_system<failing_host> comm(inner);
    failing_host::reset();
    failing_host::fail_at = 3;  // fp32 AdamW allocates params, grads, then the optimizer slots
    try {
      zero::engine<zero::stage3, on_system<failing_host>, zero::optim::adamw> e(comm, toy::spec());
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::out_of_memory);
      what[static_cast<std::size_t>(comm.rank())] = x.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    const std::string& w = what[static_cast<std::size_t>(r)];
    CAPTURE(w);
    CHECK(has(w, "rank " + std::to_string(r) + ": out of memory: allocating " + std::to_string(shard) +
                     " bytes of optimizer_states failed (std::bad_alloc); held now: " + std::to_string(2 * shard) +
                     " bytes (params " + std::to_string(shard) + ", grads " + std::to_string(shard) +
                     ", master 0, optimizer_states 0, transient 0, offload 0, snapshot 0)"));
  }
}

namespace {

// One rank's run of the plan's loop (plan.hpp: each micro-batch gathers and releases every unit
// forward, then gathers, writes the gradients and reduces backward) on a backend that overlaps, so that
// reduces stay in flight: what it held at most, its parameters after the steps, or its refusal.
struct overlapped_run {
  std::size_t peak_total = 0, transient_peak = 0;
  std::vector<float> params;
  std::string error;
};
template <class Stage>
overlapped_run train_overlapped(int n, const zero::engine_options& o, int steps) {
  using Comm = testing::deferred<zero::comm::threads>;
  const zero::model_spec s = toy::spec();
  std::vector<overlapped_run> out(static_cast<std::size_t>(n));
  try {
    zero::comm::threads::launch(n, [&](zero::comm::threads& threads) {
      Comm comm(threads);
      zero::engine<Stage, Comm, zero::optim::adamw> e(comm, s, {}, o);
      e.initialize(toy::initializer());
      for (int t = 0; t < steps; ++t) {
        for (int k = 0; k < o.micro_batches; ++k) {
          for (std::size_t u = 0; u < s.num_units(); ++u) e.gather(zero::unit_id{u}).release();
          for (std::size_t u = s.num_units(); u-- > 0;) {
            const zero::unit_id id{u};
            auto p = e.gather(id);
            auto g = e.grads(id);
            const auto gv = g.view();
            for (std::size_t j = 0; j < gv.size(); ++j)
              gv.data()[j] = std::sin(static_cast<float>(j + 7 * u + 3 * static_cast<std::size_t>(k)) * 0.37f +
                                      static_cast<float>(comm.rank() + t));
            e.reduce(id);
          }
        }
        e.step();
      }
      overlapped_run& r = out[static_cast<std::size_t>(comm.rank())];
      r.peak_total = e.memory().peak_total;
      r.transient_peak = e.memory().peak_bytes(mem_category::transient);
      r.params = e.full_params();
    });
  } catch (const zero::error& e) {
    overlapped_run r;
    r.error = e.what();
    return r;
  }
  return out[0];
}

// Overlap never needs more memory than the blocking protocol: under a memory_limit_bytes the blocking
// protocol fits, every reducer leaves reduces in flight only while the bytes they will take to
// complete (qgZ's node sums in two hops) are free, so the engine trains within the limit, with the
// same bits, and the plan under that limit says it fits and is the engine's peak.
template <class Stage>
void check_overlap_within_blocking_peak(const zero::engine_options& o, const std::string& what) {
  constexpr int n = 4, steps = 2;
  CAPTURE(Stage::stage);
  CAPTURE(what);
  using Comm = testing::deferred<zero::comm::threads>;
  using adamw = zero::optim::adamw;
  using fp32 = zero::precision::fp32;
  const zero::model_spec s = toy::spec();
  const zero::plan_report blocking = zero::plan_for<Stage, adamw, fp32>(s, n, o);
  const zero::plan_report unlimited = zero::plan_for<Stage, Comm, adamw, fp32>(s, n, o);
  REQUIRE(unlimited.overlapping);
  const overlapped_run free_run = train_overlapped<Stage>(n, o, steps);
  REQUIRE(free_run.error == "");
  CHECK(unlimited.peak_bytes == free_run.peak_total);
  for (const std::uint64_t limit : {blocking.peak_bytes, (blocking.peak_bytes + unlimited.peak_bytes) / 2}) {
    CAPTURE(limit);
    zero::engine_options tight = o;
    tight.memory_limit_bytes = limit;
    const zero::plan_report planned = zero::plan_for<Stage, Comm, adamw, fp32>(s, n, tight);
    CHECK(planned.fits(limit));
    const overlapped_run r = train_overlapped<Stage>(n, tight, steps);
    CHECK(r.error == "");
    if (!r.error.empty()) continue;
    CHECK(r.peak_total <= limit);
    CHECK(planned.peak_bytes == r.peak_total);
    CHECK(planned.step_transient_peak == r.transient_peak);
    CHECK(r.params == free_run.params);  // completing reduces earlier changes no bit
  }
  // Below the blocking peak the engine does what the plan says: refuses as out of memory, or trains
  // to the planned peak.
  zero::engine_options below = o;
  below.memory_limit_bytes = blocking.peak_bytes - 1;
  const zero::plan_report planned = zero::plan_for<Stage, Comm, adamw, fp32>(s, n, below);
  const overlapped_run r = train_overlapped<Stage>(n, below, steps);
  CHECK(planned.fits(below.memory_limit_bytes) == r.error.empty());
  if (r.error.empty())
    CHECK(planned.peak_bytes == r.peak_total);
  else
    CHECK(has(r.error, "out of memory"));
}

template <class Stage>
void check_every_reducer_within_blocking_peak() {
  zero::engine_options o;
  o.micro_batches = 2;
  check_overlap_within_blocking_peak<Stage>(o, "exact reduce-scatter, 2 micro-batches");
  o.reduce_bucket_elements = 600;
  check_overlap_within_blocking_peak<Stage>(o, "exact, fused buckets");
  o = {};
  o.micro_batches = 2;
  o.zeropp.qgz = true;
  check_overlap_within_blocking_peak<Stage>(o, "qgZ, one node");
  o.zeropp.node_size = 2;
  check_overlap_within_blocking_peak<Stage>(o, "qgZ in two hops");
  o.reduce_bucket_elements = 600;
  check_overlap_within_blocking_peak<Stage>(o, "qgZ in two hops, fused buckets");
  o.reduce_bucket_elements = 0;
  o.zeropp.qgz_error_feedback = true;
  check_overlap_within_blocking_peak<Stage>(o, "qgZ in two hops with error feedback");
  o.zeropp.node_size = 0;
  check_overlap_within_blocking_peak<Stage>(o, "qgZ with error feedback, one node");
  o = {};
  o.micro_batches = 2;
  o.reproducible = true;
  check_overlap_within_blocking_peak<Stage>(o, "binned (reproducible)");
}

}  // namespace

TEST_CASE("with overlap on, every reducer trains within a limit the blocking protocol fits, as the plan says") {
  check_every_reducer_within_blocking_peak<zero::stage1>();
  check_every_reducer_within_blocking_peak<zero::stage2>();
}

TEST_CASE("out_of_memory is an error kind of its own") {
  CHECK(std::string(zero::to_string(zero::error_kind::out_of_memory)) == "out of memory");
}
