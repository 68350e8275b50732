// checkpoint::load: each rank reads the global ranges it holds, from a checkpoint of any world size and stage.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zero/checkpoint/collective.hpp"
#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/mesh_place.hpp"
#include "zero/checkpoint/optimizer_settings.hpp"
#include "zero/checkpoint/shared_manifest.hpp"
#include "zero/checkpoint/versions.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/layout.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

struct load_result {
  fs::path version_dir;  // the version that was read
  manifest info;         // what it says: saved world size and stage, optimizer settings, state
};

namespace detail {

// One read: `count` elements of every slot, from files[file] at offsets[k], into element `dst` of
// the unit's held-range buffers.
struct planned_read {
  std::size_t file = 0;
  std::vector<std::uint64_t> offsets;
  std::size_t count = 0, dst = 0;
};

// Calls f(seg, x) for each part x of `piece`-local elements r of tensor t (its coordinates: the
// tensor's, or its piece's where it was saved in pieces) that segment seg holds, in order.
template <class F>
void for_each_stored(const tensor_entry& t, std::uint32_t piece, range r, F&& f) {
  auto it = std::lower_bound(t.segments.begin(), t.segments.end(), std::pair{piece, r.begin},
                             [](const segment& s, const std::pair<std::uint32_t, std::size_t>& at) {
                               return s.piece != at.first ? s.piece < at.first : s.end <= at.second;
                             });
  for (; it != t.segments.end() && it->piece == piece && it->begin < r.end; ++it) {
    const range x = intersect(range{static_cast<std::size_t>(it->begin), static_cast<std::size_t>(it->end)}, r);
    if (!x.empty()) f(*it, x);
  }
}

// For each unit, the reads that fill held[u] (unit-local in `spec`, the engine's units: the model,
// or a rank's pieces of it in a tensor-parallel mesh) from the manifest's segments. Each held
// element is found by its index in the whole tensor (whole_index), then where the checkpoint keeps
// that element: in the tensor, or in the piece of the mesh that saved it.
inline std::vector<std::vector<planned_read>> plan_reads(const manifest& m, const model_spec& spec,
                                                         const std::vector<range>& held) {
  std::vector<std::vector<planned_read>> plan(m.units.size());
  for (std::size_t u = 0; u < m.units.size(); ++u) {
    const range r = held[u];
    std::size_t base = 0;  // unit-local offset of the tensor in the engine's unit
    for (std::size_t k = 0; k < m.units[u].tensors.size(); ++k) {
      const tensor_entry& t = m.units[u].tensors[k];
      const tensor_spec& mine = spec.units()[u].tensors[k];
      const range tr{base, base + mine.numel};
      base = tr.end;
      const range want = intersect(tr, r);
      if (want.empty()) continue;
      const piece_runs runs = runs_of(mine);  // the engine's piece in the whole tensor
      const piece_runs saved = runs_of(t.piece_spec(0));
      auto read = [&](const segment& s, range x, std::size_t dst) {
        planned_read pr{s.file, {}, x.size(), dst};
        for (std::uint64_t o : s.offsets) pr.offsets.push_back(o + static_cast<std::uint64_t>(x.begin - s.begin) * 4);
        plan[u].push_back(std::move(pr));
      };
      // Runs of consecutive whole-tensor elements, each cut where the saved pieces are.
      for (std::size_t i = want.begin - tr.begin; i < want.end - tr.begin;) {
        const std::size_t within = i % runs.block, n = std::min(runs.block - within, want.end - tr.begin - i);
        const std::size_t w0 = i / runs.block * runs.stride + runs.first + within;  // whole index of element i
        const std::size_t dst0 = tr.begin + i - r.begin;
        if (t.parts == 1) {
          for_each_stored(t, 0, range{w0, w0 + n},
                          [&](const segment& s, range x) { read(s, x, dst0 + (x.begin - w0)); });
        } else {
          for (std::size_t w = w0; w < w0 + n;) {
            const std::size_t row = w / saved.stride, at = w % saved.stride;
            const auto piece = static_cast<std::uint32_t>(at / saved.block);
            const std::size_t off = at % saved.block, len = std::min(saved.block - off, w0 + n - w);
            const std::size_t local = row * saved.block + off;  // in the saved piece
            for_each_stored(t, piece, range{local, local + len},
                            [&](const segment& s, range x) { read(s, x, dst0 + (w - w0) + (x.begin - local)); });
            w += len;
          }
        }
        i += n;
      }
    }
  }
  return plan;
}

// The optimizer kind's own state (engine::optimizer_kind_state), where the engine's kind keeps one: the
// checkpoint must hold it, of the engine's size (which the model alone decides: any world size and
// stage loads it), its file verified before any state changes. Every rank reads the whole of it.
template <class Engine, class Files>
void check_optimizer_state(Engine& e, const manifest& m, const std::string& where, Files& files) {
  std::size_t floats = 0;
  if constexpr (requires { e.optimizer_kind_state(); }) floats = e.optimizer_kind_state().size();
  if (floats == 0) return;
  ZERO_CHECK(m.optimizer_state.has_value(), corrupt, "checkpoint: '", where, "' holds no state of optim::",
             Engine::optimizer::name, "'s own (its kind's, e.g. factored moments): it was not saved by this engine's "
             "optimizer kind");
  ZERO_CHECK(m.optimizer_state->floats == floats, corrupt, "checkpoint: '", where, "' holds ",
             m.optimizer_state->floats, " floats of optim::", Engine::optimizer::name,
             "'s own state; this model needs ", floats);
  files.verify({m.optimizer_state->file});
}

// A version's data files on disk, as the load reads them: each verified the first time it is used.
class disk_files {
 public:
  disk_files(fs::path vdir, const std::vector<file_entry>& entries) : files_(std::move(vdir), entries) {}
  void verify(const std::vector<std::size_t>& which) { files_.verify(which); }
  void read(std::size_t i, void* dst, std::size_t bytes, std::uint64_t offset) {
    files_.get(i).pread_exact(dst, bytes, offset);
  }

