// --elastic, --fail RANK:STEP, --rejoin-step, --grow and --snapshot-every: a run on threads that loses a rank goes on at
// N - 1 from its last checkpoint (on disk, or a peer snapshot in the ranks' memory) and takes the rank back at a later
// one, and grows by new ranks at checkpoints; with --reproducible, to the bits of a run that never changed.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "trainer_checkpoint.hpp"
#include "trainer_cli.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/versions.hpp"
#include "zero/error.hpp"

namespace trainer {

// What one launch's ranks share with the supervisor: the failures planted for it, which rank failed
// first (the cause: its peers fail only after it, when the world aborts), and its progress.
class elastic_monitor {
 public:
  using clock = std::chrono::steady_clock;

  explicit elastic_monitor(std::vector<planted_failure> planted) : planted_(std::move(planted)) {}

  // A new launch of `ranks` ranks begins.
  void launch(int ranks) {
    std::lock_guard lk(m_);
    ranks_ = ranks;
    failed_rank_ = -1;
    first_step_.reset();
    steps_done_.reset();
    first_step_end_.reset();
  }
  // Rank `rank` begins global step t + 1 (t steps done): the next planted failure fires there, once.
  // They fire in the order given, each only after the one before it: a second one at an earlier step
  // is a failure during the recovery from the first.
  void step_begins(int rank, std::uint64_t t) {
    std::lock_guard lk(m_);
    if (!first_step_) first_step_ = t;
    for (auto& p : planted_) {
      if (p.fired) continue;
      if (p.rank == rank && p.step == t + 1) {
        p.fired = true;
        throw std::runtime_error("planted failure (--fail " + std::to_string(p.rank) + ":" +
                                 std::to_string(p.step) + "): rank " + std::to_string(rank) +
                                 " stops as it begins step " + std::to_string(p.step));
      }
      break;  // only the first not yet fired is armed
    }
  }
  // Rank 0 has finished global step `steps`.
  void step_done(int rank, std::uint64_t steps) {
    if (rank != 0) return;
    std::lock_guard lk(m_);
    steps_done_ = steps;
    if (!first_step_end_) first_step_end_ = clock::now();
  }
  // Rank `rank` is leaving its function by an exception: the first to do so is the cause.
  void rank_failed(int rank) {
    std::lock_guard lk(m_);
    if (failed_rank_ < 0) failed_rank_ = rank;
  }

  int ranks() const { return ranks_; }
  int failed_rank() const { return failed_rank_; }
  std::optional<std::uint64_t> first_step() const { return first_step_; }      // the launch's t0
  std::optional<std::uint64_t> steps_done() const { return steps_done_; }      // none before its first step
  std::optional<clock::time_point> first_step_end() const { return first_step_end_; }

