// The catalog's policies by name, as plan() describes them: what a tool's --precision or --optimizer flag names.
#pragma once

#include <string>
#include <string_view>

#include "zero/catalog.hpp"
#include "zero/engine/plan.hpp"
#include "zero/error.hpp"

namespace zero {

namespace detail {
// The member of catalog list `List` named `name`, as the plan's description `Plan` of it (a policy
// added to the catalog is known here too). Throws zero::error naming the known ones.
template <class List, class Plan>
Plan plan_entry_named(std::string_view name, const char* what) {
  Plan found{};
  const bool ok = List::visit_first([&]<class T>() { return name == T::name; },
                                    [&]<class T>() { found = Plan::template of<T>(); });
  if (!ok) {
    std::string known;
    for (const auto& n : List::names()) known += (known.empty() ? "" : ", ") + n;
    fail(error_kind::invalid_argument, "plan: unknown ", what, " '", name, "' (", known, ")");
  }
  return found;
}
}  // namespace detail

// "fp32", "bf16", "fp16", ...: zero::precisions' member of that name.
inline plan_precision plan_precision_named(std::string_view name) {
  return detail::plan_entry_named<precisions, plan_precision>(name, "precision");
}

// "sgd", "adamw", "lion", ...: zero::optimizers' member of that name.
inline plan_optimizer plan_optimizer_named(std::string_view name) {
  return detail::plan_entry_named<optimizers, plan_optimizer>(name, "optimizer");
}

}  // namespace zero
