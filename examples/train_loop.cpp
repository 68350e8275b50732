// train_loop: a complete small training loop to copy: data split over ranks, schedule, clipping, evaluation, checkpoints.
//
// The model is a 2-layer MLP (8 -> 16 -> 1, tanh) fitted to a fixed synthetic function by least
// squares. Every call of the engine is in this file; docs/api.md walks through it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "tool_cli.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/comm/any_backend.hpp"
#include "zero/zero.hpp"
#if ZERO_WITH_MPI
#include "zero/comm/backends/mpi.hpp"
#endif

namespace {

struct options {
  int ranks = 4, stage = 3, steps = 40, eval_every = 10, save_every = 0;
  int schedule_steps = 0;  // the schedule's length: the run as planned, which may stop earlier (0: --steps)
  std::string backend = "threads", save, resume;
  bool save_async = false;  // --save-async: checkpoints written in the background
  std::uint64_t seed = 1;
};

constexpr std::size_t in = 8, hidden = 16;
constexpr int batch = 16;       // the global batch: every step's samples, split over the ranks
constexpr int eval_rows = 32;   // the held-out split
constexpr float peak_lr = 1e-2f;
constexpr int warmup = 5;

// Counter-based random numbers: the value depends only on (seed, stream, index), never on which
// rank draws it or in which order, so every rank can produce any sample or any initial weight.
double uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull ^ (stream << 40) ^ index;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
}

// Sample `index` of a split (0: training, 1: held-out): 8 inputs and the target the model learns.
struct sample {
  float x[in];
  float y;
};
sample make_sample(std::uint64_t seed, int split, std::uint64_t index) {
  sample s{};
  float y = 0.0f;
  for (std::size_t k = 0; k < in; ++k) {
    s.x[k] = static_cast<float>(uniform(seed, 10 + split, index * in + k));
    y += (k % 2 ? 0.5f : -0.25f) * s.x[k];
  }
  s.y = y + 0.5f * std::tanh(2.0f * s.x[0] * s.x[1]);
  return s;
}

// tutorial:begin schedule
// Linear warm-up to the peak, then cosine decay to zero at the last step (zero/core/schedule.hpp):
// a function of the step alone, so a resumed run continues it where the checkpoint left off.
zero::warmup_cosine schedule_of(int total) {
  const zero::warmup_cosine s{.peak = peak_lr, .min = 0.0f, .warmup = warmup, .total = static_cast<std::uint64_t>(total)};
  s.validate();
  return s;
}
// tutorial:end

// tutorial:begin exact
// Per-sample gradient contributions rounded to multiples of 2^-12 (and bounded by 16): every sum
// of them below is exact in float, and the batch sizes are powers of two, so the step's gradient
// does not depend on how the batch is split. That makes the final parameters bit-identical at any
// power-of-two world size, which the tests check on a resume at another N. A real model skips this
// and accepts last-bit differences between world sizes (same N, any stage, is bit-identical anyway).
float fixed(float v) { return std::clamp(std::round(v * 4096.0f), -65536.0f, 65536.0f) / 4096.0f; }
// tutorial:end

// The forward pass of one sample through the gathered weights; h receives the hidden activations.
template <class W>
float forward(const W& fc1, const W& fc2, const sample& s, float* h) {
  const auto w1 = fc1["w"], b1 = fc1["b"], w2 = fc2["w"], b2 = fc2["b"];
  float y = b2[0];
  for (std::size_t j = 0; j < hidden; ++j) {
    float a = b1[j];
    for (std::size_t k = 0; k < in; ++k) a += w1[j * in + k] * s.x[k];
    h[j] = std::tanh(a);
    y += w2[j] * h[j];
  }
  return y;
}

// Divides a unit's summed gradients by this rank's row count (a power of two: exact).
template <class G>
void mean_over(const G& grads, int rows) {
  const auto v = grads.view();
  for (std::size_t i = 0; i < v.num_tensors(); ++i)
    for (float& g : v.at(i)) g /= static_cast<float>(rows);
}

// tutorial:begin global_sum
template <class Comm>
double global_sum(Comm& comm, double v) {
  comm.all_reduce(&v, &v, 1, zero::reduce_op::sum);
  return v;
}
// tutorial:end

