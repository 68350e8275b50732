// The command line, policy dispatch and final report shared by the example trainers (train_mlp, train_mlp_cuda).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <type_traits>

#include "mlp.hpp"
#include "zero/zero.hpp"

namespace trainer {

struct options {
  int stage = 3, ranks = 4, steps = 200;
  mlp::config model;
  std::string optimizer = "adamw";
  float lr = 0.0f;  // 0: the optimizer's default (1e-3 for adamw, 0.05 for sgd)
  bool json = false;
  std::string backend;
  std::string precision = "fp32";
  float clip = 0.0f;  // 0: no clipping
  int accum = 1;      // micro-batches per step, each reduced on its own
  std::string save, resume, export_file;
  int save_every = 0;  // 0: save only at the end
  std::uint64_t memory_limit = 0;  // engine_options::memory_limit_bytes: bytes per rank, 0: no budget
};

// Everything a run reports, reduced over ranks where ranks differ (max for bytes).
struct summary {
  double loss_first = 0, loss_last = 0, accuracy_last = 0, seconds = 0;
  double setup_seconds = 0;  // engine construction and initialization (or resume), max over ranks
  double setup_cpu_seconds = 0;  // the same in CPU time of the rank's thread: the work, whatever else runs
  std::uint64_t param_hash = 0, padded = 0, numel = 0;
  double model_state_bytes = 0, model_state_formula = 0, comm_bytes = 0, comm_formula = 0;
  double by_category[zero::mem_category_count] = {}, transient_peak = 0;
  double grad_norm = 0, loss_scale = 1;
  std::uint64_t overflow_steps = 0, first_step = 0, last_step = 0;
  std::string device;  // empty on the host
};

// The flags every trainer takes (--ranks and --backend are the trainer's own: their meaning depends
// on the backends it offers).
inline void add_common_flags(CLI::App& app, options& o) {
  app.add_option("--stage", o.stage, "ZeRO stage")->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--steps", o.steps, "training steps")->check(CLI::Range(1, 100000000))->capture_default_str();
  app.add_option("--layers", o.model.layers, "linear layers")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--hidden", o.model.hidden, "hidden width")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--in", o.model.in, "input features")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--classes", o.model.classes, "classes")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  app.add_option("--batch", o.model.batch, "global batch, a multiple of the ranks times --accum")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "optimizer")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate (default: 1e-3 for adamw, 0.05 for sgd)")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.model.seed, "seed of the data and the initial weights")->capture_default_str();
  app.add_option("--precision", o.precision, "parameter and gradient precision (bf16/fp16 keep fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--clip", o.clip, "clip the global gradient norm to this value (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--accum", o.accum, "micro-batches per step, each reduced on its own")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  auto* save_flag = app.add_option("--save", o.save, "save a checkpoint into this directory at the end");
  app.add_option("--save-every", o.save_every, "also save every K steps (needs --save)")
      ->check(CLI::Range(1, 1 << 30))
      ->needs(save_flag);
  app.add_option("--resume", o.resume, "continue from the checkpoint in this directory (any world size or stage)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--export", o.export_file, "write the final fp32 weights as a .safetensors file");
  app.add_option("--memory-limit", o.memory_limit,
                 "bytes each rank's engine may hold (model states are checked before allocation; 0: no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON object as the last line of stdout");
}

// Exit code of a usage error: the message, a blank line, the usage.
inline int usage_error(const CLI::App& app, const std::string& message) {
  std::cerr << "error: " << message << "\n\n" << app.help();
  return 2;
}

// Parses the command line; returns the exit code when the program should stop here (0 after
// --help, 2 after a bad flag), nothing when it should go on.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e.what());
  }
  return std::nullopt;
}

// Calls train.template operator()<Stage, Optimizer, Precision>(optimizer) for the policies the
// options name: the one place where run-time flags become template arguments.
template <class Train>
void dispatch(const options& o, Train&& train) {
  auto with_precision = [&]<class S, class O>(const O& opt) {
    if (o.precision == "bf16") train.template operator()<S, O, zero::precision::bf16>(opt);
    else if (o.precision == "fp16") train.template operator()<S, O, zero::precision::fp16>(opt);
    else train.template operator()<S, O, zero::precision::fp32>(opt);
  };
  auto with_optimizer = [&]<class S>() {
    if (o.optimizer == "adamw") {
      zero::optim::adamw a;
      a.lr = o.lr > 0 ? o.lr : 1e-3f;
      with_precision.template operator()<S>(a);
    } else {
      zero::optim::sgd s;
      s.lr = o.lr > 0 ? o.lr : 0.05f;
      with_precision.template operator()<S>(s);
    }
  };
  switch (o.stage) {
    case 0: return with_optimizer.template operator()<zero::stage0>();
    case 1: return with_optimizer.template operator()<zero::stage1>();
    case 2: return with_optimizer.template operator()<zero::stage2>();
    default: return with_optimizer.template operator()<zero::stage3>();
  }
}

