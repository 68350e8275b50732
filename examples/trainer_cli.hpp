// The command line, policy dispatch and final report shared by the trainers (train_mlp, train_gpt, train_mlp_cuda).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "mlp.hpp"
#include "tool_cli.hpp"
#include "zero/zero.hpp"

namespace trainer {

// A trainer compiled for one stage, optimizer or precision (ZERO_TRAINER_STAGE, ZERO_TRAINER_OPTIMIZER,
// ZERO_TRAINER_PRECISION, each optional; the Meson options trainer_stage, trainer_optimizer and
// trainer_precision, which scripts/demo.sh sets from its flags) instantiates the engine for those
// alone: one engine instead of 36, a compile of seconds instead of minutes. The flags then
// default to what was compiled and refuse the rest (dispatch below, compiled_only).
#ifdef ZERO_TRAINER_STAGE
inline constexpr int built_stage = ZERO_TRAINER_STAGE;
#else
inline constexpr int built_stage = -1;  // every stage
#endif
#ifdef ZERO_TRAINER_OPTIMIZER
inline constexpr std::string_view built_optimizer = ZERO_TRAINER_OPTIMIZER;
#else
inline constexpr std::string_view built_optimizer = "";  // every optimizer
#endif
#ifdef ZERO_TRAINER_PRECISION
inline constexpr std::string_view built_precision = ZERO_TRAINER_PRECISION;
#else
inline constexpr std::string_view built_precision = "";  // every precision
#endif

// Whether this build instantiates the engine for stage S, optimizer O and precision P.
template <class S, class O, class P>
constexpr bool compiled() {
  return (built_stage < 0 || S::stage == built_stage) && (built_optimizer.empty() || O::name == built_optimizer) &&
         (built_precision.empty() || P::name == built_precision);
}

// --fail RANK:STEP (trainer_elastic.hpp): rank `rank` of the launch that reaches global step `step`
// (1-based) throws as it begins it, once.
struct planted_failure {
  int rank = -1;
  std::uint64_t step = 0;
  bool fired = false;
};
class elastic_monitor;  // trainer_elastic.hpp
class peer_memory;      // trainer_checkpoint.hpp

struct options {
  int stage = built_stage >= 0 ? built_stage : 3, ranks = 4, steps = 200;
  mlp::config model;
  std::string optimizer = built_optimizer.empty() ? "adamw" : std::string(built_optimizer);
  float lr = 0.0f;  // 0: the trainer's default for the optimizer (trainer_optimizer)
  bool json = false;
  std::string backend;
  std::string precision = built_precision.empty() ? "fp32" : std::string(built_precision);
  float clip = 0.0f;  // 0: no clipping
  int accum = 1;      // micro-batches per step, each reduced on its own
  int micro_batch = 0;  // --micro-batch: rows per micro-batch (then accum = batch / (ranks x micro_batch)); 0: --accum
  bool reproducible = false;  // engine_options::reproducible (needs --micro-batch)
  std::string save, resume, export_file;
  int save_every = 0;  // 0: save only at the end
  bool save_async = false;    // --save-async: the saves' writing runs in the background
  double comm_timeout = 300;  // seconds a rank waits in a collective before the run fails
  std::uint64_t memory_limit = 0;  // engine_options::memory_limit_bytes: bytes per rank, 0: no budget
  std::string log;  // --log FILE: JSON lines, one per step (run_log.hpp)
  bool log_overwrite = false;  // --log-overwrite: discard what an existing --log file holds
  // train_mlp's own: the GEMM kernels ("loops" or "blas"; empty: the trainer's only kind), and a
  // modeled link (comm::modeled) when link_gbps > 0 or link_latency_us > 0 (0 GB/s: no bandwidth term).
  std::string gemm;
  double link_gbps = 0, link_latency_us = 0;
  std::string overlap = "on";  // engine_options::overlap: on|off
  // engine_options::offload: where master weights and optimizer slots live (none|host|disk), the
  // disk tier's directory, and the elements streamed per slice.
  std::string offload = "none";
  std::string offload_dir;
  std::uint64_t offload_slice = std::uint64_t{1} << 20;
  bool offload_slice_given = false;  // --offload-slice given; otherwise chosen to fit --memory-limit (offload_slice_of)
  bool link() const { return link_gbps > 0 || link_latency_us > 0; }
  // ZeRO++ (engine_options::zeropp): --qwz, --qgz, --hpz NODE_SIZE, --node-size, the formats.
  bool qwz = false, qgz = false, qgz_error_feedback = false;
  int hpz = 0;        // the node size of hpZ's secondary partition; 0: hpZ off
  int node_size = 0;  // ranks per node (what counts as inter-node; qgZ's hops); 0: one node, or --hpz's
  int quant_block = 256, qwz_bits = 8, qgz_bits = 8;
  bool zeropp() const { return qwz || qgz || hpz > 0; }
  // engine_options::shard_group_size (HSDP): ZeRO within groups of this many ranks, the groups
  // replicas; 0: plain ZeRO over every rank.
  int shard_group = 0;
  int host_threads = 1;  // engine_options::host_threads: threads of each rank's host update
  std::string host_isa;  // --host-isa: the host loops' level capped (sys::host_loop::set_cap); empty: none
  int nodes_of() const { return hpz > 0 ? hpz : node_size; }
  // --elastic, --fail, --rejoin-step, --grow (trainer_elastic.hpp); `monitor`: what a launch's ranks
  // report to its supervisor (set by it, null otherwise).
  bool elastic = false;
  std::vector<planted_failure> planted;
  std::uint64_t rejoin_step = 0;         // 0: a lost rank does not come back
  std::vector<std::uint64_t> grow_steps;  // where a rank that was never in the run joins
  elastic_monitor* monitor = nullptr;
  // --snapshot-every K (with --elastic): a peer snapshot in host memory every K steps; `memory`: the
  // ranks' holders, kept by the supervisor across launches (null otherwise).
  int snapshot_every = 0;
  peer_memory* memory = nullptr;
};

// Everything a run reports, reduced over ranks where ranks differ (max for bytes).
struct summary {
  double loss_first = 0, loss_last = 0, accuracy_last = 0, seconds = 0;
  double setup_seconds = 0;  // engine construction and initialization (or resume), max over ranks
  double setup_cpu_seconds = 0;  // the same in CPU time of the rank's thread: the work, whatever else runs
  std::uint64_t param_hash = 0, padded = 0, numel = 0;
  double model_state_bytes = 0, model_state_formula = 0, comm_bytes = 0, comm_formula = 0;
  std::string checkpoints;  // the checkpoints' summary line (trainer::checkpoints::summary), when any were saved
  double by_category[zero::mem_category_count] = {}, transient_peak = 0;
  double grad_norm = 0, loss_scale = 1;
  std::uint64_t overflow_steps = 0, first_step = 0, last_step = 0;
  std::string device;  // empty on the host
  // The mean step's time split, seconds (mean over ranks and steps; negative: not measured; the
  // definitions are in docs/performance.md): compute + comm_exposed + optimizer + other = step.
  double time_step_s = -1, time_compute_s = -1, time_comm_exposed_s = -1, time_optimizer_s = -1, time_other_s = -1;
  double link_modeled_s = -1, link_waited_s = -1;  // per step, with a modeled link: its cost, and the time held
  // With --offload host|disk (max over ranks): the tier's bytes, their formula, the host memory of the
  // slices in flight, and what the last updating step moved (disk reads + writes, host <-> device).
  double offload_bytes = 0, offload_formula = 0, offload_staging = 0, offload_moved = 0, offload_moved_formula = 0;
  std::string offload_file;  // rank 0's, disk tier
  bool offload_direct = false;
  double control_bytes = 0;  // the step's control collectives (the norm, the settings fingerprint), per step
  // A matrix optimizer's exchange of the last updating step (optim::muon) and its formula; 0: none.
  double exchange_bytes = 0, exchange_formula = 0;
  double comm_inter_bytes = 0, comm_inter_formula = 0;  // the part of comm_bytes sent between nodes, and its formula
  // engine_options::param_groups and what the model puts in each (describe_param_groups); empty: none.
  std::string param_groups;
};

// "'no_decay' (lr x 1, weight_decay 0): 50 tensors, 9600 elements": each parameter group, its
// overrides and the tensors (and elements) the model spec puts in it; groups separated by "; ".
inline std::string describe_param_groups(const zero::model_spec& spec, const std::vector<zero::param_group>& groups) {
  std::string out;
  for (const zero::param_group& g : groups) {
    std::size_t tensors = 0, elements = 0;
    for (const auto& u : spec.units())
      for (const auto& t : u.tensors)
        if (t.group == g.name) ++tensors, elements += t.numel;
    char values[96];
    if (g.weight_decay)
      std::snprintf(values, sizeof values, "lr x %g, weight_decay %g", static_cast<double>(g.lr_scale),
                    static_cast<double>(*g.weight_decay));
    else
      std::snprintf(values, sizeof values, "lr x %g, the optimizer's weight_decay", static_cast<double>(g.lr_scale));
    out += (out.empty() ? "" : "; ") + ("'" + g.name + "' (") + values + (g.element_wise ? ", element-wise rule" : "") +
           "): " + std::to_string(tensors) + " tensors, " + std::to_string(elements) + " elements";
  }
  return out;
}

// ---- flag values and output targets --------------------------------------------------------
// Every number is converted by tool_cli.hpp (exactly, then range-checked as used: CLI11 2.1 turned
// -1 into 2^64 - 1 and let nan through its ranges); every output place is proved before training
// by creating something there. A refusal is a CLI::ValidationError: exit status 2 and the usage.
using toolcli::float_flag;

// The bounds of --lr and --clip: far above any rate or norm that trains, far below what overflows.
inline constexpr float max_lr = 1000.0f, max_clip = 1e9f;
using toolcli::uint64_flag;

using toolcli::checkpoint_manifest;

// --save DIR: a directory of checkpoint versions, created (with its parents) here, before training.
inline std::string save_target_problem(const std::string& text) { return toolcli::save_directory_problem(text); }

// --export FILE: a file written into an existing directory (beside it, a temporary checkpoint).
inline std::string export_target_problem(const std::string& text) {
  return toolcli::output_file_problem(text, "an empty path; give the .safetensors file to write");
}

// --log FILE: the JSON-lines log, in an existing directory, never through a symbolic link.
inline std::string log_target_problem(const std::string& text) {
  return toolcli::output_file_problem(text, "an empty path; give the file to write the log into", false);
}

inline CLI::Validator checked_target(std::string (*problem)(const std::string&), const char* name) {
  return toolcli::checked(problem, name);
}

// The optimizer the trainer runs: the library's defaults, with --lr or the trainer's default rate.
// SGD's is the trainer's own (0.05, larger than the library's 0.01: the MLP learns faster with it).
template <class O>
O trainer_optimizer(const options& o) {
  O opt{};
  if constexpr (std::is_same_v<O, zero::optim::sgd>) opt.lr = 0.05f;
  if (o.lr > 0) opt.lr = o.lr;
  return opt;
}

// The traffic the summary reports per step, compared with the engine's formula: that of the last step
// that applied an update, or of the last step when none did. A step skipped for non-finite gradients
// sends less than the formula (no post-update all-gather in stages 1-2), so a run whose last step
// overflowed would otherwise report a mismatch that is not one.
struct step_traffic {
  std::uint64_t bytes = 0, inter = 0;
  std::uint64_t exchange = 0;  // the optimizer's exchange on the control link (step_report::optimizer_exchange)
  bool applied = false;
  void add(const zero::step_report& r) {
    if (r.skipped && applied) return;
    bytes = r.comm.total_bytes();
    inter = r.comm.inter_node_bytes();
    exchange = r.optimizer_exchange.total_bytes();
    applied = !r.skipped;
  }
};

// "1e-3 for adamw, 0.05 for sgd, ...": the default rates, for --lr's help. `tune(opt)` applies a
// trainer's own changes to trainer_optimizer's defaults.
inline std::string default_rates(const auto& tune) {
  std::string t;
  zero::optimizers::for_each([&]<class O>() {
    O opt = trainer_optimizer<O>({});
    tune(opt);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%g for %s", t.empty() ? "" : ", ", static_cast<double>(opt.lr),
                  std::string(O::name).c_str());
    t += buf;
  });
  return t;
}

