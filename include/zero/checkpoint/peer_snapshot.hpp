// checkpoint::peer_snapshot: each rank's checkpoint kept in host memory, its own and a copy on its ring neighbour, so
// that the state of any one lost rank survives in the others; and the load, at any world size, from what they hold.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "zero/checkpoint/checksum.hpp"
#include "zero/checkpoint/collective.hpp"
#include "zero/checkpoint/load.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/mesh_place.hpp"
#include "zero/checkpoint/save.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/error.hpp"
#include "zero/offload/host_block.hpp"

namespace zero::checkpoint {

// One rank's data file of a snapshot, byte for byte as save() writes it, in host memory.
struct memory_file {
  int rank = -1;  // whose: its rank in the world that took the snapshot
  snapshot_block bytes;
};

// One take_peer_snapshot, as this rank saw it.
struct peer_snapshot_report {
  std::uint64_t step = 0;        // of the snapshot
  std::uint64_t own_bytes = 0;   // this rank's data file: sent to its successor once
  std::uint64_t held_bytes = 0;  // own + predecessor's, held until the next snapshot completes
  double copy_seconds = 0;       // the state copied into the own file, with its checksum
  double exchange_seconds = 0;   // the ring's copy, the manifest and the agreement
};

class peer_snapshot;
template <class Engine, class Comm>
peer_snapshot_report take_peer_snapshot(Engine& e, Comm& comm, peer_snapshot& held, int distance = 1);

// What one rank holds of its world's last complete snapshot: the manifest (every rank's file listed,
// as save() would commit it), its own data file and its ring predecessor's (rank (r - d) mod N, d the
// take's distance, 1 by default). Any one rank lost, its file survives on its successor, so the
// survivors hold the whole snapshot; a rank and its successor lost, one file is gone. With d = T,
// any T consecutive ranks may go together (a tensor-parallel group of T adjacent ranks). Outlives the engine and the communicator that took it: a world
// of another size loads from it (load_peer_snapshot).
class peer_snapshot {
 public:
  bool empty() const { return info_ == nullptr; }
  // The snapshot's manifest: world size, stage, training state, every file's size and checksum.
  const manifest& info() const { return *info_; }
  // Steps done when it was taken, skipped ones included (the data position a resumed run continues from).
  std::uint64_t step() const { return info_ ? info_->state.step + info_->state.skipped_steps : 0; }
  int world() const { return info_ ? info_->world_size : 0; }
  // The data file of rank `rank` of the snapshot's world, if this holder keeps it.
  const memory_file* file_of(int rank) const {
    for (const auto& f : files_)
      if (f.rank == rank) return &f;
    return nullptr;
  }
  // Host memory held: the own file and the predecessor's.
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& f : files_) n += f.bytes.bytes();
    return n;
  }
  // The same snapshot on every rank that took it together (a value drawn by the world's rank 0).
  std::uint64_t token() const { return token_; }
  // The take's distance: each file is also held by rank (r + distance) mod N.
  int distance() const { return distance_; }
  // Frees the memory; the holder is then empty.
  void clear() { *this = peer_snapshot(); }

 private:
  template <class Engine, class Comm>
  friend peer_snapshot_report take_peer_snapshot(Engine&, Comm&, peer_snapshot&, int);

  std::shared_ptr<const manifest> info_;
  std::vector<memory_file> files_;  // the own file first, then the predecessor's (none in a world of one)
  std::uint64_t token_ = 0;
  int distance_ = 1;
};

