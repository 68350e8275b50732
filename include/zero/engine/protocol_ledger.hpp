// protocol_ledger: the engine protocol's bookkeeping (each unit's gathers and reduces in the step, the evaluation scope) and the checks that name what a call broke.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/options.hpp"
#include "zero/error.hpp"

namespace zero {

// What the protocol's calls have done since the last step(), per unit, and the rules they must keep
// (engine.hpp: "the protocol"). Every check throws zero::error (protocol) naming the rank, the unit and
// what to do instead, before the call changes anything; a call is counted once it succeeded (record_*),
// so one refused for memory leaves the ledger as it was. It holds counters only: the buffers a call
// hands out are the engine's.
class protocol_ledger {
 public:
  struct unit {
    bool gathered = false;
    int reduces = 0;       // reduce() calls in the current step
    int step_gathers = 0;  // gather() calls in the current step, outside evaluation()
    // Bumped by each gather and reduce: a handle from before is stale (engine/handles.hpp).
    std::uint64_t gather_epoch = 0, reduce_epoch = 0;
  };

  protocol_ledger(const model_spec& spec, const engine_options& options, int rank)
      : spec_(spec), options_(options), rank_(rank), units_(spec.num_units()) {}

  std::size_t size() const { return units_.size(); }
  const unit& at(unit_id u) const { return units_[u.index]; }
  // Refuses a unit index the model does not have.
  void check_index(unit_id u, const char* call) const {
    ZERO_CHECK(u.index < units_.size(), invalid_argument, "rank ", rank_, ": ", call, " of unit index ", u.index,
               ", but the model has ", units_.size(), " units");
  }
  std::string where(unit_id u) const {
    return detail::concat("rank ", rank_, ", unit '", spec_.units()[u.index].name, "': ");
  }
  bool evaluating() const { return evaluating_; }
  // A gather, grads or reduce since the last step() (outside evaluation()).
  bool step_started() const { return step_started_; }
  int reduces_per_step() const {
    return options_.accumulate == accumulation::reduce_each_micro_batch ? options_.micro_batches : 1;
  }

  // gather(u): not gathered already, and (in a step) within the gathers the unit declares: at most
  // 2 passes x unit_spec::gathers x micro_batches, the count the traffic formula assumes.
  void check_gather(unit_id u) const {
    const unit& s = units_[u.index];
    ZERO_CHECK(!s.gathered, protocol, where(u), "gather of a unit that is already gathered; release it first");
    if (evaluating_) return;
    const int declared = spec_.units()[u.index].gathers;  // both ints: the product in 64 bits
    const std::int64_t limit = std::int64_t{2} * declared * options_.micro_batches;
    ZERO_CHECK(s.step_gathers < limit, protocol, where(u), "gathered ", s.step_gathers + 1,
               " times in this step, but it is declared to be gathered ", declared,
               " time(s) per pass: at most 2 passes x ", declared, " x ", options_.micro_batches, " micro-batch(es) = ",
               limit,
               " per step (declare a shared unit with unit_builder::gathers(n); run "
               "forward-only passes inside an evaluation() scope)");
  }
  // Returns the gather's epoch.
  std::uint64_t record_gather(unit_id u) {
    unit& s = units_[u.index];
    if (!evaluating_) {
      ++s.step_gathers;
      step_started_ = true;
    }
    s.gathered = true;
    return ++s.gather_epoch;
  }
  // Marks a unit gathered or not without counting a gather (stage 3's gather in flight counts as live).
  void set_gathered(unit_id u, bool gathered) { units_[u.index].gathered = gathered; }
  void record_release(unit_id u) {
    ZERO_CHECK(units_[u.index].gathered, protocol, where(u), "release of a unit that is not gathered");
    units_[u.index].gathered = false;
  }

  // grads(u) and reduce(u): outside an evaluation() scope, and not after the unit's last reduce of the step.
  void check_gradients(unit_id u, const char* call) const {
    ZERO_CHECK(!evaluating_, protocol, where(u), call,
               "() inside an evaluation() scope (forward-only passes take no "
               "gradients; end the scope first)");
    ZERO_CHECK(!reduced(u), protocol, where(u), call, " of a unit already reduced in this step",
               reduce_count_text(units_[u.index].reduces));
  }
  // Returns the epoch the unit's gradient handle belongs to (its next reduce ends it).
  std::uint64_t record_grads(unit_id u) {
    step_started_ = true;
    return units_[u.index].reduce_epoch;
  }
  // Whether this is the unit's first reduce of the step.
  bool record_reduce(unit_id u) {
    unit& s = units_[u.index];
    const bool first = s.reduces == 0;
    ++s.reduces;
    ++s.reduce_epoch;
    step_started_ = true;
    return first;
  }

  // step(): outside an evaluation() scope, every unit reduced (M times under reduce_each_micro_batch)
  // and released.
  void check_step() const {
    ZERO_CHECK(!evaluating_, protocol, "rank ", rank_, ": step() inside an evaluation() scope; end the scope first");
    for (std::size_t i = 0; i < units_.size(); ++i) {
      const unit_id u{i};
      ZERO_CHECK(reduced(u), protocol, where(u), "step() before every unit was reduced (this one was not",
                 reduce_count_text(units_[i].reduces), ")");
      ZERO_CHECK(!units_[i].gathered, protocol, where(u), "step() while this unit is still gathered");
    }
  }
  // After step() or a load: a new step begins.
  void end_step() {
    for (unit& s : units_) s.reduces = s.step_gathers = 0;
    step_started_ = false;
  }

  // evaluation(): between steps, and not inside another scope.
  void begin_evaluation() {
    ZERO_CHECK(!evaluating_, protocol, "rank ", rank_, ": evaluation() inside another evaluation() scope");
    if (step_started_) {
      std::size_t i = 0;  // the first unit the step has touched, to name in the message
      while (i + 1 < units_.size() && units_[i].step_gathers == 0 && units_[i].reduces == 0) ++i;
      fail(error_kind::protocol, where(unit_id{i}), "evaluation() in the middle of a step (this unit gathered ",
           units_[i].step_gathers, " and reduced ", units_[i].reduces,
           " time(s) since the last step(), after a gather, grads or reduce of the step); call step() first");
    }
    evaluating_ = true;
  }
  void end_evaluation() noexcept {
    for (unit& s : units_) s.gathered = false;
    evaluating_ = false;
  }

  // Calls that change what a step reads (set_optimizer, finish_load): no unit gathered or reduced since
  // the last step(). A non-empty `advice` names the unit's state and ends the message.
  void check_between_steps(const char* call, std::string_view advice = {}) const {
    for (std::size_t i = 0; i < units_.size(); ++i) {
      const unit& s = units_[i];
      ZERO_CHECK(!s.gathered && s.reduces == 0, protocol, where(unit_id{i}), call, "() in the middle of a step",
                 advice.empty() ? std::string()
                                : detail::concat(" (this unit is ", s.gathered ? "gathered" : "reduced in this step",
                                                 "); ", advice));
    }
  }

 private:
  bool reduced(unit_id u) const { return units_[u.index].reduces >= reduces_per_step(); }
  std::string reduce_count_text(int done) const {
    if (reduces_per_step() == 1) return "";
    return detail::concat(": ", done, " of ", reduces_per_step(), " micro-batch reduces");
  }

  const model_spec& spec_;
  const engine_options& options_;
  int rank_;
  std::vector<unit> units_;
  bool evaluating_ = false;
  bool step_started_ = false;
};

}  // namespace zero
