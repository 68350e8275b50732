// An optimizer in a checkpoint: its name, slot names and hyper-parameters, written and read through the optimizer's own
// metadata.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/printable.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/hyper_parameter.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

// Every setting of Opt::hyper_parameters(), under its name. Floats are stored as the JSON number of
// the double they widen to: exact, and read back exactly.
template <Optimizer Opt>
json hyper_parameters(const Opt& o) {
  json j = json::object();
  for_each_hyper_parameter(Opt::hyper_parameters(), [&](const auto& h) { j[std::string(h.name)] = o.*(h.member); });
  return j;
}

// The names of an optimizer's state slots, as the manifest lists them after "master".
template <Optimizer Opt>
std::vector<std::string> slot_names() {
  return std::vector<std::string>(Opt::slot_names.begin(), Opt::slot_names.end());
}

// Refuses state slots of another optimizer.
template <Optimizer Opt>
void check_optimizer(const manifest& m, const std::string& source) {
  ZERO_CHECK(m.optimizer == Opt::name, corrupt, "checkpoint: '", source, "' was saved with optimizer ",
             quote_name(m.optimizer), ", the engine uses '", Opt::name, "'");
  ZERO_CHECK(m.slots.size() == 1 + static_cast<std::size_t>(Opt::slots), corrupt, "checkpoint: '", source, "' has ",
             m.slots.size() - 1, " optimizer slots, optimizer '", Opt::name, "' has ", Opt::slots);
}

namespace detail {

// One saved setting, read back as its type: a float or double from a finite number (a float within
// float range), a bool from true or false. Every failure names the member.
template <class T>
T hyper_value(const json& hp, std::string_view name, const std::string& source) {
  const reader rd{source};
  const std::string key(name);
  const std::string where = "manifest.optimizer.hyper_parameters." + key;
  const json& v = rd.member(hp, key.c_str(), "manifest.optimizer.hyper_parameters");
  if constexpr (std::is_same_v<T, bool>) {
    ZERO_CHECK(v.is_boolean(), corrupt, "checkpoint: '", source, "': ", where, ": expected true or false");
    return v.get<bool>();
  } else {
    const double d = rd.number(v, where);
    if constexpr (std::is_same_v<T, float>)
      if (std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) rd.bad(where, "out of float range");
    return static_cast<T>(d);
  }
}

}  // namespace detail

// The optimizer as saved, e.g. to resume with the same settings: optimizer_from<optim::adamw>(m).
// Settings are read in the order Opt::hyper_parameters() lists them.
template <Optimizer Opt>
Opt optimizer_from(const manifest& m, const std::string& source = "manifest") {
  check_optimizer<Opt>(m, source);
  Opt o{};
  for_each_hyper_parameter(Opt::hyper_parameters(), [&](const auto& h) {
    using T = typename std::remove_cvref_t<decltype(h)>::type;
    o.*(h.member) = detail::hyper_value<T>(m.hyper_parameters, h.name, source);
  });
  return o;
}

}  // namespace zero::checkpoint
