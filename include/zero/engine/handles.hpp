// The engine's handles: a gathered unit's parameters, a unit's gradient buffers, an evaluation() scope.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zero/core/model_spec.hpp"
#include "zero/engine/tensor_view.hpp"
#include "zero/error.hpp"

namespace zero::detail {

// engine<...>::evaluation_scope, ::gathered and ::grad_buffers (the engine befriends them: they check
// its unit states and release through it).
// An evaluation() scope: ends when destroyed (movable, not copyable).
template <class Engine>
class evaluation_scope_handle {
 public:
  evaluation_scope_handle(evaluation_scope_handle&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  evaluation_scope_handle& operator=(evaluation_scope_handle&&) = delete;
  evaluation_scope_handle(const evaluation_scope_handle&) = delete;
  ~evaluation_scope_handle() { end(); }
  // Ends the scope before the destructor would.
  void end() {
    if (e_) e_->end_evaluation();
    e_ = nullptr;
  }

 private:
  friend Engine;
  explicit evaluation_scope_handle(Engine& e) : e_(&e) {}
  Engine* e_;
};

// A unit's gathered parameters; releases the unit when destroyed unless released already.
template <class Engine>
class gathered_handle {
 public:
  gathered_handle(gathered_handle&& o) noexcept : e_(o.e_), u_(o.u_), epoch_(o.epoch_) { o.e_ = nullptr; }
  gathered_handle& operator=(gathered_handle&&) = delete;
  gathered_handle(const gathered_handle&) = delete;
  ~gathered_handle() {
    if (live()) e_->release(u_);
  }
  tensor_view<typename Engine::param_type> operator[](std::string_view tensor) const { return view()[tensor]; }
  unit_view<typename Engine::param_type> view() const {
    ZERO_CHECK(live(), protocol, e_ ? e_->where(u_) : std::string("engine: "),
               "access to parameters of a released unit (gather it again)");
    return unit_view<typename Engine::param_type>(e_->full_params_of(u_), e_->spec_.units()[u_.index],
                                                  e_->layout_.unit(u_), e_->rank_);
  }
  unit_id unit() const { return u_; }
  void release() {
    ZERO_CHECK(live(), protocol, e_ ? e_->where(u_) : std::string("engine: "), "release of a released unit");
    e_->release(u_);
  }

 private:
  friend Engine;
  gathered_handle(Engine& e, unit_id u, std::uint64_t epoch) : e_(&e), u_(u), epoch_(epoch) {}
  bool live() const {
    return e_ && e_->ledger_.at(u_).gathered && e_->ledger_.at(u_).gather_epoch == epoch_;
  }
  Engine* e_;
  unit_id u_;
  std::uint64_t epoch_;
};

// A unit's gradient buffers for the current step; valid until the unit is reduced.
template <class Engine>
class grad_buffers_handle {
 public:
  tensor_view<typename Engine::grad_type> operator[](std::string_view tensor) const { return view()[tensor]; }
  unit_view<typename Engine::grad_type> view() const {
    ZERO_CHECK(e_->ledger_.at(u_).reduce_epoch == epoch_, protocol, e_->where(u_),
               "access to gradients after the unit was reduced (call grads() again for the next micro-batch "
               "or step)");
    return unit_view<typename Engine::grad_type>(e_->full_grads_of(u_), e_->spec_.units()[u_.index],
                                                 e_->layout_.unit(u_), e_->rank_);
  }
  unit_id unit() const { return u_; }

 private:
  friend Engine;
  grad_buffers_handle(Engine& e, unit_id u, std::uint64_t epoch) : e_(&e), u_(u), epoch_(epoch) {}
  Engine* e_;
  unit_id u_;
  std::uint64_t epoch_;
};

}  // namespace zero::detail