// ZeRO++'s flags (docs/zeropp.md): each technique on its own, and the formats.
inline void add_zeropp_flags(CLI::App& app, options& o) {
  app.add_flag("--qwz", o.qwz, "ZeRO++ qwZ: stage 3 gathers parameters as blockwise int8 (or --qwz-bits 4) codes");
  app.add_flag("--qgz", o.qgz,
               "ZeRO++ qgZ: stages 1-3 reduce gradients as blockwise int8 (or --qgz-bits 4) codes through an "
               "all-to-all, summed in fp32 in rank order (two hops with --node-size or --hpz)");
  app.add_flag("--qgz-error-feedback", o.qgz_error_feedback,
               "qgZ with error feedback: each rank keeps the error its quantized gradients left (4 bytes per "
               "parameter) and adds it to its next contribution before quantizing (needs --qgz)");
  toolcli::add_integer(app, "--hpz", o.hpz, 1, 1 << 20,
                       "ZeRO++ hpZ: stage 3 keeps a secondary partition within nodes of this many consecutive ranks; "
                       "the backward pass gathers inside the node")
      ->type_name("NODE_SIZE")
      ->default_str("");
  toolcli::add_integer(app, "--node-size", o.node_size, 1, 1 << 20,
                       "ranks per node (consecutive): what the summary counts as inter-node traffic, and qgZ's hops "
                       "(default: one node, or --hpz's)")
      ->default_str("");
  toolcli::add_integer(app, "--shard-group", o.shard_group, 1, 1 << 20,
                       "HSDP: ZeRO within groups of this many consecutive ranks (a node's), the groups replicas of "
                       "each other; the reduced gradients are all-reduced across the groups (default: one group)")
      ->type_name("RANKS")
      ->default_str("");
  toolcli::add_integer(app, "--quant-block", o.quant_block, 1, 1 << 24,
                       "values per fp32 scale in qwZ's and qgZ's blocks (needs --qwz or --qgz)");
  const auto bits = [](int& target, const std::string& flag) {
    return [&target, flag](const std::string& v) {
      target = toolcli::integer_value(flag, v, 4, 8);
      if (target != 4 && target != 8) throw CLI::ValidationError(flag, toolcli::quote(v) + " is not 8 or 4");
    };
  };
  app.add_option_function<std::string>("--qwz-bits", bits(o.qwz_bits, "--qwz-bits"),
                                       "qwZ's code width, 8 or 4 (needs --qwz)")
      ->type_name("BITS")
      ->default_str("8");
  app.add_option_function<std::string>("--qgz-bits", bits(o.qgz_bits, "--qgz-bits"),
                                       "qgZ's code width, 8 or 4 (needs --qgz)")
      ->type_name("BITS")
      ->default_str("8");
}

