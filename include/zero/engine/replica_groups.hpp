// HSDP's groups: the data-parallel ranks as R replicas of a shard group of S ranks, split from the engine's backend.
#pragma once

#include <memory>

#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/error.hpp"

namespace zero {

// engine_options::shard_group_size = S (docs/parallelism.md, "Replicated shard groups"): the N
// data-parallel ranks are R = N / S groups of S consecutive ranks (a node's, in the usual placement).
// ZeRO runs within a group: its layout, gathers and reduce-scatters are the group's, so a rank holds
// 1/S of what it partitions. The groups are replicas of each other: after the in-group reduce, each
// rank's reduced slice is all-reduced with the ranks of the same position in every group (its replica
// group), so every replica updates the same slice from the same gradient. The data-parallel rank is
// index() x S + rank_in_group().
//
// A rank's place follows from S alone, so the engine lays itself out before any collective; the split
// (two collectives) waits until the ranks have agreed on their settings, S among them: a rank that
// named another S would otherwise split differently, or not at all, and its peers would wait for it.
template <class Comm>
class replica_groups {
 public:
  // Checks S against the backend's N (0: all of them) on this rank alone, before any collective.
  replica_groups(Comm& comm, int shard_group_size) : whole_(&comm) {
    const int n = comm.size(), rank = comm.rank();
    ZERO_CHECK(shard_group_size >= 0, invalid_argument, "rank ", rank, ": engine_options::shard_group_size ",
               shard_group_size, " is negative (0: the whole data-parallel group)");
    size_ = shard_group_size == 0 ? n : shard_group_size;
    ZERO_CHECK(size_ <= n && n % size_ == 0, invalid_argument, "rank ", rank, ": engine_options::shard_group_size ",
               size_, " does not divide the ", n, " data-parallel ranks (0: all of them)");
    ZERO_CHECK(size_ == n || comm::splittable<Comm>, invalid_argument, "rank ", rank,
               ": engine_options::shard_group_size ", size_,
               " needs a backend with split() (comm/split.hpp); this one has none");
  }
  replica_groups(const replica_groups&) = delete;
  replica_groups& operator=(const replica_groups&) = delete;

  // S, the groups R, this rank's group and its rank in it.
  int size() const { return size_; }
  int count() const { return whole_->size() / size_; }
  int index() const { return whole_->rank() / size_; }
  int rank_in_group() const { return whole_->rank() % size_; }

  // The two splits, once the ranks agree on S (a collective; nothing where there is one group): the
  // S consecutive ranks of this rank's group, and this position in every group.
  void split() {
    if (count() == 1) return;
    if constexpr (comm::splittable<Comm>) {
      shard_ = whole_->split(index());
      replicas_ = whole_->split(rank_in_group());
    }
  }
  // The shard group (after split(); the whole group where there is one), and the replicas (null
  // where there is one group).
  Comm& shard() const { return shard_ ? *shard_ : *whole_; }
  Comm* replicas() const { return replicas_.get(); }

 private:
  Comm* whole_;
  int size_ = 1;
  std::unique_ptr<Comm> shard_, replicas_;
};

}  // namespace zero
