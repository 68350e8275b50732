// The summing reducers' method: reduced gradients summed into a persistent store, over a wire (exact or qgZ).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "zero/concepts/gradient_reducer.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/engine/agreement.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/reduce/reducer.hpp"
#include "zero/engine/tensor_parallel.hpp"

namespace zero::reduce {

// A summing reduce whose collective may still be in flight: the units its bucket carries (in reduce
// order), the bucket (empty, with no parts, where the persistent store was reduced in place) and the
// wire's state. The request is declared last: destroyed, and so waited for, before the buffers it writes.
// One type per wire state, not per wire: wires that share a state share its code.
template <class Ctx, class WireState>
struct summing_in_flight {
  std::vector<bucket_part> parts;
  buffer<typename Ctx::grad_type, typename Ctx::system> bucket;
  WireState wire;
  // Where this rank's reduced elements land (in the bucket or the store), and how many: what the
  // replicas' all-reduce sums (engine_options::shard_group_size).
  typename Ctx::grad_type* reduced = nullptr;
  std::size_t reduced_count = 0;
  unit_id first{};  // the first unit it carries, to label the collectives
  typename Ctx::request pending{};
};

// What every summing reducer does whatever its wire: the persistent store of the precision's gradient
// type, or fp32 under fp32_grad_accumulation (the whole model in stages 0-1, this rank's slices in
// 2-3); the micro-batches of a step added into it in fp32 and rounded once; the fused bucket's layout;
// the norm. Compiled once per engine, however many wires its catalog holds.
template <class Ctx>
class summing_store {
 public:
  using P = typename Ctx::partitioner;
  using system = typename Ctx::system;
  using grad_type = typename Ctx::grad_type;
  static constexpr bool store_sharded = P::shards_gradients;
  static std::size_t grad_bytes(const engine_options& o) {
    return o.fp32_grad_accumulation ? sizeof(float) : sizeof(grad_type);
  }
  // Kernels write a transient bucket per micro-batch instead of the persistent store where gradients
  // are sharded, and where several reduced micro-batches must be added up.
  static bool uses_bucket(const Ctx& c) { return P::shards_gradients || c.reduces_per_step() > 1; }

  explicit summing_store(Ctx& c) : ctx_(c), grads_(store<grad_type>(c, false)), grads32_(store<float>(c, true)) {}

  grad_type* persistent_gradient(unit_id u) { return grads_.data() + ctx_.layout.unit(u).offset; }