 private:
  mutable std::mutex m_;
  std::vector<planted_failure> planted_;
  int ranks_ = 0, failed_rank_ = -1;
  std::optional<std::uint64_t> first_step_, steps_done_;
  std::optional<clock::time_point> first_step_end_;
};

// --elastic, --fail RANK:STEP (repeatable), --rejoin-step STEP, --grow STEP (repeatable) and --snapshot-every K
// (train_mlp, train_gpt).
inline void add_elastic_flags(CLI::App& app, options& o) {
  app.add_flag("--elastic", o.elastic,
               "when a rank fails (--backend threads), go on at one rank fewer from the newest checkpoint in --save "
               "(at most --save-every steps redone); with --reproducible, to the bits of a run that never failed");
  app.add_option_function<std::vector<std::string>>(
         "--fail",
         [&o](const std::vector<std::string>& specs) {
           for (const std::string& spec : specs) {
             const auto colon = spec.find(':');
             planted_failure p;
             const auto parse = [&](std::string_view text, auto& out) {
               const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
               return ec == std::errc{} && end == text.data() + text.size() && !text.empty();
             };
             if (colon == std::string::npos || !parse(std::string_view(spec).substr(0, colon), p.rank) ||
                 !parse(std::string_view(spec).substr(colon + 1), p.step) || p.rank < 0 || p.step < 1 ||
                 p.step > (std::uint64_t{1} << 40))
               throw CLI::ValidationError("--fail", "expected RANK:STEP (rank >= 0, step >= 1), got " +
                                                        toolcli::quote(spec));
             o.planted.push_back(p);
           }
         },
         "plant a failure: rank RANK throws as it begins step STEP (counted from 1 over the whole run; ranks "
         "numbered in the world that reaches it); repeatable: each fires after the one before it, so a second one "
         "at an earlier step fails the recovery from the first; for tests and demos of --elastic and of "
         "scripts/elastic_mpirun.py")
      ->type_name("RANK:STEP");
  toolcli::add_integer(app, "--rejoin-step", o.rejoin_step, std::uint64_t{1}, std::uint64_t{1} << 40,
                       "with --elastic: a lost rank comes back at this step (the smaller world saves there and the "
                       "whole world goes on from that checkpoint)");
  app.add_option("--grow", o.grow_steps,
                 "with --elastic: after this many steps the world grows by one rank (train_gpt: one tensor-parallel "
                 "group) that was never in the run: the world saves there and the larger one goes on from that "
                 "checkpoint (repeatable; with --reproducible, to the bits of a run at the first size)")
      ->type_name("STEP")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  toolcli::add_integer(app, "--snapshot-every", o.snapshot_every, 1, 1 << 30,
                       "with --elastic: every K steps each rank copies its state into host memory, and into its "
                       "neighbour's (train_gpt --tp T: the rank T places on), so that a lost rank's survives; the run "
                       "goes on from it without a file system (--save not needed)");
}

// What is wrong with the planted failures in a world of `ranks` ranks ("" when nothing).
inline std::string planted_problem(const options& o, int ranks) {
  for (const auto& p : o.planted) {
    if (p.rank >= ranks)
      return "--fail " + std::to_string(p.rank) + ":" + std::to_string(p.step) + ": the run has ranks 0-" +
             std::to_string(ranks - 1);
    if (o.resume.empty() && p.step > static_cast<std::uint64_t>(o.steps))
      return "--fail " + std::to_string(p.rank) + ":" + std::to_string(p.step) + ": the run trains steps 1-" +
             std::to_string(o.steps);
  }
  return "";
}

// What is wrong with the elastic flags ("" when nothing).
inline std::string elastic_problem(const CLI::App& app, const options& o) {
  if ((o.elastic || given(app, "--rejoin-step") || given(app, "--grow") || given(app, "--snapshot-every")) &&
      o.backend != "threads")
    return "--elastic, --rejoin-step, --grow and --snapshot-every run on --backend threads (under MPI a failed process "
           "ends the job: scripts/elastic_mpirun.py starts it again with one process fewer from the newest checkpoint; "
           "docs/elasticity.md)";
  if (o.elastic && o.save.empty() && o.snapshot_every == 0)
    return "--elastic needs --save DIR or --snapshot-every K: the checkpoints a smaller world goes on from, on disk or "
           "in the ranks' memory (at most K steps are trained again)";
  if (given(app, "--snapshot-every") && !o.elastic) return "--snapshot-every needs --elastic";
  if (o.elastic && o.ranks < 2) return "--elastic needs --ranks 2 or more: a world of one rank has none to spare";
  if (given(app, "--rejoin-step") && !o.elastic) return "--rejoin-step needs --elastic";
  if (given(app, "--grow") && !o.elastic) return "--grow needs --elastic";
  for (std::size_t i = 0; i < o.grow_steps.size(); ++i) {
    const std::uint64_t g = o.grow_steps[i];
    for (std::size_t j = 0; j < i; ++j)
      if (o.grow_steps[j] == g) return "--grow " + std::to_string(g) + " is given twice (one rank joins per --grow)";
    if (given(app, "--rejoin-step") && g == o.rejoin_step)
      return "--grow " + std::to_string(g) + " and --rejoin-step " + std::to_string(g) +
             " at the same step: give them different steps";
    if (o.resume.empty() && g >= static_cast<std::uint64_t>(o.steps))
      return "--grow " + std::to_string(g) + ": the world grows between steps, and the run trains steps 1-" +
             std::to_string(o.steps);
  }
  // Under MPI the world is known once MPI starts: the trainer checks the ranks then (planted_problem).
  if (o.backend == "threads")
    if (std::string p = planted_problem(o, o.ranks); !p.empty()) return p;
  if (o.resume.empty() && o.rejoin_step > static_cast<std::uint64_t>(o.steps))
    return "--rejoin-step " + std::to_string(o.rejoin_step) + ": the run trains steps 1-" + std::to_string(o.steps);
  return "";
}

// --fail without --elastic (threads), or in one process of an MPI job: a monitor for a single launch of
// `ranks` ranks, wired into o; nothing without --fail.
inline void plant_failures(options& o, std::optional<elastic_monitor>& monitor, int ranks) {
  if (o.planted.empty()) return;
  monitor.emplace(o.planted).launch(ranks);
  o.monitor = &*monitor;
}

// The trainers' step loops call these: no-ops unless the run has a monitor (--elastic or --fail).
inline void step_begins(const options& o, int rank, std::uint64_t t) {
  if (o.monitor) o.monitor->step_begins(rank, t);
}
inline void step_done(const options& o, int rank, std::uint64_t steps) {
  if (o.monitor) o.monitor->step_done(rank, steps);
}

// One change of the world's membership.
struct membership_change {
  std::string kind;  // "shrink": a rank failed; "grow": the lost ranks came back; "join": a new rank (--grow)
  int from = 0, to = 0;
  int rank = -1;                  // shrink: the rank that failed, in its launch's numbering
  std::string cause;              // shrink: its error
  std::uint64_t at_step = 0;      // steps done when the world changed
  std::uint64_t resumed_at = 0;   // the step the next launch continued from (its checkpoint's)
  std::uint64_t redone = 0;       // steps trained a second time: at_step - resumed_at
  double recovery_s = -1;         // from the change to the end of the next launch's first step; < 0: none
  std::string source;             // what the next launch continued from: "memory" (a peer snapshot),
                                  // "checkpoint" (--save or --resume), "start" (the initialization)
};

// Runs the launches of an --elastic run: the first at --ranks; after a rank fails, one rank (or group)
// fewer from the newest checkpoint in --save (or from the start, before the first one); at --rejoin-step,
// the lost ranks back from the checkpoint the smaller world saved there; at each --grow step, one rank (or
// group) more, from the checkpoint the world saved there. Each launch is the trainer's own
// (`launch(options)`, which runs the ranks and throws what the first failing rank threw); the
// supervisor only chooses their options and records what changed.
class elastic_supervisor {
 public:
  using clock = std::chrono::steady_clock;

