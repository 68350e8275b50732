// Where an engine's model states move between steps: out of the system's memory and back (release_memory), and into host snapshots for the asynchronous saver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "zero/core/memory.hpp"
#include "zero/engine/memory_release.hpp"
#include "zero/engine/protocol_ledger.hpp"
#include "zero/error.hpp"
#include "zero/offload/host_block.hpp"
#include "zero/offload/state_store.hpp"

namespace zero::detail {

// The movers of whole model states between steps, beside the offload tier (offload::state_store, which
// moves the master weights and slots inside each step): a release parks the parts' buffers in host
// memory or a file and brings them back; a snapshot is host memory the saver copies the state into.
// Each counts its host memory by the offload tier's rule (host_account): in the engine's account where
// host memory is the system's own (a CPU system), so memory() and memory_limit_bytes see every byte a
// mover holds there, and nowhere on a device system, whose budget is the device's.
template <class System>
class state_movers {
 public:
  state_movers(memory_accounting& acct, int rank) : acct_(acct), rank_(rank) {}
  state_movers(const state_movers&) = delete;
  state_movers& operator=(const state_movers&) = delete;

  memory_accounting* host_account() const {
    return offload::state_store<System>::counts_host_memory ? &acct_ : nullptr;
  }

  // ---- release_memory / restore_memory ----

  release_report report() const { return released_.report(); }
  // Refuses `call` while the states are released.
  void check_held(const char* call) const { released_.check_held(rank_, call); }
  // Refuses a release: of released states, inside an evaluation() scope or a step, or where the
  // gradient reducer carries state between steps that a release would not move (`carried_bytes`).
  void check_releasable(const protocol_ledger& ledger, std::uint64_t carried_bytes) const {
    released_.check_releasable(rank_);
    ZERO_CHECK(!ledger.evaluating() && !ledger.step_started(), protocol, "rank ", rank_, ": release_memory() ",
               ledger.evaluating() ? "inside an evaluation() scope"
                                   : "in the middle of a step (after a gather, grads or reduce)",
               "; call it between steps");
    ZERO_CHECK(carried_bytes == 0, invalid_argument, "rank ", rank_,
               ": release_memory(): the error-feedback gradient reducer (zeropp qgZ with error feedback) carries each "
               "rank's quantization error between steps, which release_memory does not move");
  }
  // Parks every buffer `for_each(f)` hands f, in its order, and frees it.
  template <class ForEach>
  void release(const System& sys, const release_options& o, ForEach&& for_each) {
    released_.release(sys, o, rank_, host_account(), std::forward<ForEach>(for_each));
  }
  // Allocates them again in the same order and copies them back; the states count as released until
  // restored() (a restore that failed for memory can be tried again).
  template <class ForEach>
  void restore(ForEach&& for_each) {
    released_.restore(rank_, acct_, std::forward<ForEach>(for_each));
  }
  void restored() { released_.restored(); }

  // ---- snapshots (engine::snapshot_memory) ----

  // Host memory of `bytes` for a copy of the state, not filled, pinned where the system pins host
  // memory, counted under mem_category::snapshot. `reuse`, a block this engine gave before, comes back
  // as it is when it has `bytes` (its pages mapped already), else is freed first.
  snapshot_block snapshot(std::size_t bytes, snapshot_block reuse) {
    if (reuse.belongs_to(lifetime_) && reuse.bytes() == bytes) return reuse;
    reuse = snapshot_block();
    memory_accounting* acct = host_account();
    return snapshot_block(
        offload::host_block<System>(
            bytes, [&] { return offload::accounted(acct, bytes, mem_category::snapshot, lifetime_); }, false),
        lifetime_);
  }

 private:
  memory_accounting& acct_;
  int rank_;
  released_memory<System> released_;  // what release_memory() moved out, until restore_memory()
  // Expires with the engine: a snapshot block it handed out, which may outlive it, then leaves acct_ alone.
  std::shared_ptr<const int> lifetime_ = std::make_shared<const int>(0);
};

}  // namespace zero::detail