  // Sum of squares of the averaged, unscaled gradient over real elements, identical on every rank
  // and in every stage: each rank sums its owned slice unit by unit, and the partial sums are added in
  // rank order (by the all-reduce, or locally over the N slices where gradients are replicated).
  norm_result sum_of_squares(float divisor, const agreement_terms& a) {
    if (ctx_.tp_size > 1) return mesh_sum_of_squares(divisor, a);
    const zero::layout& lay = ctx_.layout;
    // Rank r's slices of every unit, summed by one call of the system (a device system waits once).
    auto partial = [&](int r) {
      double acc = 0.0;
      with_store([&](const auto& store) {
        using T = std::remove_pointer_t<decltype(store.data())>;
        std::vector<const T*> segments;
        std::vector<std::size_t> sizes;
        for (std::size_t u = 0; u < lay.num_units(); ++u) {
          const unit_layout& ul = lay.unit(unit_id{u});
          const range o = lay.owned_real(unit_id{u}, r);
          if (o.empty()) continue;
          segments.push_back(store.data() + element_index(ul, o.begin, P::shards_gradients, r));
          sizes.push_back(o.size());
        }
        acc = ctx_.sys.sum_of_squares(segments.data(), sizes.data(), segments.size(), divisor);
      });
      return acc;
    };
    if constexpr (P::shards_optimizer_states) {
      // The partial sum and the optimizer's fingerprint (agreement.hpp) in one all-reduce, through the
      // system's memory: a device backend cannot read a host variable in a collective.
      std::array<double, 1 + detail::fingerprint_words> v{partial(ctx_.rank)};
      std::copy(a.fingerprint, a.fingerprint + detail::fingerprint_words, v.begin() + 1);
      buffer<double, system> wire(v.size(), mem_category::transient, ctx_.acct);
      ctx_.sys.copy_from_host(wire.data(), v.data(), sizeof v);
      {
        const comm::scoped_label<typename Ctx::comm_backend> l(ctx_.protocol.inner(), "grad norm");
        ctx_.control.all_reduce(wire.data(), wire.data(), v.size(), reduce_op::sum);
      }
      ctx_.sys.copy_to_host(v.data(), wire.data(), sizeof v);
      return {v[0], detail::fingerprints_agree(a.fingerprint, v.data() + 1, lay.ranks())};
    } else {
      // Replicated gradients: the same N partial sums the sharded stages compute, added the same way.
      double total = partial(0);
      for (int r = 1; r < lay.ranks(); ++r) total += partial(r);
      return {total, true};
    }
  }
  // In a tensor-parallel mesh: the same sums kept apart for the split tensors' pieces and the
  // replicated tensors (one call of the system each), and combined over the mesh
  // (engine/tensor_parallel.hpp): the split sums in tensor-parallel rank order, the replicated once.
  norm_result mesh_sum_of_squares(float divisor, const agreement_terms& a) {
    namespace tpd = tensor_parallel_detail;
    const zero::layout& lay = ctx_.layout;
    auto partial = [&](int r) {
      std::array<double, 2> acc{};
      with_store([&](const auto& store) {
        using T = std::remove_pointer_t<decltype(store.data())>;
        std::array<std::vector<const T*>, 2> segments;  // [0]: split, [1]: replicated
        std::array<std::vector<std::size_t>, 2> sizes;
        for (std::size_t u = 0; u < lay.num_units(); ++u) {
          const unit_layout& ul = lay.unit(unit_id{u});
          tpd::for_each_tensor_part(ctx_.spec.units()[u], ul, lay.owned_real(unit_id{u}, r), [&](range p, bool split) {
            segments[split ? 0 : 1].push_back(store.data() + element_index(ul, p.begin, P::shards_gradients, r));
            sizes[split ? 0 : 1].push_back(p.size());
          });
        }
        for (std::size_t k = 0; k < 2; ++k)
          acc[k] = ctx_.sys.sum_of_squares(segments[k].data(), sizes[k].data(), segments[k].size(), divisor);
      });
      return acc;
    };
    tpd::norm_parts parts{0.0, 0.0, a.agreed};
    if constexpr (P::shards_optimizer_states) {
      std::array<double, 2 + detail::fingerprint_words> v{};
      const auto mine = partial(ctx_.rank);
      v[0] = mine[0];
      v[1] = mine[1];
      std::copy(a.fingerprint, a.fingerprint + detail::fingerprint_words, v.begin() + 2);
      buffer<double, system> wire(v.size(), mem_category::transient, ctx_.acct);
      ctx_.sys.copy_from_host(wire.data(), v.data(), sizeof v);
      {
        const comm::scoped_label<typename Ctx::comm_backend> l(ctx_.protocol.inner(), "grad norm");
        ctx_.control.all_reduce(wire.data(), wire.data(), v.size(), reduce_op::sum);
      }
      ctx_.sys.copy_to_host(v.data(), wire.data(), sizeof v);
      parts = {v[0], v[1], a.agreed && detail::fingerprints_agree(a.fingerprint, v.data() + 2, lay.ranks())};
    } else {
      for (int r = 0; r < lay.ranks(); ++r) {
        const auto p = partial(r);
        parts.split += p[0];
        parts.replicated += p[1];
      }
    }
    return tpd::combine_norm(ctx_, parts, a.optimizer_hash);
  }
  // Every data-parallel rank's gradient is in the sum: replicas included.
  std::size_t averaging_count() const { return static_cast<std::size_t>(ctx_.dp_size()); }
  // Calls f with the store's base: fp32 or the precision's gradient type.
  template <class F>
  void with_gradients(F&& f) const {
    if (ctx_.options.fp32_grad_accumulation)
      f(static_cast<const float*>(grads32_.data()));
    else
      f(static_cast<const grad_type*>(grads_.data()));
  }
  void clear(bool updated_zeroed) {
    with_store([&](auto& store) {
      if (updated_zeroed)
        zero_all_but_updated(ctx_, store.data(), store.size(), store_sharded);
      else
        ctx_.sys.fill_zero(store.data(), store.size() * sizeof(*store.data()));
    });
  }

