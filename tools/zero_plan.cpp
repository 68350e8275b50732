// zero_plan: memory per rank and traffic per step of a model for every stage and world size, before anything runs.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mlp.hpp"  // the trainers' model, for their --layers/--hidden/--in/--classes flags
#include "paper_tables.hpp"
#include "paper_zero_r.hpp"
#include "tool_cli.hpp"
#include "trainer_cli.hpp"  // the trainers' ZeRO++ flags and their refusals
#include "zero/plan_by_name.hpp"
#include "zero/zero.hpp"

namespace {

struct tensor_text {
  std::string name;
  std::vector<std::size_t> shape;
  zero::tensor_parallel tp{};
};

// A model description: a JSON list of units, each {"name": ..., "tensors": [{"name": ..., "shape": [...]}]}
// and optionally "gathers": n (a shared unit gathered n times per pass, unit_builder::gathers), or an
// object with that list under "units" and optionally its parameter groups under "groups": each
// {"name": ..., "members": ["unit.tensor", ...]} with param_group's overrides "lr_scale", "weight_decay"
// and "element_wise" (a matrix optimizer's element-wise rule: AdamW under Muon). Errors name the file
// and the place. The file is opened without blocking (a FIFO is refused, not waited on) and read up to
// max_model_bytes; every name quoted from it is escaped (toolcli::quote).
inline constexpr std::uint64_t max_model_bytes = std::uint64_t{64} << 20;

struct model_description {
  zero::model_spec spec;
  std::vector<zero::param_group> groups;  // engine_options::param_groups, as the engine would be given them
};

// A group's "lr_scale" or "weight_decay": a finite number >= 0 (the engine's own check, named here).
float group_number(const nlohmann::json& g, const char* key, const std::string& where, const std::string& group) {
  const nlohmann::json& v = g[key];
  ZERO_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0.0 &&
                 v.get<double>() <= 3.4e38,
             invalid_argument, where, ": group ", group, ": \"", key, "\" ",
             v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), " is not a finite number >= 0");
  return v.get<float>();
}

// "groups": the overrides in order, and each member ("unit.tensor") with its group's name.
std::vector<zero::param_group> read_groups(const nlohmann::json& j, const std::string& where,
                                           std::map<std::string, std::string>& member_group) {
  std::vector<zero::param_group> groups;
  if (!j.is_object() || !j.contains("groups")) return groups;
  const nlohmann::json& list = j["groups"];
  ZERO_CHECK(list.is_array(), invalid_argument, where, ": \"groups\" must be a list of parameter groups");
  for (std::size_t g = 0; g < list.size(); ++g) {
    const nlohmann::json& gj = list[g];
    ZERO_CHECK(gj.is_object() && gj.contains("name") && gj["name"].is_string() && gj.contains("members") &&
                   gj["members"].is_array() && !gj["members"].empty(),
               invalid_argument, where, ": group ", g,
               " needs a \"name\" (string) and \"members\" (a non-empty list of \"unit.tensor\" names)");
    zero::param_group p;
    p.name = gj["name"].get<std::string>();
    const std::string group = toolcli::quote(p.name);
    for (const auto& [key, value] : gj.items())
      ZERO_CHECK(key == "name" || key == "members" || key == "lr_scale" || key == "weight_decay" ||
                     key == "element_wise",
                 invalid_argument, where, ": group ", group, ": unknown key ", toolcli::quote(key),
                 " (name, members, lr_scale, weight_decay, element_wise)");
    if (gj.contains("lr_scale")) p.lr_scale = group_number(gj, "lr_scale", where, group);
    if (gj.contains("weight_decay")) p.weight_decay = group_number(gj, "weight_decay", where, group);
    if (gj.contains("element_wise")) {
      ZERO_CHECK(gj["element_wise"].is_boolean(), invalid_argument, where, ": group ", group,
                 ": \"element_wise\" must be true or false");
      p.element_wise = gj["element_wise"].get<bool>();
    }
    for (const nlohmann::json& m : gj["members"]) {
      ZERO_CHECK(m.is_string(), invalid_argument, where, ": group ", group, ": member ",
                 m.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), " is not a \"unit.tensor\" name");
      const auto [it, added] = member_group.try_emplace(m.get<std::string>(), p.name);
      ZERO_CHECK(added, invalid_argument, where, ": group ", group, ": member ", toolcli::quote(it->first),
                 " is in group ", toolcli::quote(it->second), " already (a tensor belongs to one group)");
    }
    groups.push_back(std::move(p));
  }
  return groups;
}

