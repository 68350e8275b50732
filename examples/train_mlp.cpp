// train_mlp: trains a small MLP classifier with ZeRO stage 0-3 on N simulated ranks and reports memory and traffic.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <string>

#include "mlp.hpp"
#include "progress.hpp"
#include "run_log.hpp"
#include "trainer_checkpoint.hpp"
#include "trainer_cli.hpp"
#include "trainer_elastic.hpp"
#include "zero/comm/any_backend.hpp"
#include "zero/comm/backends/modeled.hpp"
#include "zero/zero.hpp"
#if ZERO_WITH_MPI
#include <optional>

#include "zero/comm/backends/mpi.hpp"
#endif

namespace {

using trainer::options;
using trainer::summary;
static_assert(zero::checkpoint::manifest_name == trainer::checkpoint_manifest);

template <class Comm>
double global_sum(Comm& comm, double v) {
  comm.all_reduce(&v, &v, 1, zero::reduce_op::sum);
  return v;
}
template <class Comm>
double global_max(Comm& comm, double v) {
  comm.all_reduce(&v, &v, 1, zero::reduce_op::max);
  return v;
}

// `comm` is the backend wrapped in comm::modeled (a pass-through without --link-*): the engine's
// collectives go through it, which times them; the trainer's own reductions of what it reports
// (loss, accuracy, maxima) go to the backend underneath, off the modeled link.
template <class Stage, class Opt, class Prec, class Comm>
void train(zero::comm::modeled<Comm>& comm, const options& o, const Opt& opt, summary& out) {
  Comm& report = comm.inner();
  const zero::model_spec spec = mlp::make_spec(o.model);
  zero::engine_options eo = trainer::engine_options_of(o);
  eo.offload.slice_elements = trainer::offload_slice_of(o, eo, comm.rank(), [&](const zero::engine_options& x) {
    return zero::plan_for<Stage, zero::comm::modeled<Comm>, Opt, Prec>(spec, comm.size(), x);
  });
  const auto setup_start = std::chrono::steady_clock::now();
  const double setup_cpu_start = trainer::thread_cpu_seconds();
  zero::engine<Stage, zero::comm::modeled<Comm>, Opt, Prec> e(comm, spec, opt, eo);
  // A resumed run continues from the checkpoint's weights, optimizer state and data position,
  // whatever world size and stage saved it.
  const std::uint64_t t0 = trainer::resume_or_initialize(e, comm, o, mlp::initializer(o.model));
  const double setup_cpu = trainer::thread_cpu_seconds() - setup_cpu_start;
  out.setup_seconds =
      global_max(report, std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count());
  out.setup_cpu_seconds = global_max(report, setup_cpu);
  const int rank = comm.rank(), ranks = comm.size();
  // Rank 0 reports: the progress line on stderr, and the --log file.
  std::optional<trainer::progress> bar;
  std::optional<trainer::run_log> log;
  trainer::checkpoints saves;  // --save-every and the last --save, blocking or --save-async
  if (rank == 0) {
    bar.emplace(stderr, t0, t0 + static_cast<std::uint64_t>(o.steps), static_cast<double>(o.model.batch));
    if (!o.log.empty()) {
      log.emplace(o.log, trainer::log_mode_of(o));
      log->run("train_mlp", o, e, t0,
              {{"batch", o.model.batch},
               {"gemm", o.gemm},
               {"link_gbps", o.link_gbps},
               {"link_latency_us", o.link_latency_us},
               {"model", {{"layers", o.model.layers}, {"hidden", o.model.hidden}, {"in", o.model.in},
                          {"classes", o.model.classes}}}});
    }
  }
  const auto start = std::chrono::steady_clock::now();
  out.first_step = t0;
  out.last_step = t0;  // --steps 0: nothing trained
  trainer::step_traffic step_bytes;  // what the summary reports as the step's traffic
  mlp::step_options how;
  how.kernels = o.gemm == "blas" ? mlp::gemm::blas : mlp::gemm::loops;
  how.comm_seconds = [&comm] { return comm.stats().blocked_s; };
  // The time split, summed over this rank's steps (docs/performance.md, "Step time").
  double sum_step = 0, sum_compute = 0, sum_comm = 0, sum_optimizer = 0, sum_other = 0, sum_modeled = 0, sum_waited = 0;
  for (int i = 0; i < o.steps; ++i) {
    const std::uint64_t t = t0 + static_cast<std::uint64_t>(i);
    trainer::step_begins(o, rank, t);  // --fail: a planted failure
    const zero::comm::link_stats link_before = comm.stats();
    const auto step_start = std::chrono::steady_clock::now();
    const auto r = mlp::train_step(e, o.model, t, rank, ranks, o.accum, how);
    const auto step_end = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(step_end - step_start).count();
    // Compute: the kernels; optimizer: step() less the collectives inside it; exposed communication:
    // time inside collectives; other: the rest (the batch's drawing, the engine's own copies in
    // gather/reduce/release), >= 0 as the parts are disjoint intervals of the step.
    const double optimizer = r.times.update - r.times.update_comm;
    const double other = std::max(0.0, secs - r.times.compute - r.times.comm - optimizer);
    sum_step += secs;
    sum_compute += r.times.compute;
    sum_comm += r.times.comm;
    sum_optimizer += optimizer;
    sum_other += other;
    sum_modeled += comm.stats().modeled_s - link_before.modeled_s;
    sum_waited += comm.stats().waited_s - link_before.waited_s;
    const double loss = global_sum(report, r.loss) / ranks;
    const double correct = global_sum(report, r.correct);
    if (i == 0) out.loss_first = loss;
    out.loss_last = loss;
    out.accuracy_last = correct / o.model.batch;
    out.grad_norm = r.report.grad_norm;
    out.loss_scale = r.report.loss_scale;
    out.overflow_steps += r.report.skipped ? 1 : 0;
    step_bytes.add(r.report);
    out.last_step = t + 1;
    trainer::step_done(o, rank, t + 1);
    if (rank == 0) {
      if (log) {
        trainer::step_record rec = trainer::engine_record(e, r.report);
        rec.step = t + 1;
        rec.loss = loss;
        rec.accuracy = out.accuracy_last;
        rec.items_per_s = secs > 0 ? o.model.batch / secs : 0.0;
        rec.step_ms = secs * 1e3;
        rec.elapsed_s = std::chrono::duration<double>(step_end - start).count();
        rec.gather_ms = r.times.gather * 1e3;
        rec.reduce_ms = r.times.reduce * 1e3;
        rec.update_ms = r.times.update * 1e3;
        rec.compute_ms = r.times.compute * 1e3;
        rec.time_step_s = secs;
        rec.time_compute_s = r.times.compute;
        rec.time_comm_exposed_s = r.times.comm;
        rec.time_optimizer_s = optimizer;
        rec.time_other_s = other;
        log->step(rec);
      }
      bar->update(t + 1, loss, r.report.skipped ? "  (skipped: non-finite gradients)" : "");
    }
    saves.after_step(e, comm, o, i);
    trainer::peer_snapshot_after(e, comm, o, i);  // --elastic --snapshot-every K: the state in the ranks' memory
    trainer::report(saves, bar ? &*bar : nullptr, log ? &*log : nullptr);
  }
  if (bar) bar->finish();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.steps > 0) {  // means over ranks and steps: the parts still add up to the step
    const double per = 1.0 / (static_cast<double>(ranks) * o.steps);
    out.time_step_s = global_sum(report, sum_step) * per;
    out.time_compute_s = global_sum(report, sum_compute) * per;
    out.time_comm_exposed_s = global_sum(report, sum_comm) * per;
    out.time_optimizer_s = global_sum(report, sum_optimizer) * per;
    out.time_other_s = global_sum(report, sum_other) * per;
    if (o.link()) {
      out.link_modeled_s = global_sum(report, sum_modeled) * per;
      out.link_waited_s = global_sum(report, sum_waited) * per;
    }
  }
  out.param_hash = mlp::param_hash(e);
  out.padded = e.layout().padded();
  out.numel = e.layout().numel();
  const auto& mem = e.memory();
  out.model_state_bytes = global_max(report, static_cast<double>(mem.model_state_bytes()));
  out.model_state_formula = static_cast<double>(e.model_state_formula_bytes());
  for (int c = 0; c < zero::mem_category_count; ++c)
    out.by_category[c] = global_max(report, static_cast<double>(mem.current[c]));
  out.transient_peak =
      global_max(report, static_cast<double>(mem.peak[static_cast<int>(zero::mem_category::transient)]));
  out.comm_bytes = global_max(report, static_cast<double>(step_bytes.bytes));
  out.comm_formula = static_cast<double>(e.comm_formula_bytes());
  out.exchange_bytes = global_max(report, static_cast<double>(step_bytes.exchange));
  out.exchange_formula = static_cast<double>(e.optimizer_exchange_formula_bytes());
  if (o.steps > 0)
    out.control_bytes =
        global_max(report, static_cast<double>(e.comm().control.total_bytes()) / static_cast<double>(o.steps));
  trainer::offload_summary(e, out, [&](double v) { return global_max(report, v); });
  out.comm_inter_bytes = global_max(report, static_cast<double>(step_bytes.inter));
  out.comm_inter_formula = static_cast<double>(e.comm_formula_by_level().inter);
  trainer::finish(e, comm, o, saves);
  trainer::report(saves, bar ? &*bar : nullptr, log ? &*log : nullptr);
  out.checkpoints = saves.summary();
}

