// A gradient reducer: the buckets kernels write, their fusion, and the reduces in flight, over a method.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
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

// A unit in a reduce under way: whether the reduce is the step's first of the unit (stored, not added),
// and where the unit's reduced data starts in what the reduce returns (a method's own convention: its
// elements in a summing bucket, its words in a rank's block of binned words).
struct bucket_part {
  unit_id unit{};
  bool first = false;
  std::size_t at = 0;
};

// The chosen reducer's gradient store as the engine's sweep reads it: its base, fp32 or the
// precision's gradient type (in_fp32 says which). Writable: the host update zeroes what it reads
// (elementwise::clearing_gradient), and clear(true) then zeroes only the rest.
template <class Ctx>
struct gradient_store_view {
  bool in_fp32 = false;
  float* fp32 = nullptr;
  typename Ctx::grad_type* grad = nullptr;
};

// The view of a reducer's store that a with_gradients(f) call hands to f. with_gradients gives readers
// a const base; the store is the reducer's own buffer, which the engine, its owner, may also write.
template <class Ctx, class S>
gradient_store_view<Ctx> store_view(S& s) {
  gradient_store_view<Ctx> v;
  s.with_gradients([&]<class T>(const T* base) {
    if constexpr (std::is_same_v<T, float>) {
      v.in_fp32 = true;
      v.fp32 = const_cast<float*>(base);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
    } else {
      v.grad = const_cast<T*>(base);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
    }
  });
  return v;
}

// Zeroes a gradient store of `size` elements (element_index addressing, `sharded` or whole) but for
// the elements the rank's optimizer updates (layout::updated_real), which the update zeroed as it
// read them: what is left is the padding and, where the store is whole and the states sharded
// (stage 1), the other ranks' slices.
template <class Ctx, class T>
void zero_all_but_updated(Ctx& ctx, T* store, std::size_t size, bool sharded) {
  const zero::layout& lay = ctx.layout;
  std::size_t at = 0;  // the first element not yet zero or updated
  for (std::size_t u = 0; u < lay.num_units(); ++u) {
    const unit_layout& ul = lay.unit(unit_id{u});
    const range r = lay.updated_real(unit_id{u}, ctx.rank, Ctx::partitioner::shards_optimizer_states);
    if (r.empty()) continue;
    const std::size_t begin = element_index(ul, r.begin, sharded, ctx.rank);
    if (begin > at) ctx.sys.fill_zero(store + at, (begin - at) * sizeof(T));
    at = begin + r.size();
  }
  if (size > at) ctx.sys.fill_zero(store + at, (size - at) * sizeof(T));
}

// The engine's view of its reducer: the GradientReducer calls, virtual. The engine's code that calls
// them is compiled once, and each reducer's once, however many the catalog holds (a variant visited at
// every call site compiled each caller once per reducer); one indirect call per unit and step costs
// nothing next to a collective.
template <class Ctx>
class any_reducer {
 public:
  using grad_type = typename Ctx::grad_type;
  virtual ~any_reducer() = default;
  virtual void open(unit_id u) = 0;
  virtual grad_type* unit_gradient(unit_id u) = 0;
  virtual void reduce(unit_id u, bool first) = 0;
  virtual void flush() = 0;
  virtual std::size_t in_flight() const = 0;
  virtual std::size_t reserved_bytes() const = 0;
  virtual void complete_oldest() = 0;
  virtual void complete_all() = 0;
  virtual norm_result sum_of_squares(float divisor, const agreement_terms& a) = 0;
  virtual std::size_t averaging_count() const = 0;
  virtual bool sharded() const = 0;
  virtual gradient_store_view<Ctx> gradients() = 0;
  virtual void clear(bool updated_zeroed) = 0;
};

