// checkpoint::save: every rank writes the global ranges it is responsible for; rank 0 commits a manifest last.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zero/checkpoint/collective.hpp"
#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/mesh_place.hpp"
#include "zero/checkpoint/optimizer_settings.hpp"
#include "zero/checkpoint/versions.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

// The points of a save, in order, reported to save_options::on_phase: a progress hook, and the
// places a test stops a save to check that every intermediate state on disk is safe.
enum class save_phase {
  version_created,      // every rank: rank 0 has created the new, empty version directory
  data_partly_written,  // every rank: about half of its data file is written (the file is still a temporary)
  data_written,         // every rank: its data file is complete, synced and under its final name
  manifest_staged,      // rank 0: the manifest is written under a temporary name, not yet renamed
  committed,            // rank 0: the manifest is in place and synced: the new checkpoint is the current one
  cleaned,              // rank 0: older versions beyond `keep` are removed
};

struct save_options {
  // Committed versions left in the directory after the save, the new one included (at least 1).
  std::size_t keep = 1;
  // Called on each rank at each phase it reaches; an exception it throws fails the save like any
  // other error (every rank throws, the previous checkpoint stays the current one) except at
  // `cleaned`, when the older versions are already gone and the new one stays.
  std::function<void(save_phase, int rank)> on_phase;
  // `dir` must not exist yet: the save creates it, exclusively, and fails if anything is already
  // there. For a temporary checkpoint that nothing else may share (see remove_checkpoint()).
  bool new_directory = false;
  // Write the data files past the page cache (O_DIRECT) where the file system allows it, in aligned
  // blocks of 4 MiB (the last one, ragged, through the page cache): the device reads the staged bytes
  // itself, and the CPU does not copy every byte into the page cache, allocate and zero its pages and
  // write them back, which cost a core more than the device's time on the machines measured
  // (docs/performance.md) and take memory bandwidth from training beside an asynchronous save. The
  // file is the same, durable in the same way (fsync, rename). A file system that refuses O_DIRECT
  // (tmpfs) is written through the page cache, as with false.
  bool direct_io = true;
};

struct save_result {
  fs::path version_dir;       // the committed version directory
  std::uint64_t version = 0;  // its number
  std::uint64_t bytes = 0;    // of all its data files
  std::uint64_t rank_bytes = 0;  // of this rank's data file
};

namespace detail {

// One tensor's part of a data file: tensor-local elements [begin, end), slot k at offset + k * (end - begin) * 4.
struct planned_piece {
  std::size_t unit = 0, tensor = 0;
  std::uint64_t begin = 0, end = 0;
  std::uint64_t offset = 0;
};

// The contents of the data file of a rank responsible for unit-local ranges `ranges[u]`: units in
// order, each tensor that meets the range in order, and for it every slot, one after the other.
// The writer and the manifest are both derived from this one plan.
// In a tensor-parallel mesh the spec is a rank's pieces, and only the ranks of tensor-parallel index 0
// write the replicated tensors (`replicated` false elsewhere): each element of the model once.
inline std::vector<planned_piece> plan_data_file(const model_spec& spec, const std::vector<range>& ranges,
                                                 std::size_t nslots, std::uint64_t& bytes, bool replicated = true) {
  std::vector<planned_piece> plan;
  bytes = 0;
  for (std::size_t u = 0; u < spec.num_units(); ++u) {
    std::size_t at = 0;
    for (std::size_t t = 0; t < spec.units()[u].tensors.size(); ++t) {
      const range tr{at, at + spec.units()[u].tensors[t].numel};
      at = tr.end;
      if (!replicated && spec.units()[u].tensors[t].tp_parts == 1) continue;
      const range x = intersect(tr, ranges[u]);
      if (x.empty()) continue;
      plan.push_back({u, t, x.begin - tr.begin, x.end - tr.begin, bytes});
      bytes += static_cast<std::uint64_t>(x.size()) * 4 * nslots;
    }
  }
  return plan;
}

// Calls `reached` once, when a file of `total` bytes is half written (at once for an empty file).
class half_way {
 public:
  template <class F>
  half_way(std::uint64_t total, F&& reached) : total_(total), reached_(std::forward<F>(reached)) {}
  void wrote(std::uint64_t bytes) {
    if (done_ || 2 * bytes < total_) return;
    done_ = true;
    reached_();
  }

