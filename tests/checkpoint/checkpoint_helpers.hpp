// Shared by the checkpoint tests: scratch directories, training the toy model, and reading an engine's
// master weights and optimizer slots back as global arrays.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../toy_model.hpp"
#include "zero/checkpoint/checkpoint.hpp"

namespace ckpt_test {

namespace fs = std::filesystem;
namespace ckpt = zero::checkpoint;
using adamw = zero::optim::adamw;

// A fresh directory under the system's temporary directory, removed with everything in it.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("zero-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& s) const { return path / s; }
};

// The model's master weights and every optimizer slot as global, unpadded arrays (unit after unit).
struct state_arrays {
  std::vector<float> master;
  std::vector<std::vector<float>> slots;
  zero::training_state state;
};

// Every rank copies its canonical slices (disjoint across ranks) into `out`, sized beforehand.
template <class Engine>
void read_state(Engine& e, state_arrays& out) {
  using Opt = typename Engine::optimizer;
  const auto base = toy::unit_bases(e.spec());
  for (std::size_t u = 0; u < e.spec().num_units(); ++u) {
    const auto r = e.canonical_range(zero::unit_id{u});
    const std::size_t at = base[u] + r.begin;
    float* slots[Opt::slots > 0 ? Opt::slots : 1] = {};
    for (int k = 0; k < Opt::slots; ++k) slots[k] = out.slots[static_cast<std::size_t>(k)].data() + at;
    e.read_state(zero::unit_id{u}, r, out.master.data() + at, slots);
  }
  if (e.rank() == 0) out.state = e.state();
}

template <class Opt>
state_arrays sized_arrays(const zero::model_spec& spec) {
  state_arrays s;
  s.master.assign(spec.numel(), 0.0f);
  s.slots.assign(static_cast<std::size_t>(Opt::slots), s.master);
  return s;
}

// Trains the toy model for `steps` steps at N ranks, optionally saves into `save_to`, and returns the state.
template <class Stage, class Opt = adamw>
state_arrays train(int n, int steps, const fs::path& save_to = {}, Opt opt = {}) {
  const auto spec = toy::spec();
  state_arrays s = sized_arrays<Opt>(spec);
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, Opt> e(comm, spec, opt);
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    if (!save_to.empty()) ckpt::save(e, comm, save_to);
    read_state(e, s);
  });
  return s;
}

// Loads `dir` into a fresh engine at N ranks and returns what the engine then holds.
template <class Stage, class Opt = adamw>
state_arrays load_state(int n, const fs::path& dir, Opt opt = {}) {
  const auto spec = toy::spec();
  state_arrays s = sized_arrays<Opt>(spec);
  zero::comm::threads::launch(n, [&](zero::comm::threads& comm) {
    zero::engine<Stage, zero::comm::threads, Opt> e(comm, spec, opt);
    ckpt::load(e, comm, dir);
    read_state(e, s);
  });
  return s;
}

// A file's bytes, and a file replaced by bytes (damage is made by editing these).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
inline void spit(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
inline bool bit_equal(const state_arrays& a, const state_arrays& b) {
  if (!bit_equal(a.master, b.master) || a.slots.size() != b.slots.size()) return false;
  for (std::size_t k = 0; k < a.slots.size(); ++k)
    if (!bit_equal(a.slots[k], b.slots[k])) return false;
  return a.state.step == b.state.step;
}

}  // namespace ckpt_test
