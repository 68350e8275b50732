// train_mlp: trains a small MLP classifier with ZeRO stage 0-3 on N simulated ranks and reports memory and traffic.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "mlp.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/zero.hpp"
#if ZERO_WITH_MPI
#include <optional>

#include "zero/comm/mpi.hpp"
#endif

namespace {

struct options {
  int stage = 3, ranks = 4, steps = 200;
  mlp::config model;
  std::string optimizer = "adamw";
  float lr = 0.0f;  // 0: the optimizer's default below
  bool json = false;
  std::string backend = "threads";  // threads: ranks are threads of this process; mpi: MPI processes
  std::string precision = "fp32";
  float clip = 0.0f;  // 0: no clipping
  int accum = 1;      // micro-batches per step, each reduced on its own
  std::string save, resume, export_file;
  int save_every = 0;  // 0: save only at the end
};

// Everything a rank learned, reduced over ranks where ranks differ (max for bytes).
struct summary {
  double loss_first = 0, loss_last = 0, accuracy_last = 0, seconds = 0;
  std::uint64_t param_hash = 0, padded = 0, numel = 0;
  double model_state_bytes = 0, model_state_formula = 0, comm_bytes = 0, comm_formula = 0;
  double by_category[zero::mem_category_count] = {}, transient_peak = 0;
  double grad_norm = 0, loss_scale = 1;
  std::uint64_t overflow_steps = 0, first_step = 0, last_step = 0;
};

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
  namespace ckpt = zero::checkpoint;
  const zero::model_spec spec = mlp::make_spec(o.model);
  zero::engine_options eo;
  eo.clip_norm = o.clip;
  eo.micro_batches = o.accum;
  zero::engine<Stage, Comm, Opt, Prec> e(comm, spec, opt, eo);
  // A resumed run continues from the checkpoint's weights, optimizer state and data position,
  // whatever world size and stage saved it.
  std::uint64_t t0 = 0;
  if (!o.resume.empty()) {
    ckpt::load(e, comm, o.resume);
    t0 = e.state().step + e.state().skipped_steps;
  } else {
    e.initialize(mlp::initializer(o.model));
  }
  const int rank = comm.rank(), ranks = comm.size();
  const auto start = std::chrono::steady_clock::now();
  auto last_print = start;
  out.first_step = t0;
  for (int i = 0; i < o.steps; ++i) {
    const std::uint64_t t = t0 + static_cast<std::uint64_t>(i);
    const auto r = mlp::train_step(e, o.model, t, rank, ranks, o.accum);
    const double loss = global_sum(comm, r.loss) / ranks;
    const double correct = global_sum(comm, r.correct);
    if (i == 0) out.loss_first = loss;
    out.loss_last = loss;
    out.accuracy_last = correct / o.model.batch;
    out.grad_norm = r.report.grad_norm;
    out.loss_scale = r.report.loss_scale;
    out.overflow_steps += r.report.skipped ? 1 : 0;
    out.last_step = t + 1;
    if (o.save_every > 0 && (i + 1) % o.save_every == 0 && i + 1 < o.steps) ckpt::save(e, comm, o.save);
    const auto now = std::chrono::steady_clock::now();
    if (rank == 0 && (now - last_print > std::chrono::milliseconds(500) || i + 1 == o.steps || i == 0)) {
      const double secs = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "step %5llu/%llu  loss %.4f  acc %.3f  %.0f samples/s%s\n",
                   static_cast<unsigned long long>(t + 1), static_cast<unsigned long long>(t0 + o.steps), loss,
                   out.accuracy_last, secs > 0 ? (i + 1) * double(o.model.batch) / secs : 0.0,
                   r.report.skipped ? "  (skipped: non-finite gradients)" : "");
      last_print = now;
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto params = e.full_params();
  out.param_hash = zero::fnv1a64(params.data(), params.size() * sizeof(float));
  out.padded = e.layout().padded();
  out.numel = e.layout().numel();
  const auto& mem = e.memory();
  out.model_state_bytes = global_max(comm, static_cast<double>(mem.model_state_bytes()));
  out.model_state_formula = static_cast<double>(e.model_state_formula_bytes());
  for (int c = 0; c < zero::mem_category_count; ++c)
    out.by_category[c] = global_max(comm, static_cast<double>(mem.current[c]));
  out.transient_peak = global_max(comm, static_cast<double>(mem.peak[static_cast<int>(zero::mem_category::transient)]));
  out.comm_bytes = global_max(comm, static_cast<double>(e.comm().last_step.total_bytes()));
  out.comm_formula = static_cast<double>(e.comm_formula_bytes());
  if (!o.save.empty()) ckpt::save(e, comm, o.save);
  if (!o.export_file.empty()) {
    // The export reads a checkpoint: the one just saved, or a temporary one beside the output.
    std::filesystem::path dir = o.save;
    if (dir.empty()) dir = std::filesystem::path(o.export_file).string() + ".checkpoint.tmp";
    if (o.save.empty()) ckpt::save(e, comm, dir);
    comm.barrier();
    if (rank == 0) {
      ckpt::export_safetensors(dir, o.export_file);
      if (o.save.empty()) std::filesystem::remove_all(dir);
    }
    comm.barrier();
  }
}

template <class Comm>
void dispatch(Comm& comm, const options& o, summary& out) {
  auto with_precision = [&](auto stage, const auto& opt) {
    using S = decltype(stage);
    using O = std::decay_t<decltype(opt)>;
    if (o.precision == "bf16") train<S, O, zero::precision::bf16>(comm, o, opt, out);
    else if (o.precision == "fp16") train<S, O, zero::precision::fp16>(comm, o, opt, out);
    else train<S, O, zero::precision::fp32>(comm, o, opt, out);
  };
  auto with_opt = [&](auto stage) {
    if (o.optimizer == "adamw") {
      zero::optim::adamw a;
      a.lr = o.lr > 0 ? o.lr : 1e-3f;
      with_precision(stage, a);
    } else {
      zero::optim::sgd s;
      s.lr = o.lr > 0 ? o.lr : 0.05f;
      with_precision(stage, s);
    }
  };
  switch (o.stage) {
    case 0: return with_opt(zero::stage0{});
    case 1: return with_opt(zero::stage1{});
    case 2: return with_opt(zero::stage2{});
    default: return with_opt(zero::stage3{});
  }
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

void print_summary(const options& o, const summary& s) {
  const double n = o.ranks;
  std::printf("\nZeRO stage %d, %d ranks, %s, %s, steps %llu-%llu in %.2f s\n", o.stage, o.ranks, o.precision.c_str(),
              o.optimizer.c_str(), static_cast<unsigned long long>(s.first_step + 1),
              static_cast<unsigned long long>(s.last_step), s.seconds);
  std::printf("  loss %.4f -> %.4f, accuracy %.1f%% on the last batch\n", s.loss_first, s.loss_last,
              100.0 * s.accuracy_last);
  std::printf("  parameters %" PRIu64 " (padded Psi = %" PRIu64 "), param_hash %s\n", s.numel, s.padded,
              hex(s.param_hash).c_str());
  std::printf("  memory per rank (bytes, max over ranks):\n");
  for (int c = 0; c < zero::mem_category_count; ++c)
    std::printf("    %-17s %14.0f\n", zero::to_string(static_cast<zero::mem_category>(c)), s.by_category[c]);
  std::printf("    %-17s %14.0f   formula %.0f (%s)\n", "model states", s.model_state_bytes, s.model_state_formula,
              s.model_state_bytes == s.model_state_formula ? "equal" : "DIFFERS");
  std::printf("    %-17s %14.0f\n", "transient peak", s.transient_peak);
  const double elem = o.precision == "fp32" ? 4.0 : 2.0;
  std::printf("  communicated per rank per step: %.0f bytes, formula %.0f (%s); %.3f x Psi elements\n", s.comm_bytes,
              s.comm_formula, s.comm_bytes == s.comm_formula ? "equal" : "DIFFERS",
              n > 1 ? s.comm_bytes / (elem * static_cast<double>(s.padded)) : 0.0);
  std::printf("  gradient norm %.4g (last step), loss scale %g, %llu overflow step(s) skipped\n", s.grad_norm,
              s.loss_scale, static_cast<unsigned long long>(s.overflow_steps));
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Train a small MLP classifier with ZeRO on N ranks: threads of this process (comm::threads) or MPI "
               "processes started by mpirun (comm::mpi)."};
  app.add_option("--stage", o.stage, "ZeRO stage")->check(CLI::Range(0, 3))->capture_default_str();
  [[maybe_unused]] auto* ranks_flag =
      app.add_option("--ranks", o.ranks, "number of ranks (with --backend mpi: the communicator's size)")
          ->check(CLI::Range(1, 1024))
          ->capture_default_str();
  app.add_option("--backend", o.backend, "threads: ranks as threads of this process; mpi: one rank per MPI process")
      ->check(CLI::IsMember({"threads", "mpi"}))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "training steps")->check(CLI::Range(1, 100000000))->capture_default_str();
  app.add_option("--layers", o.model.layers, "linear layers")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--hidden", o.model.hidden, "hidden width")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--in", o.model.in, "input features")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--classes", o.model.classes, "classes")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  app.add_option("--batch", o.model.batch, "global batch, a multiple of --ranks")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "optimizer")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate (default: 1e-3 for adamw, 0.05 for sgd)")
      ->check(CLI::PositiveNumber);
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
  app.add_flag("--json", o.json, "print one JSON object as the last line of stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << e.what() << "\n\n" << app.help();
    return 2;
  }
  auto usage_error = [&](const std::string& msg) {
    std::cerr << "error: " << msg << "\n\n" << app.help();
    return 2;
  };
  const std::string batch_rule = "the global batch " + std::to_string(o.model.batch) + " must be a multiple of ";

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
    zero::comm::mpi::run([&](zero::comm::mpi& comm) { dispatch(comm, o, s); });
    if (rank != 0) return 0;  // every rank holds the reduced summary; rank 0 reports it
