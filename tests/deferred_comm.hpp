// A nonblocking test backend that moves data only when a request is waited for: an engine that reads
// a result early, or writes a buffer in flight, computes different bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/nonblocking.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"

namespace testing {

// deferred<C>: start_* queues the collective; wait(r) runs the queue, oldest first, up to r's, so the
// inner backend sees the collectives in the order they were started (as every rank must). A blocking
// call first runs everything started before it. The label current at start goes with the call.
template <zero::CommBackend C>
class deferred {
 public:
  using system = typename C::system;

  class request {
   public:
    request() = default;
    request(request&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), id_(o.id_) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        finish();
        owner_ = std::exchange(o.owner_, nullptr);
        id_ = o.id_;
      }
      return *this;
    }
    ~request() { finish(); }

   private:
    friend class deferred;
    request(deferred* owner, std::uint64_t id) : owner_(owner), id_(id) {}
    void finish() noexcept {
      if (!owner_) return;
      try {
        owner_->run_until(id_);
      } catch (...) {
      }
      owner_ = nullptr;
    }
    deferred* owner_ = nullptr;
    std::uint64_t id_ = 0;
  };

  explicit deferred(C& inner) : inner_(&inner) {}
  deferred(const deferred&) = delete;
  deferred& operator=(const deferred&) = delete;

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  zero::comm::call_label set_call_label(zero::comm::call_label l) {
    const auto previous = label_;
    label_ = l;
    return previous;
  }

  template <class T>
  void all_reduce(const T* s, T* r, std::size_t n, zero::reduce_op op) {
    run_all();
    labelled(label_, [&] { inner_->all_reduce(s, r, n, op); });
  }
  template <class T>
  void reduce_scatter(const T* s, T* r, std::size_t n, zero::reduce_op op) {
    run_all();
    labelled(label_, [&] { inner_->reduce_scatter(s, r, n, op); });
  }
  template <class T>
  void all_gather(const T* s, T* r, std::size_t n) {
    run_all();
    labelled(label_, [&] { inner_->all_gather(s, r, n); });
  }
  template <class T>
  void broadcast(const T* s, T* r, std::size_t n, int root) {
    run_all();
    labelled(label_, [&] { inner_->broadcast(s, r, n, root); });
  }
  void barrier() {
    run_all();
    inner_->barrier();
  }
  template <class T>
  void all_to_all(const T* s, T* r, std::size_t n)
    requires zero::comm::has_all_to_all<C>
  {
    run_all();
    labelled(label_, [&] { inner_->all_to_all(s, r, n); });
  }
  template <class T>
  request start_all_to_all(const T* s, T* r, std::size_t n)
    requires zero::comm::has_all_to_all<C>
  {
    return queue([=, this] { inner_->all_to_all(s, r, n); });
  }
  // A deferred backend over the inner backend's split (which it owns).
  std::unique_ptr<deferred> split(int color)
    requires zero::comm::splittable<C>
  {
    run_all();
    auto part = inner_->split(color);
    auto out = std::make_unique<deferred>(*part);
    out->owned_ = std::move(part);
    return out;
  }

  template <class T>
  request start_all_reduce(const T* s, T* r, std::size_t n, zero::reduce_op op) {
    return queue([=, this] { inner_->all_reduce(s, r, n, op); });
  }
  template <class T>
  request start_reduce_scatter(const T* s, T* r, std::size_t n, zero::reduce_op op) {
    return queue([=, this] { inner_->reduce_scatter(s, r, n, op); });
  }
  template <class T>
  request start_all_gather(const T* s, T* r, std::size_t n) {
    return queue([=, this] { inner_->all_gather(s, r, n); });
  }
  void wait(request& r) {
    if (!r.owner_) return;
    r.owner_ = nullptr;
    run_until(r.id_);
  }

  // Collectives started and not yet run.
  std::size_t pending() const { return queue_.size(); }

 private:
  struct queued {
    std::uint64_t id;
    zero::comm::call_label label;
    std::function<void()> run;
  };
  request queue(std::function<void()> f) {
    queue_.push_back(queued{++last_id_, label_, std::move(f)});
    return request(this, last_id_);
  }
  void run_until(std::uint64_t id) {
    while (!queue_.empty() && queue_.front().id <= id) {
      queued q = std::move(queue_.front());
      queue_.pop_front();
      labelled(q.label, q.run);
    }
  }
  void run_all() { run_until(last_id_); }
  template <class F>
  void labelled(zero::comm::call_label l, F&& f) {
    if constexpr (zero::comm::labels_calls<C>) {
      const auto previous = inner_->set_call_label(l);
      try {
        f();
      } catch (...) {
        inner_->set_call_label(previous);
        throw;
      }
      inner_->set_call_label(previous);
    } else {
      f();
    }
  }

  C* inner_;
  std::unique_ptr<C> owned_;  // a split's backend
  zero::comm::call_label label_{};
  std::deque<queued> queue_;
  std::uint64_t last_id_ = 0;
};

}  // namespace testing
