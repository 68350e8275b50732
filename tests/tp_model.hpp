// A small model in the Megatron layout for tests of the engine in a tensor-parallel mesh, with gradients that depend
// only on an element's place in the whole model.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "zero/zero.hpp"

namespace tp_model {

// A transformer block's shapes in miniature, Megatron's way: an embedding and a head kept whole
// (replicated), a column-parallel matrix and its bias split by output column, a row-parallel matrix
// split by input row, its bias and a gain replicated; sizes that do not fit a shard evenly.
inline zero::model_spec model() {
  zero::model_spec s;
  s.unit("embed").tensor("w", {13, 6}, zero::tp_replicated);
  s.unit("block")
      .tensor("w_in", {6, 12}, zero::tp_split(1))
      .tensor("b_in", {12}, zero::tp_split(0))
      .tensor("w_out", {12, 6}, zero::tp_split(0))
      .tensor("b_out", {6})
      .tensor("gain", {6}, zero::tp_replicated);
  s.unit("head").tensor("w", {6, 5}).tensor("b", {5});
  return s;
}

// Where each tensor of the whole model starts in the model's flat order: element i of tensor (u, k)
// is whole index bases[u][k] + i, the identity of a value at every tensor-parallel size.
inline std::vector<std::vector<std::size_t>> whole_bases(const zero::model_spec& whole) {
  std::vector<std::vector<std::size_t>> b;
  std::size_t at = 0;
  for (const auto& u : whole.units()) {
    b.emplace_back();
    for (const auto& t : u.tensors) {
      b.back().push_back(at);
      at += t.numel;
    }
  }
  return b;
}

inline float initial(std::size_t i) { return 0.03f * std::sin(0.37f * static_cast<float>(i) + 0.5f); }
inline float gradient(float w, int dp_rank, std::uint64_t step, std::size_t i) {
  return std::sin(w * 1.3f + 0.21f * static_cast<float>(i) + 0.4f * static_cast<float>(step) +
                  0.9f * static_cast<float>(dp_rank)) *
         (0.5f + 0.25f * static_cast<float>(dp_rank));
}

// The model's initial values as a function of whole tensors (what from_whole_tensors adapts).
inline zero::init_range_fn whole_init() {
  return [](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    static const zero::model_spec m = model();
    static const auto bases = whole_bases(m);
    const zero::unit_id id = m.find(u.name);
    std::size_t k = 0;
    while (m.units()[id.index].tensors[k].name != t.name) ++k;
    ZERO_CHECK(t.numel == m.units()[id.index].tensors[k].numel, invalid_argument, "tp_model: tensor '", t.name,
               "' is a piece: whole_init takes whole tensors (wrap it in zero::from_whole_tensors)");
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial(bases[id.index][k] + r.begin + j);
  };
}

// Which kind of mistake a run plants (none: a correct run).
enum class plant { none, replicated_grad_differs, nan_in_split_piece, nan_in_replicated_on_tp1, lr_on_tp1 };

// One micro-batch of mesh_step: `g_index` picks its gradients, `t` is the step (the planted mistakes').
template <class E>
void mesh_pass(E& e, int dp_rank, std::uint64_t g_index, std::uint64_t t, plant p) {
  const zero::model_spec& s = e.spec();
  static const auto bases = whole_bases(model());
  for (std::size_t u = 0; u < s.num_units(); ++u) e.gather(zero::unit_id{u}).release();
  for (std::size_t u = s.num_units(); u-- > 0;) {
    const zero::unit_id id{u};
    auto w = e.gather(id);
    auto g = e.grads(id);
    const auto& ul = e.layout().unit(id);
    using G = typename E::grad_type;
    for (std::size_t k = 0; k < s.units()[u].tensors.size(); ++k) {
      const zero::tensor_spec& ts = s.units()[u].tensors[k];
      for (std::size_t j = 0; j < ts.numel; ++j) {
        const std::size_t at = ul.tensors[k].begin + j;
        float v = gradient(static_cast<float>(w.view().data()[at]), dp_rank, g_index, bases[u][k] + zero::whole_index(ts, j));
        if (p == plant::replicated_grad_differs && !ts.tp.split() && e.tensor_parallel_rank() == 1 && j == 0) v += 0.5f;
        g.view().data()[at] = static_cast<G>(v * e.loss_scale());
      }
      const bool first_rank = e.tensor_parallel_rank() == 1 && dp_rank == 0 && t == 1;
      if (p == plant::nan_in_split_piece && ts.tp.split() && first_rank && u == 1 && k == 2)
        g.view().data()[ul.tensors[k].begin] = static_cast<G>(std::numeric_limits<float>::quiet_NaN());
      if (p == plant::nan_in_replicated_on_tp1 && !ts.tp.split() && first_rank && u == 2 && k == 1)
        g.view().data()[ul.tensors[k].begin] = static_cast<G>(std::numeric_limits<float>::infinity());
    }
    e.reduce(id);
  }
}

// One step: forward (gather, release) and backward (gather, grads, reduce) over the pieces, once per
// micro-batch (engine_options::micro_batches: micro-batch k of step t takes step t x M + k's
// gradients); each piece's gradient is the whole model's at its whole index, so every tensor-parallel
// size computes the same per-element gradients. Replicated tensors get the same gradient on every tp rank.
template <class E>
zero::step_report mesh_step(E& e, int dp_rank, std::uint64_t t, plant p = plant::none) {
  const auto m = static_cast<std::uint64_t>(e.options().micro_batches);
  for (std::uint64_t k = 0; k < m; ++k) mesh_pass(e, dp_rank, t * m + k, t, p);
  return e.step();
}

}  // namespace tp_model
