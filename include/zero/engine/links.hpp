// links: the engine's topology: the groups it runs over (shard group, replicas, tensor-parallel group, ZeRO++'s nodes) and a counted link per kind of traffic.
#pragma once

#include <cstdint>
#include <memory>

#include "zero/comm/counted.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/node_links.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/replica_groups.hpp"
#include "zero/engine/reports.hpp"
#include "zero/error.hpp"

namespace zero {

// Which group does what, in one place. The engine's data-parallel backend is split, where the options
// say so, into the shard group ZeRO partitions over (engine_options::shard_group_size) and its
// replicas; the protocol (gathers, reduces, the step's all-gathers), the set-up, the step's control
// collectives and the evaluation() gathers each run on a counted link over the shard group, so that
// each kind of traffic is reported apart; the replicas' all-reduce of the reduced slices, a
// tensor-parallel group (an engine over comm::mesh) and ZeRO++'s node links (engine/node_links.hpp)
// get links of their own. The parts reach them through the context (engine/context.hpp), which this
// fills in as the groups come to exist: the tensor-parallel group and the replicas' place before any
// collective, the splits once the ranks agree on their settings.
template <class Ctx>
class engine_links {
  using Comm = typename Ctx::comm_backend;
  using link = typename Ctx::link;

 public:
  // Before any collective: the counted links over the whole data-parallel backend `dp` (moved to the
  // shard group by connect_replicas()), and over `tp_group` in a tensor-parallel mesh.
  engine_links(Comm& dp, Comm* tp_group, int shard_group_size)
      : groups_(dp, shard_group_size),
        protocol_(dp),
        other_(dp),
        control_(dp),
        eval_(dp),
        tp_(tp_group ? std::make_unique<link>(*tp_group) : nullptr),
        everyone_(groups_.count() > 1 ? std::make_unique<link>(dp) : nullptr),
        everyone_control_(groups_.count() > 1 ? std::make_unique<link>(dp) : nullptr) {}
  engine_links(const engine_links&) = delete;
  engine_links& operator=(const engine_links&) = delete;

  const replica_groups<Comm>& groups() const { return groups_; }
  link& protocol() { return protocol_; }  // what the formulas count
  link& other() { return other_; }        // set-up and consolidation
  link& control() { return control_; }    // the norm's all-reduce, the fingerprint, the optimizer's exchange
  link& eval() { return eval_; }          // gathers inside evaluation() scopes
  const link& protocol() const { return protocol_; }
  const link& control() const { return control_; }

  // Before any collective: the context learns the tensor-parallel group (`world`: the whole mesh's
  // backend) and this rank's place among the replicas. They compose: in a mesh, the data-parallel
  // group is split into shard groups and replicas as a plain engine's is, and the agreement checks stay
  // the whole mesh's; ZeRO++'s nodes (connect_nodes) are nodes of the shard group, which its links
  // run over by then.
  void enter(Ctx& ctx, Comm* world) {
    if (groups_.count() > 1) {
      ctx.everyone = everyone_.get();
      ctx.everyone_control = everyone_control_.get();
      ctx.replica_count = groups_.count();
      ctx.replica_index = groups_.index();
    }
    if (tp_) {
      ctx.tp = tp_.get();
      ctx.world = world;
      ctx.tp_size = tp_->inner().size();
      ctx.tp_rank = tp_->inner().rank();
    }
  }
  // Once the ranks agree on the groups (a collective where there are replicas): the splits, the four
  // links moved to the shard group, and the replicas' link (all of its traffic between groups, a group
  // being a node).
  void connect_replicas(Ctx& ctx) {
    if (groups_.count() == 1) return;
    groups_.split();
    for (link* c : {&protocol_, &other_, &control_, &eval_}) c->rebind(groups_.shard());
    replicas_ = std::make_unique<link>(*groups_.replicas());
    replicas_->set_node_size(1);
    ctx.replicas = replicas_.get();
  }
  // After the model states exist: tells the counters where the nodes are, and splits ZeRO++'s node
  // links (a collective where the options need them).
  void connect_nodes(Ctx& ctx) {
    for (link* c : {&protocol_, &other_, &control_, &eval_}) c->set_node_size(ctx.node_size());
    nodes_.connect(ctx);
  }

  // The protocol's traffic on every link it uses.
  comm::comm_stats protocol_stats() const { return nodes_.add_to(protocol_.stats()) + stats_of(replicas_); }
  // The engine's comm() report: `last_step`, the protocol's traffic in the last step; `steps`, the
  // step() calls.
  comm_report report(const comm::comm_stats& last_step, std::uint64_t steps) const {
    return comm_report{protocol_stats(),
                       last_step,
                       other_.stats() + stats_of(everyone_),
                       control_.stats() + stats_of(everyone_control_),
                       steps,
                       eval_.stats(),
                       stats_of(tp_)};
  }

 private:
  static comm::comm_stats stats_of(const std::unique_ptr<link>& c) { return c ? c->stats() : comm::comm_stats{}; }

  replica_groups<Comm> groups_;  // the shard group the links below run over, and its replicas
  link protocol_, other_, control_, eval_;
  std::unique_ptr<link> tp_;  // the tensor-parallel group's traffic (the norm's exchange, full_model_params)
  // With replicated shard groups: the replicas' all-reduce (protocol traffic), and the whole
  // data-parallel group's set-up (init broadcast and check) and control (the fingerprint) traffic.
  std::unique_ptr<link> replicas_, everyone_, everyone_control_;
  node_links<Ctx> nodes_;  // ZeRO++'s node and cross-node links, over the protocol's backend
};

}  // namespace zero
