// The checkpoint flags of the example trainers (--resume, --save, --save-every, --save-async, --export), shared by the
// CPU and GPU trainers, and the peer snapshots in memory of an --elastic run (--snapshot-every).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "trainer_cli.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/comm/split.hpp"

namespace trainer {

// The host memory of an --elastic run's ranks (--snapshot-every K): rank j of a launch keeps holder j
// (zero::checkpoint::peer_snapshot: its own data file and its predecessor's), across launches. A
// failed rank's holder goes with it; a rank that joins starts with an empty one.
class peer_memory {
 public:
  explicit peer_memory(int distance) : distance_(distance) {}

  // A launch of `ranks` ranks begins: the ranks that stay keep their holders; new ones get empty ones.
  void launch(int ranks) {
    while (static_cast<int>(holders_.size()) < ranks) holders_.push_back(std::make_shared<zero::checkpoint::peer_snapshot>());
  }
  // Ranks [first, first + count) failed: their memory is gone; the ranks after them move down.
  void lose(int first, int count) {
    holders_.erase(holders_.begin() + first, holders_.begin() + std::min<int>(first + count, static_cast<int>(holders_.size())));
  }
  zero::checkpoint::peer_snapshot& of(int rank) { return *holders_[static_cast<std::size_t>(rank)]; }
  std::vector<const zero::checkpoint::peer_snapshot*> holders() const {
    std::vector<const zero::checkpoint::peer_snapshot*> out;
    for (const auto& h : holders_) out.push_back(h.get());
    return out;
  }
  bool any() const {
    for (const auto& h : holders_)
      if (!h->empty()) return true;
    return false;
  }
  // The step of the snapshot the holders can rebuild; nothing with the reason otherwise.
  std::optional<std::uint64_t> rebuildable(std::string* why = nullptr) const {
    try {
      return zero::checkpoint::detail::find_snapshot(holders()).first->step();
    } catch (const zero::error& e) {
      if (why) *why = e.what();
      return std::nullopt;
    }
  }
  int distance() const { return distance_; }

  // What the launches' snapshots cost on rank 0 (the ranks' files differ by at most a padded slice).
  void record(int rank, const zero::checkpoint::peer_snapshot_report& r) {
    if (rank != 0) return;
    std::lock_guard lk(m_);
    ++taken_;
    last_ = r;
    copy_s_ += r.copy_seconds;
    exchange_s_ += r.exchange_seconds;
  }
  int taken() const { return taken_; }
  const zero::checkpoint::peer_snapshot_report& last() const { return last_; }
  double mean_copy_seconds() const { return taken_ ? copy_s_ / taken_ : 0.0; }
  double mean_exchange_seconds() const { return taken_ ? exchange_s_ / taken_ : 0.0; }

  bool resume = false;           // the next launch loads from the holders
  bool snapshot_at_end = false;  // the launch stops where the world changes: a snapshot of its last step