// Why the ZeRO++ flags make no sense for this stage and world size, or "" (the engine refuses the
// same with a rank-prefixed error; a trainer says it first, as a usage error).
inline std::string zeropp_problem(const options& o, int ranks) {
  if (o.qwz && o.stage != 3) return "--qwz quantizes stage 3's parameter gathers; --stage " + std::to_string(o.stage) +
                                    " gathers no parameters";
  if (o.hpz > 0 && o.stage != 3)
    return "--hpz keeps a secondary partition of stage 3's parameters; --stage " + std::to_string(o.stage) +
           " does not shard them";
  if (o.qgz && o.stage == 0) return "--qgz replaces the reduce-scatter of stages 1-3; --stage 0 all-reduces";
  if (o.reproducible && (o.qwz || o.qgz || o.hpz > 0))
    return "--reproducible keeps the bits at any world size; --qwz and --qgz quantize per rank's shard and --hpz is "
           "not carried through its exact reduction yet: drop one of them";
  if (o.hpz > 0 && o.node_size > 0 && o.hpz != o.node_size)
    return "--hpz " + std::to_string(o.hpz) + " and --node-size " + std::to_string(o.node_size) +
           " disagree on the node size";
  if (o.shard_group > 0 && ranks % o.shard_group != 0)
    return "--shard-group " + std::to_string(o.shard_group) + " does not divide the " + std::to_string(ranks) +
           " data-parallel ranks";
  // ZeRO++'s nodes are nodes of the ranks ZeRO partitions over: the shard group's, where there is one.
  const int group = o.shard_group > 0 ? o.shard_group : ranks;
  const std::string of_group = o.shard_group > 0 && o.shard_group < ranks ? " ranks of a --shard-group" : " ranks";
  const int g = o.nodes_of();
  if (g > 0 && group % g != 0)
    return std::string(o.hpz > 0 ? "--hpz " : "--node-size ") + std::to_string(g) + " does not divide the " +
           std::to_string(group) + of_group;
  if (o.hpz > 0 && o.hpz >= group)
    return "--hpz " + std::to_string(o.hpz) + ": nodes of all " + std::to_string(group) + of_group +
           " make the secondary partition the primary one; use a node size below them";
  if (o.qgz_bits == 4 && o.quant_block % 2 != 0 && o.qgz)
    return "--qgz-bits 4 packs two codes per byte: --quant-block must be even, got " + std::to_string(o.quant_block);
  if (o.qwz_bits == 4 && o.quant_block % 2 != 0 && o.qwz)
    return "--qwz-bits 4 packs two codes per byte: --quant-block must be even, got " + std::to_string(o.quant_block);
  return "";
}