// What every reducer shares, whatever travels on the wire, compiled once per engine: a unit's
// gradient goes to a transient bucket from its first grads() to its reduce() where the method asks
// for one; units join an open bucket of reduce_bucket_elements (stages 1-3) whose one collective
// starts when the next unit would not fit.
template <class Ctx>
class bucketing : public any_reducer<Ctx> {
 public:
  using grad_type = typename Ctx::grad_type;
  using system = typename Ctx::system;
  using P = typename Ctx::partitioner;

  bucketing(const bucketing&) = delete;
  bucketing& operator=(const bucketing&) = delete;

  // Before kernels write unit u's gradient: its bucket, zero, where the method uses buckets.
  void open(unit_id u) final {
    auto& b = open_[u.index];
    if (!uses_bucket_ || !b.empty()) return;
    const std::size_t padded = ctx_.layout.unit(u).padded;
    ctx_.make_room(padded * sizeof(grad_type));
    b = buffer<grad_type, system>(padded, mem_category::transient, ctx_.acct);
  }
  // Where kernels write unit u's gradient in this micro-batch: its bucket, or the persistent store.
  grad_type* unit_gradient(unit_id u) final {
    if (uses_bucket_) return open_[u.index].data();
    return persistent_gradient(u);
  }
  // Starts (or, in a fused bucket, schedules) the reduction of unit u's gradient over the ranks.
  void reduce(unit_id u, bool first) final {
    unit_part<Ctx> part{u, first, std::move(open_[u.index])};
    if (fuses_) {
      const std::size_t padded = ctx_.layout.unit(u).padded;
      if (!fusing_.empty() && fusing_elements_ + padded > ctx_.options.reduce_bucket_elements) flush();
      fusing_elements_ += padded;
      fusing_.push_back(std::move(part));
      if (fusing_elements_ >= ctx_.options.reduce_bucket_elements) flush();
      return;
    }
    std::vector<unit_part<Ctx>> one;
    one.push_back(std::move(part));
    start(std::move(one));
  }
  // Starts the open fused bucket's collective, if any.
  void flush() final {
    std::vector<unit_part<Ctx>> parts = std::move(fusing_);
    fusing_.clear();
    fusing_elements_ = 0;
    if (parts.empty()) return;
    if (parts.size() > 1) ++ctx_.overlap.fused_reduces;
    start(std::move(parts));
  }

 protected:
  bucketing(Ctx& c, bool uses_bucket)
      : ctx_(c),
        uses_bucket_(uses_bucket),
        fuses_(c.options.reduce_bucket_elements > 0 && uses_bucket && !updates_every_element<P>),
        open_(c.spec.num_units()) {}
  ~bucketing() override = default;
  // The method's part: start a reduce of these units' buckets (and file it), and the store's place
  // for unit u where kernels write into it directly.
  virtual void start(std::vector<unit_part<Ctx>> parts) = 0;
  virtual grad_type* persistent_gradient(unit_id u) = 0;

  Ctx& ctx_;

 private:
  const bool uses_bucket_, fuses_;
  std::vector<buffer<grad_type, system>> open_;  // each unit's bucket between grads() and reduce()
  std::vector<unit_part<Ctx>> fusing_;           // the open bucket of reduce_bucket_elements, in reduce order
  std::size_t fusing_elements_ = 0;
};

// A gradient reducer: the buckets (bucketing) over a method, and the reduces in flight: completed
// oldest first, at most reduces_in_flight left pending with overlap on (none without). Method (exact,
// quantized, binned; one file each) holds the gradient store, starts a reduce of some units' buckets
// and completes it into the store (completion_bytes(f): what completing f allocates beyond what f
// holds), and computes the norm.
template <class Ctx, class Method>
class reducer final : public bucketing<Ctx> {
  using base = bucketing<Ctx>;
  using base::ctx_;

 public:
  using context_type = Ctx;
  using method_type = Method;
  using grad_type = typename Ctx::grad_type;
  static constexpr const char* name = Method::name;
  static constexpr bool available = Method::available;
  static constexpr bool store_sharded = Method::store_sharded;  // the store holds only this rank's slices

