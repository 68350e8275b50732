// The ZeRO paper's Tables 1 and 2 computed by zero::plan, each figure beside the paper's (zero_plan --paper-tables).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "zero/plan_by_name.hpp"
#include "zero/zero.hpp"

namespace paper {

// Rajbhandari, Rasley, Ruwase, He, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", SC'20 (arXiv:1910.02054): Table 1 (discussed in section 5.4) and Table 2 (in section 9),
// transcribed figure by figure as printed. They are the expectation the planner's figures are compared with.
inline constexpr std::string_view source =
    "Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion Parameter Models, SC'20 "
    "(arXiv:1910.02054), Tables 1 and 2";

// The paper's mixed-precision Adam: fp16 parameters and gradients (2 + 2 bytes), fp32 master weights
// and two fp32 slots (K = 12). AdamW keeps the same states as Adam.
inline constexpr std::string_view precision = "fp16", optimizer = "adamw";
inline constexpr std::uint64_t gb = 1'000'000'000;  // the paper's GB: 16 TB / 1024 devices = 15.6 GB

inline constexpr std::array<int, 3> stages{1, 2, 3};  // Pos, Pos+g, Pos+g+p: ZeRO stages 1, 2, 3
inline constexpr std::string_view stage_name(int stage) {
  constexpr std::array<std::string_view, 4> names{"Baseline", "Pos", "Pos+g", "Pos+g+p"};
  return names[static_cast<std::size_t>(stage)];
}

// Table 1: model-state memory per device (GB) at each DP degree; cells in Pos, Pos+g, Pos+g+p order.
inline constexpr std::array<int, 6> table1_dp{1, 4, 16, 64, 256, 1024};
struct table1_model {
  std::string_view name;
  std::uint64_t parameters;
  std::array<std::array<std::string_view, 3>, 6> cells;  // [row of table1_dp][stage]
};
inline constexpr std::array<table1_model, 3> table1{{
    {"7.5B",
     7'500'000'000,
     {{{"120", "120", "120"},
       {"52.5", "41.3", "30"},
       {"35.6", "21.6", "7.5"},
       {"31.4", "16.6", "1.88"},
       {"30.4", "15.4", "0.47"},
       {"30.1", "15.1", "0.12"}}}},
    {"128B",
     128'000'000'000,
     {{{"2048", "2048", "2048"},
       {"896", "704", "512"},
       {"608", "368", "128"},
       {"536", "284", "32"},
       {"518", "263", "8"},
       {"513", "257", "2"}}}},
    {"1T",
     1'000'000'000'000,
     {{{"16000", "16000", "16000"},
       {"7000", "5500", "4000"},
       {"4750", "2875", "1000"},
       {"4187", "2218", "250"},
       {"4046", "2054", "62.5"},
       {"4011", "2013", "15.6"}}}},
}};

// Table 2: the largest model whose model states fit a 32 GB V100, with MP-way model parallelism on
// 64 x MP GPUs (64-way data parallelism); cells in Baseline, Pos, Pos+g, Pos+g+p order.
inline constexpr std::uint64_t table2_memory = 32 * gb;
inline constexpr int table2_dp = 64;
inline constexpr std::array<int, 4> table2_stages{0, 1, 2, 3};
struct table2_row {
  int mp;
  std::array<std::string_view, 4> cells;
};
inline constexpr std::array<table2_row, 5> table2{{
    {1, {"2B", "7.6B", "14.4B", "128B"}},
    {2, {"4B", "15.2B", "28.8B", "256B"}},
    {4, {"8B", "30.4B", "57.6B", "0.5T"}},
    {8, {"16B", "60.8B", "115.2B", "1T"}},
    {16, {"32B", "121.6B", "230.4B", "2T"}},
}};

// A figure as the paper prints it: "52.5" is 525 at 1 decimal; "7.6B" is 76 at 1 decimal of 10^9
// parameters; "0.5T" is 5 at 1 decimal of 10^12.
struct figure {
  std::uint64_t digits = 0;  // the figure times 10^decimals
  int decimals = 0;
  std::uint64_t unit = 1;  // of the base quantity (bytes, parameters) per 1 of the figure
  // The base quantity one step of its last printed digit stands for.
  std::uint64_t quantum() const {
    std::uint64_t q = unit;
    for (int i = 0; i < decimals; ++i) q /= 10;
    return q;
  }
};
inline figure parse_figure(std::string_view text, std::uint64_t unit) {
  figure f;
  f.unit = unit;
  if (!text.empty() && (text.back() == 'B' || text.back() == 'T')) {
    f.unit = text.back() == 'B' ? std::uint64_t{1'000'000'000} : std::uint64_t{1'000'000'000'000};
    text.remove_suffix(1);
  }
  bool point = false;
  for (char c : text) {
    if (c == '.') {
      point = true;
      continue;
    }
    f.digits = f.digits * 10 + static_cast<std::uint64_t>(c - '0');
    if (point) ++f.decimals;
  }
  return f;
}

// The comparison rule: the paper's figure agrees with an exact quantity (bytes or parameters) when it
// is that quantity rounded (half up) or truncated to the decimals the figure prints. The paper rounds
// the 7.5B model's cells (30.35 GB is 30.4) and truncates the larger ones' (4187.5 GB is 4187).
inline bool agrees(const figure& f, std::uint64_t exact) {
  const std::uint64_t q = f.quantum();
  return f.digits == exact / q || f.digits == (exact + q / 2) / q;
}

// A model of `parameters` parameters as one unit: its only padding is that unit's (less than N x 32
// elements), so the planner's bytes are the paper's formulas at the padded Psi.
inline zero::model_spec one_unit_model(std::uint64_t parameters) {
  zero::model_spec spec;
  spec.unit("model").tensor("parameters", {static_cast<std::size_t>(parameters)});
  return spec;
}

// The planner's model-state bytes per rank (params + grads + master + optimizer states).
inline std::uint64_t model_state_bytes(std::uint64_t parameters, int ranks, int stage) {
  return zero::plan(one_unit_model(parameters), ranks, stage, zero::plan_precision_named(precision),
                    zero::plan_optimizer_named(optimizer))
      .model_states.total();
}

// The most parameters whose model states per rank the planner fits in `memory` bytes at `ranks`
// ranks (bisection: the bytes grow with the parameters, padding included).
inline std::uint64_t largest_fitting(std::uint64_t memory, int ranks, int stage) {
  std::uint64_t lo = 1, hi = zero::model_spec::max_elements;  // lo fits; hi does not (checked below)
  ZERO_CHECK(model_state_bytes(lo, ranks, stage) <= memory && model_state_bytes(hi, ranks, stage) > memory,
             invalid_argument, "paper tables: ", memory, " bytes at ", ranks, " ranks, stage ", stage,
             " do not bracket a largest model in [1, 2^50] parameters");
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (model_state_bytes(mid, ranks, stage) <= memory ? lo : hi) = mid;
  }
  return lo;
}

struct cell {
  std::string_view paper;
  int stage = 0;
  std::uint64_t planner = 0;   // Table 1: bytes per device; Table 2: the largest model's parameters
  std::uint64_t compared = 0;  // what the rule compares with the paper's figure (Table 1: = planner)
  bool agrees = false;
};
struct result {
  std::vector<std::vector<std::vector<cell>>> table1;  // [model][DP row][stage]
  std::array<std::uint64_t, 4> table2_share{};         // per stage: the most parameters one device's model states hold
  std::vector<std::vector<cell>> table2;               // [MP row][stage]
  int figures = 0, agreeing = 0;
};

// Both tables from the planner. Table 2: with MP-way model parallelism each device holds 1/MP of the
// model (the paper's assumption), so the largest model is MP times the largest one-device share the
// planner fits at DP = 64. The paper prints MP times its MP = 1 figure (121.6B = 16 x 7.6B, where the
// bound is 16 x 7.64B = 122.3B): each row is compared as MP x the MP = 1 share rounded to the
// precision the MP = 1 row prints.
inline result compute() {
  result r;
  for (const table1_model& m : table1) {
    auto& rows = r.table1.emplace_back();
    for (std::size_t d = 0; d < table1_dp.size(); ++d) {
      auto& row = rows.emplace_back();
      for (std::size_t s = 0; s < stages.size(); ++s) {
        const std::uint64_t bytes = model_state_bytes(m.parameters, table1_dp[d], stages[s]);
        row.push_back({m.cells[d][s], stages[s], bytes, bytes, agrees(parse_figure(m.cells[d][s], gb), bytes)});
      }
    }
  }
  for (std::size_t s = 0; s < table2_stages.size(); ++s)
    r.table2_share[s] = largest_fitting(table2_memory, table2_dp, table2_stages[s]);
  for (const table2_row& row : table2) {
    auto& cells = r.table2.emplace_back();
    for (std::size_t s = 0; s < table2_stages.size(); ++s) {
      const std::uint64_t q1 = parse_figure(table2[0].cells[s], 1).quantum();
      const std::uint64_t share_as_printed = (r.table2_share[s] + q1 / 2) / q1 * q1;
      const auto mp = static_cast<std::uint64_t>(row.mp);
      const std::uint64_t compared = mp * share_as_printed;
      cells.push_back({row.cells[s], table2_stages[s], mp * r.table2_share[s], compared,
                       agrees(parse_figure(row.cells[s], 1), compared)});
    }
  }
  auto count = [&r](const std::vector<cell>& row) {
    for (const cell& c : row) {
      ++r.figures;
      if (c.agrees) ++r.agreeing;
    }
  };
  for (const auto& t : r.table1)
    for (const auto& row : t) count(row);
  for (const auto& row : r.table2) count(row);
  return r;
}

inline constexpr std::string_view rule =
    "the paper's figure is the planner's rounded (half up) or truncated to the decimals it prints; Table 2 "
    "compares MP x (the planner's largest one-device share rounded to the precision of the MP = 1 row)";

inline nlohmann::json to_json(const result& r) {
  nlohmann::json j = {{"source", source}, {"precision", precision}, {"optimizer", optimizer}, {"k", 12},
                      {"gb_bytes", gb},   {"rule", rule},           {"figures", r.figures},   {"agreeing", r.agreeing}};
  auto cell_json = [](const cell& c, const char* planner_key) {
    nlohmann::json cj = {{"stage", c.stage},
                         {"name", stage_name(c.stage)},
                         {planner_key, c.planner},
                         {"paper", c.paper},
                         {"agrees", c.agrees}};
    return cj;
  };
  nlohmann::json t1 = nlohmann::json::array();
  for (std::size_t m = 0; m < table1.size(); ++m) {
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t d = 0; d < table1_dp.size(); ++d) {
      nlohmann::json cells = nlohmann::json::array();
      for (const cell& c : r.table1[m][d]) cells.push_back(cell_json(c, "planner_bytes"));
      rows.push_back({{"dp", table1_dp[d]}, {"cells", cells}});
    }
    t1.push_back({{"model", table1[m].name}, {"parameters", table1[m].parameters}, {"rows", rows}});
  }
  j["table1"] = t1;
  nlohmann::json shares = nlohmann::json::object();
  for (std::size_t s = 0; s < table2_stages.size(); ++s)
    shares[std::string(stage_name(table2_stages[s]))] = r.table2_share[s];
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < table2.size(); ++i) {
    nlohmann::json cells = nlohmann::json::array();
    for (const cell& c : r.table2[i]) {
      nlohmann::json cj = cell_json(c, "planner_parameters");
      cj["compared_parameters"] = c.compared;
      cells.push_back(cj);
    }
    rows.push_back({{"mp", table2[i].mp}, {"gpus", table2_dp * table2[i].mp}, {"cells", cells}});
  }
  j["table2"] = {{"memory_bytes", table2_memory}, {"dp", table2_dp}, {"largest_share", shares}, {"rows", rows}};
  return j;
}

