// The optimizer sweep: the update over the rank's master weights and optimizer slots, in memory or offloaded.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/thread_pool.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/matrix_owners.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/tensor_sums.hpp"
#include "zero/offload/state_store.hpp"

namespace zero {

// The fp32 state arrays (the master weights where the precision keeps them apart from the parameters,
// then one per optimizer slot) over what the rank updates (its owned slices where the states are
// sharded, the whole model otherwise), in the offload tier's memory or the system's own, and the pass
// that updates them: the offload store streams them slice by slice (offload::state_store), and each
// unit's segments run the optimizer's element-wise rule on the system (no offload) or the host loop.
// The same rule whichever memory runs it, so offloading changes no bit. Where the host runs it, the
// rank's pool (engine_options::host_threads) updates contiguous ranges of each segment at once: each
// element's operations are the same, so the thread count changes no bit either.
// What a matrix optimizer reuses across orthogonalizations (nothing for the other kinds).
template <class Opt>
struct matrix_workspace {
  struct type {};
};
template <MatrixOptimizer Opt>
struct matrix_workspace<Opt> {
  using type = typename Opt::workspace;
};

template <class Ctx, class Opt>
class optimizer_sweep {
 public:
  using P = typename Ctx::partitioner;
  using Prec = typename Ctx::precision;
  using system = typename Ctx::system;
  using param_type = typename Ctx::param_type;
  static constexpr int master_arrays = Prec::separate_master ? 1 : 0;
  static constexpr int state_arrays = master_arrays + Opt::slots;
  static constexpr int slot_array(int k) { return master_arrays + k; }

  explicit optimizer_sweep(Ctx& c) : ctx_(c), pool_(c.options.host_threads) {}
  optimizer_sweep(const optimizer_sweep&) = delete;
  optimizer_sweep& operator=(const optimizer_sweep&) = delete;

  // The state elements the rank holds (padded): Psi / N where the states are sharded, Psi otherwise.
  std::size_t elements() const { return P::shards_optimizer_states ? ctx_.layout.shard_total() : ctx_.layout.padded(); }
  void allocate() {
    std::array<mem_category, state_arrays> categories{};
    for (int a = 0; a < state_arrays; ++a)
      categories[static_cast<std::size_t>(a)] =
          a < master_arrays ? mem_category::master : mem_category::optimizer_states;
    store_ = offload::state_store<system>(ctx_.options.offload, ctx_.rank, state_arrays, elements(), categories.data(),
                                          ctx_.acct);
  }
  const offload::state_store<system>& store() const { return store_; }
  offload::state_store<system>& store() { return store_; }
  // n values of state array `array` from element `at` of its index space into host memory.
  void read_array(int array, std::size_t at, std::size_t n, float* out) const {
    store_.read(ctx_.sys, array, at, n, out);
  }
  bool offloaded() const { return store_.offloaded(); }

  // Where the state arrays keep unit-local element i, which this rank must hold.
  std::size_t state_index(const unit_layout& ul, std::size_t i) const {
    return element_index(ul, i, P::shards_optimizer_states, ctx_.rank);
  }
  // The unit-local, unpadded elements the rank holds and updates: its owned slice, or the whole unit.
  range update_range(unit_id u) const { return ctx_.layout.updated_real(u, ctx_.rank, P::shards_optimizer_states); }
  std::size_t held_real_elements() const {
    std::size_t n = 0;
    for (std::size_t u = 0; u < ctx_.layout.num_units(); ++u) n += update_range(unit_id{u}).size();
    return n;
  }

