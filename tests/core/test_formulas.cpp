// Memory and communication: what the engine allocates and sends equals the paper's formulas exactly.
#include <doctest/doctest.h>

#include <algorithm>

#include "../toy_model.hpp"

namespace {

using zero::mem_category;

std::size_t max_unit_padded(int n) {
  const auto l = zero::layout::make(toy::spec(), n);
  std::size_t m = 0;
  for (const auto& u : l.units()) m = std::max(m, u.padded);
  return m;
}

// Independent of zero::formula: the per-stage equations with K = slots x 4 (fp32 params are the master).
std::uint64_t expected_state_bytes(int stage, std::uint64_t psi, std::uint64_t n, std::uint64_t k) {
  switch (stage) {
    case 0: return (4 + 4 + k) * psi;
    case 1: return 8 * psi + k * psi / n;
    case 2: return 4 * psi + (4 + k) * psi / n;
    default: return (8 + k) * psi / n;
  }
}

template <class Stage, class Opt>
void check_stage(Opt opt) {
  constexpr int steps = 3;
  for (int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    CAPTURE(Stage::stage);
    const auto res = toy::run<Stage>(n, steps, opt);
    const std::uint64_t psi = res.padded, N = static_cast<std::uint64_t>(n);
    const std::uint64_t k = 4 * static_cast<std::uint64_t>(Opt::slots);
    const std::uint64_t want_state = expected_state_bytes(Stage::stage, psi, N, k);
    CHECK(res.model_state_formula == want_state);
    const std::uint64_t want_comm = (Stage::stage == 3 ? 3 : 2) * psi * (N - 1) / N * 4;
    CHECK(res.comm_formula == want_comm);
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto& m = res.memory[static_cast<std::size_t>(r)];
      CHECK(m.model_state_bytes() == want_state);
      // Category by category, as DESIGN section 4 describes each stage.
      const std::uint64_t full = psi * 4, shard = psi / N * 4;
      CHECK(m.bytes(mem_category::params) == (Stage::shards_parameters ? shard : full));
      CHECK(m.bytes(mem_category::grads) == (Stage::shards_gradients ? shard : full));
      CHECK(m.bytes(mem_category::master) == 0);
      CHECK(m.bytes(mem_category::optimizer_states) == k * (Stage::shards_optimizer_states ? psi / N : psi));
      CHECK(m.bytes(mem_category::transient) == 0);  // nothing transient outlives a call
      // Each model state is flat: one contiguous block per array whatever the model's 4 units and 8
      // tensors (parameters, gradients, each optimizer slot), and no transient block left behind.
      CHECK(m.block_count(mem_category::params) == 1);
      CHECK(m.block_count(mem_category::grads) == 1);
      CHECK(m.block_count(mem_category::master) == 0);
      CHECK(m.block_count(mem_category::optimizer_states) == static_cast<std::size_t>(Opt::slots));
      CHECK(m.block_count(mem_category::transient) == 0);
      // Communicated bytes per step equal the formula exactly, in every step.
      const auto& c = res.comm[static_cast<std::size_t>(r)];
      CHECK(c.steps == steps);
      CHECK(c.last_step.total_bytes() == want_comm);
      CHECK(c.protocol.total_bytes() == want_comm * steps);
    }
  }
}

}  // namespace

// Every optimizer of the library (K = 4 + 4 x slots), every stage.
TEST_CASE_TEMPLATE_DEFINE("model-state bytes and bytes sent per step equal the formulas", Opt, formulas_per_optimizer) {
  CAPTURE(Opt::name);
  zero::stages::for_each([]<class Stage>() {
    CAPTURE(Stage::stage);
    check_stage<Stage>(Opt{});
  });
}
TEST_CASE_TEMPLATE_APPLY(formulas_per_optimizer, zero::optimizers::tuple);

TEST_CASE("each stage uses the collectives DESIGN section 4 names") {
  const int n = 4;
  using zero::comm::collective;
  const auto s0 = toy::run<zero::stage0>(n, 1, zero::optim::adamw{}).comm[0].last_step;
  CHECK(s0.calls[static_cast<int>(collective::all_reduce)] == toy::spec().num_units());
  CHECK(s0[collective::reduce_scatter] == 0);
  CHECK(s0[collective::all_gather] == 0);
  for (const auto& s : {toy::run<zero::stage1>(n, 1, zero::optim::adamw{}).comm[0].last_step,
                        toy::run<zero::stage2>(n, 1, zero::optim::adamw{}).comm[0].last_step}) {
    CHECK(s[collective::all_reduce] == 0);
    CHECK(s[collective::reduce_scatter] == s[collective::all_gather]);
  }
  const auto s3 = toy::run<zero::stage3>(n, 1, zero::optim::adamw{}).comm[0].last_step;
  CHECK(s3[collective::all_gather] == 2 * s3[collective::reduce_scatter]);  // forward and backward
}

TEST_CASE("transient buffers: stage 2 holds one unit's gradient bucket, stage 3 a unit and its bucket") {
  const int n = 4;
  const std::uint64_t unit_bytes = max_unit_padded(n) * 4;
  const auto peak = [](const toy::run_result& r) { return r.memory[0].peak_bytes(mem_category::transient); };
  // full_params() at the end consolidates one unit at a time in sharded stages; that is within the bounds too.
  CHECK(toy::run<zero::stage0>(n, 2, zero::optim::adamw{}).memory[0].peak_bytes(mem_category::transient) == 0);
  CHECK(peak(toy::run<zero::stage2>(n, 2, zero::optim::adamw{})) == unit_bytes);
  CHECK(peak(toy::run<zero::stage3>(n, 2, zero::optim::adamw{})) == 2 * unit_bytes);
}

TEST_CASE("zero::formula refuses a Psi that is not a multiple of N and unknown stages") {
  CHECK_THROWS_AS(zero::formula::model_state_bytes(1, 10, 4, {}), zero::error);
  CHECK_THROWS_AS(zero::formula::model_state_bytes(4, 16, 4, {}), zero::error);
  CHECK_THROWS_AS(zero::formula::comm_bytes_per_step(5, 16, 4, 4), zero::error);
  CHECK(zero::formula::comm_bytes_per_step(2, 16, 1, 4) == 0);  // one rank sends nothing
}
