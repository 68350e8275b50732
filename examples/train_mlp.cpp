// train_mlp: trains a small MLP classifier with ZeRO stage 0-3 on N simulated ranks and reports memory and traffic.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "mlp.hpp"
#include "progress.hpp"
#include "run_log.hpp"
#include "trainer_checkpoint.hpp"
#include "trainer_cli.hpp"
#include "zero/zero.hpp"
#if ZERO_WITH_MPI
#include <optional>

#include "zero/comm/mpi.hpp"
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

template <class Stage, class Opt, class Prec, class Comm>
void train(Comm& comm, const options& o, const Opt& opt, summary& out) {
  const zero::model_spec spec = mlp::make_spec(o.model);
  const zero::engine_options eo = trainer::engine_options_of(o);
  const auto setup_start = std::chrono::steady_clock::now();
  const double setup_cpu_start = trainer::thread_cpu_seconds();
  zero::engine<Stage, Comm, Opt, Prec> e(comm, spec, opt, eo);
  // A resumed run continues from the checkpoint's weights, optimizer state and data position,
  // whatever world size and stage saved it.
  const std::uint64_t t0 = trainer::resume_or_initialize(e, comm, o, mlp::initializer(o.model));
  const double setup_cpu = trainer::thread_cpu_seconds() - setup_cpu_start;
  out.setup_seconds =
      global_max(comm, std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count());
  out.setup_cpu_seconds = global_max(comm, setup_cpu);
  const int rank = comm.rank(), ranks = comm.size();
  // Rank 0 reports: the progress line on stderr, and the --log file.
  std::optional<trainer::progress> bar;
  std::optional<trainer::run_log> log;
  if (rank == 0) {
    bar.emplace(stderr, t0, t0 + static_cast<std::uint64_t>(o.steps), static_cast<double>(o.model.batch));
    if (!o.log.empty()) {
      log.emplace(o.log);
      log->run("train_mlp", o, e, t0,
              {{"batch", o.model.batch},
               {"model", {{"layers", o.model.layers}, {"hidden", o.model.hidden}, {"in", o.model.in},
                          {"classes", o.model.classes}}}});
    }
  }
  const auto start = std::chrono::steady_clock::now();
  out.first_step = t0;
  out.last_step = t0;  // --steps 0: nothing trained
  trainer::step_traffic step_bytes;  // what the summary reports as the step's traffic
  for (int i = 0; i < o.steps; ++i) {
    const std::uint64_t t = t0 + static_cast<std::uint64_t>(i);
    const auto step_start = std::chrono::steady_clock::now();
    const auto r = mlp::train_step(e, o.model, t, rank, ranks, o.accum);
    const auto step_end = std::chrono::steady_clock::now();
    const double loss = global_sum(comm, r.loss) / ranks;
    const double correct = global_sum(comm, r.correct);
    if (i == 0) out.loss_first = loss;
    out.loss_last = loss;
    out.accuracy_last = correct / o.model.batch;
    out.grad_norm = r.report.grad_norm;
    out.loss_scale = r.report.loss_scale;
    out.overflow_steps += r.report.skipped ? 1 : 0;
    step_bytes.add(r.report);
    out.last_step = t + 1;
    if (rank == 0) {
      if (log) {
        trainer::step_record rec = trainer::engine_record(e, r.report);
        rec.step = t + 1;
        rec.loss = loss;
        rec.accuracy = out.accuracy_last;
        const double secs = std::chrono::duration<double>(step_end - step_start).count();
        rec.items_per_s = secs > 0 ? o.model.batch / secs : 0.0;
        rec.step_ms = secs * 1e3;
        rec.elapsed_s = std::chrono::duration<double>(step_end - start).count();
        rec.gather_ms = r.times.gather * 1e3;
        rec.reduce_ms = r.times.reduce * 1e3;
        rec.update_ms = r.times.update * 1e3;
        rec.compute_ms = r.times.compute * 1e3;
        log->step(rec);
      }
      bar->update(t + 1, loss, r.report.skipped ? "  (skipped: non-finite gradients)" : "");
    }
    trainer::after_step(e, comm, o, i);
  }
  if (bar) bar->finish();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.param_hash = mlp::param_hash(e);
  out.padded = e.layout().padded();
  out.numel = e.layout().numel();
  const auto& mem = e.memory();
  out.model_state_bytes = global_max(comm, static_cast<double>(mem.model_state_bytes()));
  out.model_state_formula = static_cast<double>(e.model_state_formula_bytes());
  for (int c = 0; c < zero::mem_category_count; ++c)
    out.by_category[c] = global_max(comm, static_cast<double>(mem.current[c]));
  out.transient_peak = global_max(comm, static_cast<double>(mem.peak[static_cast<int>(zero::mem_category::transient)]));
  out.comm_bytes = global_max(comm, static_cast<double>(step_bytes.bytes));
  out.comm_formula = static_cast<double>(e.comm_formula_bytes());
  trainer::finish(e, comm, o);
}

