// Offload of master weights and optimizer slots to host memory and disk: the same bits as without, the tiers' bytes and traffic equal their formulas, faults named.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint_helpers.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/zero.hpp"

namespace {

namespace fs = std::filesystem;
using zero::offload_tier;

// Units of awkward sizes, about 6700 elements: with slices of 1024 elements the disk tier streams
// several slices, whose edges fall inside units at every N.
zero::model_spec spec() {
  zero::model_spec s;
  s.unit("embed").tensor("w", {61, 37});
  s.unit("tiny").tensor("scale", {1});
  s.unit("block").tensor("w", {43, 71}).tensor("b", {43});
  s.unit("head").tensor("w", {9, 89}).tensor("b", {9});
  return s;
}

float initial(std::size_t unit, std::size_t i) {
  return 0.05f * std::sin(static_cast<float>(i) * 0.37f + static_cast<float>(unit));
}

zero::init_range_fn init() {
  return [](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = initial(u.name.size() + t.numel, r.begin + i);
  };
}

// One step: forward and backward over every unit; the gradient depends on the parameter, the rank
// and the step, so a divergence anywhere shows in later steps.
template <class Engine>
zero::step_report step(Engine& e, int rank, std::uint64_t t) {
  const auto& s = e.spec();
  for (std::size_t u = 0; u < s.num_units(); ++u) e.gather(zero::unit_id{u}).release();
  for (std::size_t u = s.num_units(); u-- > 0;) {
    const zero::unit_id id{u};
    auto p = e.gather(id);
    auto g = e.grads(id);
    const auto pv = p.view();
    const auto gv = g.view();
    using G = typename Engine::grad_type;
    for (std::size_t j = 0; j < pv.size(); ++j)
      gv.data()[j] = static_cast<G>(
          std::cos(static_cast<float>(pv.data()[j]) * 3.0f + static_cast<float>(rank + 1) * 0.1f * static_cast<float>(t) +
                   static_cast<float>(j) * 0.01f) *
          e.loss_scale());
    e.reduce(id);
  }
  return e.step();
}

struct outcome {
  std::vector<float> params;
  std::vector<zero::memory_report> memory;
  std::vector<zero::offload_report> offload;
  std::vector<std::uint64_t> formula_system, formula_tier;
  std::vector<zero::offload_traffic> formula_traffic;
};

zero::engine_options with_tier(offload_tier tier, const fs::path& dir, std::size_t slice = 1024) {
  zero::engine_options o;
  o.offload.tier = tier;
  o.offload.directory = dir.string();
  o.offload.slice_elements = slice;
  o.clip_norm = 0.5f;
  return o;
}

template <class Stage, class Opt, class Prec>
outcome train(int n, int steps, const zero::engine_options& o) {
  outcome out;
  out.memory.resize(static_cast<std::size_t>(n));
  out.offload.resize(static_cast<std::size_t>(n));
  out.formula_system.resize(static_cast<std::size_t>(n));
  out.formula_tier.resize(static_cast<std::size_t>(n));
  out.formula_traffic.resize(static_cast<std::size_t>(n));
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, Opt, Prec> e(comm, spec(), Opt{}, o);
    e.initialize(init());
    for (int t = 0; t < steps; ++t) step(e, comm.rank(), static_cast<std::uint64_t>(t));
    const auto r = static_cast<std::size_t>(comm.rank());
    out.memory[r] = e.memory();
    out.offload[r] = e.offload();
    out.formula_system[r] = e.model_state_formula_bytes();
    out.formula_tier[r] = e.offload_formula_bytes();
    out.formula_traffic[r] = e.offload_formula_traffic();
    auto full = e.full_params();
    if (r == 0) out.params = std::move(full);
  });
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("offload to host memory and to disk: every stage, precision and optimizer, the bits of no offload") {
  ckpt_test::temp_dir dir("offload-bits");
  zero::stages::for_each([&]<class Stage>() {
    zero::precisions::for_each([&]<class Prec>() {
      zero::optimizers::for_each([&]<class Opt>() {
        CAPTURE(Stage::stage);
        CAPTURE(Prec::name);
        CAPTURE(Opt::name);
        for (int n : {1, 3}) {
          CAPTURE(n);
          const auto base = train<Stage, Opt, Prec>(n, 3, with_tier(offload_tier::none, dir.path));
          for (offload_tier tier : {offload_tier::host, offload_tier::disk}) {
            CAPTURE(zero::to_string(tier));
            const auto got = train<Stage, Opt, Prec>(n, 3, with_tier(tier, dir.path));
            CHECK(bit_equal(got.params, base.params));
          }
        }
      });
    });
  });
  CHECK(fs::is_empty(dir.path));  // every engine removed its file
}

