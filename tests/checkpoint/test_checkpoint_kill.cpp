// Kills during a save: a process killed at any moment, at random or at each step of the protocol, leaves a
// checkpoint that loads and holds exactly one of the states that were saved.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "checkpoint_helpers.hpp"
#include "zero/checkpoint/save_async.hpp"

using namespace ckpt_test;

namespace {

using stage = zero::stage3;
constexpr int ranks = 2;

// The state after every step 0..steps of one uninterrupted run: what any committed save must equal.
std::vector<state_arrays> expected_states(int steps) {
  const auto spec = toy::spec();
  std::vector<state_arrays> out(static_cast<std::size_t>(steps) + 1, sized_arrays<adamw>(spec));
  zero::comm::threads::launch(ranks, [&](zero::comm::threads& comm) {
    zero::engine<stage, zero::comm::threads, adamw> e(comm, spec);
    e.initialize(toy::initializer());
    read_state(e, out[0]);
    for (int t = 0; t < steps; ++t) {
      toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
      read_state(e, out[static_cast<std::size_t>(t) + 1]);
    }
  });
  return out;
}

// Step 0 saved, so that there is always a previous checkpoint.
void save_initial(const fs::path& dir) {
  zero::comm::threads::launch(ranks, [&](zero::comm::threads& comm) {
    zero::engine<stage, zero::comm::threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    ckpt::save(e, comm, dir);
  });
}

// How a child saves: blocking, or asynchronously (each save completing the previous one, the
// last completed by wait()), so that a kill can land while a writer thread is in the middle of a file.
enum class saving { blocking, async };

// The child: resumes from dir, then trains and saves `saves` times. Never returns.
[[noreturn]] void run_child(const fs::path& dir, int saves, const ckpt::save_options& options,
                            saving how = saving::blocking) {
  int code = 0;
  try {
    zero::comm::threads::launch(ranks, [&](zero::comm::threads& comm) {
      zero::engine<stage, zero::comm::threads, adamw> e(comm, toy::spec());
      ckpt::load(e, comm, dir);
      ckpt::async_saver saver;
      for (int i = 0; i < saves; ++i) {
        toy::train_step(e, comm.rank(), e.steps());
        if (how == saving::async)
          saver.save(e, comm, dir, options);
        else
          ckpt::save(e, comm, dir, options);
      }
      saver.wait(e, comm);
    });
  } catch (...) {
    code = 1;
  }
  ::_exit(code);
}

// What the parent finds after the child ended: the loaded state must be one the run went through.
std::uint64_t check_loadable(const fs::path& dir, std::vector<state_arrays>& expected) {
  const state_arrays got = load_state<zero::stage1>(3, dir);  // another N and stage than the saver's
  const std::uint64_t s = got.state.step;
  REQUIRE(s < 100000);
  if (s >= expected.size()) expected = expected_states(static_cast<int>(s) + 64);
  CHECK(bit_equal(got.master, expected[s].master));
  CHECK(bit_equal(got.slots[0], expected[s].slots[0]));
  CHECK(bit_equal(got.slots[1], expected[s].slots[1]));
  return s;
}

}  // namespace

TEST_CASE("SIGKILL at random moments during repeated saves always leaves one of the saved states") {
  // Each child saves until it is killed, blocking or asynchronously (its writer thread then often in
  // the middle of a file); the probe's few saves only measure how long saves take.
  constexpr int iterations = 14, probe_saves = 6, endless = 1000000;
  auto expected = expected_states(64);
  for (const saving how : {saving::blocking, saving::async}) {
    CAPTURE(static_cast<int>(how));
    temp_dir d("kill");
    const fs::path dir = d / "ckpt";
    save_initial(dir);

    // How long a child runs when left alone, to spread the kills over its whole life.
    const auto t0 = std::chrono::steady_clock::now();
    {
      temp_dir probe("kill-probe");
      save_initial(probe / "ckpt");
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) run_child(probe / "ckpt", probe_saves, {}, how);
      int status = 0;
      ::waitpid(pid, &status, 0);
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
    }
    const auto life = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);

    std::mt19937_64 rng(1234567);
    std::uint64_t last = 0;
    int interrupted = 0;
    for (int i = 0; i < iterations; ++i) {
      CAPTURE(i);
      const auto delay = std::chrono::microseconds(
          static_cast<long long>(rng() % static_cast<std::uint64_t>(life.count() * 9 / 10 + 1)));
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) run_child(dir, endless, {}, how);
      std::this_thread::sleep_for(delay);
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      REQUIRE(WIFSIGNALED(status));  // a child that exits on its own has failed
      ++interrupted;
      const std::uint64_t s = check_loadable(dir, expected);
      CHECK(s >= last);  // a committed save is never lost
      last = s;
    }
    MESSAGE(interrupted, " children killed within ", life.count(), " us of their start; the checkpoint reached step ",
            last);
    CHECK(last > 0);
  }
}

TEST_CASE("a kill at each step of the save protocol leaves the previous or the new state, never less") {
  auto expected = expected_states(16);
  for (const saving how : {saving::blocking, saving::async}) {
    CAPTURE(static_cast<int>(how));
    temp_dir d("kill-phase");
    const fs::path dir = d / "ckpt";
    save_initial(dir);
    struct point {
      ckpt::save_phase phase;
      int rank;
      bool committed;  // whether the new state is in place at that point
    };
    const point points[] = {
        {ckpt::save_phase::version_created, 0, false},
        {ckpt::save_phase::version_created, 1, false},
        {ckpt::save_phase::data_partly_written, 0, false},
        {ckpt::save_phase::data_partly_written, 1, false},
        {ckpt::save_phase::data_written, 0, false},
        {ckpt::save_phase::data_written, 1, false},
        {ckpt::save_phase::manifest_staged, 0, false},
        {ckpt::save_phase::committed, 0, true},
        {ckpt::save_phase::cleaned, 0, true},
    };
    std::uint64_t step = 0;
    for (const point& p : points) {
      CAPTURE(static_cast<int>(p.phase));
      CAPTURE(p.rank);
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ckpt::save_options o;
        o.on_phase = [p](ckpt::save_phase ph, int rank) {
          if (ph == p.phase && rank == p.rank) ::_exit(42);  // as abrupt as a kill: no unwinding, no flushing
        };
        run_child(dir, 1, o, how);
      }
      int status = 0;
      ::waitpid(pid, &status, 0);
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 42);
      const std::uint64_t s = check_loadable(dir, expected);
      CHECK(s == (p.committed ? step + 1 : step));
      step = s;
    }
    // The debris of the interrupted saves goes with the next complete one.
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) run_child(dir, 1, {}, how);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(check_loadable(dir, expected) == step + 1);
    const auto versions = ckpt::list_versions(dir);
    REQUIRE(versions.size() == 1);
    CHECK(versions[0].committed);
    std::size_t entries = 0;
    for (const auto& entry : fs::directory_iterator(versions[0].path)) entries += entry.is_regular_file() ? 1 : 0;
    CHECK(entries == 1 + ranks);  // the manifest and one data file per rank: no temporary files left
    std::size_t top = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++top;
    CHECK(top == 1);
  }
}