model_description read_model(const std::string& file) {
  const std::string text = toolcli::read_input("--model", file, max_model_bytes);
  const std::string where = "--model " + toolcli::quote(file);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    zero::fail(zero::error_kind::invalid_argument, where, ": not JSON: ", e.what());
  }
  const nlohmann::json& units = j.is_object() && j.contains("units") ? j["units"] : j;
  ZERO_CHECK(units.is_array() && !units.empty(), invalid_argument, where,
             ": expected a non-empty list of units (or {\"units\": [...]})");
  std::map<std::string, std::string> member_group;  // "unit.tensor" -> its group's name
  model_description out{{}, read_groups(j, where, member_group)};
  std::map<std::string, int> member_matches;
  zero::model_spec& spec = out.spec;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const nlohmann::json& unit = units[u];
    ZERO_CHECK(unit.is_object() && unit.contains("name") && unit["name"].is_string() && unit.contains("tensors") &&
                   unit["tensors"].is_array() && !unit["tensors"].empty(),
               invalid_argument, where, ": unit ", u, " needs a \"name\" (string) and \"tensors\" (a non-empty list)");
    const std::string unit_name = toolcli::quote(unit["name"].get<std::string>());
    std::vector<tensor_text> tensors;
    for (std::size_t t = 0; t < unit["tensors"].size(); ++t) {
      const nlohmann::json& tj = unit["tensors"][t];
      ZERO_CHECK(tj.is_object() && tj.contains("name") && tj["name"].is_string() && tj.contains("shape") &&
                     tj["shape"].is_array() && !tj["shape"].empty(),
                 invalid_argument, where, ": unit ", unit_name, " tensor ", t,
                 " needs a \"name\" (string) and a \"shape\" (a non-empty list of positive integers)");
      tensor_text tt{tj["name"].get<std::string>(), {}};
      for (const auto& d : tj["shape"]) {
        ZERO_CHECK(d.is_number_unsigned() && d.get<std::uint64_t>() > 0, invalid_argument, where, ": unit ", unit_name,
                   " tensor ", toolcli::quote(tt.name), ": shape entry ",
                   d.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),  // JSON escapes controls
                   " is not a positive integer");
        tt.shape.push_back(d.get<std::size_t>());
      }
      if (tj.contains("tp_split")) {  // split across a tensor-parallel group along this dimension
        const nlohmann::json& d = tj["tp_split"];
        ZERO_CHECK(d.is_number_unsigned() && d.get<std::uint64_t>() < tt.shape.size(), invalid_argument, where,
                   ": unit ", unit_name, " tensor ", toolcli::quote(tt.name), ": \"tp_split\" ",
                   d.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                   " is not a dimension of its shape (0 to ", tt.shape.size() - 1, ")");
        tt.tp = zero::tp_split(static_cast<int>(d.get<std::uint64_t>()));
      }
      tensors.push_back(std::move(tt));
    }
    auto builder = spec.unit(unit["name"].get<std::string>());
    for (const auto& t : tensors) {
      builder.tensor(t.name, t.shape, t.tp);
      const auto member = member_group.find(unit["name"].get<std::string>() + "." + t.name);
      if (member == member_group.end()) continue;
      builder.group(member->second);
      ++member_matches[member->first];
    }
    if (unit.contains("gathers")) {
      const nlohmann::json& g = unit["gathers"];
      ZERO_CHECK(g.is_number_unsigned() && g.get<std::uint64_t>() >= 1 && g.get<std::uint64_t>() <= 1000000,
                 invalid_argument, where, ": unit ", unit_name, ": \"gathers\" ",
                 g.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                 " is not a positive integer (times the unit is gathered per pass)");
      builder.gathers(static_cast<int>(g.get<std::uint64_t>()));
    }
  }
  for (const auto& [member, group] : member_group) {
    const int matches = member_matches[member];
    ZERO_CHECK(matches == 1, invalid_argument, where, ": group ", toolcli::quote(group), ": member ",
               toolcli::quote(member), matches == 0 ? " names no tensor (\"unit.tensor\")"
                                                     : " names several tensors (names with dots are ambiguous)");
  }
  return out;
}

