// release_memory / restore_memory: the model states leave the system's memory between steps and come back
// bit for bit, the protocol is refused meanwhile, and memory() says where the bytes are.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include "../toy_model.hpp"
#include "zero/core/host_pages.hpp"

namespace {

using adamw = zero::optim::adamw;
using threads = zero::comm::threads;

// The parameters after `steps` steps at N ranks; with `release_after` >= 0 the engine's memory is
// released after that many steps (to `to`) and restored before the next.
template <class Stage, class Prec>
std::vector<float> run(int n, int steps, int release_after, zero::release_target to, zero::engine_options eo = {}) {
  const auto dir = std::filesystem::temp_directory_path();
  std::vector<float> out;
  threads::launch(n, [&](threads& comm) {
    zero::engine<Stage, threads, adamw, Prec> e(comm, toy::spec(), {}, eo);
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) {
      if (t == release_after) {
        const zero::memory_report before = e.memory();
        e.release_memory({.to = to, .directory = dir.string()});
        const zero::memory_report& m = e.memory();
        CHECK(m.model_state_bytes() == 0);
        CHECK(e.released().released);
        CHECK(e.released().bytes ==
              before.bytes(zero::mem_category::params) +
                  (eo.offload.tier == zero::offload_tier::none
                       ? before.bytes(zero::mem_category::master) + before.bytes(zero::mem_category::optimizer_states)
                       : 0));
        // A CPU system's host memory is its own: a host target counts what it holds under offload.
        const std::size_t parked = to == zero::release_target::host ? e.released().bytes : 0;
        CHECK(m.bytes(zero::mem_category::offload) == before.bytes(zero::mem_category::offload) + parked);
        e.restore_memory();
        CHECK(!e.released().released);
        for (int c = 0; c < zero::mem_category_count; ++c) {
          CAPTURE(c);
          CHECK(e.memory().current[c] == before.current[c]);
        }
      }
      toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    }
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("released and restored between steps, training continues bit for bit", Stage, zero::stage0,
                   zero::stage1, zero::stage2, zero::stage3) {
  for (int n : {1, 3}) {
    CAPTURE(n);
    const auto straight = run<Stage, zero::precision::fp32>(n, 5, -1, zero::release_target::host);
    CHECK(bit_equal(run<Stage, zero::precision::fp32>(n, 5, 2, zero::release_target::host), straight));
    CHECK(bit_equal(run<Stage, zero::precision::fp32>(n, 5, 3, zero::release_target::disk), straight));
    const auto bf16 = run<Stage, zero::precision::bf16>(n, 5, -1, zero::release_target::host);
    CHECK(bit_equal(run<Stage, zero::precision::bf16>(n, 5, 1, zero::release_target::disk), bf16));
    CHECK(bit_equal(run<Stage, zero::precision::bf16>(n, 5, 4, zero::release_target::host), bf16));
  }
}

TEST_CASE("with an offload tier, with hpZ and persistent units, the release keeps the bits") {
  zero::engine_options host_tier;
  host_tier.offload.tier = zero::offload_tier::host;
  const auto a = run<zero::stage3, zero::precision::bf16>(2, 4, -1, zero::release_target::host, host_tier);
  CHECK(bit_equal(run<zero::stage3, zero::precision::bf16>(2, 4, 2, zero::release_target::host, host_tier), a));
  zero::engine_options persist;
  persist.persist_below_elements = 64;
  const auto b = run<zero::stage3, zero::precision::fp32>(4, 4, -1, zero::release_target::host, persist);
  CHECK(bit_equal(run<zero::stage3, zero::precision::fp32>(4, 4, 1, zero::release_target::disk, persist), b));
  zero::engine_options hpz;
  hpz.zeropp.hpz = true;
  hpz.zeropp.node_size = 2;
  const auto c = run<zero::stage3, zero::precision::fp32>(4, 4, -1, zero::release_target::host, hpz);
  CHECK(bit_equal(run<zero::stage3, zero::precision::fp32>(4, 4, 2, zero::release_target::host, hpz), c));
}

TEST_CASE("while released every protocol call is refused, naming the state; release and restore keep their order") {
  threads::launch(2, [&](threads& comm) {
    zero::engine<zero::stage3, threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    toy::train_step(e, comm.rank(), 0);
    CHECK_THROWS_WITH_AS(e.restore_memory(), doctest::Contains("without a release_memory"), zero::error);
    e.release_memory();
    auto refused = [](auto&& call) {
      try {
        call();
      } catch (const zero::error& err) {
        return err.kind() == zero::error_kind::protocol &&
               std::string(err.what()).find("released") != std::string::npos;
      }
      return false;
    };
    const zero::unit_id u{0};
    CHECK(refused([&] { (void)e.gather(u); }));
    CHECK(refused([&] { (void)e.grads(u); }));
    CHECK(refused([&] { e.reduce(u); }));
    CHECK(refused([&] { e.step(); }));
    CHECK(refused([&] { (void)e.full_params(); }));
    CHECK(refused([&] { (void)e.evaluation(); }));
    CHECK(refused([&] { e.initialize(toy::initializer()); }));
    std::vector<float> buf(e.held_range(u).size());
    CHECK(refused([&] { e.read_state(u, e.held_range(u), buf.data(), nullptr); }));
    CHECK(refused([&] { e.release_memory(); }));
    e.restore_memory();
    toy::train_step(e, comm.rank(), 1);  // the engine works again
    CHECK_THROWS_WITH_AS(e.release_memory({.to = zero::release_target::disk, .directory = ""}),
                         doctest::Contains("directory"), zero::error);
    CHECK(!e.released().released);
    // Not inside an evaluation, nor inside a step.
    {
      auto scope = e.evaluation();
      CHECK_THROWS_WITH_AS(e.release_memory(), doctest::Contains("evaluation"), zero::error);
    }
    auto g = e.gather(u);
    CHECK_THROWS_WITH_AS(e.release_memory(), doctest::Contains("in the middle of a step"), zero::error);
  });
}

TEST_CASE("the error-feedback reducer's carried error is refused by name") {
  threads::launch(2, [&](threads& comm) {
    zero::engine_options eo;
    eo.zeropp.qgz = true;
    eo.zeropp.qgz_error_feedback = true;
    zero::engine<zero::stage2, threads, adamw> e(comm, toy::spec(), {}, eo);
    e.initialize(toy::initializer());
    CHECK_THROWS_WITH_AS(e.release_memory(), doctest::Contains("error feedback"), zero::error);
    CHECK(!e.released().released);
    toy::train_step(e, comm.rank(), 0);
  });
}

TEST_CASE("a released file changed behind the engine's back is an io error at restore, never other parameters") {
  const auto dir = std::filesystem::temp_directory_path() / ("zero-release-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string message;
  threads::launch(1, [&](threads& comm) {
    zero::engine<zero::stage3, threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    toy::train_step(e, comm.rank(), 0);
    e.release_memory({.to = zero::release_target::disk, .directory = dir.string()});
    // The file has no name: its descriptor in /proc/self/fd is the only way to it.
    int changed = 0;
    const std::string prefix = dir.string() + "/", suffix = " (deleted)";
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
      if (ec || !target.starts_with(prefix) || !target.ends_with(suffix)) continue;
      const int fd = ::open(entry.path().c_str(), O_RDWR | O_CLOEXEC);
      REQUIRE(fd >= 0);
      const char junk[4] = {1, 2, 3, 4};
      CHECK(::pwrite(fd, junk, sizeof junk, 100) == 4);
      ::close(fd);
      ++changed;
    }
    CHECK(changed == 1);
    try {
      e.restore_memory();
    } catch (const zero::error& err) {
      CHECK(err.kind() == zero::error_kind::io);
      message = err.what();
    }
  });
  CHECK(message.find("read back other bytes") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a restore refused for memory leaves the engine released, and succeeds once there is room") {
  const auto straight = run<zero::stage2, zero::precision::fp32>(2, 3, -1, zero::release_target::host);
  std::vector<float> out;
  const auto dir = std::filesystem::temp_directory_path();
  threads::launch(2, [&](threads& comm) {
    zero::engine_options eo;
    {
      zero::engine<zero::stage2, threads, adamw> probe(comm, toy::spec());
      probe.initialize(toy::initializer());
      toy::train_step(probe, comm.rank(), 0);
      eo.memory_limit_bytes = probe.memory().peak_total;  // what training needs, no more
    }
    zero::engine<zero::stage2, threads, adamw> e(comm, toy::spec(), {}, eo);
    e.initialize(toy::initializer());
    toy::train_step(e, comm.rank(), 0);
    const std::size_t states = e.memory().model_state_bytes();
    e.release_memory({.to = zero::release_target::disk, .directory = dir.string()});
    {
      const zero::snapshot_block other = e.snapshot_memory(states);  // the memory, used by something else
      CHECK_THROWS_AS(e.restore_memory(), zero::error);
      CHECK(e.released().released);
    }
    e.restore_memory();
    for (int t = 1; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    auto p = e.full_params();
    if (comm.rank() == 0) out = std::move(p);
  });
  CHECK(bit_equal(out, straight));
}

TEST_CASE("what release_memory frees leaves the process: the host keeps no freed block of it for reuse") {
  if (!zero::host_pages::keeps_spares) return;  // (AddressSanitizer: nothing is kept anyway)
  zero::model_spec spec;
  spec.unit("big").tensor("w", {std::size_t{1} << 20});  // 4 MiB per state array: blocks the host would keep
  threads::launch(1, [&](threads& comm) {
    zero::engine<zero::stage0, threads, adamw> e(comm, spec, {}, {});
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, zero::range, std::span<float> v) {
      std::fill(v.begin(), v.end(), 0.5f);
    });
    e.release_memory();
    CHECK(e.released().bytes >= 3 * (std::size_t{4} << 20));
    CHECK(zero::host_pages::spare_bytes() == 0);
    e.restore_memory();
  });
}
