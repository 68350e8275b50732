// Bytes per step on each link level (within a node, between nodes), for every stage with and without ZeRO++'s qwZ, qgZ and hpZ.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/core/quantize.hpp"
#include "zero/error.hpp"

// Written from the definitions, independently of the engine that must meet them (tests hold the
// engine's counted bytes equal to these, per level, exactly).
//
// N ranks sit on nodes of G = node_size consecutive ranks, K = N / G nodes. Every collective is
// counted by the bus-volume convention (comm/counted.hpp), split between the levels by the direct
// model: a collective whose buffer is N blocks sends one block to each of the N - 1 peers, G - 1 of
// them on the rank's node and N - G on others (an all_reduce twice that). Per unit of P padded
// elements (S = P / N per rank, c bytes per element on the wire, W(S) = quant::wire_bytes(S, format)
// for a quantized shard), per rank, with m reduces per step:
//
//   stage 0      m all_reduces             total 2 (N-1) S c         inter 2 (N-G) S c
//   stages 1-2   m reduce-scatters         total (N-1) S c           inter (N-G) S c
//                + 1 all_gather of the updated slices, the same
//   stage 3      2 g m all_gathers (g: the unit's gathers per pass) and m reduce-scatters, each
//                total (N-1) S c, inter (N-G) S c
//   qwZ          a primary all_gather moves W_w(S) per peer: total (N-1) W_w(S), inter (N-G) W_w(S)
//   hpZ          of a unit's 2 g m gathers the first is primary, the other 2 g m - 1 all-gather the
//                secondary shard inside the node: total (G-1) (P/G) c each, inter 0
//   qgZ, flat    (one node, or G = 1, or G = N) a reduce is an all_to_all of W_g(S) per peer:
//                total (N-1) W_g(S), inter (N-G) W_g(S)
//   qgZ, 2 hops  (1 < G < N) hop 1 inside the node, K slices to each of the G-1 peers:
//                total (G-1) K W_g(S), inter 0; hop 2 across nodes, one slice to each of the K-1 peers:
//                total (K-1) W_g(S), inter (K-1) W_g(S)
namespace zero::formula {

// A unit as the traffic formulas see it: its padded elements and how often it is gathered per pass.
struct unit_extent {
  std::uint64_t padded = 0;
  int gathers = 1;
};

// Which ZeRO++ techniques are on, with their formats, and the nodes (node_size 0: one node).
struct traffic_options {
  bool qwz = false, qgz = false, hpz = false;
  quant::format weights{}, gradients{};
  int node_size = 0;
};

struct link_bytes {
  std::uint64_t total = 0, inter = 0;
  std::uint64_t intra() const { return total - inter; }
  link_bytes& operator+=(const link_bytes& o) {
    total += o.total;
    inter += o.inter;
    return *this;
  }
};

namespace detail {
inline std::uint64_t nodes_of(int n, int node_size) {
  ZERO_CHECK(n > 0, invalid_argument, "formula: N must be positive, got ", n);
  const int g = node_size == 0 ? n : node_size;
  ZERO_CHECK(g >= 1 && n % g == 0, invalid_argument, "formula: node size ", g, " does not divide N = ", n);
  return static_cast<std::uint64_t>(g);
}
inline void check_unit(const unit_extent& u, int n) {
  ZERO_CHECK(u.padded % static_cast<std::uint64_t>(n) == 0 && u.gathers >= 1, invalid_argument, "formula: a unit of ",
             u.padded, " padded elements is not split into N = ", n, " equal shards (or gathers ", u.gathers, " < 1)");
}
// One block of `block_bytes` to each peer: the peers on this rank's node and on the others.
inline link_bytes to_peers(std::uint64_t block_bytes, std::uint64_t n, std::uint64_t g) {
  return {(n - 1) * block_bytes, (n - g) * block_bytes};
}
}  // namespace detail

// One reduce of a unit's gradient of S elements per rank (stages 1-3): a reduce-scatter, or qgZ.
inline link_bytes reduce_bytes(std::uint64_t shard, int n, std::size_t elem_bytes, const traffic_options& o) {
  const auto N = static_cast<std::uint64_t>(n), G = detail::nodes_of(n, o.node_size);
  if (!o.qgz) return detail::to_peers(shard * elem_bytes, N, G);
  const std::uint64_t w = quant::wire_bytes(shard, o.gradients);
  if (G == 1 || G == N) return detail::to_peers(w, N, G);
  const std::uint64_t K = N / G;
  return {(G - 1) * K * w + (K - 1) * w, (K - 1) * w};
}

// One primary all-gather of a unit's parameters (S per rank): exact, or qwZ's wire.
inline link_bytes gather_bytes(std::uint64_t shard, int n, std::size_t elem_bytes, const traffic_options& o) {
  const auto N = static_cast<std::uint64_t>(n), G = detail::nodes_of(n, o.node_size);
  return detail::to_peers(o.qwz ? quant::wire_bytes(shard, o.weights) : shard * elem_bytes, N, G);
}

// Bytes each rank sends per step, in total and between nodes, for ZeRO stage `stage`, with m reduces
// per step (micro-batches reduced one by one; in stage 3 each of the m micro-batches also gathers
// every unit 2 x gathers times). Without ZeRO++ and one node, `total` is comm_bytes_per_step's.
inline link_bytes bytes_per_step(int stage, const std::vector<unit_extent>& units, int n, std::size_t elem_bytes,
                                 int micro_batches, const traffic_options& o) {
  ZERO_CHECK(stage >= 0 && stage <= 3, invalid_argument, "formula: no ZeRO stage ", stage);
  ZERO_CHECK(micro_batches >= 1, invalid_argument, "formula: micro_batches must be at least 1");
  ZERO_CHECK(!(o.qwz || o.hpz) || stage == 3, invalid_argument, "formula: qwZ and hpZ apply to stage 3's gathers, not "
             "stage ", stage);
  ZERO_CHECK(!o.qgz || stage >= 1, invalid_argument, "formula: qgZ replaces the reduce-scatter of stages 1-3; stage 0 "
             "all-reduces");
  const auto N = static_cast<std::uint64_t>(n), G = detail::nodes_of(n, o.node_size);
  const auto m = static_cast<std::uint64_t>(micro_batches);
  link_bytes b;
  if (n == 1) return b;
  for (const unit_extent& u : units) {
    detail::check_unit(u, n);
    const std::uint64_t S = u.padded / N;
    if (stage == 0) {
      b += link_bytes{m * 2 * (N - 1) * S * elem_bytes, m * 2 * (N - G) * S * elem_bytes};
      continue;
    }
    for (std::uint64_t k = 0; k < m; ++k) b += reduce_bytes(S, n, elem_bytes, o);
    if (stage < 3) {
      b += detail::to_peers(S * elem_bytes, N, G);
      continue;
    }
    const std::uint64_t gathers = 2 * m * static_cast<std::uint64_t>(u.gathers);
    if (!o.hpz) {
      for (std::uint64_t k = 0; k < gathers; ++k) b += gather_bytes(S, n, elem_bytes, o);
    } else {
      b += gather_bytes(S, n, elem_bytes, o);
      b += link_bytes{(gathers - 1) * (G - 1) * (u.padded / G) * elem_bytes, 0};
    }
  }
  return b;
}

// Bytes of one forward-only pass inside evaluation(): stage 3 gathers every unit `gathers` times
// (primary gathers: qwZ's wire where on; never the secondary, which a step has made stale); stages
// 0-2 nothing.
inline link_bytes eval_bytes_per_pass(int stage, const std::vector<unit_extent>& units, int n, std::size_t elem_bytes,
                                      const traffic_options& o) {
  link_bytes b;
  if (stage != 3 || n == 1) return b;
  for (const unit_extent& u : units) {
    detail::check_unit(u, n);
    for (int k = 0; k < u.gathers; ++k) b += gather_bytes(u.padded / static_cast<std::uint64_t>(n), n, elem_bytes, o);
  }
  return b;
}

// hpZ's secondary shard per rank: Psi / node_size parameters of `param_bytes` each, persistent.
inline std::uint64_t hpz_secondary_bytes(std::uint64_t psi, int n, int node_size, std::size_t param_bytes) {
  const std::uint64_t G = detail::nodes_of(n, node_size);
  ZERO_CHECK(psi % G == 0, invalid_argument, "formula: Psi = ", psi, " is not a multiple of the node size ", G);
  return psi / G * param_bytes;
}

// ZeRO++'s transient buffers and state, as the engine allocates them (zero::plan reads these too).
// qwZ: a primary gather of a unit holds the N ranks' quantized shards beside the gathered unit until
// it completes (an hpZ secondary gather moves exact parameters and holds no wire).
inline std::uint64_t qwz_gather_wire_bytes(std::uint64_t shard, int n, const quant::format& f) {
  return static_cast<std::uint64_t>(n) * quant::wire_bytes(shard, f);
}
// qgZ: one slice of a reduce (the shards of its units side by side, each quantized in blocks of its
// own), in bytes on the wire.
inline std::uint64_t qgz_slice_wire_bytes(const std::vector<std::uint64_t>& shards, const quant::format& f) {
  std::uint64_t w = 0;
  for (std::uint64_t s : shards) w += quant::wire_bytes(s, f);
  return w;
}
// qgZ: a reduce in flight holds N slices sent and N received until it completes.
inline std::uint64_t qgz_exchange_bytes(std::uint64_t slice_wire, int n) {
  return 2 * static_cast<std::uint64_t>(n) * slice_wire;
}
// qgZ in two hops, at completion: the K node sums of a slice in fp32 (K x slice elements x 4), then
// K slices sent and K received across nodes.
inline std::uint64_t qgz_node_sums_bytes(std::uint64_t slice_elements, std::uint64_t nodes) {
  return nodes * slice_elements * sizeof(float);
}
// qgZ in two hops: what completing a reduce takes beyond the N slices sent and N received it holds
// (a reduce in flight keeps it free): the node sums while it still holds them, then, once they are
// freed, the node sums and the K slices sent, then the 2K slices sent and received. With K <= N / 2
// that is the node sums.
inline std::uint64_t qgz_completion_bytes(std::uint64_t slice_elements, std::uint64_t slice_wire, int n,
                                          std::uint64_t nodes) {
  const std::uint64_t sums = qgz_node_sums_bytes(slice_elements, nodes), held = qgz_exchange_bytes(slice_wire, n);
  const std::uint64_t with_sent = sums + nodes * slice_wire, second_hop = 2 * nodes * slice_wire;
  std::uint64_t most = sums;
  if (with_sent > held) most = std::max(most, with_sent - held);
  if (second_hop > held) most = std::max(most, second_hop - held);
  return most;
}
// qgZ with error feedback: the fp32 error of every padded element, kept between steps (gradient
// category), and, while a reduce starts, one slice's codes dequantized (slice elements x 4).
inline std::uint64_t qgz_error_state_bytes(std::uint64_t padded) { return padded * sizeof(float); }
inline std::uint64_t qgz_feedback_transient_bytes(std::uint64_t slice_elements) {
  return slice_elements * sizeof(float);
}

}  // namespace zero::formula
