// model_spec: the model declared as units (gathered and released together) of named, shaped tensors.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "zero/core/checked.hpp"
#include "zero/error.hpp"

namespace zero {

// How a tensor lies across the ranks of a tensor-parallel group (an engine built over comm::mesh):
// the same whole tensor on every rank of the group (replicated, the default: biases, norms' gains, the
// embeddings of a model that does not split them), or cut along one dimension into as many equal,
// contiguous pieces as the group has ranks, rank t holding the t-th (Megatron's column- and
// row-parallel matrices). Outside a mesh (a group of one rank) both are the whole tensor.
struct tensor_parallel {
  int split_dim = -1;  // the dimension cut into pieces; -1: replicated
  bool split() const { return split_dim >= 0; }
  bool operator==(const tensor_parallel&) const = default;
};
inline constexpr tensor_parallel tp_replicated{};
constexpr tensor_parallel tp_split(int dim) { return tensor_parallel{dim}; }

struct tensor_spec {
  std::string name;
  std::vector<std::size_t> shape;
  std::size_t numel = 0;  // product of shape
  tensor_parallel tp{};   // replicated, or split along a dimension, across a tensor-parallel group
  // In a model's pieces (model_spec::piece): the number of pieces the tensor is cut into (1 where it
  // is replicated or the group has one rank) and which of them this tensor is; shape is the piece's.
  int tp_parts = 1;
  int tp_index = 0;
  // The parameter group whose hyper-parameter overrides the tensor takes (engine_options::param_groups);
  // empty: the optimizer's own hyper-parameters.
  std::string group{};
};

// The shape of the whole tensor a piece was cut from (the piece's own shape where it is not cut).
inline std::vector<std::size_t> whole_shape(const tensor_spec& t) {
  std::vector<std::size_t> s = t.shape;
  if (t.tp.split()) s[static_cast<std::size_t>(t.tp.split_dim)] *= static_cast<std::size_t>(t.tp_parts);
  return s;
}

// A piece's elements as runs of consecutive elements of the whole tensor (row-major): the piece is
// `outer` blocks of `block` elements, block k at whole index k x block x tp_parts + tp_index x block.
struct piece_runs {
  std::size_t outer = 1;   // the number of runs in the whole piece
  std::size_t block = 0;   // elements per run
  std::size_t stride = 0;  // whole-tensor elements from one run to the next (block x tp_parts)
  std::size_t first = 0;   // whole index of the piece's first element (tp_index x block)
};
inline piece_runs runs_of(const tensor_spec& t) {
  if (!t.tp.split() || t.tp_parts == 1) return {1, t.numel, t.numel, 0};
  const auto d = static_cast<std::size_t>(t.tp.split_dim);
  std::size_t outer = 1;
  for (std::size_t k = 0; k < d; ++k) outer *= t.shape[k];
  const std::size_t block = t.numel / outer, parts = static_cast<std::size_t>(t.tp_parts);
  return {outer, block, block * parts, static_cast<std::size_t>(t.tp_index) * block};
}
// The whole-tensor index of a piece's element i (row-major both).
inline std::size_t whole_index(const tensor_spec& t, std::size_t i) {
  const piece_runs r = runs_of(t);
  return i / r.block * r.stride + r.first + i % r.block;
}

struct unit_spec {
  std::string name;
  std::vector<tensor_spec> tensors;
  std::size_t numel = 0;  // sum of the tensors' numel, without padding
  // How many times the unit is gathered in each forward pass and again in each backward pass: 1, or
  // more for a shared (tied) unit used in several places, such as an embedding that is also the
  // output layer (2). The traffic formulas count these gathers, and the engine refuses a unit
  // gathered more often in a step than 2 x gathers x micro-batches.
  int gathers = 1;
};

// A unit's index in declaration order; what the engine's protocol calls take.
struct unit_id {
  std::size_t index = 0;
  friend bool operator==(unit_id, unit_id) = default;
};

class model_spec;

// Returned by model_spec::unit(): adds tensors to one unit and converts to its unit_id.
class unit_builder {
 public:
  unit_builder(model_spec& spec, std::size_t index) : spec_(&spec), index_(index) {}
  unit_builder& tensor(const std::string& name, std::initializer_list<std::size_t> shape) {
    return tensor(name, std::vector<std::size_t>(shape));
  }
  unit_builder& tensor(const std::string& name, const std::vector<std::size_t>& shape);
  // A tensor with its tensor-parallel layout (tp_split(dim) or tp_replicated), declared whole: the
  // shape of the whole tensor, not of a rank's piece.
  unit_builder& tensor(const std::string& name, std::initializer_list<std::size_t> shape, tensor_parallel tp) {
    return tensor(name, std::vector<std::size_t>(shape), tp);
  }
  unit_builder& tensor(const std::string& name, const std::vector<std::size_t>& shape, tensor_parallel tp);
  // Declares a shared unit: gathered `times` times per forward pass and per backward pass (>= 1).
  unit_builder& gathers(int times);
  // Puts the tensor declared last in parameter group `name` (engine_options::param_groups gives the
  // group its hyper-parameters). A tensor belongs to one group: a second, other name is refused
  // naming both.
  unit_builder& group(const std::string& name);
  operator unit_id() const { return unit_id{index_}; }
  unit_id id() const { return unit_id{index_}; }

