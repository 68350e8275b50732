// zero::plan against the engine: every category's bytes, the transient peaks and the bytes sent per step, as measured.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if __has_include(<nlohmann/json.hpp>)
#include <nlohmann/json.hpp>
#define ZERO_TEST_PLAN_CLI 1
#endif

#include "../deferred_comm.hpp"
#include "../engine_instances.hpp"
#include "zero/plan_by_name.hpp"
#include "zero/zero.hpp"

namespace {

using zero::mem_category;

// Units of different sizes; the largest tensor (block.w) is not alone in its unit, and the largest
// unit is not the first, so "the largest" has to be found.
zero::model_spec spec() {
  zero::model_spec s;
  s.unit("embed").tensor("w", {50, 12});
  s.unit("tiny").tensor("scale", {1});
  s.unit("block").tensor("w", {24, 40}).tensor("b", {24}).tensor("gain", {1});
  s.unit("head").tensor("w", {7, 50}).tensor("b", {7});
  return s;
}

zero::init_range_fn init() {
  return [](const zero::unit_spec&, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>((r.begin + i + t.numel) % 13) - 0.06f;
  };
}

struct measured {
  std::array<std::size_t, zero::mem_category_count> current{};
  std::size_t transient_peak = 0, peak_total = 0;
  std::uint64_t offloaded = 0;               // offload(): host and disk bytes
  std::uint64_t staging = 0, checksums = 0;  // offload(): the disk tier's slice sets and checksums
  zero::comm::comm_stats last_step, control;
  bool skipped = false;
  bool out_of_memory = false;
  std::string error;
};

// Trains `steps` steps of the protocol's loop (plan.hpp: each micro-batch gathers and releases every
// unit forward, then gathers, writes the gradients and reduces backward) on N thread ranks, and
// returns rank 0's measurements. Overlapping: over testing::deferred, a backend that overlaps (its
// collectives run only when waited for), so that the engine leaves reduces and gathers in flight.
template <class Stage, class Opt, class Prec, bool Overlapping = false>
measured train_on(const zero::model_spec& s, int n, const zero::engine_options& options, int steps = 2,
                  zero::release_order order = zero::release_order::after_reduce) {
  std::vector<measured> out(static_cast<std::size_t>(n));
  try {
    zero::comm::threads::launch(n, [&](zero::comm::threads& threads) {
      using Comm = std::conditional_t<Overlapping, testing::deferred<zero::comm::threads>, zero::comm::threads>;
      std::optional<testing::deferred<zero::comm::threads>> wrapped;
      if constexpr (Overlapping) wrapped.emplace(threads);
      Comm& comm = *[&] {
        if constexpr (Overlapping)
          return &*wrapped;
        else
          return &threads;
      }();
      zero::engine<Stage, Comm, Opt, Prec> e(comm, s, Opt{}, options);
      e.initialize(init());
      measured& m = out[static_cast<std::size_t>(comm.rank())];
      const bool once = options.accumulate == zero::accumulation::local_then_reduce;
      for (int t = 0; t < steps; ++t) {
        for (int k = 0; k < options.micro_batches; ++k) {
          for (std::size_t u = 0; u < s.num_units(); ++u) e.gather(zero::unit_id{u}).release();
          for (std::size_t u = s.num_units(); u-- > 0;) {
            const zero::unit_id id{u};
            auto p = e.gather(id);
            auto g = e.grads(id);
            using G = typename decltype(e)::grad_type;
            const auto gv = g.view();
            for (std::size_t j = 0; j < gv.size(); ++j)
              gv.data()[j] = static_cast<G>(
                  0.01f * std::sin(static_cast<float>(j + 3 * u + static_cast<std::size_t>(comm.rank())) * 0.37f) *
                  e.loss_scale());
            if (order == zero::release_order::before_reduce) p.release();
            if (!once || k + 1 == options.micro_batches) e.reduce(id);
          }  // after_reduce: the handle releases the unit here
        }
        m.skipped = m.skipped || e.step().skipped;
      }
      m.current = e.memory().current;
      m.offloaded = e.offload().host_bytes + e.offload().disk_bytes;
      m.staging = e.offload().staging_bytes;
      m.checksums = e.offload().checksum_bytes;
      m.transient_peak = e.memory().peak_bytes(mem_category::transient);
      m.peak_total = e.memory().peak_total;
      m.last_step = e.comm().last_step;
      m.control = e.comm().control;
    });
  } catch (const zero::error& e) {
    measured m;
    m.out_of_memory = e.kind() == zero::error_kind::out_of_memory;
    m.error = e.what();
    return m;
  }
  return out[0];
}
template <class Stage, class Opt, class Prec, bool Overlapping = false>
measured train(int n, const zero::engine_options& options, int steps = 2,
               zero::release_order order = zero::release_order::after_reduce) {
  return train_on<Stage, Opt, Prec, Overlapping>(spec(), n, options, steps, order);
}

void check_stats(const zero::comm::comm_stats& planned, const zero::comm::comm_stats& got, std::uint64_t times = 1) {
  for (int c = 0; c < zero::comm::collective_count; ++c) {
    CAPTURE(zero::comm::to_string(static_cast<zero::comm::collective>(c)));
    CHECK(times * planned.bytes[static_cast<std::size_t>(c)] == got.bytes[static_cast<std::size_t>(c)]);
    CHECK(times * planned.calls[static_cast<std::size_t>(c)] == got.calls[static_cast<std::size_t>(c)]);
    CHECK(times * planned.inter[static_cast<std::size_t>(c)] == got.inter[static_cast<std::size_t>(c)]);
  }
}

template <class Stage, class Opt, class Prec, bool Overlapping = false>
void check_plan(int n, const zero::engine_options& options, const std::string& what,
                zero::release_order order = zero::release_order::after_reduce) {
  CAPTURE(Stage::stage);
  CAPTURE(Opt::name);
  CAPTURE(Prec::name);
  CAPTURE(n);
  CAPTURE(what);
  CAPTURE(Overlapping);
  CAPTURE(zero::to_string(order));
  const zero::model_spec s = spec();
  using Comm = std::conditional_t<Overlapping, testing::deferred<zero::comm::threads>, zero::comm::threads>;
  const zero::plan_report p = zero::plan_for<Stage, Comm, Opt, Prec>(s, n, options, order);
  CHECK(p.overlapping == (Overlapping && options.overlap));
  CHECK(p.order == order);
  const int steps = 2;
  const measured m = train<Stage, Opt, Prec, Overlapping>(n, options, steps, order);
  REQUIRE(m.error.empty());
  REQUIRE_FALSE(m.skipped);  // the plan assumes every step updates
  CHECK(p.model_states.params == m.current[static_cast<int>(mem_category::params)]);
  CHECK(p.model_states.grads == m.current[static_cast<int>(mem_category::grads)]);
  CHECK(p.model_states.master == m.current[static_cast<int>(mem_category::master)]);
  CHECK(p.model_states.optimizer_states == m.current[static_cast<int>(mem_category::optimizer_states)]);
  CHECK(m.current[static_cast<int>(mem_category::transient)] == 0);
  CHECK(p.model_states.offload == m.current[static_cast<int>(mem_category::offload)]);
  CHECK(p.offloaded_bytes == m.offloaded);
  CHECK(p.offload_staging_bytes == m.staging);
  CHECK(p.offload_checksum_bytes == m.checksums);
  CHECK(p.step_transient_peak == m.transient_peak);
  CHECK(p.peak_bytes == m.peak_total);
  check_stats(p.step_comm, m.last_step);
  check_stats(p.control_comm, m.control, steps);
  // The bytes per step are the paper's formula's (the reproducible mode's, formula::reproducible_*;
  // ZeRO++'s per link level, formula::bytes_per_step).
  const zero::zeropp_options& z = options.zeropp;
  if (z.qwz || z.qgz || z.hpz) {
    std::vector<zero::formula::unit_extent> extents;
    for (const auto& u : p.units) extents.push_back({u.padded, u.gathers});
    const auto b = zero::formula::bytes_per_step(
        Stage::stage, extents, n, sizeof(typename Prec::comm_type),
        options.accumulate == zero::accumulation::reduce_each_micro_batch ? options.micro_batches : 1,
        {z.qwz, z.qgz, z.hpz, z.weights, z.gradients, z.node_size});
    CHECK(p.step_bytes_sent() == b.total);
    CHECK(p.step_comm.inter_node_bytes() == b.inter);
  } else if (options.reproducible)
    CHECK(p.step_bytes_sent() == zero::formula::reproducible_comm_bytes_per_step(
                                     Stage::stage, p.padded, n, sizeof(typename Prec::param_type),
                                     options.micro_batches, s.num_units(), 0, p.persistent,
                                     zero::formula::reproducible_exchanges_values(Stage::stage, n, 1, true)
                                         ? sizeof(typename Prec::grad_type)
                                         : 0));
  else
    CHECK(p.step_bytes_sent() ==
          zero::formula::comm_bytes_per_step(
              Stage::stage, p.padded, n, sizeof(typename Prec::comm_type),
              options.accumulate == zero::accumulation::reduce_each_micro_batch ? options.micro_batches : 1, 0,
              p.persistent));

  // fits() is exact: a budget of peak_bytes trains, one byte less is refused as out of memory.
  zero::engine_options tight = options;
  tight.memory_limit_bytes = p.peak_bytes;
  CHECK(p.fits(tight.memory_limit_bytes));
  CHECK(train<Stage, Opt, Prec, Overlapping>(n, tight, 2, order).error == "");
  tight.memory_limit_bytes = p.peak_bytes - 1;
  CHECK_FALSE(p.fits(tight.memory_limit_bytes));
  // Gather buckets admit their further units only where the budget has room: under a smaller limit
  // they shrink, down to the peak of gathering unit by unit, below which the engine is refused.
  if (Stage::shards_parameters && options.gather_bucket_elements > 0) {
    zero::engine_options single = options;
    single.gather_bucket_elements = 0;
    const std::uint64_t floor = zero::plan_for<Stage, Comm, Opt, Prec>(s, n, single, order).peak_bytes;
    for (const std::uint64_t limit : {p.peak_bytes - 1, (p.peak_bytes + floor) / 2, floor, floor - 1}) {
      CAPTURE(limit);
      tight.memory_limit_bytes = limit;
      const zero::plan_report q = zero::plan_for<Stage, Comm, Opt, Prec>(s, n, tight, order);
      const measured t = train<Stage, Opt, Prec, Overlapping>(n, tight, 2, order);
      CHECK(q.fits(limit) == !t.out_of_memory);
      if (!p.overlapping) CHECK(q.fits(limit) == (limit >= floor));
      if (t.out_of_memory) continue;
      CHECK(t.error == "");
      CHECK(q.step_transient_peak == t.transient_peak);
      CHECK(q.peak_bytes == t.peak_total);
      check_stats(q.step_comm, t.last_step);
    }
    return;
  }
  if (!p.overlapping) {
    CHECK(train<Stage, Opt, Prec, Overlapping>(n, tight, 2, order).out_of_memory);
    return;
  }
  // Overlapping, one byte less makes the engine give back what overlap holds (complete reduces in
  // flight, drop prefetches) before it allocates: the plan under that limit is the engine's too,
  // down to the blocking protocol's peak, below which it is refused.
  const zero::plan_report blocking = zero::plan_for<Stage, Opt, Prec>(s, n, options, order);
  for (const std::uint64_t limit :
       {p.peak_bytes - 1, (p.peak_bytes + blocking.peak_bytes) / 2, blocking.peak_bytes, blocking.peak_bytes - 1}) {
    CAPTURE(limit);
    tight.memory_limit_bytes = limit;
    const zero::plan_report q = zero::plan_for<Stage, Comm, Opt, Prec>(s, n, tight, order);
    const measured t = train<Stage, Opt, Prec, Overlapping>(n, tight, 2, order);
    CHECK(q.fits(limit) == !t.out_of_memory);
    // Overlap needs no more than the blocking protocol, for every reducer: a reduce stays in flight
    // only while what completing it takes (qgZ's node sums in two hops) is kept free. Below the
    // blocking peak, qgZ in two hops may still fit: a reduce that found no room for its node sums
    // completes once a later allocation makes room, after its unit was released (stage 3), where the
    // blocking protocol completes it beside the unit.
    const bool two_hop = options.zeropp.qgz && options.zeropp.node_size > 1 && options.zeropp.node_size < n;
    if (limit >= blocking.peak_bytes || !two_hop) CHECK(q.fits(limit) == (limit >= blocking.peak_bytes));
    if (t.out_of_memory) continue;
    CHECK(t.error == "");
    CHECK(q.step_transient_peak == t.transient_peak);
    CHECK(q.peak_bytes == t.peak_total);
    check_stats(q.step_comm, t.last_step);
  }
}

// A directory for the disk tier's (anonymous) files, for the whole run, removed at exit.
std::string offload_dir() {
  struct scratch {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("zero-plan-offload-" + std::to_string(::getpid()));
    scratch() { std::filesystem::create_directories(path); }
    ~scratch() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const scratch dir;
  return dir.path.string();
}

template <class Stage, class Opt, class Prec>
void check_all_options(int n) {
  check_plan<Stage, Opt, Prec>(n, {}, "defaults");
  zero::engine_options o;
  o.micro_batches = 2;
  check_plan<Stage, Opt, Prec>(n, o, "2 micro-batches reduced each");
  o = {};
  o.clip_norm = 1.0f;
  check_plan<Stage, Opt, Prec>(n, o, "clipping (a norm in every precision)");
  o.offload.tier = zero::offload_tier::host;  // master weights and slots in host memory: category offload
  check_plan<Stage, Opt, Prec>(n, o, "clipping, states offloaded to host memory");
  o.offload.tier = zero::offload_tier::disk;  // on disk: the slice sets and checksums in category offload
  o.offload.directory = offload_dir();
  o.offload.slice_elements = 1024;
  check_plan<Stage, Opt, Prec>(n, o, "clipping, states offloaded to disk in slices of 1024");
  if constexpr (std::is_same_v<Opt, zero::optim::adamw> || std::is_same_v<Opt, zero::optim::lamb> ||
                std::is_same_v<Opt, zero::optim::muon>) {
    o = {};
    o.reproducible = true;
    o.micro_batches = 2;
    check_plan<Stage, Opt, Prec>(n, o, "reproducible, 2 micro-batches");
  }
  o = {};
  if constexpr (Stage::shards_gradients) {
    o.fp32_grad_accumulation = true;
    o.micro_batches = 3;
    check_plan<Stage, Opt, Prec>(n, o, "fp32 gradient shard, 3 micro-batches");
    if constexpr (Stage::shards_parameters) {
      // embed, tiny and head (600, 1 and 357 elements) stay gathered; block (985) is gathered on demand.
      o = {};
      o.persist_below_elements = 600;
      check_plan<Stage, Opt, Prec>(n, o, "persistent units");
      o.micro_batches = 2;
      check_plan<Stage, Opt, Prec>(n, o, "persistent units, 2 micro-batches");
      o = {};
      o.gather_bucket_elements = 1500;
      check_plan<Stage, Opt, Prec>(n, o, "gather buckets of 1500 elements");
      o.persist_below_elements = 1;  // tiny stays gathered, outside the order
      o.max_live_parameters = 1200;
      o.micro_batches = 2;
      check_plan<Stage, Opt, Prec>(n, o, "gather buckets, at most 1200 live parameters, a persistent unit, 2 micro-batches");
    }
  } else {
    o.accumulate = zero::accumulation::local_then_reduce;
    o.micro_batches = 2;
    check_plan<Stage, Opt, Prec>(n, o, "2 micro-batches reduced once");
  }
}

template <class Stage>
void check_stage() {
  for (int n = 1; n <= 4; ++n) {
    check_all_options<Stage, zero::optim::adamw, zero::precision::fp32>(n);
    check_all_options<Stage, zero::optim::adamw, zero::precision::bf16>(n);
    check_all_options<Stage, zero::optim::adamw, zero::precision::fp16>(n);
    check_all_options<Stage, zero::optim::sgd, zero::precision::fp32>(n);
    check_all_options<Stage, zero::optim::sgd, zero::precision::bf16>(n);
    check_all_options<Stage, zero::optim::sgd, zero::precision::fp16>(n);
    check_all_options<Stage, zero::optim::lamb, zero::precision::bf16>(n);  // its tensor sums' wires and all-reduces
    check_all_options<Stage, zero::optim::muon, zero::precision::bf16>(n);  // its staging and matrix exchange
  }
}

}  // namespace

// With overlap on a backend that overlaps: reduces in flight with their buckets, stage 3's prefetches
// (bounded by prefetch_units, max_live_parameters and memory_limit_bytes), fused reduce buckets.
template <class Stage, class Prec>
void check_overlap(int n) {
  using adamw = zero::optim::adamw;
  check_plan<Stage, adamw, Prec, true>(n, {}, "overlap, defaults");
  zero::engine_options o;
  o.micro_batches = 2;
  o.clip_norm = 1.0f;
  check_plan<Stage, adamw, Prec, true>(n, o, "overlap, 2 micro-batches, clipping");
  o = {};
  o.reduces_in_flight = 1;
  o.prefetch_units = 1;
  check_plan<Stage, adamw, Prec, true>(n, o, "overlap, one reduce in flight, one prefetch");
  o = {};
  o.reduce_bucket_elements = 1500;
  o.micro_batches = 2;
  check_plan<Stage, adamw, Prec, true>(n, o, "overlap, fused reduce buckets of 1500 elements");
  o = {};
  o.max_live_parameters = 2000;
  o.prefetch_units = 3;
  check_plan<Stage, adamw, Prec, true>(n, o, "overlap, at most 2000 live parameters, 3 prefetches");
  if constexpr (Stage::shards_parameters) {
    o = {};
    o.persist_below_elements = 600;
    check_plan<Stage, adamw, Prec, true>(n, o, "overlap, persistent units");
    o = {};
    o.gather_bucket_elements = 1500;
    check_plan<Stage, adamw, Prec, true>(n, o, "overlap, gather buckets of 1500 elements");
    o.prefetch_units = 1;
    o.max_live_parameters = 2000;
    o.reduce_bucket_elements = 1500;
    check_plan<Stage, adamw, Prec, true>(n, o, "overlap, gather and reduce buckets, one prefetch, 2000 live");
  }
  o = {};
  o.reproducible = true;
  check_plan<Stage, adamw, Prec, true>(n, o, "overlap, reproducible");
  o = {};
  o.overlap = false;
  check_plan<Stage, adamw, Prec, true>(n, o, "overlap off on a backend that overlaps");
}

template <class Stage>
void check_overlap_stage() {
  for (int n : {1, 2, 4}) {
    check_overlap<Stage, zero::precision::fp32>(n);
    check_overlap<Stage, zero::precision::bf16>(n);
    check_overlap<Stage, zero::precision::fp16>(n);
  }
}

// ZeRO++ on 4 ranks, with and without overlap: qwZ's wires, qgZ flat (one node) and in two hops
// (nodes of 2), its error feedback, hpZ's secondary partition.
template <class Stage, class Prec, bool Overlapping>
void check_zeropp() {
  using adamw = zero::optim::adamw;
  const int n = 4;
  zero::engine_options o;
  o.zeropp.qgz = true;
  check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qgZ, one node");
  o.zeropp.node_size = 2;
  o.micro_batches = 2;
  check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qgZ in two hops, 2 micro-batches");
  o.zeropp.qgz_error_feedback = true;
  o.zeropp.gradients = {4, 64};
  check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qgZ in two hops with error feedback, int4");
  o.zeropp.node_size = 0;
  o.micro_batches = 1;
  o.reduce_bucket_elements = 1500;
  check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qgZ with error feedback, fused buckets");
  if constexpr (Stage::shards_parameters) {
    o = {};
    o.zeropp.qwz = true;
    check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qwZ");
    o.zeropp.hpz = true;
    o.zeropp.node_size = 2;
    check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qwZ, hpZ on nodes of 2");
    o.zeropp.qgz = true;
    o.micro_batches = 2;
    check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qwZ, qgZ in two hops, hpZ, 2 micro-batches");
    o.zeropp.qgz_error_feedback = true;
    o.zeropp.weights = {4, 64};
    check_plan<Stage, adamw, Prec, Overlapping>(n, o, "qwZ int4, qgZ with error feedback, hpZ");
  }
}

template <class Stage>
void check_zeropp_stage() {
  check_zeropp<Stage, zero::precision::fp32, false>();
  check_zeropp<Stage, zero::precision::bf16, false>();
  check_zeropp<Stage, zero::precision::fp32, true>();
  check_zeropp<Stage, zero::precision::bf16, true>();
}

TEST_CASE("plan equals the engine's measurements: stage 0") { check_stage<zero::stage0>(); }
TEST_CASE("plan equals the engine's measurements: stage 1") { check_stage<zero::stage1>(); }
TEST_CASE("plan equals the engine's measurements: stage 2") { check_stage<zero::stage2>(); }
TEST_CASE("plan equals the engine's measurements: stage 3") { check_stage<zero::stage3>(); }
TEST_CASE("plan equals the engine with overlap on a backend that overlaps: stage 0") {
  check_overlap_stage<zero::stage0>();
}
TEST_CASE("plan equals the engine with overlap on a backend that overlaps: stage 1") {
  check_overlap_stage<zero::stage1>();
}
TEST_CASE("plan equals the engine with overlap on a backend that overlaps: stage 2") {
  check_overlap_stage<zero::stage2>();
}
TEST_CASE("plan equals the engine with overlap on a backend that overlaps: stage 3") {
  check_overlap_stage<zero::stage3>();
}
TEST_CASE("plan equals the engine under ZeRO++: stage 1") { check_zeropp_stage<zero::stage1>(); }
TEST_CASE("plan equals the engine under ZeRO++: stage 2") { check_zeropp_stage<zero::stage2>(); }
TEST_CASE("plan equals the engine under ZeRO++: stage 3") { check_zeropp_stage<zero::stage3>(); }

// The backward pass's two loops (release_order): gather, grads, reduce, release (the tutorial's) and
// gather, grads, release, reduce (train_loop's), each planned as the engine then measures it, with and
// without overlap, in the reproducible mode and under qgZ, whose reduce(u) allocates beside the unit.
template <class Stage>
void check_release_orders() {
  using adamw = zero::optim::adamw;
  using fp32 = zero::precision::fp32;
  using bf16 = zero::precision::bf16;
  for (const auto order : {zero::release_order::after_reduce, zero::release_order::before_reduce}) {
    for (int n = 1; n <= 4; ++n) {
      check_plan<Stage, adamw, fp32>(n, {}, "defaults", order);
      zero::engine_options o;
      o.reproducible = true;
      o.micro_batches = 2;
      check_plan<Stage, adamw, bf16>(n, o, "reproducible, 2 micro-batches", order);
      check_plan<Stage, zero::optim::muon, bf16>(n, o, "reproducible, 2 micro-batches", order);
      check_plan<Stage, adamw, fp32, true>(n, o, "overlap, reproducible, 2 micro-batches", order);
      o = {};
      o.reduce_bucket_elements = 1500;
      check_plan<Stage, adamw, bf16, true>(n, o, "overlap, fused reduce buckets of 1500 elements", order);
      if constexpr (Stage::shards_parameters) {
        o = {};
        o.persist_below_elements = 600;
        o.reproducible = true;
        check_plan<Stage, adamw, fp32>(n, o, "reproducible, persistent units", order);
      }
    }
    if constexpr (Stage::stage >= 1) {
      zero::engine_options o;
      o.zeropp.qgz = true;
      o.zeropp.node_size = 2;
      check_plan<Stage, adamw, fp32>(4, o, "qgZ in two hops", order);
      check_plan<Stage, adamw, bf16, true>(4, o, "overlap, qgZ in two hops", order);
      if constexpr (Stage::shards_parameters) {
        o.zeropp.qwz = o.zeropp.hpz = true;
        check_plan<Stage, adamw, fp32>(4, o, "qwZ, qgZ in two hops, hpZ", order);
      }
    }
  }
}

TEST_CASE("plan equals the engine for both release orders: stage 0") { check_release_orders<zero::stage0>(); }
TEST_CASE("plan equals the engine for both release orders: stage 1") { check_release_orders<zero::stage1>(); }
TEST_CASE("plan equals the engine for both release orders: stage 2") { check_release_orders<zero::stage2>(); }
TEST_CASE("plan equals the engine for both release orders: stage 3") {
  check_release_orders<zero::stage3>();
  // Where reduce(u) allocates while the unit is gathered (the reproducible mode's words), releasing
  // first frees the gathered unit before them: a lower peak, which the engine measures too (above).
  zero::engine_options o;
  o.reproducible = true;
  const auto planned = [&](zero::release_order order) {
    return zero::plan_for<zero::stage3, zero::optim::adamw, zero::precision::fp32>(spec(), 2, o, order);
  };
  const auto after = planned(zero::release_order::after_reduce), before = planned(zero::release_order::before_reduce);
  CHECK(before.step_transient_peak < after.step_transient_peak);
  CHECK(after.step_transient_peak - before.step_transient_peak <= after.gathered_bytes);
  CHECK(before.model_states.total() == after.model_states.total());
  check_stats(before.step_comm, after.step_comm);
}

TEST_CASE("plan: the transient buffers of consolidation and broadcast initialization") {
  const zero::model_spec s = spec();
  for (int n : {1, 3, 4}) {
    for (std::size_t chunk : {std::size_t{100}, std::size_t{1} << 22}) {
      CAPTURE(n);
      CAPTURE(chunk);
      zero::engine_options o;
      o.init_chunk_elements = chunk;
      const auto p = zero::plan_for<zero::stage3, zero::optim::adamw, zero::precision::bf16>(s, n, o);
      CHECK(p.init_broadcast_bytes == std::min<std::size_t>(chunk, 960) * sizeof(float));
      std::size_t init_peak = 0, consolidation_peak = 0;
      zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
        zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw, zero::precision::bf16> e(comm, s, {}, o);
        e.initialize(init(), zero::init_source::broadcast_from_rank0);
        const std::size_t a = e.memory().peak_bytes(mem_category::transient);
        (void)e.full_params();
        if (comm.rank() == 0) {
          init_peak = a;
          consolidation_peak = e.memory().peak_bytes(mem_category::transient);
        }
      });
      CHECK(init_peak == p.init_broadcast_bytes);
      CHECK(consolidation_peak == std::max<std::uint64_t>(p.init_broadcast_bytes, p.consolidation_bytes));
    }
  }
}

