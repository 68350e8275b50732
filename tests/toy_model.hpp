// A toy model for engine tests: awkward unit sizes, gradients that depend on the parameters and the
// rank, and a single-process reference that sums the N per-rank gradients in rank order.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "engine_instances.hpp"
#include "optimizer_step.hpp"
#include "zero/zero.hpp"

namespace toy {

// Units of awkward sizes: a large one, a unit smaller than any N, one-element tensors, a 2-D one.
inline zero::model_spec spec() {
  zero::model_spec s;
  s.unit("embed").tensor("w", {37, 11});
  s.unit("tiny").tensor("scale", {1});
  s.unit("block").tensor("w", {29, 13}).tensor("b", {29}).tensor("gain", {1});
  s.unit("head").tensor("w", {5, 29}).tensor("b", {5});
  return s;
}

// The unpadded global index of each unit's first element.
inline std::vector<std::size_t> unit_bases(const zero::model_spec& s) {
  std::vector<std::size_t> b(s.num_units(), 0);
  for (std::size_t u = 1; u < s.num_units(); ++u) b[u] = b[u - 1] + s.units()[u - 1].numel;
  return b;
}

// Initial value of the parameter at unpadded global index i.
inline float initial(std::size_t i) { return 0.02f * (static_cast<float>((i * 7919) % 2003) - 1001.0f) / 1001.0f; }

// Rank r's gradient for the parameter at global index i with current value w at step t: depends on
// all three, so a divergence anywhere shows up in later steps.
inline float gradient(float w, int r, std::uint64_t t, std::size_t i) {
  return std::sin(w * static_cast<float>(r + 1) * 0.7f + static_cast<float>(t) * 0.3f + static_cast<float>(i) * 0.013f) *
         (0.5f + 0.1f * static_cast<float>(r));
}

inline zero::init_fn initializer() {
  return [](const zero::unit_spec& u, const zero::tensor_spec& t, std::span<float> v) {
    // Global index of the tensor's first element: the unpadded offsets of everything declared before.
    static const zero::model_spec s = spec();
    std::size_t base = 0;
    for (const auto& unit : s.units()) {
      for (const auto& ts : unit.tensors) {
        if (unit.name == u.name && ts.name == t.name) {
          for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial(base + j);
          return;
        }
        base += ts.numel;
      }
    }
  };
}

// The same values through ranges (zero::init_range_fn): element i of a tensor is initial(base + i).
inline zero::init_range_fn range_initializer() {
  return [](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    static const zero::model_spec s = spec();
    std::size_t base = 0;
    for (const auto& unit : s.units()) {
      for (const auto& ts : unit.tensors) {
        if (unit.name == u.name && ts.name == t.name) {
          for (std::size_t j = 0; j < v.size(); ++j) v[j] = initial(base + r.begin + j);
          return;
        }
        base += ts.numel;
      }
    }
  };
}

// One step of the protocol on this rank: a forward pass over all units (gather, release) and a
// backward pass in reverse (gather, grads, reduce, release), then step().
template <class Engine>
zero::step_report train_step(Engine& e, int rank, std::uint64_t t) {
  const auto& s = e.spec();
  for (std::size_t u = 0; u < s.num_units(); ++u) {
    auto p = e.gather(zero::unit_id{u});
    p.release();
  }
  const auto unit_base = unit_bases(s);
  for (std::size_t u = s.num_units(); u-- > 0;) {
    const zero::unit_id id{u};
    auto p = e.gather(id);
    auto g = e.grads(id);
    const auto pv = p.view();
    const auto gv = g.view();
    // Gradients of the scaled loss, stored in the precision's gradient type (x 1 is exact for fp32).
    using G = typename Engine::grad_type;
    const float scale = e.loss_scale();
    for (std::size_t j = 0; j < pv.size(); ++j)
      gv.data()[j] = static_cast<G>(gradient(static_cast<float>(pv.data()[j]), rank, t, unit_base[u] + j) * scale);
    e.reduce(id);
  }
  return e.step();
}

struct run_result {
  std::vector<float> params;  // consolidated, from rank 0
  // Every optimizer slot, unpadded and global, slot after slot (slots[k * numel + i]): read by each
  // rank from its canonical range, so the ranks fill disjoint parts.
  std::vector<float> slots;
  std::vector<zero::memory_report> memory;
  std::vector<zero::comm_report> comm;
  std::vector<std::vector<zero::step_report>> reports;  // per rank, per step
  std::uint64_t model_state_formula = 0, comm_formula = 0, padded = 0;
};

// The backend itself (run's default wrapper).
template <class C>
using same_comm = C;

// Trains the toy model for `steps` steps on N thread ranks under one stage and optimizer; the engine
// talks to Wrap<comm::threads>, built from the rank's comm::threads (a decorator under test).
template <class Stage, class Opt, class Prec = zero::precision::fp32, template <class> class Wrap = same_comm>
run_result run(int n, int steps, Opt opt, zero::engine_options options = {}) {
  run_result res;
  res.memory.resize(static_cast<std::size_t>(n));
  res.comm.resize(static_cast<std::size_t>(n));
  res.reports.resize(static_cast<std::size_t>(n));
  const zero::model_spec s = spec();
  res.slots.assign(s.numel() * static_cast<std::size_t>(Opt::slots), 0.0f);
  const auto bases = unit_bases(s);
  zero::comm::threads::launch(n, [&](zero::comm::threads& base) {
    using Comm = Wrap<zero::comm::threads>;
    std::optional<Comm> wrapped;  // the decorator, when there is one
    Comm& comm = [&]() -> Comm& {
      if constexpr (std::is_same_v<Comm, zero::comm::threads>) return base;
      else return wrapped.emplace(base);
    }();
    zero::engine<Stage, Comm, Opt, Prec> e(comm, s, opt, options);
    e.initialize(initializer());
    const auto r = static_cast<std::size_t>(comm.rank());
    for (int t = 0; t < steps; ++t) res.reports[r].push_back(train_step(e, comm.rank(), static_cast<std::uint64_t>(t)));
    res.memory[r] = e.memory();
    res.comm[r] = e.comm();
    for (std::size_t u = 0; u < s.num_units(); ++u) {
      const zero::unit_id id{u};
      const auto held = e.canonical_range(id);
      float* slots[Opt::slots > 0 ? Opt::slots : 1];
      for (int k = 0; k < Opt::slots; ++k)
        slots[k] = res.slots.data() + static_cast<std::size_t>(k) * s.numel() + bases[u] + held.begin;
      e.read_state(id, held, nullptr, slots);
    }
    auto full = e.full_params();
    if (comm.rank() == 0) {
      res.params = std::move(full);
      res.model_state_formula = e.model_state_formula_bytes();
      res.comm_formula = e.comm_formula_bytes();
      res.padded = e.layout().padded();
    }
  });
  return res;
}

// The order in which the reference sums the N per-rank gradients of an element.
enum class reduction_order { rank, reversed };

// The reference's final state: parameters and every optimizer slot, laid out as run_result's.
struct reference_state {
  std::vector<float> params, slots;
};

// The same training in one process, no engine: per element, the N gradients summed in rank order
// (acc = g0; acc += g1; ...; or from g[N-1] down with reduction_order::reversed, the guard that an
// equality with the engine depends on the order), divided by N, then the optimizer's rule.
template <class Opt>
reference_state reference_with_state(int n, int steps, Opt opt, reduction_order order = reduction_order::rank) {
  const zero::model_spec s = spec();
  reference_state out;
  std::vector<float>& w = out.params;
  w.resize(s.numel());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = initial(i);
  out.slots.assign(w.size() * static_cast<std::size_t>(Opt::slots), 0.0f);
  for (int t = 0; t < steps; ++t) {
    const auto c = opt.constants(static_cast<std::uint64_t>(t) + 1);
    const auto step = static_cast<std::uint64_t>(t);
    std::vector<float> averaged(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      float acc;
      if (order == reduction_order::rank) {
        acc = gradient(w[i], 0, step, i);
        for (int r = 1; r < n; ++r) acc += gradient(w[i], r, step, i);
      } else {
        acc = gradient(w[i], n - 1, step, i);
        for (int r = n - 2; r >= 0; --r) acc += gradient(w[i], r, step, i);
      }
      averaged[i] = acc / static_cast<float>(n);
    }
    // Each tensor whole (a tensor-wise optimizer's norms are the tensor's, a matrix optimizer's matrices its own).
    std::size_t at = 0;
    for (const zero::unit_spec& u : s.units())
      for (const zero::tensor_spec& t : u.tensors) {
        float* slots[Opt::slots > 0 ? Opt::slots : 1] = {};
        for (int k = 0; k < Opt::slots; ++k) slots[k] = out.slots.data() + static_cast<std::size_t>(k) * w.size() + at;
        testing::tensor_step<Opt>(c, averaged.data() + at, w.data() + at, slots, static_cast<float*>(nullptr), t.numel,
                                  &t.shape);
        at += t.numel;
      }
  }
  return out;
}

// The reference's parameters alone.
template <class Opt>
std::vector<float> reference(int n, int steps, Opt opt) {
  return reference_with_state(n, steps, opt).params;
}

}  // namespace toy
