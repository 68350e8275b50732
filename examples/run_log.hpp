// The trainers' --log file: JSON lines, the run's settings first (and any resume point), then one line per step and per
// checkpoint save.
#pragma once

#include <stdio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "tool_cli.hpp"
#include "trainer_checkpoint.hpp"
#include "trainer_cli.hpp"
#include "zero/zero.hpp"

namespace trainer {

// What one step did, as rank 0 saw it: under the even split every rank holds the same bytes per
// category and sends the same bytes, so rank 0's are every rank's.
struct step_record {
  std::uint64_t step = 0;           // 1-based, counted from the start of training (a resumed run goes on)
  double loss = 0, accuracy = 0;    // mean loss and accuracy over the step's global batch
  double items_per_s = 0;           // samples (or tokens) of the step over its time
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // global norm, when the engine computed it
  float loss_scale = 1.0f;          // the scale this step's gradients carried
  bool skipped = false;             // non-finite gradients: the update was skipped on every rank
  std::array<std::uint64_t, zero::mem_category_count> bytes{};  // held after the step, per category
  std::uint64_t transient_peak = 0;  // the most transient bytes held at once, since the engine was built
  std::uint64_t bytes_sent = 0;      // protocol bytes this rank sent in the step (e.comm().last_step)
  double step_ms = 0, elapsed_s = 0;  // the step's wall time; time since training started
  // The step's time split (ms): the engine's gather/release, reduce and step() calls, their
  // collectives included, and the trainer's kernels; negative: not measured by this trainer.
  double gather_ms = -1, reduce_ms = -1, update_ms = -1, compute_ms = -1;
  // The step's time split (seconds; docs/performance.md defines each part): compute + comm_exposed +
  // optimizer + other = step; negative: not measured by this trainer.
  double time_step_s = -1, time_compute_s = -1, time_comm_exposed_s = -1, time_optimizer_s = -1, time_other_s = -1;
};

// The engine's side of a record: its step report, memory and traffic.
template <class Engine>
step_record engine_record(const Engine& e, const zero::step_report& r) {
  step_record s;
  s.grad_norm = r.grad_norm;
  s.loss_scale = r.loss_scale;
  s.skipped = r.skipped;
  const zero::memory_report& m = e.memory();
  for (int c = 0; c < zero::mem_category_count; ++c) s.bytes[static_cast<std::size_t>(c)] = m.current[c];
  s.transient_peak = m.peak_bytes(zero::mem_category::transient);
  s.bytes_sent = r.comm.total_bytes();
  return s;
}

class run_log {
 public:
  run_log() = default;
  // Opens the file through the tools' hardened open (toolcli::open_log: never through a symbolic
  // link, only a regular file): a resumed run appends to what is there, a new one needs it new or
  // empty unless `mode` is overwrite. A failure is a zero::error (io) naming the path and the cause.
  run_log(const std::string& path, toolcli::log_mode mode, std::string items_name = "samples")
      : items_name_(std::move(items_name)) {
    const int fd = toolcli::open_log("--log", path, mode);
    f_ = ::fdopen(fd, "a");
    if (!f_) {
      const int e = errno;
      ::close(fd);
      zero::fail(zero::error_kind::io, "--log: cannot open ", toolcli::quote(path), ": ", std::strerror(e));
    }
  }
  run_log(const run_log&) = delete;
  run_log& operator=(const run_log&) = delete;
  ~run_log() {
    if (f_) std::fclose(f_);
  }
  bool enabled() const { return f_ != nullptr; }