TEST_CASE("plan: per-unit sizes, the largest unit, and what the engine refuses") {
  const zero::model_spec s = spec();
  const auto p = zero::plan(s, 4, 3, zero::plan_precision_named("bf16"), zero::plan_optimizer_named("adamw"));
  REQUIRE(p.units.size() == 4);
  // block: 985 elements padded to a multiple of 4 x 32.
  CHECK(p.units[2].name == "block");
  CHECK(p.units[2].padded == 1024);
  CHECK(p.units[2].shard == 256);
  CHECK(p.gathered_bytes == 1024 * 2);
  CHECK(p.bucket_bytes == 1024 * 2);
  CHECK(p.step_transient_peak == 1024 * 4);
  CHECK(p.consolidation_bytes == 1024 * 4);
  CHECK_THROWS_WITH_AS(zero::plan_precision_named("fp8"), doctest::Contains("unknown precision 'fp8'"), zero::error);
  CHECK_THROWS_WITH_AS(zero::plan_optimizer_named("adafactor"), doctest::Contains("unknown optimizer 'adafactor'"),
                       zero::error);
  CHECK_THROWS_WITH_AS(zero::plan(s, 4, 4, {}, {}), doctest::Contains("no ZeRO stage 4"), zero::error);
  CHECK_THROWS_WITH_AS(zero::plan(s, 0, 1, {}, {}), doctest::Contains("world size must be positive"), zero::error);
  zero::engine_options o;
  o.fp32_grad_accumulation = true;
  CHECK_THROWS_WITH_AS(zero::plan(s, 2, 1, {}, {}, o), doctest::Contains("fp32_grad_accumulation"), zero::error);
  o = {};
  o.accumulate = zero::accumulation::local_then_reduce;
  CHECK_THROWS_WITH_AS(zero::plan(s, 2, 2, {}, {}, o), doctest::Contains("local_then_reduce"), zero::error);
  // ZeRO++: what the engine's constructor refuses.
  o = {};
  o.zeropp.qwz = true;
  CHECK_THROWS_WITH_AS(zero::plan(s, 4, 2, {}, {}, o), doctest::Contains("qwZ quantizes the parameter all-gathers"),
                       zero::error);
  o = {};
  o.zeropp.qgz = true;
  CHECK_THROWS_WITH_AS(zero::plan(s, 4, 0, {}, {}, o), doctest::Contains("ZeRO stage 0 all-reduces"), zero::error);
  o.zeropp.node_size = 3;
  CHECK_THROWS_WITH_AS(zero::plan(s, 4, 1, {}, {}, o), doctest::Contains("node_size 3 does not divide"), zero::error);
  o = {};
  o.zeropp.qgz_error_feedback = true;
  CHECK_THROWS_WITH_AS(zero::plan(s, 4, 1, {}, {}, o), doctest::Contains("needs qgz"), zero::error);
  o = {};
  o.zeropp.hpz = true;
  CHECK_THROWS_WITH_AS(zero::plan(s, 4, 3, {}, {}, o), doctest::Contains("hpZ needs nodes smaller than the world"),
                       zero::error);
  o.zeropp.node_size = 2;
  o.persist_below_elements = 600;
  CHECK_THROWS_WITH_AS(zero::plan(s, 4, 3, {}, {}, o), doctest::Contains("cannot be combined"), zero::error);
  o = {};
  o.zeropp.qwz = true;
  o.zeropp.weights = {4, 3};  // int4 packs two codes per byte: an odd block is refused
  CHECK_THROWS_AS(zero::plan(s, 4, 3, {}, {}, o), zero::error);
}

