// The binned gradient reducer (the reproducible mode): exact integer sums of fixed bins, rounded once.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/concepts/gradient_reducer.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/core/binned.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/formulas.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/reduce/reducer.hpp"
#include "zero/engine/tensor_parallel.hpp"

namespace zero::reduce {

// engine_options::reproducible (docs/reproducibility.md): every micro-batch's gradient is cut into
// the int64 words of fixed, absolutely aligned bins (core/binned.hpp) and the words are summed over
// the ranks, exact in any order; each unit's sum is rounded once to fp32 at step(). The result does
// not depend on the world size, the summation order or the split into micro-batches. The store: three
// word planes per element the rank updates and their fp32 rounding (formula::reproducible_grad_bytes).
template <class Ctx>
class binned_method {
 public:
  using P = typename Ctx::partitioner;
  using system = typename Ctx::system;
  using grad_type = typename Ctx::grad_type;
  using request = typename Ctx::request;
  static constexpr std::size_t K = binned::words;
  static constexpr const char* name = "binned";
  // Kernels never write the store, so it is sharded wherever the optimizer states are.
  static constexpr bool store_sharded = P::shards_optimizer_states;
  // The backend's std::int64_t collectives (CommBackendForReproducible) and the system's binned
  // reductions (sys::host has them; the device system not yet). Without them the engine compiles
  // without this reducer and refuses the mode at construction.
  static constexpr bool available =
      CommBackendForReproducible<typename Ctx::comm_backend> &&
      requires(const system& y, const grad_type* g, const float* const* f, const std::size_t* n, std::int64_t* w) {
    { y.binned_summary(g, n[0]) } -> std::same_as<std::int64_t>;
    { y.binned_square_summary(f, n, n[0], 1.0f) } -> std::same_as<std::int64_t>;
    y.binned_sum_of_squares(f, n, n[0], 1.0f, 0, w);
  };
  // The reduce exchanges the gradient values where it can (formula::reproducible_exchanges_values):
  // one all_to_all brings each rank every rank's values of its slice, which it cuts and sums into its
  // store itself (binned_cut_sum_rule), g bytes per element on the wire instead of 24, and no pass
  // writes words for a collective to read back. In stage 0 each rank's slice is rounded at the unit's
  // last reduce and one all-gather of the fp32 gradient gives every rank the whole unit.
  static constexpr bool can_exchange_values = comm::has_all_to_all<typename Ctx::comm_backend>;
  static bool exchanges_values(const Ctx& c) {
    return formula::reproducible_exchanges_values(P::stage, c.layout.ranks(), c.replica_count, can_exchange_values);
  }
  static bool chosen(const engine_options& o) { return o.reproducible; }
  static std::size_t grad_bytes(const engine_options&) { return formula::reproducible_grad_bytes; }
  static std::uint64_t extra_state_bytes(const engine_options&, std::uint64_t) { return 0; }
  static bool uses_bucket(const Ctx&) { return true; }  // converted into words before it is reduced
  static void accept(const Ctx& c) {
    static_assert(formula::reproducible_wire_bytes == binned::words * sizeof(std::int64_t),
                  "formula::reproducible_wire_bytes counts the binned words");
    ZERO_CHECK(available, invalid_argument, "rank ", c.rank,
               ": engine_options::reproducible needs a backend with all_reduce and reduce_scatter of std::int64_t "
               "(CommBackendForReproducible) and the binned reductions of the system (binned_summary, "
               "binned_square_summary, binned_sum_of_squares; sys::host has them, the device system not yet): "
               "run the reproducible mode on a host backend (comm::threads, comm::mpi), or turn it off");
    const std::size_t total = static_cast<std::size_t>(c.dp_size()) * static_cast<std::size_t>(c.reduces_per_step());
    ZERO_CHECK(total <= (std::size_t{1} << 24), invalid_argument, "rank ", c.rank,
               ": engine_options::reproducible averages over N x micro_batches = ", c.dp_size(), " x ",
               c.reduces_per_step(), " = ", total,
               " micro-batches, more than 2^24 (the divisor must be exact in fp32)");
  }

  // The words on the wire ([rank][unit][plane][shard], a rank's block `block` words long), each unit's
  // agreed summary, and whether the one unit's words went straight into its empty store. The request
  // is declared last: destroyed, and so waited for, first.
  struct in_flight {
    std::vector<bucket_part> parts;  // at: where the unit's words (or values) start in a rank's block
    buffer<std::int64_t, system> wire;
    // Where the reduce exchanges values: what this rank sends ([rank][unit][shard], a lone unit's bucket)
    // and receives (every rank's values of this rank's slices).
    bool exchanged = false;
    buffer<grad_type, system> sent, values;
    std::size_t block = 0;
    std::vector<binned::summary> summaries;
    bool direct = false;
    std::int64_t* reduced = nullptr;  // this rank's summed words (the replicas' all-reduce sums them)
    std::size_t reduced_count = 0;
    unit_id first{};
    request pending{};
  };

