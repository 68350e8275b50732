// The checkpoint flags of the example trainers (--resume, --save, --save-every, --export), shared by the CPU and GPU trainers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

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

// The end of the run: --save, then --export (which reads a checkpoint: the one just saved, or a
// temporary one beside the output, removed afterwards). Collective: every rank calls it.
template <class Engine, class Comm>
void finish(Engine& e, Comm& comm, const options& o) {
  namespace ckpt = zero::checkpoint;
  if (!o.save.empty()) ckpt::save(e, comm, o.save);
  if (o.export_file.empty()) return;
  std::filesystem::path dir = o.save;
  if (dir.empty()) dir = std::filesystem::path(o.export_file).string() + ".checkpoint.tmp";
  if (o.save.empty()) ckpt::save(e, comm, dir);
  comm.barrier();
  if (comm.rank() == 0) {
    ckpt::export_safetensors(dir, o.export_file);
    if (o.save.empty()) std::filesystem::remove_all(dir);
  }
  comm.barrier();
}

}  // namespace trainer