TEST_CASE("plan: the disk tier's host memory, counted in the budget; a small state gets no more staging than it has") {
  // A state of one slice needs one slice set, not three: with the default slice (2^20 elements) the
  // spec's few thousand elements per rank are staged once, and that is counted like the rest.
  const zero::model_spec s = spec();
  zero::engine_options o;
  o.offload.tier = zero::offload_tier::disk;
  o.offload.directory = offload_dir();
  for (int n : {1, 2}) {
    CAPTURE(n);
    const auto p = zero::plan_for<zero::stage3, zero::optim::adamw, zero::precision::bf16>(s, n, o);
    const std::uint64_t held = p.padded / static_cast<std::uint64_t>(n);
    CHECK(p.offload_staging_bytes == 3 * ((held + 1023) / 1024 * 1024) * 4);  // 3 arrays, one slice each
    CHECK(p.offload_staging_bytes <= p.offloaded_bytes);
    CHECK(p.offload_checksum_bytes == 3 * 8);
    CHECK(p.model_states.offload == p.offload_staging_bytes + p.offload_checksum_bytes);
    CHECK(p.peak_bytes == p.model_states.total() + p.step_transient_peak);
    const measured m = train<zero::stage3, zero::optim::adamw, zero::precision::bf16>(n, o);
    REQUIRE(m.error.empty());
    CHECK(m.current[static_cast<int>(mem_category::offload)] == p.model_states.offload);
    CHECK(m.staging == p.offload_staging_bytes);
    CHECK(m.peak_total == p.peak_bytes);
  }
}

