// The quantized gradient reducer (ZeRO++'s qgZ): slices quantized, exchanged by all_to_all, summed in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/gradient_reducer.hpp"
#include "zero/core/link_formulas.hpp"
#include "zero/core/quantize.hpp"
#include "zero/engine/reduce/reducer.hpp"
#include "zero/engine/reduce/summing.hpp"
#include "zero/engine/zeropp.hpp"

namespace zero::reduce {

// engine_options::zeropp.qgz: each rank's N slices quantized (each unit's shard in blocks of its own,
// so fusing changes no bit) and exchanged by one all_to_all; each rank sums the N received slices in
// fp32 in rank order into its slice. Two hops where nodes hold more than one rank and there is more
// than one node: within the node (to the rank of local position l go the slices of the ranks of
// position l in every node), then the node sums, quantized once more, across nodes.
template <class Ctx>
class qgz_wire {
 public:
  using Comm = typename Ctx::comm_backend;
  using system = typename Ctx::system;
  using P = typename Ctx::partitioner;
  static constexpr const char* name = "qgZ";
  static constexpr bool available =
      comm::has_all_to_all<Comm> && requires(const system& s, std::size_t n, quant::scale_rule<float> r) {
    s.for_each_index(n, r);
  };
  static bool chosen(const engine_options& o) { return o.zeropp.qgz; }
  static std::uint64_t extra_state_bytes(const engine_options&, std::uint64_t) { return 0; }
  static void accept(const Ctx& c) {
    const char* where = "engine_options::zeropp";
    ZERO_CHECK(P::shards_optimizer_states, invalid_argument, "rank ", c.rank, ": ", where,
               ": qgZ replaces the gradient reduce-scatter of stages 1-3; ZeRO stage ", P::stage,
               " all-reduces every gradient");
    try {
      quant::validate(c.options.zeropp.gradients, "engine_options::zeropp.gradients");
    } catch (const error& e) {
      throw error(e.kind(), detail::concat("rank ", c.rank, ": ", e.what()));
    }
    ZERO_CHECK(available, invalid_argument, "rank ", c.rank, ": ", where,
               ": qgZ needs a backend with all_to_all (comm/all_to_all.hpp) and a system with for_each_index");
    ZERO_CHECK(!c.hierarchical() || comm::splittable<Comm>, invalid_argument, "rank ", c.rank, ": ", where,
               ": qgZ over several nodes needs a backend with split (comm/split.hpp)");
  }

  // The quantized slices sent and received, where the reduced slice goes, and whether the request is
  // the first hop's (the node's link).
  struct state {
    buffer<std::uint8_t, system> send_wire, recv_wire;
    detail::quantized_slice slice;
    typename Ctx::grad_type* reduced = nullptr;
    unit_id unit{};
    bool quantized = false, first_hop = false;
  };

  explicit qgz_wire(Ctx& c) : ctx_(c) {}