 private:
  model_spec* spec_;
  std::size_t index_;
};

class model_spec {
 public:
  // The most elements a model (and so each of its units and tensors) may have: 2^50, far above any
  // trainable model, so that every byte count derived from it (elements x bytes per element, padded
  // to the ranks) stays exact in 64 bits. A larger shape, or one whose product of dimensions does not
  // even fit in size_t, is refused naming the unit, the tensor and the shape.
  static constexpr std::size_t max_elements = std::size_t{1} << 50;

  // Starts a new unit; names must be unique and non-empty. O(1) per unit (a name index).
  unit_builder unit(const std::string& name) {
    ZERO_CHECK(!name.empty(), invalid_argument, "model_spec: a unit name must not be empty");
    ZERO_CHECK(by_name_.try_emplace(name, units_.size()).second, invalid_argument, "model_spec: unit '", name,
               "' is declared twice");
    units_.push_back(unit_spec{name, {}, 0, 1});
    return unit_builder(*this, units_.size() - 1);
  }

  const std::vector<unit_spec>& units() const { return units_; }
  std::size_t num_units() const { return units_.size(); }
  const unit_spec& operator[](unit_id u) const { return at(u); }
  const unit_spec& at(unit_id u) const {
    ZERO_CHECK(u.index < units_.size(), invalid_argument, "model_spec: unit index ", u.index,
               " is out of range (the model has ", units_.size(), " units)");
    return units_[u.index];
  }

  // Looks a unit up by name; throws naming the unknown unit.
  unit_id find(const std::string& name) const {
    if (const auto it = by_name_.find(name); it != by_name_.end()) return unit_id{it->second};
    fail(error_kind::invalid_argument, "model_spec: unknown unit '", name, "'");
  }

  // Unpadded parameter count of the whole model (at most max_elements).
  std::size_t numel() const { return numel_; }

  // Whether any tensor is split across a tensor-parallel group (tp_split).
  bool has_split_tensors() const {
    for (const auto& u : units_)
      for (const auto& t : u.tensors)
        if (t.tp.split()) return true;
    return false;
  }

  // What rank `index` of a tensor-parallel group of `parts` ranks holds: the same units and tensors,
  // each split tensor replaced by its index-th piece (its split dimension divided by parts, tp_parts
  // and tp_index set), each replicated tensor whole. The model itself at parts = 1. Refused
  // (invalid_argument) where a split dimension is not a multiple of parts, naming the tensor.
  model_spec piece(int parts, int index) const;
  // The size of the tensor-parallel group whose rank's pieces this spec is (model_spec::piece's
  // `parts`), 1 for a model: what zero::plan reads to plan an engine in a mesh.
  int tensor_parallel_parts() const { return tp_parts_; }

  // Throws unless the spec can be trained: at least one unit, each with at least one tensor.
  void validate() const {
    ZERO_CHECK(!units_.empty(), invalid_argument, "model_spec: the model has no units");
    for (const auto& u : units_)
      ZERO_CHECK(!u.tensors.empty(), invalid_argument, "model_spec: unit '", u.name, "' has no tensors");
  }

  // Equal models have the same units and tensors; how often a unit is gathered (unit_spec::gathers) is
  // how a training loop uses the model, not part of it, so a checkpoint loads whatever it declares.
  friend bool operator==(const model_spec& a, const model_spec& b) {
    if (a.units_.size() != b.units_.size()) return false;
    for (std::size_t i = 0; i < a.units_.size(); ++i) {
      const auto &x = a.units_[i], &y = b.units_[i];
      if (x.name != y.name || x.tensors.size() != y.tensors.size()) return false;
      for (std::size_t t = 0; t < x.tensors.size(); ++t)
        if (x.tensors[t].name != y.tensors[t].name || x.tensors[t].shape != y.tensors[t].shape) return false;
    }
    return true;
  }