TEST_CASE("plan: totals that would wrap 64 bits are refused, not wrapped") {
  zero::model_spec big;  // the largest model a spec accepts: 2^50 elements
  big.unit("w").tensor("w", {std::size_t{1} << 25, std::size_t{1} << 25});
  const auto bf16 = zero::plan_precision_named("bf16");
  const auto adamw = zero::plan_optimizer_named("adamw");
  const auto p = zero::plan(big, 2, 3, bf16, adamw);  // fits: about 2^54 bytes of model states
  CHECK(p.model_states.total() == 16 * p.padded / 2);
  zero::engine_options o;
  o.micro_batches = 1 << 30;  // stage 3 gathers 2 x 2^30 times per step: 2^81 bytes
  CHECK_THROWS_WITH_AS(zero::plan(big, 2, 3, bf16, adamw, o), doctest::Contains("plan: "), zero::error);
  auto many_slots = adamw;
  many_slots.slots = 1 << 30;  // 2^30 fp32 slots of 2^50 elements
  CHECK_THROWS_WITH_AS(zero::plan(big, 2, 0, bf16, many_slots), doctest::Contains("plan: model-state bytes"),
                       zero::error);
}

#ifdef ZERO_TEST_PLAN_CLI
namespace {

// Muon's recipe on a small model: matrices under Muon, the embedding and the output head element-wise
// (AdamW), the vectors element-wise by shape, with their own lr scale and no weight decay.
zero::model_spec grouped_spec() {
  zero::model_spec s;
  s.unit("embed").tensor("wte", {50, 12}).group("embeddings");
  s.unit("block")
      .tensor("w1", {24, 12})
      .tensor("b1", {24})
      .group("vectors")
      .tensor("w2", {12, 24})
      .tensor("gain", {12})
      .group("vectors");
  s.unit("head").tensor("w", {7, 12}).group("embeddings").tensor("b", {7}).group("vectors");
  return s;
}
std::vector<zero::param_group> recipe_groups() {
  return {{.name = "embeddings", .weight_decay = 0.0f, .element_wise = true},
          {.name = "vectors", .lr_scale = 0.5f, .weight_decay = 0.0f}};
}
// The same model and groups as zero_plan reads them; without_groups: the units alone.
std::string grouped_json(bool with_groups, const std::string& member = "head.b") {
  std::string j = R"({"units": [
  {"name": "embed", "tensors": [{"name": "wte", "shape": [50, 12]}]},
  {"name": "block", "tensors": [{"name": "w1", "shape": [24, 12]}, {"name": "b1", "shape": [24]},
                                {"name": "w2", "shape": [12, 24]}, {"name": "gain", "shape": [12]}]},
  {"name": "head", "tensors": [{"name": "w", "shape": [7, 12]}, {"name": "b", "shape": [7]}]}])";
  if (with_groups)
    j += R"(, "groups": [
  {"name": "embeddings", "element_wise": true, "weight_decay": 0, "members": ["embed.wte", "head.w"]},
  {"name": "vectors", "lr_scale": 0.5, "weight_decay": 0, "members": ["block.b1", "block.gain", ")" +
         member + R"("]}])";
  return j + "}\n";
}