template <class Comm>
void dispatch(Comm& comm, const options& o, summary& out) {
  trainer::with_printable_errors(
      [&] { trainer::dispatch(o, [&]<class S, class O, class P>(const O& opt) { train<S, O, P>(comm, o, opt, out); }); });
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.backend = "threads";
  CLI::App app{"Train a small MLP classifier with ZeRO on N ranks: threads of this process (comm::threads) or MPI "
               "processes started by mpirun (comm::mpi)."};
  [[maybe_unused]] auto* ranks_flag =
      app.add_option("--ranks", o.ranks, "number of ranks (with --backend mpi: the communicator's size)")
          ->check(CLI::Range(1, 1024))
          ->capture_default_str();
  app.add_option("--backend", o.backend, "threads: ranks as threads of this process; mpi: one rank per MPI process")
      ->check(CLI::IsMember({"threads", "mpi"}))
      ->capture_default_str();
  app.add_option("--comm-timeout", o.comm_timeout,
                 "seconds a rank waits in a collective for its peers before the run fails with an error naming "
                 "the call and the ranks that did not arrive")
      ->check(CLI::Range(0.001, 7 * 86400.0))
      ->capture_default_str();
  trainer::add_common_flags(app, o);
  if (const auto code = trainer::parse(app, argc, argv)) return *code;
  auto usage_error = [&](const std::string& msg) { return trainer::usage_error(app, msg); };
  // Checked as parsed (CLI11's range lets nan through) and as used: whole milliseconds, at least 1.
  if (!(o.comm_timeout >= 0.001 && o.comm_timeout <= 7 * 86400.0))
    return usage_error("--comm-timeout " + std::to_string(o.comm_timeout) +
                       ": the timeout must be a number of seconds in [0.001, 604800]");
  const auto comm_timeout = std::chrono::milliseconds(std::llround(o.comm_timeout * 1000.0));
  const std::string batch_rule = "the global batch " + std::to_string(o.model.batch) + " must be a multiple of ";
  if (o.steps == 0 && o.resume.empty()) return usage_error("--steps 0 only makes sense with --resume");

  summary s;
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
    else if (o.model.batch % (world * o.accum) != 0)
      problem = batch_rule + "the number of MPI processes " + std::to_string(world) + " times --accum " +
                std::to_string(o.accum);
    if (!problem.empty()) return rank == 0 ? usage_error(problem) : 2;
    o.ranks = world;
    // A rank that throws ends the job through MPI_Abort: its peers would otherwise wait forever.
    zero::comm::mpi_options mpi_opt;
    mpi_opt.timeout = comm_timeout;
    zero::comm::mpi::run([&](zero::comm::mpi& comm) { dispatch(comm, o, s); }, mpi_opt);
    if (rank != 0) return 0;  // every rank holds the reduced summary; rank 0 reports it
#else
    return usage_error("--backend mpi: this train_mlp was built without MPI (configure with -Dmpi=enabled)");
#endif
  } else {
    if (o.model.batch % (o.ranks * o.accum) != 0)
      return usage_error(batch_rule + "--ranks " + std::to_string(o.ranks) + " times --accum " +
                         std::to_string(o.accum));
    try {
      zero::comm::threads::options threads_opt;
      threads_opt.timeout = comm_timeout;
      zero::comm::threads::launch(
          o.ranks,
          [&](zero::comm::threads& comm) {
            summary local;
            dispatch(comm, o, local);
            if (comm.rank() == 0) s = local;
          },
          threads_opt);
    } catch (...) {
      std::cerr << "train_mlp: " << trainer::printable_failure(std::current_exception()) << "\n";
      return 1;
    }
  }
  print_summary(o, s);
  if (o.json) {
    const nlohmann::json j = trainer::summary_json(o, s);
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
