// Offload of master weights and optimizer slots to host memory and disk: the same bits as without, the tiers' bytes and traffic equal their formulas, faults named.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
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
// Every descriptor of this process open on an anonymous offload file in `dir` (its link in
// /proc/self/fd: "<dir>/#<inode> (deleted)" for O_TMPFILE, "<dir>/<name> (deleted)" otherwise): the
// only way left to reach the file.
std::vector<std::string> offload_descriptors(const fs::path& dir) {
  std::vector<std::string> out;
  const std::string prefix = dir.string() + "/", suffix = " (deleted)";
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(entry.path(), ec).string();
    if (!ec && target.starts_with(prefix) && target.ends_with(suffix)) out.push_back(entry.path().string());
  }
  return out;
}

// The error a run on 2 ranks ends in when `harm` is done to both ranks' offload files (through
// /proc/self/fd/N: they have no name) after one step; the run's last checkpoint (saved after that
// step) must stay loadable and resume exactly.
std::string harmed(void (*harm)(const std::string& fd_path), const fs::path& dir, const fs::path& ck) {
  using Opt = zero::optim::adamw;
  std::string message;
  try {
    zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
      zero::engine<zero::stage2, zero::comm::threads, Opt> e(comm, spec(), Opt{}, with_tier(offload_tier::disk, dir));
      e.initialize(init());
      step(e, comm.rank(), 0);
      zero::checkpoint::save(e, comm, ck);
      comm.barrier();
      if (comm.rank() == 0) {
        const auto fds = offload_descriptors(dir);
        CHECK(fds.size() == 2);
        for (const auto& fd : fds) harm(fd);
      }
      comm.barrier();
      step(e, comm.rank(), 1);
    });
  } catch (const zero::error& e) {
    CHECK(e.kind() == zero::error_kind::io);
    message = e.what();
  }
  return message;
}

// Opens the file behind /proc/self/fd/N afresh (buffered, whatever the engine's descriptor uses).
int reopen(const std::string& fd_path) {
  const int fd = ::open(fd_path.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  return fd;
}
}  // namespace

TEST_CASE("offload to disk: the file has no name; planted names and hard links are never written or removed") {
  ckpt_test::temp_dir dir("offload-anonymous");
  ckpt_test::temp_dir outside("offload-anonymous-outside");
  // Names an engine of this process could once have used, planted before it starts: regular files,
  // and hard links to a file outside the directory (what a rename or link race would redirect to).
  const std::string victim_text(10000, 'v');
  { std::ofstream(outside / "victim") << victim_text; }
  std::vector<fs::path> planted;
  for (int c = 0; c < 64; ++c) {
    for (int rank = 0; rank < 2; ++rank) {
      const std::string stem = "zero-offload-rank" + std::to_string(rank) + "-" + std::to_string(::getpid()) + "-" +
                               std::to_string(c);
      planted.push_back(dir / (stem + ".state"));
      { std::ofstream(planted.back()) << "planted " << c; }
      planted.push_back(dir / (stem + ".unlinked"));
      fs::create_hard_link(outside / "victim", planted.back());
    }
  }
  auto entries = [&] {
    std::vector<fs::path> e;
    for (const auto& x : fs::directory_iterator(dir.path)) e.push_back(x.path());
    std::sort(e.begin(), e.end());
    return e;
  };
  std::sort(planted.begin(), planted.end());
  REQUIRE(entries() == planted);
  auto intact = [&] {
    CHECK(entries() == planted);
    for (std::size_t i = 0; i < planted.size(); i += 2) {
      std::ifstream in(planted[i]);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      CHECK(text.starts_with("planted "));
    }
    std::ifstream in(outside / "victim");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text == victim_text);
    CHECK(fs::hard_link_count(outside / "victim") == 1 + planted.size() / 2);
  };

  // An engine: while it lives, its directory has no entry of its own; its steps write nothing named.
  const auto base = train<zero::stage3, zero::optim::adamw, zero::precision::bf16>(2, 2, with_tier(offload_tier::none, dir.path));
  std::vector<float> got;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw, zero::precision::bf16> e(
        comm, spec(), {}, with_tier(offload_tier::disk, dir.path));
    e.initialize(init());
    comm.barrier();
    if (comm.rank() == 0) {
      intact();
      CHECK(offload_descriptors(dir.path).size() == 2);
    }
    for (std::uint64_t t = 0; t < 2; ++t) step(e, comm.rank(), t);
    comm.barrier();
    if (comm.rank() == 0) intact();
    CHECK(e.offload().file == "anonymous file of rank " + std::to_string(comm.rank()) + " in '" + dir.path.string() + "'");
    auto full = e.full_params();
    if (comm.rank() == 0) got = std::move(full);
  });
  CHECK(bit_equal(got, base.params));
  intact();
  CHECK(offload_descriptors(dir.path).empty());  // closed with the engine: nothing left to remove

  // Where a file system refuses O_TMPFILE: created under a fresh name (past every planted one) and
  // unlinked before anything is written; the same guarantees.
  for (int round = 0; round < 2; ++round) {
    zero::offload::state_file f(dir.path.string(), 0, 2, 8192, true, zero::offload::anonymous_file::unlinked);
    CHECK(f.named_then_unlinked());
    intact();
    std::vector<char> block(4096, 'x'), back(4096);
    auto* aligned = static_cast<char*>(::operator new(8192, std::align_val_t{4096}));
    std::memcpy(aligned, block.data(), 4096);
    f.write(1, 4096, aligned, 4096);
    f.read(1, 4096, aligned + 4096, 4096);
    CHECK(std::memcmp(aligned + 4096, block.data(), 4096) == 0);
    ::operator delete(aligned, std::align_val_t{4096});
    intact();
  }
  intact();
}

