// tensorwise_sweep: a tensor-wise optimizer's step (optim::lamb): the slots, each tensor's norms in a fixed order, then the weights.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/tensor_sums.hpp"
#include "zero/error.hpp"
#include "zero/offload/state_store.hpp"

namespace zero {

template <class Ctx, class Opt>
class optimizer_sweep;

// The kind of a TensorwiseOptimizer (engine/sweep_kind.hpp).
template <class Ctx, class Opt>
class tensorwise_sweep {
 public:
  using P = typename Ctx::partitioner;
  using Prec = typename Ctx::precision;
  using system = typename Ctx::system;
  using param_type = typename Ctx::param_type;

  explicit tensorwise_sweep(Ctx& c) : ctx_(c) {}

  // Each tensor's norms are combined over the data-parallel ranks only.
  void plan(optimizer_sweep<Ctx, Opt>&, const param_group_map&) {
    ZERO_CHECK(ctx_.tp_size == 1, invalid_argument, "rank ", ctx_.rank, ": optim::", Opt::name,
               " needs each tensor's norms, which the engine does not combine over a tensor-parallel group yet: "
               "build the engine over comm::mesh with tp = 1, or over the data-parallel backend");
  }
  // Its sums' all-reduce rides on the control link beside the norm's; counted there (plan.hpp).
  std::uint64_t exchange_bytes(const optimizer_sweep<Ctx, Opt>&) const { return 0; }

  // Whether a tensor-wise step keeps its direction in the gradient store of element type T between its
  // passes (concepts/optimizer_state.hpp: TensorwiseDirection): fp32 elements the host's first pass
  // would only zero (optimizer_sweep::update_zeroes_gradients: where the host updates). The last
  // pass zeroes them.
  template <class T>
  static constexpr bool keeps_direction = [] {
    if constexpr (TensorwiseDirection<Opt>)
      return Ctx::host_memory && std::is_same_v<T, float>;
    else
      return false;
  }();


