// Jobs in which one rank fails its peers (throws, returns early, arrives late): each must end promptly, naming a rank.
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "zero/comm/mpi.hpp"

// Usage: mpi_rank_failure throw|return|late. Rank 1 misbehaves after a first collective that all
// ranks complete; the others then wait in an all_reduce that rank 1 does not enter (in time).
int main(int argc, char** argv) {
  zero::comm::mpi_session session(argc, argv);
  const std::string how = argc > 1 ? argv[1] : "throw";
  zero::comm::mpi_options opt;
  opt.timeout = std::chrono::milliseconds(1000);
  zero::comm::mpi::run(
      [&](zero::comm::mpi& c) {
        std::vector<float> x(1000, 1.0f);
        c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
        if (c.rank() == 1) {
          if (how == "throw") throw std::runtime_error("injected failure");
          if (how == "return") return;
          std::this_thread::sleep_for(std::chrono::seconds(60));  // "late": far beyond the timeout
        }
        c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
        c.barrier();
      },
      opt);
  return 0;
}