// What the engine's constructor refuses of the groups for this optimizer (param_group_map::make), so that
// the plan describes only an engine that can be built.
void check_groups(const model_description& m, const std::string& optimizer, const std::string& where) {
  if (m.groups.empty()) return;
  try {
    const zero::layout l = zero::layout::make(m.spec, 1, 1);
    zero::optimizers::visit_first([&]<class T>() { return optimizer == T::name; },
                                  [&]<class T>() { zero::param_group_map::make<T>(m.spec, l, m.groups, 0); });
  } catch (const zero::error& e) {
    zero::fail(zero::error_kind::invalid_argument, where, ": \"groups\": ", e.what());
  }
}

// 1234567 -> "1.18 MiB": the table's sizes (the JSON gives exact bytes).
std::string size_text(std::uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1024.0 && i < 5) {
    v /= 1024.0;
    ++i;
  }
  char buf[32];
  if (i == 0) std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[i]);
  return buf;
}

nlohmann::json report_json(const zero::plan_report& p, std::uint64_t memory) {
  const std::uint64_t full_params_peak =
      p.model_states.total() + std::max<std::uint64_t>(p.step_transient_peak, p.consolidation_bytes);
  nlohmann::json j = {
      {"stage", p.stage},
      {"ranks", p.ranks * p.replicas},
      {"shard_group", p.ranks},
      {"replicas", p.replicas},
      {"params_bytes", p.model_states.params},
      {"grads_bytes", p.model_states.grads},
      {"master_bytes", p.model_states.master},
      {"optimizer_states_bytes", p.model_states.optimizer_states},
      {"model_state_bytes", p.model_states.total()},
      {"bucket_bytes", p.bucket_bytes},
      {"shared_bucket_bytes", p.shared_bucket_bytes},
      {"gathered_bytes", p.gathered_bytes},
      {"wire_bytes", p.wire_bytes},
      {"norm_bytes", p.norm_bytes},
      {"offload_bytes", p.model_states.offload},
      {"offloaded_bytes", p.offloaded_bytes},
      {"offload_staging_bytes", p.offload_staging_bytes},
      {"offload_checksum_bytes", p.offload_checksum_bytes},
      {"transient_peak_bytes", p.step_transient_peak},
      {"peak_bytes", p.peak_bytes},
      {"consolidation_bytes", p.consolidation_bytes},
      {"full_params_peak_bytes", full_params_peak},
      {"bytes_sent_per_step", p.step_bytes_sent()},
      {"inter_node_bytes_per_step", p.step_comm.inter_node_bytes()},
      {"control_bytes_per_step", p.control_comm.total_bytes()},
  };
  if (memory > 0) j["fits"] = p.fits(memory);
  return j;
}