  explicit binned_method(Ctx& c)
      : ctx_(c),
        sums_(c.spec.num_units()),
        started_(c.spec.num_units()),
        pending_(c.spec.num_units(), 0),
        reduces_(c.spec.num_units(), 0),
        rounded_(c.spec.num_units(), 0),
        held_(c.spec.num_units(), 0) {
    const std::size_t n = sharded() ? c.layout.shard_total() : c.layout.padded();
    bins_ = buffer<std::int64_t, system>(K * n, mem_category::grads, c.acct);
    grads32_ = buffer<float, system>(n, mem_category::grads, c.acct);
  }

  grad_type* persistent_gradient(unit_id) { return nullptr; }  // (never: every gradient goes to a bucket)

  // Reduces one unit, or the units of a fused bucket, exactly: the ranks agree on each unit's top bin
  // (one all-gather of a binned::summary per unit and rank, on the protocol's counter), each rank cuts
  // its gradients into the words of those bins, and one all-reduce (stage 0) or reduce-scatter sums
  // the int64 words, exact in any order. The wire puts rank r's slices of every unit side by side,
  // each as three planes of its shard, so each rank receives its words together. The gradient buckets
  // are freed before the collective starts; the sum lands in the store (landing_of), or on the wire,
  // merged into the store when the collective completes.
  in_flight start(std::vector<unit_part<Ctx>> parts) {
    const zero::layout& lay = ctx_.layout;
    const auto ranks = static_cast<std::size_t>(lay.ranks()), me = static_cast<std::size_t>(ctx_.rank);
    const std::size_t count = parts.size();
    std::vector<std::int64_t> table(count * ranks);
    for (std::size_t i = 0; i < count; ++i)
      table[me * count + i] = summary_of(parts[i].bucket.data(), lay.unit(parts[i].unit).padded) |
                              (pending_[parts[i].unit.index] > 0 ? in_flight_mark : 0);
    {
      ctx_.make_room(count * ranks * sizeof(std::int64_t));
      buffer<std::int64_t, system> wire(count * ranks, mem_category::transient, ctx_.acct);
      ctx_.sys.copy_from_host(wire.data() + me * count, table.data() + me * count, count * sizeof(std::int64_t));
      const auto l = ctx_.label("reduce summary", parts[0].unit);
      ctx_.protocol.all_gather(wire.data() + me * count, wire.data(), count);
      ctx_.sys.copy_to_host(table.data(), wire.data(), table.size() * sizeof(std::int64_t));
    }
    // Each unit's top bin agreed over the group, then (replicated shard groups) across the groups, so
    // every data-parallel rank cuts its gradients at the same bins; and whether any rank has an earlier
    // reduce of the unit in flight (landing_of).
    std::vector<binned::summary> agreed(count);
    std::vector<char> busy(count, 0);
    for (std::size_t i = 0; i < count; ++i)
      for (std::size_t r = 0; r < ranks; ++r) {
        agreed[i] = binned::merge(agreed[i], binned::unpack(table[r * count + i] & ~in_flight_mark));
        busy[i] |= (table[r * count + i] & in_flight_mark) != 0;
      }
    if (ctx_.replicas) agree_across_replicas(agreed, busy, parts[0].unit);
    if constexpr (can_exchange_values)
      if (exchanges_values(ctx_)) {
        note_started(parts, agreed);
        return start_exchange(parts, agreed);
      }
    in_flight f;
    f.first = parts[0].unit;
    const landing land = landing_of(parts, agreed, busy);
    note_started(parts, agreed);
    std::size_t shard_sum = 0;
    for (const auto& p : parts) shard_sum += lay.unit(p.unit).shard;
    f.block = K * shard_sum;
    ctx_.make_room(f.block * ranks * sizeof(std::int64_t));
    f.wire = buffer<std::int64_t, system>(f.block * ranks, mem_category::transient, ctx_.acct, uninitialized);
    // One rank in the group: the reduce would copy the words to where they land, so the cut writes (or
    // adds) into the store itself and the collective runs in place there (the wire, allocated as
    // always, stays unused).
    const bool in_place = land.direct && ranks == 1;
    // And where that reduce is the unit's last of the step (and no replica group adds to the sum), the
    // sum is complete here: the cut rounds it at once into the fp32 gradient (to_bins_rounding_rule),
    // and the words are neither stored nor read back at step(). The same integers, the same rounding.
    const bool rounds_now = in_place && count == 1 && !ctx_.replicas &&
                            reduces_[parts[0].unit.index] == static_cast<std::size_t>(ctx_.reduces_per_step());
    std::size_t off = 0;
    for (std::size_t i = 0; i < count; ++i) {
      unit_part<Ctx>& p = parts[i];
      const std::size_t shard = lay.unit(p.unit).shard;
      // Cut at the landing's top (the agreed one, or the store's where it lands): a rank-independent bin.
      const binned::summary cut = count == 1 ? land.words : agreed[i];
      if (rounds_now && cut.finite() && cut.bin >= 0) {
        const unit_layout& ul = lay.unit(p.unit);
        const std::int64_t* st = store_of(ul);
        const int store_top = land.adds_store ? sums_[p.unit.index].bin : -1;
        ctx_.sys.for_each(shard, elementwise::to_bins_rounding_rule{cut.bin, store_top},
                          elementwise::in(p.bucket.data()), elementwise::in(st), elementwise::in(st + shard),
                          elementwise::in(st + 2 * shard), elementwise::out(grads32_.data() + base(ul)));
        rounded_[p.unit.index] = 1;
      }
      for (std::size_t r = 0; r < ranks && !rounded_[p.unit.index]; ++r) {
        std::int64_t* w = f.wire.data() + r * f.block + off;
        if (cut.finite() && cut.bin >= 0 && land.adds_store && r == me) {
          // the store's slice `me` (stage 0 keeps every slice, [rank][plane][shard])
          std::int64_t* st = store_of(lay.unit(p.unit)) + (updates_every_element<P> ? me * K * shard : 0);
          if (in_place) w = st;
          ctx_.sys.for_each(shard, elementwise::to_bins_adding_rule{cut.bin, sums_[p.unit.index].bin},
                            elementwise::in(p.bucket.data() + r * shard), elementwise::in(st),
                            elementwise::in(st + shard), elementwise::in(st + 2 * shard), elementwise::out(w),
                            elementwise::out(w + shard), elementwise::out(w + 2 * shard));
        } else if (cut.finite() && cut.bin >= 0) {
          if (in_place) w = store_of(lay.unit(p.unit));
          ctx_.sys.for_each(shard, elementwise::to_bins_rule{cut.bin}, elementwise::in(p.bucket.data() + r * shard),
                            elementwise::out(w), elementwise::out(w + shard), elementwise::out(w + 2 * shard));
        } else {  // all zeros, or a non-finite value: zeros (the flag, which every rank has, skips the step)
          if (in_place) w = store_of(lay.unit(p.unit));
          ctx_.sys.fill_zero(w, K * shard * sizeof(std::int64_t));
        }
      }
      f.parts.push_back({p.unit, p.first, off});
      f.summaries.push_back(cut);
      off += K * shard;
      p.bucket.reset();  // converted: freed before the collective starts
    }
    // Received straight into the unit's store (landing_of): no merge pass. Nothing else touches that
    // part of the store until the collective completes.
    f.direct = land.direct;
    const auto l = ctx_.label(count > 1 ? "reduce bucket" : "reduce", parts[0].unit);
    std::int64_t* store = f.direct ? store_of(lay.unit(parts[0].unit)) : nullptr;
    std::int64_t* send = in_place ? store : f.wire.data();
    if constexpr (updates_every_element<P>) {
      f.reduced = f.direct ? store : f.wire.data(), f.reduced_count = f.block * ranks;
      f.pending = ctx_.protocol.start_all_reduce(send, f.reduced, f.reduced_count, reduce_op::sum);
    } else {
      f.reduced = f.direct ? store : f.wire.data() + me * f.block, f.reduced_count = f.block;
      f.pending = ctx_.protocol.start_reduce_scatter(send, f.reduced, f.block, reduce_op::sum);
    }
    return f;
  }

