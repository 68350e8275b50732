// Peer snapshots: each rank's data file in its own memory and its ring successor's, byte for byte a save's; any one
// rank lost, the survivors' holders load at any world size and stage to the snapshot's bits; two neighbours lost,
// changed memory, mixed snapshots and a take that fails are refused or leave the previous snapshot whole.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

#include "checkpoint_helpers.hpp"
#include "zero/checkpoint/peer_snapshot.hpp"

using namespace ckpt_test;

namespace {

using threads = zero::comm::threads;

// The bytes of a held file.
std::string bytes_of(const ckpt::memory_file& f) {
  return std::string(static_cast<const char*>(f.bytes.data()), f.bytes.bytes());
}

// Trains `steps` steps at N ranks and takes a peer snapshot into holders (one per rank), then trains
// `after` more steps, so that the engines have moved on from what the holders keep.
template <class Stage>
std::vector<std::shared_ptr<ckpt::peer_snapshot>> snapshot_at(int n, int steps, int after = 2, int distance = 1) {
  std::vector<std::shared_ptr<ckpt::peer_snapshot>> holders;
  for (int r = 0; r < n; ++r) holders.push_back(std::make_shared<ckpt::peer_snapshot>());
  threads::launch(n, [&](threads& comm) {
    zero::engine<Stage, threads, adamw> e(comm, toy::spec());
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
    ckpt::take_peer_snapshot(e, comm, *holders[static_cast<std::size_t>(comm.rank())], distance);
    for (int t = steps; t < steps + after; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
  });
  return holders;
}

std::vector<const ckpt::peer_snapshot*> pointers(const std::vector<std::shared_ptr<ckpt::peer_snapshot>>& holders) {
  std::vector<const ckpt::peer_snapshot*> out;
  for (const auto& h : holders) out.push_back(h.get());
  return out;
}

// Loads from the holders into a fresh engine at N ranks and returns what it then holds.
template <class Stage>
state_arrays load_held(int n, const std::vector<const ckpt::peer_snapshot*>& holders) {
  state_arrays s = sized_arrays<adamw>(toy::spec());
  threads::launch(n, [&](threads& comm) {
    zero::engine<Stage, threads, adamw> e(comm, toy::spec());
    ckpt::load_peer_snapshot(e, comm, holders);
    read_state(e, s);
  });
  return s;
}

}  // namespace

TEST_CASE_TEMPLATE("a peer snapshot holds a save's files: each rank its own and its predecessor's", Stage, zero::stage1,
                   zero::stage3) {
  for (int n : {1, 2, 3, 4, 5}) {
    CAPTURE(n);
    temp_dir d("peer");
    std::vector<ckpt::peer_snapshot> held(static_cast<std::size_t>(n));
    std::vector<ckpt::peer_snapshot_report> reports(held.size());
    threads::launch(n, [&](threads& comm) {
      zero::engine<Stage, threads, adamw> e(comm, toy::spec());
      e.initialize(toy::initializer());
      for (int t = 0; t < 3; ++t) toy::train_step(e, comm.rank(), static_cast<std::uint64_t>(t));
      ckpt::save(e, comm, d.path);
      auto& mine = held[static_cast<std::size_t>(comm.rank())];
      reports[static_cast<std::size_t>(comm.rank())] = ckpt::take_peer_snapshot(e, comm, mine);
      // Counted while the engine lives: both files, under snapshot.
      CHECK(e.memory().bytes(zero::mem_category::snapshot) == mine.bytes());
    });
    const ckpt::manifest disk = ckpt::read_manifest(d.path);
    const fs::path vdir = ckpt::resolve(d.path);
    // The plan's figures are the largest rank's.
    std::uint64_t most_held = 0, most_sent = 0;
    for (int r = 0; r < n; ++r) {
      most_held = std::max<std::uint64_t>(most_held, held[static_cast<std::size_t>(r)].bytes());
      most_sent = std::max<std::uint64_t>(most_sent, reports[static_cast<std::size_t>(r)].own_bytes);
    }
    const auto p = zero::plan_for<Stage, threads, adamw, zero::precision::fp32>(toy::spec(), n);
    CHECK(p.peer_snapshot_bytes == most_held);
    CHECK(p.peer_snapshot_wire_bytes == (n > 1 ? most_sent : 0));
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto& h = held[static_cast<std::size_t>(r)];
      const auto& report = reports[static_cast<std::size_t>(r)];
      REQUIRE(!h.empty());
      CHECK(h.step() == 3);
      CHECK(h.world() == n);
      CHECK(h.token() == held[0].token());
      CHECK(report.step == 3);
      // The manifest lists the disk's files: names, sizes, checksums; and the same segments.
      REQUIRE(h.info().files.size() == disk.files.size());
      for (std::size_t f = 0; f < disk.files.size(); ++f) {
        CHECK(h.info().files[f].name == disk.files[f].name);
        CHECK(h.info().files[f].bytes == disk.files[f].bytes);
        CHECK(h.info().files[f].xxh64 == disk.files[f].xxh64);
      }
      // Read back as a reader would (its hyper-parameters then in the parser's order).
      const ckpt::manifest read_back = ckpt::parse_manifest(ckpt::serialize_manifest(h.info()), "held");
      CHECK(ckpt::serialize_manifest(read_back) == ckpt::serialize_manifest(disk));
      const int pred = (r + n - 1) % n;
      REQUIRE(h.file_of(r) != nullptr);
      CHECK(bytes_of(*h.file_of(r)) == slurp(vdir / ckpt::data_file_name(r, n)));
      CHECK(report.own_bytes == disk.files[static_cast<std::size_t>(r)].bytes);
      if (n == 1) {
        CHECK(h.bytes() == report.own_bytes);
        continue;
      }
      REQUIRE(h.file_of(pred) != nullptr);
      CHECK(bytes_of(*h.file_of(pred)) == slurp(vdir / ckpt::data_file_name(pred, n)));
      CHECK(h.bytes() == disk.files[static_cast<std::size_t>(r)].bytes + disk.files[static_cast<std::size_t>(pred)].bytes);
      CHECK(report.held_bytes == h.bytes());
      for (int other = 0; other < n; ++other)
        if (other != r && other != pred) CHECK(h.file_of(other) == nullptr);
    }
  }
}