// CPU time of the calling thread (a rank's thread): what set-up costs a rank, whatever else shares the cores.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

inline void print_summary(const options& o, const summary& s) {
  std::printf("\nZeRO stage %d, %d ranks (%s%s%s), %s, %s, steps %llu-%llu in %.2f s\n", o.stage, o.ranks,
              o.backend.c_str(), s.device.empty() ? "" : " on ", s.device.c_str(), o.precision.c_str(),
              o.optimizer.c_str(), static_cast<unsigned long long>(s.first_step + 1),
              static_cast<unsigned long long>(s.last_step), s.seconds);
  std::printf("  loss %.4f -> %.4f, accuracy %.1f%% on the last batch\n", s.loss_first, s.loss_last,
              100.0 * s.accuracy_last);
  std::printf("  parameters %" PRIu64 " (padded Psi = %" PRIu64 "), param_hash %s\n", s.numel, s.padded,
              hex(s.param_hash).c_str());
  std::printf("  %smemory per rank (bytes, max over ranks):\n", s.device.empty() ? "" : "device ");
  for (int c = 0; c < zero::mem_category_count; ++c)
    std::printf("    %-17s %14.0f\n", zero::to_string(static_cast<zero::mem_category>(c)), s.by_category[c]);
  std::printf("    %-17s %14.0f   formula %.0f (%s)\n", "model states", s.model_state_bytes, s.model_state_formula,
              s.model_state_bytes == s.model_state_formula ? "equal" : "DIFFERS");
  std::printf("    %-17s %14.0f\n", "transient peak", s.transient_peak);
  const double elem = o.precision == "fp32" ? 4.0 : 2.0;
  std::printf("  communicated per rank per step: %.0f bytes, formula %.0f (%s); %.3f x Psi elements\n", s.comm_bytes,
              s.comm_formula, s.comm_bytes == s.comm_formula ? "equal" : "DIFFERS",
              o.ranks > 1 ? s.comm_bytes / (elem * static_cast<double>(s.padded)) : 0.0);
  if (std::isnan(s.grad_norm))
    std::printf("  gradient norm not computed (fp32 without --clip)");
  else
    std::printf("  gradient norm %.4g (last step)", s.grad_norm);
  std::printf(", loss scale %g, %llu overflow step(s) skipped\n", s.loss_scale,
              static_cast<unsigned long long>(s.overflow_steps));
}

inline nlohmann::json summary_json(const options& o, const summary& s) {
  nlohmann::json j = {
      {"backend", o.backend},
      {"stage", o.stage},
      {"ranks", o.ranks},
      {"steps", o.steps},
      {"optimizer", o.optimizer},
      {"precision", o.precision},
      {"clip", o.clip},
      {"accum", o.accum},
      {"first_step", s.first_step},
      {"last_step", s.last_step},
      {"overflow_steps", s.overflow_steps},
      {"loss_scale", s.loss_scale},
      {"grad_norm", s.grad_norm},
      {"params", s.numel},
      {"padded_params", s.padded},
      {"loss_first", s.loss_first},
      {"loss_last", s.loss_last},
      {"accuracy_last", s.accuracy_last},
      {"seconds", s.seconds},
      {"setup_seconds", s.setup_seconds},
      {"setup_cpu_seconds", s.setup_cpu_seconds},
      {"param_hash", hex(s.param_hash)},
      {"model_state_bytes_per_rank", static_cast<std::uint64_t>(s.model_state_bytes)},
      {"model_state_formula_bytes", static_cast<std::uint64_t>(s.model_state_formula)},
      {"transient_peak_bytes_per_rank", static_cast<std::uint64_t>(s.transient_peak)},
      {"comm_bytes_per_rank_per_step", static_cast<std::uint64_t>(s.comm_bytes)},
      {"comm_formula_bytes", static_cast<std::uint64_t>(s.comm_formula)},
  };
  if (!s.device.empty()) j["device"] = s.device;
  return j;
}

}  // namespace trainer
