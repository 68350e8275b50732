// activation_plan: the memory and traffic of an activation_store's checkpoints (ZeRO-R), planned before anything runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/comm/counted.hpp"
#include "zero/core/checked.hpp"
#include "zero/core/formulas.hpp"
#include "zero/engine/activation_store.hpp"
#include "zero/engine/plan_replay.hpp"
#include "zero/error.hpp"

namespace zero {

// The activation checkpoints of an activation_store on one rank, planned: L layers, each a checkpoint
// of E elements of b bytes, on a tensor-parallel group of tp ranks, for the loop of activation
// checkpointing: save every layer in the forward pass, then in the backward pass restore, recompute and
// release one layer at a time (in any order). With `prefetch_next` the backward pass prefetches the next
// layer's checkpoint once it has restored this one (restore(l), prefetch(l - 1), recompute, release(l)),
// so that its transfer overlaps the recomputation: two restored checkpoints are then held at once.
// Every field equals what the store then measures.
struct activation_plan {
  activation_mode mode = activation_mode::none;
  int tp = 1;
  std::uint64_t layers = 0, elements = 0;
  std::size_t element_bytes = 2;
  std::uint64_t kept_elements = 0;  // per checkpoint and rank: E (none) or ceil(E / tp)
  // Held once the forward pass is done: = memory().peak_saved and memory().peak_host.
  std::uint64_t saved_bytes = 0;        // in the system's memory (none: L E b; Pa: L ceil(E/tp) b; Pa+cpu: 0)
  std::uint64_t host_bytes = 0;         // in host memory (Pa+cpu: L ceil(E/tp) b)
  bool prefetch_next = false;
  std::uint64_t restore_bytes = 0;        // one restored checkpoint, padded (Pa, Pa+cpu)
  std::uint64_t peak_restored_bytes = 0;  // one restore, or two with prefetch_next: = memory().peak_restored
  std::uint64_t peak_system_bytes = 0;    // saved + peak_restored, at the first restore: = memory().peak_system
  // Per backward pass: the restores' all-gathers (bus bytes and calls, = traffic().gather), and the
  // Pa+cpu copies to host memory (forward) and back (backward).
  comm::comm_stats gather;
  std::uint64_t to_host_bytes = 0, from_host_bytes = 0;
};

inline activation_plan plan_activations(std::uint64_t layers, std::uint64_t elements, std::size_t element_bytes, int tp,
                                        activation_mode mode, bool prefetch_next = false) {
  ZERO_CHECK(tp >= 1, invalid_argument, "plan_activations: a tensor-parallel group of ", tp, " ranks");
  ZERO_CHECK(elements >= 1 && element_bytes >= 1, invalid_argument, "plan_activations: checkpoints of ", elements,
             " elements of ", element_bytes, " bytes");
  const bool partitioned = mode != activation_mode::none, host = mode == activation_mode::partitioned_cpu;
  activation_plan p;
  p.mode = mode;
  p.tp = tp;
  p.layers = layers;
  p.elements = elements;
  p.element_bytes = element_bytes;
  p.prefetch_next = prefetch_next;
  p.kept_elements = partitioned ? formula::activation_slice_elements(elements, tp) : elements;
  const formula::activation_bytes held =
      formula::activation_checkpoint_bytes(layers, elements, element_bytes, tp, partitioned, host);
  p.saved_bytes = held.system;
  p.host_bytes = held.host;
  p.restore_bytes = layers > 0 ? formula::activation_restore_bytes(elements, element_bytes, tp, partitioned) : 0;
  p.peak_restored_bytes = prefetch_next && layers > 1
                              ? add_or_fail(p.restore_bytes, p.restore_bytes, "plan_activations: bytes")
                              : p.restore_bytes;
  p.peak_system_bytes = add_or_fail(p.saved_bytes, p.peak_restored_bytes, "plan_activations: bytes");
  if (partitioned && layers > 0) {
    detail::plan_count(p.gather, comm::collective::all_gather, p.restore_bytes, tp, layers);
    if (host) p.to_host_bytes = p.from_host_bytes = held.host;
  }
  return p;
}

}  // namespace zero
