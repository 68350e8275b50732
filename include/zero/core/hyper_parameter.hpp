// zero::hyper_parameter: a named member of a policy (an optimizer's lr, beta1, ...), so generic code can save, load and
// print its settings.
#pragma once

#include <string_view>
#include <tuple>
#include <type_traits>

namespace zero {

// The types a hyper-parameter may have: what a checkpoint manifest stores exactly (a float widens
// to the JSON number of its double; a bool is a JSON boolean).
template <class T>
inline constexpr bool is_hyper_parameter_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bool>;

template <class O, class T>
struct hyper_parameter {
  static_assert(is_hyper_parameter_type_v<T>, "zero::hyper_parameter: a setting is a float, a double or a bool");
  using owner = O;
  using type = T;
  // Through an alias: nvcc rewrites a plain `T O::*member` with parentheses that the host
  // compiler then warns about (-Wparentheses).
  using member_pointer = T O::*;
  std::string_view name;
  member_pointer member;
};

// field("lr", &adamw::lr): the owner and the type deduced from the member pointer.
template <class O, class T>
constexpr hyper_parameter<O, T> field(std::string_view name, T O::*member) {
  return {name, member};
}

template <class L, class O>
inline constexpr bool is_hyper_parameter_list_v = false;
template <class O, class... Owners, class... Ts>
inline constexpr bool is_hyper_parameter_list_v<std::tuple<hyper_parameter<Owners, Ts>...>, O> =
    (std::is_base_of_v<Owners, O> && ...);

// A std::tuple of hyper_parameter<Owner, T>, one per setting of O (possibly none), each a member of O
// or of a base of O.
template <class L, class O>
concept hyper_parameter_list = is_hyper_parameter_list_v<std::remove_cvref_t<L>, O>;

// Calls f(h) for each hyper_parameter h of the list, in order.
template <class L, class F>
constexpr void for_each_hyper_parameter(const L& list, F&& f) {
  std::apply([&](const auto&... h) { (f(h), ...); }, list);
}

}  // namespace zero
