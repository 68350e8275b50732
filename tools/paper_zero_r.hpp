// The ZeRO paper's ZeRO-R figures (section 6 on its 100B model, section 10's configurations C1-C5) computed by the
// planner, each beside the paper's (zero_plan --paper-zero-r).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "paper_tables.hpp"
#include "zero/plan_by_name.hpp"
#include "zero/zero.hpp"

namespace paper::zero_r {

inline constexpr std::string_view source =
    "Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion Parameter Models, SC'20 "
    "(arXiv:1910.02054), sections 6 and 10 (Tables 3 and 4)";

// Table 4's 100B model (row "80B-170B: 100, 125, 150 layers, HD 8192"): 125 transformer layers of hidden
// size 8192, each 12 h^2 weights (attention's qkv 3h^2 and projection h^2, the MLP's 4h^2 twice), the
// paper's count of a GPT-2-like layer; split Megatron's way over MP ranks (qkv and the MLP's first
// layer by columns, the projection and the MLP's second layer by rows).
inline constexpr std::uint64_t layers = 125, hidden = 8192;
// Section 6.1's example: batch 32, sequence 1024, MP 16, one checkpoint per transformer layer (its
// input, batch x sequence x hidden elements).
inline constexpr std::uint64_t batch = 32, sequence = 1024;
inline constexpr int mp = 16;
// Section 10: 400 V100s of 32 GB (25 DGX-2 nodes); at MP 16 that is DP 25.
inline constexpr int gpus = 400, dp = gpus / mp;
// Section 6.2's example of a model-sized fused buffer: a 3B-parameter model in 32 bits.
inline constexpr std::uint64_t fused_buffer_model = 3'000'000'000;

inline constexpr std::uint64_t checkpoint_elements = batch * sequence * hidden;

// The 100B model, whole (parts = 1) or as one MP rank's pieces.
inline zero::model_spec model_100b(int parts) {
  zero::model_spec whole;
  const std::size_t h = hidden;
  for (std::uint64_t l = 0; l < layers; ++l)
    whole.unit("layer " + std::to_string(l))
        .tensor("qkv", {h, 3 * h}, zero::tp_split(1))
        .tensor("projection", {h, h}, zero::tp_split(0))
        .tensor("mlp_in", {h, 4 * h}, zero::tp_split(1))
        .tensor("mlp_out", {4 * h, h}, zero::tp_split(0));
  return parts == 1 ? whole : whole.piece(parts, 0);
}

// fp16 parameters and gradients, fp32 master weights and Adam's two slots (K = 12), as in Tables 1-2.
inline zero::plan_report plan_piece(int stage, int ranks) {
  return zero::plan(model_100b(mp), ranks, stage, zero::plan_precision_named(paper::precision),
                    zero::plan_optimizer_named(paper::optimizer));
}

// One figure the paper prints. `planner`: the planner's value for the configuration the paper states;
// `compared`: the value the rule compares with the paper's figure, = planner unless the paper's figure
// rests on an assumption the text does not state, which `assumption` then names (and the figure is
// compared at it). `unit`: bytes, parameters or a ratio's scale per 1 of the figure.
struct figure_row {
  std::string_view section, quantity;
  std::string_view paper;  // the figure as printed, a number ("33", "16") or the words ("nearly zero", "halves")
  std::string_view value;  // the number the words stand for ("0", "0.5"); the figure itself where it is one
  std::uint64_t unit = 1;
  std::uint64_t planner = 0, compared = 0;
  std::string assumption;
  bool agrees = false;
};

// Section 10's configurations C1-C5 (Table 3) for the 100B model at MP 16, DP 25: what one GPU holds
// by the planner. The paper plots these (Figure 7) without printing figures.
struct configuration {
  std::string_view name, zero_dp, zero_r;
  int stage = 1;
  zero::activation_mode activations = zero::activation_mode::none;
  std::uint64_t model_state_bytes = 0;  // plan(...).model_states.total()
  std::uint64_t transient_bytes = 0;    // plan(...).step_transient_peak: the engine's buffers in a step
  std::uint64_t bucket_bytes = 0;       // plan(...).bucket_bytes: the largest gradient bucket (one layer)
  std::uint64_t checkpoint_bytes = 0;   // plan_activations: checkpoints plus one restored, in GPU memory
  std::uint64_t host_bytes = 0;         // plan_activations: Pa+cpu's checkpoints in CPU memory
  std::uint64_t gpu_bytes() const { return model_state_bytes + transient_bytes + checkpoint_bytes; }
};
inline constexpr std::array<std::string_view, 5> config_names{"C1", "C2", "C3", "C4", "C5"};

struct result {
  std::uint64_t parameters = 0, piece_parameters = 0;
  std::vector<figure_row> figures;
  std::vector<configuration> configurations;
  int agreeing = 0;          // every figure, at its stated assumption where it names one
  int agreeing_as_stated = 0;  // figures that need no assumption beyond the paper's text
};

inline zero::activation_plan checkpoints(zero::activation_mode mode, std::size_t element_bytes) {
  return zero::plan_activations(layers, checkpoint_elements, element_bytes, mp, mode);
}

inline result compute() {
  using zero::activation_mode;
  result r;
  r.parameters = model_100b(1).numel();
  r.piece_parameters = model_100b(mp).numel();
  auto add = [&r](figure_row f) {
    f.agrees = agrees(parse_figure(f.value, f.unit), f.compared);
    if (f.agrees) ++r.agreeing;
    if (f.agrees && f.assumption.empty()) ++r.agreeing_as_stated;
    r.figures.push_back(std::move(f));
  };
  // Table 4: the model's size, its label.
  add({"Table 4", "parameters of 125 layers of hidden 8192, 12 h^2 each (B)", "100B", "100B", 1'000'000'000, r.parameters,
       r.parameters, {}});

  // Section 6.1: the checkpoints per GPU. The paper's 33 GB and 2 GB are the element counts (one byte
  // each); in fp16 the same checkpoints are twice that.
  const std::string one_byte =
      "one byte per element: the paper's figure is the checkpoints' element count (layers x batch x sequence x "
      "hidden); in fp16 they take twice the bytes (section 3.2 gives the same model's fp16 checkpoints at batch 32 "
      "as 'around 60 GB')";
  const auto whole16 = checkpoints(activation_mode::none, 2), whole8 = checkpoints(activation_mode::none, 1);
  const auto pa16 = checkpoints(activation_mode::partitioned, 2), pa8 = checkpoints(activation_mode::partitioned, 1);
  const auto cpu16 = checkpoints(activation_mode::partitioned_cpu, 2),
             cpu8 = checkpoints(activation_mode::partitioned_cpu, 1);
  add({"6.1", "activation checkpoints per GPU at MP 16, without Pa (GB)", "33", "33", gb, whole16.saved_bytes,
       whole8.saved_bytes, one_byte});
  add({"6.1", "activation checkpoints per GPU with Pa (GB)", "2", "2", gb, pa16.saved_bytes, pa8.saved_bytes,
       one_byte});
  add({"6.1", "Pa+cpu: the checkpoints in GPU memory (GB)", "nearly zero", "0", gb, cpu16.saved_bytes,
       cpu16.saved_bytes, {}});
  add({"6.1", "Pa+cpu: the checkpoints offloaded to CPU memory (GB)", "2", "2", gb, cpu16.host_bytes,
       cpu8.host_bytes, one_byte});

  // Section 6.2: a model-sized fused buffer in 32 bits. The planner's: the gradient bucket of the 3B
  // model as one unit in fp32 (stage 2 at N = 1 reduces through a bucket the unit's size).
  {
    zero::model_spec one;
    one.unit("model").tensor("parameters", {static_cast<std::size_t>(fused_buffer_model)});
    const auto p = zero::plan(one, 1, 2, zero::plan_precision_named("fp32"), zero::plan_optimizer_named("adamw"));
    add({"6.2", "a 3B-parameter model's 32-bit fused buffer (GB)", "12", "12", gb, p.bucket_bytes, p.bucket_bytes, {}});
  }

  // Section 10.5: Pa's reduction of the activation memory (C1 -> C2), and Pos+g's of the model states
  // (C2 -> C4, "halves"), as ratios: the second in thousandths, at the DP 25 of 400 GPUs at MP 16.
  const std::uint64_t reduction = whole16.saved_bytes / pa16.saved_bytes;
  add({"10.5", "activation memory without Pa / with Pa (x)", "16", "16", 1, reduction, reduction, {}});
  const std::uint64_t pos = plan_piece(1, dp).model_states.total(), posg = plan_piece(2, dp).model_states.total();
  const std::uint64_t thousandths = posg * 1000 / pos;
  add({"10.5", "model states with Pos+g / with Pos (x)", "halves", "0.5", 1000, thousandths, thousandths, {}});

  // Table 3's configurations on the 100B model.
  struct config_spec {
    std::string_view zero_dp, zero_r;
    int stage;
    activation_mode mode;
  };
  const std::array<config_spec, 5> specs{{{"Pos", "CB+MD", 1, activation_mode::none},
                                          {"Pos", "CB+MD+Pa", 1, activation_mode::partitioned},
                                          {"Pos+g", "CB+MD", 2, activation_mode::none},
                                          {"Pos+g", "CB+MD+Pa", 2, activation_mode::partitioned},
                                          {"Pos+g", "CB+MD+Pa+cpu", 2, activation_mode::partitioned_cpu}}};
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto p = plan_piece(specs[i].stage, dp);
    const auto a = checkpoints(specs[i].mode, 2);
    r.configurations.push_back({config_names[i], specs[i].zero_dp, specs[i].zero_r, specs[i].stage, specs[i].mode,
                                p.model_states.total(), p.step_transient_peak, p.bucket_bytes, a.peak_system_bytes,
                                a.host_bytes});
  }
  return r;
}

