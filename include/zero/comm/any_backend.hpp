// comm::any_backend<System>: one CommBackend type over any backend chosen at run time, so that code templated on the
// backend compiles once.
#pragma once

// An engine is a template over its backend: a program that offers comm::threads and comm::mpi
// compiles every engine it uses twice. any_backend wraps either (or any CommBackend whose system is
// System) behind one virtual interface, so engine<S, any_backend<sys::host>, O, P> is compiled once
// and serves both. What it costs: one virtual call per collective (nanoseconds next to a collective's
// microseconds); the results are the wrapped backend's, bit for bit.
//
// What it moves: the element types in element_types (what the engine sends for every precision and
// feature: gradients and parameters in float, bf16 and fp16, the norm and the trainers' reports in
// double, the settings check and the reproducible mode's words in std::int64_t, ZeRO++'s codes in
// std::uint8_t); a call in another type does not compile.
//
// The optional members of a backend (comm/nonblocking.hpp, all_to_all.hpp, split.hpp,
// call_label.hpp) are always declared, and what the wrapped backend lacks is decided at run time:
//   nonblocking calls  forwarded where the wrapped backend has them; otherwise start_* runs the
//                      blocking call and returns a complete request. overlaps() says which, and
//                      comm::counted (hence the engine) reads it: over a blocking backend the
//                      engine behaves, and reports its memory, exactly as over that backend itself.
//   all_to_all, split  forwarded; where the wrapped backend lacks one, the call throws zero::error
//                      (invalid_argument) naming the member, on every rank alike (the engine calls
//                      them at construction, for qgZ and hpZ).
//   call labels        forwarded; a backend without them keeps the label here and ignores it.
//   make_system()      forwarded; a backend without it gives a default-constructed System.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/nonblocking.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/half_types.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/core/type_list.hpp"
#include "zero/error.hpp"

namespace zero::comm {

template <class System>
class any_backend {
  struct pending;  // a collective the wrapped backend started (below)

 public:
  using system = System;
  using element_types = type_list<float, double, bf16, fp16, std::int64_t, std::uint8_t>;
  template <class T>
  static constexpr bool moves =
      []<class... Ts>(type_list<Ts...>*) { return (std::same_as<T, Ts> || ...); }(static_cast<element_types*>(nullptr));

  // Wraps `inner` by reference: it must outlive this object.
  template <CommBackend C>
  requires(!std::same_as<C, any_backend> && std::same_as<typename C::system, System>) explicit any_backend(C& inner)
      : impl_(std::make_unique<model_of<C>>(&inner, nullptr)) {}
  // Owns `inner` (what split() returns is wrapped this way).
  template <CommBackend C>
  requires(!std::same_as<C, any_backend> &&
           std::same_as<typename C::system, System>) explicit any_backend(std::unique_ptr<C> inner)
      : impl_(std::make_unique<model_of<C>>(inner.get(), std::move(inner))) {}

  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }
  // Whether start_* returns before its collective completes (the wrapped backend is nonblocking).
  bool overlaps() const { return impl_->overlaps(); }
  call_label set_call_label(call_label l) { return impl_->set_call_label(l); }
  // The wrapped backend's system instance (a device backend's carries the rank's context and
  // stream), or a default-constructed System where it hands none out.
  System make_system() const { return impl_->make_system(); }