// The backend (threads or MPI behind one type, so that each engine is compiled once for both) under
// comm::modeled: the link of --link-gbps/--link-latency-us, or a pass-through.
void dispatch(zero::comm::any_backend<zero::sys::host>& backend, const options& o, summary& out) {
  trainer::with_printable_errors([&] {
    const zero::comm::link_model link =
        o.link() ? zero::comm::link_model::of(o.link_latency_us,
                                              o.link_gbps > 0 ? o.link_gbps : std::numeric_limits<double>::infinity())
                 : zero::comm::link_model{};
    zero::comm::modeled<zero::comm::any_backend<zero::sys::host>> comm(backend, link);
    trainer::dispatch(o, [&]<class S, class O, class P>(const O& opt) { train<S, O, P>(comm, o, opt, out); });
  });
}

// A decimal number as a double: finite, and > 0 (or >= 0 with zero_ok), at most 1e12.
double double_flag(const std::string& flag, const std::string& text, bool zero_ok) {
  const double v = toolcli::double_value(flag, text, 0.0, 1e12);
  if (!zero_ok && v == 0) throw CLI::ValidationError(flag, "must be > 0, got " + toolcli::quote(text));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.backend = "threads";
  CLI::App app{"Train a small MLP classifier with ZeRO on N ranks: threads of this process (comm::threads) or MPI "
               "processes started by mpirun (comm::mpi)."};
  [[maybe_unused]] auto* ranks_flag = toolcli::add_integer(
      app, "--ranks", o.ranks, 1, 1024, "number of ranks (with --backend mpi: the communicator's size)");
  app.add_option("--backend", o.backend, "threads: ranks as threads of this process; mpi: one rank per MPI process")
      ->check(toolcli::one_of({"threads", "mpi"}))
      ->capture_default_str();
  toolcli::add_double(app, "--comm-timeout", o.comm_timeout, 0.001, 7 * 86400.0,
                      "seconds a rank waits in a collective for its peers before the run fails with an error naming "
                      "the call and the ranks that did not arrive");
  trainer::add_common_flags(app, o);
  o.gemm = mlp::have_blas ? "blas" : "loops";
  app.add_option("--gemm", o.gemm,
                 "the linear layers' GEMMs: blas (OpenBLAS, one thread per rank) or loops (the hand-written ones; "
                 "the two sum in different orders, so param_hash depends on the choice)")
      ->check(mlp::have_blas ? toolcli::one_of({"loops", "blas"}) : toolcli::one_of({"loops"}))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--link-gbps", [&o](const std::string& v) { o.link_gbps = double_flag("--link-gbps", v, false); },
         "model a link of this bandwidth (GB/s, per rank): each collective of the engine is held to latency + "
         "bytes / bandwidth, bytes being what the rank sends (comm::modeled); results stay bit-identical")
      ->type_name("FLOAT");
  app.add_option_function<std::string>(
         "--link-latency-us",
         [&o](const std::string& v) { o.link_latency_us = double_flag("--link-latency-us", v, true); },
         "the modeled link's latency per collective, in microseconds (alone: a link of unlimited bandwidth)")
      ->type_name("FLOAT")
      ->default_str("0");
  app.add_option("--overlap", o.overlap,
                 "overlap communication with computation where the backend can (comm::mpi, a modeled link): "
                 "reduces in flight, stage 3 prefetch; the same bits either way")
      ->check(toolcli::one_of({"on", "off"}))
      ->capture_default_str();
  trainer::add_elastic_flags(app, o);
  if (const auto code = trainer::parse(app, argc, argv)) return *code;
