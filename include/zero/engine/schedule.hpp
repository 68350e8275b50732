// The gather schedule: stage 3's prefetches and gather buckets, which follow the order the last step gathered its
// units in.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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
//
// Gather buckets (engine_options::gather_bucket_elements, CB): while the step follows the recorded
// order, a gather that starts an all-gather (on demand, or a prefetch) takes with it the units the
// order gathers next, consecutive, while their padded elements stay within the budget (the first
// unit whatever its size), each fits max_live_parameters and the bucket's bytes fit the memory budget,
// stopping at a unit gathered or prefetched already. One all-gather carries them: each rank copies its
// shards side by side into its slot of a wire of their padded elements, and when the first of them is
// taken the wire is copied into each unit's buffer and freed. The others wait, gathered, for their
// gather(u) (counted as prefetches: overlap_report). A bucket of one unit is the unit's own gather.
// The bytes sent are the same as unit by unit, in fewer collectives; the bits are the same.
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

  bool bucketing() const { return P::shards_parameters && ctx_.options.gather_bucket_elements > 0; }

  // Stage 3's gather(u) inside a step: the unit's prefetch when the step follows the recorded order,
  // else a gather started now (hpZ: from the secondary partition for a unit already gathered in the step;
  // with gather buckets, with the units the order gathers next).
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
      if (s.in_bucket) finish(*s.in_bucket);
      g.full = std::move(s.full);
      g.wire = std::move(s.wire);
      g.pending = std::move(s.pending);
      s.prefetching = false;
      s.in_bucket.reset();
      ++ctx_.overlap.prefetch_hits;
    } else {
      const unit_layout& ul = ctx_.layout.unit(u);
      ctx_.make_room(params_.gather_bytes(ul, g.from_secondary));
      g.full = buffer<param_type, system>(ul.padded, mem_category::transient, ctx_.acct, uninitialized);
      // (the step follows the order here unless it just departed from it: then the order is not asked)
      const std::vector<std::size_t> others =
          bucketing() && order_holds_ ? bucket_after(position, ul.padded, ul.padded * sizeof(param_type)) : none_;
      if (others.empty()) {
        g.pending = params_.start_gather(ctx_.protocol, u, g.full.data(), g.wire, g.from_secondary);
      } else {  // taken now: its buffer lent to units_ while the bucket is copied out, and the wire freed
        s.full = std::move(g.full);
        try {
          finish(*start_bucket(u, s.full.size(), others));
        } catch (...) {
          s.full.reset();
          throw;
        }
        g.full = std::move(s.full);
      }
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
    while (next_ < end) {
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
      const std::vector<std::size_t> others = bucketing() ? bucket_after(next_, ul.padded, 0) : none_;
      t.full = buffer<param_type, system>(ul.padded, mem_category::transient, ctx_.acct, uninitialized);
      if (others.empty())
        t.pending = params_.start_gather(ctx_.protocol, v, t.full.data(), t.wire, secondary);
      else
        t.in_bucket = start_bucket(v, t.full.size(), others);
      t.from_secondary = secondary;
      t.prefetching = true;
      ++ctx_.overlap.prefetches;
      next_ += 1 + others.size();
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
  // A gather bucket in flight: its units (in the order's order) and the wire their one all-gather
  // writes, until the first of them is taken.
  struct bucket {
    std::vector<std::size_t> members;
    buffer<param_type, system> wire;
    request pending{};
    bool open = true;  // the all-gather not yet waited for and copied out
  };
  // A unit's prefetch: the buffer and wire its all-gather writes, then the request (destroyed, and so
  // waited for, first); or its place in a bucket.
  struct unit {
    buffer<param_type, system> full;
    wire_buffer wire;
    request pending{};
    std::shared_ptr<bucket> in_bucket;
    bool prefetching = false;
    bool from_secondary = false;  // hpZ: it reads the secondary partition (the node's link)
  };

  // The units a bucket starting at `position` of the recorded order takes besides its first (of
  // `first_padded` elements): the next ones in the order while the rules above admit them. `credit`:
  // bytes the first unit's gather already made room for (its buffer, on demand).
  std::vector<std::size_t> bucket_after(std::size_t position, std::size_t first_padded, std::size_t credit) const {
    std::vector<std::size_t> others;
    const std::size_t budget = ctx_.options.gather_bucket_elements, live_limit = ctx_.options.max_live_parameters;
    const std::size_t live = live_parameters() + first_padded;
    std::size_t elements = first_padded, added = 0;
    for (std::size_t p = position + 1; p < gather_order_.size(); ++p) {
      const std::size_t v = gather_order_[p];
      const std::size_t padded = ctx_.layout.unit(unit_id{v}).padded;
      if (v == gather_order_[position] || std::find(others.begin(), others.end(), v) != others.end()) break;
      if (gathered_(unit_id{v}) || units_[v].prefetching) break;
      if (elements + padded > budget) break;
      if (live_limit > 0 && live + added + padded > live_limit) break;
      // The bucket's buffers and its wire, each of all its members' elements.
      if (!ctx_.has_room(2 * (elements + padded) * sizeof(param_type) - credit)) break;
      others.push_back(v);
      elements += padded;
      added += padded;
    }
    return others;
  }
  // Starts the all-gather of a bucket: `first` (whose buffer, of `first_padded` elements, the caller
  // holds in units_) and `others`, each given a buffer and marked prefetched; this rank's shards copied
  // side by side into its slot of the wire.
  std::shared_ptr<bucket> start_bucket(unit_id first, std::size_t first_padded, const std::vector<std::size_t>& others) {
    auto b = std::make_shared<bucket>();
    b->members.push_back(first.index);
    b->members.insert(b->members.end(), others.begin(), others.end());
    std::size_t elements = first_padded;
    std::vector<buffer<param_type, system>> full;  // the others' buffers, theirs once the all-gather started
    for (std::size_t v : others) {
      const std::size_t padded = ctx_.layout.unit(unit_id{v}).padded;
      full.emplace_back(padded, mem_category::transient, ctx_.acct, uninitialized);
      elements += padded;
    }
    b->wire = buffer<param_type, system>(elements, mem_category::transient, ctx_.acct, uninitialized);
    const std::size_t slot = elements / static_cast<std::size_t>(ctx_.ranks());
    param_type* mine = b->wire.data() + static_cast<std::size_t>(ctx_.rank) * slot;
    for (std::size_t v : b->members) {
      const std::size_t shard = ctx_.layout.unit(unit_id{v}).shard;
      ctx_.sys.copy(mine, params_.shard_of(unit_id{v}), shard * sizeof(param_type));
      mine += shard;
    }
    const auto l = ctx_.label("gather bucket", first);
    b->pending = ctx_.protocol.start_all_gather(b->wire.data() + static_cast<std::size_t>(ctx_.rank) * slot,
                                                b->wire.data(), slot);
    for (std::size_t i = 0; i < others.size(); ++i) {
      unit& t = units_[others[i]];
      t.full = std::move(full[i]);
      t.in_bucket = b;
      t.prefetching = true;
      t.from_secondary = false;
      ++ctx_.overlap.prefetches;
    }
    ++ctx_.overlap.gather_buckets;
    return b;
  }
  // Waits for a bucket's all-gather and copies each rank's slot into its members' buffers in units_,
  // then frees the wire.
  void finish(bucket& b) {
    if (!b.open) return;
    b.open = false;
    ctx_.protocol.wait(b.pending);
    const std::size_t n = static_cast<std::size_t>(ctx_.ranks()), slot = b.wire.size() / n;
    for (std::size_t r = 0; r < n; ++r) {
      const param_type* from = b.wire.data() + r * slot;
      for (std::size_t v : b.members) {
        const std::size_t shard = ctx_.layout.unit(unit_id{v}).shard;
        ctx_.sys.copy(units_[v].full.data() + r * shard, from, shard * sizeof(param_type));
        from += shard;
      }
    }
    b.wire.reset();
  }

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
    if (t.in_bucket) {  // the bucket's all-gather still writes every member's slot of its wire
      bucket& b = *t.in_bucket;
      if (b.open) {
        b.open = false;
        ctx_.protocol.wait(b.pending);
        b.wire.reset();
      }
      t.in_bucket.reset();
    } else if (t.from_secondary) {
      ctx_.node->wait(t.pending);
    } else {
      ctx_.protocol.wait(t.pending);
    }
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
  const std::vector<std::size_t> none_{};  // no unit besides the first: a gather of its own
  std::size_t next_ = 0;                   // the position in gather_order_ of the next prefetch
  bool order_holds_ = true;                // this step has followed gather_order_ so far
};

}  // namespace zero
