// ZeRO++ (Wang et al. 2023) as engine options: quantized weight gathers (qwZ), quantized gradient reduction (qgZ), a secondary partition within nodes (hpZ).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/core/quantize.hpp"
#include "zero/error.hpp"

namespace zero {

// Less traffic between nodes, as properties of a stage's communication; the protocol (gather,
// grads, reduce, step) is unchanged, and so is every rank's persistent state (the parameter shard,
// the gradient shard, the master weights and the optimizer stay exact).
struct zeropp_options {
  // qwZ, stage 3: every all-gather of parameters moves each rank's shard as blocks of int8 (or int4)
  // codes with one fp32 scale per block (core/quantize.hpp), in one byte all-gather; every rank, its
  // own slice included, dequantizes the same bytes into the gathered unit, so all ranks compute with
  // the same values.
  bool qwz = false;
  quant::format weights{8, 256};
  // qgZ, stages 1-3: the gradient reduce-scatter becomes quantize -> all_to_all -> dequantize -> sum
  // in fp32 in rank order, each rank's slice quantized in its own blocks; so stages 1-3 stay
  // bit-identical to each other under the same quantization, and every deterministic backend gives
  // the same bits. With nodes (1 < node_size < N) in two hops, as ZeRO++ does: within the node (each
  // rank receives, from its node's ranks, the slices of the ranks of its position in every node), then
  // the node sums, quantized once more, across nodes to their owners; the sum is then over nodes in
  // order of the node sums in rank order.
  bool qgz = false;
  quant::format gradients{8, 256};
  // qgZ with error feedback (engine/reduce/error_feedback.hpp): each rank keeps the error its quantized
  // contribution left (fp32, one per element of the padded model: 4 Psi bytes, in memory()'s gradient
  // category) and adds it to its next contribution before quantizing. Needs qgz.
  bool qgz_error_feedback = false;
  // hpZ, stage 3: each rank also keeps a secondary shard, the parameters partitioned within its node
  // (Psi/node_size elements, persistent, counted as params). A step's first gather of a unit fills it
  // from the gathered (with qwZ: dequantized) values; the unit's later gathers in that step (the
  // backward pass, further micro-batches, a shared unit's second use) all-gather it inside the node,
  // exactly. step() makes it stale: the next step's first gather refills it.
  bool hpz = false;
  // Ranks per node, consecutive (ranks [k G, (k+1) G) form node k); 0: one node holds every rank.
  // What comm reports count as inter-node (comm_stats::inter), qgZ's two hops and hpZ's groups.
  int node_size = 0;
};

namespace detail {

// The slice a quantized reduction sends to one rank: the shards of the units it carries (one for a
// unit's own reduce, several for a fused bucket), each quantized in blocks of its own, so that
// fusing units changes no block and no bit. `wire` is the bytes of one slice.
struct quantized_slice {
  std::vector<std::size_t> segments;
  std::size_t elements = 0, wire = 0;
  quant::format format{};

  static quantized_slice of(std::vector<std::size_t> segments, const quant::format& f) {
    quantized_slice s;
    s.format = f;
    for (std::size_t n : segments) {
      s.elements += n;
      s.wire += quant::wire_bytes(n, f);
    }
    s.segments = std::move(segments);
    return s;
  }

  // Quantizes slice order[p] of x (slice j at x + j * elements) into position p of out (p x wire).
  template <class System, class T>
  void quantize(const System& sys, const T* x, const std::vector<std::size_t>& order, std::uint8_t* out) const {
    for (std::size_t p = 0; p < order.size(); ++p) {
      const T* src = x + order[p] * elements;
      std::uint8_t* dst = out + p * wire;
      for (std::size_t n : segments) {
        quant::quantize(sys, src, n, format, dst);
        src += n;
        dst += quant::wire_bytes(n, format);
      }
    }
  }
  // y[0, elements) = the sum over `sources` slices' wires, `stride` bytes apart from `wires`, in source
  // order, in fp32, stored once as T.
  template <class System, class T>
  void sum(const System& sys, const std::uint8_t* wires, std::size_t stride, int sources, T* y) const {
    for (std::size_t n : segments) {
      quant::dequantize_sum(sys, wires, stride, sources, n, format, y);
      wires += quant::wire_bytes(n, format);
      y += n;
    }
  }
};

}  // namespace detail

}  // namespace zero