#if MLP_WITH_OPENBLAS
  mlp::blas::single_threaded();  // before the ranks start: one thread per rank
#endif
  auto usage_error = [&](const std::string& msg) { return trainer::usage_error(app, msg); };
  if (const std::string p = trainer::options_problem(app, o); !p.empty()) return usage_error(p);
  if (const std::string p = trainer::elastic_problem(app, o); !p.empty()) return usage_error(p);
  // Checked as parsed (a double in [0.001, 604800]) and used as whole milliseconds, at least 1.
  const auto comm_timeout = std::chrono::milliseconds(std::llround(o.comm_timeout * 1000.0));

  summary s;
  std::optional<trainer::elastic_supervisor> elastic;  // --elastic: the launches and what changed
#if ZERO_WITH_MPI
  std::optional<zero::comm::mpi_session> session;  // finalizes MPI when main returns
#endif
  if (o.backend == "mpi") {
#if ZERO_WITH_MPI
    session.emplace(argc, argv);
    // Under mpirun the world is the communicator; a --ranks that says otherwise is a mistake, and
    // every rank reaches the same verdict, but only rank 0 says so.
    const int world = session->world_size(), rank = session->world_rank();
    std::string problem;
    if (ranks_flag->count() > 0 && o.ranks != world)
      problem = "--ranks " + std::to_string(o.ranks) + " contradicts the " + std::to_string(world) +
                " MPI processes (under --backend mpi the ranks are the processes mpirun starts; drop --ranks)";
    else if (problem = trainer::split_batch(o, o.model.batch, world, "the number of MPI processes " + std::to_string(world));
             problem.empty())
      problem = trainer::zeropp_problem(o, world);
    if (problem.empty()) problem = trainer::planted_problem(o, world);
    if (!problem.empty()) return rank == 0 ? usage_error(problem) : 2;
    o.ranks = world;
    std::optional<trainer::elastic_monitor> planted;  // --fail: this process's rank throws there
    trainer::plant_failures(o, planted, world);
    // A rank that throws ends the job through MPI_Abort: its peers would otherwise wait forever.
    zero::comm::mpi_options mpi_opt;
    mpi_opt.timeout = comm_timeout;
    zero::comm::mpi::run(
        [&](zero::comm::mpi& comm) {
          zero::comm::any_backend<zero::sys::host> backend(comm);
          dispatch(backend, o, s);
        },
        mpi_opt);
    if (rank != 0) return 0;  // every rank holds the reduced summary; rank 0 reports it
#else
    return usage_error("--backend mpi: this train_mlp was built without MPI (configure with -Dmpi=enabled)");
#endif
  } else {
    if (const std::string problem =
            trainer::split_batch(o, o.model.batch, o.ranks, "--ranks " + std::to_string(o.ranks));
        !problem.empty())
      return usage_error(problem);
    if (const std::string p = trainer::zeropp_problem(o, o.ranks); !p.empty()) return usage_error(p);
    // One launch of the ranks; a rank leaving by an exception tells the monitor first (the first to
    // do so is the cause: its peers fail after it, when the world aborts).
    auto launch = [&](const options& run, summary& out) {
      zero::comm::threads::options threads_opt;
      threads_opt.timeout = comm_timeout;
      zero::comm::threads::launch(
          run.ranks,
          [&](zero::comm::threads& comm) {
            try {
              summary local;
              zero::comm::any_backend<zero::sys::host> backend(comm);
              dispatch(backend, run, local);
              if (comm.rank() == 0) out = local;
            } catch (...) {
              if (run.monitor) run.monitor->rank_failed(comm.rank());
              throw;
            }
          },
          threads_opt);
    };
    try {
      if (o.elastic) {
        s = elastic.emplace(o).run(launch);
      } else {
        std::optional<trainer::elastic_monitor> planted;  // --fail without --elastic: the run fails
        trainer::plant_failures(o, planted, o.ranks);
        launch(o, s);
      }
    } catch (...) {
      std::cerr << "train_mlp: " << trainer::printable_failure(std::current_exception()) << "\n";
      return 1;
    }
  }
  print_summary(o, s);
  if (elastic)
    for (const std::string& line : elastic->lines()) std::cout << line << "\n";
  if (o.json) {
    nlohmann::json j = trainer::summary_json(o, s);
    if (elastic) j["elastic"] = elastic->json();
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
