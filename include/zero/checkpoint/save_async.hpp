// checkpoint::async_saver: a save whose writing runs in the background while training goes on.
#pragma once

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "zero/checkpoint/save.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/error.hpp"
#include "zero/offload/host_block.hpp"

namespace zero::checkpoint {

// One asynchronous save, as the step loop and the writer saw it.
struct async_save_report {
  std::uint64_t version = 0;    // the version it created (committed once completed)
  std::uint64_t bytes = 0;      // of this rank's data file, the size of its snapshot
  double waited_seconds = 0;    // save(): held waiting for the previous save's writer to finish
  double snapshot_seconds = 0;  // save(): copying the rank's state into the snapshot (with the version's creation)
  double write_seconds = 0;     // the writer: the data file, from its first byte to its durable rename
  std::uint64_t direct_bytes = 0;  // the writer: of the data file's bytes, those that went past the page cache
  bool completed = false;       // committed by a later save() or wait()
};

// Saves as checkpoint::save() does, producing exactly the same directory, with the data files
// written by a background thread on each rank:
//
//   zero::checkpoint::async_saver saver;             // after the engine: destroyed before it
//   saver.save(e, comm, dir);                        // returns once the state is copied
//   ... steps ...
//   saver.save(e, comm, dir);                        // commits the previous save, then starts this one
//   auto result = saver.wait(e, comm);               // commits the last one
//
// save() is a collective. It first completes the save in flight, if any (waits for its writer, then
// commits it as save() does: the files' records reach rank 0, which writes the manifest), so at most
// one snapshot per rank is held. Then rank 0 creates the new version, every rank copies its ranges of
// the master weights and slots into a host snapshot (pinned where the system pins host memory) and
// the manifest's fields are taken from the engine as it stands, and a writer thread starts writing the
// rank's data file from the snapshot. Training may then change the engine freely.
// The new version is committed by the next save() or by wait(), a collective that returns its
// save_result. Until then it is incomplete: a load never picks it, and a process killed at any point
// leaves the previous version the current one. An error of the writer (a full disk, a directory
// removed under it) is thrown on every rank by that next save() or wait(), and the new version is
// removed, as a failed save() removes it.
// The snapshot is counted in the engine's memory() under mem_category::snapshot, where host memory
// is the system's own (held to memory_limit_bytes there), from save() until the writer is joined, and
// by default kept for the next save after that (async_saver_options::keep_memory; trim() frees it).
// A saver destroyed with a save in flight joins its writer and leaves that version uncommitted (the
// next save into the directory removes it): call wait() before the end of a run.
struct async_saver_options {
  // Keep the snapshot's memory once a save completes, for the next save of the same engine: a fresh
  // allocation costs the kernel's page faults and zeroing, several times the copy itself. It stays
  // counted under mem_category::snapshot until trim() or the saver's end.
  bool keep_memory = true;
  // The writer thread's nice value (Linux sets it per thread): where every core is busy training, the
  // steps keep their time and the writer takes what is left. 0 leaves it as the process's.
  int writer_nice = 10;
};

class async_saver {
 public:
  async_saver() = default;
  explicit async_saver(const async_saver_options& o) : o_(o) {}
  async_saver(const async_saver&) = delete;
  async_saver& operator=(const async_saver&) = delete;
  ~async_saver() { join(); }

  template <class Engine, CommBackend Comm>
  async_save_report save(Engine& e, Comm& comm, const fs::path& dir, const save_options& options = {}) {
    using clock = std::chrono::steady_clock;
    using Opt = typename Engine::optimizer;
    constexpr std::size_t nslots = 1 + static_cast<std::size_t>(Opt::slots);
    const detail::mesh_place mesh = detail::mesh_place_of(e);
    detail::check_communicator(e, comm, mesh, "save");
    detail::check_no_kind_state(e, "asynchronous save");
    ZERO_CHECK(options.keep >= 1, invalid_argument, "checkpoint save: keep must be at least 1");
    const auto t0 = clock::now();
    if (job_) complete(comm);
    const auto t1 = clock::now();

    auto job = std::make_unique<pending_save>();
    job->dir = dir;
    job->options = options;
    job->spec = e.spec();
    job->tp_size = mesh.tp_size;
    job->nslots = nslots;
    job->world = comm.size();
    job->version = detail::open_version(comm, dir, options);
    const int rank = comm.rank();
    job->file = dir / version_name(job->version) / data_file_name(rank, comm.size());

    // The snapshot: this rank's data file, byte for byte, in host memory.
    const detail::outcome copied = detail::attempt([&] {
      if (options.on_phase) options.on_phase(save_phase::version_created, rank);
      detail::data_file_plan plan = detail::plan_own_file(e, mesh, nslots);
      job->ranges = std::move(plan.ranges);
      job->snapshot = e.snapshot_memory(plan.bytes, std::move(kept_));
      auto* base = static_cast<unsigned char*>(job->snapshot.data());
      detail::copy_own_file(e, plan, base);
      job->bytes = plan.bytes;
      if (rank == 0) job->head = detail::manifest_head(e, mesh, comm.size());
    });
    try {
      detail::agree(comm, copied, "save (copying the state into the snapshot)");
    } catch (...) {
      if (rank == 0) detail::remove_version(dir, version_name(job->version));
      throw;
    }
    const auto t2 = clock::now();
    job->report.version = job->version;
    job->report.bytes = job->bytes;
    job->report.waited_seconds = std::chrono::duration<double>(t1 - t0).count();
    job->report.snapshot_seconds = std::chrono::duration<double>(t2 - t1).count();

    // Copied before the writer starts: the writer fills in the report's write time.
    const async_save_report taken = job->report;
    pending_save* j = job.get();
    j->writer = std::thread([j, rank, nice = o_.writer_nice] {
      if (nice != 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice);
      j->write(rank);
    });
    job_ = std::move(job);
    return taken;
  }