  explicit reducer(Ctx& c) : base(c, Method::uses_bucket(c)), method_(c) {}

  static bool chosen(const engine_options& o) { return Method::chosen(o); }
  static void accept(const Ctx& c) { Method::accept(c); }
  static std::size_t grad_bytes(const engine_options& o) { return Method::grad_bytes(o); }
  // Bytes it keeps between steps besides the gradient store (an error buffer), for a model of
  // `padded` elements: in memory() under the gradient category, and in the engine's formulas.
  static std::uint64_t extra_state_bytes(const engine_options& o, std::uint64_t padded) {
    return Method::extra_state_bytes(o, padded);
  }

  std::size_t in_flight() const override { return pending_.size() - oldest_; }
  // The transient bytes completing the reduces in flight will allocate beyond what they hold (qgZ's
  // node sums in two hops), summed: the engine's make_room keeps them free, so that a reduce can
  // always complete within memory_limit_bytes, and overlap needs no more than the blocking protocol.
  std::size_t reserved_bytes() const override { return reserved_; }
  // Waits for the oldest reduce in flight and adds it into the gradient store (spending its reserve).
  void complete_oldest() override {
    auto f = std::move(pending_[oldest_++]);
    if (oldest_ == pending_.size()) {
      pending_.clear();
      oldest_ = 0;
    }
    reserved_ -= method_.completion_bytes(f);
    method_.complete(f);
  }
  // Every reduce of the step started and completed; the store then readable (settle).
  void complete_all() override {
    this->flush();
    while (in_flight() > 0) complete_oldest();
    method_.settle();
  }
  // The global sum of squares of the averaged gradient, the same on every rank (with the optimizer's
  // agreement, which rides on the norm's collective).
  norm_result sum_of_squares(float divisor, const agreement_terms& a) override {
    return method_.sum_of_squares(divisor, a);
  }
  std::size_t averaging_count() const override { return method_.averaging_count(); }
  bool sharded() const override { return store_sharded; }
  template <class F>
  void with_gradients(F&& f) const {
    method_.with_gradients(std::forward<F>(f));
  }
  gradient_store_view<Ctx> gradients() override { return store_view<Ctx>(method_); }
  // After step(): the store zero for the next step; `updated_zeroed`: the update zeroed the elements
  // it read (zero_all_but_updated), so only the rest is left to zero.
  void clear(bool updated_zeroed) override { method_.clear(updated_zeroed); }

 private:
  void start(std::vector<unit_part<Ctx>> parts) override { launched(method_.start(std::move(parts))); }
  grad_type* persistent_gradient(unit_id u) override { return method_.persistent_gradient(u); }
  // Files a started reduce, completing the oldest while more than reduces_in_flight are pending.
  void launched(typename Method::in_flight f) {
    reserved_ += method_.completion_bytes(f);
    pending_.push_back(std::move(f));
    const std::size_t limit = ctx_.overlapping() ? static_cast<std::size_t>(ctx_.options.reduces_in_flight) : 0;
    while (in_flight() > limit) complete_oldest();
    if (ctx_.overlapping()) {
      ++ctx_.overlap.reduces_started;
      ctx_.overlap.max_reduces_in_flight = std::max<std::uint64_t>(ctx_.overlap.max_reduces_in_flight, in_flight());
    }
  }

  Method method_;  // the store, before the requests that write into it
  // Started, oldest first from pending_[oldest_] (those before it completed, moved from), emptied when
  // none is left: a vector, lighter to compile than a deque, holding a step's reduces at most.
  // Destroyed, and so waited for, before the store they write.
  std::vector<typename Method::in_flight> pending_;
  std::size_t oldest_ = 0;
  std::size_t reserved_ = 0;  // the completion_bytes of the reduces in flight
};

}  // namespace zero::reduce
