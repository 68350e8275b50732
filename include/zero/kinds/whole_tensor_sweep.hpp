// whole_tensor_sweep: the kind of an optimizer whose update needs each tensor whole and keeps per-tensor state (optim::adafactor), added through the engine's kind seam.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "zero/comm/counted.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/sweep.hpp"
#include "zero/engine/sweep_kind.hpp"
#include "zero/error.hpp"

namespace zero {

// An optimizer whose step updates each tensor whole from its gradient and a state of its own per
// tensor (not per element): the metadata of OptimizerState (with slots = 0, and an `update` that is
// never called) and
//   O::tensor_state_size(shape) -> std::size_t   the state's floats of a tensor of that shape
//   O::update_tensor(sys, c, shape, g, w, state) static, host: the tensor's weights w (fp32, updated in
//                                                place) from its averaged gradient g and its state
//                                                (zero before the first step); sys is the engine's host
//                                                system, whose for_each runs element-wise rules on packs
// update_tensor must be a fixed sequence of operations over the tensor's values: every rank that runs
// it on the same tensor gets the same bits.
template <class O>
concept WholeTensorOptimizer =
    OptimizerState<O> && (O::slots == 0) &&
    requires(std::span<const std::size_t> shape) {
      { O::tensor_state_size(shape) } -> std::same_as<std::size_t>;
    };  // (update_tensor is a template over the system: checked where the kind calls it)

// The kind (engine/sweep_kind.hpp) of a WholeTensorOptimizer. Every rank of the shard group holds
// every tensor's state (rows + cols floats per matrix for Adafactor: O(sqrt) of the parameters it
// describes) and updates every tensor: where the states are sharded over N > 1 ranks (stages 1-3),
// one all-gather per unit on the control link brings the unit's averaged gradients and master weights
// whole (8 bytes an element); where a rank holds the whole model (stage 0, N = 1) nothing moves.
// Each rank then keeps the new weights of the elements it holds. The state is the same on every rank
// (the same operations on the same values), so each rank's copy is the whole of it, whatever N.
// The host runs it, on the calling thread, with the states in the system's memory (no offload tier),
// outside a tensor-parallel mesh; the state is released with the model states (release_memory), and
// checkpoint::save writes it once (every rank holds all of it), which checkpoint::load reads into
// every rank at any world size and stage; the asynchronous saver and peer snapshots refuse it.
template <class Ctx, class Opt>
class whole_tensor_sweep {
 public:
  using P = typename Ctx::partitioner;
  using Prec = typename Ctx::precision;
  using system = typename Ctx::system;
  using param_type = typename Ctx::param_type;

  explicit whole_tensor_sweep(Ctx& c) : ctx_(c) {
    for (const unit_spec& us : ctx_.spec.units()) {
      std::vector<std::size_t> at;
      for (const tensor_spec& ts : us.tensors) {
        at.push_back(state_size_);
        state_size_ += Opt::tensor_state_size(ts.shape);
      }
      state_at_.push_back(std::move(at));
    }
  }

  // The refusals, alike on every rank; then the state, zero.
  void plan(optimizer_sweep<Ctx, Opt>&, const param_group_map&) {
    ZERO_CHECK(ctx_.tp_size == 1, invalid_argument, "rank ", ctx_.rank, ": optim::", Opt::name,
               " updates each tensor whole, which the engine does not put together over a tensor-parallel group: "
               "build the engine over comm::mesh with tp = 1, or over the data-parallel backend");
    ZERO_CHECK(ctx_.options.offload.tier == offload_tier::none, invalid_argument, "rank ", ctx_.rank, ": optim::",
               Opt::name, " updates each tensor whole from the system's memory; the offload tier streams slices: "
               "build the engine without engine_options::offload");
    state_ = buffer<float, system>(state_size_, mem_category::optimizer_states, ctx_.acct);
  }
  std::uint64_t state_bytes() const { return static_cast<std::uint64_t>(state_size_) * sizeof(float); }
  template <class F>
  void for_each_state_buffer(F&& f) {
    f(state_);
  }
  // The same on every rank, its size the model's: what a checkpoint saves once and loads into any N.
  std::span<float> checkpointed_state() { return {state_.data(), state_size_}; }
  // One all-gather per unit of 2 x its padded extent in fp32, where the states are sharded over N > 1.
  std::uint64_t exchange_bytes(const optimizer_sweep<Ctx, Opt>&) const {
    if (!gathers()) return 0;
    std::uint64_t bytes = 0;
    for (std::size_t u = 0; u < ctx_.layout.num_units(); ++u)
      bytes += comm::bus_bytes(comm::collective::all_gather, 2 * ctx_.layout.unit(unit_id{u}).padded * sizeof(float),
                               ctx_.ranks());
    return bytes;
  }