  // `group`: the ranks a failure takes out of the world, a multiple of which the world stays: 1, or a
  // tensor-parallel group's size (train_gpt --tp: a lost rank takes its group's shards of the layers).
  explicit elastic_supervisor(const options& o, int group = 1) : base_(o), group_(group), monitor_(o.planted) {
    if (o.snapshot_every > 0) memory_.emplace(group);  // a lost group's files on the next group's ranks
  }

  elastic_monitor& monitor() { return monitor_; }
  const std::vector<membership_change>& changes() const { return changes_; }
  int launches() const { return launches_; }

  // Runs launches until the steps are done (returns the last launch's summary) or a failure cannot be
  // recovered from (throws it, with the reason in front). `launch(o, s)` runs the ranks of one launch.
  template <class Launch>
  summary run(const Launch& launch) {
    options o = base_;
    o.monitor = &monitor_;
    if (memory_) o.memory = &*memory_;
    std::optional<std::uint64_t> end;  // the step the run ends at: the first launch's start + --steps
    int ranks = base_.ranks;
    int lost = 0, joined = 0;  // groups lost (and not yet back), groups that joined (--grow)
    if (!base_.grow_steps.empty()) {
      // The first launch stops at the first --grow step: where the run starts is needed before it.
      const std::uint64_t start = base_.resume.empty() ? 0 : checkpoint_step(base_.resume);
      end = start + static_cast<std::uint64_t>(base_.steps);
      for (const std::uint64_t g : base_.grow_steps)
        if (g <= start || g >= *end)
          throw zero::error(zero::error_kind::invalid_argument,
                            "--grow " + std::to_string(g) + ": the run trains steps " + std::to_string(start + 1) +
                                "-" + std::to_string(*end) + ", and the world grows between two of them");
      o.steps = static_cast<int>(next_stop(start, lost, *end) - start);
    }
    for (;;) {
      ++launches_;
      monitor_.launch(ranks);
      o.ranks = ranks;
      if (memory_) {
        memory_->launch(ranks);
        // A launch that stops where the world changes leaves a snapshot of its last step for the next.
        memory_->snapshot_at_end = end && launch_start(o) + static_cast<std::uint64_t>(o.steps) < *end;
      }
      if (const std::string p = split_batch(o, o.model.batch, ranks / group_,
                                            std::to_string(ranks / group_) + " data-parallel ranks");
          !p.empty())
        throw zero::error(zero::error_kind::invalid_argument, "--elastic: the run cannot go on at " +
                                                                 std::to_string(ranks) + " ranks: " + p);
      summary s;
      try {
        launch(o, s);
      } catch (...) {
        const auto failed_at = clock::now();
        const std::string why = cannot_shrink(ranks);
        if (!why.empty()) throw zero::error(zero::as_error(std::current_exception()).kind(),
                                            "--elastic: " + why + "; the failure: " +
                                                printable_failure(std::current_exception()));
        if (!end) end = *monitor_.first_step() + static_cast<std::uint64_t>(base_.steps);
        note_resumed();
        membership_change c;
        c.kind = "shrink";
        c.from = ranks;
        c.to = ranks - group_;
        c.rank = monitor_.failed_rank();
        c.cause = printable_failure(std::current_exception());
        c.at_step = *monitor_.steps_done();
        change_started_ = failed_at;
        // The failed rank's tensor-parallel group leaves, and its memory with it.
        if (memory_) memory_->lose(c.rank / group_ * group_, group_);
        ranks -= group_;
        ++lost;
        const std::uint64_t from = go_on_from(o, c);
        changes_.push_back(c);
        o.steps = static_cast<int>(next_stop(from, lost, *end) - from);
        continue;
      }
      if (!end) end = s.first_step + static_cast<std::uint64_t>(base_.steps);
      note_resumed();
      if (s.last_step >= *end) return s;
      // The launch stopped where the world changes and saved that step (--save): the next world
      // continues from it.
      membership_change c;
      c.from = ranks;
      c.at_step = s.last_step;
      if (lost > 0 && base_.rejoin_step == s.last_step) {
        c.kind = "grow";
        lost = 0;
      } else {
        c.kind = "join";
        ++joined;
      }
      ranks = base_.ranks + group_ * (joined - lost);
      c.to = ranks;
      change_started_ = clock::now();
      // The launch saved its last step: in the ranks' memory (--snapshot-every), and in --save when given.
      if (memory_ && memory_->rebuildable() == s.last_step) {
        memory_->resume = true;
        c.source = "memory";
      } else {
        if (memory_) memory_->resume = false;
        o.resume = base_.save;
        c.source = "checkpoint";
      }
      changes_.push_back(c);
      o.steps = static_cast<int>(next_stop(s.last_step, lost, *end) - s.last_step);
    }
  }

