// Which rank orthogonalizes each matrix of a matrix optimizer (optim::muon), and the bytes that brings each matrix to
// its owner and its result back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/comm/counted.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"

namespace zero {

// A matrix of the model: a tensor of shape (rows, cols) that takes the optimizer's matrix rule, or one
// matrix of a stack, a tensor of shape (..., rows, cols) (attention's q, k and v as one {3, C, C}
// tensor: three matrices, each orthogonalized on its own).
struct matrix_entry {
  std::size_t tensor = 0;  // its index in the unit
  range elements;          // unit-local: the matrix's rows x cols elements
  std::size_t rows = 0, cols = 0;
  int owner = 0;       // the rank that orthogonalizes it
  std::size_t at = 0;  // its offset in the owner's block of the unit's result exchange
};

// Every unit's matrices and their owners at N ranks. At N > 1 the step exchanges per unit that has
// matrices, on the control link:
//   - where the optimizer states are sharded (stages 1-3), two all_to_alls: each rank sends every
//     owner the elements it holds of the owner's matrices (its `pair_block`: the most one rank holds
//     of one owner's matrices, in model order), the owners orthogonalize, and send each rank back the
//     results for the same elements. Each element crosses the link once each way.
//     Over a backend without all_to_all (comm/all_to_all.hpp; every backend of the library has it):
//     an all-gather of the unit's slices (every rank then has each matrix whole) and the results'
//     all-gather below;
//   - where every rank holds whole matrices (stage 0), each owner orthogonalizes its matrices into its
//     block of `block` elements (the largest total of one rank's matrices in the unit), and an
//     all-gather of the blocks hands every rank every result (the reference implementation's split
//     of the work over data-parallel ranks).
// Owners are assigned over the whole model, the matrices by decreasing Newton-Schulz work (ties:
// model order), each to the rank with the least work so far (ties: the lowest rank). The owner
// decides only where the work runs, never a bit: every rank would compute the same result.
class matrix_owners {
 public:
  matrix_owners() = default;
  // is_matrix(u, t): whether tensor t of unit u takes the matrix rule.
  template <class IsMatrix>
  matrix_owners(const model_spec& spec, const layout& lay, IsMatrix&& is_matrix) : ranks_(lay.ranks()) {
    units_.resize(spec.num_units());
    blocks_.assign(spec.num_units(), 0);
    struct ref {
      std::size_t unit, index;
      double work;
    };
    std::vector<ref> all;
    for (std::size_t u = 0; u < spec.num_units(); ++u) {
      const unit_spec& us = spec.units()[u];
      for (std::size_t t = 0; t < us.tensors.size(); ++t) {
        const tensor_spec& ts = us.tensors[t];
        if (ts.shape.size() < 2 || ts.numel == 0 || !is_matrix(u, t)) continue;
        const std::size_t rows = ts.shape[ts.shape.size() - 2], cols = ts.shape.back();
        const range whole = lay.unit(unit_id{u}).tensors[t];
        for (std::size_t at = whole.begin; at < whole.end; at += rows * cols) {
          matrix_entry m;
          m.tensor = t;
          m.elements = range{at, at + rows * cols};
          m.rows = rows;
          m.cols = cols;
          all.push_back({u, units_[u].size(), work(m.rows, m.cols)});
          units_[u].push_back(m);
        }
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const ref& a, const ref& b) { return a.work > b.work; });
    std::vector<double> load(static_cast<std::size_t>(ranks_), 0.0);
    for (const ref& r : all) {
      const auto least = std::min_element(load.begin(), load.end());
      *least += r.work;
      units_[r.unit][r.index].owner = static_cast<int>(least - load.begin());
    }
    // Each unit's blocks: a rank's matrices in model order.
    for (std::size_t u = 0; u < units_.size(); ++u) {
      std::vector<std::size_t> used(static_cast<std::size_t>(ranks_), 0);
      for (matrix_entry& m : units_[u]) {
        std::size_t& at = used[static_cast<std::size_t>(m.owner)];
        m.at = at;
        at += m.elements.size();
      }
      blocks_[u] = units_[u].empty() ? 0 : *std::max_element(used.begin(), used.end());
    }
    // Each unit's all_to_all block: the most elements one rank holds of one owner's matrices.
    pair_blocks_.assign(units_.size(), 0);
    for (std::size_t u = 0; u < units_.size(); ++u)
      for (int r = 0; r < ranks_ && !units_[u].empty(); ++r) {
        std::vector<std::size_t> to(static_cast<std::size_t>(ranks_), 0);
        for (const matrix_entry& m : units_[u])
          to[static_cast<std::size_t>(m.owner)] += intersect(m.elements, lay.owned(unit_id{u}, r)).size();
        pair_blocks_[u] = std::max(pair_blocks_[u], *std::max_element(to.begin(), to.end()));
      }
  }

