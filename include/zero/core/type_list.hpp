// zero::type_list: a compile-time list of policy types, walked to instantiate, dispatch and test every member.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

namespace zero {

template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
  // The same types as a std::tuple: what doctest's TEST_CASE_TEMPLATE_APPLY takes.
  using tuple = std::tuple<Ts...>;

  // f.template operator()<T>() for each T, in order.
  template <class F>
  static constexpr void for_each(F&& f) {
    (f.template operator()<Ts>(), ...);
  }

  // act.template operator()<T>() for the first T with match.template operator()<T>() true; returns
  // whether one matched. The one place where a value known at run time picks a type.
  template <class Match, class Act>
  static bool visit_first(Match&& match, Act&& act) {
    bool found = false;
    (void)((!found && match.template operator()<Ts>() ? (act.template operator()<Ts>(), found = true) : false) || ...);
    return found;
  }

  // T::name of each T, in order (for a command line's choices and its messages).
  static std::vector<std::string> names() { return {std::string(Ts::name)...}; }
};

}  // namespace zero
