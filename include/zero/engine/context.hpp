// What the engine's parts work with: the engine's system, memory account, layout, options and links.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "zero/comm/call_label.hpp"
#include "zero/comm/counted.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/reports.hpp"
#include "zero/error.hpp"

namespace zero {

// The engine's services, by reference: each part (a gradient reducer, the parameter store, the
// optimizer sweep, the ranks' agreement) owns its own state and reaches everything else through
// this. The engine builds one context and keeps it alive for as long as its parts.
template <class P, class Comm, class Prec>
struct part_context {
  using partitioner = P;
  using comm_backend = Comm;
  using precision = Prec;
  using system = typename Comm::system;
  using param_type = typename Prec::param_type;
  using grad_type = typename Prec::grad_type;
  using comm_type = typename Prec::comm_type;
  using link = comm::counted<Comm>;
  using request = typename link::request;
  // Whether the system's memory is host memory (a device system's is not: its words travel through
  // copies).
  static constexpr bool host_memory = requires { requires system::host_addressable; };

  system& sys;
  memory_accounting& acct;
  const zero::layout& layout;
  const model_spec& spec;
  const engine_options& options;
  int rank;
  link& protocol;  // the protocol's traffic (the formulas count it)
  link& other;     // set-up and consolidation traffic
  link& control;   // the norm's all-reduce and the optimizer's fingerprint
  link& eval;      // gathers inside evaluation() scopes
  overlap_report& overlap;
  // ZeRO++'s node links (engine_options::zeropp): the node's ranks and the ranks of this rank's
  // position in every node; null where the options need none.
  Comm* node_backend = nullptr;
  link* node = nullptr;
  Comm* cross_backend = nullptr;
  link* cross = nullptr;
  // The tensor-parallel group of an engine built over comm::mesh (tensor_parallel.hpp): its link (the
  // norm's exchange, the whole-model consolidation), the world's backend (agreement checks of the whole
  // mesh), the group's size and this rank's index in it. A plain engine has a group of one: no link.
  link* tp = nullptr;
  Comm* world = nullptr;
  int tp_size = 1;
  int tp_rank = 0;
  // Replicated shard groups (engine_options::shard_group_size, engine/replica_groups.hpp): the layout
  // and the links above are the shard group's; `replicas` links this rank to its position in every
  // group (the reduced gradients' all-reduce: protocol traffic, all of it between groups);
  // `everyone` is the whole data-parallel group (the init broadcast and check: set-up traffic) and
  // `everyone_control` the same ranks for the optimizer's fingerprint. Null without replicas.
  link* replicas = nullptr;
  link* everyone = nullptr;
  link* everyone_control = nullptr;
  int replica_count = 1;
  int replica_index = 0;
  // Frees room for `bytes` more under memory_limit_bytes (completes reduces in flight, drops
  // prefetches): the engine's schedule, which a part calls before each transient allocation.
  std::function<void(std::size_t)> make_room{};
  // Whether `bytes` more fit under memory_limit_bytes beside what the reduces in flight keep free to
  // complete (without making room: a prefetch that does not fit is not started).
  std::function<bool(std::size_t)> has_room{};

  int ranks() const { return layout.ranks(); }
  // The whole data-parallel group: R x S ranks, this one at replica_index x S + rank.
  int dp_size() const { return replica_count * layout.ranks(); }
  int dp_rank() const { return replica_index * layout.ranks() + rank; }
  // Where set-up collectives that every data-parallel rank must share run: the whole group.
  link& setup() const { return everyone ? *everyone : other; }
  int reduces_per_step() const {
    return options.accumulate == accumulation::reduce_each_micro_batch ? options.micro_batches : 1;
  }
  int node_size() const { return options.zeropp.node_size == 0 ? layout.ranks() : options.zeropp.node_size; }
  // qgZ in two hops: nodes of more than one rank, more than one node.
  bool hierarchical() const { return options.zeropp.qgz && node_size() > 1 && node_size() < layout.ranks(); }
  bool overlapping() const { return options.overlap && protocol.overlaps(); }
  // Names the collectives issued while the guard lives ("reduce unit 'fc2'").
  comm::scoped_label<Comm> label(const char* phase, unit_id u) const { return label_on(protocol.inner(), phase, u); }
  comm::scoped_label<Comm> label_on(Comm& c, const char* phase, unit_id u) const {
    return comm::scoped_label<Comm>(c, phase, spec.units()[u.index].name);
  }
  std::string where(unit_id u) const {
    return detail::concat("rank ", rank, ", unit '", spec.units()[u.index].name, "': ");
  }
};

}  // namespace zero
