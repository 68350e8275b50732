// step()'s all-gathers of the updated parameters where a unit is kept whole, in flight until something reads them.
#pragma once

#include <cstddef>
#include <vector>

#include "zero/core/layout.hpp"
#include "zero/engine/parameters.hpp"

namespace zero {

// Where a unit's parameters are kept whole on every rank (stages 1-2; stage 3's persistent units),
// step() all-gathers its updated shard as soon as the unit is updated, so that the gather runs while
// the next unit updates. Without overlap each completes at once. With overlap they stay in flight after
// step() returns: the next step's gather(u) waits for its unit's (the forward pass overlaps them);
// anything else that reads or writes the parameters waits for all of them (complete_all).
// Destroyed before the parameters it writes (the engine declares it after them): a request in flight
// completes before those buffers are freed.
template <class Ctx>
class step_gathers {
 public:
  using request = typename Ctx::request;

  step_gathers(Ctx& c, parameter_placement<Ctx>& placement)
      : ctx_(c), placement_(placement), units_(c.spec.num_units()) {}
  step_gathers(const step_gathers&) = delete;
  step_gathers& operator=(const step_gathers&) = delete;

  // After unit u's update: the all-gather of its shard, where the unit is kept whole.
  void start(unit_id u) {
    if (!placement_.keeps_whole(u)) return;
    in_flight& g = units_[u.index];
    {
      const auto l = ctx_.label("step", u);
      g.collective = placement_.start_whole_gather(ctx_.protocol, u);
    }
    g.pending = true;
    if (!ctx_.overlapping())
      complete(u);
    else
      ++ctx_.overlap.parameter_gathers_started;
  }
  // Waits for unit u's, if one is in flight.
  void complete(unit_id u) {
    in_flight& g = units_[u.index];
    if (!g.pending) return;
    g.pending = false;
    ctx_.protocol.wait(g.collective);
  }
  // Before anything but gather(u) reads or writes the parameters.
  void complete_all() {
    for (std::size_t u = 0; u < units_.size(); ++u) complete(unit_id{u});
  }

 private:
  struct in_flight {
    request collective;
    bool pending = false;
  };
  Ctx& ctx_;
  parameter_placement<Ctx>& placement_;
  std::vector<in_flight> units_;
};

}  // namespace zero