 private:
  int distance_ = 1;
  std::vector<std::shared_ptr<zero::checkpoint::peer_snapshot>> holders_;
  std::mutex m_;
  int taken_ = 0;
  zero::checkpoint::peer_snapshot_report last_;
  double copy_s_ = 0, exchange_s_ = 0;
};

// The backend a peer snapshot's ring goes through: the communicator, or the one under a wrapper that
// cannot split (train_mlp's comm::modeled).
template <class Comm>
auto& splittable_comm(Comm& comm) {
  if constexpr (zero::comm::splittable<Comm>) return comm;
  else return comm.inner();
}

// After step i + 1 of a launch: a peer snapshot every --snapshot-every K steps (the run's last step
// excepted), and of the last step of a launch that stops where the world changes.
template <class Engine, class Comm>
void peer_snapshot_after(Engine& e, Comm& comm, const options& o, int i) {
  if (!o.memory) return;
  const bool last = i + 1 == o.steps;
  if (!(last ? o.memory->snapshot_at_end : o.snapshot_every > 0 && (i + 1) % o.snapshot_every == 0)) return;
  auto& ring = splittable_comm(comm);
  const auto report = zero::checkpoint::take_peer_snapshot(e, ring, o.memory->of(ring.rank()), o.memory->distance());
  o.memory->record(ring.rank(), report);
}

// Loads --resume into the engine (or, in an --elastic run going on after a change, the peer snapshot
// the ranks' memory holds), or initializes it with `init`; returns the step training continues
// from (the checkpoint's steps, skipped ones included, so the data position is the same). A
// checkpoint loads at any world size and stage, written by either trainer.
template <class Engine, class Comm, class Init>
std::uint64_t resume_or_initialize(Engine& e, Comm& comm, const options& o, const Init& init) {
  if (o.memory && o.memory->resume) {
    zero::checkpoint::load_peer_snapshot(e, comm, o.memory->holders());
    return e.state().step + e.state().skipped_steps;
  }
  if (o.resume.empty()) {
    e.initialize(init);
    return 0;
  }
  zero::checkpoint::load(e, comm, o.resume);
  return e.state().step + e.state().skipped_steps;
}

// One checkpoint save of the run, as this rank's step loop saw it.
struct save_record {
  std::uint64_t step = 0;     // steps done when it was taken
  std::uint64_t version = 0;  // its version number in --save
  bool async = false;
  double stall_s = 0;       // the step loop held: a blocking save's whole time; an asynchronous one's wait
                            // for the previous save's writer and its snapshot copy
  double waited_s = 0;      // asynchronous: of the stall, the wait for the previous save's writer
  double write_s = 0;       // writing the rank's data file (asynchronous: in the background)
  std::uint64_t bytes = 0;  // the rank's data file, blocking or asynchronous
  double write_bytes_per_s() const { return write_s > 0 ? static_cast<double>(bytes) / write_s : 0.0; }
};

// The run's checkpoints: --save-every's, blocking or (--save-async) asynchronous, and the last one.
// Each save is recorded once complete (an asynchronous one by the next save or the end); the
// trainers print them and write them to --log.
class checkpoints {
 public:
  // After step i + 1 of the run: a periodic --save-every checkpoint (the final one is finish()'s).
  template <class Engine, class Comm>
  void after_step(Engine& e, Comm& comm, const options& o, int i) {
    if (o.save_every > 0 && (i + 1) % o.save_every == 0 && i + 1 < o.steps) save(e, comm, o);
  }
  // The last save (--save), completed before it returns.
  template <class Engine, class Comm>
  void last(Engine& e, Comm& comm, const options& o) {
    save(e, comm, o);
    if (!o.save_async) return;
    saver_.wait(e, comm);
    complete(true);
  }
  // Lines to show since the last call: each save completed, and each wait for a previous writer.
  std::vector<std::string> take_notes() { return std::exchange(notes_, {}); }
  // Saves completed since the last call, for the log.
  std::vector<save_record> take_completed() {
    std::vector<save_record> out(records_.begin() + static_cast<std::ptrdiff_t>(logged_),
                                 records_.begin() + static_cast<std::ptrdiff_t>(completed_));
    logged_ = completed_;
    return out;
  }
  const std::vector<save_record>& records() const { return records_; }
  // "checkpoints: 4 saves (asynchronous), step loop held 2.1 ms mean (...), 3.0 ms max; rank 0 wrote ..."
  std::string summary() const {
    if (completed_ == 0) return {};
    double stall = 0, stall_max = 0, write = 0, bytes = 0, waited = 0;
    for (std::size_t k = 0; k < completed_; ++k) {
      const auto& r = records_[k];
      stall += r.stall_s, stall_max = std::max(stall_max, r.stall_s), write += r.write_s, waited += r.waited_s;
      bytes += static_cast<double>(r.bytes);
    }
    const double n = static_cast<double>(completed_);
    char line[320];
    std::snprintf(line, sizeof line,
                  "checkpoints: %zu save%s (%s), step loop held %.1f ms mean (%.1f of them waiting for the previous "
                  "write), %.1f ms max; rank 0 wrote %.1f MB each in %.3f s mean, %.0f MB/s",
                  completed_, completed_ == 1 ? "" : "s", records_.front().async ? "asynchronous" : "blocking",
                  1e3 * stall / n, 1e3 * waited / n, 1e3 * stall_max, bytes / n / 1e6, write / n,
                  write > 0 ? bytes / write / 1e6 : 0.0);
    return line;
  }