  void complete(in_flight& f) {
    ctx_.protocol.wait(f.pending);
    for (const bucket_part& p : f.parts) --pending_[p.unit.index];
    if (f.exchanged) return complete_exchange(f);
    if (ctx_.replicas) {  // the integer words, exact in any order: the same sum as one group of N ranks
      const auto l = ctx_.label_on(ctx_.replicas->inner(), "reduce across replicas", f.first);
      ctx_.replicas->all_reduce(f.reduced, f.reduced, f.reduced_count, reduce_op::sum);
    }
    for (std::size_t i = 0; i < f.parts.size(); ++i) merge(f, f.parts[i], f.summaries[i]);
  }
  // The merge adds the words in place: completing allocates nothing.
  std::size_t completion_bytes(const in_flight&) const { return 0; }

  // Each unit's binned sum rounded once into the fp32 gradient the norm and the optimizer read (where
  // its last reduce did not already: start's rounds_now). A unit whose sum is empty keeps its zeros;
  // one with a non-finite value is left alone (the norm reports it and every rank skips the update).
  void settle() {
    const zero::layout& lay = ctx_.layout;
    for (std::size_t u = 0; u < sums_.size(); ++u) {
      const binned::summary s = sums_[u];
      if (!s.finite() || s.bin < 0 || rounded_[u]) continue;
      const unit_layout& ul = lay.unit(unit_id{u});
      for (std::size_t b = 0; b < kept_blocks(); ++b) {
        const std::int64_t* w = bins_.data() + K * base(ul) + b * K * ul.shard;
        ctx_.sys.for_each(ul.shard, elementwise::round_bins_rule{s.bin},
                          elementwise::out(grads32_.data() + base(ul) + b * ul.shard), elementwise::in(w),
                          elementwise::in(w + ul.shard), elementwise::in(w + 2 * ul.shard));
      }
    }
  }