// A flag's check in a build compiled for one value of it (built_*): that value only, naming the build.
inline CLI::Validator compiled_only(const std::string& flag, const std::string& built) {
  return CLI::Validator(
      [flag, built](std::string& value) -> std::string {
        if (built.empty() || value == built) return "";
        return "this build of the trainer was compiled for " + flag + " " + built + " only, not " +
               toolcli::quote(value) + " (Meson option trainer_" + flag.substr(2) +
               "; scripts/demo.sh builds one per choice)";
      },
      "");
}

// The optimizers a trainer offers: every one in the library's catalog, or those `offered` says it runs,
// the others refused with `why_not` (the help lists the offered ones only).
struct optimizer_offer {
  std::function<bool(const std::string&)> offered = [](const std::string&) { return true; };
  std::string why_not;
};

// The flags every trainer takes (--ranks and --backend are the trainer's own: their meaning depends
// on the backends it offers). Combinations are checked after parsing, by options_problem().
inline void add_common_flags(CLI::App& app, options& o, const optimizer_offer& offer = {}) {
  toolcli::add_integer(app, "--stage", o.stage, 0, 3, "ZeRO stage")
      ->check(compiled_only("--stage", built_stage >= 0 ? std::to_string(built_stage) : ""));
  toolcli::add_integer(app, "--steps", o.steps, 0, 100000000,
                       "training steps (0 with --resume: only reshard, --save or --export it)");
  toolcli::add_integer(app, "--layers", o.model.layers, 1, 1000, "linear layers");
  toolcli::add_integer(app, "--hidden", o.model.hidden, 1, 1 << 20, "hidden width");
  toolcli::add_integer(app, "--in", o.model.in, 1, 1 << 20, "input features");
  toolcli::add_integer(app, "--classes", o.model.classes, 2, 1 << 20, "classes");
  toolcli::add_integer(app, "--batch", o.model.batch, 1, 1 << 24,
                       "global batch, a multiple of the ranks times --accum");
  std::vector<std::string> offered;
  for (const auto& n : zero::optimizers::names())
    if (offer.offered(n)) offered.push_back(n);
  app.add_option("--optimizer", o.optimizer, "optimizer")
      ->check(CLI::Validator(
          [offer](std::string& v) -> std::string {
            const auto all = zero::optimizers::names();
            const bool known = std::find(all.begin(), all.end(), v) != all.end();
            return known && !offer.offered(v) ? "--optimizer " + v + " " + offer.why_not : "";
          },
          ""))
      ->check(toolcli::one_of(offered))
      ->check(compiled_only("--optimizer", std::string(built_optimizer)))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--lr", [&o](const std::string& v) { o.lr = float_flag("--lr", v, false, max_lr); },
         "learning rate, in (0, 1000] as a 32-bit float (default: " + default_rates([](auto&) {}) + ")")
      ->type_name("FLOAT");
  app.add_option_function<std::string>(
         "--seed", [&o](const std::string& v) { o.model.seed = uint64_flag("--seed", v); },
         "seed of the data and the initial weights, a decimal integer in [0, 2^64 - 1]")
      ->type_name("UINT")
      ->default_str(std::to_string(o.model.seed));
  app.add_option("--precision", o.precision, "parameter and gradient precision (bf16/fp16 keep fp32 master weights)")
      ->check(toolcli::one_of(zero::precisions::names()))
      ->check(compiled_only("--precision", std::string(built_precision)))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--clip", [&o](const std::string& v) { o.clip = float_flag("--clip", v, true, max_clip); },
         "clip the global gradient norm to this value (0: off), in [0, 1e9]")
      ->type_name("FLOAT")
      ->default_str("0");
  auto* accum_flag =
      toolcli::add_integer(app, "--accum", o.accum, 1, 1 << 20, "micro-batches per step, each reduced on its own");
  auto* micro_flag =
      toolcli::add_integer(app, "--micro-batch", o.micro_batch, 1, 1 << 24,
                           "rows per micro-batch, fixed: with the global --batch and the ranks N it gives the "
                           "micro-batches per rank, batch / (N x K), which must divide evenly (instead of --accum)")
          ->default_str("")
          ->excludes(accum_flag);
  app.add_flag("--reproducible", o.reproducible,
               "the same bits at any world size: gradients reduced as exact binned sums, rounded once "
               "(docs/reproducibility.md); param_hash is the same for every N that divides the work")
      ->needs(micro_flag);
  auto* save_flag = app.add_option("--save", o.save,
                                   "save a checkpoint into this directory at the end (created, with its parents, "
                                   "before training)")
                        ->check(checked_target(save_target_problem, "save target"));
  toolcli::add_integer(app, "--save-every", o.save_every, 1, 1 << 30, "also save every K steps (needs --save)")
      ->default_str("")
      ->needs(save_flag);
  app.add_flag("--save-async", o.save_async,
               "write the checkpoints in the background: training goes on once each rank's state is copied "
               "(each save completes the previous one; the last is completed at the end)")
      ->needs(save_flag);
  app.add_option("--resume", o.resume, "continue from the checkpoint in this directory (any world size or stage)")
      ->check(toolcli::checked([](const std::string& t) { return toolcli::input_problem(t, S_IFDIR); }, "DIR"));
  app.add_option("--export", o.export_file, "write the final fp32 weights as a .safetensors file")
      ->check(checked_target(export_target_problem, "export target"));
  app.add_option_function<std::string>(
         "--memory-limit,--state-memory-limit",
         [&o](const std::string& v) { o.memory_limit = toolcli::size_value("--memory-limit", v); },
         "bytes each rank's engine may hold in its system's memory, e.g. 2000000, 64MiB (model states are checked "
         "before allocation; 0: no limit); offloaded states (--offload) are outside it, the host memory the tier "
          "holds on a CPU system (the disk tier's slice buffers) inside")
      ->type_name("BYTES")
      ->default_str("0");
  app.add_option("--offload", o.offload,
                 "where master weights and optimizer states live: none (with the parameters), host (host "
                 "memory), disk (a file per rank in --offload-dir); the same bits either way")
      ->check(toolcli::one_of({"none", "host", "disk"}))
      ->capture_default_str();
  app.add_option("--offload-dir", o.offload_dir,
                 "--offload disk (needed there, refused otherwise): the directory each rank's state file is created in")
      ->check(toolcli::checked(
          [](const std::string& t) {
            const std::string why = toolcli::input_problem(t, S_IFDIR);
            return why.empty() ? toolcli::cannot_create_in(t) : why;
          },
          "DIR"));
  app.add_option_function<std::string>(
         "--offload-slice",
         [&o](const std::string& v) {
           o.offload_slice = toolcli::integer_value<std::uint64_t>("--offload-slice", v, 1024, std::uint64_t{1} << 40);
           if (o.offload_slice % 1024 != 0)
             throw CLI::ValidationError("--offload-slice", toolcli::quote(v) + " is not a multiple of 1024");
           o.offload_slice_given = true;
         },
         "--offload host|disk: elements streamed per slice, a multiple of 1024 in [1024, 2^40] (three slices per state "
         "array in flight); not given with --offload disk and --memory-limit on a CPU system (where the tier's host "
         "memory counts in the limit): the largest up to the default with which the run fits the limit")
      ->type_name("UINT")
      ->default_str(std::to_string(o.offload_slice));
  auto* log_flag = app.add_option("--log", o.log,
                                  "write one JSON line per step into this file (tools/plot_run.py draws it); a "
                                  "resumed run (--resume) appends to it, a new run refuses a file that holds "
                                  "something unless --log-overwrite; symbolic links are not followed")
                       ->check(checked_target(log_target_problem, "log file"));
  app.add_flag("--log-overwrite", o.log_overwrite, "discard what the --log file holds instead of refusing it")
      ->needs(log_flag);
  app.add_flag("--json", o.json, "print one JSON object as the last line of stdout");
  toolcli::add_integer(app, "--host-threads", o.host_threads, 1, 1024,
                       "threads of each rank's optimizer update on the host (the same bits at any count; a run uses "
                       "ranks x this many)");