template <class Stage, class Comm>
void train(Comm& comm, const options& o) {
  const int rank = comm.rank(), ranks = comm.size();

  // tutorial:begin setup
  zero::model_spec spec;
  const zero::unit_id fc1 = spec.unit("fc1").tensor("w", {hidden, in}).tensor("b", {hidden});
  const zero::unit_id fc2 = spec.unit("fc2").tensor("w", {1, hidden}).tensor("b", {1});

  // Options are designated in declaration order (options.hpp): clip the global gradient norm to 0.5.
  const zero::engine_options eo{.clip_norm = 0.5f};
  zero::engine<Stage, Comm, zero::optim::adamw> e(comm, spec, zero::optim::adamw{.lr = peak_lr}, eo);
  // tutorial:end
  zero::checkpoint::async_saver saver;  // --save-async; declared after the engine, so destroyed first

  // tutorial:begin resume
  std::uint64_t t0 = 0;  // the first step of this run: 0, or where the checkpoint left off
  if (o.resume.empty()) {
    e.initialize([&](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
      const bool weight = t.name == "w";
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape.back()));  // 1/sqrt(fan_in)
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = weight ? static_cast<float>(bound * uniform(o.seed, u.name == "fc1" ? 1 : 2, i)) : 0.0f;
    });
  } else {
    zero::checkpoint::load(e, comm, o.resume);  // any world size and stage that saved it
    t0 = e.state().step + e.state().skipped_steps;
  }
  // tutorial:end

  // This rank's rows of the global batch.
  const int rows = batch / ranks, first = rank * rows;
  std::vector<sample> xs(static_cast<std::size_t>(rows));
  std::vector<float> h(static_cast<std::size_t>(rows) * hidden), dy(static_cast<std::size_t>(rows));

  const zero::warmup_cosine schedule = schedule_of(o.schedule_steps > 0 ? o.schedule_steps : o.steps);
  for (std::uint64_t t = t0; t < static_cast<std::uint64_t>(o.steps); ++t) {
    // tutorial:begin lr
    // The step's rate, applied from this step on (set between steps, before the first gather).
    const float lr = schedule.at(t);
    e.set_learning_rate(lr);
    // tutorial:end

    // tutorial:begin forward
    for (int i = 0; i < rows; ++i) xs[i] = make_sample(o.seed, 0, t * batch + static_cast<std::uint64_t>(first + i));
    double loss = 0.0;  // this rank's summed loss, for printing
    {
      auto p1 = e.gather(fc1);  // stage 3: a collective, every rank gathers the same units in the same order
      auto p2 = e.gather(fc2);
      for (int i = 0; i < rows; ++i) {
        const float y = forward(p1, p2, xs[i], &h[static_cast<std::size_t>(i) * hidden]);
        const float err = y - xs[i].y;
        loss += 0.5 * static_cast<double>(err) * err;
        // d(loss)/dy, times the loss scale (1 in fp32; what the 2-byte precisions scale by).
        dy[i] = err * e.loss_scale();
      }
    }  // the handles release both units
    // tutorial:end

    // tutorial:begin backward
    // Each rank writes the mean gradient of its own rows; reduce() sums over ranks and step()
    // divides by N, so the update sees the global batch's mean.
    {
      auto p2 = e.gather(fc2);  // the output layer's weights, for the hidden layer's gradient
      auto g2 = e.grads(fc2);  // zero at its first use in the step
      const auto w2 = p2["w"], gw2 = g2["w"], gb2 = g2["b"];
      std::vector<float> dpre(static_cast<std::size_t>(rows) * hidden);  // d(loss)/d(pre-activation)
      for (int i = 0; i < rows; ++i) {
        const float* hi = &h[static_cast<std::size_t>(i) * hidden];
        gb2[0] += fixed(dy[i]);
        for (std::size_t j = 0; j < hidden; ++j) {
          gw2[j] += fixed(dy[i] * hi[j]);
          dpre[i * hidden + j] = dy[i] * w2[j] * (1.0f - hi[j] * hi[j]);
        }
      }
      mean_over(g2, rows);
      p2.release();
      e.reduce(fc2);

      // The first layer's gradient needs its input and dpre, not its weights: no gather.
      auto g1 = e.grads(fc1);
      const auto gw1 = g1["w"], gb1 = g1["b"];
      for (int i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < hidden; ++j) {
          const float d = dpre[i * hidden + j];
          gb1[j] += fixed(d);
          for (std::size_t k = 0; k < in; ++k) gw1[j * in + k] += fixed(d * xs[i].x[k]);
        }
      mean_over(g1, rows);
      e.reduce(fc1);
    }
    const zero::step_report r = e.step();  // clips, then AdamW on this rank's shard
    // tutorial:end

    const std::uint64_t done = t + 1;
    // tutorial:begin eval
    if (o.eval_every > 0 && (done % static_cast<std::uint64_t>(o.eval_every) == 0 || done == std::uint64_t(o.steps))) {
      // Forward only, inside an evaluation() scope: its gathers are reported in comm().evaluation,
      // not in the next step's traffic, and grads(), reduce() and step() are refused until it ends.
      // In stage 3 gather is a collective, so every rank gathers even where it has no held-out rows.
      double eval_loss = 0.0;
      {
        const auto scope = e.evaluation();
        auto p1 = e.gather(fc1);
        auto p2 = e.gather(fc2);
        float hb[hidden];
        for (int i = rank; i < eval_rows; i += ranks) {
          const sample s = make_sample(o.seed, 1, static_cast<std::uint64_t>(i));
          const float err = forward(p1, p2, s, hb) - s.y;
          eval_loss += 0.5 * static_cast<double>(err) * err;
        }
      }  // the handles release both units, then the scope ends
      const double train_mean = global_sum(comm, loss) / batch;
      const double eval_mean = global_sum(comm, eval_loss) / eval_rows;
      if (rank == 0)
        std::printf("step %llu lr %.6f train_loss %.6f eval_loss %.6f grad_norm %.6f\n",
                    static_cast<unsigned long long>(done), static_cast<double>(lr), train_mean, eval_mean,
                    r.grad_norm);
    }
    // tutorial:end
    // tutorial:begin save
    if (!o.save.empty() && o.save_every > 0 && done % static_cast<std::uint64_t>(o.save_every) == 0 &&
        done < static_cast<std::uint64_t>(o.steps)) {  // the last step's save follows the loop
      if (!o.save_async) {
        zero::checkpoint::save(e, comm, o.save);  // a collective: every rank writes its slice
      } else {
        // Also a collective; it returns once each rank's state is copied, and its writer thread
        // writes the slice while training goes on. It first completes the previous save.
        const auto r = saver.save(e, comm, o.save);
        if (rank == 0)
          std::printf("save at step %llu: training held %.1f ms (%.1f of them waiting for the previous write)\n",
                      static_cast<unsigned long long>(done), 1e3 * (r.waited_seconds + r.snapshot_seconds),
                      1e3 * r.waited_seconds);
      }
    }
    // tutorial:end
  }
  if (!o.save.empty() && !o.save_async) zero::checkpoint::save(e, comm, o.save);
  if (!o.save.empty() && o.save_async) {
    saver.save(e, comm, o.save);
    saver.wait(e, comm);  // commits the last version: a run ends with its checkpoint complete
  }

  // tutorial:begin hash
  // The fingerprint of the trained model: the consolidated fp32 parameters, unit by unit (a
  // collective in stages 1-3). Equal at every stage, backend and power-of-two world size.
  std::uint64_t hash = zero::fnv1a64(nullptr, 0);
  for (zero::unit_id u : {fc1, fc2}) {
    const std::vector<float> p = e.full_params(u);
    hash = zero::fnv1a64(p.data(), p.size() * sizeof(float), hash);
  }
  if (rank == 0)
    std::printf("final step %llu param_hash %016llx\n", static_cast<unsigned long long>(e.steps()),
                static_cast<unsigned long long>(hash));
  // tutorial:end
}