 private:
  template <class Engine, class Comm>
  void save(Engine& e, Comm& comm, const options& o) {
    using clock = std::chrono::steady_clock;
    save_record r;
    r.step = e.steps();
    r.async = o.save_async;
    if (o.save_async) {
      const bool previous = saver_.in_flight();
      const auto started = saver_.save(e, comm, o.save);
      if (previous) complete(true);
      r.version = started.version;
      r.bytes = started.bytes;
      r.waited_s = started.waited_seconds;
      r.stall_s = started.waited_seconds + started.snapshot_seconds;
      if (r.waited_s >= 0.001) {
        char line[160];
        std::snprintf(line, sizeof line, "checkpoint of step %llu waited %.3f s for the previous save's writer",
                      static_cast<unsigned long long>(r.step), r.waited_s);
        notes_.push_back(line);
      }
      records_.push_back(r);
      return;
    }
    const auto t0 = clock::now();
    const auto saved = zero::checkpoint::save(e, comm, o.save);
    r.stall_s = r.write_s = std::chrono::duration<double>(clock::now() - t0).count();
    r.version = saved.version;
    r.bytes = saved.rank_bytes;
    records_.push_back(r);
    complete(false);
  }
  // The oldest incomplete save is complete; an asynchronous one's write time is the saver's report.
  void complete(bool async) {
    save_record& r = records_[completed_++];
    if (async) r.write_s = saver_.last().write_seconds;
    char line[200];
    std::snprintf(line, sizeof line,
                  "checkpoint v%llu of step %llu: %.1f MB, step loop held %.1f ms, written in %.3f s%s",
                  static_cast<unsigned long long>(r.version), static_cast<unsigned long long>(r.step),
                  static_cast<double>(r.bytes) / 1e6, 1e3 * r.stall_s, r.write_s, async ? " in the background" : "");
    notes_.push_back(line);
  }

  zero::checkpoint::async_saver saver_;
  std::vector<save_record> records_;
  std::size_t completed_ = 0, logged_ = 0;
  std::vector<std::string> notes_;
};

// Lines on a stream, for a trainer without a progress line.
struct line_printer {
  std::FILE* out;
  void message(const std::string& text) const { std::fprintf(out, "%s\n", text.c_str()); }
};

// Shows the saves' notes on the progress line's output and writes the completed saves to the log
// (either may be null: the ranks that report neither just drain them).
template <class Bar, class Log>
void report(checkpoints& saves, Bar* bar, Log* log) {
  for (const auto& line : saves.take_notes())
    if (bar) bar->message(line);
  for (const auto& r : saves.take_completed())
    if (log) log->save(r);
}

// The end of the run: --save, then --export. The export reads a checkpoint: the one just saved, or
// a temporary one beside the output, under a name nobody can predict (rank 0 draws it and broadcasts
// it), created afresh so that no existing directory is ever used or removed, and removed afterwards
// without following links. Collective: every rank calls it.
template <class Engine, class Comm>
void finish(Engine& e, Comm& comm, const options& o, checkpoints& saves) {
  namespace ckpt = zero::checkpoint;
  if (!o.save.empty()) saves.last(e, comm, o);
  if (o.export_file.empty()) return;
  std::string dir = o.save;
  const bool temporary = dir.empty();
  if (temporary) {
    std::random_device rd;
    const std::uint64_t token = ((std::uint64_t{rd()} << 16) ^ rd()) & ((std::uint64_t{1} << 48) - 1);
    std::vector<double> shared{comm.rank() == 0 ? static_cast<double>(token) : 0.0};  // exact below 2^53
    ckpt::detail::broadcast(comm, shared, 0);
    dir = o.export_file + ".checkpoint-" + ckpt::to_hex(static_cast<std::uint64_t>(shared[0])).substr(4);
    ckpt::save_options so;
    so.new_directory = true;
    ckpt::save(e, comm, dir, so);
  }
  comm.barrier();
  if (comm.rank() == 0) {
    try {
      ckpt::export_safetensors(dir, o.export_file);
    } catch (...) {
      if (temporary) ckpt::remove_checkpoint(dir);
      throw;
    }
    if (temporary && !ckpt::remove_checkpoint(dir))
      std::fprintf(stderr, "warning: the temporary checkpoint '%s' could not be removed entirely\n",
                   ckpt::printable(dir, 4096).c_str());
  }
  comm.barrier();
}

// A failure as one line that is safe to print: any exception (std::bad_alloc included) made a
// zero::error, names quoted from a checkpoint escaped.
inline std::string printable_failure(std::exception_ptr p) {
  return zero::checkpoint::printable(zero::as_error(p).what(), 4096, zero::checkpoint::printable_mode::message);
}

// Runs a rank's whole run; whatever it throws leaves as a zero::error with a printable message.
template <class F>
void with_printable_errors(F&& f) {
  try {
    f();
  } catch (...) {
    const zero::error e = zero::as_error(std::current_exception());
    throw zero::error(e.kind(), printable_failure(std::current_exception()));
  }
}

}  // namespace trainer
