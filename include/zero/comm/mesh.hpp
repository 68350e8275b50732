// comm::mesh<C>: the ranks of a backend as a dp x tp grid, with its data-parallel and tensor-parallel sub-communicators and this rank's coordinates.
#pragma once

// The order of the dimensions: tensor-parallel ranks are adjacent, as the GPUs of a node are, so
//   rank = dp_index * tp + tp_index
// A tensor-parallel group is tp consecutive ranks (dp_index fixed); a data-parallel group is the dp
// ranks of equal tp_index, tp apart. Each group is a communicator of the backend's own type (its
// split, comm/split.hpp), ranked by the other coordinate: in the tensor-parallel group this rank is
// tp_index, in the data-parallel group dp_index. A ZeRO engine over dp() partitions over the
// data-parallel ranks only; the tensor-parallel ranks of a group hold different pieces of the model.
//
// A shape that does not fit the world (a dimension < 1, a product other than the world size) is
// refused before any collective, the same way on every rank, naming the shape and the world size.

#include <cstdint>
#include <memory>

#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/error.hpp"

namespace zero::comm {

// The extent of each dimension: dp data-parallel groups' worth of ranks times tp ranks per
// tensor-parallel group.
struct mesh_shape {
  int dp = 1;
  int tp = 1;
  bool operator==(const mesh_shape&) const = default;
};

// A rank's place in the grid.
struct mesh_coordinates {
  int dp = 0;  // which tensor-parallel group (its index in the data-parallel group)
  int tp = 0;  // its index in the tensor-parallel group
  bool operator==(const mesh_coordinates&) const = default;
};

// Throws zero::error (invalid_argument) unless `shape` covers exactly `world_size` ranks.
inline void check_mesh_shape(mesh_shape shape, int world_size) {
  ZERO_CHECK(shape.dp >= 1 && shape.tp >= 1, invalid_argument, "mesh ", shape.dp, " x ", shape.tp,
             " (dp x tp): each dimension must be at least 1");
  const std::int64_t ranks = static_cast<std::int64_t>(shape.dp) * shape.tp;
  ZERO_CHECK(ranks == world_size, invalid_argument, "mesh ", shape.dp, " x ", shape.tp, " (dp x tp) has ", ranks,
             " ranks but the world has ", world_size);
}

// The coordinates of `rank` in a grid of `shape` (tensor-parallel ranks adjacent), and back.
inline mesh_coordinates mesh_coordinates_of(mesh_shape shape, int rank) { return {rank / shape.tp, rank % shape.tp}; }
inline int mesh_rank_of(mesh_shape shape, mesh_coordinates c) { return c.dp * shape.tp + c.tp; }

template <CommBackend C>
  requires splittable<C>
class mesh {
 public:
  // A collective on `world` (two splits). `world` must outlive the mesh; the groups are destroyed
  // with it, before `world`.
  mesh(C& world, mesh_shape shape) : world_(&world), shape_(shape) {
    check_mesh_shape(shape, world.size());
    at_ = mesh_coordinates_of(shape, world.rank());
    tp_ = world.split(at_.dp);  // the ranks of one tensor-parallel group share their dp index
    dp_ = world.split(at_.tp);  // the ranks of one data-parallel group share their tp index
  }

  const mesh_shape& shape() const { return shape_; }
  const mesh_coordinates& coordinates() const { return at_; }
  C& world() const { return *world_; }
  // The data-parallel group of this rank: dp ranks, this one at dp_index.
  C& dp() const { return *dp_; }
  // The tensor-parallel group of this rank: tp ranks, this one at tp_index.
  C& tp() const { return *tp_; }

 private:
  C* world_;
  mesh_shape shape_;
  mesh_coordinates at_{};
  std::unique_ptr<C> tp_, dp_;
};

// Whether M is comm::mesh<C>: for a constraint that must not name mesh<C> where C cannot split (an
// engine over any backend offers its mesh constructor through it).
template <class M, class C>
inline constexpr bool is_mesh_over = false;
template <class C>
inline constexpr bool is_mesh_over<mesh<C>, C> = true;

}  // namespace zero::comm