 private:
  std::uint64_t total_;
  std::function<void()> reached_;
  bool done_ = false;
};

inline void sync_directory_quietly(const fs::path& dir) noexcept {
  try {
    sync_directory(dir);
  } catch (...) {
  }
}

// Removes the version directory `name` of `dir` with everything in it, its manifest first, never
// following a symbolic link (see remove_tree_at). Best effort; returns whether it is gone.
inline bool remove_version(const fs::path& dir, const std::string& name) noexcept {
  try {
    const file d = file::open_directory(dir);
    const bool gone = remove_tree_at(d.fd(), name, manifest_name.data());
    ::fsync(d.fd());
    return gone;
  } catch (...) {
    return false;
  }
}

// Rank 0, before any data is written: the directory of versions, and in it a new, empty version.
inline std::uint64_t create_version(const fs::path& dir, bool new_directory) {
  std::error_code ec;
  bool created = false;
  if (new_directory) {
    created = fs::create_directory(dir, ec);
    ZERO_CHECK(!ec && created, io, "checkpoint: cannot create the new directory '", dir.string(), "'",
               ec ? ": " + ec.message() : std::string(": something exists under that name (it is left alone)"));
  } else {
    created = fs::create_directories(dir, ec);
    ZERO_CHECK(!ec, io, "checkpoint: cannot create directory '", dir.string(), "': ", ec.message());
  }
  ZERO_CHECK(fs::is_directory(dir, ec), io, "checkpoint: '", dir.string(), "' is not a directory");
  if (created) sync_directory(parent_of(dir));
  struct stat st {};
  ZERO_CHECK(::lstat((dir / manifest_name).c_str(), &st) != 0, invalid_argument, "checkpoint: '", dir.string(),
             "' is one checkpoint version (it holds a ", manifest_name,
             "); save into a directory of versions (for example its parent)");
  // One above every name that looks like a version, whatever it is (a link, a file, a directory
  // that cannot be read): a new version never collides with, or hides behind, an existing name.
  std::uint64_t highest = 0;
  std::string highest_name;
  for (const auto& v : list_versions(dir))
    if (v.number >= highest) highest = v.number, highest_name = v.path.filename().string();
  ZERO_CHECK(highest < max_version, io, "checkpoint: '", dir.string(), "' holds version ", quote_name(highest_name),
             ": a newer one would need a number wider than the 18 digits readers accept (max ", max_version,
             "); save into a new directory");
  const std::uint64_t next = highest + 1;
  const fs::path vdir = dir / version_name(next);
  const bool made = fs::create_directory(vdir, ec);
  ZERO_CHECK(!ec && made, io, "checkpoint: cannot create '", vdir.string(), "'",
             ec ? ": " + ec.message() : std::string(" (it exists: is another save running?)"));
  try {
    sync_directory(dir);
  } catch (...) {
    ::rmdir(vdir.c_str());
    throw;
  }
  return next;
}

// After the commit: removes versions beyond `keep` and incomplete older ones. Best effort, since
// the new checkpoint is already safe; each manifest goes first, so a version half-removed by a
// crash is merely incomplete, never a damaged checkpoint that looks committed. Only real
// directories are removed, through descriptors that never follow a link: an entry that is a
// symbolic link (say, to a checkpoint kept elsewhere) is neither followed nor removed.
inline void remove_old_versions(const fs::path& dir, std::uint64_t current, std::size_t keep) {
  std::vector<version_entry> versions;
  try {
    versions = list_versions(dir);
  } catch (...) {
    return;
  }
  std::size_t kept = 0;
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (it->number > current || !it->problem.empty()) continue;  // not ours to judge
    if (it->committed && kept < keep) {
      ++kept;
      continue;
    }
    remove_version(dir, it->path.filename().string());
  }
  sync_directory_quietly(dir);
}

}  // namespace detail