 protected:
  // One unit's reduce: its bucket (or none: the persistent store, reduced in place) moved into
  // `parts` and `bucket`; returns where the collective reduces.
  grad_type* single(unit_part<Ctx>& p, std::vector<bucket_part>& parts, buffer<grad_type, system>& bucket) {
    const zero::layout& lay = ctx_.layout;
    bucket = std::move(p.bucket);
    if (!bucket.empty())
      parts.push_back({p.unit, p.first, updates_every_element<P> ? 0 : lay.owned(p.unit, ctx_.rank).begin});
    return uses_bucket(ctx_) ? bucket.data() : grads_.data() + lay.unit(p.unit).offset;
  }
  // Several units (a fused bucket) interleaved into one buffer, rank r's slices of every unit side by
  // side at [r S, (r+1) S) (S = the sum of their shards), so each rank receives its slices together;
  // each element is summed over the ranks in rank order as in a unit's own collective: the same bits.
  // Returns S; the units in `units`, each one's bucket freed once copied.
  std::size_t fuse(std::vector<unit_part<Ctx>>& in, std::vector<unit_id>& units, std::vector<bucket_part>& parts,
                   buffer<grad_type, system>& bucket) {
    const zero::layout& lay = ctx_.layout;
    std::size_t shard_sum = 0;
    for (const auto& p : in) {
      shard_sum += lay.unit(p.unit).shard;
      units.push_back(p.unit);
    }
    const auto ranks = static_cast<std::size_t>(lay.ranks());
    ctx_.make_room(shard_sum * ranks * sizeof(grad_type));
    bucket = buffer<grad_type, system>(shard_sum * ranks, mem_category::transient, ctx_.acct, uninitialized);
    std::size_t off = 0;
    for (auto& p : in) {
      const std::size_t shard = lay.unit(p.unit).shard;
      for (std::size_t r = 0; r < ranks; ++r)
        ctx_.sys.copy(bucket.data() + r * shard_sum + off, p.bucket.data() + r * shard, shard * sizeof(grad_type));
      parts.push_back({p.unit, p.first, static_cast<std::size_t>(ctx_.rank) * shard_sum + off});
      off += shard;
      p.bucket.reset();  // copied: freed before the collective starts
    }
    return shard_sum;
  }
  // With replicated shard groups: this rank's reduced elements summed with the same position's in
  // every group (in replica order, after the in-group sum), so every replica holds the same sum.
  void across_replicas(grad_type* reduced, std::size_t count, unit_id u) {
    if (!ctx_.replicas || count == 0) return;
    const auto l = ctx_.label_on(ctx_.replicas->inner(), "reduce across replicas", u);
    ctx_.replicas->all_reduce(reduced, reduced, count, reduce_op::sum);
  }
  // Adds each unit's reduced elements of a completed reduce into the store.
  void add_reduced(const std::vector<bucket_part>& parts, const grad_type* bucket) {
    for (const auto& part : parts) {
      const unit_layout& ul = ctx_.layout.unit(part.unit);
      const std::size_t from = updates_every_element<P> ? 0 : ctx_.layout.owned(part.unit, ctx_.rank).begin;
      const std::size_t count = updates_every_element<P> ? ul.padded : ul.shard;
      with_store([&](auto& store) { store_reduced(store, ul, from, bucket + part.at, count, part.first); });
    }
  }

  Ctx& ctx_;

 private:
  // The persistent store: of type T where the options choose it (fp32 under fp32_grad_accumulation).
  template <class T>
  static buffer<T, system> store(Ctx& c, bool fp32) {
    if (c.options.fp32_grad_accumulation != fp32) return {};
    return buffer<T, system>(P::shards_gradients ? c.layout.shard_total() : c.layout.padded(), mem_category::grads,
                             c.acct);
  }
  template <class F>
  void with_store(F f) {
    if (ctx_.options.fp32_grad_accumulation)
      f(grads32_);
    else
      f(grads_);
  }
  // Stores (first micro-batch) or adds (later ones, in fp32, rounded once) `count` reduced elements
  // starting at unit-local element `from` into the store. A copy, not an add into zeros, for the
  // first: 0 + (-0) would turn a negative zero positive.
  template <class S>
  void store_reduced(S& store, const unit_layout& ul, std::size_t from, const grad_type* src, std::size_t count,
                     bool first) {
    using T = std::remove_pointer_t<decltype(store.data())>;
    T* dst = store.data() + element_index(ul, from, P::shards_gradients, ctx_.rank);
    ctx_.sys.for_each(count, elementwise::accumulate_rule{first}, elementwise::operand<T>{dst, !first, true},
                      elementwise::in(src));
  }

