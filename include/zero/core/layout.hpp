// layout: where every tensor lives in the flat, padded buffer of its unit, and which slice each rank owns.
#pragma once

#include <cstddef>
#include <vector>

#include "zero/core/checked.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/error.hpp"

namespace zero {

// A half-open range of element indices.
struct range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
  friend bool operator==(range, range) = default;
};

inline range intersect(range a, range b) {
  range r{a.begin > b.begin ? a.begin : b.begin, a.end < b.end ? a.end : b.end};
  return r.empty() ? range{r.begin, r.begin} : r;
}

// Every shard starts on a multiple of this many elements: 64 bytes for 2-byte types (and 128 for
// 4-byte ones), so vector loads on a shard are aligned whatever the precision.
inline constexpr std::size_t shard_alignment_elements = 32;

struct unit_layout {
  std::size_t offset = 0;        // of the unit in the full flat buffer (all units, padded)
  std::size_t numel = 0;         // unpadded element count
  std::size_t padded = 0;        // numel rounded up to padded_extent(numel, N)
  std::size_t shard = 0;         // padded / ranks: the slice each rank owns
  std::size_t shard_offset = 0;  // of this unit's slice in a rank's shard buffer (all units' slices)
  std::vector<range> tensors;    // each tensor's range inside the unit (unit-local, unpadded, contiguous)
};

// The padded extent of a unit of numel elements at N ranks: the next multiple of N x
// shard_alignment_elements, so the N equal slices each start aligned.
inline constexpr std::size_t padded_extent(std::size_t numel, int ranks) {
  const std::size_t quantum = static_cast<std::size_t>(ranks) * shard_alignment_elements;
  return (numel + quantum - 1) / quantum * quantum;
}

// Where a buffer keeps unit-local element i: a buffer of every unit in full holds it at the unit's
// offset; a buffer of one rank's slices (sharded) at the unit's shard_offset, counted from the start
// of rank r's slice, which must contain i. The one shard-address rule: every pointer into a sharded
// or full buffer is computed here.
inline std::size_t element_index(const unit_layout& ul, std::size_t i, bool sharded, int r) {
  return sharded ? ul.shard_offset + (i - static_cast<std::size_t>(r) * ul.shard) : ul.offset + i;
}

// The layout of every unit at N ranks. The split is the same for every stage (padded_extent, then N
// equal rank-ordered slices): the collectives use one count per unit, and a checkpoint written at
// one stage is read at another.
class layout {
 public:
  static constexpr std::size_t max_padded_elements = 2 * model_spec::max_elements;

  // `pad_ranks` (a multiple of ranks; ranks by default) sets the padding: each unit is padded as at
  // pad_ranks ranks and split into `ranks` slices. Replicated shard groups (engine_options::
  // shard_group_size) pad as the whole data-parallel group, so each slice divides by the replicas.
  static layout make(const model_spec& spec, int ranks, int pad_ranks = 0) {
    spec.validate();
    if (pad_ranks == 0) pad_ranks = ranks;
    ZERO_CHECK(ranks > 0 && pad_ranks % ranks == 0, invalid_argument, "layout: world size must be positive and divide ",
               pad_ranks, ", got ", ranks);
    layout l;
    l.ranks_ = ranks;
    // Padding adds less than N x alignment per unit; the padded total is held to twice
    // model_spec::max_elements, so byte counts (elements x bytes) stay exact in 64 bits.
    const std::size_t quantum = static_cast<std::size_t>(pad_ranks) * shard_alignment_elements;
    for (const auto& u : spec.units()) {
      unit_layout ul;
      ul.offset = l.padded_;
      ul.shard_offset = l.shard_total_;
      ul.numel = u.numel;
      const auto padded = checked_add(l.padded_, u.numel + (quantum - 1));  // numel <= 2^50, quantum < 2^37
      ZERO_CHECK(padded && *padded <= max_padded_elements, invalid_argument, "layout: unit '", u.name, "' (", u.numel,
                 " elements) padded to a multiple of ", quantum, " at ", ranks,
                 " ranks brings the model past 2^51 padded elements (layout::max_padded_elements)");
      ul.padded = padded_extent(u.numel, pad_ranks);
      ul.shard = ul.padded / static_cast<std::size_t>(ranks);
      std::size_t at = 0;
      for (const auto& t : u.tensors) {
        ul.tensors.push_back(range{at, at + t.numel});
        at += t.numel;
      }
      l.padded_ += ul.padded;
      l.shard_total_ += ul.shard;
      l.numel_ += ul.numel;
      l.units_.push_back(std::move(ul));
    }
    return l;
  }

  int ranks() const { return ranks_; }
  std::size_t numel() const { return numel_; }             // unpadded parameter count
  std::size_t padded() const { return padded_; }           // Psi: padded parameter count
  std::size_t shard_total() const { return shard_total_; } // Psi / ranks
  std::size_t num_units() const { return units_.size(); }
  const unit_layout& unit(unit_id u) const { return units_.at(u.index); }
  const std::vector<unit_layout>& units() const { return units_; }

  // The unit-local range rank r owns, padding included.
  range owned(unit_id u, int r) const {
    const auto& ul = unit(u);
    return range{static_cast<std::size_t>(r) * ul.shard, static_cast<std::size_t>(r + 1) * ul.shard};
  }
  // The part of owned(u, r) that holds real elements: padding never enters a norm or an update.
  range owned_real(unit_id u, int r) const { return intersect(owned(u, r), range{0, unit(u).numel}); }
  // The unit-local, unpadded elements rank r's optimizer updates: its owned slice where the optimizer
  // states are sharded (stages 1-3), the whole unit where every rank keeps them (stage 0).
  range updated_real(unit_id u, int r, bool states_sharded) const {
    return states_sharded ? owned_real(u, r) : range{0, unit(u).numel};
  }

 private:
  int ranks_ = 0;
  std::size_t numel_ = 0, padded_ = 0, shard_total_ = 0;
  std::vector<unit_layout> units_;
};

}  // namespace zero
