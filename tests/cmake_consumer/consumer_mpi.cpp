// A downstream MPI program: one rank per process (zero::comm::mpi), and the mean loss over ranks as a
// training loop computes it, through the backend's all_reduce. Run it under mpirun.
#include <cstdio>
#include <zero/comm/backends/mpi.hpp>
#include <zero/comm/mpi_session.hpp>

int main(int argc, char** argv) {
  zero::comm::mpi_session session(argc, argv);  // MPI_Init_thread here, MPI_Finalize at the end of main
  return zero::comm::mpi::run([](zero::comm::mpi& comm) {
    double loss = 1.0 + comm.rank();  // this rank's loss: 1, 2, ..., N
    comm.all_reduce(&loss, &loss, 1, zero::reduce_op::sum);
    const double mean = loss / comm.size(), want = (comm.size() + 1) / 2.0;
    if (comm.rank() == 0)
      std::printf("consumer_mpi: %d ranks, mean loss %g%s\n", comm.size(), mean, mean == want ? "" : " (wrong)");
    return mean == want ? 0 : 1;
  });
}