// The stage is a type: one instantiation per stage, chosen at run time. The backend, threads or MPI,
// is one type (comm::any_backend), so each stage's engine is compiled once for both.
void run_stage(zero::comm::any_backend<zero::sys::host>&& comm, const options& o) {
  switch (o.stage) {
    case 0: return train<zero::stage0>(comm, o);
    case 1: return train<zero::stage1>(comm, o);
    case 2: return train<zero::stage2>(comm, o);
    default: return train<zero::stage3>(comm, o);
  }
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"A complete small training loop with ZeRO: an MLP on synthetic data, warm-up + cosine schedule, "
               "clipping, held-out evaluation, checkpoints and resume."};
  [[maybe_unused]] auto* ranks_flag =  // (read under MPI only)
      app.add_option_function<std::string>(
             "--ranks",
             [&o](const std::string& v) {
               o.ranks = toolcli::integer_value("--ranks", v, 1, 16);
               if ((o.ranks & (o.ranks - 1)) != 0)
                 throw CLI::ValidationError("--ranks", toolcli::quote(v) + " is not one of 1, 2, 4, 8, 16");
             },
             "number of ranks, 1, 2, 4, 8 or 16 (threads; under mpirun: the processes)")
          ->type_name("INT")
          ->default_str(std::to_string(o.ranks));
  toolcli::add_integer(app, "--stage", o.stage, 0, 3, "ZeRO stage");
  toolcli::add_integer(app, "--steps", o.steps, 1, 1000000, "train until this step (a resumed run continues to it)");
  auto* schedule_flag = toolcli::add_integer(
      app, "--schedule-steps", o.schedule_steps, 0, 1000000,
      "the length of the learning-rate schedule, the same in every part of an interrupted run (0: --steps)");
  app.add_option("--backend", o.backend, "threads: ranks as threads; mpi: one rank per MPI process")
      ->check(toolcli::one_of({"threads", "mpi"}))
      ->capture_default_str();
  auto* save_flag = app.add_option("--save", o.save,
                                   "checkpoint directory written at the end (and every --save-every steps), created "
                                   "with its parents before training")
                        ->check(toolcli::checked(toolcli::save_directory_problem, "DIR"));
  app.add_option("--resume", o.resume, "checkpoint directory to continue from (any world size and stage)")
      ->check(toolcli::checked([](const std::string& t) { return toolcli::input_problem(t, S_IFDIR); }, "DIR"));
  toolcli::add_integer(app, "--eval-every", o.eval_every, 0, 1000000,
                       "evaluate on the held-out split every K steps (0: never)");
  toolcli::add_integer(app, "--save-every", o.save_every, 1, 1000000, "save to --save every K steps (needs --save)")
      ->default_str("")
      ->needs(save_flag);
  app.add_flag("--save-async", o.save_async,
               "write the checkpoints in the background while training goes on (zero::checkpoint::async_saver)")
      ->needs(save_flag);
  app.add_option_function<std::string>(
         "--seed", [&o](const std::string& v) { o.seed = toolcli::uint64_flag("--seed", v); },
         "seed of the data and the initial weights, a decimal integer in [0, 2^64 - 1]")
      ->type_name("UINT")
      ->default_str(std::to_string(o.seed));
  if (const auto code = toolcli::parse(app, argc, argv)) return *code;
  // The schedule warms up over its first `warmup` steps, then decays to its end: a shorter one
  // would be refused by the library after the engine is built; a run past its end learns nothing.
  const int schedule_steps = o.schedule_steps > 0 ? o.schedule_steps : o.steps;
  if (schedule_steps < warmup)
    return toolcli::usage_error(
        app, std::string(schedule_flag->count() > 0 ? "--schedule-steps " : "--steps ") +
                 std::to_string(schedule_steps) + ": the learning-rate schedule warms up over its first " +
                 std::to_string(warmup) + " steps, so it must be at least " + std::to_string(warmup) + " steps long");
  if (o.schedule_steps > 0 && o.schedule_steps < o.steps)
    return toolcli::usage_error(app, "--schedule-steps " + std::to_string(o.schedule_steps) + " ends before --steps " +
                                         std::to_string(o.steps) +
                                         ": the steps after it would train at the schedule's final rate, 0");

  try {
    if (o.backend == "mpi") {
#if ZERO_WITH_MPI
      zero::comm::mpi_session session(argc, argv);  // MPI_Init here, MPI_Finalize when main returns
      const int world = session.world_size();
      if ((ranks_flag->count() > 0 && o.ranks != world) || batch % world != 0 || (world & (world - 1)) != 0) {
        if (session.world_rank() == 0)
          std::fprintf(stderr, "train_loop: under mpirun the ranks are the %d processes: a power of two that "
                               "divides the batch %d, and --ranks, if given, must say the same\n", world, batch);
        return toolcli::usage_exit;
      }
      zero::comm::mpi::run(
          [&](zero::comm::mpi& comm) { run_stage(zero::comm::any_backend<zero::sys::host>(comm), o); });
#else
      return toolcli::usage_error(
          app, "--backend mpi: this train_loop was built without MPI (configure with -Dmpi=enabled)");
#endif
    } else {
      zero::comm::threads::launch(
          o.ranks, [&](zero::comm::threads& comm) { run_stage(zero::comm::any_backend<zero::sys::host>(comm), o); });
    }
  } catch (...) {
    // Whatever a name in it came from (a checkpoint, a path), the message is escaped.
    std::fprintf(stderr, "train_loop: %s\n",
                 toolcli::printable_message(zero::as_error(std::current_exception()).what()).c_str());
    return 1;
  }
  return 0;
}