 private:
  data_files files_;
};

// Step 2 of a load, from any store of data files (`Files`: verify(which) checks the listed files,
// read(file, dst, bytes, offset) copies bytes out of one): the manifest `m` (read from `where`)
// checked against the engine, the reads that fill the ranges this rank holds (held[u]), and the
// checksums of every file they touch, before any state changes.
template <class Engine, class Files>
std::vector<std::vector<planned_read>> plan_load(const Engine& e, const mesh_place& mesh, const manifest& m,
                                                 const std::string& where, Files& files, std::vector<range>& held) {
  using Opt = typename Engine::optimizer;
  check_model(m, *mesh.model, where);
  check_optimizer<Opt>(m, where);
  held.resize(e.spec().num_units());
  for (std::size_t u = 0; u < held.size(); ++u) held[u] = e.held_range(unit_id{u});
  auto plan = plan_reads(m, e.spec(), held);
  std::vector<bool> used(m.files.size(), false);
  std::vector<std::size_t> which;
  for (const auto& reads : plan)
    for (const auto& pr : reads)
      if (!used[pr.file]) used[pr.file] = true, which.push_back(pr.file);
  files.verify(which);
  return plan;
}

// Step 3 of a load: the planned reads, in chunks of each unit's held range, so the staging stays one
// chunk of every array whatever the units' sizes (an offloaded engine takes them into its tier chunk
// by chunk).
template <class Engine, class Files>
void read_planned(Engine& e, const std::vector<range>& held, const std::vector<std::vector<planned_read>>& plan,
                  Files& files) {
  constexpr std::size_t nslots = 1 + static_cast<std::size_t>(Engine::optimizer::slots);
  std::vector<float> buf;
  for (std::size_t u = 0; u < held.size(); ++u) {
    const range h = held[u];
    for (std::size_t c0 = 0; c0 < h.size(); c0 += state_chunk_elements) {
      const std::size_t c1 = std::min(h.size(), c0 + state_chunk_elements), n = c1 - c0;
      buf.assign(n * nslots, 0.0f);
      const float* slots[nslots];
      for (std::size_t k = 0; k < nslots; ++k) slots[k] = buf.data() + k * n;
      for (const auto& pr : plan[u]) {
        // The part of the read inside this chunk (dst: held-range-local, like c0 and c1).
        const std::size_t lo = std::max(pr.dst, c0), hi = std::min(pr.dst + pr.count, c1);
        if (lo >= hi) continue;
        for (std::size_t k = 0; k < nslots; ++k)
          files.read(pr.file, buf.data() + k * n + (lo - c0), (hi - lo) * sizeof(float),
                     pr.offsets[k] + static_cast<std::uint64_t>(lo - pr.dst) * sizeof(float));
      }
      e.write_state(unit_id{u}, range{h.begin + c0, h.begin + c1}, slots[0], slots + 1);
    }
  }
}

}  // namespace detail