  // The run's membership for --json: each change, and the launches it took.
  nlohmann::json json() const {
    nlohmann::json changes = nlohmann::json::array();
    for (const auto& c : changes_) {
      nlohmann::json j = {{"kind", c.kind}, {"from", c.from}, {"to", c.to}, {"at_step", c.at_step},
                          {"resumed_at", c.resumed_at}, {"steps_redone", c.redone}};
      if (c.kind == "shrink") j["rank"] = c.rank, j["cause"] = c.cause;
      j["recovery_s"] = c.recovery_s >= 0 ? nlohmann::json(c.recovery_s) : nlohmann::json(nullptr);
      j["source"] = c.source;
      changes.push_back(std::move(j));
    }
    nlohmann::json out = {{"launches", launches_}, {"changes", std::move(changes)}};
    if (memory_) {
      const auto& last = memory_->last();
      out["peer_snapshots"] = {{"every", base_.snapshot_every},
                               {"distance", memory_->distance()},
                               {"taken", memory_->taken()},
                               {"rank0_file_bytes", last.own_bytes},
                               {"rank0_held_bytes", last.held_bytes},
                               {"copy_s_mean", memory_->mean_copy_seconds()},
                               {"exchange_s_mean", memory_->mean_exchange_seconds()}};
    }
    return out;
  }