inline nlohmann::json to_json(const result& r) {
  nlohmann::json j = {{"source", source},
                      {"model",
                       {{"layers", layers},
                        {"hidden", hidden},
                        {"parameters", r.parameters},
                        {"mp", mp},
                        {"piece_parameters", r.piece_parameters},
                        {"dp", dp},
                        {"gpus", gpus},
                        {"batch", batch},
                        {"sequence", sequence},
                        {"checkpoint_elements", checkpoint_elements}}},
                      {"precision", precision},
                      {"optimizer", optimizer},
                      {"gb_bytes", gb},
                      {"rule", rule},
                      {"figures_count", r.figures.size()},
                      {"agreeing", r.agreeing},
                      {"agreeing_as_stated", r.agreeing_as_stated}};
  nlohmann::json figures = nlohmann::json::array();
  for (const figure_row& f : r.figures)
    figures.push_back({{"section", f.section},
                       {"quantity", f.quantity},
                       {"paper", f.paper},
                       {"value", f.value},
                       {"unit", f.unit},
                       {"planner", f.planner},
                       {"compared", f.compared},
                       {"assumption", f.assumption},
                       {"agrees", f.agrees}});
  j["figures"] = figures;
  nlohmann::json configs = nlohmann::json::array();
  for (const configuration& c : r.configurations)
    configs.push_back({{"name", c.name},
                       {"zero_dp", c.zero_dp},
                       {"zero_r", c.zero_r},
                       {"stage", c.stage},
                       {"activations", zero::to_string(c.activations)},
                       {"model_state_bytes", c.model_state_bytes},
                       {"transient_bytes", c.transient_bytes},
                       {"bucket_bytes", c.bucket_bytes},
                       {"checkpoint_bytes", c.checkpoint_bytes},
                       {"host_bytes", c.host_bytes},
                       {"gpu_bytes", c.gpu_bytes()}});
  j["configurations"] = configs;
  return j;
}

