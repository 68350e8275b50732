// Asynchronous saves: the same directory as a blocking save, the state of the moment of the snapshot
// whatever training does meanwhile, the snapshot counted in memory(), and errors of the background
// writer surfacing on every rank with the new version gone and the previous one current.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <optional>
#include <set>
#include <thread>

#include "checkpoint_helpers.hpp"
#include "zero/checkpoint/save_async.hpp"

using namespace ckpt_test;

namespace {

using threads = zero::comm::threads;

// Every regular file under a version directory, by name, with its bytes.
std::map<std::string, std::string> files_of(const fs::path& vdir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(vdir))
    if (entry.is_regular_file()) out[entry.path().filename().string()] = slurp(entry.path());
  return out;
}

// Whether a file in `dir` can be opened for writes past the page cache (not on tmpfs, for one).
bool takes_direct_io(const fs::path& dir) {
  const fs::path probe = dir / "direct-probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0600);
  if (fd < 0) return false;
  ::close(fd);
  fs::remove(probe);
  return true;
}

}  // namespace

TEST_CASE("data files written past the page cache hold the page cache's bytes, blocking and asynchronous") {
  // Data files of several 4 MiB blocks and a ragged last one, saved with save_options::direct_io on
  // (the default) and off, and asynchronously: the same files.
  zero::model_spec spec;
  spec.unit("a").tensor("w", {1400001});
  spec.unit("b").tensor("w", {333333}).tensor("v", {17});
  temp_dir direct("direct-b"), cached("cached-b"), background("direct-a");
  for (int n : {1, 2}) {
    CAPTURE(n);
    threads::launch(n, [&](threads& comm) {
      zero::engine<zero::stage1, threads, adamw> e(comm, spec);
      e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1e-3f * static_cast<float>(i % 977) - 0.3f;
      });
      ckpt::save_options through_cache;
      through_cache.direct_io = false;
      const auto d = ckpt::save(e, comm, direct.path);
      const auto c = ckpt::save(e, comm, cached.path, through_cache);
      ckpt::async_saver saver;
      saver.save(e, comm, background.path);
      const std::optional<ckpt::save_result> a = saver.wait(e, comm);
      REQUIRE(a.has_value());
      if (comm.rank() == 0) {
        CHECK(files_of(d.version_dir) == files_of(c.version_dir));
        CHECK(files_of(a->version_dir) == files_of(c.version_dir));
      }
      // Where the file system takes O_DIRECT every whole 4 MiB block of the writer went past the page
      // cache (and a last one too where its size is aligned); where it does not, none did.
      constexpr std::uint64_t block = std::uint64_t{4} << 20;
      const std::uint64_t bytes = saver.last().bytes, direct_bytes = saver.last().direct_bytes;
      CHECK(bytes > 2 * block);
      if (takes_direct_io(background.path)) {
        CHECK(direct_bytes >= bytes / block * block);
        CHECK(direct_bytes <= bytes);
        CHECK(direct_bytes % ckpt::durable_writer::direct_alignment == 0);
      } else {
        CHECK(direct_bytes == 0);
      }
    });
  }
}

TEST_CASE_TEMPLATE("an asynchronous save writes exactly the blocking save's files", Stage, zero::stage0, zero::stage1,
                   zero::stage3) {
  temp_dir blocking("async-b"), background("async-a");
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    threads::launch(n, [&](threads& comm) {
      zero::engine<Stage, threads, adamw> e(comm, toy::spec());
      e.initialize(toy::initializer());
      for (int t = 0; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
      const auto b = ckpt::save(e, comm, blocking.path);
      ckpt::async_saver saver;
      const auto started = saver.save(e, comm, background.path);
      CHECK(saver.in_flight());
      const std::optional<ckpt::save_result> a = saver.wait(e, comm);
      REQUIRE(a.has_value());
      CHECK(!saver.in_flight());
      CHECK(a->version == b.version);
      CHECK(a->bytes == b.bytes);
      CHECK(started.version == a->version);
      CHECK(saver.last().completed);
      CHECK(saver.last().write_seconds >= 0.0);
      if (comm.rank() == 0) CHECK(files_of(a->version_dir) == files_of(b.version_dir));
      CHECK(!saver.wait(e, comm).has_value());  // nothing in flight
    });
  }
}

