// quickstart: the README's usage example, built and run as a test: a two-unit model trained under ZeRO-3.
#include <cstdio>

#include "zero/zero.hpp"

int main() {
  // The model: units (gathered and released together) of named tensors.
  zero::model_spec spec;
  zero::unit_id fc1 = spec.unit("fc1").tensor("w", {16, 8}).tensor("b", {16});
  zero::unit_id fc2 = spec.unit("fc2").tensor("w", {4, 16}).tensor("b", {4});

  // Four ranks as threads of this process; with MPI or NCCL only the backend type changes.
  zero::comm::threads::launch(4, [&](zero::comm::threads& comm) {
    using engine = zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw>;
    engine e(comm, spec, zero::optim::adamw{.lr = 1e-2f});
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7);
    });

    for (int step = 0; step < 10; ++step) {
      for (zero::unit_id u : {fc1, fc2}) {  // forward: your kernels read the gathered parameters
        auto p = e.gather(u);
        (void)p["w"];
      }
      for (zero::unit_id u : {fc2, fc1}) {  // backward: your kernels write this rank's gradients
        auto p = e.gather(u);
        auto g = e.grads(u);
        for (float& x : g["w"]) x = 1.0f + static_cast<float>(comm.rank());
        e.reduce(u);  // sums over ranks; each rank keeps its shard
      }
      e.step();  // the optimizer on this rank's shard
    }

    const auto params = e.full_params();  // consolidated fp32 parameters (a collective in stage 3)
    if (comm.rank() == 0)
      std::printf("trained %zu parameters: model states %zu bytes per rank (formula %llu)\n", params.size(),
                  e.memory().model_state_bytes(), static_cast<unsigned long long>(e.model_state_formula_bytes()));
  });
}