struct cli_result {
  int status = -1;
  std::string out;
};
// Runs zero_plan (the ZERO_PLAN environment variable: meson's zero_plan_groups test sets it) on `model`.
cli_result run_zero_plan(const std::string& model, const std::string& flags) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("zero-plan-groups-" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << model;
  const std::string cmd = std::string("'") + std::getenv("ZERO_PLAN") + "' --json --model '" + file.string() +
                          "' --optimizer muon --precision bf16 --ranks 1,2,3,4 " + flags + " 2>&1";
  cli_result r;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (std::size_t k; (k = std::fread(buf, 1, sizeof buf, f)) > 0;) r.out.append(buf, k);
    r.status = ::pclose(f);
  }
  std::filesystem::remove(file);
  return r;
}

template <class Stage>
void check_cli_plans(const nlohmann::json& plans, const nlohmann::json& ungrouped, const zero::engine_options& o,
                     zero::release_order order) {
  const zero::model_spec s = grouped_spec();
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const nlohmann::json& p = plans[i];
    if (p["stage"].get<int>() != Stage::stage) continue;
    const int n = p["ranks"].get<int>();
    CAPTURE(Stage::stage);
    CAPTURE(n);
    const measured m = train_on<Stage, zero::optim::muon, zero::precision::bf16>(s, n, o, 2, order);
    REQUIRE(m.error.empty());
    REQUIRE_FALSE(m.skipped);
    CHECK(p["params_bytes"].get<std::uint64_t>() == m.current[static_cast<int>(mem_category::params)]);
    CHECK(p["grads_bytes"].get<std::uint64_t>() == m.current[static_cast<int>(mem_category::grads)]);
    CHECK(p["master_bytes"].get<std::uint64_t>() == m.current[static_cast<int>(mem_category::master)]);
    CHECK(p["optimizer_states_bytes"].get<std::uint64_t>() ==
          m.current[static_cast<int>(mem_category::optimizer_states)]);
    CHECK(p["transient_peak_bytes"].get<std::uint64_t>() == m.transient_peak);
    CHECK(p["peak_bytes"].get<std::uint64_t>() == m.peak_total);
    CHECK(p["bytes_sent_per_step"].get<std::uint64_t>() == m.last_step.total_bytes());
    // comm().control counts since construction: two steps, each with the plan's control bytes.
    CHECK(2 * p["control_bytes_per_step"].get<std::uint64_t>() == m.control.total_bytes());
    // Without its groups the same model is planned with every matrix under Muon: a larger exchange.
    if (n > 1)
      CHECK(2 * ungrouped[i]["control_bytes_per_step"].get<std::uint64_t>() > m.control.total_bytes());
  }
}

}  // namespace

