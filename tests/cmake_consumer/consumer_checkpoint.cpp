// A downstream program on zero::checkpoint: saves a ZeRO-3 engine on 2 ranks and loads it on 1.
#include <cstdio>
#include <filesystem>
#include <vector>

#include <zero/checkpoint/checkpoint.hpp>
#include <zero/zero.hpp>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::filesystem::path dir = argv[1];
  zero::model_spec spec;
  spec.unit("linear").tensor("w", {5, 3}).tensor("b", {5});
  auto init = [](const zero::unit_spec&, const zero::tensor_spec&, zero::range r, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(r.begin + i) - 1.0f;
  };
  std::vector<float> saved, loaded;
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(comm, spec, zero::optim::adamw{});
    e.initialize(init);
    zero::checkpoint::save(e, comm, dir);
    const auto p = e.full_params();
    if (comm.rank() == 0) saved.assign(p.begin(), p.end());
  });
  zero::comm::threads::launch(1, [&](zero::comm::threads& comm) {
    zero::engine<zero::stage0, zero::comm::threads, zero::optim::adamw> e(comm, spec, zero::optim::adamw{});
    zero::checkpoint::load(e, comm, dir);
    const auto p = e.full_params();
    loaded.assign(p.begin(), p.end());
  });
  const bool ok = !saved.empty() && saved == loaded && saved[1] == -0.75f;
  std::puts(ok ? "consumer_checkpoint: ok" : "consumer_checkpoint: parameters differ after the round trip");
  return ok ? 0 : 1;
}
