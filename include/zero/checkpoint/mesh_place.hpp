// Where an engine stands in a tensor-parallel mesh, for the checkpoint collectives: the model, the group, and the
// communicator they need.
#pragma once

#include <cstdint>

#include "zero/core/model_spec.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint::detail {

// Where an engine stands in a tensor-parallel mesh (a group of one outside a mesh): the model it
// trains pieces of, and the communicator a checkpoint collective runs on, the mesh's world, in which
// this rank is dp_rank x tp_size + tp_rank (comm::mesh's order).
struct mesh_place {
  const model_spec* model = nullptr;
  int tp_size = 1, tp_rank = 0;
};
template <class Engine>
mesh_place mesh_place_of(const Engine& e) {
  if constexpr (requires {
                  e.model();
                  e.tensor_parallel_size();
                })
    return {&e.model(), e.tensor_parallel_size(), e.tensor_parallel_rank()};
  else
    return {&e.spec(), 1, 0};
}
// Refuses a communicator that is not the one the checkpoint's collectives need: the engine's, or in
// a mesh its world.
template <class Engine, class Comm>
void check_communicator(const Engine& e, const Comm& comm, const mesh_place& mp, const char* what) {
  // Not a communicator's property, but what every checkpoint call checks of the engine first, alike
  // on every rank (a property of its type): a checkpoint carries the master weights and the slots.
  constexpr bool complete = [] {
    if constexpr (requires { Engine::checkpoints_optimizer_state; })
      return Engine::checkpoints_optimizer_state;
    else
      return true;
  }();
  ZERO_CHECK(complete, invalid_argument, "checkpoint ", what, ": optim::",
             Engine::optimizer::name, " keeps state beside its per-element slots (its kind's, e.g. factored "
             "moments), which checkpoints do not carry: a checkpoint would lose it");
  const std::int64_t world = static_cast<std::int64_t>(e.world_size()) * mp.tp_size;
  const std::int64_t rank = static_cast<std::int64_t>(e.rank()) * mp.tp_size + mp.tp_rank;
  ZERO_CHECK(comm.rank() == rank && comm.size() == world, invalid_argument, "checkpoint ", what,
             ": the communicator (rank ", comm.rank(), " of ", comm.size(), ") is not the engine's (rank ", rank,
             " of ", world, mp.tp_size > 1 ? "; in a tensor-parallel mesh, pass the mesh's world" : "", ")");
}

// Refuses an engine whose optimizer kind keeps state of its own (engine::optimizer_kind_state) where
// `what` (an asynchronous save, a peer snapshot) carries only the data files, which do not hold it.
template <class Engine>
void check_no_kind_state(Engine& e, const char* what) {
  if constexpr (requires { e.optimizer_kind_state(); })
    ZERO_CHECK(e.optimizer_kind_state().empty(), invalid_argument, "checkpoint ", what, ": optim::",
               Engine::optimizer::name, " keeps state beside its per-element slots, which only checkpoint::save "
               "and load carry: save with checkpoint::save");
}

}  // namespace zero::checkpoint::detail