#if defined(ZERO_HOST_SIMD)
  // Process-wide, as the host loop's level is (sys/host_loop.hpp): set when the flag is parsed.
  app.add_option("--host-isa", o.host_isa,
                 "cap the host loops' instruction set (avx512, avx2, sse2, scalar): the CPU's best level up to this "
                 "one runs them; the same bits at every level (for measuring a narrower CPU on this one)")
      ->check(toolcli::one_of({"avx512", "avx2", "sse2", "scalar"}))
      ->each([](const std::string& level) {
        using zero::sys::host_loop::isa;
        zero::sys::host_loop::set_cap(level == "avx512" ? isa::avx512
                                      : level == "avx2" ? isa::avx2
                                      : level == "sse2" ? isa::sse2
                                                        : isa::scalar);
      });
#endif
  add_zeropp_flags(app, o);
}

// Whether the option `name` was given on the command line (false when the trainer has no such flag).
inline bool given(const CLI::App& app, const std::string& name) {
  try {
    return app.get_option(name)->count() > 0;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}

// The --log file's mode: appended to by a resumed run, replaced on request, else new or empty.
inline toolcli::log_mode log_mode_of(const options& o) {
  if (o.log_overwrite) return toolcli::log_mode::overwrite;
  return o.resume.empty() ? toolcli::log_mode::fresh : toolcli::log_mode::append;
}

// Why the ZeRO++ flags given do nothing without another one, or "" (the trainers and zero_plan).
inline std::string zeropp_flags_problem(const CLI::App& app, const options& o) {
  if (given(app, "--qwz-bits") && !o.qwz) return "--qwz-bits sets qwZ's codes: it needs --qwz";
  if (given(app, "--qgz-bits") && !o.qgz) return "--qgz-bits sets qgZ's codes: it needs --qgz";
  if (o.qgz_error_feedback && !o.qgz) return "--qgz-error-feedback compensates qgZ's quantization: it needs --qgz";
  if (given(app, "--quant-block") && !o.qwz && !o.qgz)
    return "--quant-block sets the blocks of qwZ's and qgZ's codes: it needs --qwz or --qgz";
  return "";
}

// Why the combination of the common flags cannot run, or does something other than it says (a flag
// that does nothing in the chosen mode), or "": a usage error before anything starts.
inline std::string options_problem(const CLI::App& app, const options& o) {
  if (o.steps == 0 && o.resume.empty()) return "--steps 0 only makes sense with --resume";
  if (given(app, "--offload-dir") && o.offload != "disk")
    return "--offload-dir is the disk tier's directory; --offload " + o.offload + " writes no file there";
  if (o.offload == "disk" && o.offload_dir.empty())
    return "--offload disk needs --offload-dir DIR: the directory each rank's state file is created in";
  if (given(app, "--offload-slice") && o.offload == "none")
    return "--offload-slice sets how offloaded state is streamed; --offload none streams nothing";
  if (std::string p = zeropp_flags_problem(app, o); !p.empty()) return p;
  // The log: a new run never mixes into, nor silently discards, a file that holds another run.
  if (!o.log.empty() && log_mode_of(o) == toolcli::log_mode::fresh) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(o.log, ec);
    if (!ec && size > 0)
      return "--log " + toolcli::quote(o.log) + " already holds " + std::to_string(size) +
             " bytes: a new run does not write into another run's log (give --log-overwrite to replace it; a run "
             "with --resume appends to it)";
  }
  return "";
}