  // Master weights and slots of unit-local range r (held) to host memory; a null pointer skips its
  // array. Without a separate master the weights are the parameters.
  void read(const parameter_placement<Ctx>& params, unit_id u, range r, float* master, float* const* slots) const {
    const unit_layout& ul = ctx_.layout.unit(u);
    const std::size_t at = state_index(ul, r.begin);
    if (master) {
      if constexpr (Prec::separate_master)
        store_.read(ctx_.sys, 0, at, r.size(), master);
      else
        ctx_.sys.copy_to_host(master, params.element(ul, r.begin), r.size() * sizeof(float));
    }
    for (int k = 0; k < Opt::slots; ++k)
      if (slots[k]) store_.read(ctx_.sys, slot_array(k), at, r.size(), slots[k]);
  }
  void write(parameter_placement<Ctx>& params, unit_id u, range r, const float* master, const float* const* slots) {
    const unit_layout& ul = ctx_.layout.unit(u);
    const std::size_t at = state_index(ul, r.begin);
    if constexpr (Prec::separate_master)
      store_.write(ctx_.sys, 0, at, r.size(), master);
    else
      ctx_.sys.copy_from_host(params.element(ul, r.begin), master, r.size() * sizeof(float));
    for (int k = 0; k < Opt::slots; ++k) store_.write(ctx_.sys, slot_array(k), at, r.size(), slots[k]);
  }
  // Initial values of unit-local elements r into the master weights the rank holds (a separate master).
  void store_initial(unit_id u, range r, const float* values) {
    if constexpr (Prec::separate_master) {
      const unit_layout& ul = ctx_.layout.unit(u);
      const range seg = P::shards_optimizer_states ? intersect(r, ctx_.layout.owned(u, ctx_.rank)) : r;
      if (!seg.empty())
        store_.write(ctx_.sys, 0, state_index(ul, seg.begin), seg.size(), values + (seg.begin - r.begin));
    }
  }

  // Where the host runs the update, it zeroes each gradient element it reads (the store is then ready
  // for the next step without a second pass over it: the reducer's clear(true)); a device system's
  // update leaves the gradients as they are.
  static constexpr bool update_zeroes_gradients = Ctx::host_memory;

  // The update of every held element: for each segment, the gradient the reducer stores (`gradients`:
  // calls f(T* base, bool sharded)) divided by N x loss scale (`divisor`) and multiplied by the
  // clipping coefficient, then the optimizer's rule with the constants of the element's parameter
  // group (`c[g]` for the runs `groups` gives group g). `done(u)` is called once per unit in unit
  // order, as soon as its last segment is through (the engine starts the unit's parameter all-gather
  // there).
  template <class Gradients, class Done>
  void update(parameter_placement<Ctx>& params, const param_group_map& groups,
              const std::vector<typename Opt::step_constants>& c, float divisor, float coef, const Gradients& gradients,
              Done done) {
    if constexpr (MatrixOptimizer<Opt>) {
      update_matrixwise(params, groups, c, divisor, coef, gradients, done);
    } else if constexpr (TensorwiseOptimizer<Opt>) {
      update_tensorwise(params, groups, c, divisor, coef, gradients, done);
    } else {
      store_.begin_step();
      for_each_held_segment(
          [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
            // The segment cut where its elements' group changes (one piece where the unit has one group).
            for (const group_run& run : groups.runs(u)) {
              const range piece = intersect(run.elements, range{i, i + n});
              if (piece.empty()) continue;
              float* at[offload::state_store<system>::max_arrays] = {};
              for (int a = 0; a < state_arrays; ++a) at[a] = arrays[a] + (piece.begin - i);
              update_segment(params, u, piece.begin, piece.size(), at, c[run.group], divisor, coef, gradients);
            }
          },
          true, done);
      store_.end_step();
    }
  }