TEST_CASE("any one rank lost, the survivors' holders load at any world size and stage to the snapshot's bits") {
  const state_arrays at3 = train<zero::stage3>(4, 3);
  const auto holders = snapshot_at<zero::stage3>(4, 3);
  for (int lost = 0; lost < 4; ++lost) {
    CAPTURE(lost);
    auto survivors = pointers(holders);
    survivors.erase(survivors.begin() + lost);
    CHECK(bit_equal(load_held<zero::stage3>(3, survivors), at3));
    CHECK(bit_equal(load_held<zero::stage1>(2, survivors), at3));
    CHECK(bit_equal(load_held<zero::stage0>(1, survivors), at3));
    CHECK(bit_equal(load_held<zero::stage2>(5, survivors), at3));
  }
  // Every holder (a world that changed on purpose) and the holders in any order.
  auto all = pointers(holders);
  std::swap(all[0], all[3]);
  CHECK(bit_equal(load_held<zero::stage3>(4, all), at3));
}

TEST_CASE("two neighbours lost, changed memory and mixed snapshots are refused with the reason") {
  const auto holders = snapshot_at<zero::stage1>(4, 3);
  auto survivors = pointers(holders);
  survivors.erase(survivors.begin() + 1, survivors.begin() + 3);  // ranks 1 and 2: rank 1's file is gone
  CHECK_THROWS_WITH_AS(load_held<zero::stage1>(2, survivors),
                       doctest::Contains("no holder keeps the data file of rank 1 of its 4"), zero::error);
  // Ranks 0 and 2 lost: rank 1 holds 0's file, rank 3 holds 2's: nothing is missing.
  const state_arrays at3 = train<zero::stage1>(4, 3);
  CHECK(bit_equal(load_held<zero::stage1>(2, {holders[1].get(), holders[3].get()}), at3));

  // A snapshot of another moment among the holders.
  const auto later = snapshot_at<zero::stage1>(4, 4);
  CHECK_THROWS_WITH_AS(load_held<zero::stage1>(3, {holders[0].get(), later[1].get(), holders[2].get()}),
                       doctest::Contains("the holders keep different snapshots (of steps 3 and 4"), zero::error);
  CHECK_THROWS_WITH_AS(load_held<zero::stage1>(2, {}), doctest::Contains("no holder keeps a snapshot"), zero::error);

  // A byte of a held file changed: found by its checksum, on the ranks that read it.
  auto* byte = static_cast<unsigned char*>(holders[2]->file_of(2)->bytes.data()) + 7;
  *byte ^= 0x10;
  const std::vector<const ckpt::peer_snapshot*> only_changed{holders[0].get(), holders[2].get()};
  CHECK_THROWS_WITH_AS(load_held<zero::stage1>(2, only_changed),
                       doctest::Contains("the copy of rank 2's file hashes to"), zero::error);
}

