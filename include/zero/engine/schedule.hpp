// The gather schedule: stage 3's prefetches, which follow the order the last step gathered its units in.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/engine/context.hpp"
#include "zero/engine/parameters.hpp"

namespace zero {

// With overlap on a backend that overlaps, stage 3's gather(u) in a step takes the all-gather the
// schedule started ahead of it, when the step follows the order the last step gathered its units in,
// and starts the next ones: up to prefetch_units ahead, within max_live_parameters and the memory
// budget. A departure from the order drops what was prefetched (its bytes spent: overlap_report's
// misses) and gathers on demand for the rest of the step. Every decision depends only on the calls,
// which every rank makes alike, so the ranks start the same collectives in the same order.
template <class Ctx>
class gather_schedule {
 public:
  using P = typename Ctx::partitioner;
  using system = typename Ctx::system;
  using param_type = typename Ctx::param_type;
  using request = typename Ctx::request;
  using wire_buffer = buffer<std::uint8_t, system>;

  // A gather handed to gather(u): the unit's buffer, its transport's wire, and the request to finish.
  struct started {
    buffer<param_type, system> full;
    wire_buffer wire;
    request pending{};
    bool from_secondary = false;
  };

  // `gathered(u)`: whether the engine holds unit u gathered now (its buffer counts as live).
  gather_schedule(Ctx& c, parameter_placement<Ctx>& params, std::function<bool(unit_id)> gathered)
      : ctx_(c), params_(params), gathered_(std::move(gathered)), units_(c.spec.num_units()) {}
  gather_schedule(const gather_schedule&) = delete;
  gather_schedule& operator=(const gather_schedule&) = delete;

  bool prefetching() const {
    return P::shards_parameters && ctx_.overlapping() && ctx_.options.prefetch_units > 0 && order_holds_;
  }

  // Stage 3's gather(u) inside a step: the unit's prefetch when the step follows the recorded order,
  // else a gather started now (hpZ: from the secondary partition for a unit already gathered in the step).
  started start(unit_id u) {
    const std::size_t position = step_order_.size();
    if (order_holds_ && (position >= gather_order_.size() || gather_order_[position] != u.index)) {
      // This step departs from the last one's order: what was prefetched is not what is asked for.
      order_holds_ = false;
      drop_all();
    }
    started g;
    g.from_secondary = ctx_.options.zeropp.hpz && params_.secondary_ready(u);
    unit& s = units_[u.index];
    if (s.prefetching && s.from_secondary != g.from_secondary) drop(s);  // (cannot happen: same rule)
    if (s.prefetching) {
      g.full = std::move(s.full);
      g.wire = std::move(s.wire);
      g.pending = std::move(s.pending);
      s.prefetching = false;
      ++ctx_.overlap.prefetch_hits;
    } else {
      const unit_layout& ul = ctx_.layout.unit(u);
      ctx_.make_room(params_.gather_bytes(ul, g.from_secondary));
      g.full = buffer<param_type, system>(ul.padded, mem_category::transient, ctx_.acct);
      g.pending = params_.start_gather(ctx_.protocol, u, g.full.data(), g.wire, g.from_secondary);
    }
    step_order_.push_back(u.index);
    if (order_holds_ && next_ <= position) next_ = position + 1;
    return g;
  }

  // Starts the all-gathers of the units the recorded order gathers next, in that order, up to
  // prefetch_units ahead of the last gather, while each fits max_live_parameters and the memory
  // budget. A unit gathered now may be prefetched for its next gather (into a buffer of its own: the
  // backward pass gathers the last layer again right after the forward released it), but a unit
  // already prefetched stops the walk until that prefetch is taken.
  void prefetch_ahead() {
    if (!prefetching() || step_order_.empty()) return;
    const std::size_t last = step_order_.size() - 1;
    const std::size_t end =
        std::min(gather_order_.size(), last + 1 + static_cast<std::size_t>(ctx_.options.prefetch_units));
    for (; next_ < end; ++next_) {
      const unit_id v{gather_order_[next_]};
      unit& t = units_[v.index];
      if (t.prefetching) return;
      // hpZ: the gather at this position reads the secondary partition when the order gathered the unit
      // before it (as the gather itself will decide); its source must be filled first.
      const bool secondary = ctx_.options.zeropp.hpz && gathered_before(v.index, next_);
      if (secondary && !params_.secondary_ready(v)) return;
      const unit_layout& ul = ctx_.layout.unit(v);
      const std::size_t live_limit = ctx_.options.max_live_parameters;
      if (live_limit > 0 && live_parameters() + ul.padded > live_limit) return;
      const std::size_t bytes = params_.gather_bytes(ul, secondary);
      if (!ctx_.has_room(bytes)) return;
      t.full = buffer<param_type, system>(ul.padded, mem_category::transient, ctx_.acct);
      t.pending = params_.start_gather(ctx_.protocol, v, t.full.data(), t.wire, secondary);
      t.from_secondary = secondary;
      t.prefetching = true;
      ++ctx_.overlap.prefetches;
    }
  }

  // Under a memory limit: drops the prefetches no gather has taken and gathers on demand for the rest
  // of the step; whether anything was dropped.
  bool give_back() {
    bool any = false;
    for (const auto& t : units_) any = any || t.prefetching;
    if (any) {
      drop_all();
      order_holds_ = false;
    }
    return any;
  }
  // At step(): what no gather took is dropped, and the next step's prefetch follows this one's gathers.
  void end_step() {
    drop_all();
    gather_order_ = std::move(step_order_);
    step_order_.clear();
    next_ = 0;
    order_holds_ = true;
  }

 private:
  // A unit's prefetch: the buffer and wire its all-gather writes, then the request (destroyed, and so
  // waited for, first).
  struct unit {
    buffer<param_type, system> full;
    wire_buffer wire;
    request pending{};
    bool prefetching = false;
    bool from_secondary = false;  // hpZ: it reads the secondary partition (the node's link)
  };

  // Elements of units gathered or being prefetched now (a unit that is both counts twice: two buffers).
  std::size_t live_parameters() const {
    std::size_t n = 0;
    for (std::size_t u = 0; u < units_.size(); ++u)
      if (!params_.persistent(unit_id{u}))
        n += (std::size_t{gathered_(unit_id{u})} + std::size_t{units_[u].prefetching}) *
             ctx_.layout.unit(unit_id{u}).padded;
    return n;
  }
  // Whether the recorded order gathers unit v before position `pos` (then that gather reads hpZ's secondary).
  bool gathered_before(std::size_t v, std::size_t pos) const {
    for (std::size_t i = 0; i < pos && i < gather_order_.size(); ++i)
      if (gather_order_[i] == v) return true;
    return false;
  }
  // Completes and frees the prefetches no gather took (the order changed, or the step ended).
  void drop_all() {
    for (auto& t : units_)
      if (t.prefetching) drop(t);
  }
  void drop(unit& t) {
    if (t.from_secondary)
      ctx_.node->wait(t.pending);
    else
      ctx_.protocol.wait(t.pending);
    t.full.reset();
    t.wire.reset();
    t.prefetching = false;
    ++ctx_.overlap.prefetch_misses;
  }

  Ctx& ctx_;
  parameter_placement<Ctx>& params_;
  std::function<bool(unit_id)> gathered_;
  std::vector<unit> units_;
  std::vector<std::size_t> gather_order_;  // units in the order the last step gathered them
  std::vector<std::size_t> step_order_;    // the same for the step under way
  std::size_t next_ = 0;                   // the position in gather_order_ of the next prefetch
  bool order_holds_ = true;                // this step has followed gather_order_ so far
};

}  // namespace zero
