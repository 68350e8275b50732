// Set-up: the model's initial values, whole tensors or ranges, produced on every rank or broadcast from rank 0.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zero/core/hash.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/init.hpp"
#include "zero/engine/parameters.hpp"
#include "zero/engine/rank_agreement.hpp"
#include "zero/engine/sweep.hpp"

namespace zero {

// engine::initialize's two forms (engine/init.hpp has the init functions): each value goes where this
// rank keeps it (its parameters and master weights), checked against the other ranks' where several
// ranks produce it (rank_agreement::check_init), and the units kept whole refreshed where a rank
// produced only its slices.
template <class Ctx, class Opt>
class initializer {
 public:
  using system = typename Ctx::system;
  using P = typename Ctx::partitioner;

  initializer(Ctx& c, parameter_placement<Ctx>& params, optimizer_sweep<Ctx, Opt>& sweep,
              rank_agreement<Ctx, Opt>& agreement)
      : ctx_(c), params_(params), sweep_(sweep), agreement_(agreement) {}

  // Fills every tensor from fn; a collective. With every_rank, every rank produces every value, so
  // the engine then checks that they agree (check_init_agreement: one hash per tensor, all-gathered;
  // engine_options::verify_init) and throws on every rank, naming the first tensor that differs.
  void whole(const init_fn& fn, init_source source) {
    std::vector<float> host;
    const bool check = ctx_.options.verify_init && source == init_source::every_rank && ctx_.dp_size() > 1;
    std::vector<std::uint64_t> hashes;
    mesh_values stored;
    for (std::size_t u = 0; u < ctx_.spec.num_units(); ++u) {
      const unit_spec& us = ctx_.spec.units()[u];
      for (std::size_t t = 0; t < us.tensors.size(); ++t) {
        const tensor_spec& ts = us.tensors[t];
        host.assign(ts.numel, 0.0f);
        if (source == init_source::every_rank || ctx_.dp_rank() == 0) fn(us, ts, std::span<float>(host));
        if (check) hashes.push_back(run_hash64(host.data(), host.size() * sizeof(float)));
        if (source == init_source::broadcast_from_rank0) {
          const auto l = ctx_.label("init", unit_id{u});
          buffer<float, system> wire(ts.numel, mem_category::transient, ctx_.acct);
          ctx_.sys.copy_from_host(wire.data(), host.data(), ts.numel * sizeof(float));
          ctx_.setup().broadcast(wire.data(), wire.data(), ts.numel, 0);
          ctx_.sys.copy_to_host(host.data(), wire.data(), ts.numel * sizeof(float));
        }
        store(unit_id{u}, ctx_.layout.unit(unit_id{u}).tensors[t], host.data());
        stored.add(host.data(), host.size());
      }
    }
    if (mesh_check())
      agreement_.check_mesh_init(stored.hashes, stored.constant, check);
    else if (check)
      agreement_.check_init(hashes);
  }