  typename Ctx::request start(state& f, const std::vector<unit_id>& units, typename Ctx::grad_type* g,
                              std::size_t count) {
    Ctx& c = ctx_;
    const unit_id u = units.front();
    std::vector<std::size_t> segments;  // each unit's part of a slice is quantized in blocks of its own
    for (unit_id v : units) segments.push_back(c.layout.unit(v).shard);
    const auto n = static_cast<std::size_t>(c.ranks());
    f.quantized = true;
    f.unit = u;
    f.reduced = g + static_cast<std::size_t>(c.rank) * count;
    f.slice = detail::quantized_slice::of(std::move(segments), c.options.zeropp.gradients);
    f.first_hop = c.hierarchical();
    const std::size_t wb = f.slice.wire;
    // Room for the wires, and for what completing the reduce will take: kept free while it is in flight.
    c.make_room(formula::qgz_exchange_bytes(wb, c.ranks()) + completion_bytes(f));
    f.send_wire = buffer<std::uint8_t, system>(n * wb, mem_category::transient, c.acct);
    f.recv_wire = buffer<std::uint8_t, system>(n * wb, mem_category::transient, c.acct);
    const std::vector<std::size_t> order = send_order();
    f.slice.quantize(c.sys, g, order, f.send_wire.data());
    if (!c.hierarchical()) return c.protocol.start_all_to_all(f.send_wire.data(), f.recv_wire.data(), wb);
    const std::size_t nodes = n / static_cast<std::size_t>(c.node_size());
    const auto l = c.label_on(*c.node_backend, "reduce", u);
    return c.node->start_all_to_all(f.send_wire.data(), f.recv_wire.data(), nodes * wb);
  }
  void wait(state& f, typename Ctx::request& r) {
    if (f.first_hop)
      ctx_.node->wait(r);
    else
      ctx_.protocol.wait(r);
  }
  // The N received slices summed in fp32 in rank order into this rank's slice. Two hops: the node's
  // G slices of each of the K ranks of this position summed in local order (fp32), quantized once
  // more and exchanged across nodes, then the K node sums summed in node order.
  void finish(state& f) {
    Ctx& c = ctx_;
    if (!f.quantized) return;
    const std::size_t wb = f.slice.wire;
    if (!f.first_hop) {
      f.slice.sum(c.sys, f.recv_wire.data(), wb, c.ranks(), f.reduced);
      f.send_wire.reset();
      f.recv_wire.reset();
      return;
    }
    const auto gs = static_cast<std::size_t>(c.node_size());
    const std::size_t nodes = static_cast<std::size_t>(c.ranks()) / gs, count = f.slice.elements;
    buffer<float, system> partial(nodes * count, mem_category::transient, c.acct);
    for (std::size_t m = 0; m < nodes; ++m)
      f.slice.sum(c.sys, f.recv_wire.data() + m * wb, nodes * wb, static_cast<int>(gs), partial.data() + m * count);
    f.send_wire.reset();
    f.recv_wire.reset();
    buffer<std::uint8_t, system> send(nodes * wb, mem_category::transient, c.acct);
    std::vector<std::size_t> order(nodes);
    for (std::size_t m = 0; m < nodes; ++m) order[m] = m;
    f.slice.quantize(c.sys, partial.data(), order, send.data());
    partial.reset();
    buffer<std::uint8_t, system> recv(nodes * wb, mem_category::transient, c.acct);
    const auto l = c.label_on(*c.cross_backend, "reduce", f.unit);
    auto r = c.cross->start_all_to_all(send.data(), recv.data(), wb);
    c.cross->wait(r);
    f.slice.sum(c.sys, recv.data(), wb, static_cast<int>(nodes), f.reduced);
  }

  // The transient bytes finish(f) allocates beyond the wires f holds: in two hops, the node sums and
  // the second hop's slices (formula::qgz_completion_bytes); flat, none.
  std::size_t completion_bytes(const state& f) const {
    if (!f.quantized || !f.first_hop) return 0;
    const auto nodes = static_cast<std::uint64_t>(ctx_.ranks() / ctx_.node_size());
    return static_cast<std::size_t>(formula::qgz_completion_bytes(f.slice.elements, f.slice.wire, ctx_.ranks(), nodes));
  }

  // Which slice goes to which position of the send wire: slice k to rank k; in two hops, to the rank
  // of local position l of this node the slices of the ranks of position l in every node (node m's at m).
  std::vector<std::size_t> send_order() const {
    const auto n = static_cast<std::size_t>(ctx_.ranks());
    std::vector<std::size_t> order(n);
    if (!ctx_.hierarchical()) {
      for (std::size_t k = 0; k < n; ++k) order[k] = k;
      return order;
    }
    const auto gs = static_cast<std::size_t>(ctx_.node_size()), nodes = n / gs;
    for (std::size_t l = 0; l < gs; ++l)
      for (std::size_t m = 0; m < nodes; ++m) order[l * nodes + m] = m * gs + l;
    return order;
  }

 private:
  Ctx& ctx_;
};

template <class Ctx>
using quantized_reducer = reducer<Ctx, summing<Ctx, qgz_wire<Ctx>>>;

}  // namespace zero::reduce