TEST_CASE("offload: the system keeps params and grads, the tier the K bytes; bytes and traffic equal the formulas") {
  ckpt_test::temp_dir dir("offload-formulas");
  const auto l2 = zero::layout::make(spec(), 2);
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    auto check = [&]<class Prec>(Prec) {
      CAPTURE(Prec::name);
      using Opt = zero::optim::adamw;
      const std::uint64_t psi = l2.padded(), held = Stage::stage >= 1 ? psi / 2 : psi;
      const std::uint64_t arrays = (Prec::separate_master ? 1 : 0) + Opt::slots;
      const std::uint64_t p = sizeof(typename Prec::param_type), g = sizeof(typename Prec::grad_type);
      // Independent of zero::formula: the params and grads per stage, and the arrays in the tier.
      const std::uint64_t params = Stage::shards_parameters ? psi / 2 * p : psi * p;
      const std::uint64_t grads = Stage::shards_gradients ? psi / 2 * g : psi * g;
      const std::uint64_t region = (held * 4 + 4095) / 4096 * 4096;
      for (offload_tier tier : {offload_tier::host, offload_tier::disk}) {
        CAPTURE(zero::to_string(tier));
        const auto r = train<Stage, Opt, Prec>(2, 2, with_tier(tier, dir.path));
        for (std::size_t k = 0; k < 2; ++k) {
          const auto& m = r.memory[k];
          const auto& o = r.offload[k];
          CHECK(m.bytes(zero::mem_category::master) == 0);
          CHECK(m.bytes(zero::mem_category::optimizer_states) == 0);
          CHECK(m.model_state_bytes() == params + grads);
          CHECK(r.formula_system[k] == params + grads);
          CHECK(o.arrays == static_cast<int>(arrays));
          CHECK(o.elements == held);
          if (tier == offload_tier::host) {
            CHECK(o.host_bytes == arrays * held * 4);
            CHECK(o.disk_bytes == 0);
            CHECK(r.formula_tier[k] == arrays * held * 4);
            CHECK(o.last_step.total() == 0);  // host memory is where the host loop runs: nothing moves
          } else {
            CHECK(o.host_bytes == 0);
            CHECK(o.disk_bytes == arrays * region);
            CHECK(r.formula_tier[k] == arrays * region);
            CHECK(o.last_step.disk_read == arrays * region);
            CHECK(o.last_step.disk_written == arrays * region);
            CHECK(o.last_step.disk_read == r.formula_traffic[k].disk_read);
            CHECK(o.last_step.disk_written == r.formula_traffic[k].disk_written);
            CHECK(o.staging_bytes == 3 * arrays * 1024 * 4);  // three slice sets
            CHECK(!o.file.empty());
          }
          CHECK(o.last_step.to_host == 0);
          CHECK(r.formula_traffic[k].to_host == 0);
        }
      }
    };
    check(zero::precision::fp32{});
    check(zero::precision::bf16{});
  });
}

TEST_CASE("offload: checkpoints move between offloaded and in-memory engines at any N and stage") {
  ckpt_test::temp_dir dir("offload-ckpt");
  ckpt_test::temp_dir ck("offload-ckpt-save");
  using Opt = zero::optim::adamw;
  using Prec = zero::precision::bf16;
  // Uninterrupted: 4 steps at N = 2, stage 1, in memory.
  const auto whole = train<zero::stage1, Opt, Prec>(2, 4, with_tier(offload_tier::none, dir.path));
  // 2 steps on disk at N = 2 stage 3, saved; loaded in memory at N = 2 stage 1 and on disk at N = 2,
  // stage 2, 2 more steps each: the same bits as the uninterrupted run (stages are bit-identical).
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, Opt, Prec> e(comm, spec(), Opt{}, with_tier(offload_tier::disk, dir.path));
    e.initialize(init());
    for (std::uint64_t t = 0; t < 2; ++t) step(e, comm.rank(), t);
    zero::checkpoint::save(e, comm, ck.path);
  });
  auto resume = [&]<class Stage>(Stage, offload_tier tier) {
    std::vector<float> out;
    zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
      zero::engine<Stage, zero::comm::threads, Opt, Prec> e(comm, spec(), Opt{}, with_tier(tier, dir.path));
      zero::checkpoint::load(e, comm, ck.path);
      for (std::uint64_t t = 2; t < 4; ++t) step(e, comm.rank(), t);
      auto full = e.full_params();
      if (comm.rank() == 0) out = std::move(full);
    });
    return out;
  };
  CHECK(bit_equal(resume(zero::stage1{}, offload_tier::none), whole.params));
  CHECK(bit_equal(resume(zero::stage2{}, offload_tier::disk), whole.params));
  CHECK(bit_equal(resume(zero::stage0{}, offload_tier::host), whole.params));
}

