// A downstream program: includes zero's umbrella header and trains one unit under ZeRO-2 on 2 ranks.
#include <cstdio>

#include <zero/zero.hpp>

int main() {
  zero::model_spec spec;
  const zero::unit_id u = spec.unit("linear").tensor("w", {3, 3});
  int failures = 0;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage2, zero::comm::threads, zero::optim::sgd> e(comm, spec, zero::optim::sgd{});
    e.grads(u)["w"][0] = 1.0f;
    e.reduce(u);
    e.step();
    const auto p = e.full_params();
    if (comm.rank() == 0 && p[0] != -0.01f) ++failures;  // lr 0.01 x mean gradient 1
  });
  std::puts(failures ? "consumer: wrong result" : "consumer: ok");
  return failures;
}