namespace detail {

// Step 1 of a save, a collective: rank 0 creates the new version directory; its number reaches
// the others with the verdict, and every rank returns it or throws.
template <CommBackend Comm>
std::uint64_t open_version(Comm& comm, const fs::path& dir, const save_options& options) {
  constexpr std::size_t sd = status_doubles;
  std::vector<double> head(sd + 2, 0.0);
  std::uint64_t version = 0;
  outcome prepared;
  if (comm.rank() == 0) prepared = attempt([&] { version = create_version(dir, options.new_directory); });
  encode(prepared, head.data());
  put_u64(head, sd, version);
  broadcast(comm, head, 0);
  settle(prepared, head, head.size(), "save (creating the version directory)");
  return get_u64(head, sd);
}

// The ranges a rank writes (canonical_range() of every unit) and its data file's plan.
struct data_file_plan {
  std::vector<range> ranges;
  std::vector<planned_piece> pieces;
  std::uint64_t bytes = 0;
};
template <class Engine>
data_file_plan plan_own_file(const Engine& e, const mesh_place& mesh, std::size_t nslots) {
  data_file_plan d;
  d.ranges.resize(e.spec().num_units());
  for (std::size_t u = 0; u < d.ranges.size(); ++u) d.ranges[u] = e.canonical_range(unit_id{u});
  d.pieces = plan_data_file(e.spec(), d.ranges, nslots, d.bytes, mesh.tp_rank == 0);
  return d;
}

// The unit-local offset of every planned piece's first element, in the plan's order.
inline std::vector<std::size_t> piece_starts(const model_spec& spec, const std::vector<planned_piece>& pieces) {
  std::vector<std::size_t> out;
  out.reserve(pieces.size());
  for (const auto& piece : pieces) {
    std::size_t base = 0;
    for (std::size_t t = 0; t < piece.tensor; ++t) base += spec.units()[piece.unit].tensors[t].numel;
    out.push_back(base + piece.begin);
  }
  return out;
}

// The rank's data file, byte for byte, into `base` (plan.bytes of host memory): each piece's slots
// one after the other, read from the engine (an offloaded one streams them from its tier).
template <class Engine>
void copy_own_file(Engine& e, const data_file_plan& plan, unsigned char* base) {
  constexpr std::size_t nslots = 1 + static_cast<std::size_t>(Engine::optimizer::slots);
  const auto starts = piece_starts(e.spec(), plan.pieces);
  for (std::size_t p = 0; p < plan.pieces.size(); ++p) {
    const auto& piece = plan.pieces[p];
    const std::size_t len = piece.end - piece.begin;
    float* arrays[nslots];
    for (std::size_t k = 0; k < nslots; ++k)
      arrays[k] = reinterpret_cast<float*>(base + piece.offset + k * len * sizeof(float));
    e.read_state(unit_id{piece.unit}, range{starts[p], starts[p] + len}, arrays[0], arrays + 1);
  }
}

// What a version's manifest says besides its files and segments, as the engine stands now: taken
// when the state is read (an asynchronous save's snapshot), written at the commit.
template <class Engine>
manifest manifest_head(const Engine& e, const mesh_place& mesh, int world) {
  using Opt = typename Engine::optimizer;
  manifest m;
  m.library = library_name();
  m.world_size = world;
  m.tensor_parallel = mesh.tp_size;
  m.stage = Engine::partitioner::stage;
  m.precision = std::string(Engine::precision::name);
  m.optimizer = std::string(Opt::name);
  m.hyper_parameters = hyper_parameters(e.optimizer_settings());
  m.param_groups = e.options().param_groups;
  m.state = e.state();
  ZERO_CHECK(std::isfinite(m.state.loss_scale) && m.state.loss_scale > 0.0f, invalid_argument,
             "checkpoint save: the loss scale ", m.state.loss_scale, " is not a positive finite number");
  m.slots.push_back(std::string(master_slot));
  for (auto& s : slot_names<Opt>()) m.slots.push_back(s);
  // The whole model; in a mesh each split tensor in its pieces, each replicated tensor once.
  for (const auto& u : mesh.model->units()) {
    unit_entry ue{u.name, {}};
    for (const auto& t : u.tensors) {
      tensor_entry te{t.name, t.shape, t.numel, std::string(stored_dtype), {}};
      if (mesh.tp_size > 1 && t.tp.split()) te.split_dim = t.tp.split_dim, te.parts = mesh.tp_size;
      ue.tensors.push_back(std::move(te));
    }
    m.units.push_back(std::move(ue));
  }
  return m;
}

// Completes a manifest's head (manifest_head()) with the data files of a world of `world` ranks, listed
// after the files the head lists already (the optimizer kind's state): rank r's file holds its
// unit-local ranges `ranges[r]` (plan_data_file's order), `bytes[r]` bytes hashing to `checksums[r]`;
// each tensor's segments sorted by piece and offset. `spec` is a rank's
// (in a mesh its pieces; the ranks of tensor-parallel index 0 hold the replicated tensors). Throws
// (invalid_argument) where a file's size is not what its ranges need.
inline void add_data_files(manifest& m, const model_spec& spec, int tp_size, std::size_t nslots,
                           const std::vector<std::vector<range>>& ranges, const std::vector<std::uint64_t>& bytes,
                           const std::vector<std::uint64_t>& checksums) {
  const int world = static_cast<int>(ranges.size());
  for (int r = 0; r < world; ++r) {
    const std::size_t file = m.files.size();  // after the files the head lists already (the optimizer's state)
    std::uint64_t planned = 0;
    const int tp_index = r % tp_size;  // comm::mesh's order: tensor-parallel ranks adjacent
    for (const auto& piece :
         plan_data_file(spec, ranges[static_cast<std::size_t>(r)], nslots, planned, tp_index == 0)) {
      const bool split = m.units[piece.unit].tensors[piece.tensor].parts > 1;
      segment s{
          piece.begin, piece.end, file, {}, split ? static_cast<std::uint32_t>(tp_index) : 0u};
      for (std::size_t k = 0; k < nslots; ++k) s.offsets.push_back(piece.offset + k * (piece.end - piece.begin) * 4);
      m.units[piece.unit].tensors[piece.tensor].segments.push_back(std::move(s));
    }
    const auto at = static_cast<std::size_t>(r);
    ZERO_CHECK(bytes[at] == planned, invalid_argument, "checkpoint save: rank ", r, " reports ", bytes[at],
               " bytes, its ranges need ", planned);
    m.files.push_back(file_entry{data_file_name(r, world), bytes[at], checksums[at]});
  }
  for (auto& u : m.units)
    for (auto& t : u.tensors)
      std::sort(t.segments.begin(), t.segments.end(), [](const segment& a, const segment& b) {
        return a.piece != b.piece ? a.piece < b.piece : a.begin < b.begin;
      });
}

// The optimizer kind's own state (engine::optimizer_kind_state), where it keeps one, into its file in
// the version directory `vdir`, listed in the manifest's head as its first file.
inline constexpr std::string_view optimizer_state_file = "optimizer_state.f32";
template <class Engine>
void write_optimizer_state(Engine& e, const fs::path& vdir, manifest& head) {
  const std::span<float> state = e.optimizer_kind_state();
  if (state.empty()) return;
  durable_writer w(vdir / optimizer_state_file, existing_file::refuse);
  w.write(state.data(), state.size_bytes());
  w.commit();
  head.optimizer_state = manifest::kind_state{head.files.size(), state.size()};
  head.files.push_back(file_entry{std::string(optimizer_state_file), w.bytes(), w.checksum()});
}

// A rank's data file as written: the outcome of writing it, and what the manifest needs of it.
struct written_file {
  outcome result;
  std::uint64_t checksum = 0, bytes = 0;
};

// Steps 2-3 of a save, a collective, after every rank has written (or failed to write) its data
// file: the files' records reach rank 0, which writes the manifest last (until it is in place the
// new version does not exist) and removes older versions. `spec` is this rank's (in a mesh its
// pieces), `head` what manifest_head() took. A failure throws on every rank and, until the clean-up
// began, removes the new version: each rank its own data file, rank 0 the whole directory.
template <CommBackend Comm>
save_result commit_version(Comm& comm, const model_spec& spec, int tp_size, std::size_t nslots, manifest head,
                           const fs::path& dir, std::uint64_t version, const std::vector<range>& ranges,
                           const written_file& mine_written, const save_options& options) {
  constexpr std::size_t sd = status_doubles;
  const int rank = comm.rank(), world = comm.size();
  const std::size_t units = spec.num_units();
  const fs::path vdir = dir / version_name(version);
  const fs::path my_file = vdir / data_file_name(rank, world);
  auto phase = [&](save_phase p) {
    if (options.on_phase) options.on_phase(p, rank);
  };
  const bool wrote_mine = !mine_written.result.error;
  auto abandon = [&] {
    if (wrote_mine) ::unlink(my_file.c_str());
    if (rank == 0) remove_version(dir, version_name(version));
  };

  const std::size_t stride = sd + 4 + 2 * units;  // status, checksum, bytes, ranges
  std::vector<double> mine(stride, 0.0);
  encode(mine_written.result, mine.data());
  put_u64(mine, sd, mine_written.checksum);
  put_u64(mine, sd + 2, mine_written.bytes);
  for (std::size_t u = 0; u < units; ++u) {
    mine[sd + 4 + 2 * u] = static_cast<double>(ranges[u].begin);
    mine[sd + 5 + 2 * u] = static_cast<double>(ranges[u].end);
  }
  const std::vector<double> all = all_gather(comm, mine);
  try {
    settle(mine_written.result, all, stride, "save (writing the data files)");
  } catch (...) {
    abandon();
    throw;
  }

  std::uint64_t total_bytes = 0;
  bool cleanup_began = false;  // the older versions may be going: the new one must then stay
  const outcome committed = rank != 0 ? outcome{} : attempt([&] {
    manifest m = std::move(head);
    std::vector<std::vector<range>> ranges_of(static_cast<std::size_t>(world), std::vector<range>(units));
    std::vector<std::uint64_t> bytes_of(static_cast<std::size_t>(world)), checksum_of(bytes_of.size());
    for (int r = 0; r < world; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * stride;
      for (std::size_t u = 0; u < units; ++u)
        ranges_of[static_cast<std::size_t>(r)][u] = range{static_cast<std::size_t>(all[at + sd + 4 + 2 * u]),
                                                          static_cast<std::size_t>(all[at + sd + 5 + 2 * u])};
      bytes_of[static_cast<std::size_t>(r)] = get_u64(all, at + sd + 2);
      checksum_of[static_cast<std::size_t>(r)] = get_u64(all, at + sd);
    }
    add_data_files(m, spec, tp_size, nslots, ranges_of, bytes_of, checksum_of);
    for (const file_entry& f : m.files) {
      // Every file must be visible here: on a file system that is not shared by all ranks it is not.
      struct stat st {};
      const bool seen = ::lstat((vdir / f.name).c_str(), &st) == 0;
      const int e = errno;
      ZERO_CHECK(seen && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) == f.bytes, io,
                 "checkpoint save: rank 0 sees '", (vdir / f.name).string(), "' ",
                 !seen ? "missing (" + errno_text(e) + "): is the directory on a file system all ranks share?"
                 : !S_ISREG(st.st_mode)
                     ? std::string("as ") + type_name(st.st_mode)
                     : "with " + std::to_string(st.st_size) + " bytes, not " + std::to_string(f.bytes));
      total_bytes += f.bytes;
    }
    const std::string text = serialize_manifest(m);
    // The reader checks what the writer wrote: ranges that fail to tile a tensor never get committed.
    (void)parse_manifest(text, (vdir / manifest_name).string());
    durable_writer w(vdir / manifest_name, existing_file::refuse);
    w.write(text.data(), text.size());
    phase(save_phase::manifest_staged);
    w.commit();
    phase(save_phase::committed);
    cleanup_began = true;
    remove_old_versions(dir, version, options.keep);
    phase(save_phase::cleaned);
  });
  std::vector<double> verdict(sd + 3, 0.0);
  encode(committed, verdict.data());
  put_u64(verdict, sd, total_bytes);
  verdict[sd + 2] = cleanup_began ? 1.0 : 0.0;
  broadcast(comm, verdict, 0);
  try {
    settle(committed, verdict, verdict.size(), "save (committing the manifest)");
  } catch (...) {
    // Until the clean-up began, the previous checkpoint is intact: the new version goes, so that
    // a failed save leaves the directory as it found it.
    if (verdict[sd + 2] == 0.0) abandon();
    throw;
  }
  return save_result{vdir, version, get_u64(verdict, sd), mine_written.bytes};
}

}  // namespace detail