TEST_CASE("offload to disk: an overwritten, truncated or re-extended file is an io error naming the slice") {
  ckpt_test::temp_dir dir("offload-faults");
  ckpt_test::temp_dir ck("offload-faults-save");
  const std::string prefix = "rank ";
  const std::string file = " in '" + dir.path.string() + "')";
  // Overwritten in place with zeros: the first 4 KiB of array 0's slice 0.
  const std::string zeroed = harmed(
      [](const std::string& fd_path) {
        const int fd = reopen(fd_path);
        const std::vector<char> zeros(4096, 0);
        CHECK(::pwrite(fd, zeros.data(), zeros.size(), 0) == 4096);
        ::close(fd);
      },
      dir.path, ck.path);
  INFO(zeroed);
  CHECK(zeroed.starts_with(prefix));
  CHECK(zeroed.find("offload file (anonymous file of rank ") != std::string::npos);
  CHECK(zeroed.find(file) != std::string::npos);
  CHECK(zeroed.find("state array 0 (optimizer_states), slice 0 of ") != std::string::npos);
  CHECK(zeroed.find("read back other bytes than were written") != std::string::npos);
  // Truncated and extended again to its size: zeros where the states were, at the right size.
  const std::string reextended = harmed(
      [](const std::string& fd_path) {
        const int fd = reopen(fd_path);
        struct stat st {};
        CHECK(::fstat(fd, &st) == 0);
        CHECK(::ftruncate(fd, 0) == 0);
        CHECK(::ftruncate(fd, st.st_size) == 0);
        ::close(fd);
      },
      dir.path, ck.path);
  INFO(reextended);
  CHECK(reextended.find(file) != std::string::npos);
  CHECK(reextended.find("state array 0 (optimizer_states), slice 0 of ") != std::string::npos);
  CHECK(reextended.find("read back other bytes than were written") != std::string::npos);
  // Truncated: found by fstat before the step reads.
  const std::string truncated = harmed(
      [](const std::string& fd_path) {
        const int fd = reopen(fd_path);
        CHECK(::ftruncate(fd, 4096) == 0);
        ::close(fd);
      },
      dir.path, ck.path);
  INFO(truncated);
  CHECK(truncated.find(file + " was truncated to 4096 bytes") != std::string::npos);
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
  CHECK(offload_descriptors(dir.path).empty());
}

