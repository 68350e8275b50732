// A gradient reducer: the buckets kernels write, their fusion, and the reduces in flight, over a method.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "zero/concepts/gradient_reducer.hpp"
#include "zero/core/memory.hpp"
#include "zero/engine/context.hpp"

namespace zero::reduce {

// A unit's gradient as handed to a method: the step's first reduce of the unit or a later one, and
// the bucket the kernels wrote (empty where the method reduces its persistent store in place).
template <class Ctx>
struct unit_part {
  unit_id unit{};
  bool first = false;
  buffer<typename Ctx::grad_type, typename Ctx::system> bucket;
};

// What every reducer shares, whatever travels on the wire: a unit's gradient goes to a transient
// bucket from its first grads() to its reduce() where the method asks for one; units join an open
// bucket of reduce_bucket_elements (stages 1-3) whose one collective starts when the next unit would
// not fit; started reduces are completed oldest first, at most reduces_in_flight left pending with
// overlap on (none without). Method (exact, quantized, binned; one file each) holds the gradient
// store, starts a reduce of some units' buckets and completes it into the store, and computes the norm.
template <class Ctx, class Method>
class reducer {
 public:
  using context_type = Ctx;
  using method_type = Method;
  using grad_type = typename Ctx::grad_type;
  using system = typename Ctx::system;
  using P = typename Ctx::partitioner;
  static constexpr const char* name = Method::name;
  static constexpr bool available = Method::available;
  static constexpr bool store_sharded = Method::store_sharded;  // the store holds only this rank's slices

  explicit reducer(Ctx& c) : ctx_(c), method_(c), open_(c.spec.num_units()) {}
  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;

  static bool chosen(const engine_options& o) { return Method::chosen(o); }
  static void accept(const Ctx& c) { Method::accept(c); }
  static std::size_t grad_bytes(const engine_options& o) { return Method::grad_bytes(o); }
  // Bytes it keeps between steps besides the gradient store (an error buffer), for a model of
  // `padded` elements: in memory() under the gradient category, and in the engine's formulas.
  static std::uint64_t extra_state_bytes(const engine_options& o, std::uint64_t padded) {
    return Method::extra_state_bytes(o, padded);
  }

  // Before kernels write unit u's gradient: its bucket, zero, where the method uses buckets.
  void open(unit_id u) {
    auto& b = open_[u.index];
    if (!Method::uses_bucket(ctx_) || !b.empty()) return;
    const std::size_t padded = ctx_.layout.unit(u).padded;
    ctx_.make_room(padded * sizeof(grad_type));
    b = buffer<grad_type, system>(padded, mem_category::transient, ctx_.acct);
  }
  // Where kernels write unit u's gradient in this micro-batch: its bucket, or the persistent store.
  grad_type* unit_gradient(unit_id u) {
    if (Method::uses_bucket(ctx_)) return open_[u.index].data();
    return method_.persistent_gradient(u);
  }
  // Starts (or, in a fused bucket, schedules) the reduction of unit u's gradient over the ranks.
  void reduce(unit_id u, bool first) {
    unit_part<Ctx> part{u, first, std::move(open_[u.index])};
    if (fuses()) {
      const std::size_t padded = ctx_.layout.unit(u).padded;
      if (!fusing_.empty() && fusing_elements_ + padded > ctx_.options.reduce_bucket_elements) flush();
      fusing_elements_ += padded;
      fusing_.push_back(std::move(part));
      if (fusing_elements_ >= ctx_.options.reduce_bucket_elements) flush();
      return;
    }
    std::vector<unit_part<Ctx>> one;
    one.push_back(std::move(part));
    launched(method_.start(std::move(one)));
  }
  // Starts the open fused bucket's collective, if any.
  void flush() {
    std::vector<unit_part<Ctx>> parts = std::move(fusing_);
    fusing_.clear();
    fusing_elements_ = 0;
    if (parts.empty()) return;
    const bool fused = parts.size() > 1;
    auto f = method_.start(std::move(parts));
    if (fused) ++ctx_.overlap.fused_reduces;
    launched(std::move(f));
  }
  std::size_t in_flight() const { return pending_.size(); }
  // Waits for the oldest reduce in flight and adds it into the gradient store.
  void complete_oldest() {
    auto f = std::move(pending_.front());
    pending_.pop_front();
    method_.complete(f);
  }
  // Every reduce of the step started and completed; the store then readable (settle).
  void complete_all() {
    flush();
    while (!pending_.empty()) complete_oldest();
    method_.settle();
  }
  // The global sum of squares of the averaged gradient, the same on every rank (with the optimizer's
  // agreement, which rides on the norm's collective).
  norm_result sum_of_squares(float divisor, const agreement_terms& a) { return method_.sum_of_squares(divisor, a); }
  std::size_t averaging_count() const { return method_.averaging_count(); }
  bool sharded() const { return store_sharded; }
  template <class F>
  void with_gradients(F&& f) const {
    method_.with_gradients(std::forward<F>(f));
  }
  // After step(): the store zero for the next step.
  void clear() { method_.clear(); }

 private:
  bool fuses() const {
    return ctx_.options.reduce_bucket_elements > 0 && Method::uses_bucket(ctx_) && !updates_every_element<P>;
  }
  // Files a started reduce, completing the oldest while more than reduces_in_flight are pending.
  void launched(typename Method::in_flight f) {
    pending_.push_back(std::move(f));
    const std::size_t limit = ctx_.overlapping() ? static_cast<std::size_t>(ctx_.options.reduces_in_flight) : 0;
    while (pending_.size() > limit) complete_oldest();
    if (ctx_.overlapping()) {
      ++ctx_.overlap.reduces_started;
      ctx_.overlap.max_reduces_in_flight = std::max<std::uint64_t>(ctx_.overlap.max_reduces_in_flight, pending_.size());
    }
  }

  Ctx& ctx_;
  Method method_;                                // the store, before the buckets and requests that write into it
  std::vector<buffer<grad_type, system>> open_;  // each unit's bucket between grads() and reduce()
  std::vector<unit_part<Ctx>> fusing_;           // the open bucket of reduce_bucket_elements, in reduce order
  std::size_t fusing_elements_ = 0;
  std::deque<typename Method::in_flight> pending_;  // started, oldest first (destroyed, and waited for, first)
};

}  // namespace zero::reduce