namespace detail {

// The ring's copy: rank r's `own` reaches rank (r + d) mod N's `predecessor` (d = distance). The
// edges r -> r + d form gcd(N, d) cycles of N / gcd(N, d) ranks; each cycle's edges are coloured by
// their place in it so that no rank has two of one colour (2 colours for a cycle of even length, 3 for
// an odd one). Per colour, each edge's two ranks form a world of their own (comm.split) where the
// sender broadcasts. Each rank sends its file once and receives one: the wire is the own file's bytes.
template <class Comm>
void ring_copy(Comm& comm, int distance, const float* own, std::size_t own_floats, float* predecessor,
               std::size_t pred_floats) {
  const int n = comm.size(), r = comm.rank();
  const int d = ((distance % n) + n) % n;
  if (n < 2 || d == 0) return;
  int g = n;  // gcd(n, d): the cycles
  for (int b = d; b != 0;) g = std::exchange(b, g % b);
  const int length = n / g;
  // The place of rank q in its cycle (the cycle of q mod g starts at q mod g).
  const auto place = [&](int q) {
    int p = 0;
    for (int at = q % g; at != q; at = (at + d) % n) ++p;
    return p;
  };
  const auto colour = [&](int sender) {
    const int p = place(sender);
    return length % 2 == 1 && p == length - 1 ? 2 : p % 2;
  };
  const int to = (r + d) % n, from = (r + n - d) % n;  // the edges r -> to and from -> r, named by their senders
  for (int c = 0; c < (length % 2 == 1 ? 3 : 2); ++c) {
    const int group = colour(r) == c ? r : colour(from) == c ? from : n + r;
    const std::unique_ptr<Comm> pair = comm.split(group);
    if (group == r) {
      pair->broadcast(own, const_cast<float*>(own), own_floats, r < to ? 0 : 1);  // ranked in the world's order
    } else if (group == from) {
      pair->broadcast(predecessor, predecessor, pred_floats, from < r ? 0 : 1);
    }
  }
}

}  // namespace detail