TEST_CASE("offload to disk: a slice overwritten between a write_state and a read_state is found there too") {
  // read()/write() of the store hold a slice in host memory and write it back before the next
  // stream; what they read from the file is checked as the stream's reads are.
  ckpt_test::temp_dir dir("offload-rw");
  std::string message;
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    using E = zero::engine<zero::stage1, zero::comm::threads, zero::optim::adamw, zero::precision::bf16>;
    E e(comm, spec(), {}, with_tier(offload_tier::disk, dir.path));
    e.initialize(init());
    step(e, 0, 0);
    const auto fds = offload_descriptors(dir.path);
    REQUIRE(fds.size() == 1);
    const int fd = reopen(fds[0]);
    const std::vector<char> zeros(4096, 0);
    const auto region = static_cast<off_t>(e.offload().disk_bytes / 3);  // array 1: the first slot
    CHECK(::pwrite(fd, zeros.data(), zeros.size(), region) == 4096);
    ::close(fd);
    std::vector<float> master(10), m(10), v(10);
    float* slots[2] = {m.data(), v.data()};
    try {
      e.read_state(zero::unit_id{0}, {0, 10}, master.data(), slots);
    } catch (const zero::error& x) {
      CHECK(x.kind() == zero::error_kind::io);
      message = x.what();
    }
  });
  INFO(message);
  CHECK(message.find("rank 0: offload file (anonymous file of rank 0 in '" + dir.path.string() +
                     "'): state array 1 (optimizer_states), slice 0 of ") == 0);
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

TEST_CASE("offload within the budget: the tier's host memory counts; a refusal names offload when it would fit") {
  ckpt_test::temp_dir dir("offload-budget");
  using E = zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw, zero::precision::bf16>;
  auto refusal = [&](const zero::engine_options& o) {
    std::string m;
    zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
      try {
        E e(comm, spec(), {}, o);
      } catch (const zero::error& x) {
        CHECK(x.kind() == zero::error_kind::out_of_memory);
        if (comm.rank() == 0) m = x.what();
      }
    });
    return m;
  };
  // The disk tier in slices of 1024: its slice sets and checksums are what the plan says, held in
  // memory() as offload; the budget is exactly the planned model states with them.
  zero::engine_options sliced = with_tier(offload_tier::disk, dir.path, 1024);
  const auto p = zero::plan_for<zero::stage3, zero::optim::adamw, zero::precision::bf16>(spec(), 2, sliced);
  REQUIRE(p.model_states.offload == p.offload_staging_bytes + p.offload_checksum_bytes);
  const std::uint64_t budget = p.model_states.total();
  sliced.memory_limit_bytes = budget;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    E e(comm, spec(), {}, sliced);
    CHECK(e.memory().bytes(zero::mem_category::offload) == p.model_states.offload);
    CHECK(e.offload().staging_bytes == p.offload_staging_bytes);
    CHECK(e.offload().checksum_bytes == p.offload_checksum_bytes);
    CHECK(e.memory().model_state_bytes() + e.memory().bytes(zero::mem_category::offload) == budget);
  });
  CHECK(fs::is_empty(dir.path));
  const std::string fits = "With offload (engine_options::offload, tier disk: the master weights and optimizer slots in a "
                           "file, streamed through " + std::to_string(p.model_states.offload) +
                           " bytes of host memory for its slices and checksums with offload.slice_elements = 1024) "
                           "stage 3 would need " + std::to_string(budget) + " bytes on this rank, which fit";
  // Without offload the same budget is refused, and the refusal names the disk tier that would fit.
  zero::engine_options plain = with_tier(offload_tier::none, dir.path);
  plain.memory_limit_bytes = budget;
  const std::string without = refusal(plain);
  INFO(without);
  CHECK(without.find("rank 0: out of memory: the model states of ZeRO stage 3 at N = 2") == 0);
  CHECK(without.find(fits) != std::string::npos);
  // With the default slice (2^20 elements) the small state is staged whole: counted, so refused, the
  // message naming the tier's bytes and the slice that would fit.
  zero::engine_options whole = with_tier(offload_tier::disk, dir.path, std::size_t{1} << 20);
  whole.memory_limit_bytes = budget;
  const auto q = zero::plan_for<zero::stage3, zero::optim::adamw, zero::precision::bf16>(spec(), 2, whole);
  CHECK(q.offload_staging_bytes == 3 * ((p.padded / 2 + 1023) / 1024 * 1024) * 4);  // one set of 3 arrays
  const std::string staged = refusal(whole);
  INFO(staged);
  CHECK(staged.find(", offload " + std::to_string(q.model_states.offload) + "), more than the memory_limit_bytes") !=
        std::string::npos);
  CHECK(staged.find(fits) != std::string::npos);
  CHECK(fs::is_empty(dir.path));  // refused before the file was opened
}