  buffer<grad_type, system> grads_;
  buffer<float, system> grads32_;  // instead of grads_ under fp32_grad_accumulation
};

// Gradients summed over the ranks by a collective (Wire: the rank-ordered reduce-scatter, or qgZ's
// quantized exchange; stage 0 all-reduces whatever the wire) into the summing store.
//
// Wire requirements: name, available, chosen(options), accept(ctx) as for a reducer, and
// extra_state_bytes(options, padded) (what it keeps between steps, in the gradient category); built
// from the context once (Wire w(ctx): state it keeps across steps, such as an error buffer, is its
// own); `state`, what a reduce in flight carries besides its bucket; w.start(state, units, g, count)
// -> request (g's N slices of `count` elements, slice k for rank k, into this rank's slice in place;
// each slice holds the units' shards side by side, in the order of `units`); w.wait(state, request&);
// w.finish(state) (the wire's work after the collective, e.g. dequantize and sum);
// w.completion_bytes(const state&) (the transient bytes finish allocates beyond what the state holds:
// the reducer keeps them free while the reduce is in flight).
template <class Ctx, class Wire>
class summing : public summing_store<Ctx> {
  using base = summing_store<Ctx>;
  using base::ctx_;

 public:
  using P = typename Ctx::partitioner;
  using grad_type = typename Ctx::grad_type;
  using in_flight = summing_in_flight<Ctx, typename Wire::state>;
  static constexpr const char* name = Wire::name;
  static constexpr bool available = Wire::available;
  static bool chosen(const engine_options& o) { return Wire::chosen(o); }
  static void accept(const Ctx& c) { Wire::accept(c); }
  static std::uint64_t extra_state_bytes(const engine_options& o, std::uint64_t padded) {
    return Wire::extra_state_bytes(o, padded);
  }

  explicit summing(Ctx& c) : base(c), wire_(c) {}

  // One unit reduces from its bucket, or in place in the persistent store; several (a fused bucket)
  // from one buffer of their interleaved slices.
  in_flight start(std::vector<unit_part<Ctx>> parts) {
    in_flight f;
    if (parts.size() == 1) {
      const unit_id u = parts[0].unit;
      f.first = u;
      grad_type* g = base::single(parts[0], f.parts, f.bucket);
      const unit_layout& ul = ctx_.layout.unit(u);
      const auto l = ctx_.label("reduce", u);
      if constexpr (updates_every_element<P>) {
        f.pending = ctx_.protocol.start_all_reduce(g, g, ul.padded, reduce_op::sum);
        f.reduced = g, f.reduced_count = ul.padded;
      } else {
        f.pending = wire_.start(f.wire, {u}, g, ul.shard);
        f.reduced = g + static_cast<std::size_t>(ctx_.rank) * ul.shard, f.reduced_count = ul.shard;
      }
      return f;
    }
    std::vector<unit_id> units;
    const std::size_t shard_sum = base::fuse(parts, units, f.parts, f.bucket);
    f.first = units.front();
    const auto l = ctx_.label("reduce bucket", units.front());
    f.pending = wire_.start(f.wire, units, f.bucket.data(), shard_sum);
    f.reduced = f.bucket.data() + static_cast<std::size_t>(ctx_.rank) * shard_sum, f.reduced_count = shard_sum;
    return f;
  }

  // Waits for the collective and adds each unit's reduced elements into the store.
  void complete(in_flight& f) {
    wire_.wait(f.wire, f.pending);
    wire_.finish(f.wire);
    base::across_replicas(f.reduced, f.reduced_count, f.first);
    base::add_reduced(f.parts, f.bucket.data());
  }
  void settle() {}
  // What complete(f) allocates beyond what f holds: the wire's finish.
  std::size_t completion_bytes(const in_flight& f) const { return wire_.completion_bytes(f.wire); }

 private:
  Wire wire_;
};

}  // namespace zero::reduce