  // The sum of squares of the averaged gradient (fp32 rounded sum / divisor, each square exact in
  // double) over the real elements, exact before one rounding, so it does not depend on how the
  // elements are split over ranks: the ranks agree on the squares' top bin (an all-gather of one
  // summary per rank, with the optimizer's hash), sum their squares into binned words, and all-gather
  // the words (stages 1-3, on the control counter; stage 0 holds every element and needs no
  // collective). A non-finite gradient gives +inf (NaN where a NaN was among the values), the same on
  // every rank.
  norm_result sum_of_squares(float divisor, const agreement_terms& a) {
    if (ctx_.tp_size > 1) return mesh_sum_of_squares(divisor, a);
    constexpr std::size_t KS = binned::words + 1;
    const zero::layout& lay = ctx_.layout;
    auto non_finite = [](binned::summary s) {
      return (s.flags & binned::summary::not_a_number) ? std::numeric_limits<double>::quiet_NaN()
                                                       : std::numeric_limits<double>::infinity();
    };
    binned::summary flagged;
    for (const auto& s : sums_) flagged.flags |= s.flags;
    if (!flagged.finite()) return {non_finite(flagged), true};
    std::vector<const float*> segments;
    std::vector<std::size_t> sizes;
    for (std::size_t u = 0; u < sums_.size(); ++u) {
      const unit_layout& ul = lay.unit(unit_id{u});
      const range o = P::shards_optimizer_states ? lay.owned_real(unit_id{u}, ctx_.rank) : range{0, ul.numel};
      if (o.empty()) continue;
      segments.push_back(grads32_.data() + element_index(ul, o.begin, sharded(), ctx_.rank));
      sizes.push_back(o.size());
    }
    binned::summary s = binned::unpack(square_summary(segments, sizes, divisor));
    if constexpr (P::shards_optimizer_states) {
      // With the optimizer's hash (agreement.hpp): every rank sees every rank's.
      const std::int64_t mine[2] = {binned::pack(s), static_cast<std::int64_t>(a.optimizer_hash)};
      const std::vector<std::int64_t> all = all_gather_control(mine, 2);
      bool agree = true;
      for (std::size_t r = 0; r < all.size(); r += 2) {
        s = binned::merge(s, binned::unpack(all[r]));
        if (all[r + 1] != mine[1]) agree = false;
      }
      if (!agree) return {0.0, false};
    }
    if (!s.finite()) return {non_finite(s), true};
    if (s.bin < 0) return {0.0, true};
    const int top = s.bin + 1;  // one bin above every square's: it takes the carries
    std::int64_t w[KS] = {};
    sum_of_squares_words(segments, sizes, divisor, top, w);
    if constexpr (P::shards_optimizer_states) {
      const std::vector<std::int64_t> all = all_gather_control(w, KS);
      for (std::size_t k = 0; k < KS; ++k) w[k] = 0;
      for (std::size_t r = 0; r < all.size() / KS; ++r)
        for (std::size_t k = 0; k < KS; ++k) w[k] += all[r * KS + k];
    }
    return {binned::round<double>(w, top), true};
  }
  // In a tensor-parallel mesh: the same exact sum over the whole mesh's model, so the norm is the
  // same bits at every tensor-parallel size. The squares' top bin is agreed over the data-parallel
  // group and then over the tensor-parallel group (with each group's optimizer verdict and hash); the
  // words of the split tensors' pieces and of the replicated tensors are summed apart over the
  // data-parallel group, then the split words over the tensor-parallel group and the replicated once
  // (tp rank 0's, which every rank's must equal: engine/tensor_parallel.hpp), rounded once.
  norm_result mesh_sum_of_squares(float divisor, const agreement_terms& a) {
    namespace tpd = tensor_parallel_detail;
    constexpr std::size_t KS = binned::words + 1;
    const zero::layout& lay = ctx_.layout;
    auto non_finite = [](binned::summary s) {
      return (s.flags & binned::summary::not_a_number) ? std::numeric_limits<double>::quiet_NaN()
                                                       : std::numeric_limits<double>::infinity();
    };
    binned::summary flagged;
    for (const auto& s : sums_) flagged.flags |= s.flags;
    std::array<std::vector<const float*>, 3> segments;  // [0]: split, [1]: replicated, [2]: both
    std::array<std::vector<std::size_t>, 3> sizes;
    for (std::size_t u = 0; u < sums_.size(); ++u) {
      const unit_layout& ul = lay.unit(unit_id{u});
      const range o = P::shards_optimizer_states ? lay.owned_real(unit_id{u}, ctx_.rank) : range{0, ul.numel};
      tpd::for_each_tensor_part(ctx_.spec.units()[u], ul, o, [&](range p, bool split) {
        const float* at = grads32_.data() + element_index(ul, p.begin, sharded(), ctx_.rank);
        for (std::size_t k : {split ? std::size_t{0} : std::size_t{1}, std::size_t{2}}) {
          segments[k].push_back(at);
          sizes[k].push_back(p.size());
        }
      });
    }
    // Where the step is to be skipped, the flags alone travel.
    binned::summary s = flagged.finite() ? binned::unpack(square_summary(segments[2], sizes[2], divisor)) : flagged;
    bool agree = a.agreed;
    if constexpr (P::shards_optimizer_states) {
      const std::int64_t mine[2] = {binned::pack(s), static_cast<std::int64_t>(a.optimizer_hash)};
      const std::vector<std::int64_t> all = all_gather_control(mine, 2);
      for (std::size_t r = 0; r < all.size(); r += 2) {
        s = binned::merge(s, binned::unpack(all[r]));
        if (all[r + 1] != mine[1]) agree = false;
      }
    }
    const std::int64_t group_mine[3] = {binned::pack(s), agree ? 1 : 0, static_cast<std::int64_t>(a.optimizer_hash)};
    const std::vector<std::int64_t> group = tpd::over_group(ctx_, group_mine, 3, "grad norm");
    for (std::size_t t = 0; t < group.size(); t += 3) {
      s = binned::merge(s, binned::unpack(group[t]));
      if (group[t + 1] != 1 || group[t + 2] != group_mine[2]) agree = false;
    }
    if (!agree) return {0.0, false};
    if (!s.finite()) return {non_finite(s), true};
    if (s.bin < 0) return {0.0, true};
    const int top = s.bin + 1;
    std::int64_t w[2 * KS] = {};  // the split tensors' words, then the replicated ones'
    sum_of_squares_words(segments[0], sizes[0], divisor, top, w);
    sum_of_squares_words(segments[1], sizes[1], divisor, top, w + KS);
    if constexpr (P::shards_optimizer_states) {
      const std::vector<std::int64_t> all = all_gather_control(w, 2 * KS);
      for (std::size_t k = 0; k < 2 * KS; ++k) w[k] = 0;
      for (std::size_t r = 0; r < all.size() / (2 * KS); ++r)
        for (std::size_t k = 0; k < 2 * KS; ++k) w[k] += all[r * 2 * KS + k];
    }
    const std::vector<std::int64_t> words = tpd::over_group(ctx_, w, 2 * KS, "grad norm");
    const auto rounded = [&](const std::int64_t* p) {
      std::int64_t v[KS];
      std::copy(p, p + KS, v);
      return binned::round<double>(v, top);
    };
    std::int64_t total[KS] = {};
    for (std::size_t t = 0; t < words.size() / (2 * KS); ++t) {
      const std::int64_t* mine = words.data() + t * 2 * KS;
      for (std::size_t k = 0; k < KS; ++k) total[k] += mine[k];
      if (!std::equal(mine + KS, mine + 2 * KS, words.data() + KS))
        tpd::replicated_gradients_differ(ctx_.rank, ctx_.tp_rank, rounded(words.data() + KS), static_cast<int>(t),
                                         rounded(mine + KS));
    }
    for (std::size_t k = 0; k < KS; ++k) total[k] += words[KS + k];
    return {binned::round<double>(total, top), true};
  }
  // The global number of micro-batches N x M (the trainer does not divide by M here).
  std::size_t averaging_count() const {
    return static_cast<std::size_t>(ctx_.dp_size()) * static_cast<std::size_t>(ctx_.reduces_per_step());
  }
  bool sharded() const { return store_sharded; }
  template <class F>
  void with_gradients(F&& f) const {
    f(static_cast<const float*>(grads32_.data()));
  }
  void clear(bool updated_zeroed) {
    if (updated_zeroed)
      zero_all_but_updated(ctx_, grads32_.data(), grads32_.size(), sharded());
    else
      ctx_.sys.fill_zero(grads32_.data(), grads32_.size() * sizeof(float));
    // bins_ is not cleared: a unit's store is read only once its summary says words were written
    // there this step, and its first words are copied in (merge), not added.
    for (auto& s : sums_) s = binned::summary{};
    for (auto& s : started_) s = binned::summary{};
    std::fill(reduces_.begin(), reduces_.end(), std::size_t{0});
    std::fill(rounded_.begin(), rounded_.end(), char{0});
    std::fill(held_.begin(), held_.end(), char{0});
  }