// --activations: the three modes of activation_store at a tensor-parallel size, from plan_activations.
int print_activation_plans(std::uint64_t layers, std::uint64_t elements, std::size_t element_bytes, int tp,
                           bool json) {
  try {
    std::vector<zero::activation_plan> plans;
    for (auto mode :
         {zero::activation_mode::none, zero::activation_mode::partitioned, zero::activation_mode::partitioned_cpu})
      plans.push_back(zero::plan_activations(layers, elements, element_bytes, tp, mode));
    if (json) {
      nlohmann::json j = {{"layers", layers}, {"elements", elements}, {"element_bytes", element_bytes},
                          {"plans", nlohmann::json::array()}};
      for (const auto& p : plans)
        j["plans"].push_back({{"tp", p.tp},
                              {"mode", zero::to_string(p.mode)},
                              {"kept_elements", p.kept_elements},
                              {"saved_bytes", p.saved_bytes},
                              {"host_bytes", p.host_bytes},
                              {"restore_bytes", p.restore_bytes},
                              {"peak_system_bytes", p.peak_system_bytes},
                              {"gather_bytes_per_pass", p.gather.total_bytes()},
                              {"to_host_bytes", p.to_host_bytes},
                              {"from_host_bytes", p.from_host_bytes}});
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::printf("activation checkpoints: %" PRIu64 " layers of %" PRIu64 " elements of %zu bytes (%s each, whole)\n",
                layers, elements, element_bytes, size_text(elements * element_bytes).c_str());
    std::printf("bytes per rank; \"system\": the system's memory after the forward pass, \"host\": host memory "
                "(pinned on a GPU), \"peak\": system + one restored checkpoint; \"gathered\": all-gather bytes sent "
                "per backward pass (bus volume)\n\n");
    std::printf("%6s %7s %11s %11s %11s %11s %11s %12s\n", "tp", "mode", "kept/layer", "system", "host", "restore",
                "peak", "gathered");
    for (const auto& p : plans)
      std::printf("%6d %7s %11s %11s %11s %11s %11s %12s\n", p.tp, zero::to_string(p.mode),
                  size_text(p.kept_elements * element_bytes).c_str(), size_text(p.saved_bytes).c_str(),
                  size_text(p.host_bytes).c_str(), size_text(p.restore_bytes).c_str(),
                  size_text(p.peak_system_bytes).c_str(), size_text(p.gather.total_bytes()).c_str());
    std::printf("\nPa+cpu also copies its host bytes to host memory in the forward pass and back in the backward "
                "pass.\n");
  } catch (...) {
    std::fprintf(stderr, "zero_plan: %s\n",
                 toolcli::printable_message(zero::as_error(std::current_exception()).what()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Memory per rank and bytes sent per step of a model under every ZeRO stage, for a list of world sizes, "
      "computed exactly from the layout (zero::plan) before anything is allocated. The model is the example "
      "trainers' MLP (--layers, --hidden, --in, --classes) or a JSON description (--model)."};
  mlp::config model;
  std::string model_file, precision = "fp32", optimizer = "adamw";
  std::vector<int> ranks{1, 2, 4, 8};
  std::vector<int> stages{0, 1, 2, 3};
  int accum = 1;
  float clip = 0.0f;
  std::uint64_t memory = 0;
  bool json = false;
  auto* model_flag =
      app.add_option("--model", model_file,
                     "JSON model description: a list of units, each {\"name\": ..., \"tensors\": [{\"name\": ..., "
                     "\"shape\": [...], \"tp_split\": d (optional: cut along dimension d across a tensor-parallel group, --tp)}, "
                     "...], \"gathers\": n (optional: a shared unit gathered n times per pass)}, or {\"units\": "
                     "[...], \"groups\": [{\"name\": ..., \"members\": [\"unit.tensor\", ...], \"lr_scale\": x, "
                     "\"weight_decay\": x, \"element_wise\": true (a matrix optimizer's element-wise rule: AdamW "
                     "under Muon)}, ...]} (engine_options::param_groups); a regular file of at most 64 MiB")
          ->check(toolcli::checked([](const std::string& t) { return toolcli::input_problem(t, S_IFREG); }, "FILE"));
  toolcli::add_integer(app, "--layers", model.layers, 1, 1000, "the trainers' MLP: linear layers")
      ->excludes(model_flag);
  toolcli::add_integer(app, "--hidden", model.hidden, 1, 1 << 20, "the trainers' MLP: hidden width")
      ->excludes(model_flag);
  toolcli::add_integer(app, "--in", model.in, 1, 1 << 20, "the trainers' MLP: input features")->excludes(model_flag);
  toolcli::add_integer(app, "--classes", model.classes, 2, 1 << 20, "the trainers' MLP: classes")->excludes(model_flag);
  toolcli::add_integer_list(app, "--ranks", ranks, 1, 1 << 20, "world sizes, e.g. 1,8,64");
  toolcli::add_integer_list(app, "--stage", stages, 0, 3, "ZeRO stages (default: all)");
  app.add_option("--precision", precision, "parameter and gradient precision (bf16/fp16 keep fp32 master weights)")
      ->check(toolcli::one_of(zero::precisions::names()))
      ->capture_default_str();
  app.add_option("--optimizer", optimizer, "optimizer")
      ->check(toolcli::one_of(zero::optimizers::names()))
      ->capture_default_str();
  toolcli::add_integer(app, "--accum", accum, 1, 1 << 20, "micro-batches per step, each reduced on its own");
  app.add_option_function<std::string>(
         "--clip", [&clip](const std::string& v) { clip = toolcli::float_flag("--clip", v, true, 1e9f); },
         "gradient clipping norm in [0, 1e9] (0: off; on, it adds the norm's all-reduce)")
      ->type_name("FLOAT")
      ->default_str("0");
  app.add_option_function<std::string>(
         "--memory", [&memory](const std::string& v) { memory = toolcli::size_value("--memory", v); },
         "memory per rank to fit into, e.g. 80GB or 16GiB (bytes without a unit): planned as the trainers' "
         "--memory-limit (with --overlap on the engine then gives back what overlap holds before it allocates)")
      ->type_name("BYTES");
  // Offload (engine_options::offload): where the master weights and optimizer slots would live.
  std::string offload = "none";
  std::size_t offload_slice = std::size_t{1} << 20;
  app.add_option("--offload", offload,
                 "master weights and optimizer slots in: none (memory), host (host memory), disk (a file per "
                 "rank, streamed through host memory in slices); on a CPU system the tier's host memory counts "
                 "as the rank's (\"offload\")")
      ->check(toolcli::one_of({"none", "host", "disk"}))
      ->capture_default_str();
  auto* slice_flag = app.add_option_function<std::string>(
                            "--offload-slice",
                            [&offload_slice](const std::string& v) {
                              offload_slice = toolcli::integer_value<std::size_t>("--offload-slice", v, 1024,
                                                                                  std::size_t{1} << 40);
                              if (offload_slice % 1024 != 0)
                                throw CLI::ValidationError("--offload-slice",
                                                           toolcli::quote(v) + " is not a multiple of 1024");
                            },
                            "--offload disk: elements per slice, a multiple of 1024 in [1024, 2^40]; up to three "
                            "slices per state array are held in host memory")
                        ->type_name("UINT")
                        ->default_str(std::to_string(offload_slice));
  bool reproducible = false;
  app.add_flag("--reproducible", reproducible,
               "the reproducible reduction (engine_options::reproducible): binned gradient sums, 24 bytes per "
               "element on the wire and 28 held per gradient element a rank updates");
  // ZeRO++ (engine_options::zeropp) as the trainers name it, and overlap.
  trainer::options flags;
  trainer::add_zeropp_flags(app, flags);
  flags.overlap = "off";
  app.add_option("--overlap", flags.overlap,
                 "on: the engine overlaps communication with computation (engine_options::overlap on a backend "
                 "that overlaps: comm::mpi, a modeled link; the trainers' default): reduces in flight with their "
                 "buckets, stage 3 prefetches, a larger transient peak; off: every collective completes in its "
                 "call (comm::threads, or overlap off)")
      ->check(toolcli::one_of({"on", "off"}))
      ->capture_default_str();
  std::string release_order = "after-reduce";
  app.add_option("--release-order", release_order,
                 "where the backward pass releases each unit: after-reduce (gather, grads, reduce, release: the "
                 "tutorial's loop) or before-reduce (gather, grads, release, reduce: train_loop's); in stage 3, "
                 "releasing first can lower the transient peak by one gathered unit where reduce() allocates "
                 "(--reproducible, --qgz)")
      ->check(toolcli::one_of({"after-reduce", "before-reduce"}))
      ->capture_default_str();
  int tp = 1;
  auto* tp_flag = toolcli::add_integer(
      app, "--tp", tp, 1, 1 << 20,
      "plan one rank of a dp x tp mesh (docs/parallelism.md): its pieces of a --model whose tensors "
      "declare \"tp_split\": a dimension (the others replicated); each --ranks value is then the "
      "data-parallel size, the mesh that many times tp ranks; with --activations, the tensor-parallel group");
  auto* json_flag = app.add_flag("--json", json, "print a JSON object instead of the table");
  bool paper_tables = false;
  auto* paper_flag = app.add_flag(
      "--paper-tables", paper_tables,
      "instead of a model's plan: the ZeRO paper's Table 1 (model-state memory per device of its 7.5B, 128B and 1T "
      "models, K = 12, DP 1 to 1024) and Table 2 (the largest model in 32 GB per device with model parallelism), "
      "each figure computed by the planner beside the paper's; exit 1 if one differs (takes only --json)");
  bool paper_zero_r = false;
  auto* paper_zero_r_flag = app.add_flag(
      "--paper-zero-r", paper_zero_r,
      "instead of a model's plan: the ZeRO paper's ZeRO-R figures (section 6's activation checkpoints with Pa and "
      "Pa+cpu and its fused buffer, section 10's ratios) on its 100B model at MP 16, and Table 3's configurations "
      "C1-C5 per GPU, each figure computed by the planner beside the paper's; exit 1 if one differs (takes only "
      "--json)");
  // Activation checkpoints (activation_store): their memory per rank and traffic per backward pass.
  std::vector<std::uint64_t> activations;
  auto* activations_flag = toolcli::add_integer_list<std::uint64_t>(
      app, "--activations", activations, 1, std::uint64_t{1} << 50,
      "instead of a model's plan: activation checkpoints (zero::activation_store) of L layers, E elements each, of "
      "B bytes (2: bf16/fp16, 4: fp32), as L,E,B: bytes per rank kept whole, with Pa and with Pa+cpu, at --tp");
  if (const auto code = toolcli::parse(app, argc, argv)) return *code;
  if (activations_flag->count() > 0) {
    for (const CLI::Option* o : app.get_options())
      if (o != activations_flag && o != tp_flag && o != json_flag && o->count() > 0)
        return toolcli::usage_error(app, "--activations plans activation checkpoints; it takes only --tp and --json, "
                                         "not " + o->get_name());
    if (activations.size() != 3 || (activations[2] != 2 && activations[2] != 4))
      return toolcli::usage_error(app, "--activations takes L,E,B: layers, elements per checkpoint, and bytes per "
                                       "element (2 or 4)");
    return print_activation_plans(activations[0], activations[1], static_cast<std::size_t>(activations[2]), tp,
                                  json);
  }
  if (paper_zero_r) {
    for (const CLI::Option* o : app.get_options())
      if (o != paper_zero_r_flag && o != json_flag && o->count() > 0)
        return toolcli::usage_error(app, "--paper-zero-r prints the paper's fixed model; it takes only --json, not " +
                                             o->get_name());
    try {
      const paper::zero_r::result r = paper::zero_r::compute();
      if (json)
        std::cout << paper::zero_r::to_json(r).dump(2) << "\n";
      else
        paper::zero_r::print(r);
      return r.agreeing == static_cast<int>(r.figures.size()) ? 0 : 1;
    } catch (...) {
      std::fprintf(stderr, "zero_plan: %s\n",
                   toolcli::printable_message(zero::as_error(std::current_exception()).what()).c_str());
      return 1;
    }
  }
  if (paper_tables) {
    for (const CLI::Option* o : app.get_options())
      if (o != paper_flag && o != json_flag && o->count() > 0)
        return toolcli::usage_error(app, "--paper-tables prints the paper's fixed models; it takes only --json, not " +
                                             o->get_name());
    try {
      const paper::result r = paper::compute();
      if (json)
        std::cout << paper::to_json(r).dump(2) << "\n";
      else
        paper::print(r);
      return r.agreeing == r.figures ? 0 : 1;
    } catch (...) {
      std::fprintf(stderr, "zero_plan: %s\n",
                   toolcli::printable_message(zero::as_error(std::current_exception()).what()).c_str());
      return 1;
    }
  }
  if (slice_flag->count() > 0 && offload != "disk")
    return toolcli::usage_error(app, "--offload-slice sets the disk tier's slices; it needs --offload disk");
  if (const std::string p = trainer::zeropp_flags_problem(app, flags); !p.empty()) return toolcli::usage_error(app, p);
  flags.reproducible = reproducible;
  for (int stage : stages)
    for (int n : ranks) {
      flags.stage = stage;
      if (const std::string p = trainer::zeropp_problem(flags, n); !p.empty()) return toolcli::usage_error(app, p);
    }

  try {
    const model_description described =
        model_file.empty() ? model_description{mlp::make_spec(model), {}} : read_model(model_file);
    if (!model_file.empty()) check_groups(described, optimizer, "--model " + toolcli::quote(model_file));
    const zero::model_spec& whole = described.spec;
    if (tp > 1 && !whole.has_split_tensors())
      return toolcli::usage_error(app, "--tp " + std::to_string(tp) +
                                           " plans the pieces of split tensors, but no tensor of the model declares "
                                           "\"tp_split\" (give a --model whose tensors do)");
    const zero::model_spec spec = whole.piece(tp, 0);  // what each rank of a tensor-parallel group holds
    // The engine options exactly as the trainers set them from the same flags.
    flags.accum = accum;
    flags.clip = clip;
    flags.offload = offload;
    flags.offload_slice = offload_slice;
    flags.memory_limit = memory;  // the plan under that limit: overlap makes room within it
    zero::engine_options options = trainer::engine_options_of(flags);
    options.param_groups = described.groups;
    const bool overlapping = flags.overlap == "on";
    const zero::release_order order =
        release_order == "before-reduce" ? zero::release_order::before_reduce : zero::release_order::after_reduce;
    const auto prec = zero::plan_precision_named(precision);
    const auto opt = zero::plan_optimizer_named(optimizer);
    flags.offload_slice_given = slice_flag->count() > 0;
    std::vector<zero::plan_report> reports;
    std::vector<std::size_t> slices;  // --offload disk: each plan's slice (the trainers' choice under --memory)
    for (int stage : stages)
      for (int n : ranks) {
        const auto plan = [&](const zero::engine_options& o) {
          return zero::plan(spec, n, stage, prec, opt, o, overlapping, order);
        };
        zero::engine_options chosen = options;
        chosen.offload.slice_elements = trainer::offload_slice_of(flags, options, -1, plan);
        slices.push_back(chosen.offload.slice_elements);
        reports.push_back(plan(chosen));
      }
    const zero::zeropp_options& z = options.zeropp;
    std::string zeropp_text;  // ", qwZ int8/256, qgZ int8/256, hpZ, nodes of 2"
    if (z.qwz) zeropp_text += ", qwZ int" + std::to_string(z.weights.bits) + "/" + std::to_string(z.weights.block);
    if (z.qgz) zeropp_text += ", qgZ int" + std::to_string(z.gradients.bits) + "/" + std::to_string(z.gradients.block);
    if (z.qgz_error_feedback) zeropp_text += " with error feedback";
    if (z.hpz) zeropp_text += ", hpZ";
    if (z.node_size > 0) zeropp_text += ", nodes of " + std::to_string(z.node_size);
    if (options.shard_group_size > 0)
      zeropp_text += ", shard groups of " + std::to_string(options.shard_group_size) + " (HSDP)";
    if (overlapping) zeropp_text += ", overlap";
    if (!options.param_groups.empty())
      zeropp_text += ", " + std::to_string(options.param_groups.size()) + " parameter group" +
                     (options.param_groups.size() == 1 ? "" : "s");
    if (order == zero::release_order::before_reduce) zeropp_text += ", release before reduce";

    const zero::plan_report& first = reports.front();
    if (json) {
      nlohmann::json j = {{"model", model_file.empty() ? "mlp" : model_file},
                          {"units", spec.num_units()},
                          {"params", first.numel},
                          {"precision", precision},
                          {"optimizer", optimizer},
                          {"accum", accum},
                          {"clip", clip},
                          {"reproducible", reproducible},
                          {"offload", offload},
                          {"qwz", z.qwz},
                          {"qgz", z.qgz},
                          {"qgz_error_feedback", z.qgz_error_feedback},
                          {"hpz", z.hpz},
                          {"node_size", z.node_size},
                          {"quant_block", flags.quant_block},
                          {"qwz_bits", flags.qwz_bits},
                          {"qgz_bits", flags.qgz_bits},
                          {"overlap", overlapping},
                          {"release_order", zero::to_string(order)},
                          {"param_groups", options.param_groups.size()},
                          {"tensor_parallel", tp},
                          {"plans", nlohmann::json::array()}};
      if (memory > 0) j["memory_bytes"] = memory;
      for (std::size_t i = 0; i < reports.size(); ++i) {
        j["plans"].push_back(report_json(reports[i], memory));
        if (offload == "disk") j["plans"].back()["offload_slice"] = slices[i];
      }
      std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      return 0;
    }

    std::printf("%s: %zu units, %zu parameters; %s, %s, %d micro-batch%s%s%s%s%s\n",
                model_file.empty() ? "MLP" : toolcli::quote(model_file).c_str(), spec.num_units(), first.numel,
                precision.c_str(), optimizer.c_str(), accum, accum == 1 ? "" : "es", clip > 0 ? ", clipping" : "",
                reproducible ? ", reproducible" : "", offload == "none" ? "" : (", offload " + offload).c_str(),
                zeropp_text.c_str());
    if (tp > 1)
      std::printf("one rank of a dp x %d mesh: its pieces of the split tensors and the replicated ones whole "
                  "(%zu of the model's %zu parameters); \"ranks\" is the data-parallel size\n",
                  tp, spec.numel(), whole.numel());
    std::printf("bytes per rank; \"transient\" is the most held at once by a step's buffers, \"peak\" adds it to the "
                "model states\n");
    std::printf("bytes sent per step: \"sent/step\" by the gathers, reduces and parameter updates (comm().last_step), "
                "\"control/step\" by step()'s own collectives (the norm, the settings' fingerprint, a tensor-wise "
                "optimizer's sums, a matrix optimizer's exchange)\n\n");
    if (offload != "none")
      std::printf("\"offload\": the tier's host memory (the host tier's arrays; the disk tier's slice buffers and "
                  "checksums), counted as the rank's on a CPU system; \"offloaded\": the arrays in the tier\n");
    const bool off = offload != "none";
    if (offload == "disk")
      std::printf("\"slice\": the disk tier's elements per slice (%s)\n",
                  flags.offload_slice_given || memory == 0
                      ? "--offload-slice"
                      : "the largest up to --offload-slice's default that fits --memory, as the trainers choose it");
    const bool disk = offload == "disk";
    // The part of the bytes sent that goes between nodes (with shard groups, between the groups).
    const bool nodes = z.node_size > 0 || options.shard_group_size > 0;
    if (z.node_size > 0)
      std::printf("\"between nodes\": the part of sent/step that leaves the rank's node (nodes of %d ranks)\n",
                  z.node_size);
    else if (nodes)
      std::printf(
          "\"between nodes\": the part of sent/step that crosses the shard groups of %d ranks (each a node); "
          "the model states are ZeRO's at that many ranks\n",
          options.shard_group_size);
    std::printf("%5s %6s %11s %11s %11s %11s%s %12s %11s %11s %12s %12s%s%s\n", "stage", "ranks", "params", "grads",
                "master", "optimizer", off ? (disk ? "     offload   offloaded     slice" : "     offload   offloaded") : "",
                "model states", "transient", "peak",
                "sent/step", "control/step", nodes ? " between nodes" : "",
                memory > 0 ? ("  fits " + size_text(memory)).c_str() : "");
    int last_stage = -1;
    for (std::size_t i = 0; i < reports.size(); ++i) {
      const zero::plan_report& p = reports[i];
      if (p.stage != last_stage && last_stage >= 0 && ranks.size() > 1) std::printf("\n");
      last_stage = p.stage;
      char offload_columns[48] = "";
      if (off)
        std::snprintf(offload_columns, sizeof offload_columns, " %11s %11s", size_text(p.model_states.offload).c_str(),
                      size_text(p.offloaded_bytes).c_str());
      if (disk)
        std::snprintf(offload_columns + std::strlen(offload_columns), sizeof offload_columns - std::strlen(offload_columns),
                      " %9zu", slices[i]);
      char inter_column[32] = "";
      if (nodes)
        std::snprintf(inter_column, sizeof inter_column, " %13s", size_text(p.step_comm.inter_node_bytes()).c_str());
      std::printf("%5d %6d %11s %11s %11s %11s%s %12s %11s %11s %12s %12s%s%s\n", p.stage, p.ranks * p.replicas,
                  size_text(p.model_states.params).c_str(), size_text(p.model_states.grads).c_str(),
                  size_text(p.model_states.master).c_str(), size_text(p.model_states.optimizer_states).c_str(),
                  offload_columns, size_text(p.model_states.total()).c_str(), size_text(p.step_transient_peak).c_str(),
                  size_text(p.peak_bytes).c_str(), size_text(p.step_bytes_sent()).c_str(),
                  size_text(p.control_comm.total_bytes()).c_str(), inter_column,
                  memory > 0 ? (p.fits(memory) ? "  yes" : "  no") : "");
    }
    std::uint64_t consolidation = 0;
    for (const auto& p : reports) consolidation = std::max(consolidation, p.consolidation_bytes);
    if (consolidation > 0)
      std::printf("\nfull_params(), export and the trainers' final hash gather one unit at a time in fp32 "
                  "(stages 1-3): up to %s transient, instead of the step's if larger.\n",
                  size_text(consolidation).c_str());
  } catch (...) {
    // Any failure (std::bad_alloc included) as one escaped line: names from --model may hold anything.
    std::fprintf(stderr, "zero_plan: %s\n",
                 toolcli::printable_message(zero::as_error(std::current_exception()).what()).c_str());
    return 1;
  }
  return 0;
}
