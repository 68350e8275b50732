// activation_store over comm::mpi: every mesh shape of the job, every mode, restores bit for bit and the plan's bytes;
// a layer mismatch caught by verify.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zero/comm/backends/mpi.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/engine/activation_store.hpp"
#include "zero/engine/plan.hpp"

namespace {

using zero::activation_mode;
using zero::comm::mpi;

// A layer's bf16 activation on a data-parallel rank: equal across its tensor-parallel group.
std::vector<zero::bf16> activation(int dp_index, std::size_t layer, std::size_t n) {
  std::vector<zero::bf16> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto bits = static_cast<std::uint16_t>(i * 7919u + layer * 31u + static_cast<std::size_t>(dp_index) * 1009u);
    std::memcpy(&v[i], &bits, sizeof bits);
  }
  return v;
}

}  // namespace

TEST_CASE("activation_store over comm::mpi: every dp x tp shape and mode restores bit for bit; bytes equal the plan") {
  mpi world;
  const int n = world.size();
  constexpr std::size_t layers = 3, elements = 1001;  // no multiple of 2, 3 or 4: the last slice is padded
  for (int tp = 1; tp <= n; ++tp) {
    if (n % tp != 0) continue;
    zero::comm::mesh<mpi> m(world, {n / tp, tp});
    for (activation_mode mode :
         {activation_mode::none, activation_mode::partitioned, activation_mode::partitioned_cpu}) {
      CAPTURE(tp);
      CAPTURE(zero::to_string(mode));
      zero::activation_store<mpi> store(m.tp(), mode);
      std::vector<std::vector<zero::bf16>> inputs;
      for (std::size_t l = 0; l < layers; ++l) {
        inputs.push_back(activation(m.coordinates().dp, l, elements));
        store.save(l, inputs.back().data(), elements);
      }
      // The next layer's all-gather (MPI_Iallgather) runs while this one is checked: prefetch_next's loop.
      for (std::size_t l = layers; l-- > 0;) {
        const auto restored = store.restore<zero::bf16>(l);
        if (l > 0) store.prefetch<zero::bf16>(l - 1);
        CHECK(std::memcmp(restored.data(), inputs[l].data(), elements * sizeof(zero::bf16)) == 0);
        store.release(l);
      }
      const zero::activation_plan p = zero::plan_activations(layers, elements, sizeof(zero::bf16), tp, mode, true);
      const zero::activation_memory& mem = store.memory();
      const zero::activation_traffic t = store.traffic();
      CHECK(mem.peak_saved == p.saved_bytes);
      CHECK(mem.peak_host == p.host_bytes);
      CHECK(mem.peak_restored == p.peak_restored_bytes);
      CHECK(mem.peak_system == p.peak_system_bytes);
      CHECK(t.gather.total_bytes() == p.gather.total_bytes());
      CHECK(t.gather.calls == p.gather.calls);
      CHECK(t.to_host_bytes == p.to_host_bytes);
      CHECK(t.from_host_bytes == p.from_host_bytes);
    }
  }
}

TEST_CASE("activation_store over comm::mpi: a prefetch in flight released or cleared unrestored is waited for") {
  mpi world;
  zero::activation_store<mpi> store(world, activation_mode::partitioned_cpu);
  const auto a = activation(0, 0, 4099);
  for (std::size_t l = 0; l < 3; ++l) store.save(l, a.data(), a.size());
  store.prefetch<zero::bf16>(2);
  store.release(2);  // waits for the all-gather before freeing its buffer
  store.prefetch<zero::bf16>(1);
  const auto restored = store.restore<zero::bf16>(1);
  CHECK(std::memcmp(restored.data(), a.data(), a.size() * sizeof(zero::bf16)) == 0);
  store.prefetch<zero::bf16>(0);
  store.clear();
  CHECK(store.memory().restored == 0);
  CHECK(store.traffic().gather.calls[static_cast<std::size_t>(zero::comm::collective::all_gather)] == 3);
  world.barrier();
}

TEST_CASE("activation_store over comm::mpi with verify: ranks restoring different layers fail together") {
  zero::comm::mpi_options o;
  o.verify = true;
  mpi world(MPI_COMM_WORLD, o);
  zero::activation_store<mpi> store(world, activation_mode::partitioned);
  const std::vector<float> a(8, 1.0f);
  store.save(0, a.data(), a.size());
  store.save(1, a.data(), a.size());
  std::string what;
  try {
    (void)store.restore<float>(world.rank() == 0 ? 0 : 1);
  } catch (const zero::error& e) {
    CHECK(e.kind() == zero::error_kind::comm);
    what = e.what();
  }
  CAPTURE(what);
  CHECK(what.find("restore unit 'layer 0'") != std::string::npos);
  world.barrier();  // the refusal left every rank able to go on
}