#else
    return usage_error("--backend mpi: this train_mlp was built without MPI (configure with -Dmpi=enabled)");
#endif
  } else {
    if (o.model.batch % (o.ranks * o.accum) != 0)
      return usage_error(batch_rule + "--ranks " + std::to_string(o.ranks) + " times --accum " +
                         std::to_string(o.accum));
    try {
      zero::comm::threads::launch(o.ranks, [&](zero::comm::threads& comm) {
        summary local;
        dispatch(comm, o, local);
        if (comm.rank() == 0) s = local;
      });
    } catch (const std::exception& e) {
      std::cerr << "train_mlp: " << e.what() << "\n";
      return 1;
    }
  }
  print_summary(o, s);
  if (o.json) {
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
        {"param_hash", hex(s.param_hash)},
        {"model_state_bytes_per_rank", static_cast<std::uint64_t>(s.model_state_bytes)},
        {"model_state_formula_bytes", static_cast<std::uint64_t>(s.model_state_formula)},
        {"transient_peak_bytes_per_rank", static_cast<std::uint64_t>(s.transient_peak)},
        {"comm_bytes_per_rank_per_step", static_cast<std::uint64_t>(s.comm_bytes)},
        {"comm_formula_bytes", static_cast<std::uint64_t>(s.comm_formula)},
    };
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
