// The doctest main of the MPI tests: every rank runs the same test cases and exits with the same code.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "zero/comm/mpi_session.hpp"

int main(int argc, char** argv) {
  zero::comm::mpi_session session(argc, argv);
  doctest::Context ctx(argc, argv);
  // One full report (rank 0) is enough; the other ranks still print their own failures.
  if (session.world_rank() != 0) {
    ctx.setOption("minimal", true);
    ctx.setOption("no-colors", true);  // mpirun gives ranks a terminal; escapes would clutter the log
  }
  int failed = ctx.run();
  // A failure seen by one rank fails the job on every rank, so mpirun's exit code cannot depend
  // on which rank's status it happens to report.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
