// The checkpoint flags of the example trainers (--resume, --save, --save-every, --export), shared by the CPU and GPU trainers.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "trainer_cli.hpp"
#include "zero/checkpoint/checkpoint.hpp"

namespace trainer {

// Loads --resume into the engine, or initializes it with `init`; returns the step training continues
// from (the checkpoint's steps, skipped ones included, so the data position is the same). A
// checkpoint loads at any world size and stage, written by either trainer.
template <class Engine, class Comm, class Init>
std::uint64_t resume_or_initialize(Engine& e, Comm& comm, const options& o, const Init& init) {
  if (o.resume.empty()) {
    e.initialize(init);
    return 0;
  }
  zero::checkpoint::load(e, comm, o.resume);
  return e.state().step + e.state().skipped_steps;
}

// After step i + 1 of the run: a periodic --save-every checkpoint (the final one is finish()'s).
template <class Engine, class Comm>
void after_step(Engine& e, Comm& comm, const options& o, int i) {
  if (o.save_every > 0 && (i + 1) % o.save_every == 0 && i + 1 < o.steps) zero::checkpoint::save(e, comm, o.save);
}

// The end of the run: --save, then --export. The export reads a checkpoint: the one just saved, or
// a temporary one beside the output, under a name nobody can predict (rank 0 draws it and broadcasts
// it), created afresh so that no existing directory is ever used or removed, and removed afterwards
// without following links. Collective: every rank calls it.
template <class Engine, class Comm>
void finish(Engine& e, Comm& comm, const options& o) {
  namespace ckpt = zero::checkpoint;
  if (!o.save.empty()) ckpt::save(e, comm, o.save);
  if (o.export_file.empty()) return;
  std::string dir = o.save;
  const bool temporary = dir.empty();
  if (temporary) {
    std::random_device rd;
    const std::uint64_t token = ((std::uint64_t{rd()} << 16) ^ rd()) & ((std::uint64_t{1} << 48) - 1);
    std::vector<double> shared{comm.rank() == 0 ? static_cast<double>(token) : 0.0};  // exact below 2^53
    ckpt::detail::broadcast(comm, shared, 0);
    dir = o.export_file + ".checkpoint-" + ckpt::to_hex(static_cast<std::uint64_t>(shared[0])).substr(4);
    ckpt::save_options so;
    so.new_directory = true;
    ckpt::save(e, comm, dir, so);
  }
  comm.barrier();
  if (comm.rank() == 0) {
    try {
      ckpt::export_safetensors(dir, o.export_file);
    } catch (...) {
      if (temporary) ckpt::remove_checkpoint(dir);
      throw;
    }
    if (temporary && !ckpt::remove_checkpoint(dir))
      std::fprintf(stderr, "warning: the temporary checkpoint '%s' could not be removed entirely\n",
                   ckpt::printable(dir, 4096).c_str());
  }
  comm.barrier();
}

// A failure as one line that is safe to print: any exception (std::bad_alloc included) made a
// zero::error, names quoted from a checkpoint escaped.
inline std::string printable_failure(std::exception_ptr p) {
  return zero::checkpoint::printable(zero::as_error(p).what(), 4096, zero::checkpoint::printable_mode::message);
}

// Runs a rank's whole run; whatever it throws leaves as a zero::error with a printable message.
template <class F>
void with_printable_errors(F&& f) {
  try {
    f();
  } catch (...) {
    const zero::error e = zero::as_error(std::current_exception());
    throw zero::error(e.kind(), printable_failure(std::current_exception()));
  }
}

}  // namespace trainer