// Sets the micro-batches per rank (o.accum) for `ranks` ranks: batch / (ranks x --micro-batch) when
// that flag is given, else --accum as given. Returns "" when the global batch splits evenly, else the
// problem; `ranks_text` names the ranks ("--ranks 4", "the number of MPI processes 4").
inline std::string split_batch(options& o, int batch, int ranks, const std::string& ranks_text) {
  const std::string rule = "the global batch " + std::to_string(batch) + " must be a multiple of " + ranks_text;
  if (o.micro_batch > 0) {
    if (batch % (ranks * o.micro_batch) != 0) return rule + " times --micro-batch " + std::to_string(o.micro_batch);
    o.accum = batch / (ranks * o.micro_batch);
    return "";
  }
  if (batch % (ranks * o.accum) != 0) return rule + " times --accum " + std::to_string(o.accum);
  return "";
}

using toolcli::parse;
using toolcli::usage_error;

// The engine options the trainers' flags set.
inline zero::engine_options engine_options_of(const options& o) {
  zero::engine_options eo;
  eo.clip_norm = o.clip;
  eo.micro_batches = o.accum;
  eo.memory_limit_bytes = o.memory_limit;
  eo.overlap = o.overlap != "off";
  eo.reproducible = o.reproducible;
  eo.offload.tier = o.offload == "host" ? zero::offload_tier::host
                    : o.offload == "disk" ? zero::offload_tier::disk
                                          : zero::offload_tier::none;
  eo.offload.directory = o.offload_dir;
  eo.offload.slice_elements = static_cast<std::size_t>(o.offload_slice);
  eo.zeropp.qwz = o.qwz;
  eo.zeropp.qgz = o.qgz;
  eo.zeropp.qgz_error_feedback = o.qgz_error_feedback;
  eo.zeropp.hpz = o.hpz > 0;
  eo.zeropp.node_size = o.nodes_of();
  eo.zeropp.weights = {o.qwz_bits, static_cast<std::size_t>(o.quant_block)};
  eo.zeropp.gradients = {o.qgz_bits, static_cast<std::size_t>(o.quant_block)};
  eo.shard_group_size = o.shard_group;
  eo.host_threads = o.host_threads;
  return eo;
}