// Takes a snapshot of the engine's state into `held`, a collective over comm (the engine's
// communicator, or the backend under a wrapper that cannot split: it needs comm.split):
//   1. each rank copies its ranges of the master weights and slots into host memory, as its data file
//      of a save would hold them (e.snapshot_memory: counted under mem_category::snapshot), with
//      the file's xxHash64;
//   2. the ranks' ranges and checksums are all-gathered, so that every rank holds the whole manifest;
//   3. each rank's file is copied to its successor, rank (r + distance) mod N, whose checksum of it
//      must match (distance 1 by default: the ring's neighbour; T in a mesh whose tensor-parallel
//      groups of T adjacent ranks are lost together: the same place in the next group).
// Only when every rank has all of it does `held` change (an agreement): a failure anywhere, a rank
// lost during the take included, throws on every rank and leaves each holder with the previous
// snapshot, so the survivors' holders always agree. While it runs a rank holds both snapshots (up
// to twice held_bytes); afterwards the previous one is freed. A world of one keeps its own file only.
template <class Engine, class Comm>
peer_snapshot_report take_peer_snapshot(Engine& e, Comm& comm, peer_snapshot& held, int distance) {
  static_assert(comm::splittable<Comm>, "take_peer_snapshot: the ring's copy needs comm.split (comm/split.hpp); pass "
                                        "the backend under a wrapper that cannot split");
  static_assert(Comm::system::host_addressable,
                "take_peer_snapshot: the snapshots are host memory, copied by a backend whose system addresses it");
  using clock = std::chrono::steady_clock;
  using Opt = typename Engine::optimizer;
  constexpr std::size_t nslots = 1 + static_cast<std::size_t>(Opt::slots);
  constexpr std::size_t sd = detail::status_doubles;
  const detail::mesh_place mesh = detail::mesh_place_of(e);
  detail::check_communicator(e, comm, mesh, "peer snapshot");
  detail::check_no_kind_state(e, "peer snapshot");
  const int rank = comm.rank(), world = comm.size();
  ZERO_CHECK(world == 1 || (distance > 0 && distance % world != 0), invalid_argument,
             "peer snapshot: distance ", distance, " in a world of ", world,
             " ranks: each file must go to another rank (1 to N - 1, or any positive value not a multiple of N)");
  const std::size_t units = e.spec().num_units();
  const auto t0 = clock::now();

  // 1. The own file.
  detail::data_file_plan plan;
  memory_file own{rank, {}};
  std::uint64_t checksum = 0;
  const detail::outcome copied = detail::attempt([&] {
    plan = detail::plan_own_file(e, mesh, nslots);
    own.bytes = e.snapshot_memory(plan.bytes);
    auto* base = static_cast<unsigned char*>(own.bytes.data());
    detail::copy_own_file(e, plan, base);
    checksum = xxh64(base, plan.bytes);
  });
  if (plan.ranges.empty()) plan.ranges.resize(units);
  const auto t1 = clock::now();

  // 2. Every rank's record: status, checksum, bytes, rank 0's token, ranges.
  std::uint64_t token = 0;
  if (rank == 0) {
    std::random_device rd;
    token = (std::uint64_t{rd()} << 32) ^ rd();
  }
  const std::size_t stride = sd + 6 + 2 * units;
  std::vector<double> mine(stride, 0.0);
  detail::encode(copied, mine.data());
  detail::put_u64(mine, sd, checksum);
  detail::put_u64(mine, sd + 2, plan.bytes);
  detail::put_u64(mine, sd + 4, token);
  for (std::size_t u = 0; u < units; ++u) {
    mine[sd + 6 + 2 * u] = static_cast<double>(plan.ranges[u].begin);
    mine[sd + 7 + 2 * u] = static_cast<double>(plan.ranges[u].end);
  }
  const std::vector<double> all = detail::all_gather(comm, mine);
  detail::settle(copied, all, stride, "peer snapshot (copying the state)");
  token = detail::get_u64(all, sd + 4);
  const int pred = world > 1 ? (rank + world - distance % world) % world : 0;
  const auto record = [&](int r) { return static_cast<std::size_t>(r) * stride; };

  // The manifest, the same on every rank, and the predecessor's file's memory.
  std::shared_ptr<manifest> info;
  memory_file received{pred, {}};
  const detail::outcome prepared = detail::attempt([&] {
    info = std::make_shared<manifest>(detail::manifest_head(e, mesh, world));
    std::vector<std::vector<range>> ranges(static_cast<std::size_t>(world), std::vector<range>(units));
    std::vector<std::uint64_t> bytes(static_cast<std::size_t>(world)), sums(bytes.size());
    for (int r = 0; r < world; ++r) {
      for (std::size_t u = 0; u < units; ++u)
        ranges[static_cast<std::size_t>(r)][u] = range{static_cast<std::size_t>(all[record(r) + sd + 6 + 2 * u]),
                                                       static_cast<std::size_t>(all[record(r) + sd + 7 + 2 * u])};
      sums[static_cast<std::size_t>(r)] = detail::get_u64(all, record(r) + sd);
      bytes[static_cast<std::size_t>(r)] = detail::get_u64(all, record(r) + sd + 2);
    }
    detail::add_data_files(*info, e.spec(), mesh.tp_size, nslots, ranges, bytes, sums);
    if (world > 1) received.bytes = e.snapshot_memory(info->files[static_cast<std::size_t>(pred)].bytes);
  });
  detail::agree(comm, prepared, "peer snapshot (the manifest and the neighbour's memory)");

  // 3. The ring's copy, then the received file checked against its owner's checksum.
  if (world > 1) {
    detail::ring_copy(comm, distance, static_cast<const float*>(own.bytes.data()), plan.bytes / sizeof(float),
                      static_cast<float*>(received.bytes.data()),
                      info->files[static_cast<std::size_t>(pred)].bytes / sizeof(float));
  }
  const detail::outcome checked = detail::attempt([&] {
    if (world == 1) return;
    const file_entry& f = info->files[static_cast<std::size_t>(pred)];
    const std::uint64_t h = xxh64(received.bytes.data(), f.bytes);
    ZERO_CHECK(h == f.xxh64, corrupt, "peer snapshot: rank ", rank, " received rank ", pred, "'s file hashing to ",
               to_hex(h), ", its owner's checksum is ", to_hex(f.xxh64));
  });
  detail::agree(comm, checked, "peer snapshot (the neighbour's copy)");

  // Every rank has all of it: the new snapshot replaces the previous one.
  peer_snapshot next;
  next.info_ = std::move(info);
  next.files_.push_back(std::move(own));
  if (world > 1) next.files_.push_back(std::move(received));
  next.token_ = token;
  next.distance_ = distance;
  held = std::move(next);
  peer_snapshot_report report;
  report.step = held.step();
  report.own_bytes = plan.bytes;
  report.held_bytes = held.bytes();
  report.copy_seconds = std::chrono::duration<double>(t1 - t0).count();
  report.exchange_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return report;
}