 private:
  // How a reduce of one unit lands: its words' summary (the top bin they are cut at, every rank's
  // flags), whether it is received straight into the unit's store (direct), and whether this rank's
  // own slice carries the store's words (adds_store), so that the sum received is the store's new value.
  struct landing {
    binned::summary words;
    bool direct = false, adds_store = false;
  };
  // A unit's first reduce of the step, on its own, lands in its empty store. A later one on its own
  // is cut at the larger of its agreed top and the top of every reduce of the unit started before it
  // (started_: the same on every rank). Where no rank has one of those still in flight (`busy`, from
  // the summaries' all-gather: the same verdict on every rank), every store holds them all, and slice
  // r of rank r's words carries the store's words for slice r (in replicated shard groups, the first
  // group's only): the collective then returns each store's new value, with no merge pass. Otherwise,
  // and for fused buckets, the words land on the wire and merge when the reduce completes.
  landing landing_of(const std::vector<unit_part<Ctx>>& parts, const std::vector<binned::summary>& agreed,
                     const std::vector<char>& busy) const {
    landing l;
    l.words = parts.size() == 1 ? agreed[0] : binned::summary{};
    if (parts.size() != 1) return l;
    const std::size_t u = parts[0].unit.index;
    if (parts[0].first) {
      l.direct = true;
      return l;
    }
    if (!agreed[0].finite() || agreed[0].bin < 0 || !started_[u].finite()) return l;
    l.words = binned::summary{binned::merge(started_[u], agreed[0]).bin, agreed[0].flags};
    if (busy[0]) return l;
    l.direct = true;
    l.adds_store = ctx_.replica_index == 0;
    return l;
  }
  std::int64_t* store_of(const unit_layout& ul) const { return bins_.data() + K * base(ul); }

