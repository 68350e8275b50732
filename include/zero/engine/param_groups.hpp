// Parameter groups (engine_options::param_groups): each unit's elements as runs of one group, and each group's
// optimizer.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/concepts/optimizer_state.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/hash.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/core/value_checks.hpp"
#include "zero/engine/options.hpp"
#include "zero/error.hpp"

namespace zero {

// A run of a unit's consecutive elements (unit-local, unpadded) that take one group's hyper-parameters:
// 0, the optimizer's own; g + 1, engine_options::param_groups[g].
struct group_run {
  range elements;
  std::size_t group = 0;
};

// Group g's optimizer (g: an entry of engine_options::param_groups): the engine's with the group's lr
// scale (one fp32 multiplication, so a schedule's lr scales every group alike) and weight decay.
template <Optimizer Opt>
Opt group_optimizer(const Opt& base, const param_group& g) {
  Opt o = base;
  if constexpr (requires { o.lr = 1.0f; }) o.lr = fp::mul(o.lr, g.lr_scale);
  if constexpr (requires { o.weight_decay = 1.0f; })
    if (g.weight_decay) o.weight_decay = *g.weight_decay;
  return o;
}

// What the ranks' settings check compares: the overrides (names, scales, decays) and which tensor the
// spec puts in which group, each hashed into one word.
inline std::uint64_t param_groups_hash(const std::vector<param_group>& groups) {
  std::string text;
  for (const param_group& p : groups)
    text += detail::concat(p.name, "=", std::bit_cast<std::uint32_t>(p.lr_scale), ",",
                           p.weight_decay ? detail::concat(std::bit_cast<std::uint32_t>(*p.weight_decay)) : "-",
                           p.element_wise ? ",element_wise" : "", ";");
  return fnv1a64(text.data(), text.size());
}
inline std::uint64_t tensor_groups_hash(const model_spec& spec) {
  std::string text;
  for (const unit_spec& u : spec.units())
    for (const tensor_spec& t : u.tensors)
      if (!t.group.empty()) text += detail::concat(u.name, ".", t.name, "=", t.group, ";");
  return fnv1a64(text.data(), text.size());
}

// The groups' runs over a model's units, from the spec's tensor groups (unit_builder::group) and the
// overrides. Built at construction after the ranks' settings check (so every rank builds the same
// map, or every rank refuses), where it refuses overrides the model or the optimizer cannot take,
// naming the group: a name given twice or to no tensor, a scale or decay out of range, a weight decay
// for an optimizer without one, an lr scale other than 1 for one without an lr, element_wise for one
// without a matrix rule.
class param_group_map {
 public:
  param_group_map() = default;
  template <Optimizer Opt>
  static param_group_map make(const model_spec& spec, const layout& lay, const std::vector<param_group>& groups,
                              int rank) {
    check_optimizer<Opt>(groups, rank);
    return param_group_map(spec, lay, groups, rank);
  }

  // 1 + the overrides: group 0 is the optimizer's own.
  std::size_t count() const { return count_; }
  // Unit u's elements as runs, in order, together the whole unit.
  const std::vector<group_run>& runs(unit_id u) const { return runs_[u.index]; }
  // Whether group g's tensors take a matrix optimizer's element-wise rule (param_group::element_wise).
  bool element_wise(std::size_t g) const { return g < element_wise_.size() && element_wise_[g]; }
  // The group of tensor t of unit u (0: the optimizer's own).
  std::size_t group_of(const layout& lay, unit_id u, std::size_t t) const {
    const std::size_t first = lay.unit(u).tensors[t].begin;
    for (const group_run& run : runs_[u.index])
      if (run.elements.begin <= first && first < run.elements.end) return run.group;
    return 0;
  }

 private:
  param_group_map(const model_spec& spec, const layout& lay, const std::vector<param_group>& groups, int rank)
      : count_(groups.size() + 1), element_wise_(groups.size() + 1, false) {
    std::unordered_map<std::string, std::size_t> index;  // override name -> its group number
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const param_group& p = groups[g];
      ZERO_CHECK(!p.name.empty(), invalid_argument, "rank ", rank, ": engine_options::param_groups[", g,
                 "]: a group name must not be empty");
      ZERO_CHECK(index.try_emplace(p.name, g + 1).second, invalid_argument, "rank ", rank,
                 ": engine_options::param_groups: group '", p.name, "' is given twice");
      detail::require_non_negative(detail::concat("engine_options::param_groups['", p.name, "']"), "lr_scale",
                                   p.lr_scale);
      if (p.weight_decay)
        detail::require_non_negative(detail::concat("engine_options::param_groups['", p.name, "']"), "weight_decay",
                                     *p.weight_decay);
      element_wise_[g + 1] = p.element_wise;
    }
    std::vector<bool> used(count_, false);
    std::string declared;  // the spec's group names, for the message
    runs_.resize(spec.num_units());
    for (std::size_t u = 0; u < spec.num_units(); ++u) {
      const unit_spec& us = spec.units()[u];
      const unit_layout& ul = lay.unit(unit_id{u});
      for (std::size_t t = 0; t < us.tensors.size(); ++t) {
        const std::string& name = us.tensors[t].group;
        std::size_t g = 0;
        if (!name.empty()) {
          if (declared.find(detail::concat("'", name, "'")) == std::string::npos)
            declared += detail::concat(declared.empty() ? "" : ", ", "'", name, "'");
          if (const auto it = index.find(name); it != index.end()) g = it->second;
        }
        used[g] = true;
        std::vector<group_run>& rs = runs_[u];
        const range r = ul.tensors[t];
        if (!rs.empty() && rs.back().group == g && rs.back().elements.end == r.begin)
          rs.back().elements.end = r.end;
        else
          rs.push_back({r, g});
      }
    }
    for (std::size_t g = 0; g < groups.size(); ++g)
      ZERO_CHECK(used[g + 1], invalid_argument, "rank ", rank, ": engine_options::param_groups: group '",
                 groups[g].name, "' is given to no tensor of the model (",
                 declared.empty() ? std::string("the model spec puts no tensor in a group: unit_builder::group")
                                  : detail::concat("its groups: ", declared),
                 ")");
  }

  template <Optimizer Opt>
  static void check_optimizer(const std::vector<param_group>& groups, int rank) {
    for (const param_group& p : groups) {
      if constexpr (!requires(Opt o) { o.weight_decay = 1.0f; })
        ZERO_CHECK(!p.weight_decay, invalid_argument, "rank ", rank, ": engine_options::param_groups['", p.name,
                   "']: weight_decay is set, but optim::", Opt::name, " has no weight decay");
      if constexpr (!MatrixOptimizer<Opt>)
        ZERO_CHECK(!p.element_wise, invalid_argument, "rank ", rank, ": engine_options::param_groups['", p.name,
                   "']: element_wise is set, but optim::", Opt::name,
                   " has no matrix rule (every tensor takes its element-wise rule)");
      if constexpr (!requires(Opt o) { o.lr = 1.0f; })
        ZERO_CHECK(p.lr_scale == 1.0f, invalid_argument, "rank ", rank, ": engine_options::param_groups['", p.name,
                   "']: lr_scale is ", detail::show(p.lr_scale), ", but optim::", Opt::name, " has no lr");
    }
  }

  std::size_t count_ = 1;
  std::vector<bool> element_wise_{false};
  std::vector<std::vector<group_run>> runs_;
};

}  // namespace zero