 private:
  friend class unit_builder;
  std::vector<unit_spec> units_;
  std::unordered_map<std::string, std::size_t> by_name_;  // unit name -> index
  // Every unit's tensor names, as "<unit index>:<name>": a duplicate is found in O(1).
  std::unordered_set<std::string> tensor_names_;
  std::size_t numel_ = 0;
  int tp_parts_ = 1;
};

inline unit_builder& unit_builder::tensor(const std::string& name, const std::vector<std::size_t>& shape,
                                          tensor_parallel tp) {
  const unit_spec& u = spec_->units_[index_];
  ZERO_CHECK(tp.split_dim >= -1 && tp.split_dim < static_cast<int>(shape.size()), invalid_argument,
             "model_spec: unit '", u.name, "', tensor '", name, "': tp_split(", tp.split_dim, ") of a tensor with ",
             shape.size(), " dimension(s) (the dimension counts from 0)");
  tensor(name, shape);
  spec_->units_[index_].tensors.back().tp = tp;
  return *this;
}

inline unit_builder& unit_builder::tensor(const std::string& name, const std::vector<std::size_t>& shape) {
  unit_spec& u = spec_->units_[index_];
  ZERO_CHECK(!name.empty(), invalid_argument, "model_spec: unit '", u.name, "': a tensor name must not be empty");
  ZERO_CHECK(!shape.empty(), invalid_argument, "model_spec: tensor '", u.name, ".", name,
             "' has an empty shape (a scalar is shape {1})");
  std::string dims;  // "[2, 3]", for the messages
  for (std::size_t d : shape) dims += detail::concat(dims.empty() ? "[" : ", ", d);
  dims += "]";
  std::size_t numel = 1;
  bool fits = true;
  for (std::size_t d : shape) {
    ZERO_CHECK(d > 0, invalid_argument, "model_spec: tensor '", u.name, ".", name, "' has a zero dimension");
    const auto n = checked_mul(numel, d);
    fits = fits && n && *n <= model_spec::max_elements;
    numel = fits ? *n : numel;
  }
  ZERO_CHECK(fits, invalid_argument, "model_spec: unit '", u.name, "', tensor '", name, "': shape ", dims,
             " has more than 2^50 elements (model_spec::max_elements)");
  const std::size_t total = spec_->numel_ + numel;  // both <= 2^50: no wrap
  ZERO_CHECK(total <= model_spec::max_elements, invalid_argument, "model_spec: unit '", u.name, "', tensor '", name,
             "': shape ", dims, " brings the model to ", total, " elements, more than 2^50 (model_spec::max_elements)");
  ZERO_CHECK(spec_->tensor_names_.insert(detail::concat(index_, ":", name)).second, invalid_argument,
             "model_spec: unit '", u.name, "': tensor '", name, "' is declared twice");
  u.tensors.push_back(tensor_spec{.name = name, .shape = shape, .numel = numel});
  u.numel += numel;
  spec_->numel_ = total;
  return *this;
}

inline unit_builder& unit_builder::gathers(int times) {
  unit_spec& u = spec_->units_[index_];
  ZERO_CHECK(times >= 1, invalid_argument, "model_spec: unit '", u.name, "': gathers(", times,
             "): a unit is gathered at least once per pass");
  u.gathers = times;
  return *this;
}

inline unit_builder& unit_builder::group(const std::string& name) {
  unit_spec& u = spec_->units_[index_];
  ZERO_CHECK(!u.tensors.empty(), invalid_argument, "model_spec: unit '", u.name, "': group('", name,
             "') before any tensor (it names the group of the tensor declared last)");
  ZERO_CHECK(!name.empty(), invalid_argument, "model_spec: unit '", u.name, "', tensor '", u.tensors.back().name,
             "': a group name must not be empty");
  std::string& g = u.tensors.back().group;
  ZERO_CHECK(g.empty() || g == name, invalid_argument, "model_spec: unit '", u.name, "', tensor '",
             u.tensors.back().name, "' is put in group '", name, "' but is in group '", g,
             "' already (a tensor belongs to one group)");
  g = name;
  return *this;
}

inline model_spec model_spec::piece(int parts, int index) const {
  ZERO_CHECK(parts >= 1 && index >= 0 && index < parts, invalid_argument, "model_spec::piece(", parts, ", ", index,
             "): a group of at least one rank, and an index within it");
  model_spec out;
  out.tp_parts_ = parts;
  for (const unit_spec& u : units_) {
    unit_builder b = out.unit(u.name);
    b.gathers(u.gathers);
    for (const tensor_spec& t : u.tensors) {
      ZERO_CHECK(t.tp_parts == 1, invalid_argument, "model_spec::piece: unit '", u.name, "', tensor '", t.name,
                 "' is already a piece (1 of ", t.tp_parts, "): cut the whole model");
      std::vector<std::size_t> shape = t.shape;
      if (t.tp.split()) {
        std::size_t& d = shape[static_cast<std::size_t>(t.tp.split_dim)];
        ZERO_CHECK(d % static_cast<std::size_t>(parts) == 0, invalid_argument, "model_spec: unit '", u.name,
                   "', tensor '", t.name, "': dimension ", t.tp.split_dim, " (", d, ") cannot be cut into ", parts,
                   " equal pieces for a tensor-parallel group of ", parts, " ranks");
        d /= static_cast<std::size_t>(parts);
      }
      b.tensor(t.name, shape, t.tp);
      tensor_spec& p = out.units_.back().tensors.back();
      p.tp_parts = t.tp.split() ? parts : 1;
      p.tp_index = t.tp.split() ? index : 0;
      p.group = t.group;
    }
  }
  return out;
}

}  // namespace zero
