// matrix_sweep: a matrix optimizer's step (optim::muon): the slots, each matrix whole on its owner, then the weights.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/thread_pool.hpp"
#include "zero/engine/matrix_owners.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/error.hpp"
#include "zero/offload/state_store.hpp"

namespace zero {

template <class Ctx, class Opt>
class optimizer_sweep;

// The kind of a MatrixOptimizer (engine/sweep_kind.hpp).
template <class Ctx, class Opt>
class matrix_sweep {
 public:
  using P = typename Ctx::partitioner;
  using Prec = typename Ctx::precision;
  using system = typename Ctx::system;
  using param_type = typename Ctx::param_type;

  explicit matrix_sweep(Ctx& c) : ctx_(c) {}

  // The matrices and their owners (engine/matrix_owners.hpp), from the spec's shapes and the parameter
  // groups. Each matrix is orthogonalized whole, which the engine does not put together over a
  // tensor-parallel group.
  void plan(optimizer_sweep<Ctx, Opt>&, const param_group_map& groups) {
    ZERO_CHECK(ctx_.tp_size == 1, invalid_argument, "rank ", ctx_.rank, ": optim::", Opt::name,
               " needs each weight matrix whole, which the engine does not gather over a tensor-parallel group "
               "yet: build the engine over comm::mesh with tp = 1, or over the data-parallel backend");
    owners_ = matrix_owners(ctx_.spec, ctx_.layout, [&](std::size_t u, std::size_t t) {
      return !groups.element_wise(groups.group_of(ctx_.layout, unit_id{u}, t));
    });
  }
  // Whether the control link can send each matrix to its owner and back (matrix_owners::to_owners).
  static constexpr bool link_has_all_to_all = comm::has_all_to_all<typename Ctx::link>;
  // The exchange of one step on the control link, in bus bytes (matrix_owners).
  std::uint64_t exchange_bytes(const optimizer_sweep<Ctx, Opt>&) const {
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
  void update(optimizer_sweep<Ctx, Opt>& sweep, parameter_placement<Ctx>& params, const param_group_map& groups,
              const std::vector<typename Opt::step_constants>& c, float divisor, float coef, const Gradients& gradients,
              Done done) {
    using sweep_type = optimizer_sweep<Ctx, Opt>;
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
        for (int a = 0; a < sweep_type::state_arrays; ++a) at[a] = arrays[a] + (piece.begin - i);
        f(piece, g, mi, static_cast<float* const*>(at));
      }
    };
    // The staged values of matrix q's held elements from unit-local element `from`.
    const auto staged = [&](unit_id u, std::size_t q, std::size_t from) {
      const matrix_entry& m = owners_.matrices(u)[q];
      return staged_.data() + staged_at[u.index][q] + (from - held_part(u, m).begin);
    };
    sweep.store().begin_step();
    // 1. Element-wise tensors updated; matrices advanced, their u staged.
    sweep.for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays, [&](range piece, std::size_t g, std::size_t q, float* const* at) {
            if (q == owners_.matrices(u).size()) {
              sweep.update_segment(params, u, piece.begin, piece.size(), at, c[g], divisor, coef, gradients);
              return;
            }
            const unit_layout& ul = ctx_.layout.unit(u);
            float* w = Prec::separate_master ? at[0] : reinterpret_cast<float*>(params.element(ul, piece.begin));
            float* st[Opt::slots] = {};
            for (int k = 0; k < Opt::slots; ++k) st[k] = at[sweep_type::slot_array(k)];
            gradients([&]<class T>(T* store, bool sharded) {
              T* gp = store + element_index(ul, piece.begin, sharded, ctx_.rank);
              sweep.pool().run(piece.size(), [&](std::size_t b, std::size_t e) {
                float* s[Opt::slots] = {};
                for (int k = 0; k < Opt::slots; ++k) s[k] = st[k] + b;
                if constexpr (sweep_type::update_zeroes_gradients)
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
      if (!owners_.matrices(unit_id{u}).empty()) orthogonalize_unit(sweep.pool(), unit_id{u}, staged_at[u]);
    // 3. The matrices' weights.
    sweep.for_each_held_segment(
        [&](unit_id u, std::size_t i, std::size_t n, float* const* arrays) {
          pieces(u, i, n, arrays, [&](range piece, std::size_t g, std::size_t q, float* const* at) {
            if (q == owners_.matrices(u).size()) return;
            const matrix_entry& m = owners_.matrices(u)[q];
            const unit_layout& ul = ctx_.layout.unit(u);
            param_type* p = params.element(ul, piece.begin);
            float* w = Prec::separate_master ? at[0] : reinterpret_cast<float*>(p);
            const float f = Opt::matrix_factor(c[g], m.rows, m.cols);
            const float* o = staged(u, q, piece.begin);
            sweep.pool().run(piece.size(), [&](std::size_t b, std::size_t e) {
              const float* s[Opt::slots] = {};
              for (int k = 0; k < Opt::slots; ++k) s[k] = at[sweep_type::slot_array(k)] + b;
              s[ms] = o + b;  // the result in place of u
              elementwise::apply_factor<Opt>(ctx_.sys, c[g], f, w + b, s,
                                             Prec::separate_master ? p + b : static_cast<param_type*>(nullptr), e - b);
            });
          });
        },
        true, done);
    sweep.store().end_step();
    staged_ = buffer<float, system>();
  }

 private:
  // Matrix m's elements this rank holds (unit-local): the whole matrix where the states are replicated.
  range held_part(unit_id u, const matrix_entry& m) const {
    return intersect(m.elements, ctx_.layout.updated_real(u, ctx_.rank, P::shards_optimizer_states));
  }

  // Step 2 of update() for unit u: every matrix's staged u replaced by its orthogonalization
  // (only the elements this rank holds). `at`: each matrix's offset in staged_.
  void orthogonalize_unit(thread_pool& pool, unit_id u, const std::vector<std::size_t>& at) {
    const auto& mats = owners_.matrices(u);
    // The system's products, their rows over the rank's pool (which does not change a bit).
    const auto products = ctx_.sys.products([&](std::size_t n, auto&& f) { pool.run(n, f); });
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

  Ctx& ctx_;
  matrix_owners owners_;
  buffer<float, system> staged_;              // in a step: each matrix's u, then its result
  typename Opt::workspace workspace_;         // what the orthogonalization reuses
};

}  // namespace zero