// "   31.4063 | 31.4 ": the planner's figure right-aligned, the paper's left-aligned, so the bars line
// up; " (differs)" follows a paper figure the rule does not match.
inline std::string cell_text(const std::string& planner, const cell& c, std::size_t planner_width,
                             std::size_t paper_width) {
  std::string left = planner, right = std::string(c.paper) + (c.agrees ? "" : " (differs)");
  if (left.size() < planner_width) left.insert(0, planner_width - left.size(), ' ');
  if (right.size() < paper_width) right.append(paper_width - right.size(), ' ');
  return left + " | " + right;
}

// One line of a table, without the padding its last column leaves.
inline void put_line(std::string line) {
  while (!line.empty() && line.back() == ' ') line.pop_back();
  std::printf("%s\n", line.c_str());
}

inline void print(const result& r) {
  std::printf("%.*s, from zero::plan\n", static_cast<int>(source.size()), source.data());
  std::printf(
      "fp16 parameters and gradients, fp32 master weights and AdamW's two fp32 slots (K = 12); each model one unit "
      "(padded to a multiple of N x 32 elements); GB = 10^9 bytes\n"
      "each figure: the planner's | the paper's, which agree when the paper's is the planner's rounded or truncated "
      "to the decimals it prints\n\n");
  std::printf("Table 1: model-state memory per device (GB)\n");
  char buf[128];
  for (std::size_t m = 0; m < table1.size(); ++m) {
    std::snprintf(buf, sizeof buf, "%-6.*s %5s  %-18s  %-18s  %-18s", static_cast<int>(table1[m].name.size()),
                  table1[m].name.data(), "DP", "       Pos", "       Pos+g", "       Pos+g+p");
    std::printf("\n");
    put_line(buf);
    for (std::size_t d = 0; d < table1_dp.size(); ++d) {
      std::snprintf(buf, sizeof buf, "%6s %5d", "", table1_dp[d]);
      std::string line = buf;
      for (const cell& c : r.table1[m][d]) {
        std::snprintf(buf, sizeof buf, "%.4f", static_cast<double>(c.planner) / static_cast<double>(gb));
        line += "  " + cell_text(buf, c, 10, 5);
      }
      put_line(line);
    }
  }
  std::printf(
      "\nTable 2: the largest model whose model states fit 32 GB per device, MP-way model parallel x 64-way data "
      "parallel (each device holds 1/MP of the model), parameters\n");
  std::snprintf(buf, sizeof buf, "%4s %5s  %-17s  %-17s  %-17s  %-17s", "MP", "GPUs", "     Baseline", "     Pos",
                "     Pos+g", "     Pos+g+p");
  put_line(buf);
  for (std::size_t i = 0; i < table2.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%4d %5d", table2[i].mp, table2_dp * table2[i].mp);
    std::string line = buf;
    for (const cell& c : r.table2[i]) {
      std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(c.planner) / 1e9);
      line += "  " + cell_text(buf, c, 8, 6);
    }
    put_line(line);
  }
  std::printf(
      "The paper's rows for MP > 1 are MP times its MP = 1 figure (121.6B = 16 x 7.6B), so each is compared as MP "
      "times the planner's MP = 1 figure rounded as printed; 0.5T is 4 x 128B.\n");
  std::printf("\n%d of %d figures agree with the paper.\n", r.agreeing, r.figures);
}

}  // namespace paper
