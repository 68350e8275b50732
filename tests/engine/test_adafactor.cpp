// optim::adafactor through its kind (kinds/whole_tensor_sweep.hpp): the same bits in every stage and at every N, its
// factored state counted, released and checkpointed at any N, its exchange as its formula says, and the refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "../global_batch.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/zero.hpp"

namespace {

using zero::comm::threads;
using zero::optim::adafactor;

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Matrices (wide, tall), a stack of three matrices, 1-D tensors, and parameter groups.
zero::model_spec adafactor_model() {
  zero::model_spec s;
  s.unit("embed").tensor("wte", {37, 12}).group("slow");
  s.unit("block").tensor("qkv", {3, 12, 20}).tensor("b1", {40}).group("no_decay").tensor("w2", {40, 12}).tensor(
      "g", {12});
  s.unit("head").tensor("w", {5, 12}).tensor("b", {5}).group("no_decay");
  return s;
}
// The state the model's tensors take: rows + cols per matrix, numel per 1-D tensor.
constexpr std::size_t model_state_floats = (37 + 12) + 3 * (12 + 20) + 40 + (40 + 12) + 12 + (5 + 12) + 5;

adafactor settings() {
  adafactor o;
  o.lr = 0.05f;
  o.weight_decay = 0.02f;
  o.d = 0.8f;  // the update's RMS clipped in some steps
  return o;
}
zero::engine_options options(int ranks, bool reproducible) {
  zero::engine_options eo;
  eo.param_groups = {{.name = "no_decay", .weight_decay = 0.0f}, {.name = "slow", .lr_scale = 0.1f}};
  eo.reproducible = reproducible;
  eo.micro_batches = reproducible ? 12 / ranks : 1;
  eo.clip_norm = 2.0f;
  return eo;
}

using testing::global_step;
using testing::init_values;

template <class Stage, class Prec = zero::precision::fp32>
std::vector<float> trained(int ranks, bool reproducible, int steps = 4) {
  std::vector<float> out;
  threads::launch(ranks, [&](threads& c) {
    zero::engine<Stage, threads, adafactor, Prec> e(c, adafactor_model(), settings(), options(ranks, reproducible));
    e.initialize(init_values);
    for (int s = 0; s < steps; ++s) global_step(e, c.rank(), s);
    const std::vector<float> p = e.full_params();
    if (c.rank() == 0) out = p;
  });
  return out;
}

}  // namespace

TEST_CASE("adafactor: every stage trains the same bits at N = 1..4 reproducibly, and at a fixed N without") {
  const auto one = trained<zero::stage0>(1, true);
  REQUIRE(one.size() == adafactor_model().numel());
  CHECK(!bit_equal(one, trained<zero::stage0>(1, true, 3)));  // the steps move the weights
  for (int ranks : {1, 2, 3, 4}) {
    CAPTURE(ranks);
    CHECK(bit_equal(trained<zero::stage0>(ranks, true), one));
    CHECK(bit_equal(trained<zero::stage1>(ranks, true), one));
    CHECK(bit_equal(trained<zero::stage2>(ranks, true), one));
    CHECK(bit_equal(trained<zero::stage3>(ranks, true), one));
  }
  for (int ranks : {2, 3}) {
    CAPTURE(ranks);
    const auto s0 = trained<zero::stage0>(ranks, false);
    CHECK(bit_equal(trained<zero::stage1>(ranks, false), s0));
    CHECK(bit_equal(trained<zero::stage3>(ranks, false), s0));
    const auto b0 = trained<zero::stage0, zero::precision::bf16>(ranks, false);
    CHECK(bit_equal(trained<zero::stage2, zero::precision::bf16>(ranks, false), b0));
    CHECK(bit_equal(trained<zero::stage3, zero::precision::bf16>(ranks, false), b0));
  }
}