namespace detail {

// The files of a snapshot, read where the holders keep them (in this process's memory: the ranks
// are threads of it), each checked against the manifest's size and checksum the first time.
class held_files {
 public:
  held_files(const manifest& m, std::vector<const memory_file*> files) : m_(&m), files_(std::move(files)) {
    verified_.assign(files_.size(), false);
  }
  void verify(const std::vector<std::size_t>& which) {
    for (std::size_t i : which) {
      if (verified_[i]) continue;
      const file_entry& f = m_->files[i];
      const memory_file& held = *files_[i];
      ZERO_CHECK(held.bytes.bytes() == f.bytes, corrupt, "peer snapshot: the copy of rank ", held.rank, "'s file has ",
                 held.bytes.bytes(), " bytes, the manifest says ", f.bytes);
      const std::uint64_t h = xxh64(held.bytes.data(), f.bytes);
      ZERO_CHECK(h == f.xxh64, corrupt, "peer snapshot: the copy of rank ", held.rank, "'s file hashes to ", to_hex(h),
                 ", the manifest says ", to_hex(f.xxh64), ": the memory holding it was changed");
      verified_[i] = true;
    }
  }
  void read(std::size_t i, void* dst, std::size_t bytes, std::uint64_t offset) {
    std::memcpy(dst, static_cast<const unsigned char*>(files_[i]->bytes.data()) + offset, bytes);
  }

 private:
  const manifest* m_;
  std::vector<const memory_file*> files_;
  std::vector<bool> verified_;
};

// The holders' common snapshot and, for each of its files, a holder's copy; throws (invalid_argument)
// naming what is missing or inconsistent.
inline std::pair<const peer_snapshot*, std::vector<const memory_file*>> find_snapshot(
    const std::vector<const peer_snapshot*>& holders) {
  const peer_snapshot* first = nullptr;
  for (const peer_snapshot* h : holders)
    if (h && !h->empty()) {
      if (!first) first = h;
      ZERO_CHECK(h->token() == first->token(), invalid_argument,
                 "peer snapshot: the holders keep different snapshots (of steps ", first->step(), " and ", h->step(),
                 ", worlds of ", first->world(), " and ", h->world(), " ranks)");
    }
  ZERO_CHECK(first != nullptr, invalid_argument, "peer snapshot: no holder keeps a snapshot");
  const int world = first->world();
  std::vector<const memory_file*> files(static_cast<std::size_t>(world), nullptr);
  std::string missing;
  int lost = 0;
  for (int r = 0; r < world; ++r) {
    for (const peer_snapshot* h : holders)
      if (h && !h->empty() && (files[static_cast<std::size_t>(r)] = h->file_of(r))) break;
    if (!files[static_cast<std::size_t>(r)]) missing += (lost++ ? ", " : "") + std::to_string(r);
  }
  ZERO_CHECK(lost == 0, invalid_argument, "peer snapshot: the snapshot of step ", first->step(),
             " cannot be rebuilt: no holder keeps the data file", lost > 1 ? "s" : "", " of rank", lost > 1 ? "s " : " ",
             missing, " of its ", world, " (each file is held by its rank and rank + ", first->distance(),
             ": both lost)");
  return {first, std::move(files)};
}

}  // namespace detail

// Loads the engine from a snapshot the holders keep between them (each rank of the world that took
// it held its own file and its predecessor's), whatever world size and stage load it: the holders of
// the survivors after a rank was lost, or all of them after the world changed on purpose. A
// collective over comm (the engine's communicator); every rank passes holders of the same snapshot.
// The holders are read where they are, in this process's memory: the ranks are threads of one
// process (comm::threads). Each rank checks the size and checksum of every file it reads. As
// load(): the master weights, slots and training state, bit-identical to the snapshot; the
// optimizer's hyper-parameters stay the engine's (the snapshot's are in the result).
template <class Engine, CommBackend Comm>
load_result load_peer_snapshot(Engine& e, Comm& comm, const std::vector<const peer_snapshot*>& holders) {
  const detail::mesh_place mesh = detail::mesh_place_of(e);
  detail::check_communicator(e, comm, mesh, "peer snapshot load");
  detail::check_no_kind_state(e, "peer snapshot load");
  load_result result;
  std::vector<range> held;
  std::vector<std::vector<detail::planned_read>> plan;
  std::optional<detail::held_files> files;
  const detail::outcome checked = detail::attempt([&] {
    auto [snapshot, copies] = detail::find_snapshot(holders);
    result.info = snapshot->info();
    files.emplace(snapshot->info(), std::move(copies));
    plan = detail::plan_load(e, mesh, snapshot->info(), "peer snapshot of step " + std::to_string(snapshot->step()),
                             *files, held);
  });
  detail::agree(comm, checked, "peer snapshot load (finding and checking the snapshot)");
  const detail::outcome stored = detail::attempt([&] { detail::read_planned(e, held, plan, *files); });
  detail::agree(comm, stored, "peer snapshot load (reading the held files)");
  e.finish_load(result.info.state);
  return result;
}

}  // namespace zero::checkpoint