  template <class T>
  requires moves<T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    impl_->call(op_kind::all_reduce, element<T>, send, recv, count, op, 0);
  }
  template <class T>
  requires moves<T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    impl_->call(op_kind::reduce_scatter, element<T>, send, recv, count, op, 0);
  }
  template <class T>
  requires moves<T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    impl_->call(op_kind::all_gather, element<T>, send, recv, count, reduce_op::sum, 0);
  }
  template <class T>
  requires moves<T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    impl_->call(op_kind::broadcast, element<T>, send, recv, count, reduce_op::sum, root);
  }
  template <class T>
  requires moves<T>
  void all_to_all(const T* send, T* recv, std::size_t count) {
    impl_->call(op_kind::all_to_all, element<T>, send, recv, count, reduce_op::sum, 0);
  }
  void barrier() { impl_->barrier(); }
  std::unique_ptr<any_backend> split(int color) { return impl_->split(color); }

  // A started collective: movable, complete when default-constructed or waited; dropped unwaited,
  // the wrapped backend's request waits in its destructor.
  class request {
   public:
    request() = default;

   private:
    friend class any_backend;
    std::unique_ptr<pending> pending_;
  };
  template <class T>
  requires moves<T> request start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    return impl_->start(op_kind::all_reduce, element<T>, send, recv, count, op);
  }
  template <class T>
  requires moves<T> request start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    return impl_->start(op_kind::reduce_scatter, element<T>, send, recv, count, op);
  }
  template <class T>
  requires moves<T> request start_all_gather(const T* send, T* recv, std::size_t count) {
    return impl_->start(op_kind::all_gather, element<T>, send, recv, count, reduce_op::sum);
  }
  template <class T>
  requires moves<T> request start_all_to_all(const T* send, T* recv, std::size_t count) {
    return impl_->start(op_kind::all_to_all, element<T>, send, recv, count, reduce_op::sum);
  }
  void wait(request& r) {
    if (!r.pending_) return;
    const std::unique_ptr<pending> p = std::move(r.pending_);
    p->wait();
  }

 private:
  // A collective the wrapped backend started; wait() completes it.
  struct pending {
    virtual ~pending() = default;
    virtual void wait() = 0;
  };
  static request make_request(std::unique_ptr<pending> p) {
    request r;
    r.pending_ = std::move(p);
    return r;
  }
  enum class op_kind { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };
  // The index of T in element_types.
  template <class T>
  static constexpr int element = []<class... Ts>(type_list<Ts...>*) {
    int i = 0, found = -1;
    ((std::same_as<T, Ts> ? (found = i, ++i) : ++i), ...);
    return found;
  }(static_cast<element_types*>(nullptr));

  // f.template operator()<T>() for the element type of index e.
  template <class F>
  static void with_element(int e, F&& f) {
    element_types::visit_first([e]<class T>() { return element<T> == e; }, f);
  }

  struct model {
    virtual ~model() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual bool overlaps() const = 0;
    virtual call_label set_call_label(call_label l) = 0;
    virtual System make_system() const = 0;
    virtual void call(op_kind k, int e, const void* send, void* recv, std::size_t count, reduce_op op, int root) = 0;
    virtual request start(op_kind k, int e, const void* send, void* recv, std::size_t count, reduce_op op) = 0;
    virtual void barrier() = 0;
    virtual std::unique_ptr<any_backend> split(int color) = 0;
  };

  template <class C>
  struct model_of final : model {
    model_of(C* c, std::unique_ptr<C> owned) : c_(c), owned_(std::move(owned)) {}
    int rank() const override { return c_->rank(); }
    int size() const override { return c_->size(); }
    bool overlaps() const override {
      if constexpr (overlap_decided_at_run_time<C>)
        return c_->overlaps();
      else
        return nonblocking<C>;
    }
    call_label set_call_label(call_label l) override {
      if constexpr (labels_calls<C>)
        return c_->set_call_label(l);
      else
        return std::exchange(label_, l);
    }
    System make_system() const override {
      if constexpr (requires(const C& c) { c.make_system(); })
        return c_->make_system();
      else
        return System{};
    }
    void call(op_kind k, int e, const void* send, void* recv, std::size_t count, reduce_op op, int root) override {
      with_element(e, [&]<class T>() {
        const T* s = static_cast<const T*>(send);
        T* r = static_cast<T*>(recv);
        switch (k) {
          case op_kind::all_reduce:
            c_->all_reduce(s, r, count, op);
            break;
          case op_kind::reduce_scatter:
            c_->reduce_scatter(s, r, count, op);
            break;
          case op_kind::all_gather:
            c_->all_gather(s, r, count);
            break;
          case op_kind::broadcast:
            c_->broadcast(s, r, count, root);
            break;
          case op_kind::all_to_all:
            if constexpr (requires { c_->all_to_all(s, r, count); })
              c_->all_to_all(s, r, count);
            else
              missing("all_to_all");
            break;
        }
      });
    }
    request start(op_kind k, int e, const void* send, void* recv, std::size_t count, reduce_op op) override {
      if constexpr (nonblocking<C>) {
        request out;
        with_element(e, [&]<class T>() {
          const T* s = static_cast<const T*>(send);
          T* r = static_cast<T*>(recv);
          switch (k) {
            case op_kind::all_reduce:
              out = started(c_->start_all_reduce(s, r, count, op));
              break;
            case op_kind::reduce_scatter:
              out = started(c_->start_reduce_scatter(s, r, count, op));
              break;
            case op_kind::all_gather:
              out = started(c_->start_all_gather(s, r, count));
              break;
            case op_kind::all_to_all:
              if constexpr (requires { c_->start_all_to_all(s, r, count); })
                out = started(c_->start_all_to_all(s, r, count));
              else
                call(k, e, send, recv, count, op, 0);
              break;
            case op_kind::broadcast:
              call(k, e, send, recv, count, op, 0);
              break;
          }
        });
        return out;
      } else {
        call(k, e, send, recv, count, op, 0);
        return request{};
      }
    }
    void barrier() override { c_->barrier(); }
    std::unique_ptr<any_backend> split(int color) override {
      if constexpr (splittable<C>)
        return std::make_unique<any_backend>(c_->split(color));
      else
        missing("split");
      return nullptr;
    }

   private:
    [[noreturn]] void missing(const char* member) const {
      fail(error_kind::invalid_argument, "comm::any_backend rank ", c_->rank(), ": the backend it wraps has no ",
           member, " (comm/", member, ".hpp)");
    }
    // The wrapped backend's request, waited through any_backend's.
    template <class R>
    struct pending_of final : pending {
      pending_of(C* c, R r) : c(c), r(std::move(r)) {}
      void wait() override { c->wait(r); }
      C* c;
      R r;
    };
    template <class R>
    request started(R r) {
      return make_request(std::make_unique<pending_of<R>>(c_, std::move(r)));
    }
    C* c_;
    std::unique_ptr<C> owned_;
    call_label label_{};
  };

  std::unique_ptr<model> impl_;
};

}  // namespace zero::comm