  // A tensor-wise optimizer's step (concepts/optimizer_state.hpp), in two passes over the held
  // elements, each tensor's piece at a time: the slots advance from the gradient, and the norm terms of
  // each block of elements (in a buffer the block's size, in cache) go into the tensor's sums
  // (engine/tensor_sums.hpp: in an order fixed by the tensor's own indices, completed over the ranks by
  // one all-reduce on the control link where a shard boundary cuts a tensor); then each tensor's
  // factor, and the weights. A tensor held whole in one piece and cut by no shard boundary (every one
  // at stage 0 or N = 1) takes its weights' pass right after its first, from cache. The sums depend on
  // the values only, so every stage, N and thread count gives the same bits. The host runs it (a device
  // system's passes are not built), in memory or from the offload tier (whose disk file the two passes
  // read twice and write twice). Where the optimizer allows it and the gradients are fp32
  // (keeps_direction), the first pass leaves the update's direction in each gradient element instead
  // of zero; the sums read it there, and the last pass reads it there (and zeroes it) instead of
  // recomputing it from the slots: the same value, so the same bits. A term that is the weight itself
  // (TensorwiseWeightTerm) is summed from the weights, not from a copy.
  template <class Gradients, class Done>
  void update(optimizer_sweep<Ctx, Opt>& sweep, parameter_placement<Ctx>& params, const param_group_map& groups,
              const std::vector<typename Opt::step_constants>& c, float divisor, float coef, const Gradients& gradients,
              Done done) {
    using sweep_type = optimizer_sweep<Ctx, Opt>;
    static_assert(Ctx::host_memory,
                  "a tensor-wise optimizer (optim::lamb) runs on a host system; its device passes are not built");
    constexpr std::size_t K = static_cast<std::size_t>(Opt::tensor_sums);
    // Elements per block of terms: K buffers of 4 KiB, which stay in L1 between the pass that writes
    // them and the sums that read them; a multiple of the sums' blocks, so that a thread's blocks after
    // its first begin where a block of the sums does.
    constexpr std::size_t term_block = 1024;
    static_assert(term_block % tensor_sums::block_size == 0);
    const std::size_t units = ctx_.layout.num_units();
    std::vector<std::size_t> first_tensor(units + 1, 0);  // the global index of each unit's first tensor
    for (std::size_t u = 0; u < units; ++u)
      first_tensor[u + 1] = first_tensor[u] + ctx_.layout.unit(unit_id{u}).tensors.size();
    // Made once: its buffers (a double per 64 held elements and sum) are reused by every step.
    if (!tensor_sums_)
      tensor_sums_ = std::make_unique<tensor_sums>(ctx_.layout, P::shards_optimizer_states, ctx_.rank,
                                                   static_cast<int>(K));
    tensor_sums& sums = *tensor_sums_;
    sums.begin_step();
    // Calls f(t, piece, group, w, p, slots) for every held piece of a tensor in the segment.
    const auto pieces = [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays, auto&& f) {
      const unit_layout& ul = ctx_.layout.unit(u);
      for (std::size_t t = 0; t < ul.tensors.size(); ++t) {
        const range piece = intersect(ul.tensors[t], range{i, i + n});
        if (piece.empty()) continue;
        std::size_t g = 0;
        for (const group_run& run : groups.runs(u))
          if (run.elements.begin <= piece.begin && piece.begin < run.elements.end) g = run.group;
        const std::size_t off = piece.begin - i;
        param_type* p = params.element(ul, piece.begin);
        float* w = Prec::separate_master ? arrays[0] + off : reinterpret_cast<float*>(p);
        float* st[Opt::slots > 0 ? Opt::slots : 1] = {};
        for (int k = 0; k < Opt::slots; ++k) st[k] = arrays[sweep_type::slot_array(k)] + off;
        f(first_tensor[u.index] + t, piece, g, w, Prec::separate_master ? p : nullptr, st);
      }
    };
    // The weights of a piece of tensor t from its factor (its sums complete).
    const auto weights = [&](unit_id u, std::size_t t, range piece, std::size_t g, float* w, param_type* p,
                             float* const* st) {
      double sq[K];
      for (std::size_t k = 0; k < K; ++k) sq[k] = sums.sum(t, k);
      const float f = Opt::tensor_factor(c[g], sq);
      const unit_layout& ul = ctx_.layout.unit(u);
      gradients([&]<class T>(T* store, bool sharded) {
        sweep.pool().run(piece.size(), [&](std::size_t b, std::size_t e) {
          if constexpr (keeps_direction<T>) {
            T* d = store + element_index(ul, piece.begin, sharded, ctx_.rank);
            elementwise::apply_direction<Opt>(ctx_.sys, c[g], f, d + b, w + b, p ? p + b : p, e - b);
          } else {
            const float* s[Opt::slots > 0 ? Opt::slots : 1] = {};
            for (int k = 0; k < Opt::slots; ++k) s[k] = st[k] + b;
            elementwise::apply_factor<Opt>(ctx_.sys, c[g], f, w + b, s, p ? p + b : p, e - b);
          }
        });
      });
    };
    // A tensor this rank holds whole, in one piece, and no shard boundary cuts has its sums when its
    // first pass ends: its weights follow at once, while its weights and directions are still in cache,
    // so that each crosses memory once, as in an element-wise step (the same bits: the same factor and
    // direction). The others wait for the exchange.
    applied_.assign(sums.tensors(), 0);
    sweep.store().begin_step();
    // 1. The slots, and the terms' sums; the weights of the local tensors.
    sweep.for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays,
                 [&](std::size_t t, range piece, std::size_t g, float* w, param_type* p, float* const* st) {
                   const unit_layout& ul = ctx_.layout.unit(u);
                   // The piece's first element's index in its tensor.
                   const std::size_t local = piece.begin - ul.tensors[t - first_tensor[u.index]].begin;
                   gradients([&]<class T>(T* store, bool sharded) {
                     T* gp = store + element_index(ul, piece.begin, sharded, ctx_.rank);
                     sweep.pool().run(piece.size(), [&](std::size_t b, std::size_t e) {
                       alignas(64) float buffers[K][term_block];
                       double block_sums[K][term_block / tensor_sums::block_size];
                       float* terms[K];
                       for (std::size_t k = 0; k < K; ++k) terms[k] = buffers[k];
                       tensor_sums::adder adder(sums, t);
                       for (std::size_t at = b, m = 0; at < e; at += m) {
                         // A block that the range goes on after ends where a block of the sums does.
                         m = std::min(term_block, e - at);
                         if (const std::size_t edge = (local + at + m) / tensor_sums::block_size * tensor_sums::block_size;
                             at + m < e && edge > local + at)
                           m = edge - (local + at);
                         float* s[Opt::slots > 0 ? Opt::slots : 1] = {};
                         for (int k = 0; k < Opt::slots; ++k) s[k] = st[k] + at;
                         const float* summed[K];  // where each term's values of the block are
                         for (std::size_t k = 0; k < K; ++k) summed[k] = terms[k];
                         bool fused = false;  // the block's sums taken in the pass itself
                         if constexpr (keeps_direction<T>) {
                           // The direction is left in the gradient elements and the weight term is the
                           // weights: only the other terms go into buffers.
                           float* buffered[K] = {};
                           for (std::size_t k = 0, b = 0; k < K; ++k) {
                             if (static_cast<int>(k) == Opt::direction_term)
                               summed[k] = gp + at;
                             else if (static_cast<int>(k) == elementwise::weight_term_of<Opt>)
                               summed[k] = w + at;
                             else
                               buffered[b++] = terms[k];
                           }
                           const std::size_t blocks = m / tensor_sums::block_size;
                           if ((local + at) % tensor_sums::block_size == 0 && m % tensor_sums::block_size == 0) {
                             double* out[K];
                             for (std::size_t k = 0; k < K; ++k) out[k] = block_sums[k];
                             fused = elementwise::advance_keeping_direction_summed<Opt>(
                                 ctx_.sys, c[g], gp + at, divisor, coef, w + at, s, buffered, blocks, out);
                             if (fused)
                               for (std::size_t k = 0; k < K; ++k) adder.add_block_sums(k, local + at, out[k], blocks);
                           }
                           if (!fused)
                             elementwise::advance_keeping_direction<Opt>(ctx_.sys, c[g], gp + at, divisor, coef,
                                                                         w + at, s, buffered, m);
                         } else if constexpr (sweep_type::update_zeroes_gradients) {
                           elementwise::advance_with_terms<Opt>(ctx_.sys, c[g], gp + at, divisor, coef, w + at, s,
                                                                terms, m);
                         } else {
                           elementwise::advance_with_terms<Opt>(ctx_.sys, c[g], static_cast<const T*>(gp + at),
                                                                divisor, coef, w + at, s, terms, m);
                         }
                         if (!fused)
                           for (std::size_t k = 0; k < K; ++k) adder.add(ctx_.sys, k, local + at, summed[k], m);
                       }
                       adder.finish();
                     });
                   });
                   if (piece.size() == ul.tensors[t - first_tensor[u.index]].size() && sums.local(t)) {
                     sums.complete_tensor(t);
                     weights(u, t, piece, g, w, p, st);
                     applied_[t] = 1;
                   }
                 });
        },
        true, [](unit_id) {});
    // 2. The leaves and blocks a shard boundary cuts, completed over the ranks; the sums.
    std::vector<double>& exchange = sums.exchange();
    exchange = reduce_over_ranks(std::move(exchange), reduce_op::sum, "tensor norms");
    sums.complete();
    // 3. The weights of the other tensors.
    sweep.for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays,
                 [&](std::size_t t, range piece, std::size_t g, float* w, param_type* p, float* const* st) {
                   if (!applied_[t]) weights(u, t, piece, g, w, p, st);
                 });
        },
        true, done);
    sweep.store().end_step();
  }
 private:
  // The element-wise sum or max of `mine` over the ranks that share the optimizer states (the control
  // link), through the system's memory; `mine` itself where the states are not sharded or N = 1.
  template <class T>
  std::vector<T> reduce_over_ranks(std::vector<T> mine, reduce_op op, const char* what) {
    if (!P::shards_optimizer_states || ctx_.ranks() == 1 || mine.empty()) return mine;
    ctx_.make_room(mine.size() * sizeof(T));
    buffer<T, system> wire(mine.size(), mem_category::transient, ctx_.acct);
    ctx_.sys.copy_from_host(wire.data(), mine.data(), mine.size() * sizeof(T));
    {
      const comm::scoped_label<typename Ctx::comm_backend> l(ctx_.protocol.inner(), what);
      ctx_.control.all_reduce(wire.data(), wire.data(), mine.size(), op);
    }
    ctx_.sys.copy_to_host(mine.data(), wire.data(), mine.size() * sizeof(T));
    return mine;
  }

  Ctx& ctx_;
  std::unique_ptr<tensor_sums> tensor_sums_;  // the sums, kept between steps
  std::vector<char> applied_;                 // in a step: the tensors whose weights are done
};

}  // namespace zero