TEST_CASE("adafactor: one step of a 1-rank engine is update_tensor on each tensor, with its group's constants") {
  const zero::model_spec spec = adafactor_model();
  std::vector<float> engine_weights, gradients;
  threads::launch(1, [&](threads& c) {
    zero::engine_options eo = options(1, false);
    eo.clip_norm = 0.0f;
    zero::engine<zero::stage2, threads, adafactor> e(c, spec, settings(), eo);
    e.initialize(init_values);
    gradients = e.full_params();  // the gradient of each element: its initial weight times 3
    for (float& g : gradients) g *= 3.0f;
    std::size_t at = 0;
    for (std::size_t u = 0; u < spec.num_units(); ++u) {
      auto g = e.grads(zero::unit_id{u});
      std::copy(gradients.begin() + static_cast<std::ptrdiff_t>(at),
                gradients.begin() + static_cast<std::ptrdiff_t>(at + spec.units()[u].numel), g.view().data());
      at += spec.units()[u].numel;
      e.reduce(zero::unit_id{u});
    }
    e.step();
    engine_weights = e.full_params();
  });
  // The same by hand: each tensor's own state, its group's settings.
  std::vector<float> w(spec.numel());
  std::size_t at = 0;
  for (const auto& u : spec.units())
    for (const auto& t : u.tensors) {
      init_values(u, t, {0, t.numel}, std::span<float>(w.data() + at, t.numel));
      adafactor o = settings();
      if (u.name == "embed") o.lr = zero::fp::mul(o.lr, 0.1f);
      if (t.name == "b1" || t.name == "b") o.weight_decay = 0.0f;
      std::vector<float> state(adafactor::tensor_state_size(t.shape), 0.0f);
      adafactor::update_tensor(zero::sys::host{}, o.constants(1), t.shape, gradients.data() + at, w.data() + at,
                               state.data());
      at += t.numel;
    }
  CHECK(bit_equal(engine_weights, w));
}

TEST_CASE("adafactor: its state is rows + cols per matrix in memory() and the formulas; the exchange is its formula") {
  for (int ranks : {1, 3}) {
    CAPTURE(ranks);
    threads::launch(ranks, [&](threads& c) {
      zero::engine<zero::stage2, threads, adafactor, zero::precision::bf16> e(c, adafactor_model(), settings(),
                                                                              options(ranks, false));
      e.initialize(init_values);
      const auto& m = e.memory();
      CHECK(m.bytes(zero::mem_category::optimizer_states) == model_state_floats * sizeof(float));
      CHECK(m.bytes(zero::mem_category::master) == e.layout().shard_total() * sizeof(float));
      CHECK(m.model_state_bytes() == e.model_state_formula_bytes());
      for (int s = 0; s < 2; ++s) {
        const zero::step_report r = global_step(e, c.rank(), s);
        CHECK(r.optimizer_exchange.total_bytes() == e.optimizer_exchange_formula_bytes());
      }
      // One all-gather of gradients and weights per unit where the states are sharded over N > 1.
      std::uint64_t want = 0;
      if (ranks > 1)
        for (std::size_t u = 0; u < e.layout().num_units(); ++u)
          want += zero::comm::bus_bytes(zero::comm::collective::all_gather,
                                        2 * e.layout().unit(zero::unit_id{u}).padded * sizeof(float), ranks);
      CHECK(e.optimizer_exchange_formula_bytes() == want);
      CHECK(e.memory().model_state_bytes() == e.model_state_formula_bytes());
    });
  }
}

TEST_CASE("adafactor: release_memory parks its state with the model states; training goes on with the same bits") {
  const auto plain = trained<zero::stage3>(2, false);
  std::vector<float> released;
  threads::launch(2, [&](threads& c) {
    zero::engine<zero::stage3, threads, adafactor> e(c, adafactor_model(), settings(), options(2, false));
    e.initialize(init_values);
    for (int s = 0; s < 4; ++s) {
      global_step(e, c.rank(), s);
      e.release_memory();
      CHECK(e.memory().bytes(zero::mem_category::optimizer_states) == 0);
      e.restore_memory();
      CHECK(e.memory().bytes(zero::mem_category::optimizer_states) == model_state_floats * sizeof(float));
    }
    const auto p = e.full_params();
    if (c.rank() == 0) released = p;
  });
  CHECK(bit_equal(released, plain));
}