  // The work an owner is balanced by: the multiply-adds of one iteration of a Newton-Schulz
  // orthogonalization, X X^T (n n m), A A (n^3) and B X (n n m), n the smaller side.
  static double work(std::size_t rows, std::size_t cols) {
    const double n = static_cast<double>(std::min(rows, cols)), m = static_cast<double>(std::max(rows, cols));
    return 2.0 * n * n * m + n * n * n;
  }

  const std::vector<matrix_entry>& matrices(unit_id u) const { return units_[u.index]; }
  // The elements of each rank's block in unit u's result exchange.
  std::size_t block(unit_id u) const { return blocks_[u.index]; }
  // The elements of each rank's block in unit u's all_to_alls where the states are sharded.
  std::size_t pair_block(unit_id u) const { return pair_blocks_[u.index]; }
  // Whether the states' holders send each matrix to its owner and back by all_to_all (stages 1-3 over
  // a backend that has it), rather than gathering the unit whole.
  static constexpr bool to_owners(bool states_sharded, bool has_all_to_all) { return states_sharded && has_all_to_all; }
  bool any() const {
    return std::any_of(units_.begin(), units_.end(), [](const auto& v) { return !v.empty(); });
  }
  // The work of rank r's matrices (work() summed).
  double work_of(int r) const {
    double w = 0.0;
    for (const auto& v : units_)
      for (const matrix_entry& m : v)
        if (m.owner == r) w += work(m.rows, m.cols);
    return w;
  }

  // One step's exchange per rank, in bus bytes (comm/counted.hpp), fp32, per unit with matrices: two
  // all_to_alls of N pair blocks (to_owners), else an all-gather of its padded extent (where the states
  // are sharded) and one of N blocks. 0 at N = 1: the rank orthogonalizes every matrix itself.
  std::uint64_t exchange_bytes(const layout& lay, bool states_sharded, bool has_all_to_all) const {
    std::uint64_t bytes = 0;
    for_each_collective(lay, states_sharded, has_all_to_all, [&](comm::collective c, std::uint64_t buffer) {
      bytes += comm::bus_bytes(c, buffer, ranks_);
    });
    return bytes;
  }
  // Calls f(collective, buffer bytes) for each collective of one step's exchange, in order (the plan
  // counts them per link level).
  template <class F>
  void for_each_collective(const layout& lay, bool states_sharded, bool has_all_to_all, F&& f) const {
    if (ranks_ <= 1) return;
    const auto n = static_cast<std::uint64_t>(ranks_);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].empty()) continue;
      if (to_owners(states_sharded, has_all_to_all)) {
        f(comm::collective::all_to_all, n * pair_blocks_[u] * sizeof(float));
        f(comm::collective::all_to_all, n * pair_blocks_[u] * sizeof(float));
        continue;
      }
      if (states_sharded) f(comm::collective::all_gather, lay.unit(unit_id{u}).padded * sizeof(float));
      f(comm::collective::all_gather, n * blocks_[u] * sizeof(float));
    }
  }
  // The elements a step stages (each matrix's u, then its result, for the elements a rank holds): the
  // largest rank's count, which every rank allocates, so that the memory is the same on every rank.
  std::size_t staged_elements(const layout& lay, bool states_sharded) const {
    std::size_t most = 0;
    for (int r = 0; r < (states_sharded ? ranks_ : 1); ++r) {
      std::size_t n = 0;
      for (std::size_t u = 0; u < units_.size(); ++u)
        for (const matrix_entry& m : units_[u])
          n += intersect(m.elements, lay.updated_real(unit_id{u}, r, states_sharded)).size();
      most = std::max(most, n);
    }
    return most;
  }
  // The most transient memory of one unit's exchange (bytes): to_owners, the all_to_alls' send and
  // receive buffers and the owner's block of its matrices; else the gathered unit (where the states
  // are sharded) and the blocks. 0 at N = 1.
  std::uint64_t exchange_buffer_bytes(const layout& lay, bool states_sharded, bool has_all_to_all) const {
    if (ranks_ <= 1) return 0;
    const auto n = static_cast<std::uint64_t>(ranks_);
    std::uint64_t most = 0;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].empty()) continue;
      const std::uint64_t elements = to_owners(states_sharded, has_all_to_all)
                                         ? 2 * n * pair_blocks_[u] + blocks_[u]
                                         : (states_sharded ? lay.unit(unit_id{u}).padded : 0) + n * blocks_[u];
      most = std::max<std::uint64_t>(most, elements * sizeof(float));
    }
    return most;
  }

 private:
  int ranks_ = 1;
  std::vector<std::vector<matrix_entry>> units_;
  std::vector<std::size_t> blocks_;
  std::vector<std::size_t> pair_blocks_;
};

}  // namespace zero