// Loads the checkpoint `dir` names (see resolve()) into the engine: master weights, optimizer
// slots and training state, bit-identical to what was saved, whatever world size and stage saved
// it. A collective: every rank of comm (the engine's communicator) calls it. Each rank verifies
// the checksum of every file it reads; any problem on any rank makes every rank throw zero::error.
// After a failure while reading (rare: checksums are verified first), the engine's state is
// undefined until a successful load or initialize().
// The optimizer's hyper-parameters are not loaded: the engine keeps the ones it was built with (or
// last given), so a resumed run may change them. The saved ones (what optimizer_settings() held at the
// save, set_learning_rate included) are in the result:
// e.set_optimizer(optimizer_from<Opt>(r.info)) continues with them exactly.
template <class Engine, CommBackend Comm>
load_result load(Engine& e, Comm& comm, const fs::path& dir) {
  const int rank = comm.rank();
  const detail::mesh_place mesh = detail::mesh_place_of(e);
  detail::check_communicator(e, comm, mesh, "load");

  // 1. Rank 0 picks the version, so that every rank reads the same one.
  constexpr std::size_t sd = detail::status_doubles;
  std::vector<double> head(sd + 3, 0.0);  // verdict, then: dir is the version itself?, version number
  fs::path vdir;
  double direct = 0.0;
  std::uint64_t number = 0;
  detail::outcome resolved;
  if (rank == 0)
    resolved = detail::attempt([&] {
      vdir = resolve(dir);
      direct = vdir == dir ? 1.0 : 0.0;
      if (vdir != dir) number = *parse_version_name(vdir.filename().string());
    });
  detail::encode(resolved, head.data());
  head[sd] = direct;
  detail::put_u64(head, sd + 1, number);
  detail::broadcast(comm, head, 0);
  detail::settle(resolved, head, head.size(), "load (finding the checkpoint)");
  vdir = head[sd] != 0.0 ? dir : dir / version_name(detail::get_u64(head, sd + 1));

  // 2. The manifest, then the checksums of every file this rank will read, before any state changes.
  load_result result{vdir, {}};
  std::vector<range> held;
  std::vector<std::vector<detail::planned_read>> plan;
  std::optional<detail::disk_files> files;
  // Parsed once per process, however many thread-ranks load at once: each rank holds the shared
  // parse until every rank has it (the agreement below), so none parses it again.
  std::shared_ptr<const manifest> shared;
  const detail::outcome checked = detail::attempt([&] {
    const fs::path mp = vdir / manifest_name;
    shared = read_manifest_shared(mp);
    result.info = *shared;
    files.emplace(vdir, result.info.files);
    plan = detail::plan_load(e, mesh, result.info, mp.string(), *files, held);
    detail::check_optimizer_state(e, result.info, mp.string(), *files);
  });
  detail::agree(comm, checked, "load (checking the manifest and data files)");
  shared.reset();

  // 3. Read and store.
  const detail::outcome stored = detail::attempt([&] {
    detail::read_planned(e, held, plan, *files);
    if (result.info.optimizer_state) {
      const std::span<float> state = e.optimizer_kind_state();
      files->read(result.info.optimizer_state->file, state.data(), state.size_bytes(), 0);
    }
  });
  detail::agree(comm, stored, "load (reading the data files)");
  e.finish_load(result.info.state);
  return result;
}

// Checks the checkpoint `dir` names without loading it: the manifest, then the size of every data
// file, then every checksum. Returns the manifest; throws zero::error (corrupt or io) at the first
// problem.
inline manifest verify(const fs::path& dir) {
  const fs::path vdir = resolve(dir);
  const fs::path mp = vdir / manifest_name;
  manifest m = *read_manifest_shared(mp);
  detail::data_files files(vdir, m.files);
  files.verify_all();
  return m;
}

}  // namespace zero::checkpoint