TEST_CASE("adafactor: bad settings and the offload tier are refused, naming why") {
  adafactor o;
  o.beta2_decay = 0.5f;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("optim::adafactor: beta2_decay"), zero::error);
  o = adafactor{};
  o.d = 0.0f;
  CHECK_THROWS_WITH_AS(o.validate(), doctest::Contains("optim::adafactor: d"), zero::error);
  threads::launch(1, [&](threads& c) {
    zero::engine_options eo;
    eo.offload.tier = zero::offload_tier::host;
    CHECK_THROWS_WITH_AS((zero::engine<zero::stage1, threads, adafactor>(c, adafactor_model(), {}, eo)),
                         doctest::Contains("offload"), zero::error);
  });
}

TEST_CASE("adafactor: a checkpoint at N = 4, stage 3 resumes at N = 2, stage 1 with the same bits (reproducible)") {
  const auto reference = trained<zero::stage0>(1, true, 4);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero_adafactor_checkpoint";
  std::filesystem::remove_all(dir);
  threads::launch(4, [&](threads& c) {
    zero::engine<zero::stage3, threads, adafactor> e(c, adafactor_model(), settings(), options(4, true));
    e.initialize(init_values);
    for (int s = 0; s < 2; ++s) global_step(e, c.rank(), s);
    REQUIRE(e.optimizer_kind_state().size() == model_state_floats);
    zero::checkpoint::save(e, c, dir);
    // The asynchronous saver and peer snapshots carry the data files alone: refused, naming the way.
    zero::checkpoint::async_saver saver;
    CHECK_THROWS_WITH_AS(saver.save(e, c, dir), doctest::Contains("save with checkpoint::save"), zero::error);
  });
  std::vector<float> resumed;
  const auto resume = [&](bool corrupt_state) {
    threads::launch(2, [&](threads& c) {
      zero::engine<zero::stage1, threads, adafactor> e(c, adafactor_model(), settings(), options(2, true));
      e.initialize(init_values);
      if (corrupt_state) {
        CHECK_THROWS_WITH_AS(zero::checkpoint::load(e, c, dir), doctest::Contains("optimizer_state.f32"), zero::error);
        return;
      }
      const auto r = zero::checkpoint::load(e, c, dir);
      REQUIRE(r.info.optimizer_state.has_value());
      CHECK(r.info.optimizer_state->floats == model_state_floats);
      for (int s = 2; s < 4; ++s) global_step(e, c.rank(), s);
      const auto p = e.full_params();
      if (c.rank() == 0) resumed = p;
    });
  };
  resume(false);
  CHECK(bit_equal(resumed, reference));
  // The manifest names the state's file and size; a size that disagrees with the file is refused.
  const std::filesystem::path version = zero::checkpoint::resolve(dir);
  {
    std::ifstream in(version / "manifest.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string floats = "\"floats\":" + std::to_string(model_state_floats);
    const auto at = text.find(floats);
    REQUIRE(at != std::string::npos);
    CHECK(zero::checkpoint::parse_manifest(text, "m", false).optimizer_state->floats == model_state_floats);
    text.replace(at, floats.size(), "\"floats\":" + std::to_string(model_state_floats + 1));
    CHECK_THROWS_WITH_AS(zero::checkpoint::parse_manifest(text, "m", false),
                         doctest::Contains("optimizer_state.floats"), zero::error);
  }
  // A changed byte of the state's file is found before any state changes.
  {
    std::fstream f(version / "optimizer_state.f32", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const char byte = 0x5a;
    f.write(&byte, 1);
  }
  resume(true);
  std::filesystem::remove_all(dir);
}