namespace {
// The error a run on 2 ranks ends in when `harm` is done to rank 0's offload file after `before`
// steps; the run's last checkpoint (saved after one step) must stay loadable and resume exactly.
std::string harmed(void (*harm)(const std::string& file), const fs::path& dir, const fs::path& ck) {
  using Opt = zero::optim::adamw;
  std::string message;
  try {
    zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
      zero::engine<zero::stage2, zero::comm::threads, Opt> e(comm, spec(), Opt{}, with_tier(offload_tier::disk, dir));
      e.initialize(init());
      step(e, comm.rank(), 0);
      zero::checkpoint::save(e, comm, ck);
      comm.barrier();
      if (comm.rank() == 0) harm(e.offload().file);
      comm.barrier();
      step(e, comm.rank(), 1);
    });
  } catch (const zero::error& e) {
    CHECK(e.kind() == zero::error_kind::io);
    message = e.what();
  }
  return message;
}
}  // namespace

TEST_CASE("offload to disk: a file removed or truncated under the engine is an error naming it; the checkpoint stays") {
  ckpt_test::temp_dir dir("offload-faults");
  ckpt_test::temp_dir ck("offload-faults-save");
  const std::string removed = harmed([](const std::string& f) { ::unlink(f.c_str()); }, dir.path, ck.path);
  CHECK(removed.find("rank 0: offload file '" + dir.path.string()) == 0);
  CHECK(removed.find("was removed while the engine used it") != std::string::npos);
  const std::string truncated = harmed([](const std::string& f) { CHECK(::truncate(f.c_str(), 4096) == 0); }, dir.path, ck.path);
  CHECK(truncated.find("rank 0: offload file '") == 0);
  CHECK(truncated.find("was truncated to 4096 bytes") != std::string::npos);
  // Nothing lost: the last checkpoint loads into a new engine and continues as without the fault.
  using Opt = zero::optim::adamw;
  std::vector<float> resumed, whole;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage2, zero::comm::threads, Opt> a(comm, spec(), Opt{}, with_tier(offload_tier::disk, dir.path));
    zero::checkpoint::load(a, comm, ck.path);
    step(a, comm.rank(), 1);
    zero::engine<zero::stage2, zero::comm::threads, Opt> b(comm, spec(), Opt{}, with_tier(offload_tier::none, dir.path));
    b.initialize(init());
    step(b, comm.rank(), 0);
    step(b, comm.rank(), 1);
    auto x = a.full_params();
    auto y = b.full_params();
    if (comm.rank() == 0) resumed = std::move(x), whole = std::move(y);
  });
  CHECK(bit_equal(resumed, whole));
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("offload options are checked before anything is allocated") {
  auto message = [](zero::engine_options o) {
    std::string m;
    zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
      try {
        zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, spec(), {}, o);
      } catch (const zero::error& e) {
        m = e.what();
      }
    });
    return m;
  };
  zero::engine_options o;
  o.offload.tier = offload_tier::disk;
  CHECK(message(o) ==
        "rank 0: engine_options: offload to disk needs offload.directory, an existing directory on a local file system");
  o.offload.directory = "/nonexistent-zero-offload-dir";
  CHECK(message(o) == "rank 0: offload directory '/nonexistent-zero-offload-dir' cannot be used: No such file or directory");
  ckpt_test::temp_dir dir("offload-options");
  { std::ofstream(dir / "a-file") << "x"; }
  o.offload.directory = (dir / "a-file").string();
  CHECK(message(o) == "rank 0: offload directory '" + o.offload.directory + "' is not a directory");
  o.offload.slice_elements = 1000;
  CHECK(message(o) == "rank 0: engine_options: offload.slice_elements must be a positive multiple of 1024 (4 KiB of "
                      "fp32, the unit of direct I/O), got 1000");
}
