// The toy model trained by the device engine on comm::cuda_threads ranks, with the host's gradients copied in.
#pragma once

// The gradients are the toy model's (toy::gradient, computed on the host from the gathered
// parameters copied back), so a device run and a host run (toy::run on comm::threads) see exactly
// the same inputs: any difference in the parameters comes from the engine, its kernels or its
// collectives.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../toy_model.hpp"
#include "zero/zero_cuda.cuh"

namespace device_toy {

// One step of the protocol, as toy::train_step, with device buffers.
template <class Engine>
zero::step_report train_step(Engine& e, int rank, std::uint64_t t) {
  using P = typename Engine::param_type;
  using G = typename Engine::grad_type;
  const auto& s = e.spec();
  for (std::size_t u = 0; u < s.num_units(); ++u) {
    auto p = e.gather(zero::unit_id{u});
    p.release();
  }
  std::vector<std::size_t> unit_base(s.num_units(), 0);
  for (std::size_t u = 1; u < s.num_units(); ++u) unit_base[u] = unit_base[u - 1] + s.units()[u - 1].numel;
  for (std::size_t u = s.num_units(); u-- > 0;) {
    const zero::unit_id id{u};
    auto p = e.gather(id);
    auto g = e.grads(id);
    const auto pv = p.view();
    const auto gv = g.view();
    std::vector<P> params(pv.size());
    std::vector<G> grads(pv.size());
    zero::sys::cuda::copy(params.data(), pv.data(), params.size() * sizeof(P));
    const float scale = e.loss_scale();
    for (std::size_t j = 0; j < params.size(); ++j)
      grads[j] = static_cast<G>(toy::gradient(static_cast<float>(params[j]), rank, t, unit_base[u] + j) * scale);
    zero::sys::cuda::copy(gv.data(), grads.data(), grads.size() * sizeof(G));
    e.reduce(id);
  }
  return e.step();
}

struct run_result {
  std::vector<float> params;  // consolidated, from rank 0
  std::vector<zero::memory_report> memory;          // the engine's accounting, per rank
  std::vector<zero::gpu::memory_stats> device;      // the rank's device allocator, per rank
  std::vector<zero::gpu::memory_stats> device_after_init;  // ... after construction and initialize()
  std::vector<std::size_t> engine_bytes_after_init;        // the engine's current bytes at that point
  std::vector<std::vector<zero::step_report>> reports;
  std::uint64_t model_state_formula = 0;
  zero::overlap_report overlap;  // rank 0's
};

// Trains the toy model for `steps` steps on N ranks sharing device 0, as toy::run does on threads.
template <class Stage, class Opt, class Prec = zero::precision::fp32>
run_result run(int n, int steps, Opt opt, zero::engine_options options = {}) {
  run_result res;
  const auto ranks = static_cast<std::size_t>(n);
  res.memory.resize(ranks);
  res.device.resize(ranks);
  res.device_after_init.resize(ranks);
  res.engine_bytes_after_init.resize(ranks);
  res.reports.resize(ranks);
  const zero::model_spec s = toy::spec();
  zero::comm::cuda_threads::launch(n, [&](zero::comm::cuda_threads& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    {
      zero::engine<Stage, zero::comm::cuda_threads, Opt, Prec> e(comm, s, opt, options);
      e.initialize(toy::initializer());
      res.device_after_init[r] = comm.context().memory();
      std::size_t total = 0;
      for (auto b : e.memory().current) total += b;
      res.engine_bytes_after_init[r] = total;
      for (int t = 0; t < steps; ++t)
        res.reports[r].push_back(train_step(e, comm.rank(), static_cast<std::uint64_t>(t)));
      res.memory[r] = e.memory();
      res.device[r] = comm.context().memory();
      auto full = e.full_params();
      if (comm.rank() == 0) {
        res.params = std::move(full);
        res.model_state_formula = e.model_state_formula_bytes();
        res.overlap = e.overlap();
      }
    }
  });
  return res;
}

}  // namespace device_toy
