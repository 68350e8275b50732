// The check an engine makes before it allocates: do this rank's model states fit its memory, and which stages would.
#pragma once

#include <array>
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>

#include "zero/core/memory.hpp"
#include "zero/error.hpp"

namespace zero {

// The persistent bytes an engine is about to allocate on one rank, per model-state category, and
// the host memory of its offload tier where that is the system's memory (mem_category::offload: the
// host tier's arrays, the disk tier's slice buffers and checksums).
struct model_state_plan {
  std::uint64_t params = 0, grads = 0, master = 0, optimizer_states = 0;
  std::uint64_t offload = 0;
  std::uint64_t total() const { return params + grads + master + optimizer_states + offload; }
};

// What a rank that keeps its master weights and slots in memory would need with them offloaded
// (engine_options::offload), for a refusal to suggest: tier is empty where there is nothing to
// suggest (the engine offloads already, or holds no such states).
struct offload_alternative {
  std::string tier;                // "disk" (a CPU system: its host memory is the budget's), "host" (a device system)
  std::uint64_t bytes = 0;         // per rank in this memory with that tier: params, grads and what the tier holds here
  std::uint64_t staging = 0;       // of which the tier's host memory (the disk tier's slice buffers and checksums)
  std::size_t slice_elements = 0;  // disk: the offload.slice_elements it assumes
};

namespace detail {

// Whether `bytes` per rank fit: within the budget (0: none) and, where the system reports its memory,
// `sharers` times within what is free (every rank sharing the memory needs as much).
inline bool model_states_fit(std::uint64_t bytes, std::uint64_t budget, const std::optional<memory_info>& m) {
  if (budget != 0 && bytes > budget) return false;
  return !m || static_cast<std::uint64_t>(m->sharers) * bytes <= m->free;
}

// Throws error_kind::out_of_memory when `need` (stage `stage`, N ranks) does not fit the budget or the
// system's free memory, naming the rank, each category's bytes, the memory, and the stages that would
// fit at this N: stage_bytes[s] is what stage s would need per rank (zero::formula).
// With `offload` given, a refusal that offloading would turn into a fit says so, with the tier's cost.
inline void check_model_states_fit(int rank, int stage, int n, const model_state_plan& need, std::uint64_t budget,
                                   const std::optional<memory_info>& m,
                                   const std::array<std::uint64_t, 4>& stage_bytes,
                                   const offload_alternative& offload = {}) {
  if (model_states_fit(need.total(), budget, m)) return;
  std::string where;
  if (budget != 0 && need.total() > budget) {
    where = concat("more than the memory_limit_bytes budget of ", budget, " bytes");
  } else {
    where = concat(m->space.empty() ? std::string("the memory") : m->space, " has ", m->free, " bytes free of ",
                   m->total, " total");
    if (m->sharers > 1)
      where += concat(", shared by ", m->sharers, " ranks of this process that need ", m->sharers, " x ", need.total(),
                      " = ", static_cast<std::uint64_t>(m->sharers) * need.total(), " bytes");
  }
  std::string fits;
  for (int s = 0; s < 4; ++s)
    if (model_states_fit(stage_bytes[static_cast<std::size_t>(s)], budget, m))
      fits += concat(fits.empty() ? "" : ", ", "stage ", s, " (", stage_bytes[static_cast<std::size_t>(s)], " bytes)");
  if (fits.empty()) {
    // More ranks divide stage 3's bytes, but not what ranks sharing one memory need together.
    const bool shared = !(budget != 0 && need.total() > budget) && m->sharers > 1;
    fits = concat("none (stage 3 needs ", stage_bytes[3], " bytes per rank; more ranks",
                  shared ? ", each on a memory of its own," : "", " would divide it)");
  }
  std::string offloaded;
  if (!offload.tier.empty() && model_states_fit(offload.bytes, budget, m))
    offloaded = concat(". With offload (engine_options::offload, tier ", offload.tier,
                       ": the master weights and optimizer slots ",
                       offload.tier == "disk" ? concat("in a file, streamed through ", offload.staging,
                                                       " bytes of host memory for its slices and checksums with "
                                                       "offload.slice_elements = ", offload.slice_elements)
                                              : std::string("in host memory"),
                       ") stage ", stage, " would need ", offload.bytes, " bytes on this rank, which fit");
  fail(error_kind::out_of_memory, "rank ", rank, ": out of memory: the model states of ZeRO stage ", stage,
       " at N = ", n, " need ", need.total(), " bytes on this rank (params ", need.params, ", grads ", need.grads,
       ", master ", need.master, ", optimizer_states ", need.optimizer_states,
       need.offload ? concat(", offload ", need.offload) : std::string(), "), ", where,
       "; nothing was allocated. Stages whose model states would fit at N = ", n, ": ", fits, offloaded);
}

// The free memory of a system that reports it (sys::cuda), read by every rank of `group` before any
// allocates (the barrier), so that ranks sharing one device see the same free bytes, not their peers'
// model states; nothing for a system that does not report it.
template <class System, class Group>
std::optional<memory_info> memory_before_allocation(const System& sys, Group& group) {
  if constexpr (requires(const System& s) {
                  { s.available() } -> std::convertible_to<memory_info>;
                }) {
    const std::uint64_t free = sys.available().free;
    group.barrier();
    // Read again for the sharers: past the barrier every rank sharing the memory exists.
    std::optional<memory_info> m = sys.available();
    m->free = free;
    return m;
  } else {
    return std::nullopt;
  }
}

}  // namespace detail
}  // namespace zero