// Saves the engine's master weights, optimizer slots and training state into a new version under
// `dir`. A collective: every rank of comm (the communicator the engine was built with; for an
// engine in a tensor-parallel mesh, the mesh's world) calls it. In a mesh the checkpoint holds the
// whole model, each split tensor as its pieces, each replicated tensor once (written by the ranks of
// tensor-parallel index 0); it loads into any mesh, stage and world size.
// Each rank writes the slice canonical_range() names, concurrently; rank 0 then writes the manifest,
// the commit record, and removes older versions. A process killed at any point leaves the previous
// checkpoint loadable. Every rank returns the same result or throws (see docs/checkpoint-format.md).
// checkpoint::async_saver (save_async.hpp) does the same with the writing in the background.
template <class Engine, CommBackend Comm>
save_result save(Engine& e, Comm& comm, const fs::path& dir, const save_options& options = {}) {
  using Opt = typename Engine::optimizer;
  constexpr std::size_t nslots = 1 + static_cast<std::size_t>(Opt::slots);
  const int rank = comm.rank(), world = comm.size();
  const detail::mesh_place mesh = detail::mesh_place_of(e);
  detail::check_communicator(e, comm, mesh, "save");
  ZERO_CHECK(options.keep >= 1, invalid_argument, "checkpoint save: keep must be at least 1");
  const model_spec& spec = e.spec();
  auto phase = [&](save_phase p) {
    if (options.on_phase) options.on_phase(p, rank);
  };

  // 1. Rank 0 creates the version directory.
  const std::uint64_t version = detail::open_version(comm, dir, options);
  const fs::path my_file = dir / version_name(version) / data_file_name(rank, world);

  // 2. Every rank writes its ranges: one array of one piece at a time, in chunks, so the staging is
  // one chunk whatever the units' sizes (an offloaded engine streams its states from the tier, never
  // holding a unit's in memory).
  detail::data_file_plan plan;
  detail::written_file written;
  written.result = detail::attempt([&] {
    phase(save_phase::version_created);
    plan = detail::plan_own_file(e, mesh, nslots);
    const auto starts = detail::piece_starts(spec, plan.pieces);
    durable_writer w(my_file, existing_file::refuse);
    if (options.direct_io) w.bypass_page_cache();
    detail::half_way half(plan.bytes, [&] { phase(save_phase::data_partly_written); });
    // The file goes out in whole staging blocks (aligned, at aligned offsets: past the page cache where
    // it is bypassed), filled across the pieces and arrays, and a ragged last one.
    const detail::aligned_floats stage(detail::state_chunk_elements);
    std::size_t staged = 0;
    const auto flush = [&] {
      w.write(stage.data(), staged * sizeof(float));
      half.wrote(w.bytes());
      staged = 0;
    };
    for (std::size_t p = 0; p < plan.pieces.size(); ++p) {
      const auto& piece = plan.pieces[p];
      const std::size_t from = starts[p], len = piece.end - piece.begin;
      for (std::size_t k = 0; k < nslots; ++k) {
        for (std::size_t c = 0; c < len;) {
          const std::size_t n = std::min(stage.size() - staged, len - c);
          float* slots[nslots] = {};  // only array k is read
          slots[k] = stage.data() + staged;
          e.read_state(unit_id{piece.unit}, range{from + c, from + c + n}, slots[0], slots + 1);
          staged += n;
          c += n;
          if (staged == stage.size()) flush();
        }
      }
    }
    if (staged > 0) flush();
    half.wrote(w.bytes());
    ZERO_CHECK(w.bytes() == plan.bytes, invalid_argument, "checkpoint save: rank ", rank, " wrote ", w.bytes(),
               " bytes, its plan has ", plan.bytes);
    w.commit();
    written.checksum = w.checksum();
    written.bytes = w.bytes();
    phase(save_phase::data_written);
  });
  if (plan.ranges.empty()) plan.ranges.resize(spec.num_units());

  // 3. Rank 0 writes the optimizer kind's state, where it keeps one (the same on every rank), and the
  // manifest, last.
  manifest head;
  if (rank == 0 && !written.result.error) {
    const detail::outcome took = detail::attempt([&] {
      head = detail::manifest_head(e, mesh, world);
      detail::write_optimizer_state(e, dir / version_name(version), head);
    });
    if (took.error) written.result = took;
  }
  return detail::commit_version(comm, spec, mesh.tp_size, nslots, std::move(head), dir, version, plan.ranges, written,
                                options);
}

// Removes a checkpoint directory this program made (a temporary one, say): its version
// directories, each through descriptors that never follow a symbolic link, then `dir` itself if
// nothing else is left in it. Anything it does not recognise as its own stays. Returns whether
// `dir` is gone.
inline bool remove_checkpoint(const fs::path& dir) noexcept {
  try {
    for (const auto& v : list_versions(dir))
      if (v.problem.empty()) detail::remove_version(dir, v.path.filename().string());
  } catch (...) {
    return false;
  }
  return ::rmdir(dir.c_str()) == 0;
}

}  // namespace zero::checkpoint
