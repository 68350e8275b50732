// ZeRO++'s node links: the backend split into the node's ranks and into the ranks of one position in every node.
#pragma once

#include <memory>
#include <optional>

#include "zero/comm/counted.hpp"
#include "zero/comm/split.hpp"
#include "zero/engine/context.hpp"

namespace zero {

// hpZ gathers from the node's ranks; two-hop qgZ exchanges first within the node, then across nodes
// between the ranks of this rank's position. Both links are split from the protocol's backend once,
// after the model states exist (the splits are collectives, made by every rank), and published in the
// context (ctx.node, ctx.cross) for the parts that use them. Their traffic is protocol traffic.
template <class Ctx>
class node_links {
  using Comm = typename Ctx::comm_backend;
  using link = typename Ctx::link;

 public:
  // Splits what the options need: the node's ranks for hpZ or two-hop qgZ, and the cross-node ranks
  // of this position for two-hop qgZ. A backend without split() is refused before (check_zeropp).
  void connect(Ctx& ctx) {
    const int g = ctx.node_size();
    if (!(ctx.options.zeropp.hpz || ctx.hierarchical())) return;
    if constexpr (comm::splittable<Comm>) {
      node_backend_ = ctx.protocol.inner().split(ctx.rank / g);
      node_.emplace(*node_backend_);  // one node: all of its traffic is intra-node
      ctx.node_backend = node_backend_.get();
      ctx.node = &*node_;
      if (ctx.hierarchical()) {
        cross_backend_ = ctx.protocol.inner().split(ctx.rank % g);
        cross_.emplace(*cross_backend_);
        cross_->set_node_size(1);  // one rank per node: all of it is inter-node
        ctx.cross_backend = cross_backend_.get();
        ctx.cross = &*cross_;
      }
    }
  }
  // Their traffic, added to the protocol's.
  comm::comm_stats add_to(comm::comm_stats s) const {
    if (node_) s = s + node_->stats();
    if (cross_) s = s + cross_->stats();
    return s;
  }

 private:
  std::unique_ptr<Comm> node_backend_, cross_backend_;  // before the counters over them
  std::optional<link> node_, cross_;
};

}  // namespace zero