  // Fills what this rank keeps from fn, chunk by chunk (at most options().init_chunk_elements values
  // per call, which bounds the host staging); a collective. With every_rank, each rank asks only for
  // the elements whose master weights it holds (held_range: its owned slice where optimizer states are
  // sharded), so the work and the staging per rank fall with N; stages 1 and 2, which replicate the
  // parameters, then all-gather them as step() does, rather than every rank producing all of them.
  // With broadcast_from_rank0, rank 0 produces every chunk and broadcasts it, and every rank keeps its
  // part. Either way the result equals initialize() with the same values as whole tensors, bit for bit.
  // With every_rank, a value is produced by more than one rank only where the master weights are
  // replicated (stage 0: every rank produces the whole model); there the engine checks agreement as
  // the whole-tensor form does. In stages 1-3 each element is produced by exactly one rank (its
  // owner) and reaches the others, if at all, by the all-gather: nothing can disagree, nothing is checked,
  // except with replicated shard groups, where each group's owner produces it: checked across groups.
  void by_range(const init_range_fn& fn, init_source source) {
    const std::size_t chunk = ctx_.options.init_chunk_elements;
    std::vector<float> host;
    const bool broadcast = source == init_source::broadcast_from_rank0;
    const bool check = ctx_.options.verify_init && !broadcast &&
                       (!P::shards_optimizer_states || ctx_.replica_count > 1) && ctx_.dp_size() > 1;
    std::vector<std::uint64_t> hashes;
    mesh_values stored;
    buffer<float, system> wire;
    for (std::size_t u = 0; u < ctx_.spec.num_units(); ++u) {
      const unit_spec& us = ctx_.spec.units()[u];
      const unit_layout& ul = ctx_.layout.unit(unit_id{u});
      const range keep = broadcast ? range{0, ul.numel} : sweep_.update_range(unit_id{u});
      for (std::size_t t = 0; t < us.tensors.size(); ++t) {
        const range tr = ul.tensors[t];
        // The tensor's hash, chained over its chunks in order (the chunks are the same on every rank).
        std::uint64_t h = 0;
        stored.begin_tensor();
        for_each_chunk(intersect(tr, keep), chunk, [&](range c) {
          const range local{c.begin - tr.begin, c.end - tr.begin};  // what the init function sees
          host.resize(std::max(host.size(), c.size()));
          if (!broadcast || ctx_.dp_rank() == 0) fn(us, us.tensors[t], local, std::span<float>(host.data(), c.size()));
          if (broadcast) {
            if (wire.empty())
              wire = buffer<float, system>(std::min(chunk, largest_tensor()), mem_category::transient, ctx_.acct);
            ctx_.sys.copy_from_host(wire.data(), host.data(), c.size() * sizeof(float));
            const auto l = ctx_.label("init", unit_id{u});
            ctx_.setup().broadcast(wire.data(), wire.data(), c.size(), 0);
            ctx_.sys.copy_to_host(host.data(), wire.data(), c.size() * sizeof(float));
          }
          if (check) h = run_hash64(host.data(), c.size() * sizeof(float), h);
          store(unit_id{u}, c, host.data());
          stored.chain(host.data(), c.size());
        });
        if (check) hashes.push_back(h);
      }
    }
    // Each rank hashed what it keeps: its slice where the states are sharded, the same in every group.
    const int period = P::shards_optimizer_states ? ctx_.ranks() : 1;
    if (mesh_check())
      agreement_.check_mesh_init(stored.hashes, stored.constant, check, period);
    else if (check)
      agreement_.check_init(hashes, period);
    // Each rank stored only what it keeps: the units kept whole gather the other ranks' slices.
    if (!broadcast) params_.refresh_whole(ctx_.other, "parameter refresh");
  }

 private:
  // In a tensor-parallel mesh (verify_init): what each tensor's stored values were, for the check
  // of the whole mesh (rank_agreement::check_mesh_init): their hash, chained over the chunks this rank
  // stored, and whether they were all one value.
  struct mesh_values {
    std::vector<std::uint64_t> hashes;
    std::vector<bool> constant;
    std::uint32_t first_bits = 0;
    bool seen = false;
    void begin_tensor() {
      hashes.push_back(0);
      constant.push_back(true);
      seen = false;
    }
    void chain(const float* v, std::size_t n) {
      if (n == 0) return;
      hashes.back() = run_hash64(v, n * sizeof(float), hashes.back());
      if (!seen) first_bits = std::bit_cast<std::uint32_t>(v[0]);
      seen = true;
      if (constant.back())
        for (std::size_t i = 0; i < n; ++i)
          if (std::bit_cast<std::uint32_t>(v[i]) != first_bits) {
            constant.back() = false;
            break;
          }
    }
    void add(const float* v, std::size_t n) {
      begin_tensor();
      chain(v, n);
    }
  };
  bool mesh_check() const { return ctx_.tp_size > 1 && ctx_.options.verify_init; }

  // Initial values of the unit-local elements r (values[i] is element r.begin + i) into whatever part
  // of them the parameters and the master weights this rank holds.
  void store(unit_id u, range r, const float* values) {
    params_.store_initial(u, r, values);
    sweep_.store_initial(u, r, values);
  }
  std::size_t largest_tensor() const {
    std::size_t m = 0;
    for (const auto& us : ctx_.spec.units())
      for (const auto& ts : us.tensors) m = std::max(m, ts.numel);
    return m;
  }

  Ctx& ctx_;
  parameter_placement<Ctx>& params_;
  optimizer_sweep<Ctx, Opt>& sweep_;
  rank_agreement<Ctx, Opt>& agreement_;
};

}  // namespace zero