  // Completes the save in flight, a collective: waits for every rank's writer, then commits the
  // version (or throws its error on every rank, the version removed). Returns its result, or nothing
  // when no save is in flight. The engine is the one the save was taken from.
  template <class Engine, CommBackend Comm>
  std::optional<save_result> wait(Engine& e, Comm& comm) {
    detail::check_communicator(e, comm, detail::mesh_place_of(e), "wait");
    if (!job_) return std::nullopt;
    return complete(comm);
  }

  // Whether a save is in flight (taken, not yet completed by save() or wait()).
  bool in_flight() const { return job_ != nullptr; }
  // Whether this rank's writer is still writing (a save in flight whose wait() would block here).
  bool writing() const { return job_ && !job_->finished.load(std::memory_order_acquire); }
  // The last save's report; after its completion, with its write time.
  const async_save_report& last() const { return last_; }
  // Frees the snapshot memory kept for the next save (async_saver_options::keep_memory).
  void trim() { kept_ = snapshot_block(); }
  // The bytes kept for the next save.
  std::size_t kept_bytes() const { return kept_.bytes(); }

 private:
  struct pending_save {
    fs::path dir, file;
    save_options options;
    model_spec spec;
    int tp_size = 1, world = 1;
    std::size_t nslots = 1;
    std::uint64_t version = 0, bytes = 0;
    std::vector<range> ranges;
    manifest head;
    snapshot_block snapshot;
    std::thread writer;
    detail::written_file written;
    async_save_report report;
    std::atomic<bool> finished{false};

    // The writer thread: the data file from the snapshot, in blocks, then its durable rename.
    void write(int rank) {
      const auto t0 = std::chrono::steady_clock::now();
      written.result = detail::attempt([&] {
        durable_writer w(file, existing_file::refuse);
        // The snapshot is aligned (host_block, or the system's pinned pages) and so are its 4 MiB
        // blocks: where save_options::direct_io bypasses the page cache, all but a ragged last one go
        // from it to the device (the writer's training neighbours keep their memory bandwidth).
        if (options.direct_io) w.bypass_page_cache();
        detail::half_way half(bytes, [&] {
          if (options.on_phase) options.on_phase(save_phase::data_partly_written, rank);
        });
        const auto* p = static_cast<const unsigned char*>(snapshot.data());
        for (std::uint64_t at = 0; at < bytes; at += write_block_bytes) {
          const std::uint64_t n = std::min<std::uint64_t>(write_block_bytes, bytes - at);
          w.write(p + at, n);
          half.wrote(w.bytes());
        }
        half.wrote(w.bytes());
        report.direct_bytes = w.direct_bytes();
        w.commit();
        written.checksum = w.checksum();
        written.bytes = w.bytes();
        if (options.on_phase) options.on_phase(save_phase::data_written, rank);
      });
      report.write_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      finished.store(true, std::memory_order_release);
    }
  };

  // The writer's block: large enough that a disk streams, small enough to report progress.
  static constexpr std::uint64_t write_block_bytes = std::uint64_t{4} << 20;

  template <CommBackend Comm>
  save_result complete(Comm& comm) {
    std::unique_ptr<pending_save> job = std::move(job_);
    job->writer.join();
    // The state is on disk (or the write failed): the memory goes now, or is kept for the next save.
    if (o_.keep_memory) kept_ = std::move(job->snapshot);
    job->snapshot = snapshot_block();
    last_ = job->report;
    ZERO_CHECK(comm.size() == job->world, invalid_argument, "checkpoint wait: the communicator has ", comm.size(),
               " ranks, the save in flight was taken over ", job->world);
    save_result r = detail::commit_version(comm, job->spec, job->tp_size, job->nslots, std::move(job->head), job->dir,
                                           job->version, job->ranges, job->written, job->options);
    last_.completed = true;
    return r;
  }

  void join() noexcept {
    if (job_ && job_->writer.joinable()) job_->writer.join();
    job_.reset();
  }

  async_saver_options o_;
  std::unique_ptr<pending_save> job_;
  async_save_report last_;
  snapshot_block kept_;  // the last snapshot's memory, for the next save (keep_memory)
};

}  // namespace zero::checkpoint