  template <class Gradients, class Done>
  void update(optimizer_sweep<Ctx, Opt>& sweep, parameter_placement<Ctx>& params, const param_group_map& groups,
              const std::vector<typename Opt::step_constants>& c, float divisor, float coef, const Gradients& gradients,
              Done done) {
    static_assert(Ctx::host_memory, "a whole-tensor optimizer (optim::adafactor) runs on a host system");
    const elementwise::gradient_divisor by(divisor);
    for (std::size_t u = 0; u < ctx_.layout.num_units(); ++u) {
      const unit_id id{u};
      const unit_layout& ul = ctx_.layout.unit(id);
      const range held = sweep.update_range(id);
      // The unit's averaged gradients and master weights, whole (unpadded), in host memory.
      g_.assign(ul.padded, 0.0f);
      w_.assign(ul.padded, 0.0f);
      // This rank's held elements: the averaged (divided, clipped) gradient, zeroed where it is read
      // (optimizer_sweep::update_zeroes_gradients), and the master weights.
      gradients([&]<class T>(T* store, bool sharded) {
        T* from = store + element_index(ul, held.begin, sharded, ctx_.rank);
        for (std::size_t i = 0; i < held.size(); ++i) {
          float x = by.divide(static_cast<float>(from[i]));
          if (coef != 1.0f) x = fp::mul(x, coef);
          g_[held.begin + i] = x;
          from[i] = T{};
        }
      });
      if (!held.empty()) sweep.read(params, id, held, w_.data() + held.begin, nullptr);
      if (gathers()) gather_unit(ul);
      // Every tensor, whole.
      for (std::size_t t = 0; t < ul.tensors.size(); ++t) {
        const range tr = ul.tensors[t];
        if (tr.empty()) continue;
        const auto& shape = ctx_.spec.units()[u].tensors[t].shape;
        Opt::update_tensor(ctx_.sys, c[groups.group_of(ctx_.layout, id, t)], shape, g_.data() + tr.begin,
                           w_.data() + tr.begin, state_.data() + state_at_[u][t]);
      }
      // The held elements' new weights: the master weights, and the parameters cast from them.
      if (!held.empty()) {
        sweep.write(params, id, held, w_.data() + held.begin, nullptr);
        if constexpr (Prec::separate_master)
          ctx_.sys.for_each(held.size(), elementwise::cast_rule{}, elementwise::out(params.element(ul, held.begin)),
                            elementwise::in(static_cast<const float*>(w_.data() + held.begin)));
      }
      done(id);
    }
  }

 private:
  // Whether the ranks hold parts of the units (sharded states over N > 1), so that a step gathers them.
  bool gathers() const { return P::shards_optimizer_states && ctx_.ranks() > 1; }

  // The unit's gradients and weights whole on every rank: each rank's slice of both (its owned,
  // padded extent: zeros past the unit's elements) in one block, all-gathered, then put in place.
  void gather_unit(const unit_layout& ul) {
    const std::size_t shard = ul.shard, n = static_cast<std::size_t>(ctx_.ranks());
    ctx_.make_room(2 * n * shard * sizeof(float));
    buffer<float, system> wire(2 * n * shard, mem_category::transient, ctx_.acct, uninitialized);
    float* mine = wire.data() + static_cast<std::size_t>(ctx_.rank) * 2 * shard;
    const std::size_t own = static_cast<std::size_t>(ctx_.rank) * shard;
    std::copy(g_.begin() + static_cast<std::ptrdiff_t>(own), g_.begin() + static_cast<std::ptrdiff_t>(own + shard),
              mine);
    std::copy(w_.begin() + static_cast<std::ptrdiff_t>(own), w_.begin() + static_cast<std::ptrdiff_t>(own + shard),
              mine + shard);
    {
      const comm::scoped_label<typename Ctx::comm_backend> l(ctx_.protocol.inner(), "whole tensors");
      ctx_.control.all_gather(mine, wire.data(), 2 * shard);
    }
    for (std::size_t r = 0; r < n; ++r) {
      const float* block = wire.data() + r * 2 * shard;
      std::copy(block, block + shard, g_.begin() + static_cast<std::ptrdiff_t>(r * shard));
      std::copy(block + shard, block + 2 * shard, w_.begin() + static_cast<std::ptrdiff_t>(r * shard));
    }
  }

  Ctx& ctx_;
  std::vector<std::vector<std::size_t>> state_at_;  // each unit's tensors' offsets in the state
  std::size_t state_size_ = 0;
  buffer<float, system> state_;  // every tensor's state, in model order
  std::vector<float> g_, w_;     // in a step: one unit's gradients and weights, whole
};

template <WholeTensorOptimizer Opt>
  requires(!TensorwiseOptimizer<Opt> && !MatrixOptimizer<Opt>)
struct sweep_kind_of<Opt> {
  template <class Ctx>
  using kind = whole_tensor_sweep<Ctx, Opt>;
};

}  // namespace zero