TEST_CASE("a take that fails leaves every holder with the previous snapshot, which still loads") {
  const state_arrays at2 = train<zero::stage3>(3, 2);
  std::vector<std::shared_ptr<ckpt::peer_snapshot>> holders;
  for (int r = 0; r < 3; ++r) holders.push_back(std::make_shared<ckpt::peer_snapshot>());
  CHECK_THROWS_WITH_AS(threads::launch(3,
                                       [&](threads& comm) {
                                         zero::engine<zero::stage3, threads, adamw> e(comm, toy::spec());
                                         e.initialize(toy::initializer());
                                         auto& mine = *holders[static_cast<std::size_t>(comm.rank())];
                                         for (int t = 0; t < 2; ++t) toy::train_step(e, comm.rank(), t);
                                         ckpt::take_peer_snapshot(e, comm, mine);
                                         toy::train_step(e, comm.rank(), 2);
                                         if (comm.rank() == 1) throw std::runtime_error("rank 1 is lost");
                                         ckpt::take_peer_snapshot(e, comm, mine);
                                       }),
                       doctest::Contains("rank 1 is lost"), std::exception);
  for (const auto& h : holders) CHECK(h->step() == 2);
  holders.erase(holders.begin() + 1);
  CHECK(bit_equal(load_held<zero::stage2>(2, pointers(holders)), at2));
}

TEST_CASE("at distance T, any T adjacent ranks may go together (a tensor-parallel group)") {
  // (N, T): cycles of even length (4, 2: two of 2 ranks), of odd length (6, 2: two of 3), one cycle
  // (5, 2), and a distance past N (5, 7 = 2).
  for (const auto& shape : {std::pair{4, 2}, std::pair{6, 2}, std::pair{5, 2}, std::pair{5, 7}, std::pair{6, 3}}) {
    const int n = shape.first, t = shape.second;  // plain names: lambdas below capture them
    CAPTURE(n);
    CAPTURE(t);
    const state_arrays at3 = train<zero::stage2>(n, 3);
    const auto holders = snapshot_at<zero::stage2>(n, 3, 1, t);
    for (int r = 0; r < n; ++r) {
      const int d = t % n;
      CHECK(holders[static_cast<std::size_t>(r)]->distance() == t);
      CHECK(holders[static_cast<std::size_t>(r)]->file_of((r + n - d) % n) != nullptr);
    }
    const int group = std::min(t % n, n - 1);
    for (int first = 0; first + group <= n; first += group) {
      CAPTURE(first);
      auto survivors = pointers(holders);
      survivors.erase(survivors.begin() + first, survivors.begin() + first + group);
      CHECK(bit_equal(load_held<zero::stage2>(n - group, survivors), at3));
    }
  }
  // Each file must go to another rank.
  CHECK_THROWS_WITH_AS(snapshot_at<zero::stage1>(3, 1, 0, 3), doctest::Contains("distance 3 in a world of 3 ranks"),
                       zero::error);
  CHECK_THROWS_WITH_AS(snapshot_at<zero::stage1>(3, 1, 0, 0), doctest::Contains("distance 0"), zero::error);
}

TEST_CASE("the plan's peer snapshot bytes: the formula where no rank's slice holds padding, below it where one does") {
  zero::model_spec even;  // 2 units of 3,072 and 768 elements: every N below holds them without padding
  even.unit("a").tensor("w", {48, 64});
  even.unit("b").tensor("w", {768});
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const auto p = zero::plan_for<zero::stage3, threads, adamw, zero::precision::fp32>(even, n);
    REQUIRE(p.padded == p.numel);
    const auto f = zero::formula::peer_snapshot_bytes(p.padded, n, adamw::slots);
    CHECK(p.peer_snapshot_bytes == f.held);
    CHECK(p.peer_snapshot_wire_bytes == f.sent);
    const auto q = zero::plan_for<zero::stage1, threads, zero::optim::sgd, zero::precision::bf16>(even, n);
    const auto g = zero::formula::peer_snapshot_bytes(q.padded, n, zero::optim::sgd::slots);
    CHECK(q.peer_snapshot_bytes == g.held);
    CHECK(g.held * 3 == f.held * 2);  // two arrays, not three
    const auto t = zero::plan_for<zero::stage2, threads, adamw, zero::precision::fp32>(toy::spec(), n);
    CHECK(t.peer_snapshot_bytes <= zero::formula::peer_snapshot_bytes(t.padded, n, adamw::slots).held);
  }
  CHECK_THROWS_AS(zero::formula::peer_snapshot_bytes(10, 3, 2), zero::error);
}