// The disk tier's slice: --offload-slice where given. Under --memory-limit without it, the largest
// multiple of 1024 up to the default whose run fits the limit as `plan(engine_options)` (zero::plan for
// the run's engine) counts it, the trainers' final full_params() gather included: the tier stages up
// to three slices per state array, 12 MiB each at the default, more than a limit just above the states
// the tier leaves in memory has room for. The default where none fits (the engine then says why).
// Rank 0 says which slice it chose.
template <class Plan>
std::size_t offload_slice_of(const options& o, zero::engine_options eo, int rank, Plan&& plan) {
  const std::size_t given = eo.offload.slice_elements;
  if (eo.offload.tier != zero::offload_tier::disk || o.offload_slice_given || eo.memory_limit_bytes == 0) return given;
  for (std::size_t slice = given / 1024 * 1024; slice >= 1024; slice -= 1024) {
    eo.offload.slice_elements = slice;
    const zero::plan_report p = plan(eo);
    if (p.model_states.total() + std::max(p.step_transient_peak, p.consolidation_bytes) > eo.memory_limit_bytes)
      continue;
    if (rank == 0 && slice != given)
      std::fprintf(stderr,
                   "--offload disk: slices of %zu elements, the largest that fits --memory-limit %" PRIu64
                   " (the default %zu does not; --offload-slice sets it)\n",
                   slice, o.memory_limit, given);
    return slice;
  }
  return given;
}