TEST_CASE("zero_plan: a JSON model with parameter groups (Muon's recipe) plans what the engine measures") {
  if (std::getenv("ZERO_PLAN") == nullptr) {
    MESSAGE("ZERO_PLAN is not set: run as meson's zero_plan_groups test");
    return;
  }
  struct config {
    std::string flags;
    zero::engine_options options;
    zero::release_order order = zero::release_order::after_reduce;
  };
  std::vector<config> configs(3);
  configs[1].flags = "--accum 2 --clip 1";
  configs[1].options.micro_batches = 2;
  configs[1].options.clip_norm = 1.0f;
  configs[2].flags = "--reproducible --release-order before-reduce";
  configs[2].options.reproducible = true;
  configs[2].order = zero::release_order::before_reduce;
  for (config& c : configs) {
    CAPTURE(c.flags);
    c.options.param_groups = recipe_groups();
    const cli_result grouped = run_zero_plan(grouped_json(true), c.flags);
    const cli_result ungrouped = run_zero_plan(grouped_json(false), c.flags);
    REQUIRE_MESSAGE(grouped.status == 0, grouped.out);
    REQUIRE_MESSAGE(ungrouped.status == 0, ungrouped.out);
    const nlohmann::json plans = nlohmann::json::parse(grouped.out)["plans"];
    const nlohmann::json without = nlohmann::json::parse(ungrouped.out)["plans"];
    REQUIRE(plans.size() == 16);
    check_cli_plans<zero::stage0>(plans, without, c.options, c.order);
    check_cli_plans<zero::stage1>(plans, without, c.options, c.order);
    check_cli_plans<zero::stage2>(plans, without, c.options, c.order);
    check_cli_plans<zero::stage3>(plans, without, c.options, c.order);
  }
  // A member that names no tensor is refused, naming the group and the member.
  const cli_result bad = run_zero_plan(grouped_json(true, "head.bias"), "");
  CHECK(bad.status != 0);
  CHECK(bad.out.find("group 'vectors': member 'head.bias' names no tensor") != std::string::npos);
}
#endif
