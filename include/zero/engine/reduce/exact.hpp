// The exact gradient reducer: each rank's slice summed over the ranks in rank order by a reduce-scatter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/concepts/gradient_reducer.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/engine/reduce/reducer.hpp"
#include "zero/engine/reduce/summing.hpp"

namespace zero::reduce {

// The backend's reduce-scatter (stage 0: its all-reduce), exact in the backend's summation order:
// rank order on every deterministic backend. Wire bytes: (N-1)/N of the slices' elements per rank.
template <class Ctx>
class exact_wire {
 public:
  static constexpr const char* name = "exact";
  static constexpr bool available = true;
  static bool chosen(const engine_options&) { return true; }  // the default: the catalog's last
  static void accept(const Ctx&) {}
  static std::uint64_t extra_state_bytes(const engine_options&, std::uint64_t) { return 0; }
  struct state {};

  explicit exact_wire(Ctx& c) : ctx_(c) {}
  typename Ctx::request start(state&, const std::vector<unit_id>&, typename Ctx::grad_type* g, std::size_t count) {
    return ctx_.protocol.start_reduce_scatter(g, g + static_cast<std::size_t>(ctx_.rank) * count, count,
                                              reduce_op::sum);
  }
  void wait(state&, typename Ctx::request& r) { ctx_.protocol.wait(r); }
  void finish(state&) {}
  std::size_t completion_bytes(const state&) const { return 0; }  // finish allocates nothing

 private:
  Ctx& ctx_;
};

template <class Ctx>
using exact_reducer = reducer<Ctx, summing<Ctx, exact_wire<Ctx>>>;

}  // namespace zero::reduce
