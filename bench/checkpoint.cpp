// Checkpoint saves and memory release against the step loop, in one run over ranks on threads: a step's time
// alone, a blocking save, an asynchronous save's stall against a memcpy of its snapshot, the steps that run while
// its writer writes (and the stall of a second save, into the first one's memory), and release/restore (host and disk) against a memcpy of the same bytes. One JSON line.
//
// Usage: bench_checkpoint --dir DIR [--ranks N] [--mib M] [--steps S]
//   DIR: where the checkpoints and the released file go (the disk being measured); M: MiB of checkpoint per rank
//   (master weights and AdamW's two slots, stage 1: 12 bytes per element of the rank's slice; default 256);
//   S: steps timed alone (default 6; the median is reported).
#include "zero/checkpoint/checkpoint.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "zero/zero.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using threads = zero::comm::threads;
using engine = zero::engine<zero::stage1, threads, zero::optim::adamw>;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One step: every unit's gradient set to a small constant pattern, reduced, and the update.
void step(engine& e) {
  for (std::size_t u = 0; u < e.spec().num_units(); ++u) {
    auto g = e.grads(zero::unit_id{u});
    auto v = g["w"];
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1e-3f * static_cast<float>(i % 7);
    e.reduce(zero::unit_id{u});
  }
  e.step();
}