// Calls train.template operator()<Stage, Optimizer, Precision>(optimizer) for the policies the
// options name: the one place where run-time flags become template arguments, over the library's
// type lists (zero/catalog.hpp), so a policy added there is a choice here.
template <class Train>
void dispatch(const options& o, Train&& train) {
  const bool found = zero::stages::visit_first([&]<class S>() { return S::stage == o.stage; }, [&]<class S>() {
    zero::optimizers::visit_first([&]<class O>() { return O::name == o.optimizer; }, [&]<class O>() {
      zero::precisions::visit_first([&]<class Pr>() { return Pr::name == o.precision; }, [&]<class Pr>() {
        // Only the compiled combinations instantiate the engine; the flags' checks refused the others.
        if constexpr (compiled<S, O, Pr>()) train.template operator()<S, O, Pr>(trainer_optimizer<O>(o));
      });
    });
  });
  (void)found;  // the flags' checks allow only the lists' members
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

// The offload part of the summary, from the rank's engine; `max` reduces a value over ranks.
template <class Engine, class Max>
void offload_summary(const Engine& e, summary& out, Max&& max) {
  const zero::offload_report& r = e.offload();
  const auto moved = [](const zero::offload_traffic& t) { return static_cast<double>(t.total()); };
  out.offload_bytes = max(static_cast<double>(r.host_bytes + r.disk_bytes));
  out.offload_formula = max(static_cast<double>(e.offload_formula_bytes()));
  out.offload_staging = max(static_cast<double>(r.staging_bytes));
  out.offload_moved = max(moved(r.last_step));
  out.offload_moved_formula = max(moved(e.offload_formula_traffic()));
  out.offload_file = r.file;
  out.offload_direct = r.direct_io;
}

inline void print_summary(const options& o, const summary& s) {
  std::printf("\nZeRO stage %d, %d ranks (%s%s%s), %s, %s%s, steps %llu-%llu in %.2f s\n", o.stage, o.ranks,
              o.backend.c_str(), s.device.empty() ? "" : " on ", s.device.c_str(), o.precision.c_str(),
              o.optimizer.c_str(), o.reproducible ? ", reproducible" : "",
              static_cast<unsigned long long>(s.first_step + 1), static_cast<unsigned long long>(s.last_step),
              s.seconds);
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
  if (o.offload != "none") {
    std::printf("  offloaded to %s%s: %.0f bytes per rank, formula %.0f (%s); %.0f bytes of host staging\n",
                o.offload.c_str(), o.offload == "disk" ? (s.offload_direct ? " (O_DIRECT)" : " (buffered)") : "",
                s.offload_bytes, s.offload_formula, s.offload_bytes == s.offload_formula ? "equal" : "DIFFERS",
                s.offload_staging);
    std::printf("    moved per step between tiers: %.0f bytes, formula %.0f (%s)\n", s.offload_moved,
                s.offload_moved_formula, s.offload_moved == s.offload_moved_formula ? "equal" : "DIFFERS");
  }
  const double elem = o.precision == "fp32" ? 4.0 : 2.0;
  std::printf("  communicated per rank per step: %.0f bytes, formula %.0f (%s); %.3f x Psi elements\n", s.comm_bytes,
              s.comm_formula, s.comm_bytes == s.comm_formula ? "equal" : "DIFFERS",
              o.ranks > 1 ? s.comm_bytes / (elem * static_cast<double>(s.padded)) : 0.0);
  if (s.exchange_formula > 0)
    std::printf("  the optimizer's matrix exchange per rank per step: %.0f bytes, formula %.0f (%s)\n",
                s.exchange_bytes, s.exchange_formula, s.exchange_bytes == s.exchange_formula ? "equal" : "DIFFERS");
  if (std::isnan(s.grad_norm))
    std::printf("  gradient norm not computed (fp32 without --clip)");
  else
    std::printf("  gradient norm %.4g (last step)", s.grad_norm);
  std::printf(", loss scale %g, %llu overflow step(s) skipped\n", s.loss_scale,
              static_cast<unsigned long long>(s.overflow_steps));
  if (!s.param_groups.empty()) std::printf("  parameter groups: %s\n", s.param_groups.c_str());
  if (!s.checkpoints.empty()) std::printf("  %s\n", s.checkpoints.c_str());
  if (s.time_step_s >= 0)
    std::printf("  step %.3f ms = compute %.3f + exposed communication %.3f + optimizer %.3f + other %.3f ms%s%s%s\n",
                1e3 * s.time_step_s, 1e3 * s.time_compute_s, 1e3 * s.time_comm_exposed_s, 1e3 * s.time_optimizer_s,
                1e3 * s.time_other_s, o.gemm.empty() ? "" : " (GEMMs: ", o.gemm.c_str(), o.gemm.empty() ? "" : ")");
  if (s.link_modeled_s >= 0)
    std::printf("  modeled link %g GB/s, %g us: %.3f ms of communication per step, %.3f ms of it held\n", o.link_gbps,
                o.link_latency_us, 1e3 * s.link_modeled_s, 1e3 * s.link_waited_s);
  if (o.zeropp() || o.nodes_of() > 0)
    std::printf("  ZeRO++%s%s%s, nodes of %d: %.0f bytes per step between nodes, formula %.0f (%s); %.3f x Psi "
                "elements\n",
                o.qwz ? " qwZ" : "", o.qgz ? (o.qgz_error_feedback ? " qgZ (error feedback)" : " qgZ") : "",
                o.hpz > 0 ? " hpZ" : "",
                o.nodes_of() > 0 ? o.nodes_of() : o.ranks, s.comm_inter_bytes, s.comm_inter_formula,
                s.comm_inter_bytes == s.comm_inter_formula ? "equal" : "DIFFERS",
                o.ranks > 1 ? s.comm_inter_bytes / ((o.precision == "fp32" ? 4.0 : 2.0) * static_cast<double>(s.padded))
                            : 0.0);
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
      {"reproducible", o.reproducible},
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
      {"optimizer_exchange_bytes_per_step", static_cast<std::uint64_t>(s.exchange_bytes)},
      {"optimizer_exchange_formula_bytes", static_cast<std::uint64_t>(s.exchange_formula)},
      {"comm_control_bytes_per_rank_per_step", static_cast<std::uint64_t>(s.control_bytes)},
  };
  if (!s.device.empty()) j["device"] = s.device;
  if (!s.param_groups.empty()) j["param_groups"] = s.param_groups;
  if (!o.gemm.empty()) j["gemm"] = o.gemm;
#if defined(ZERO_HOST_SIMD)
  j["host_isa"] = zero::sys::host_loop::name(zero::sys::host_loop::active());  // the level the host loops ran
#endif
  if (o.offload != "none") {
    j["offload"] = o.offload;
    j["offload_bytes_per_rank"] = static_cast<std::uint64_t>(s.offload_bytes);
    j["offload_formula_bytes"] = static_cast<std::uint64_t>(s.offload_formula);
    j["offload_staging_bytes"] = static_cast<std::uint64_t>(s.offload_staging);
    // The tier's host memory held as the system's (memory() category offload: CPU systems), within --memory-limit.
    j["offload_memory_bytes_per_rank"] =
        static_cast<std::uint64_t>(s.by_category[static_cast<int>(zero::mem_category::offload)]);
    j["offload_moved_bytes_per_step"] = static_cast<std::uint64_t>(s.offload_moved);
    j["offload_moved_formula_bytes"] = static_cast<std::uint64_t>(s.offload_moved_formula);
    if (o.offload == "disk") j["offload_direct_io"] = s.offload_direct;
  }
  const std::pair<const char*, double> split[] = {
      {"time_step_s", s.time_step_s},           {"time_compute_s", s.time_compute_s},
      {"time_comm_exposed_s", s.time_comm_exposed_s}, {"time_optimizer_s", s.time_optimizer_s},
      {"time_other_s", s.time_other_s},         {"link_modeled_s", s.link_modeled_s},
      {"link_waited_s", s.link_waited_s}};
  for (const auto& [name, v] : split)
    if (v >= 0) j[name] = v;
  if (o.link()) {
    j["link_gbps"] = o.link_gbps;
    j["link_latency_us"] = o.link_latency_us;
  }
  j["comm_inter_node_bytes_per_rank_per_step"] = static_cast<std::uint64_t>(s.comm_inter_bytes);
  j["comm_inter_node_formula_bytes"] = static_cast<std::uint64_t>(s.comm_inter_formula);
  if (o.zeropp() || o.nodes_of() > 0)
    j["zeropp"] = {{"qwz", o.qwz},          {"qgz", o.qgz},           {"hpz", o.hpz > 0},
                   {"node_size", o.nodes_of()}, {"quant_block", o.quant_block}, {"qwz_bits", o.qwz_bits},
                   {"qgz_bits", o.qgz_bits}};
  return j;
}

}  // namespace trainer
