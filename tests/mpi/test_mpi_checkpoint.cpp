// A tensor-parallel mesh's checkpoint over comm::mpi, loaded by a plain engine on threads (built where the checkpoint dependencies are).
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "../tp_model.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/comm/backends/mpi.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/core/hash.hpp"
#include "zero/zero.hpp"

TEST_CASE("tensor parallel: a checkpoint a dp x tp mesh saves over comm::mpi loads into a plain engine on threads") {
  using zero::comm::mpi;
  int n = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int tp = n % 2 == 0 ? 2 : 3, dp = n / tp;
  REQUIRE(dp * tp == n);
  // Split tensors in pieces, one file per process; the reader puts them together at tp = 1.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zero_mpi_tp_checkpoint_" + std::to_string(n));
  if (me == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  std::uint64_t saved = 0;
  mpi::run([&](mpi& c) {
    zero::comm::mesh<mpi> m(c, {dp, tp});
    zero::engine<zero::stage2, mpi, zero::optim::adamw> e(m, tp_model::model());
    e.initialize(zero::from_whole_tensors(tp_model::whole_init()));
    for (std::uint64_t t = 0; t < 3; ++t) tp_model::mesh_step(e, m.coordinates().dp, t);
    const auto p = e.full_model_params();
    saved = zero::fnv1a64(p.data(), p.size() * sizeof(float));
    (void)zero::checkpoint::save(e, m.world(), dir);
  });
  std::uint64_t loaded = 0;
  if (me == 0) {
    zero::comm::threads::launch(dp, [&](zero::comm::threads& c) {
      zero::engine<zero::stage3, zero::comm::threads, zero::optim::adamw> e(c, tp_model::model());
      (void)zero::checkpoint::load(e, c, dir);
      const auto p = e.full_params();
      if (c.rank() == 0) loaded = zero::fnv1a64(p.data(), p.size() * sizeof(float));
    });
    zero::checkpoint::remove_checkpoint(dir);
  }
  MPI_Bcast(&loaded, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  CHECK(loaded == saved);
}

TEST_CASE("an asynchronous save over comm::mpi, taken while training goes on, holds the state of its moment") {
  using zero::comm::mpi;
  int n = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const int tp = n % 2 == 0 ? 2 : 1, dp = n / tp;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zero_mpi_async_checkpoint_" + std::to_string(n));
  if (me == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  std::uint64_t saved = 0;
  mpi::run([&](mpi& c) {
    zero::comm::mesh<mpi> m(c, {dp, tp});
    zero::engine<zero::stage3, mpi, zero::optim::adamw> e(m, tp_model::model());
    e.initialize(zero::from_whole_tensors(tp_model::whole_init()));
    zero::checkpoint::async_saver saver;
    for (std::uint64_t t = 0; t < 3; ++t) tp_model::mesh_step(e, m.coordinates().dp, t);
    const auto p = e.full_model_params();
    saved = zero::fnv1a64(p.data(), p.size() * sizeof(float));
    saver.save(e, m.world(), dir);  // the writers run while the next steps do
    for (std::uint64_t t = 3; t < 5; ++t) tp_model::mesh_step(e, m.coordinates().dp, t);
    CHECK(saver.wait(e, m.world())->version == 1);
  });
  std::uint64_t loaded = 0;
  if (me == 0) {
    zero::comm::threads::launch(dp, [&](zero::comm::threads& c) {
      zero::engine<zero::stage1, zero::comm::threads, zero::optim::adamw> e(c, tp_model::model());
      const auto r = zero::checkpoint::load(e, c, dir);
      CHECK(r.info.state.step == 3);
      const auto p = e.full_params();
      if (c.rank() == 0) loaded = zero::fnv1a64(p.data(), p.size() * sizeof(float));
    });
    zero::checkpoint::remove_checkpoint(dir);
  }
  MPI_Bcast(&loaded, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  CHECK(loaded == saved);
}