  // Whether a tensor-wise step keeps its direction in the gradient store of element type T between its
  // passes (concepts/optimizer_state.hpp: TensorwiseDirection): fp32 elements the host's first pass
  // would only zero. The last pass zeroes them.
  template <class T>
  static constexpr bool keeps_direction = [] {
    if constexpr (TensorwiseDirection<Opt>)
      return update_zeroes_gradients && std::is_same_v<T, float>;
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
  void update_tensorwise(parameter_placement<Ctx>& params, const param_group_map& groups,
                         const std::vector<typename Opt::step_constants>& c, float divisor, float coef,
                         const Gradients& gradients, Done done) {
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
        for (int k = 0; k < Opt::slots; ++k) st[k] = arrays[slot_array(k)] + off;
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
        pool_.run(piece.size(), [&](std::size_t b, std::size_t e) {
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
    store_.begin_step();
    // 1. The slots, and the terms' sums; the weights of the local tensors.
    for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays,
                 [&](std::size_t t, range piece, std::size_t g, float* w, param_type* p, float* const* st) {
                   const unit_layout& ul = ctx_.layout.unit(u);
                   // The piece's first element's index in its tensor.
                   const std::size_t local = piece.begin - ul.tensors[t - first_tensor[u.index]].begin;
                   gradients([&]<class T>(T* store, bool sharded) {
                     T* gp = store + element_index(ul, piece.begin, sharded, ctx_.rank);
                     pool_.run(piece.size(), [&](std::size_t b, std::size_t e) {
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
                         } else if constexpr (update_zeroes_gradients) {
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
    for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays,
                 [&](std::size_t t, range piece, std::size_t g, float* w, param_type* p, float* const* st) {
                   if (!applied_[t]) weights(u, t, piece, g, w, p, st);
                 });
        },
        true, done);
    store_.end_step();
  }
  // A matrix optimizer's matrices and their owners (engine/matrix_owners.hpp), from the spec's shapes and
  // the parameter groups; set once at construction.
  void plan_matrices(const param_group_map& groups) {
    owners_ = matrix_owners(ctx_.spec, ctx_.layout, [&](std::size_t u, std::size_t t) {
      return !groups.element_wise(groups.group_of(ctx_.layout, unit_id{u}, t));
    });
  }
  const matrix_owners& matrices() const { return owners_; }
  // Whether the control link can send each matrix to its owner and back (matrix_owners::to_owners).
  static constexpr bool link_has_all_to_all = comm::has_all_to_all<typename Ctx::link>;
  // A matrix optimizer's exchange of one step on the control link, in bus bytes (matrix_owners).
  std::uint64_t matrix_exchange_bytes() const {
    return owners_.exchange_bytes(ctx_.layout, P::shards_optimizer_states, link_has_all_to_all);
  }

  // A matrix optimizer's step (concepts/optimizer_state.hpp, optim::muon), over the held elements:
  //   1. the element-wise tensors take the optimizer's element-wise rule whole; each matrix's held
  //      elements advance their slots, and their u (the matrix slot) is staged in host memory;
  //   2. each matrix's u is brought whole to its owner, which orthogonalizes it, and its result goes
  //      back to the ranks that hold its elements (engine/matrix_owners.hpp: two all_to_alls per unit
  //      on the control link where the states are sharded; stage 0, whose ranks hold every matrix,
  //      all-gathers the owners' results). At N = 1 the rank orthogonalizes every matrix itself, with
  //      no traffic;
  //   3. the matrices' weights from the result and each matrix's factor.
  // The orthogonalization is a fixed sequence of fp32 operations wherever it runs, so every stage and
  // N gives the same bits. The host runs it, in memory or from the offload tier (whose disk file the
  // first and last passes read and write).
  template <class Gradients, class Done>
  void update_matrixwise(parameter_placement<Ctx>& params, const param_group_map& groups,
                         const std::vector<typename Opt::step_constants>& c, float divisor, float coef,
                         const Gradients& gradients, Done done) {
    static_assert(Ctx::host_memory,
                  "a matrix optimizer (optim::muon) runs on a host system; its device passes are not built");
    constexpr std::size_t ms = static_cast<std::size_t>(Opt::matrix_slot);
    const std::size_t units = ctx_.layout.num_units();
    // Where each matrix's held elements are staged: after those of the matrices before it, in a buffer
    // of the largest rank's size (the same memory on every rank).
    std::vector<std::vector<std::size_t>> staged_at(units);
    std::size_t staged_size = 0;
    for (std::size_t u = 0; u < units; ++u)
      for (const matrix_entry& m : owners_.matrices(unit_id{u})) {
        staged_at[u].push_back(staged_size);
        staged_size += held_part(unit_id{u}, m).size();
      }
    const std::size_t staged_elements = owners_.staged_elements(ctx_.layout, P::shards_optimizer_states);
    ctx_.make_room(staged_elements * sizeof(float));
    staged_ = buffer<float, system>(staged_elements, mem_category::transient, ctx_.acct, uninitialized);
    // Calls f(piece, group, matrix or null, arrays at the piece) for the segment cut where a group or a
    // matrix begins or ends.
    const auto pieces = [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays, auto&& f) {
      const auto& mats = owners_.matrices(u);
      std::vector<std::size_t> cuts{i, i + n};
      for (const group_run& run : groups.runs(u))
        for (std::size_t x : {run.elements.begin, run.elements.end})
          if (x > i && x < i + n) cuts.push_back(x);
      for (const matrix_entry& m : mats)
        for (std::size_t x : {m.elements.begin, m.elements.end})
          if (x > i && x < i + n) cuts.push_back(x);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
        const range piece{cuts[k], cuts[k + 1]};
        std::size_t g = 0;
        for (const group_run& run : groups.runs(u))
          if (run.elements.begin <= piece.begin && piece.begin < run.elements.end) g = run.group;
        std::size_t mi = mats.size();
        for (std::size_t q = 0; q < mats.size(); ++q)
          if (mats[q].elements.begin <= piece.begin && piece.begin < mats[q].elements.end) mi = q;
        float* at[offload::state_store<system>::max_arrays] = {};
        for (int a = 0; a < state_arrays; ++a) at[a] = arrays[a] + (piece.begin - i);
        f(piece, g, mi, static_cast<float* const*>(at));
      }
    };
    // The staged values of matrix q's held elements from unit-local element `from`.
    const auto staged = [&](unit_id u, std::size_t q, std::size_t from) {
      const matrix_entry& m = owners_.matrices(u)[q];
      return staged_.data() + staged_at[u.index][q] + (from - held_part(u, m).begin);
    };
    store_.begin_step();
    // 1. Element-wise tensors updated; matrices advanced, their u staged.
    for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays, [&](range piece, std::size_t g, std::size_t q, float* const* at) {
            if (q == owners_.matrices(u).size()) {
              update_segment(params, u, piece.begin, piece.size(), at, c[g], divisor, coef, gradients);
              return;
            }
            const unit_layout& ul = ctx_.layout.unit(u);
            float* w = Prec::separate_master ? at[0] : reinterpret_cast<float*>(params.element(ul, piece.begin));
            float* st[Opt::slots] = {};
            for (int k = 0; k < Opt::slots; ++k) st[k] = at[slot_array(k)];
            gradients([&]<class T>(T* store, bool sharded) {
              T* gp = store + element_index(ul, piece.begin, sharded, ctx_.rank);
              pool_.run(piece.size(), [&](std::size_t b, std::size_t e) {
                float* s[Opt::slots] = {};
                for (int k = 0; k < Opt::slots; ++k) s[k] = st[k] + b;
                if constexpr (update_zeroes_gradients)
                  elementwise::advance<Opt>(ctx_.sys, c[g], gp + b, divisor, coef, w + b, s, e - b);
                else
                  elementwise::advance<Opt>(ctx_.sys, c[g], static_cast<const T*>(gp + b), divisor, coef, w + b, s,
                                            e - b);
              });
            });
            std::copy(st[ms], st[ms] + piece.size(), staged(u, q, piece.begin));
          });
        },
        true, [](unit_id) {});
    // 2. Each matrix whole on its owner, orthogonalized, its result staged where it is held.
    for (std::size_t u = 0; u < units; ++u)
      if (!owners_.matrices(unit_id{u}).empty()) orthogonalize_unit(unit_id{u}, staged_at[u]);
    // 3. The matrices' weights.
    for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays, [&](range piece, std::size_t g, std::size_t q, float* const* at) {
            if (q == owners_.matrices(u).size()) return;
            const matrix_entry& m = owners_.matrices(u)[q];
            const unit_layout& ul = ctx_.layout.unit(u);
            param_type* p = params.element(ul, piece.begin);
            float* w = Prec::separate_master ? at[0] : reinterpret_cast<float*>(p);
            const float f = Opt::matrix_factor(c[g], m.rows, m.cols);
            const float* o = staged(u, q, piece.begin);
            pool_.run(piece.size(), [&](std::size_t b, std::size_t e) {
              const float* s[Opt::slots] = {};
              for (int k = 0; k < Opt::slots; ++k) s[k] = at[slot_array(k)] + b;
              s[ms] = o + b;  // the result in place of u
              elementwise::apply_factor<Opt>(ctx_.sys, c[g], f, w + b, s,
                                             Prec::separate_master ? p + b : static_cast<param_type*>(nullptr), e - b);
            });
          });
        },
        true, done);
    store_.end_step();
    staged_ = buffer<float, system>();
  }
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

  // The master weights into the parameters after a load: in the system's memory, or slice by slice
  // from the tier, cast on the host, copied into the system's memory (the host loop's cast rule, the
  // device's bits).
  // Where the host casts, the rank's pool does (engine_options::host_threads).
  void cast_master_into(parameter_placement<Ctx>& params) {
    if (!store_.offloaded()) {
      for (std::size_t u = 0; u < ctx_.layout.num_units(); ++u) {
        const unit_layout& ul = ctx_.layout.unit(unit_id{u});
        const range r = update_range(unit_id{u});
        param_type* to = params.element(ul, r.begin);
        const float* from = store_.data(0) + state_index(ul, r.begin);
        if constexpr (Ctx::host_memory)
          cast_on_pool(ctx_.sys, to, from, r.size());
        else
          ctx_.sys.for_each(r.size(), elementwise::cast_rule{}, elementwise::out(to), elementwise::in(from));
      }
      return;
    }
    std::vector<param_type> cast;
    for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          cast.resize(n);
          cast_on_pool(offload::host_system{}, cast.data(), arrays[0], n);
          ctx_.sys.copy_from_host(params.element(ctx_.layout.unit(u), i), cast.data(), n * sizeof(param_type));
        },
        false, [](unit_id) {});
  }

  // Unit u's master weights, unpadded, into host memory at out: all-gathered (on the set-up link,
  // comm().other) where they are sharded; the parameters themselves where the precision keeps no
  // separate master (fp32).
  void consolidate(const parameter_placement<Ctx>& params, unit_id u, float* out) {
    const unit_layout& ul = ctx_.layout.unit(u);
    const std::size_t own = static_cast<std::size_t>(ctx_.rank) * ul.shard;
    if constexpr (P::shards_optimizer_states) {
      buffer<float, system> full(ul.padded, mem_category::transient, ctx_.acct);
      if constexpr (Prec::separate_master) {
        // This rank's master slice into its place in the buffer (from any tier), then in place.
        std::vector<float> mine(ul.shard);
        read_array(0, state_index(ul, own), ul.shard, mine.data());
        ctx_.sys.copy_from_host(full.data() + own, mine.data(), ul.shard * sizeof(float));
        const auto l = ctx_.label("full_params", u);
        ctx_.other.all_gather(full.data() + own, full.data(), ul.shard);
      } else {
        const auto l = ctx_.label("full_params", u);
        ctx_.other.all_gather(params.element(ul, own), full.data(), ul.shard);
      }
      ctx_.sys.copy_to_host(out, full.data(), ul.numel * sizeof(float));
    } else if constexpr (Prec::separate_master) {
      read_array(0, ul.offset, ul.numel, out);
    } else {
      ctx_.sys.copy_to_host(out, params.whole(u), ul.numel * sizeof(float));
    }
  }

 private:
  // The rank's held state per unit in the state arrays' index space: [begin, end) of its owned
  // (padded) slice, or of the whole unit where states are replicated. Units follow each other.
  range state_span(unit_id u) const {
    const unit_layout& ul = ctx_.layout.unit(u);
    const range held = P::shards_optimizer_states ? ctx_.layout.owned(u, ctx_.rank) : range{0, ul.padded};
    const std::size_t b = state_index(ul, held.begin);
    return {b, b + held.size()};
  }

  // Matrix m's elements this rank holds (unit-local): the whole matrix where the states are replicated.
  range held_part(unit_id u, const matrix_entry& m) const { return intersect(m.elements, update_range(u)); }

  // Step 2 of update_matrixwise for unit u: every matrix's staged u replaced by its orthogonalization
  // (only the elements this rank holds). `at`: each matrix's offset in staged_.
  void orthogonalize_unit(unit_id u, const std::vector<std::size_t>& at) {
    const auto& mats = owners_.matrices(u);
    // The system's products, their rows over the rank's pool (which does not change a bit).
    const auto products = ctx_.sys.products([&](std::size_t n, auto&& f) { pool_.run(n, f); });
    if (ctx_.ranks() == 1) {
      for (std::size_t q = 0; q < mats.size(); ++q)
        Opt::orthogonalize(staged_.data() + at[q], mats[q].rows, mats[q].cols, workspace_, products);
      return;
    }
    if constexpr (matrix_owners::to_owners(P::shards_optimizer_states, link_has_all_to_all)) {
      exchange_with_owners(u, at, products);
      return;
    }
    const unit_layout& ul = ctx_.layout.unit(u);
    const std::size_t block = owners_.block(u), n = static_cast<std::size_t>(ctx_.ranks());
    constexpr bool sharded = P::shards_optimizer_states;
    ctx_.make_room(((sharded ? ul.padded : 0) + n * block) * sizeof(float));
    buffer<float, system> whole(sharded ? ul.padded : 0, mem_category::transient, ctx_.acct, uninitialized);
    buffer<float, system> results(n * block, mem_category::transient, ctx_.acct, uninitialized);
    const comm::scoped_label<typename Ctx::comm_backend> l(ctx_.protocol.inner(), "matrix exchange");
    // Matrix m's u, whole: staged where every rank holds whole matrices (stage 0); else gathered first.
    const auto matrix_u = [&](std::size_t q) -> const float* {
      return sharded ? whole.data() + mats[q].elements.begin : staged_.data() + at[q];
    };
    if constexpr (sharded) {
      // This rank's slice: u where it holds a matrix's elements, 0 elsewhere (no one reads those).
      const range own = ctx_.layout.owned(u, ctx_.rank);
      std::fill(whole.data() + own.begin, whole.data() + own.end, 0.0f);
      for (std::size_t q = 0; q < mats.size(); ++q) {
        const range held = held_part(u, mats[q]);
        std::copy(staged_.data() + at[q], staged_.data() + at[q] + held.size(), whole.data() + held.begin);
      }
      ctx_.control.all_gather(whole.data() + own.begin, whole.data(), ul.shard);
    }
    float* mine = results.data() + static_cast<std::size_t>(ctx_.rank) * block;
    std::fill(mine, mine + block, 0.0f);
    for (std::size_t q = 0; q < mats.size(); ++q) {
      const matrix_entry& m = mats[q];
      if (m.owner != ctx_.rank) continue;
      std::copy(matrix_u(q), matrix_u(q) + m.elements.size(), mine + m.at);
      Opt::orthogonalize(mine + m.at, m.rows, m.cols, workspace_, products);
    }
    ctx_.control.all_gather(mine, results.data(), block);
    for (std::size_t q = 0; q < mats.size(); ++q) {
      const matrix_entry& m = mats[q];
      const range held = held_part(u, m);
      const float* from =
          results.data() + static_cast<std::size_t>(m.owner) * block + m.at + (held.begin - m.elements.begin);
      std::copy(from, from + held.size(), staged_.data() + at[q]);
    }
  }

  // Step 2 where the states are sharded, over a link with all_to_all: each rank sends every owner the
  // elements it holds of the owner's matrices (block o of `send`: its pieces of o's matrices in model
  // order), each owner puts its matrices together whole from the N blocks it receives (rank r's piece of
  // a matrix is the part in r's slice; the slices tile the unit in rank order), orthogonalizes them, and
  // sends each rank the results for the same elements in the same order.
  template <class Products>
  void exchange_with_owners(unit_id u, const std::vector<std::size_t>& at, const Products& products) {
    const auto& mats = owners_.matrices(u);
    const std::size_t pair = owners_.pair_block(u), n = static_cast<std::size_t>(ctx_.ranks());
    ctx_.make_room((2 * n * pair + owners_.block(u)) * sizeof(float));
    buffer<float, system> send(n * pair, mem_category::transient, ctx_.acct, uninitialized);
    buffer<float, system> recv(n * pair, mem_category::transient, ctx_.acct, uninitialized);
    buffer<float, system> mine(owners_.block(u), mem_category::transient, ctx_.acct, uninitialized);
    const auto exchange = [&] {
      const comm::scoped_label<typename Ctx::comm_backend> l(ctx_.protocol.inner(), "matrix exchange");
      ctx_.control.all_to_all(reinterpret_cast<const std::uint8_t*>(send.data()),
                              reinterpret_cast<std::uint8_t*>(recv.data()), pair * sizeof(float));
    };
    // Rank r's piece of matrix m (unit-local elements).
    const auto piece = [&](const matrix_entry& m, std::size_t r) {
      return intersect(m.elements, ctx_.layout.owned(u, static_cast<int>(r)));
    };
    std::vector<std::size_t> used(n, 0);  // elements written to (or read from) each rank's block so far
    // 1. This rank's pieces to their owners.
    std::fill(send.data(), send.data() + n * pair, 0.0f);  // the blocks' unused tails: nobody reads them
    for (std::size_t q = 0; q < mats.size(); ++q) {
      const auto o = static_cast<std::size_t>(mats[q].owner);
      const std::size_t size = held_part(u, mats[q]).size();
      std::copy(staged_.data() + at[q], staged_.data() + at[q] + size, send.data() + o * pair + used[o]);
      used[o] += size;
    }
    std::fill(used.begin(), used.end(), 0);
    exchange();
    // 2. This rank's matrices whole, orthogonalized, and their pieces' results into the blocks back.
    for (const matrix_entry& m : mats) {
      if (m.owner != ctx_.rank) continue;
      for (std::size_t r = 0; r < n; ++r) {
        const range p = piece(m, r);
        const float* from = recv.data() + r * pair + used[r];
        std::copy(from, from + p.size(), mine.data() + m.at + (p.begin - m.elements.begin));
        used[r] += p.size();
      }
      Opt::orthogonalize(mine.data() + m.at, m.rows, m.cols, workspace_, products);
    }
    std::fill(used.begin(), used.end(), 0);
    for (const matrix_entry& m : mats) {
      if (m.owner != ctx_.rank) continue;
      for (std::size_t r = 0; r < n; ++r) {
        const range p = piece(m, r);
        const float* from = mine.data() + m.at + (p.begin - m.elements.begin);
        std::copy(from, from + p.size(), send.data() + r * pair + used[r]);
        used[r] += p.size();
      }
    }
    std::fill(used.begin(), used.end(), 0);
    exchange();
    // 3. The results for this rank's pieces, staged.
    for (std::size_t q = 0; q < mats.size(); ++q) {
      const auto o = static_cast<std::size_t>(mats[q].owner);
      const std::size_t size = held_part(u, mats[q]).size();
      std::copy(recv.data() + o * pair + used[o], recv.data() + o * pair + used[o] + size, staged_.data() + at[q]);
      used[o] += size;
    }
  }

  // The optimizer over elements [i, i + n) of unit u (within update_range(u)), whose master weights
  // and slots are at `arrays` (the state arrays' slice that holds them, element i first): in the
  // system's memory (no offload), or in host memory.
  template <class Gradients>
  void update_segment(parameter_placement<Ctx>& params, unit_id u, std::size_t i, std::size_t n, float* const* arrays,
                      const typename Opt::step_constants& c, float divisor, float coef, const Gradients& gradients) {
    const unit_layout& ul = ctx_.layout.unit(u);
    param_type* p = params.element(ul, i);
    float* st[Opt::slots > 0 ? Opt::slots : 1] = {};
    for (int k = 0; k < Opt::slots; ++k) st[k] = arrays[slot_array(k)];
    gradients([&]<class T>(T* store, bool sharded) {
      T* g = store + element_index(ul, i, sharded, ctx_.rank);
      if (!store_.offloaded()) {
        float* w = Prec::separate_master ? arrays[0] : reinterpret_cast<float*>(p);
        in_ranges(ctx_.sys, Ctx::host_memory, c, g, divisor, coef, w, st, Prec::separate_master ? p : nullptr, n);
      } else if constexpr (Ctx::host_memory) {
        // Host memory all of it: the host loop updates in place.
        float* w = Prec::separate_master ? arrays[0] : reinterpret_cast<float*>(p);
        in_ranges(offload::host_system{}, true, c, g, divisor, coef, w, st, Prec::separate_master ? p : nullptr, n);
      } else {
        // A device system: the gradients come to host memory, the host loop updates, and the new
        // parameters (the weights themselves in fp32) go back.
        staged_update(g, p, n, arrays, st, c, divisor, coef);
      }
    });
  }
  template <class T>
  void staged_update(const T* g, param_type* p, std::size_t n, float* const* arrays, float* const* st,
                     const typename Opt::step_constants& c, float divisor, float coef) {
    const std::size_t gb = n * sizeof(T), pb = n * sizeof(param_type);
    if (stage_g_.bytes() < gb) {
      store_.add_staging(gb - stage_g_.bytes());
      stage_g_ = offload::host_block<system>(gb);
    }
    if (stage_p_.bytes() < pb) {
      store_.add_staging(pb - stage_p_.bytes());
      stage_p_ = offload::host_block<system>(pb);
    }
    ctx_.sys.copy_to_host(stage_g_.data(), g, gb);
    auto* hp = static_cast<param_type*>(stage_p_.data());
    if constexpr (Prec::separate_master) {
      store_.count_transfer(gb, pb);
      in_ranges(offload::host_system{}, true, c, static_cast<const T*>(stage_g_.data()), divisor, coef, arrays[0], st,
                hp, n);
    } else {
      ctx_.sys.copy_to_host(hp, p, pb);  // the fp32 weights are the parameters
      store_.count_transfer(gb + pb, pb);
      in_ranges(offload::host_system{}, true, c, static_cast<const T*>(stage_g_.data()), divisor, coef,
                reinterpret_cast<float*>(hp), st, static_cast<param_type*>(nullptr), n);
    }
    ctx_.sys.copy_from_host(p, hp, pb);
  }

  // The optimizer's rule over elements [0, n) of these arrays: on the rank's pool, one contiguous range
  // per thread, where the host runs it (`host`), else in one call of the system. A writable gradient
  // (the reducer's store, in host memory) is zeroed as it is read: update_zeroes_gradients.
  template <class Sys, class T, class PT>
  void in_ranges(const Sys& sys, bool host, const typename Opt::step_constants& c, T* g, float divisor, float coef,
                 float* w, float* const* st, PT* p, std::size_t n) {
    const auto range = [&](std::size_t b, std::size_t e) {
      float* s[Opt::slots > 0 ? Opt::slots : 1] = {};
      for (int k = 0; k < Opt::slots; ++k) s[k] = st[k] + b;
      if constexpr (!std::is_const_v<T> && update_zeroes_gradients)
        elementwise::update_and_clear<Opt>(sys, c, g + b, divisor, coef, w + b, s, p ? p + b : p, e - b);
      else
        elementwise::update<Opt>(sys, c, g + b, divisor, coef, w + b, s, p ? p + b : p, e - b);
    };
    if (host)
      pool_.run(n, range);
    else
      range(0, n);
  }

  // n fp32 master weights cast into parameters in host memory, one contiguous range per pool thread.
  template <class Sys>
  void cast_on_pool(const Sys& sys, param_type* to, const float* from, std::size_t n) {
    pool_.run(n, [&](std::size_t b, std::size_t e) {
      sys.for_each(e - b, elementwise::cast_rule{}, elementwise::out(to + b), elementwise::in(from + b));
    });
  }

  // Calls f(u, i, n, arrays) for the elements [i, i + n) of unit u that the store's slices hold, in
  // order: every held element, arrays pointing at element i of each state array. Each unit's segments
  // end before the next unit's begin; `done(u)` is called once per unit in unit order, as soon as its
  // last segment is through (with its slice not yet written back).
  template <class F, class Done>
  void for_each_held_segment(F f, bool write_back, Done done) {
    const std::size_t units = ctx_.layout.num_units();
    std::size_t next = 0;  // the first unit not yet done
    store_.stream(
        [&](std::size_t begin, std::size_t end, float* const* arrays) {
          for (std::size_t u = next; u < units; ++u) {
            const range span = state_span(unit_id{u});
            if (span.begin >= end) break;
            const range r = update_range(unit_id{u});
            const unit_layout& ul = ctx_.layout.unit(unit_id{u});
            if (!r.empty()) {
              const std::size_t s0 = state_index(ul, r.begin);
              const std::size_t lo = std::max(s0, begin), hi = std::min(s0 + r.size(), end);
              if (lo < hi) {
                float* at[offload::state_store<system>::max_arrays] = {};
                for (int a = 0; a < state_arrays; ++a) at[a] = arrays[a] + (lo - begin);
                f(unit_id{u}, r.begin + (lo - s0), hi - lo, at);
              }
            }
            if (span.end <= end && next == u) {
              done(unit_id{u});
              next = u + 1;
            }
          }
        },
        write_back);
    // Units with nothing held (none here: every unit has a span) are done at the end, in order.
    for (; next < units; ++next) done(unit_id{next});
  }

  Ctx& ctx_;
  // Mutable: a read of the disk tier counts its bytes.
  mutable offload::state_store<system> store_;
  offload::host_block<system> stage_g_, stage_p_;  // a device system's operands of an offloaded update
  // A matrix optimizer's: the matrices' owners, its staged values in a step, its orthogonalization's workspace.
  matrix_owners owners_;
  buffer<float, system> staged_;
  typename matrix_workspace<Opt>::type workspace_;
  thread_pool pool_;                               // the host update's threads (engine_options::host_threads)
  std::unique_ptr<tensor_sums> tensor_sums_;       // a tensor-wise optimizer's sums, kept between steps
  std::vector<char> applied_;                      // in a tensor-wise step: the tensors whose weights are done
};

}  // namespace zero
