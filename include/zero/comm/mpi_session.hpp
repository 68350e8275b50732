// comm::mpi_session: RAII MPI_Init_thread / MPI_Finalize for programs that own MPI start-up.
#pragma once

// The deprecated MPI C++ bindings would add a link dependency (libmpi_cxx) and warnings; the
// library only uses the C API.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "zero/error.hpp"

namespace zero::comm {

// Initialises MPI unless it is already initialised, and finalises it on destruction only if this
// object initialised it, so a library can nest one inside a program that manages MPI itself.
// MPI_THREAD_FUNNELED is the default level: other threads may exist (the thread backend, OpenMP
// loops) as long as only the main thread calls MPI.
class mpi_session {
 public:
  explicit mpi_session(int required = MPI_THREAD_FUNNELED) { init(nullptr, nullptr, required); }
  mpi_session(int& argc, char**& argv, int required = MPI_THREAD_FUNNELED) { init(&argc, &argv, required); }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }

  // The thread support level MPI granted (at least the one required).
  int thread_level() const { return provided_; }
  int world_rank() const {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  int world_size() const {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
  }

 private:
  void init(int* argc, char*** argv, int required) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Query_thread(&provided_);
    } else {
      const int rc = MPI_Init_thread(argc, argv, required, &provided_);
      ZERO_CHECK(rc == MPI_SUCCESS, comm, "mpi_session: MPI_Init_thread failed with code ", rc);
      owner_ = true;
    }
    ZERO_CHECK(provided_ >= required, comm, "mpi_session: MPI provides thread level ", provided_,
               " but ", required, " is required");
  }

  bool owner_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

}  // namespace zero::comm
