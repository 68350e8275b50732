// The device engine for every stage and optimizer of zero/catalog.hpp on each device backend, so nvcc compiles every kernel.
#pragma once

#include <string>
#include <type_traits>

#include "zero/comm/mesh.hpp"
#include "zero/zero_cuda.cuh"

namespace instantiate {

// Every public member of the engine, called once: compiling this for an engine type compiles every
// member the protocol, the state access and the reports use (and so every kernel they launch and
// every collective they call). Referenced, never run.
template <class E>
void every_member(typename E::comm_backend& comm, const zero::model_spec& spec) {
  // ZeRO++ on (run-time options): every quantization kernel and the split compile for the device.
  zero::engine_options zeropp;
  zeropp.zeropp.qwz = zeropp.zeropp.hpz = E::partitioner::shards_parameters;
  zeropp.zeropp.qgz = E::partitioner::shards_optimizer_states;
  zeropp.zeropp.node_size = 1;
  E z(comm, spec, typename E::optimizer{}, zeropp);
  (void)z.comm_formula_by_level();
  E e(comm, spec, typename E::optimizer{}, zero::engine_options{});
  e.initialize(zero::init_fn{});
  e.initialize(zero::init_range_fn{}, zero::init_source::broadcast_from_rank0);
  const zero::unit_id u{0};
  {
    auto p = e.gather(u);
    (void)p.view();
    (void)p["w"];
    p.release();
  }
  {
    auto p = e.gather(u);
    auto g = e.grads(u);
    (void)g.view();
    (void)g["w"];
    e.reduce(u);
    e.release(u);
  }
  (void)e.step();
  (void)e.loss_scale();
  (void)e.options();
  (void)e.full_params();
  (void)e.full_params(u);
  const zero::range r = e.held_range(u);
  (void)e.canonical_range(u);
  float* slots[E::optimizer::slots > 0 ? E::optimizer::slots : 1] = {};
  e.read_state(u, r, nullptr, slots);
  e.write_state(u, r, nullptr, slots);
  e.finish_load(e.state());
  (void)e.memory();
  (void)e.comm();
  (void)e.state_sizes();
  (void)e.model_state_formula_bytes();
  (void)e.comm_formula_bytes();
  (void)e.spec();
  (void)e.layout();
  (void)e.optimizer_settings();  // (optimizer_state(), its deprecated name, returns the same)
  (void)e.rank();
  (void)e.world_size();
  (void)e.steps();
  // In a tensor-parallel mesh: the exchanges over the group go through the device's memory.
  if constexpr (zero::comm::splittable<typename E::comm_backend>) {
    zero::comm::mesh<typename E::comm_backend> m(comm, {1, 1});
    E t(m, spec);
    (void)t.full_model_params();
    (void)t.model();
    (void)t.tensor_parallel_size();
    (void)t.tensor_parallel_rank();
  }
}

// Every stage and every optimizer of the library's lists on backend Comm in precision Prec: each stage
// with AdamW, and each other optimizer at stage 3. The stages differ in the engine's control code and
// the optimizers only in the update kernel (the same segment loop in every stage), so this compiles
// every kernel and every stage's code with half of the 12 engines of the full product, which
// train_mlp_cuda instantiates anyway (every stage x optimizer x precision on both device backends).
template <class Comm, class Prec>
void engines(Comm& comm, const zero::model_spec& spec) {
  zero::stages::for_each([&]<class S>() { every_member<zero::engine<S, Comm, zero::optim::adamw, Prec>>(comm, spec); });
  zero::optimizers::for_each([&]<class O>() {
    // (a tensor-wise or matrix optimizer, optim::lamb or optim::muon, runs on host systems only:
    // concepts/optimizer_state.hpp)
    if constexpr (!std::is_same_v<O, zero::optim::adamw> && zero::ElementwiseOptimizer<O>)
      every_member<zero::engine<zero::stage3, Comm, O, Prec>>(comm, spec);
  });
}

template <class Prec>
void device_engines(const zero::model_spec& spec) {
  (void)&engines<zero::comm::cuda_threads, Prec>;
#if ZERO_WITH_NCCL
  (void)&engines<zero::comm::nccl, Prec>;
#endif
  (void)spec;
}

}  // namespace instantiate

// Compiles every engine of precision Prec on the device backends (referenced, never called).
#define ZERO_INSTANTIATE_DEVICE_ENGINES(Prec) \
  void (*volatile instantiated_engines)(const zero::model_spec&) = &instantiate::device_engines<Prec>;
