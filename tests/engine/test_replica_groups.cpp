// Replicated shard groups (HSDP, engine_options::shard_group_size): ZeRO within groups, the groups replicas; bits,
// bytes, checkpoints and refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../engine_instances.hpp"
#include "../tp_model.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/zero.hpp"

namespace {

using zero::comm::threads;
using namespace tp_model;

struct outcome {
  std::vector<float> params;  // full_params(), the same on every rank
  std::vector<zero::comm_report> comm;
  std::vector<std::uint64_t> formula, inter_formula, model_states, model_state_formula, peak;
  std::vector<int> rank, world, shard, replicas;
};

// Trains tp_model's model (whole, no mesh) on n threads with shard groups of s ranks (0: plain ZeRO).
template <class Stage, class Prec = zero::precision::fp32>
outcome train(int n, int s, int steps, zero::engine_options eo = {}) {
  eo.shard_group_size = s;
  outcome out;
  const auto N = static_cast<std::size_t>(n);
  std::vector<std::vector<float>> params(N);
  out.comm.resize(N);
  for (auto* v : {&out.formula, &out.inter_formula, &out.model_states, &out.model_state_formula, &out.peak})
    v->resize(N);
  for (auto* v : {&out.rank, &out.world, &out.shard, &out.replicas}) v->resize(N);
  threads::launch(n, [&](threads& c) {
    zero::engine<Stage, threads, zero::optim::adamw, Prec> e(c, model(), {}, eo);
    e.initialize(whole_init());
    for (int t = 0; t < steps; ++t) mesh_step(e, e.rank(), static_cast<std::uint64_t>(t));
    const auto r = static_cast<std::size_t>(c.rank());
    out.peak[r] = e.memory().peak_total;  // before full_params(), whose consolidation plan() counts apart
    params[r] = e.full_params();
    out.comm[r] = e.comm();
    out.formula[r] = e.comm_formula_bytes();
    out.inter_formula[r] = e.comm_formula_by_level().inter;
    out.model_states[r] = e.memory().model_state_bytes();
    out.model_state_formula[r] = e.model_state_formula_bytes();
    out.rank[r] = e.rank();
    out.world[r] = e.world_size();
    out.shard[r] = e.shard_group_size();
    out.replicas[r] = e.replicas();
  });
  for (const auto& p : params) CHECK(p == params[0]);
  out.params = params[0];
  return out;
}

// Every rank's bytes equal the engine's formulas, and zero::plan's figures (plan == engine).
template <class Stage, class Prec>
void check_bytes(const outcome& o, int n, int s, zero::engine_options eo = {}) {
  eo.shard_group_size = s;
  const zero::plan_report p = zero::plan_for<Stage, zero::optim::adamw, Prec>(model(), n, eo);
  CHECK(p.ranks == s);
  CHECK(p.replicas == n / s);
  for (std::size_t r = 0; r < o.comm.size(); ++r) {
    CHECK(o.rank[r] == static_cast<int>(r));
    CHECK(o.world[r] == n);
    CHECK(o.shard[r] == s);
    CHECK(o.replicas[r] == n / s);
    CHECK(o.comm[r].last_step.total_bytes() == o.formula[r]);
    CHECK(o.comm[r].last_step.inter_node_bytes() == o.inter_formula[r]);
    CHECK(o.model_states[r] == o.model_state_formula[r]);
    CHECK(o.model_states[r] == p.model_states.total());
    CHECK(o.peak[r] == p.peak_bytes);
    CHECK(o.comm[r].last_step.bytes == p.step_comm.bytes);
    CHECK(o.comm[r].last_step.inter == p.step_comm.inter);
    CHECK(o.comm[r].last_step.calls == p.step_comm.calls);
    CHECK(o.comm[r].control.total_bytes() == p.control_comm.total_bytes() * o.comm[r].steps);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("replicated shard groups: the reproducible mode trains the bits of plain ZeRO at the same N", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  // Three micro-batches too: the later reduces of a unit land in its store, the first group adding the
  // store's words (reduce/binned.hpp, landing_of).
  for (int m : {1, 3}) {
    CAPTURE(m);
    zero::engine_options eo;
    eo.reproducible = true;
    eo.micro_batches = m;
    const outcome plain = train<Stage>(4, 0, 3, eo);
    for (int s : {1, 2}) {
      CAPTURE(s);
      const outcome hsdp = train<Stage>(4, s, 3, eo);
      CHECK(hsdp.params == plain.params);
      check_bytes<Stage, zero::precision::fp32>(hsdp, 4, s, eo);
    }
  }
}

TEST_CASE_TEMPLATE(
    "replicated shard groups: in fp32, every stage the same bits at a fixed S; groups of one rank are "
    "plain ZeRO's sum order",
    Stage, zero::stage1, zero::stage2, zero::stage3) {
  // S = 1: nothing to sum within a group; the replicas' all-reduce sums the N gradients in rank order,
  // as plain ZeRO's reduce-scatter does.
  CHECK(train<Stage>(4, 1, 3).params == train<zero::stage0>(4, 0, 3).params);
  // S = 2: (g0 + g1) + (g2 + g3), another rounding than plain ZeRO's, the same in every stage.
  const outcome two = train<Stage>(4, 2, 3);
  CHECK(two.params == train<zero::stage0>(4, 2, 3).params);
  check_bytes<Stage, zero::precision::fp32>(two, 4, 2);
  const outcome plain = train<Stage>(4, 0, 3);
  double worst = 0.0;
  for (std::size_t i = 0; i < plain.params.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(two.params[i]) - plain.params[i]));
  CHECK(worst < 1e-6);  // three AdamW steps of lr 1e-3 from gradients that differ in the last bit
}

TEST_CASE(
    "replicated shard groups: each rank holds 1/S of the model states; the bytes across groups are the formula's") {
  // Stage 3 at N = 4 in groups of 2: the model states of stage 3 at N = 2 (padded as at N = 4).
  const outcome hsdp = train<zero::stage3, zero::precision::bf16>(4, 2, 2);
  check_bytes<zero::stage3, zero::precision::bf16>(hsdp, 4, 2);
  const zero::layout at4 = zero::layout::make(model(), 2, 4);
  const zero::formula::state_sizes z{2, 2, 12};
  CHECK(hsdp.model_state_formula[0] == zero::formula::model_state_bytes(3, at4.padded(), 2, z));
  // What crosses the groups: every reduce's slice (Psi / S bf16 elements), 2 (R - 1) / R of it.
  const std::uint64_t across = zero::formula::replica_comm_bytes_per_step(3, at4.padded(), 2, 2, 2, 1);
  CHECK(across == at4.padded() / 2 * 2);  // R = 2: the whole slice, 2 bytes each
  CHECK(hsdp.inter_formula[0] == across);
  CHECK(hsdp.comm[0].last_step.total_bytes() == zero::formula::comm_bytes_per_step(3, at4.padded(), 2, 2) + across);
  // Fused buckets (one all-reduce across the groups per bucket), three groups of 2; stage 0, whose
  // in-group reduce is an all-reduce of the whole model, across the groups too.
  zero::engine_options eo;
  eo.reduce_bucket_elements = 64;
  check_bytes<zero::stage2, zero::precision::fp32>(train<zero::stage2>(6, 3, 2, eo), 6, 3, eo);
  check_bytes<zero::stage0, zero::precision::fp32>(train<zero::stage0>(6, 2, 2), 6, 2);
}

TEST_CASE("replicated shard groups: refusals before anything is allocated, the same on every rank") {
  auto refused = [](int n, auto options_of, const std::string& message) {
    threads::launch(n, [&](threads& c) {
      const zero::engine_options eo = options_of(c.rank());
      CHECK_THROWS_WITH_AS((zero::engine<zero::stage2, threads, zero::optim::adamw>(c, model(), {}, eo)),
                           doctest::Contains(message.c_str()), zero::error);
    });
  };
  refused(
      4, [](int) { return zero::engine_options{.shard_group_size = 3}; },
      "shard_group_size 3 does not divide the 4 data-parallel ranks");
  refused(
      2, [](int) { return zero::engine_options{.shard_group_size = -1}; }, "shard_group_size -1 is negative");
  // A rank with another S would split differently: the settings check, before the split, throws on
  // every rank; none waits in a split.
  refused(
      4, [](int r) { return zero::engine_options{.shard_group_size = r == 3 ? 4 : 2}; },
      "engine_options::shard_group_size is 2 on rank 0 but 4 on rank 3");
}

TEST_CASE("replicated shard groups: the replicas' init values and optimizers are checked across the groups") {
  // An init function seeded by the group: stage 3's owners in each group produce their slices, which
  // the other group replicates, so they must agree.
  threads::launch(4, [&](threads& c) {
    zero::engine<zero::stage3, threads, zero::optim::adamw> e(c, model(), {},
                                                              zero::engine_options{.shard_group_size = 2});
    const bool second = c.rank() >= 2;
    const auto init = whole_init();
    CHECK_THROWS_WITH_AS(
        e.initialize([&](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
          init(u, t, r, v);
          if (second && !v.empty()) v[0] += 1.0f;
        }),
        doctest::Contains("rank(s) 2, 3 produced other values than rank 0"), zero::error);
    e.initialize(whole_init());
    // Rank 2 (the second group's first rank) changes its learning rate alone: no rank updates.
    if (c.rank() == 2) e.set_learning_rate(0.5f);
    CHECK_THROWS_WITH_AS(mesh_step(e, e.rank(), 0), doctest::Contains("optimizer hyper-parameters differ"),
                         zero::error);
  });
}

TEST_CASE("replicated shard groups: checkpoints saved by the first group load at any N, S and stage, bit for bit") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero_test_replica_groups";
  std::filesystem::remove_all(dir);
  std::vector<float> saved;
  threads::launch(4, [&](threads& c) {
    zero::engine<zero::stage2, threads, zero::optim::adamw> e(c, model(), {},
                                                              zero::engine_options{.shard_group_size = 2});
    e.initialize(whole_init());
    mesh_step(e, e.rank(), 0);
    zero::checkpoint::save(e, c, dir);
    const std::vector<float> p = e.full_params();
    if (c.rank() == 0) saved = p;
  });
  const zero::checkpoint::manifest m = zero::checkpoint::verify(dir);
  CHECK(m.world_size == 4);
  auto load_into = [&]<class Stage>(int n, int s) {
    threads::launch(n, [&](threads& c) {
      zero::engine<Stage, threads, zero::optim::adamw> e(c, model(), {}, zero::engine_options{.shard_group_size = s});
      zero::checkpoint::load(e, c, dir);
      CHECK(e.full_params() == saved);
      CHECK(e.steps() == 1);
    });
  };
  load_into.operator()<zero::stage1>(2, 0);
  load_into.operator()<zero::stage3>(4, 1);
  load_into.operator()<zero::stage0>(6, 3);
  std::filesystem::remove_all(dir);
}