// A value in the unit the paper prints it in: "67.11" (GB), "16" (x), "0.571" (thousandths).
inline std::string in_unit(std::uint64_t value, std::uint64_t unit) {
  char buf[64];
  if (unit == 1)
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(value));
  else
    std::snprintf(buf, sizeof buf, unit == 1000 ? "%.3f" : "%.2f", static_cast<double>(value) / static_cast<double>(unit));
  return buf;
}

inline void print(const result& r) {
  std::printf("%.*s, from zero::plan and zero::plan_activations\n", static_cast<int>(source.size()), source.data());
  std::printf(
      "the 100B model of Table 4: %llu layers of hidden %llu, %.2fB parameters (12 h^2 per layer); MP %d (%.2fB per "
      "GPU), DP %d on %d GPUs; batch %llu, sequence %llu; fp16 with Adam's fp32 states (K = 12); GB = 10^9 bytes\n"
      "each figure: the planner's | the paper's, which agree when the paper's is the planner's rounded or truncated "
      "to the decimals it prints; where the paper's figure rests on an assumption its text does not state, the "
      "planner's value at that assumption is compared and the assumption named\n\n",
      static_cast<unsigned long long>(layers), static_cast<unsigned long long>(hidden),
      static_cast<double>(r.parameters) / 1e9, mp, static_cast<double>(r.piece_parameters) / 1e9, dp, gpus,
      static_cast<unsigned long long>(batch), static_cast<unsigned long long>(sequence));
  for (const figure_row& f : r.figures) {
    std::string line = std::string(f.section) + "  " + std::string(f.quantity) + ": " + in_unit(f.planner, f.unit);
    if (!f.assumption.empty()) line += " (" + in_unit(f.compared, f.unit) + " at the assumption below)";
    line += " | " + std::string(f.paper) + (f.agrees ? "" : " (differs)");
    put_line(line);
    if (!f.assumption.empty()) put_line("      assumption: " + f.assumption);
  }
  std::printf(
      "\nTable 3's configurations on the 100B model, per GPU (MP %d, DP %d; the paper plots them in Figure 7 without "
      "printed figures): model states, the engine's buffers in a step (CB: the largest is one layer's gradient "
      "bucket, whatever the model's size), the activation checkpoints in GPU memory (with one restored), and "
      "Pa+cpu's in CPU memory\n",
      mp, dp);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-4s %-7s %-13s %13s %13s %13s %13s %13s %13s", "", "ZeRO-DP", "ZeRO-R",
                "model states", "transients", "(one bucket)", "checkpoints", "GPU total", "CPU");
  put_line(buf);
  for (const configuration& c : r.configurations) {
    auto g = [](std::uint64_t b) { return in_unit(b, gb) + " GB"; };
    std::snprintf(buf, sizeof buf, "%-4.*s %-7.*s %-13.*s %13s %13s %13s %13s %13s %13s", static_cast<int>(c.name.size()),
                  c.name.data(), static_cast<int>(c.zero_dp.size()), c.zero_dp.data(),
                  static_cast<int>(c.zero_r.size()), c.zero_r.data(), g(c.model_state_bytes).c_str(),
                  g(c.transient_bytes).c_str(), g(c.bucket_bytes).c_str(), g(c.checkpoint_bytes).c_str(),
                  g(c.gpu_bytes()).c_str(), g(c.host_bytes).c_str());
    put_line(buf);
  }
  std::printf(
      "MD (memory defragmentation) moves bytes, it adds none: each of the engine's buffers is one allocation of a "
      "planned size.\n");
  std::printf("\n%d of %zu figures agree with the paper (%d as stated, %d at the assumption named).\n", r.agreeing,
              r.figures.size(), r.agreeing_as_stated, r.agreeing - r.agreeing_as_stated);
}

}  // namespace paper::zero_r