  // The first line: what was run. `extra` adds the trainer's own fields.
  template <class Engine>
  void run(const char* trainer, const options& o, const Engine& e, std::uint64_t first_step,
           const nlohmann::json& extra = nlohmann::json::object()) {
    if (!f_) return;
    nlohmann::json j = {
        {"kind", "run"},
        {"trainer", trainer},
        {"backend", o.backend},
        {"stage", o.stage},
        {"ranks", e.world_size()},
        {"precision", o.precision},
        {"optimizer", o.optimizer},
        {"accum", o.accum},
        {"reproducible", o.reproducible},
        {"clip", o.clip},
        {"first_step", first_step},
        {"steps", o.steps},
        {"params", e.layout().numel()},
        {"padded_params", e.layout().padded()},
        {"model_state_formula_bytes", e.model_state_formula_bytes()},
        {"comm_formula_bytes", e.comm_formula_bytes()},
    };
    j.update(extra);
    line(j);
    // A resumed run says where it took up: the checkpoint it loaded and the step it continues from,
    // so a log appended to across interruptions reads as one run.
    if (!o.resume.empty()) line({{"kind", "resume"}, {"checkpoint", o.resume}, {"step", first_step}});
  }

  void step(const step_record& s) {
    if (!f_) return;
    auto cat = [&](zero::mem_category c) { return s.bytes[static_cast<std::size_t>(c)]; };
    using zero::mem_category;
    nlohmann::json j = {
        {"kind", "step"},
        {"step", s.step},
        {"loss", s.loss},
        {"accuracy", s.accuracy},
        {items_name_ + "_per_s", s.items_per_s},
        {"grad_norm", std::isfinite(s.grad_norm) ? nlohmann::json(s.grad_norm) : nlohmann::json(nullptr)},
        {"loss_scale", s.loss_scale},
        {"skipped", s.skipped},
        {"params_bytes", cat(mem_category::params)},
        {"grads_bytes", cat(mem_category::grads)},
        {"master_bytes", cat(mem_category::master)},
        {"optimizer_states_bytes", cat(mem_category::optimizer_states)},
        {"model_state_bytes", cat(mem_category::params) + cat(mem_category::grads) + cat(mem_category::master) +
                                  cat(mem_category::optimizer_states)},
        {"transient_bytes", cat(mem_category::transient)},
        {"offload_bytes", cat(mem_category::offload)},  // the offload tier's host memory (CPU systems)
        {"transient_peak_bytes", s.transient_peak},
        {"bytes_sent", s.bytes_sent},
        {"step_ms", s.step_ms},
        {"elapsed_s", s.elapsed_s},
    };
    const std::pair<const char*, double> split[] = {
        {"gather_ms", s.gather_ms}, {"reduce_ms", s.reduce_ms}, {"update_ms", s.update_ms}, {"compute_ms", s.compute_ms}};
    for (const auto& [name, ms] : split)
      if (ms >= 0) j[name] = ms;
    const std::pair<const char*, double> parts[] = {
        {"time_step_s", s.time_step_s},
        {"time_compute_s", s.time_compute_s},
        {"time_comm_exposed_s", s.time_comm_exposed_s},
        {"time_optimizer_s", s.time_optimizer_s},
        {"time_other_s", s.time_other_s}};
    for (const auto& [name, v] : parts)
      if (v >= 0) j[name] = v;
    line(j);
  }

  // A checkpoint save, once complete (an asynchronous one when the next save or the end completed it).
  void save(const save_record& r) {
    if (!f_) return;
    line({{"kind", "save"},
          {"step", r.step},
          {"version", r.version},
          {"async", r.async},
          {"stall_s", r.stall_s},
          {"waited_s", r.waited_s},
          {"write_s", r.write_s},
          {"bytes", r.bytes},
          {"write_bytes_per_s", r.write_bytes_per_s()}});
  }

 private:
  // One line, flushed: a run that dies leaves every step it finished in the file.
  void line(const nlohmann::json& j) {
    // A path of invalid UTF-8 is replaced, not thrown on: the line is written either way.
    const std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (std::fwrite(text.data(), 1, text.size(), f_) != text.size() || std::fflush(f_) != 0)
      zero::fail(zero::error_kind::io, "--log: write failed: ", std::strerror(errno));
  }

  std::FILE* f_ = nullptr;
  std::string items_name_ = "samples";
};

}  // namespace trainer
