// How a stage 3 gather travels: the exact shards, qwZ's codes, or hpZ's secondary partition inside the node.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/split.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/quantize.hpp"
#include "zero/engine/context.hpp"
#include "zero/error.hpp"

namespace zero::gather {

// A transport moves one unit's parameters into a whole, padded buffer `full` on every rank:
//   static bool usable(ctx)                  the backend and system have what it needs (checked at construction)
//   static std::size_t wire_bytes(ctx, ul)   transient bytes it holds besides `full` while in flight
//   static request start(ctx, via, u, source, full, wire)   `source`: this rank's part (its shard, or
//                                            its secondary shard); `wire`: the transport's buffer, if any
//   static void finish(ctx, via, request&, u, full, wire)   waits; decodes what the wire carried
// Every rank starts the same transport for the same call, so the collectives match.

// The exact shards, all-gathered on `via`.
template <class Ctx>
struct exact {
  using request = typename Ctx::request;
  using wire_buffer = buffer<std::uint8_t, typename Ctx::system>;
  static constexpr bool usable = true;
  static std::size_t wire_bytes(const Ctx&, const unit_layout&) { return 0; }
  static request start(Ctx& c, typename Ctx::link& via, unit_id u, const typename Ctx::param_type* shard,
                       typename Ctx::param_type* full, wire_buffer&) {
    const auto l = c.label("gather", u);
    return via.start_all_gather(shard, full, c.layout.unit(u).shard);
  }
  static void finish(Ctx&, typename Ctx::link& via, request& r, unit_id, typename Ctx::param_type*, wire_buffer&) {
    via.wait(r);
  }
};

// qwZ (engine_options::zeropp.qwz): this rank's shard quantized into its slot of a wire of N slots, the
// wire all-gathered in place as bytes, and every rank's slice, this rank's included, dequantized from
// the same bytes, so every rank computes with the same values.
template <class Ctx>
struct quantized {
  using request = typename Ctx::request;
  using system = typename Ctx::system;
  using wire_buffer = buffer<std::uint8_t, system>;
  static constexpr bool usable = comm::moves_bytes<typename Ctx::comm_backend> &&
                                 requires(const system& s, std::size_t n, quant::scale_rule<float> r) {
    s.for_each_index(n, r);
  };
  static std::size_t wire_bytes(const Ctx& c, const unit_layout& ul) {
    return static_cast<std::size_t>(c.ranks()) * quant::wire_bytes(ul.shard, c.options.zeropp.weights);
  }
  static request start(Ctx& c, typename Ctx::link& via, unit_id u, const typename Ctx::param_type* shard,
                       typename Ctx::param_type*, wire_buffer& wire) {
    const auto l = c.label("gather", u);
    if constexpr (usable) {
      const unit_layout& ul = c.layout.unit(u);
      const quant::format& f = c.options.zeropp.weights;
      const std::size_t wb = quant::wire_bytes(ul.shard, f), at = static_cast<std::size_t>(c.rank) * wb;
      wire = wire_buffer(static_cast<std::size_t>(c.ranks()) * wb, mem_category::transient, c.acct);
      quant::quantize(c.sys, shard, ul.shard, f, wire.data() + at);
      return via.start_all_gather(wire.data() + at, wire.data(), wb);
    }
    fail(error_kind::invalid_argument, c.where(u), "qwZ on a backend without byte collectives");
  }
  static void finish(Ctx& c, typename Ctx::link& via, request& r, unit_id u, typename Ctx::param_type* full,
                     wire_buffer& wire) {
    via.wait(r);
    if constexpr (usable) {
      const unit_layout& ul = c.layout.unit(u);
      const quant::format& f = c.options.zeropp.weights;
      const std::size_t wb = quant::wire_bytes(ul.shard, f);
      for (std::size_t k = 0; k < static_cast<std::size_t>(c.ranks()); ++k)
        quant::dequantize(c.sys, wire.data() + k * wb, ul.shard, f, full + k * ul.shard);
    }
    wire.reset();
  }
};

// hpZ (engine_options::zeropp.hpz): a unit already gathered in this step all-gathers the node's
// secondary shards (the unit partitioned among the node's G ranks) on the node's link, exactly.
template <class Ctx>
struct secondary {
  using request = typename Ctx::request;
  using wire_buffer = buffer<std::uint8_t, typename Ctx::system>;
  static constexpr bool usable = comm::splittable<typename Ctx::comm_backend>;
  static std::size_t wire_bytes(const Ctx&, const unit_layout&) { return 0; }
  static request start(Ctx& c, typename Ctx::link&, unit_id u, const typename Ctx::param_type* part,
                       typename Ctx::param_type* full, wire_buffer&) {
    const auto l = c.label_on(*c.node_backend, "gather", u);
    return c.node->start_all_gather(part, full, c.layout.unit(u).padded / static_cast<std::size_t>(c.node_size()));
  }
  static void finish(Ctx& c, typename Ctx::link&, request& r, unit_id, typename Ctx::param_type*, wire_buffer&) {
    c.node->wait(r);
  }
};

}  // namespace zero::gather