// The time of every rank copying `bytes` at once (as the ranks take their snapshots at once).
double concurrent_memcpy(int ranks, std::size_t bytes) {
  std::vector<std::vector<char>> src(static_cast<std::size_t>(ranks), std::vector<char>(bytes, 1)),
      dst(static_cast<std::size_t>(ranks), std::vector<char>(bytes, 0));
  std::vector<double> best;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = clock_type::now();
    std::vector<std::thread> ts;
    for (int r = 0; r < ranks; ++r)
      ts.emplace_back([&, r] {
        std::memcpy(dst[static_cast<std::size_t>(r)].data(), src[static_cast<std::size_t>(r)].data(), bytes);
      });
    for (auto& t : ts) t.join();
    best.push_back(seconds_since(t0));
  }
  return *std::min_element(best.begin(), best.end());
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int ranks = 2, mib = 256, steps = 6;
  CLI::App app{"checkpoint saves (blocking, asynchronous) and memory release against the step loop"};
  app.add_option("--dir", dir, "directory for the checkpoints and the released file")->required();
  app.add_option("--ranks", ranks, "ranks (threads)")->check(CLI::Range(1, 16));
  app.add_option("--mib", mib, "MiB of checkpoint per rank")->check(CLI::Range(1, 65536));
  app.add_option("--steps", steps, "steps timed alone")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  // Stage 1 over N ranks: each rank's file holds 3 arrays of Psi/N elements.
  const std::size_t per_rank = static_cast<std::size_t>(mib) * (std::size_t{1} << 20) / 12;
  const std::size_t psi = per_rank * static_cast<std::size_t>(ranks);
  constexpr std::size_t unit_elements = std::size_t{1} << 22;
  zero::model_spec spec;
  for (std::size_t at = 0, u = 0; at < psi; at += unit_elements, ++u)
    spec.unit("u" + std::to_string(u)).tensor("w", {std::min(unit_elements, psi - at)});
  const std::filesystem::path root(dir);
  std::filesystem::create_directories(root);

  nlohmann::json out;
  std::mutex m;
  threads::launch(ranks, [&](threads& comm) {
    engine e(comm, spec);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1e-2f * static_cast<float>(i % 13);
    });
    step(e);  // warm: every buffer touched
    std::vector<double> alone;
    for (int s = 0; s < steps; ++s) {
      comm.barrier();
      const auto t0 = clock_type::now();
      step(e);
      alone.push_back(seconds_since(t0));
    }

    comm.barrier();
    auto t0 = clock_type::now();
    const auto blocking = zero::checkpoint::save(e, comm, root / "blocking");
    const double blocking_s = seconds_since(t0);
    comm.barrier();
    t0 = clock_type::now();
    zero::checkpoint::save_options through_page_cache;
    through_page_cache.direct_io = false;
    zero::checkpoint::save(e, comm, root / "blocking", through_page_cache);
    const double blocking_buffered_s = seconds_since(t0);

    // An asynchronous save and the steps during its write: the stall, the write's time, the median
    // step and how many ran, the bytes that went past the page cache.
    struct async_round {
      double stall_s, write_s, step_s;
      std::size_t steps;
      std::uint64_t direct_bytes;
    };
    const auto save_while_training = [&](zero::checkpoint::async_saver& saver, bool direct) {
      comm.barrier();
      const auto a0 = clock_type::now();
      zero::checkpoint::save_options o;
      o.direct_io = direct;
      saver.save(e, comm, root / "async", o);
      const double stall = seconds_since(a0);
      std::vector<double> during;
      int writing = 1;
      while (writing > 0) {  // every rank steps until every rank's writer is done
        const auto s0 = clock_type::now();
        step(e);
        during.push_back(seconds_since(s0));
        std::vector<int> w{saver.writing() ? 1 : 0};
        comm.all_reduce(w.data(), w.data(), 1, zero::reduce_op::sum);
        writing = w[0];
      }
      saver.wait(e, comm);
      return async_round{stall, saver.last().write_seconds, median(during), during.size(), saver.last().direct_bytes};
    };
    zero::checkpoint::async_saver saver;
    const async_round first = save_while_training(saver, true);
    const auto started = saver.last();
    const double stall_s = first.stall_s;
    // The second save copies into the first one's memory (async_saver_options::keep_memory).
    const async_round again = save_while_training(saver, true);
    const double stall_again_s = again.stall_s;
    saver.trim();
    // The same through the page cache (save_options::direct_io off), after a first save that fills
    // the saver's kept memory.
    zero::checkpoint::async_saver buffered_saver;
    (void)save_while_training(buffered_saver, false);
    const async_round buffered = save_while_training(buffered_saver, false);
    buffered_saver.trim();

    comm.barrier();
    t0 = clock_type::now();
    e.release_memory({.to = zero::release_target::host, .directory = {}});
    const double release_host_s = seconds_since(t0);
    t0 = clock_type::now();
    e.restore_memory();
    const double restore_host_s = seconds_since(t0);
    const std::uint64_t released_bytes = [&] {
      e.release_memory({.to = zero::release_target::disk, .directory = dir});
      return e.released().bytes;
    }();
    e.restore_memory();
    comm.barrier();
    t0 = clock_type::now();
    e.release_memory({.to = zero::release_target::disk, .directory = dir});
    const double release_disk_s = seconds_since(t0);
    t0 = clock_type::now();
    e.restore_memory();
    const double restore_disk_s = seconds_since(t0);
    step(e);  // the engine still works

    if (comm.rank() != 0) return;
    std::lock_guard<std::mutex> lock(m);
    const double step_s = median(alone);
    out = {{"bench", "checkpoint"},
           {"ranks", ranks},
           {"bytes_per_rank", started.bytes},
           {"checkpoint_bytes", blocking.bytes},
           {"step_s", step_s},
           {"blocking_save_s", blocking_s},
           {"buffered_blocking_save_s", blocking_buffered_s},
           {"async_stall_s", stall_s},
           {"async_snapshot_s", started.snapshot_seconds},
           {"async_stall_again_s", stall_again_s},
           {"async_write_s", again.write_s},
           {"write_bytes_per_s", static_cast<double>(started.bytes) / again.write_s},
           {"direct_bytes", again.direct_bytes},
           {"steps_during_write", again.steps},
           {"step_during_write_s", again.step_s},
           {"step_during_write_ratio", again.step_s / step_s},
           {"first_async_write_s", first.write_s},
           {"first_step_during_write_ratio", first.step_s / step_s},
           {"buffered_async_stall_s", buffered.stall_s},
           {"buffered_async_write_s", buffered.write_s},
           {"buffered_write_bytes_per_s", static_cast<double>(started.bytes) / buffered.write_s},
           {"buffered_steps_during_write", buffered.steps},
           {"buffered_step_during_write_ratio", buffered.step_s / step_s},
           {"released_bytes", released_bytes},
           {"release_host_s", release_host_s},
           {"restore_host_s", restore_host_s},
           {"release_disk_s", release_disk_s},
           {"restore_disk_s", restore_disk_s}};
  });
  const double copy_s = concurrent_memcpy(ranks, out["bytes_per_rank"].get<std::size_t>());
  const double copy_released_s = concurrent_memcpy(ranks, out["released_bytes"].get<std::size_t>());
  out["memcpy_snapshot_s"] = copy_s;
  out["stall_over_memcpy"] = out["async_stall_s"].get<double>() / copy_s;
  out["stall_again_over_memcpy"] = out["async_stall_again_s"].get<double>() / copy_s;
  out["memcpy_released_s"] = copy_released_s;
  out["release_host_over_memcpy"] = out["release_host_s"].get<double>() / copy_released_s;
  out["restore_host_over_memcpy"] = out["restore_host_s"].get<double>() / copy_released_s;
  std::printf("%s\n", out.dump().c_str());
  std::filesystem::remove_all(root / "blocking");
  std::filesystem::remove_all(root / "async");
  return 0;
}