  // One line per change, for the human summary.
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& c : changes_) {
      char line[400];
      const char* what = c.source == "memory" ? "peer snapshot in memory" : "checkpoint";
      if (c.kind == "shrink" && c.source == "start")
        std::snprintf(line, sizeof line,
                      "elastic: rank %d failed after step %llu; %d ranks started again (no checkpoint yet: %llu "
                      "step%s redone), %.3f s from the failure to the end of the next step",
                      c.rank, static_cast<unsigned long long>(c.at_step), c.to, static_cast<unsigned long long>(c.redone),
                      c.redone == 1 ? "" : "s", c.recovery_s);
      else if (c.kind == "shrink")
        std::snprintf(line, sizeof line,
                      "elastic: rank %d failed after step %llu; %d ranks went on from the %s of step %llu "
                      "(%llu step%s redone), %.3f s from the failure to the end of the next step",
                      c.rank, static_cast<unsigned long long>(c.at_step), c.to, what,
                      static_cast<unsigned long long>(c.resumed_at), static_cast<unsigned long long>(c.redone),
                      c.redone == 1 ? "" : "s", c.recovery_s);
      else
        std::snprintf(line, sizeof line, "elastic: %s %d ranks at the %s of step %llu, %.3f s to the end of the next step",
                      c.kind == "join" ? "grew to" : "back to", c.to, what, static_cast<unsigned long long>(c.at_step),
                      c.recovery_s);
      out.push_back(line);
    }
    if (memory_ && memory_->taken() > 0) {
      char line[320];
      const auto& last = memory_->last();
      std::snprintf(line, sizeof line,
                    "elastic: %d peer snapshot%s (every %d steps); rank 0 held %.2f MB (its file and its neighbour's), "
                    "copied in %.2f ms and exchanged in %.2f ms on average",
                    memory_->taken(), memory_->taken() == 1 ? "" : "s", base_.snapshot_every,
                    static_cast<double>(last.held_bytes) / 1e6, 1e3 * memory_->mean_copy_seconds(),
                    1e3 * memory_->mean_exchange_seconds());
      out.push_back(line);
    }
    return out;
  }

 private:
  // Where a launch from step `from` stops: the end, or before it the step where the lost ranks rejoin
  // (if any are lost) or the next --grow step.
  std::uint64_t next_stop(std::uint64_t from, int lost, std::uint64_t end) const {
    std::uint64_t stop = end;
    if (lost > 0 && base_.rejoin_step > from && base_.rejoin_step < stop) stop = base_.rejoin_step;
    for (const std::uint64_t g : base_.grow_steps)
      if (g > from && g < stop) stop = g;
    return stop;
  }
  // Why a failed launch cannot go on at one rank fewer ("" when it can).
  std::string cannot_shrink(int ranks) const {
    if (monitor_.failed_rank() < 0) return "no rank is known to have failed";
    if (!monitor_.steps_done()) {
      if (changes_.empty()) return "the run failed before its first step (a failure of the set-up, not of a rank)";
      const std::string kept = base_.save.empty()
                                   ? "nothing was saved to disk: with --save DIR the checkpoints outlive the run"
                                   : "the checkpoints in --save are kept: --resume continues from them";
      if (changes_.back().kind == "shrink")
        return "a second failure came during the recovery, before the smaller world's first step (" + kept + ")";
      return "a failure came before the first step of the world of " + std::to_string(changes_.back().to) + " ranks (" +
             kept + ")";
    }
    if (ranks <= group_) return group_ == 1 ? "no rank is left" : "no tensor-parallel group is left";
    return "";
  }
  // Where the next launch after a failure goes on from (into o and c; returns its step): the newer of
  // the peer snapshot the survivors' memory can rebuild and the newest checkpoint in --save (or where the
  // run started: --resume, or the initialization). A snapshot that was taken but cannot be rebuilt (a
  // rank and the one holding its copy both lost) with no checkpoint on disk ends the run.
  std::uint64_t go_on_from(options& o, membership_change& c) {
    std::string why;
    bool rebuildable = false;
    std::uint64_t in_memory = 0;
    if (memory_)
      if (const auto step = memory_->rebuildable(&why)) rebuildable = true, in_memory = *step;
    const std::string disk = newest_checkpoint(o);
    const std::uint64_t on_disk = disk.empty() ? 0 : checkpoint_step(disk);
    if (rebuildable && (disk.empty() || in_memory >= on_disk)) {
      memory_->resume = true;
      c.source = "memory";
      return in_memory;
    }
    if (memory_) {
      memory_->resume = false;
      if (memory_->any() && disk.empty())
        throw zero::error(zero::error_kind::invalid_argument,
                          "--elastic: the ranks' memory cannot rebuild its peer snapshot and there is no checkpoint "
                          "on disk to go on from (" + why + ")");
    }
    o.resume = disk;
    c.source = disk.empty() ? "start" : "checkpoint";
    return on_disk;
  }
  // The step a launch with options o starts at (its resume point): known to the supervisor.
  std::uint64_t launch_start(const options& o) const {
    if (memory_ && memory_->resume) return *memory_->rebuildable();
    return o.resume.empty() ? 0 : checkpoint_step(o.resume);
  }
  // --save when it holds a committed checkpoint, else where the run started (--resume, or nothing).
  std::string newest_checkpoint(const options& o) const {
    std::error_code ec;
    if (std::filesystem::is_directory(base_.save, ec))
      for (const auto& v : zero::checkpoint::list_versions(base_.save))
        if (v.committed) return base_.save;
    return base_.resume.empty() ? o.resume : base_.resume;
  }
  // The step a launch from `dir` starts at: its newest committed version's data position (steps,
  // skipped ones included), as the launch's resume_or_initialize reads it.
  static std::uint64_t checkpoint_step(const std::string& dir) {
    const zero::checkpoint::manifest m = zero::checkpoint::read_manifest(dir);
    return m.state.step + m.state.skipped_steps;
  }
  // The launch after the last change has trained a step (whether it then ended or failed): where it
  // continued from, and how long the change took until then.
  void note_resumed() {
    if (changes_.empty() || changes_.back().recovery_s >= 0 || !monitor_.first_step_end()) return;
    auto& c = changes_.back();
    c.resumed_at = *monitor_.first_step();
    c.redone = c.at_step - c.resumed_at;
    c.recovery_s = std::chrono::duration<double>(*monitor_.first_step_end() - change_started_).count();
  }

  options base_;
  int group_ = 1;
  elastic_monitor monitor_;
  std::vector<membership_change> changes_;
  std::optional<peer_memory> memory_;  // --snapshot-every: the ranks' holders, across launches
  clock::time_point change_started_{};
  int launches_ = 0;
};

}  // namespace trainer
