// train_mlp_cuda: train_mlp on the GPU with cuBLAS GEMMs, N ranks on one GPU (cuda_threads) or one GPU per MPI process (nccl).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "trainer_cli.hpp"
#include "train_mlp_cuda.hpp"
#include "trainer_checkpoint.hpp"  // printable_failure
#include "zero/comm/any_backend.hpp"
#include "zero/zero_cuda.cuh"
#if ZERO_WITH_MPI
#include "zero/comm/mpi_session.hpp"
#endif

namespace {

using train_mlp_cuda::dispatch;
using train_mlp_cuda::roofline;
using trainer::options;
using trainer::summary;

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.backend = "cuda_threads";
  CLI::App app{"Train a small MLP classifier with ZeRO on the GPU: N ranks sharing this process's GPU "
               "(comm::cuda_threads) or one GPU per MPI process started by mpirun (comm::nccl)."};
  [[maybe_unused]] auto* ranks_flag =
      toolcli::add_integer(app, "--ranks", o.ranks, 1, zero::comm::cuda_threads::max_ranks,
                           "number of ranks (with --backend nccl: the MPI communicator's size)");
  app.add_option("--backend", o.backend,
                 "cuda_threads: ranks as threads sharing one GPU; nccl: one rank and one GPU per MPI process")
      ->check(toolcli::one_of({"cuda_threads", "nccl"}))
      ->capture_default_str();
  // A tensor-wise optimizer (optim::lamb) needs each tensor's norms and a matrix optimizer (optim::muon) each matrix
  // whole, which the device system does not compute yet.
  trainer::optimizer_offer device_optimizers;
  device_optimizers.offered = [](const std::string& v) {
    bool elementwise = false;
    zero::optimizers::for_each([&]<class O>() { elementwise = elementwise || (O::name == v && zero::ElementwiseOptimizer<O>); });
    return elementwise;
  };
  device_optimizers.why_not = "runs on host systems only (train_mlp, train_gpt)";
  trainer::add_common_flags(app, o, device_optimizers);
  roofline rl;
  app.add_flag("--roofline", rl.wanted,
               "also time the step's GEMMs alone and the device copy bandwidth, and report the step against "
               "(GEMMs + optimizer bytes at copy speed)");
  if (const auto code = trainer::parse(app, argc, argv)) return *code;
  auto usage_error = [&](const std::string& msg) { return trainer::usage_error(app, msg); };
  if (const std::string p = trainer::options_problem(app, o); !p.empty()) return usage_error(p);

  summary s;
  if (o.backend == "nccl") {
#if ZERO_WITH_MPI && ZERO_WITH_NCCL
    zero::comm::mpi_session session(argc, argv);
    const int world = session.world_size(), rank = session.world_rank();
    std::string problem;
    if (ranks_flag->count() > 0 && o.ranks != world)
      problem = "--ranks " + std::to_string(o.ranks) + " contradicts the " + std::to_string(world) +
                " MPI processes (under --backend nccl the ranks are the processes mpirun starts; drop --ranks)";
    else if (problem =
                 trainer::split_batch(o, o.model.batch, world, "the number of MPI processes " + std::to_string(world));
             problem.empty())
      problem = trainer::zeropp_problem(o, world);
    if (!problem.empty()) return rank == 0 ? usage_error(problem) : 2;
    o.ranks = world;
    try {
      zero::comm::nccl nccl(MPI_COMM_WORLD);
      zero::comm::any_backend<zero::sys::cuda> comm(nccl);
      dispatch(comm, o, s, rl);
    } catch (...) {
      // Peers blocked in NCCL would otherwise wait for their watchdog's timeout.
      std::cerr << "train_mlp_cuda rank " << rank << ": " << trainer::printable_failure(std::current_exception()) << "\n";
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank != 0) return 0;  // every rank holds the reduced summary; rank 0 reports it
#else
    return usage_error("--backend nccl: this train_mlp_cuda was built without MPI or NCCL");
#endif
  } else {
    if (const std::string problem =
            trainer::split_batch(o, o.model.batch, o.ranks, "--ranks " + std::to_string(o.ranks));
        !problem.empty())
      return usage_error(problem);
    if (const std::string p = trainer::zeropp_problem(o, o.ranks); !p.empty()) return usage_error(p);
    try {
      zero::comm::cuda_threads::launch(o.ranks, [&](zero::comm::cuda_threads& comm) {
        summary local;
        roofline mine{rl.wanted};
        zero::comm::any_backend<zero::sys::cuda> backend(comm);
        dispatch(backend, o, local, mine);
        if (comm.rank() == 0) {
          s = local;
          rl = mine;
        }
      });
    } catch (...) {
      std::cerr << "train_mlp_cuda: " << trainer::printable_failure(std::current_exception()) << "\n";
      return 1;
    }
  }
  trainer::print_summary(o, s);
  if (rl.wanted && rl.step_s > 0) {
    const double floor_s = rl.gemm_s + rl.optimizer_at_copy_s;
    std::printf("  roofline: step %.3f ms = %.3f x (GEMMs %.3f ms + optimizer %.0f B x %zu elements at %.0f GB/s = "
                "%.3f ms)\n",
                rl.step_s * 1e3, rl.step_s / floor_s, rl.gemm_s * 1e3, rl.bytes_per_element, rl.updated_elements,
                rl.copy_gbps, rl.optimizer_at_copy_s * 1e3);
  }
  if (o.json) {
    nlohmann::json j = trainer::summary_json(o, s);
    if (rl.wanted && rl.step_s > 0) {
      j["step_s"] = rl.step_s;
      j["gemm_s"] = rl.gemm_s;
      j["optimizer_at_copy_s"] = rl.optimizer_at_copy_s;
      j["copy_gbps"] = rl.copy_gbps;
      j["roofline_ratio"] = rl.step_s / (rl.gemm_s + rl.optimizer_at_copy_s);
    }
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