  // Every rank counts the reduces it starts: each unit's top so far, in flight, and started this step.
  void note_started(const std::vector<unit_part<Ctx>>& parts, const std::vector<binned::summary>& agreed) {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const std::size_t u = parts[i].unit.index;
      started_[u] = binned::merge(started_[u], agreed[i]);
      ++pending_[u];
      ++reduces_[u];
    }
  }
  // The reduce that exchanges values: rank r's slice of every unit goes to rank r by one all_to_all of
  // the gradient type (a fused bucket's units side by side in each rank's block; a lone unit's bucket
  // is that block already), and rank r cuts and sums the N slices when it completes (complete_exchange).
  in_flight start_exchange(std::vector<unit_part<Ctx>>& parts, const std::vector<binned::summary>& agreed) {
    const zero::layout& lay = ctx_.layout;
    const auto ranks = static_cast<std::size_t>(lay.ranks());
    in_flight f;
    f.first = parts[0].unit;
    f.exchanged = true;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      f.parts.push_back({parts[i].unit, parts[i].first, f.block});
      f.summaries.push_back(agreed[i]);
      f.block += lay.unit(parts[i].unit).shard;
    }
    if (parts.size() == 1) {
      f.sent = std::move(parts[0].bucket);
    } else {
      ctx_.make_room(f.block * ranks * sizeof(grad_type));
      f.sent = buffer<grad_type, system>(f.block * ranks, mem_category::transient, ctx_.acct, uninitialized);
      for (std::size_t i = 0; i < parts.size(); ++i) {
        const std::size_t shard = lay.unit(parts[i].unit).shard;
        for (std::size_t r = 0; r < ranks; ++r)
          ctx_.sys.copy(f.sent.data() + r * f.block + f.parts[i].at, parts[i].bucket.data() + r * shard,
                        shard * sizeof(grad_type));
        parts[i].bucket.reset();
      }
    }
    ctx_.make_room(f.block * ranks * sizeof(grad_type));
    f.values = buffer<grad_type, system>(f.block * ranks, mem_category::transient, ctx_.acct, uninitialized);
    const auto l = ctx_.label(parts.size() > 1 ? "reduce bucket" : "reduce", parts[0].unit);
    f.pending = ctx_.protocol.start_all_to_all(f.sent.data(), f.values.data(), f.block);
    return f;
  }
  // Every rank's values of this rank's slices arrived: each unit's are cut at the larger of its top and
  // the store's, summed with the store's words (the reduces complete in the order they started), and
  // stored, or, at the unit's last reduce of the step, rounded at once into the fp32 gradient. Stage 0
  // keeps every slice: its own one is cut into its part of the store, and at the last reduce the
  // rounded slices are all-gathered (for every unit, a zero or non-finite sum's too: the same calls
  // and bytes every step).
  //
  // With two reduces per step (micro_batches = 2) the first one's values are held instead: copied
  // into the unit's empty store as they are (N slices of g bytes per element fit in its 24 where
  // N g <= 24), and the last reduce cuts all 2N slices at once and rounds them. Words never reach
  // memory: the store is written g N and read g N bytes per element instead of 24 each, and the same
  // integers are summed (the cut of a value does not depend on when it is made).
  void complete_exchange(in_flight& f) {
    const auto ranks = static_cast<std::size_t>(ctx_.layout.ranks()), me = static_cast<std::size_t>(ctx_.rank);
    std::vector<const grad_type*> slices(2 * ranks);
    for (std::size_t i = 0; i < f.parts.size(); ++i) {
      const bucket_part& p = f.parts[i];
      const std::size_t u = p.unit.index;
      const binned::summary before = sums_[u], in = f.summaries[i];
      sums_[u] = binned::merge(before, in);
      const bool last = reduces_[u] == static_cast<std::size_t>(ctx_.reduces_per_step()) && pending_[u] == 0;
      const unit_layout& ul = ctx_.layout.unit(p.unit);
      const std::size_t slice = updates_every_element<P> ? me : 0;  // of the unit's store and fp32 gradient
      std::int64_t* st = store_of(ul) + slice * K * ul.shard;
      float* gradient = grads32_.data() + base(ul);
      // The held values, N slices of the shard: bytes copied in and read as values (the store's words are
      // neither read nor written while it holds them).
      auto* held = reinterpret_cast<grad_type*>(st);
      // Nothing to add where the values are zeros (the store alone is rounded if this is the last
      // reduce), or where the step will be skipped (a non-finite value).
      std::size_t count = in.bin >= 0 ? ranks : 0;
      for (std::size_t r = 0; r < count; ++r) slices[r] = f.values.data() + r * f.block + p.at;
      if (sums_[u].finite() && count > 0 && !last && before.bin < 0 && holds_values()) {
        for (std::size_t r = 0; r < ranks; ++r)
          ctx_.sys.copy(held + r * ul.shard, slices[r], ul.shard * sizeof(grad_type));
        held_[u] = 1;
      } else if (sums_[u].finite() && sums_[u].bin >= 0 && (count > 0 || last || held_[u])) {
        ZERO_CHECK(last || !held_[u], protocol, "rank ", ctx_.rank, ": unit ", u,
                   " holds its first reduce's values, and its second reduce is not the step's last");
        if (held_[u])
          for (std::size_t r = 0; r < ranks; ++r) slices[count++] = held + r * ul.shard;
        float* rounded = last ? gradient + slice * ul.shard : nullptr;
        ctx_.sys.for_each_index(ul.shard, elementwise::binned_cut_sum_rule<grad_type>{
                                              slices.data(), count, sums_[u].bin, held_[u] ? -1 : before.bin, st,
                                              st + ul.shard, st + 2 * ul.shard, rounded});
      }
      rounded_[u] = last;
      if (updates_every_element<P> && last) {
        const auto l = ctx_.label("reduce gather", p.unit);
        ctx_.protocol.all_gather(gradient + me * ul.shard, gradient, ul.shard);
      }
    }
    f.values.reset();
    f.sent.reset();
  }
  // Whether a first reduce's values are held until the second (complete_exchange): two reduces per
  // step, and N slices of the gradient type fit in the store's three words per element.
  bool holds_values() const {
    return ctx_.reduces_per_step() == 2 &&
           static_cast<std::size_t>(ctx_.layout.ranks()) * sizeof(grad_type) <= K * sizeof(std::int64_t);
  }
  // Where unit u's words start in bins_ (three planes of what the rank updates: the shard, or in stage
  // 0 every rank's slice, each as three planes, [rank][plane][shard]) and its fp32 rounding in grads32_.
  std::size_t base(const unit_layout& ul) const { return sharded() ? ul.shard_offset : ul.offset; }
  // Slices of a unit the rank keeps gradients of: all N in stage 0, its own elsewhere.
  std::size_t kept_blocks() const { return updates_every_element<P> ? static_cast<std::size_t>(ctx_.ranks()) : 1; }

  // Adds a completed reduce's words of one unit into the unit's binned sum: both are re-expressed for
  // the larger of their top bins (whole low words drop), then added as integers.
  void merge(const in_flight& f, const bucket_part& part, binned::summary in) {
    const binned::summary before = sums_[part.unit.index];
    binned::summary& sum = sums_[part.unit.index];
    sum = binned::merge(before, in);
    if (f.direct) return;                     // already in the store, which was empty (the summary is now the reduce's)
    if (!sum.finite() || in.bin < 0) return;  // nothing to add: zeros, or a step that will be skipped
    const unit_layout& ul = ctx_.layout.unit(part.unit);
    const elementwise::merge_bins_rule rule{before.bin, in.bin, sum.bin};
    for (std::size_t b = 0; b < kept_blocks(); ++b) {
      std::int64_t* st = bins_.data() + K * base(ul) + b * K * ul.shard;
      const std::int64_t* w = f.wire.data() +
                              (updates_every_element<P> ? b * f.block : static_cast<std::size_t>(ctx_.rank) * f.block) +
                              part.at;
      if (before.bin < 0) {  // the unit's first words of the step: the store holds last step's, not zeros
        ctx_.sys.copy(st, w, K * ul.shard * sizeof(std::int64_t));
        continue;
      }
      ctx_.sys.for_each(ul.shard, rule, elementwise::inout(st), elementwise::inout(st + ul.shard),
                        elementwise::inout(st + 2 * ul.shard), elementwise::in(w), elementwise::in(w + ul.shard),
                        elementwise::in(w + 2 * ul.shard));
    }
  }

  // The groups' agreed summaries merged across the replicas (one all-gather of a word per unit, on
  // the protocol's counter: the replicas' link).
  void agree_across_replicas(std::vector<binned::summary>& agreed, std::vector<char>& busy, unit_id first) {
    const std::size_t count = agreed.size(), reps = static_cast<std::size_t>(ctx_.replica_count);
    const std::size_t me = static_cast<std::size_t>(ctx_.replica_index);
    std::vector<std::int64_t> table(count * reps);
    for (std::size_t i = 0; i < count; ++i) table[me * count + i] = binned::pack(agreed[i]) | (busy[i] ? in_flight_mark : 0);
    ctx_.make_room(table.size() * sizeof(std::int64_t));
    buffer<std::int64_t, system> wire(table.size(), mem_category::transient, ctx_.acct);
    ctx_.sys.copy_from_host(wire.data() + me * count, table.data() + me * count, count * sizeof(std::int64_t));
    {
      const auto l = ctx_.label_on(ctx_.replicas->inner(), "reduce summary across replicas", first);
      ctx_.replicas->all_gather(wire.data() + me * count, wire.data(), count);
    }
    ctx_.sys.copy_to_host(table.data(), wire.data(), table.size() * sizeof(std::int64_t));
    for (std::size_t i = 0; i < count; ++i)
      for (std::size_t r = 0; r < reps; ++r) {
        agreed[i] = binned::merge(agreed[i], binned::unpack(table[r * count + i] & ~in_flight_mark));
        busy[i] |= (table[r * count + i] & in_flight_mark) != 0;
      }
  }
  // Every rank's `n` values, in rank order, through the system's memory (a device backend cannot read
  // host memory in a collective), on the control counter.
  std::vector<std::int64_t> all_gather_control(const std::int64_t* mine, std::size_t n) {
    const auto ranks = static_cast<std::size_t>(ctx_.ranks()), me = static_cast<std::size_t>(ctx_.rank);
    std::vector<std::int64_t> all(n * ranks);
    buffer<std::int64_t, system> wire(n * ranks, mem_category::transient, ctx_.acct);
    ctx_.sys.copy_from_host(wire.data() + me * n, mine, n * sizeof(std::int64_t));
    const comm::scoped_label<typename Ctx::comm_backend> l(ctx_.protocol.inner(), "grad norm");
    ctx_.control.all_gather(wire.data() + me * n, wire.data(), n);
    ctx_.sys.copy_to_host(all.data(), wire.data(), all.size() * sizeof(std::int64_t));
    return all;
  }

  // The system's binned reductions. The catalog leaves this reducer out of an engine whose system has
  // none, so these are only compiled where they exist.
  std::int64_t summary_of(const grad_type* g, std::size_t n) const { return ctx_.sys.binned_summary(g, n); }
  std::int64_t square_summary(const std::vector<const float*>& segments, const std::vector<std::size_t>& sizes,
                              float divisor) const {
    return ctx_.sys.binned_square_summary(segments.data(), sizes.data(), segments.size(), divisor);
  }
  void sum_of_squares_words(const std::vector<const float*>& segments, const std::vector<std::size_t>& sizes,
                            float divisor, int top, std::int64_t* words) const {
    ctx_.sys.binned_sum_of_squares(segments.data(), sizes.data(), segments.size(), divisor, top, words);
  }

  Ctx& ctx_;
  buffer<std::int64_t, system> bins_;  // the binned sums (binned::words planes per unit)
  buffer<float, system> grads32_;      // their fp32 rounding, what the norm and the optimizer read
  // Each unit's summary of every gradient value reduced into its binned sum in this step (its top bin;
  // -1 while the sum is empty), the same on every rank.
  std::vector<binned::summary> sums_;
  // Each unit's summary of every reduce started in this step (sums_ once they all complete), and how
  // many of its reduces are in flight on this rank.
  std::vector<binned::summary> started_;
  std::vector<std::size_t> pending_;
  // Each unit's reduces started in this step, and whether its last one already rounded the sum into
  // grads32_ (settle skips it).
  std::vector<std::size_t> reduces_;
  std::vector<char> rounded_;
  // Whether a unit's store holds its first reduce's values, not words (complete_exchange).
  std::vector<char> held_;
  // Set in a summary's word on the wire (above its flags) by a rank with a reduce of the unit in flight.
  static constexpr std::int64_t in_flight_mark = std::int64_t{1} << 48;
};

template <class Ctx>
using binned_reducer = reducer<Ctx, binned_method<Ctx>>;

}  // namespace zero::reduce
