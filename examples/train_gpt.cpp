// train_gpt: trains a small character-level GPT on this repository's docs with ZeRO stage 0-3 on N ranks, then evaluates and samples it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "char_corpus.hpp"
#include "gpt.hpp"
#include "run_log.hpp"
#include "trainer_checkpoint.hpp"
#include "trainer_cli.hpp"
#include "trainer_elastic.hpp"
#include "zero/comm/any_backend.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/engine/activation_store.hpp"
#include "zero/zero.hpp"
#if ZERO_WITH_MPI
#include "zero/comm/backends/mpi.hpp"
#endif

namespace {

using trainer::options;

// The flags of this trainer besides trainer_cli.hpp's common ones (--layers, --batch and --seed of
// those are the model's too).
struct gpt_options {
  gpt::config model;
  int tp = 1;  // --tp: ranks per tensor-parallel group (Megatron's layout; 1: none)
  bool sequence_parallel = false;  // --sequence-parallel: the residual stream split by rows over the group
  // --checkpoint-activations: each block's input kept "whole" on every rank, or as ZeRO-R's "pa" (this
  // rank's 1 / tp of it) or "pa-cpu" (that slice in host memory); "": no checkpointing.
  std::string checkpoint_activations;
  std::size_t gather_bucket_elements = 0;  // --gather-bucket-elements: stage 3's gathers fused (CB)
  std::vector<std::string> data;  // empty: this repository's README.md and docs/
  double held_out = 0.1;
  // AdamW's second-moment decay: 0.99 rather than the library's 0.999, as nanoGPT sets it for its
  // small character models: with few tokens per step the gradient scale adapts 10x faster.
  float beta2 = 0.99f;
  // AdamW's learning rate without --lr (the library's 1e-3 learns too slowly for the default run;
  // 3e-3 and more stalls this model without a warmup). SGD keeps trainer_cli's default.
  float adamw_lr = 2e-3f;
  // LAMB's (with AdamW's --beta2): its steps are each tensor's ||w|| times lr over the tensor's
  // update norm, about lr x the weights' RMS per element, so its rates are larger than AdamW's.
  float lamb_lr = 1e-2f;
  // Muon's: the library's 0.02 for the matrices, and AdamW's rate above for every other tensor
  // (adamw_lr_scale = adamw_lr / muon_lr), with AdamW's --beta2.
  float muon_lr = 2e-2f;
  // --warmup K: the rate rises linearly over K steps, then decays along a cosine to a tenth of it at
  // the run's last step (zero::warmup_cosine); 0: a constant rate.
  int warmup = 0;
  std::size_t eval_windows = 256;
  int sample = 240;
  float temperature = 0.8f;
  std::string prompt = "The engine ";
};

// What a run reports beyond trainer::summary.
struct gpt_summary {
  trainer::summary base;
  double loss_train_eval = 0, loss_held_out = 0, accuracy_held_out = 0;
  std::string sample;
  std::vector<std::uint64_t> unit_padded;  // the padded size of each unit, in declaration order
  std::uint64_t comm_paper_formula = 0;    // the paper's bytes per step, one gather per unit and pass
  std::uint64_t eval_comm_bytes = 0, eval_comm_formula = 0;  // evaluation and sampling: measured, formula per pass
  std::uint64_t eval_passes = 0;           // forward passes in the evaluation scope
  std::uint64_t block_activation_bytes = 0;  // the largest rank's block activations of a micro-batch
  // --checkpoint-activations: the store's bytes and traffic (the largest rank's), and its plan.
  zero::activation_memory checkpoint_memory;
  zero::activation_traffic checkpoint_traffic;  // the last step's
  zero::activation_plan checkpoint_plan;        // one micro-batch's loop
  // The engine against its plan (zero::plan of this rank's pieces, the loop train_step runs): the step's
  // transient peak and traffic; stage 3's all-gathers per step and the gather buckets among them.
  std::uint64_t plan_transient_peak = 0, plan_step_bytes = 0, plan_all_gathers = 0;
  std::uint64_t all_gathers_last_step = 0, gather_buckets = 0;
};

zero::activation_mode checkpoint_mode_of(const std::string& flag) {
  if (flag == "pa") return zero::activation_mode::partitioned;
  if (flag == "pa-cpu") return zero::activation_mode::partitioned_cpu;
  return zero::activation_mode::none;
}

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
void train(Comm& comm, const options& o, const gpt_options& g, const gpt::corpus& data, const Opt& opt,
           gpt_summary& out) {
  const gpt::config& c = g.model;
  trainer::summary& s = out.base;
  const auto setup_start = std::chrono::steady_clock::now();
  const double setup_cpu_start = trainer::thread_cpu_seconds();
  // tutorial:begin engine
  const zero::model_spec spec = gpt::make_spec(c);
  // --clip (the global gradient norm's limit), --accum (reduce() calls per unit per step),
  // --memory-limit (bytes a rank may hold: model states are checked before they are allocated)
  zero::engine_options eo = trainer::engine_options_of(o);
  eo.gather_bucket_elements = g.gather_bucket_elements;  // --gather-bucket-elements (stage 3)
  // No weight decay for biases and norms; Muon's embeddings on its AdamW (gpt.hpp).
  eo.param_groups = gpt::param_groups(zero::MatrixOptimizer<Opt>);
  // --offload disk under --memory-limit: the largest slice that fits, planned for this rank's pieces.
  eo.offload.slice_elements = trainer::offload_slice_of(o, eo, comm.rank(), [&](const zero::engine_options& x) {
    return zero::plan(spec.piece(g.tp, 0), comm.size() / g.tp, Stage::stage, zero::plan_precision::of<Prec>(),
                      zero::plan_optimizer::of<Opt>(), x, comm.overlaps());
  });
  // --tp T > 1: the ranks as an (N / T) x T mesh (comm::mesh). The engine runs ZeRO over this rank's
  // data-parallel group, on its pieces of the model; the blocks sum their partial activations over
  // its tensor-parallel group. T = 1: the engine over all ranks, every rank data-parallel.
  std::optional<zero::comm::mesh<Comm>> mesh;
  if (g.tp > 1) mesh.emplace(comm, zero::comm::mesh_shape{.dp = comm.size() / g.tp, .tp = g.tp});
  using engine = zero::engine<Stage, Comm, Opt, Prec>;
  engine e = mesh ? engine(*mesh, spec, opt, eo) : engine(comm, spec, opt, eo);
  Comm& dp = mesh ? mesh->dp() : comm;
  const gpt::tp_group tp = mesh ? gpt::tp_group(mesh->tp(), g.sequence_parallel) : gpt::tp_group();
  // --checkpoint-activations: the blocks' inputs in a store over the tensor-parallel group (activation_store),
  // the blocks recomputed in the backward pass.
  std::optional<zero::activation_store<Comm>> store;
  gpt::block_checkpoints checkpoints;
  if (!g.checkpoint_activations.empty()) {
    store.emplace(mesh ? mesh->tp() : comm, checkpoint_mode_of(g.checkpoint_activations));
    checkpoints = gpt::block_checkpoints(*store);
  }
  // A resumed run continues from the checkpoint's weights, optimizer state and step, whatever world
  // size and stage saved it; otherwise each rank initializes the part it holds (of its pieces).
  const std::uint64_t t0 = trainer::resume_or_initialize(e, comm, o, zero::from_whole_tensors(gpt::initializer(c)));
  // tutorial:end
  s.setup_cpu_seconds = global_max(comm, trainer::thread_cpu_seconds() - setup_cpu_start);
  s.setup_seconds =
      global_max(comm, std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count());
  const int rank = dp.rank(), ranks = dp.size();  // the data-parallel ranks: they split the batch
  const double tokens_per_step = static_cast<double>(c.batch) * c.context;
  const auto start = std::chrono::steady_clock::now();
  auto last_print = start;
  s.first_step = t0;
  s.last_step = t0;
  trainer::step_traffic step_bytes;  // what the summary reports as the step's traffic
  const zero::warmup_cosine schedule{.peak = opt.lr,
                                     .min = zero::fp::mul(opt.lr, 0.1f),
                                     .warmup = static_cast<std::uint64_t>(g.warmup),
                                     .total = std::max<std::uint64_t>(t0 + static_cast<std::uint64_t>(o.steps), 1)};
  if (g.warmup > 0) schedule.validate();
  // --log FILE: the run's settings, then one JSON line per step (run_log.hpp), from world rank 0.
  std::optional<trainer::run_log> log;
  trainer::checkpoints saves;           // --save-every and the last --save, blocking or --save-async
  trainer::line_printer notes{stderr};  // the saves' reports, from world rank 0
  if (comm.rank() == 0 && !o.log.empty()) {
    log.emplace(o.log, trainer::log_mode_of(o), "tokens");
    log->run("train_gpt", o, e, t0,
             {{"batch", c.batch},
              {"warmup", g.warmup},
              {"lr", opt.lr},
              {"model", {{"layers", c.layers}, {"embd", c.embd}, {"heads", c.heads}, {"context", c.context}}},
              {"tp", g.tp}});
  }
  for (int i = 0; i < o.steps; ++i) {
    if (g.warmup > 0) e.set_learning_rate(schedule.at(e.steps()));
    const auto step_start = std::chrono::steady_clock::now();
    trainer::step_begins(o, comm.rank(), t0 + static_cast<std::uint64_t>(i));  // --fail: a planted failure
    // tutorial:begin loop
    const std::uint64_t t = t0 + static_cast<std::uint64_t>(i);  // the data position: the step since the start
    if (store) store->reset_traffic();
    const auto r = gpt::train_step(e, c, tp, data, t, rank, ranks, o.accum, checkpoints);
    saves.after_step(e, comm, o, i);  // --save-every K: a checkpoint every K steps (--save-async: in the background)
    // tutorial:end
    trainer::peer_snapshot_after(e, comm, o, i);  // --elastic --snapshot-every K: the state in the ranks' memory
    trainer::report(saves, comm.rank() == 0 ? &notes : nullptr, log ? &*log : nullptr);
    const double loss = global_sum(dp, r.loss) / ranks;
    const double correct = global_sum(dp, r.correct);
    if (i == 0) s.loss_first = loss;
    out.block_activation_bytes = static_cast<std::uint64_t>(global_max(comm, static_cast<double>(r.block_activation_bytes)));
    s.loss_last = loss;
    s.accuracy_last = correct / tokens_per_step;
    s.grad_norm = r.report.grad_norm;
    s.loss_scale = r.report.loss_scale;
    s.overflow_steps += r.report.skipped ? 1 : 0;
    step_bytes.add(r.report);
    s.last_step = t + 1;
    trainer::step_done(o, comm.rank(), t + 1);
    const auto now = std::chrono::steady_clock::now();
    if (log) {
      trainer::step_record rec = trainer::engine_record(e, r.report);
      rec.step = t + 1;
      rec.loss = loss;
      rec.accuracy = s.accuracy_last;
      rec.elapsed_s = std::chrono::duration<double>(now - start).count();
      rec.step_ms = std::chrono::duration<double>(now - step_start).count() * 1e3;
      rec.items_per_s = rec.step_ms > 0 ? tokens_per_step / (rec.step_ms * 1e-3) : 0.0;
      log->step(rec);
    }
    if (rank == 0 && (now - last_print > std::chrono::milliseconds(500) || i + 1 == o.steps || i == 0)) {
      const double secs = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "step %5llu/%llu  loss %.4f  acc %.3f  %.0f tokens/s%s\n",
                   static_cast<unsigned long long>(t + 1), static_cast<unsigned long long>(t0 + o.steps), loss,
                   s.accuracy_last, secs > 0 ? (i + 1) * tokens_per_step / secs : 0.0,
                   r.report.skipped ? "  (skipped: non-finite gradients)" : "");
      last_print = now;
    }
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (store) {
    // One micro-batch's checkpoints: its rows' residual stream per block (this rank's rows with sequence
    // parallelism), in fp32, restored with the next one prefetched.
    const int rows = c.batch / ranks / o.accum;
    const bool split_rows = tp.splits_rows(rows * c.context);
    const std::uint64_t elements = static_cast<std::uint64_t>(rows) * c.context * c.embd / (split_rows ? g.tp : 1);
    out.checkpoint_plan = zero::plan_activations(static_cast<std::uint64_t>(c.layers), elements, sizeof(float), g.tp,
                                                 store->mode(), true);
    const auto m = store->memory();
    const auto tr = store->traffic();
    const auto most = [&](std::uint64_t v) { return static_cast<std::uint64_t>(global_max(comm, static_cast<double>(v))); };
    out.checkpoint_memory.peak_saved = most(m.peak_saved);
    out.checkpoint_memory.peak_host = most(m.peak_host);
    out.checkpoint_memory.peak_restored = most(m.peak_restored);
    out.checkpoint_memory.peak_system = most(m.peak_system);
    out.checkpoint_memory.saved = most(m.saved + m.host + m.restored);  // held after the run: 0
    out.checkpoint_traffic.gather.calls[static_cast<std::size_t>(zero::comm::collective::all_gather)] =
        most(tr.gather.calls[static_cast<std::size_t>(zero::comm::collective::all_gather)]);
    out.checkpoint_traffic.gather.bytes[static_cast<std::size_t>(zero::comm::collective::all_gather)] =
        most(tr.gather.total_bytes());
    out.checkpoint_traffic.to_host_bytes = most(tr.to_host_bytes);
    out.checkpoint_traffic.from_host_bytes = most(tr.from_host_bytes);
    out.checkpoint_traffic.saves = most(tr.saves);
    out.checkpoint_traffic.restores = most(tr.restores);
    out.checkpoint_traffic.prefetches = most(tr.prefetches);
  }
  // The step's traffic and memory before evaluation adds its own gathers and buffers.
  const auto& mem = e.memory();
  s.model_state_bytes = global_max(comm, static_cast<double>(mem.model_state_bytes()));
  s.model_state_formula = static_cast<double>(e.model_state_formula_bytes());
  for (int k = 0; k < zero::mem_category_count; ++k)
    s.by_category[k] = global_max(comm, static_cast<double>(mem.current[k]));
  s.transient_peak = global_max(comm, static_cast<double>(mem.peak[static_cast<int>(zero::mem_category::transient)]));
  s.comm_bytes = global_max(comm, static_cast<double>(step_bytes.bytes));
  {
    const auto ag = static_cast<std::size_t>(zero::comm::collective::all_gather);
    const zero::plan_report p = zero::plan(spec.piece(g.tp, mesh ? mesh->coordinates().tp : 0), ranks, Stage::stage,
                                           zero::plan_precision::of<Prec>(), zero::plan_optimizer::of<Opt>(), eo,
                                           comm.overlaps());
    out.plan_transient_peak = static_cast<std::uint64_t>(global_max(comm, static_cast<double>(p.step_transient_peak)));
    out.plan_step_bytes = static_cast<std::uint64_t>(global_max(comm, static_cast<double>(p.step_bytes_sent())));
    out.plan_all_gathers = static_cast<std::uint64_t>(global_max(comm, static_cast<double>(p.step_comm.calls[ag])));
    out.all_gathers_last_step =
        static_cast<std::uint64_t>(global_max(comm, static_cast<double>(e.comm().last_step.calls[ag])));
    out.gather_buckets = static_cast<std::uint64_t>(global_max(comm, static_cast<double>(e.overlap().gather_buckets)));
  }
  s.comm_formula = static_cast<double>(e.comm_formula_bytes());
  s.exchange_bytes = global_max(comm, static_cast<double>(step_bytes.exchange));
  s.exchange_formula = static_cast<double>(e.optimizer_exchange_formula_bytes());
  trainer::offload_summary(e, s, [&](double v) { return global_max(comm, v); });
  s.comm_inter_bytes = global_max(comm, static_cast<double>(step_bytes.inter));
  s.comm_inter_formula = static_cast<double>(e.comm_formula_by_level().inter);
  for (std::size_t u = 0; u < spec.num_units(); ++u) out.unit_padded.push_back(e.layout().unit(zero::unit_id{u}).padded);
  // The formula counts wte's second gathers (declared with gathers(2)); the paper's counts one per pass.
  out.comm_paper_formula = zero::formula::comm_bytes_per_step(Stage::stage, e.layout().padded(), ranks,
                                                              sizeof(typename Prec::comm_type), o.accum);

  // Evaluation: the held-out windows, and as many spread over the training part. Forward passes only,
  // in an evaluation scope: their gathers are reported apart from the steps' (comm().evaluation).
  {
    auto ev = e.evaluation();
    const auto held = gpt::eval_windows(data.train_end, data.tokens.size(), c.context, g.eval_windows);
    const auto train_part = gpt::eval_windows(0, data.train_end, c.context, held.size());
    const int chunk = std::max(1, c.batch / ranks);
    out.loss_train_eval = gpt::evaluate(e, dp, c, tp, data, train_part, chunk).first;
    std::tie(out.loss_held_out, out.accuracy_held_out) = gpt::evaluate(e, dp, c, tp, data, held, chunk);
    if (g.sample > 0) out.sample = gpt::generate(e, c, tp, data, g.prompt, g.sample, g.temperature, c.seed);
    // Each evaluate() makes ceil(ceil(windows / N) / chunk) passes; generate() one per byte.
    const auto passes = [&](std::size_t windows) {
      const std::size_t per_rank = (windows + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
      return (per_rank + static_cast<std::size_t>(chunk) - 1) / static_cast<std::size_t>(chunk);
    };
    out.eval_passes = passes(train_part.size()) + passes(held.size()) + static_cast<std::size_t>(std::max(g.sample, 0));
  }
  out.eval_comm_bytes = e.comm().evaluation.total_bytes();
  out.eval_comm_formula = e.eval_comm_formula_bytes();

  // The hash of the whole model's parameters in declaration order (at tp > 1 the pieces put together:
  // the hash a tp = 1 run with the same values prints). padded: this rank's pieces, the engine's Psi.
  if (mesh) {
    const std::vector<float> whole = e.full_model_params();
    s.param_hash = zero::fnv1a64(whole.data(), whole.size() * sizeof(float));
  } else {
    s.param_hash = mlp::param_hash(e);
  }
  s.padded = e.layout().padded();
  s.numel = spec.numel();
  s.param_groups = trainer::describe_param_groups(spec, eo.param_groups);
  // tutorial:begin finish
  trainer::finish(e, comm, o, saves);  // --save DIR: a checkpoint of the end; --export FILE: its weights as safetensors
  // tutorial:end
  trainer::report(saves, comm.rank() == 0 ? &notes : nullptr, log ? &*log : nullptr);
  s.checkpoints = saves.summary();
}

// tutorial:begin dispatch
// This trainer's changes to the optimizers trainer_cli makes from the flags: AdamW's (with fp32 or bf16
// moments), LAMB's and Muon's --beta2 and, without --lr, their own rates.
template <class O>
void tune(O& opt, const gpt_options& g, const options& o) {
  if constexpr (std::is_same_v<O, zero::optim::adamw> || std::is_same_v<O, zero::optim::adamw_bf16>) {
    opt.beta2 = g.beta2;
    if (o.lr == 0) opt.lr = g.adamw_lr;
  }
  if constexpr (std::is_same_v<O, zero::optim::lamb>) {
    opt.beta2 = g.beta2;
    if (o.lr == 0) opt.lr = g.lamb_lr;
  }
  if constexpr (std::is_same_v<O, zero::optim::muon>) {
    opt.beta2 = g.beta2;
    if (o.lr == 0) opt.lr = g.muon_lr;
    opt.adamw_lr_scale = g.adamw_lr / g.muon_lr;
  }
}

// The flags --stage, --optimizer and --precision become the engine's template arguments here, once.
// comm: threads or MPI behind one type, so that each engine is compiled once for both.
void dispatch(zero::comm::any_backend<zero::sys::host>& comm, const options& o, const gpt_options& g,
              const gpt::corpus& data, gpt_summary& out) {
  trainer::with_printable_errors([&] {
    trainer::dispatch(o, [&]<class S, class O, class P>(const O& opt) {
      O tuned = opt;
      tune(tuned, g, o);
      train<S, O, P>(comm, o, g, data, tuned, out);
    });
  });
}
// tutorial:end

// The default corpus: README.md and docs/ of this repository, found in the source tree the build was
// configured from (ZERO_SOURCE_ROOT, from Meson), or else two levels above the executable (a build
// directory inside the source tree, as build/examples/train_gpt).
std::vector<std::string> default_corpus(std::string& tried) {
  namespace fs = std::filesystem;
  std::vector<fs::path> roots;
#ifdef ZERO_SOURCE_ROOT
  roots.emplace_back(ZERO_SOURCE_ROOT);
#endif
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(exe.parent_path().parent_path().parent_path());
  for (const auto& r : roots) {
    if (fs::is_regular_file(r / "README.md", ec) && fs::is_directory(r / "docs", ec))
      return {(r / "README.md").string(), (r / "docs").string()};
    tried += (tried.empty() ? "" : ", ") + r.string();
  }
  return {};
}

// Text of the corpus's bytes (the prompt, the sample) as it may reach a terminal: a corpus may hold
// any byte but NUL, so control characters and cut UTF-8 sequences are escaped; newlines stay.
std::string shown(const std::string& text) {
  return zero::checkpoint::printable(text, text.size(), zero::checkpoint::printable_mode::message);
}

// Why --tp cannot split `ranks` ranks, or "" (`ranks_text` names them).
std::string tp_problem(int tp, int ranks, const std::string& ranks_text) {
  if (ranks % tp == 0) return "";
  return "--tp " + std::to_string(tp) + " must divide " + ranks_text + ": the ranks form groups of --tp";
}

// The data-parallel ranks as a usage message names them: "--ranks 4", or "the 2 data-parallel ranks
// (--ranks 4 / --tp 2)".
std::string data_parallel_text(int tp, const std::string& ranks_name, int ranks) {
  if (tp == 1) return ranks_name + " " + std::to_string(ranks);
  return "the " + std::to_string(ranks / tp) + " data-parallel ranks (" + ranks_name + " " + std::to_string(ranks) +
         " / --tp " + std::to_string(tp) + ")";
}

void print_gpt_summary(const options& o, const gpt_options& g, const gpt::corpus& data, const gpt_summary& s) {
  trainer::print_summary(o, s.base);
  if (g.tp > 1)
    std::printf("  tensor parallel: %d x %d ranks (data x tensor); the %llu parameters are the whole model's, "
                "Psi = %llu the padded pieces of tensor-parallel rank 0, which ZeRO partitions over %d ranks\n",
                o.ranks / g.tp, g.tp, static_cast<unsigned long long>(s.base.numel),
                static_cast<unsigned long long>(s.base.padded), o.ranks / g.tp);
  const double entropy_train = gpt::unigram_entropy(data, 0, data.train_end);
  const double entropy_held = gpt::unigram_entropy(data, data.train_end, data.tokens.size());
  std::printf("  tied weight 'wte' (padded %llu) is declared gathered twice per pass: the traffic formula above "
              "counts its second gathers, %llu bytes beyond the paper's %llu (stage 3 only)\n",
              static_cast<unsigned long long>(s.unit_padded[gpt::wte.index]),
              static_cast<unsigned long long>(static_cast<std::uint64_t>(s.base.comm_formula) - s.comm_paper_formula),
              static_cast<unsigned long long>(s.comm_paper_formula));
  std::printf("  evaluation and sampling: %llu forward passes sent %llu bytes per rank (formula: %llu per pass), "
              "not counted in the steps'\n",
              static_cast<unsigned long long>(s.eval_passes), static_cast<unsigned long long>(s.eval_comm_bytes),
              static_cast<unsigned long long>(s.eval_comm_formula));
  if (!g.checkpoint_activations.empty()) {
    const auto& m = s.checkpoint_memory;
    const auto& p = s.checkpoint_plan;
    std::printf("  activation checkpoints (%s): %d blocks' inputs of %llu elements, %llu kept per rank; bytes held "
                "per rank: %llu in the system's memory, %llu in host memory, %llu restored at once (plan: %llu, %llu, "
                "%llu)\n",
                g.checkpoint_activations.c_str(), g.model.layers, static_cast<unsigned long long>(p.elements),
                static_cast<unsigned long long>(p.kept_elements), static_cast<unsigned long long>(m.peak_saved),
                static_cast<unsigned long long>(m.peak_host), static_cast<unsigned long long>(m.peak_restored),
                static_cast<unsigned long long>(p.saved_bytes), static_cast<unsigned long long>(p.host_bytes),
                static_cast<unsigned long long>(p.peak_restored_bytes));
  }
  std::printf("  %.1f ms per step, %.0f tokens/s\n", o.steps > 0 ? 1e3 * s.base.seconds / o.steps : 0.0,
              s.base.seconds > 0 ? o.steps * double(g.model.batch) * g.model.context / s.base.seconds : 0.0);
  std::printf("  corpus: %zu files, %zu bytes, vocabulary %d; %zu tokens for training, %zu held out\n",
              data.files.size(), data.text.size(), data.vocab_size(), data.train_size(), data.held_out_size());
  std::printf("  loss (nats per byte): train %.4f, held out %.4f (accuracy %.1f%%); unigram entropy: train %.4f, "
              "held out %.4f\n",
              s.loss_train_eval, s.loss_held_out, 100.0 * s.accuracy_held_out, entropy_train, entropy_held);
  if (g.sample > 0)
    std::printf("  sample (temperature %g, seed %llu):\n%s%s\n", g.temperature,
                static_cast<unsigned long long>(g.model.seed), shown(g.prompt).c_str(), shown(s.sample).c_str());
}

nlohmann::json gpt_json(const options& o, const gpt_options& g, const gpt::corpus& data, const gpt_summary& s) {
  nlohmann::json j = trainer::summary_json(o, s.base);
  const auto& c = g.model;
  j["model"] = {{"vocab", c.vocab}, {"context", c.context}, {"embd", c.embd}, {"heads", c.heads},
                {"layers", c.layers}, {"batch", c.batch}};
  j["tp"] = g.tp;
  j["dp"] = o.ranks / g.tp;
  j["sequence_parallel"] = g.sequence_parallel;
  j["block_activation_bytes"] = s.block_activation_bytes;
  j["gather_bucket_elements"] = g.gather_bucket_elements;
  j["gather_buckets"] = s.gather_buckets;
  j["all_gathers_last_step"] = s.all_gathers_last_step;
  j["plan"] = {{"transient_peak_bytes", s.plan_transient_peak},
               {"step_bytes", s.plan_step_bytes},
               {"all_gathers_per_step", s.plan_all_gathers}};
  if (!g.checkpoint_activations.empty()) {
    // Measured (the largest rank's; traffic: the last step's, --accum loops) beside the plan of one loop.
    const auto& m = s.checkpoint_memory;
    const auto& t = s.checkpoint_traffic;
    const auto& p = s.checkpoint_plan;
    const auto ag = static_cast<std::size_t>(zero::comm::collective::all_gather);
    j["activation_checkpoints"] = {
        {"mode", g.checkpoint_activations},
        {"elements_per_checkpoint", p.elements},
        {"kept_elements_per_checkpoint", p.kept_elements},
        {"measured",
         {{"peak_saved_bytes", m.peak_saved},
          {"peak_host_bytes", m.peak_host},
          {"peak_restored_bytes", m.peak_restored},
          {"peak_system_bytes", m.peak_system},
          {"held_at_end_bytes", m.saved},
          {"gather_bytes_per_step", t.gather.bytes[ag]},
          {"gathers_per_step", t.gather.calls[ag]},
          {"to_host_bytes_per_step", t.to_host_bytes},
          {"from_host_bytes_per_step", t.from_host_bytes},
          {"saves_per_step", t.saves},
          {"restores_per_step", t.restores},
          {"prefetches_per_step", t.prefetches}}},
        {"plan_per_micro_batch",
         {{"saved_bytes", p.saved_bytes},
          {"host_bytes", p.host_bytes},
          {"peak_restored_bytes", p.peak_restored_bytes},
          {"peak_system_bytes", p.peak_system_bytes},
          {"gather_bytes", p.gather.total_bytes()},
          {"gathers", p.gather.calls[ag]},
          {"to_host_bytes", p.to_host_bytes},
          {"from_host_bytes", p.from_host_bytes}}}};
  }
  j["corpus"] = {{"files", data.files.size()}, {"bytes", data.text.size()}, {"train_tokens", data.train_size()},
                 {"held_out_tokens", data.held_out_size()}};
  j["loss_train_eval"] = s.loss_train_eval;
  j["loss_held_out"] = s.loss_held_out;
  j["accuracy_held_out"] = s.accuracy_held_out;
  j["unigram_entropy_train"] = gpt::unigram_entropy(data, 0, data.train_end);
  j["unigram_entropy_held_out"] = gpt::unigram_entropy(data, data.train_end, data.tokens.size());
  j["ms_per_step"] = o.steps > 0 ? 1e3 * s.base.seconds / o.steps : 0.0;
  j["tokens_per_second"] = s.base.seconds > 0 ? o.steps * double(c.batch) * c.context / s.base.seconds : 0.0;
  nlohmann::json units = nlohmann::json::array();
  const zero::model_spec spec = gpt::make_spec(c);
  for (std::size_t u = 0; u < spec.num_units(); ++u)
    units.push_back({{"name", spec.units()[u].name}, {"numel", spec.units()[u].numel}, {"padded", s.unit_padded[u]},
                     {"gathers", spec.units()[u].gathers}});
  j["units"] = units;
  j["tied_unit"] = spec.units()[gpt::wte.index].name;
  j["comm_paper_formula_bytes"] = s.comm_paper_formula;
  j["eval_passes"] = s.eval_passes;
  j["eval_comm_bytes_per_rank"] = s.eval_comm_bytes;
  j["eval_comm_formula_bytes_per_pass"] = s.eval_comm_formula;
  j["sample"] = s.sample;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.backend = "threads";
  o.steps = 1000;
  o.model.layers = 2;
  o.model.batch = 16;
  gpt_options g;
  CLI::App app{"Train a small character-level GPT on this repository's documentation with ZeRO on N ranks: threads "
               "of this process (comm::threads) or MPI processes started by mpirun (comm::mpi)."};
  [[maybe_unused]] auto* ranks_flag = toolcli::add_integer(
      app, "--ranks", o.ranks, 1, 1024, "number of ranks (with --backend mpi: the communicator's size)");
  app.add_option("--backend", o.backend, "threads: ranks as threads of this process; mpi: one rank per MPI process")
      ->check(toolcli::one_of({"threads", "mpi"}))
      ->capture_default_str();
  toolcli::add_double(app, "--comm-timeout", o.comm_timeout, 0.001, 7 * 86400.0,
                      "seconds a rank waits in a collective for its peers before the run fails with an error naming "
                      "the call and the ranks that did not arrive");
  trainer::add_common_flags(app, o);
  // The MLP's shape flags do not apply; --layers and --batch mean the GPT's blocks and sequences.
  for (const char* name : {"--hidden", "--in", "--classes"}) app.remove_option(app.get_option(name));
  app.get_option("--layers")->description("transformer blocks");
  app.get_option("--batch")->description("global batch in sequences of --context bytes, a multiple of the ranks "
                                         "times --accum");
  app.get_option("--lr")->description("learning rate, in (0, 1000] as a 32-bit float (default: " +
                                      trainer::default_rates([&](auto& opt) { tune(opt, g, options{}); }) + ")");
  toolcli::add_integer(app, "--embd", g.model.embd, 1, 1 << 16, "channels of the residual stream");
  toolcli::add_integer(app, "--heads", g.model.heads, 1, 1 << 10, "attention heads (they split --embd)");
  toolcli::add_integer(app, "--context,--block", g.model.context, 1, 1 << 16,
                       "positions per sequence (the block size)");
  toolcli::add_integer(app, "--tp", g.tp, 1, 1024,
                       "ranks per tensor-parallel group (Megatron's layout: attention heads and the MLP split over "
                       "them); it divides the ranks and --heads, and ZeRO runs over the ranks / --tp data-parallel "
                       "ranks");
  app.add_flag("--sequence-parallel", g.sequence_parallel,
               "with --tp: the residual stream between the blocks' tensor-parallel layers (layer norms, residual "
               "additions) split along the rows over the group, reduce-scatters and all-gathers in place of the sums; "
               "the same bits as --tp alone, 1 / --tp of those activations per rank");
  app.add_option("--checkpoint-activations", g.checkpoint_activations,
                 "keep only each block's input in the forward pass and recompute the block in the backward pass (the "
                 "same bits): whole (every rank keeps it), pa (ZeRO-R's Pa: each rank of the tensor-parallel group "
                 "keeps 1 / --tp of it, all-gathered back) or pa-cpu (Pa+cpu: that slice in host memory)")
      ->check(toolcli::one_of({"whole", "pa", "pa-cpu"}));
  toolcli::add_integer(app, "--gather-bucket-elements", g.gather_bucket_elements, std::size_t{0}, std::size_t{1} << 40,
                       "stage 3: the units the recorded order gathers next, up to this many padded elements, in one "
                       "all-gather (ZeRO-R's constant-size buffers; the same bits); 0: unit by unit; other stages: "
                       "no effect");
  app.add_option("--data", g.data,
                 "text files (any byte but NUL; not empty), or directories whose *.md and *.txt files are read in "
                 "name order (default: this repository's README.md and docs/)")
      ->check(toolcli::checked(
          [](const std::string& t) {
            struct stat st {};
            if (!t.empty() && ::stat(t.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
              return toolcli::input_problem(t, S_IFDIR);
            return toolcli::input_problem(t, S_IFREG);
          },
          "PATH"));
  std::uint64_t data_limit = gpt::default_max_corpus_bytes;
  app.add_option_function<std::string>(
         "--data-limit", [&](const std::string& v) { data_limit = toolcli::size_value("--data-limit", v); },
         "the most bytes the corpus may hold, e.g. 64MiB (it is read into memory: about twice that is held); "
         "larger files are refused before they are read")
      ->type_name("BYTES")
      ->default_str(std::to_string(data_limit));
  toolcli::add_float(app, "--beta2", g.beta2, 0.0f, 0.99999f, "AdamW's and LAMB's second-moment decay");
  toolcli::add_integer(app, "--warmup", g.warmup, 0, 100000000,
                       "steps of linear warm-up to the rate, then a cosine decay to a tenth of it at the last step "
                       "(0: a constant rate)");
  toolcli::add_double(
      app, "--held-out", g.held_out, 0.01, 0.9,
      "fraction of the corpus held out for evaluation: that many of its 100 equal blocks, evenly spread");
  toolcli::add_integer(app, "--eval-windows", g.eval_windows, std::size_t{0}, std::size_t{1} << 24,
                       "windows of --context bytes evaluated in each part (0: all of the held-out part)");
  toolcli::add_integer(app, "--sample", g.sample, 0, 1 << 20, "bytes to generate after training (0: none)");
  auto* temperature_flag = toolcli::add_float(app, "--temperature", g.temperature, 0.0f, 100.0f,
                                              "sampling temperature (0: always the most likely byte)");
  auto* prompt_flag = app.add_option("--prompt", g.prompt, "text the sample continues")->capture_default_str();
  trainer::add_elastic_flags(app, o);
  if (const auto code = trainer::parse(app, argc, argv)) return *code;
  auto usage_error = [&](const std::string& msg) { return trainer::usage_error(app, msg); };
  if (const std::string p = trainer::options_problem(app, o); !p.empty()) return usage_error(p);
  if (const std::string p = trainer::elastic_problem(app, o); !p.empty()) return usage_error(p);
  if (o.elastic && o.ranks < 2 * g.tp)
    return usage_error("--elastic with --tp " + std::to_string(g.tp) + " needs --ranks " + std::to_string(2 * g.tp) +
                       " or more: a failure takes a whole tensor-parallel group out of the world");
  const auto comm_timeout = std::chrono::milliseconds(std::llround(o.comm_timeout * 1000.0));
  g.model.layers = o.model.layers;
  g.model.batch = o.model.batch;
  g.model.seed = o.model.seed;
  if (g.model.embd % g.model.heads != 0)
    return usage_error("--embd " + std::to_string(g.model.embd) + " must be a multiple of --heads " +
                       std::to_string(g.model.heads));
  if (g.model.heads % g.tp != 0)
    return usage_error("--tp " + std::to_string(g.tp) + " must divide --heads " + std::to_string(g.model.heads) +
                       ": each tensor-parallel rank computes whole attention heads");
  if (g.sequence_parallel && g.tp == 1)
    return usage_error("--sequence-parallel splits the rows over a tensor-parallel group: give --tp > 1");
  if (checkpoint_mode_of(g.checkpoint_activations) != zero::activation_mode::none && g.tp == 1)
    return usage_error("--checkpoint-activations " + g.checkpoint_activations +
                       " partitions each checkpoint over a tensor-parallel group: give --tp > 1 (or use whole)");
  if (checkpoint_mode_of(g.checkpoint_activations) != zero::activation_mode::none && g.sequence_parallel)
    return usage_error("--checkpoint-activations " + g.checkpoint_activations +
                       " with --sequence-parallel: the blocks' inputs are already split along the rows over the "
                       "group, each rank's own; use whole");
  if (g.gather_bucket_elements > 0 && (o.qwz || o.hpz > 0))
    return usage_error("--gather-bucket-elements with " + std::string(o.qwz ? "--qwz" : "--hpz") +
                       ": stage 3's gather buckets and ZeRO++'s gathers are not combined");
  if (g.prompt.empty()) return usage_error("--prompt must not be empty");
  if (o.resume.empty() && g.warmup > o.steps)
    return usage_error("--warmup " + std::to_string(g.warmup) + " is longer than the run (--steps " +
                       std::to_string(o.steps) + "): the schedule warms up, then decays to its last step");
  if (g.sample == 0 && (temperature_flag->count() > 0 || prompt_flag->count() > 0))
    return usage_error(std::string(temperature_flag->count() > 0 ? "--temperature" : "--prompt") +
                       " sets the sample; --sample 0 generates none");

  if (g.data.empty()) {
    std::string tried;
    g.data = default_corpus(tried);
    if (g.data.empty())
      return usage_error("no README.md and docs/ found in " + tried + "; give the corpus with --data");
  }
  // The corpus is the command line's input: what cannot be read as one (a FIFO, an empty or binary
  // file, more than --data-limit) is a usage error, before any rank starts.
  gpt::corpus data;
  try {
    data = gpt::load_corpus(g.data, g.held_out, g.model.context, data_limit);
  } catch (...) {
    return usage_error("--data: " + std::string(zero::as_error(std::current_exception()).what()));
  }
  g.model.vocab = data.vocab_size();
  for (unsigned char ch : g.prompt)
    if (data.id[ch] < 0)
      return usage_error("--prompt: the byte " + std::to_string(ch) + " does not occur in the corpus");

  gpt_summary s;
  std::optional<trainer::elastic_supervisor> elastic;  // --elastic: the launches and what changed
#if ZERO_WITH_MPI
  std::optional<zero::comm::mpi_session> session;  // finalizes MPI when main returns
#endif
  if (o.backend == "mpi") {
#if ZERO_WITH_MPI
    session.emplace(argc, argv);
    // Under mpirun the world is the communicator; every rank reaches the same verdict on the flags,
    // but only rank 0 says so.
    const int world = session->world_size(), rank = session->world_rank();
    std::string problem;
    if (ranks_flag->count() > 0 && o.ranks != world)
      problem = "--ranks " + std::to_string(o.ranks) + " contradicts the " + std::to_string(world) +
                " MPI processes (under --backend mpi the ranks are the processes mpirun starts; drop --ranks)";
    if (problem.empty()) problem = tp_problem(g.tp, world, "the number of MPI processes " + std::to_string(world));
    if (problem.empty())
      problem = trainer::split_batch(o, g.model.batch, world / g.tp,
                                     data_parallel_text(g.tp, "the number of MPI processes", world));
    if (problem.empty()) problem = trainer::zeropp_problem(o, world / g.tp);
    if (problem.empty()) problem = trainer::planted_problem(o, world);
    if (!problem.empty()) return rank == 0 ? usage_error(problem) : 2;
    o.ranks = world;
    std::optional<trainer::elastic_monitor> planted;  // --fail: this process's rank throws there
    trainer::plant_failures(o, planted, world);
    zero::comm::mpi_options mpi_opt;
    mpi_opt.timeout = comm_timeout;
    zero::comm::mpi::run(
        [&](zero::comm::mpi& comm) {
          zero::comm::any_backend<zero::sys::host> backend(comm);
          dispatch(backend, o, g, data, s);
        },
        mpi_opt);
    if (rank != 0) return 0;  // rank 0 reports
#else
    return usage_error("--backend mpi: this train_gpt was built without MPI (configure with -Dmpi=enabled)");
#endif
  } else {
    if (const std::string p = tp_problem(g.tp, o.ranks, "--ranks " + std::to_string(o.ranks)); !p.empty())
      return usage_error(p);
    if (const std::string problem =
            trainer::split_batch(o, g.model.batch, o.ranks / g.tp, data_parallel_text(g.tp, "--ranks", o.ranks));
        !problem.empty())
      return usage_error(problem);
    if (const std::string p = trainer::zeropp_problem(o, o.ranks / g.tp); !p.empty()) return usage_error(p);
    // One launch of the ranks; a rank leaving by an exception tells the monitor first (--fail, --elastic).
    auto launch = [&](const trainer::options& run, trainer::summary& base) {
      zero::comm::threads::options threads_opt;
      threads_opt.timeout = comm_timeout;
      zero::comm::threads::launch(
          run.ranks,
          [&](zero::comm::threads& comm) {
            try {
              gpt_summary local;
              zero::comm::any_backend<zero::sys::host> backend(comm);
              dispatch(backend, run, g, data, local);
              if (comm.rank() == 0) s = local;
            } catch (...) {
              if (run.monitor) run.monitor->rank_failed(comm.rank());
              throw;
            }
          },
          threads_opt);
      base = s.base;
    };
    try {
      trainer::summary base;
      if (o.elastic) {
        elastic.emplace(o, g.tp).run(launch);
      } else {
        std::optional<trainer::elastic_monitor> planted;  // --fail without --elastic: the run fails
        trainer::plant_failures(o, planted, o.ranks);
        launch(o, base);
      }
    } catch (...) {
      std::cerr << "train_gpt: " << trainer::printable_failure(std::current_exception()) << "\n";
      return 1;
    }
  }
  print_gpt_summary(o, g, data, s);
  if (elastic)
    for (const std::string& line : elastic->lines()) std::cout << line << "\n";
  // The sample is bytes: a multi-byte character may be cut, so invalid UTF-8 is replaced in the JSON.
  if (o.json) {
    nlohmann::json j = gpt_json(o, g, data, s);
    if (elastic) j["elastic"] = elastic->json();
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  }
  return 0;
}