TEST_CASE("an engine whose states are offloaded to disk snapshots them from its file, the same bytes") {
  temp_dir blocking("async-b"), background("async-a"), tier("async-tier");
  threads::launch(2, [&](threads& comm) {
    zero::engine_options eo;
    eo.offload.tier = zero::offload_tier::disk;
    eo.offload.directory = tier.path.string();
    eo.offload.slice_elements = 1024;
    zero::engine<zero::stage3, threads, adamw, zero::precision::bf16> e(comm, toy::spec(), {}, eo);
    e.initialize(toy::initializer());
    for (int t = 0; t < 2; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    const auto b = ckpt::save(e, comm, blocking.path);
    ckpt::async_saver saver;
    saver.save(e, comm, background.path);
    toy::train_step(e, comm.rank(), 2);
    const auto a = saver.wait(e, comm);
    if (comm.rank() == 0) CHECK(files_of(a->version_dir) == files_of(b.version_dir));
  });
}

TEST_CASE("the snapshot holds the state of its moment while training goes on, and costs one data file of memory") {
  temp_dir d("async"), more("async-more");
  const state_arrays at3 = train<zero::stage3>(4, 3);
  const state_arrays at6 = train<zero::stage3>(4, 6);
  state_arrays now = sized_arrays<adamw>(toy::spec());  // each rank fills its slices
  threads::launch(4, [&](threads& comm) {
    zero::engine<zero::stage3, threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    ckpt::async_saver saver;
    for (int t = 0; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    CHECK(e.memory().bytes(zero::mem_category::snapshot) == 0);
    const auto model_states = e.memory().model_state_bytes();
    const auto r = saver.save(e, comm, d.path);
    CHECK(r.bytes > 0);
    CHECK(e.memory().bytes(zero::mem_category::snapshot) == r.bytes);
    CHECK(e.memory().model_state_bytes() == model_states);
    for (int t = 3; t < 6; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    while (saver.writing()) std::this_thread::yield();
    CHECK(saver.in_flight());  // written, not yet committed
    CHECK(saver.wait(e, comm).has_value());
    CHECK(!saver.writing());
    // Kept for the next save (async_saver_options::keep_memory), which reuses it; trim() frees it.
    CHECK(e.memory().bytes(zero::mem_category::snapshot) == r.bytes);
    CHECK(saver.kept_bytes() == r.bytes);
    saver.save(e, comm, more.path);
    CHECK(e.memory().peak_bytes(zero::mem_category::snapshot) == r.bytes);  // the same memory, not a second copy
    saver.wait(e, comm);
    saver.trim();
    CHECK(e.memory().bytes(zero::mem_category::snapshot) == 0);
    // Without keep_memory the memory goes with each save's completion.
    ckpt::async_saver lean({.keep_memory = false});
    lean.save(e, comm, more.path);
    lean.wait(e, comm);
    CHECK(e.memory().bytes(zero::mem_category::snapshot) == 0);
    CHECK(lean.kept_bytes() == 0);
    read_state(e, now);
  });
  CHECK(bit_equal(now, at6));                                  // the save changed nothing
  CHECK(bit_equal(load_state<zero::stage1>(2, d.path), at3));  // the checkpoint is step 3's
  CHECK(bit_equal(load_state<zero::stage2>(3, more.path), at6));
}

TEST_CASE("saving asynchronously every step ends as saving blocking does, and every version loads elsewhere") {
  temp_dir blocking("async-b"), background("async-a");
  std::vector<state_arrays> states;
  for (int t = 1; t <= 5; ++t) states.push_back(train<zero::stage2>(3, t));
  ckpt::save_options keep_all;
  keep_all.keep = 10;
  for (bool async : {false, true}) {
    threads::launch(3, [&](threads& comm) {
      zero::engine<zero::stage2, threads, adamw> e(comm, toy::spec());
      e.initialize(toy::initializer());
      ckpt::async_saver saver;
      for (int t = 0; t < 5; ++t) {
        toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
        if (async) {
          const auto r = saver.save(e, comm, background.path, keep_all);
          if (t > 0) CHECK(saver.last().version == static_cast<std::uint64_t>(t));  // completed by this save
          if (t > 0) CHECK(saver.last().completed);
          CHECK(r.version == static_cast<std::uint64_t>(t) + 1);
        } else {
          ckpt::save(e, comm, blocking.path, keep_all);
        }
      }
      if (async) CHECK(saver.wait(e, comm)->version == 5);
    });
  }
  const auto a = ckpt::list_versions(background.path), b = ckpt::list_versions(blocking.path);
  REQUIRE(a.size() == 5);
  REQUIRE(b.size() == 5);
  for (std::size_t v = 0; v < 5; ++v) {
    CAPTURE(v);
    CHECK(a[v].committed);
    CHECK(files_of(a[v].path) == files_of(b[v].path));
    CHECK(bit_equal(load_state<zero::stage3>(v % 2 ? 4 : 1, a[v].path), states[v]));
  }
}

TEST_CASE("an error of the background writer is thrown on every rank by wait(), and the new version goes") {
  temp_dir d("async");
  const state_arrays at0 = train<zero::stage3>(3, 0);
  for (auto failing : {ckpt::save_phase::data_partly_written, ckpt::save_phase::data_written}) {
    CAPTURE(static_cast<int>(failing));
    std::atomic<int> thrown{0};
    threads::launch(3, [&](threads& comm) {
      zero::engine<zero::stage3, threads, adamw> e(comm, toy::spec());
      e.initialize(toy::initializer());
      ckpt::async_saver saver;
      ckpt::save(e, comm, d.path);  // step 0: the current checkpoint
      toy::train_step(e, comm.rank(), 0);
      ckpt::save_options o;
      o.on_phase = [failing](ckpt::save_phase p, int rank) {
        if (p == failing && rank == 1) throw zero::error(zero::error_kind::io, "disk full on rank 1");
      };
      saver.save(e, comm, d.path, o);  // the snapshot is taken: the error comes later
      try {
        saver.wait(e, comm);
      } catch (const zero::error& err) {
        CHECK(err.kind() == zero::error_kind::io);
        CHECK(std::string(err.what()).find("disk full on rank 1") != std::string::npos);
        ++thrown;
      }
      CHECK(!saver.in_flight());
      saver.trim();
      CHECK(e.memory().bytes(zero::mem_category::snapshot) == 0);
    });
    CHECK(thrown == 3);
    const auto versions = ckpt::list_versions(d.path);
    REQUIRE(versions.size() == 1);  // the failed version is gone
    CHECK(bit_equal(load_state<zero::stage1>(2, d.path), at0));
  }
}

TEST_CASE("an error of the writer surfaces at the next save, which then does not start") {
  temp_dir d("async");
  std::atomic<int> thrown{0};
  threads::launch(2, [&](threads& comm) {
    zero::engine<zero::stage1, threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    ckpt::async_saver saver;
    ckpt::save_options o;
    o.on_phase = [](ckpt::save_phase p, int rank) {
      if (p == ckpt::save_phase::data_written && rank == 0) throw zero::error(zero::error_kind::io, "no space");
    };
    saver.save(e, comm, d.path, o);
    toy::train_step(e, comm.rank(), 0);
    try {
      saver.save(e, comm, d.path);
    } catch (const zero::error& err) {
      CHECK(std::string(err.what()).find("no space") != std::string::npos);
      ++thrown;
    }
    CHECK(!saver.in_flight());
    // The saver is usable again.
    saver.save(e, comm, d.path);
    CHECK(saver.wait(e, comm)->version >= 1);
  });
  CHECK(thrown == 2);
  const auto versions = ckpt::list_versions(d.path);
  REQUIRE(versions.size() == 1);
  CHECK(versions[0].committed);
  CHECK(ckpt::read_manifest(d.path).state.step == 1);
}

TEST_CASE("a snapshot over the memory budget is refused on every rank before anything is written") {
  temp_dir d("async");
  std::atomic<int> refused{0};
  threads::launch(2, [&](threads& comm) {
    zero::engine_options opts;
    {
      zero::engine<zero::stage3, threads, adamw> probe(comm, toy::spec());
      for (auto bytes : probe.memory().current) opts.memory_limit_bytes += bytes;
      opts.memory_limit_bytes += 64;  // room for the model states, not for a snapshot
    }
    zero::engine<zero::stage3, threads, adamw> e(comm, toy::spec(), {}, opts);
    ckpt::save(e, comm, d.path);
    ckpt::async_saver saver;
    try {
      saver.save(e, comm, d.path);
    } catch (const zero::error& err) {
      CHECK(std::string(err.what()).find("snapshot") != std::string::npos);
      ++refused;
    }
    CHECK(!saver.in_flight());
  });
  CHECK(refused == 2);
  const auto versions = ckpt::list_versions(d.path);
  REQUIRE(versions.size() == 1);
  CHECK(versions[0].committed);
}

TEST_CASE("a saver dropped with a save in flight leaves that version uncommitted, and the next save clears it") {
  temp_dir d("async");
  threads::launch(2, [&](threads& comm) {
    zero::engine<zero::stage3, threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    ckpt::save(e, comm, d.path);
    toy::train_step(e, comm.rank(), 0);
    {
      ckpt::async_saver saver;
      saver.save(e, comm, d.path);
    }
    comm.barrier();
    if (comm.rank() == 0) {
      CHECK(ckpt::read_manifest(d.path).state.step == 0);  // version 2 is incomplete: never loaded
      CHECK(ckpt::list_versions(d.path).size() == 2);
    }
    comm.barrier();
    ckpt::save(e, comm, d.path);
  });
  const auto versions = ckpt::list_versions(d.path);
  REQUIRE(versions.size() == 1);
  CHECK(versions[0].number == 3);
  CHECK(ckpt::read_manifest(d.path).state.step == 1);
}

TEST_CASE("a saver that outlives its engine frees its snapshot safely") {
  temp_dir d("async");
  threads::launch(2, [&](threads& comm) {
    ckpt::async_saver saver;  // declared before the engine: destroyed after it
    zero::engine<zero::stage2, threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    saver.save(e, comm, d.path);
  });
  CHECK(ckpt::list_versions(d.path).size() == 1);
}

TEST_CASE_TEMPLATE("zero::plan knows the snapshot: the largest rank's data file, as the saver holds it", Stage,
                   zero::stage0, zero::stage1, zero::stage2, zero::stage3) {
  temp_dir d("async");
  for (int n : {1, 3, 4}) {
    CAPTURE(n);
    std::atomic<std::uint64_t> largest{0};
    threads::launch(n, [&](threads& comm) {
      zero::engine<Stage, threads, zero::optim::sgd, zero::precision::bf16> e(comm, toy::spec());
      ckpt::async_saver saver;
      const auto r = saver.save(e, comm, d.path);
      CHECK(e.memory().bytes(zero::mem_category::snapshot) == r.bytes);
      std::uint64_t seen = largest.load();
      while (r.bytes > seen && !largest.compare_exchange_weak(seen, r.bytes)) {
      }
      saver.wait(e, comm);
    });
    const auto p = zero::plan_for<Stage, threads, zero::optim::sgd, zero::precision::bf16>(toy::spec(), n);
    CHECK(p.checkpoint_snapshot_bytes == largest.load());
    const auto q = zero::plan_for<Stage, threads, adamw, zero::precision::fp32>(toy::spec(), n);
    CHECK(q.checkpoint_snapshot_bytes * 2 == p.checkpoint_snapshot_bytes * 3);  // three arrays, not two
  }
}
