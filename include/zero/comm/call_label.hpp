// call_label: how a caller (the engine) names the collectives it issues, e.g. "reduce unit 'fc2'".
#pragma once

#include <concepts>
#include <string_view>

namespace zero::comm {

// What a collective is for. `phase` is a string with static storage ("reduce", "gather", ...);
// `unit` names the model unit, if any, and must outlive the collectives it labels.
struct call_label {
  const char* phase = nullptr;
  std::string_view unit;
};

// A backend that puts labels in its collectives' fingerprints has
//   call_label set_call_label(call_label next)   // labels the following calls; returns the previous label
// The member is optional: the engine labels its calls only where it exists, so a user's backend
// without it keeps working (its calls are just not named).
template <class C>
concept labels_calls = requires(C& c, call_label l) {
  { c.set_call_label(l) } -> std::same_as<call_label>;
};

// For a backend author: static_assert(zero::comm::check_call_labels<my_backend>()); a misspelled member
// would otherwise leave the calls unnamed.
template <class C>
consteval bool check_call_labels() {
  static_assert(labels_calls<C>, "check_call_labels: no member call_label set_call_label(call_label next) "
                                 "returning the previous label");
  return true;
}

// Labels the collectives issued on `c` during its lifetime and restores the previous label after, so
// scopes nest. A no-op for a backend without set_call_label.
template <class C>
class scoped_label {
 public:
  scoped_label(C& c, const char* phase, std::string_view unit = {}) : c_(&c) {
    if constexpr (labels_calls<C>) previous_ = c.set_call_label(call_label{phase, unit});
  }
  ~scoped_label() {
    if constexpr (labels_calls<C>) c_->set_call_label(previous_);
  }
  scoped_label(const scoped_label&) = delete;
  scoped_label& operator=(const scoped_label&) = delete;

 private:
  C* c_;
  call_label previous_{};
};

}  // namespace zero::comm
