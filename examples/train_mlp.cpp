// train_mlp: trains a small MLP classifier with ZeRO stage 0-3 on N simulated ranks and reports memory and traffic.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <string>

#include "mlp.hpp"
#include "zero/zero.hpp"

namespace {

struct options {
  int stage = 3, ranks = 4, steps = 200;
  mlp::config model;
  std::string optimizer = "adamw";
  float lr = 0.0f;  // 0: the optimizer's default below
  bool json = false;
};

// Everything a rank learned, reduced over ranks where ranks differ (max for bytes).
struct summary {
  double loss_first = 0, loss_last = 0, accuracy_last = 0, seconds = 0;
  std::uint64_t param_hash = 0, padded = 0, numel = 0;
  double model_state_bytes = 0, model_state_formula = 0, comm_bytes = 0, comm_formula = 0;
  double by_category[zero::mem_category_count] = {}, transient_peak = 0;
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

template <class Stage, class Opt, class Comm>
void train(Comm& comm, const options& o, const Opt& opt, summary& out) {
  const zero::model_spec spec = mlp::make_spec(o.model);
  zero::engine<Stage, Comm, Opt> e(comm, spec, opt);
  e.initialize(mlp::initializer(o.model));
  const int rank = comm.rank(), ranks = comm.size();
  const auto start = std::chrono::steady_clock::now();
  auto last_print = start;
  for (int t = 0; t < o.steps; ++t) {
    const auto r = mlp::train_step(e, o.model, static_cast<std::uint64_t>(t), rank, ranks);
    const double loss = global_sum(comm, r.loss) / ranks;
    const double correct = global_sum(comm, r.correct);
    if (t == 0) out.loss_first = loss;
    out.loss_last = loss;
    out.accuracy_last = correct / o.model.batch;
    const auto now = std::chrono::steady_clock::now();
    if (rank == 0 && (now - last_print > std::chrono::milliseconds(500) || t + 1 == o.steps || t == 0)) {
      const double secs = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "step %5d/%d  loss %.4f  acc %.3f  %.0f samples/s\n", t + 1, o.steps, loss,
                   out.accuracy_last, secs > 0 ? (t + 1) * double(o.model.batch) / secs : 0.0);
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
}

template <class Comm>
void dispatch(Comm& comm, const options& o, summary& out) {
  auto with_opt = [&](auto stage) {
    using S = decltype(stage);
    if (o.optimizer == "adamw") {
      zero::optim::adamw a;
      a.lr = o.lr > 0 ? o.lr : 1e-3f;
      train<S>(comm, o, a, out);
    } else {
      zero::optim::sgd s;
      s.lr = o.lr > 0 ? o.lr : 0.05f;
      train<S>(comm, o, s, out);
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
  std::printf("\nZeRO stage %d, %d ranks, %s, %d steps in %.2f s\n", o.stage, o.ranks, o.optimizer.c_str(), o.steps,
              s.seconds);
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
  std::printf("  communicated per rank per step: %.0f bytes, formula %.0f (%s); %.2f x Psi x 4 bytes\n", s.comm_bytes,
              s.comm_formula, s.comm_bytes == s.comm_formula ? "equal" : "DIFFERS",
              s.comm_bytes / (4.0 * static_cast<double>(s.padded)) * (n > 1 ? 1.0 : 0.0));
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"Train a small MLP classifier with ZeRO on simulated ranks (comm::threads)."};
  app.add_option("--stage", o.stage, "ZeRO stage")->check(CLI::Range(0, 3))->capture_default_str();
  app.add_option("--ranks", o.ranks, "number of ranks")->check(CLI::Range(1, 1024))->capture_default_str();
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
  app.add_flag("--json", o.json, "print one JSON object as the last line of stdout");
  try {
    app.parse(argc, argv);
    if (o.model.batch % o.ranks != 0)
      throw CLI::ValidationError("--batch", "the global batch " + std::to_string(o.model.batch) +
                                                " must be a multiple of --ranks " + std::to_string(o.ranks));
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << e.what() << "\n\n" << app.help();
    return 2;
  }

  summary s;
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
  print_summary(o, s);
  if (o.json) {
    nlohmann::json j = {
        {"backend", "threads"},
        {"stage", o.stage},
        {"ranks", o.ranks},
        {"steps", o.steps},
        {"optimizer", o.optimizer},
        {"precision", "fp32"},
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
