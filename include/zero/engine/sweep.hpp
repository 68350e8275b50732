// The optimizer sweep: the update over the rank's master weights and optimizer slots, in memory or offloaded.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/thread_pool.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/param_groups.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/sweep_kind.hpp"
#include "zero/offload/state_store.hpp"

namespace zero {

// The fp32 state arrays (the master weights where the precision keeps them apart from the parameters,
// then one per optimizer slot) over what the rank updates (its owned slices where the states are
// sharded, the whole model otherwise), in the offload tier's memory or the system's own, and the pass
// that updates them: the offload store streams them slice by slice (offload::state_store), and each
// unit's segments run the optimizer's element-wise rule on the system (no offload) or the host loop.
// The same rule whichever memory runs it, so offloading changes no bit. Where the host runs it, the
// rank's pool (engine_options::host_threads) updates contiguous ranges of each segment at once: each
// element's operations are the same, so the thread count changes no bit either. What a step does with
// them is the optimizer's kind's (engine/sweep_kind.hpp): the element-wise rule over every segment, a
// tensor-wise optimizer's passes around each tensor's norms, a matrix optimizer's exchange with the
// matrices' owners, or a kind an optimizer brings; this class is what every kind is built from.
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
  // The step of the optimizer's kind: element-wise, tensor-wise, matrix, or one the optimizer names.
  using kind = sweep_kind_t<Ctx, Opt>;

  explicit optimizer_sweep(Ctx& c) : ctx_(c), pool_(c.options.host_threads), kind_(c) {}
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
    kind_.update(*this, params, groups, c, divisor, coef, gradients, done);
  }
  // At construction, once the parameter groups are known and before anything is allocated: what the
  // optimizer's kind checks and plans (a matrix optimizer's owners), the same on every rank.
  void plan_kind(const param_group_map& groups) { kind_.plan(*this, groups); }
  // The kind's exchange of one step on the control link, in bus bytes (a matrix optimizer's matrices
  // to their owners and back; 0 for the others).
  std::uint64_t exchange_bytes() const { return kind_.exchange_bytes(*this); }
  // Whether the kind keeps optimizer state of its own beside the slots (engine/sweep_kind.hpp), its
  // bytes, and its buffers for release_memory().
  static constexpr bool kind_holds_state = requires(const kind& k) {
    { k.state_bytes() } -> std::convertible_to<std::uint64_t>;
  };
  std::uint64_t kind_state_bytes() const {
    if constexpr (kind_holds_state)
      return kind_.state_bytes();
    else
      return 0;
  }
  template <class F>
  void for_each_kind_buffer(F&& f) {
    if constexpr (kind_holds_state) kind_.for_each_state_buffer(f);
  }
  // Whether a checkpoint can carry that state (the kind hands it out whole), and the state itself.
  static constexpr bool kind_checkpoints_state = requires(kind& k) {
    { k.checkpointed_state() } -> std::same_as<std::span<float>>;
  };
  static constexpr bool kind_state_lost = kind_holds_state && !kind_checkpoints_state;  // by a checkpoint
  std::span<float> kind_checkpointed_state() {
    if constexpr (kind_checkpoints_state)
      return kind_.checkpointed_state();
    else
      return {};
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

  // ---- the pieces a kind's step is made of (engine/sweep_kind.hpp) ----

  Ctx& context() const { return ctx_; }
  // The host update's threads (engine_options::host_threads): a range split over them changes no bit.
  thread_pool& pool() { return pool_; }

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

 private:
  // The rank's held state per unit in the state arrays' index space: [begin, end) of its owned
  // (padded) slice, or of the whole unit where states are replicated. Units follow each other.
  range state_span(unit_id u) const {
    const unit_layout& ul = ctx_.layout.unit(u);
    const range held = P::shards_optimizer_states ? ctx_.layout.owned(u, ctx_.rank) : range{0, ul.padded};
    const std::size_t b = state_index(ul, held.begin);
    return {b, b + held.size()};
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

  Ctx& ctx_;
  // Mutable: a read of the disk tier counts its bytes.
  mutable offload::state_store<system> store_;
  offload::host_block<system> stage_g_, stage_p_;  // a device system's operands of an offloaded update
  thread_pool pool_;  // the host update's threads (engine_options::host_threads)
  kind kind_;         // the optimizer kind's step (engine/sweep_kind.hpp) and what it keeps between steps
};

}  // namespace zero
