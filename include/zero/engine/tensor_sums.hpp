// Per-tensor sums of squares for a tensor-wise optimizer, in an order fixed by each tensor's own element indices: the same
// bits however the tensor is cut over ranks, threads or offload chunks, taken in the pass that computes the values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zero/core/layout.hpp"
#include "zero/core/square_blocks.hpp"
#include "zero/error.hpp"

namespace zero {

// The order, which is the definition (tests/optimizer_step.hpp computes it one value at a time):
//   - a tensor's elements in blocks of 64 by tensor-local index, each block's squares summed as
//     core/square_blocks.hpp says;
//   - the blocks in leaves of 64 (4096 elements), a leaf's sum its blocks' sums added in order from 0.0;
//   - the tensor's sum its leaves' sums added in order from 0.0.
// The result depends on the tensor's values only: the same bits in every stage, at every N and
// thread count. Why an order and not an exact sum: cutting every square into exact binned digits
// (core/binned.hpp, as the reproducible gradient norm does) cost more than the step's whole moments
// pass, and a fixed order costs a product and an addition per value. Its rounding error is below
// about (80 + leaves) 2^-53 of the sum, far below the float factor's own rounding.
//
// How the ranks meet. A rank sums every whole block and every whole leaf it holds. Where the states
// are sharded over N > 1 ranks, a shard boundary inside a tensor leaves the tensor held in part by two
// or more ranks, and the leaf (and block) it falls inside, if any, too. One all-reduce (sum) of doubles
// completes them: every leaf's sum of the cut tensors (0.0 from every rank that does not hold the leaf
// whole), the block sums of the leaves a boundary falls in, and the squares of the blocks a boundary
// falls in. Each entry comes from one rank and every other adds +0.0 to it, so it keeps that rank's
// bits in any order of addition. Then every rank sums the cut blocks and the cut leaves, and adds the
// leaves. A tensor no boundary cuts is held whole by one rank (or every rank, at stage 0), which needs
// nothing from the others.
class tensor_sums {
 public:
  static constexpr std::size_t block_size = square_blocks::size;
  static constexpr std::size_t leaf_blocks = 64;
  static constexpr std::size_t leaf_size = block_size * leaf_blocks;

  // What every rank agrees on: the tensors (units in order, each unit's tensors in order) and the
  // leaves and blocks that a shard boundary falls inside.
  struct shape {
    static constexpr std::size_t not_cut = ~std::size_t{0};
    struct tensor {
      std::size_t unit = 0, begin = 0, size = 0;  // begin: unit-local
      std::size_t first_leaf = 0;                 // of the tensor's leaves among all tensors'
      std::size_t first_exchanged = not_cut;      // of its leaves in the exchange, where a boundary cuts it
    };
    std::vector<tensor> tensors;
    std::size_t leaves = 0;
    std::size_t exchanged_leaves = 0;  // the leaves of the tensors a boundary cuts
    std::vector<std::pair<std::size_t, std::size_t>> cut_leaves;  // (tensor, leaf), sorted
    std::vector<std::pair<std::size_t, std::size_t>> cut_blocks;  // (tensor, block), sorted

    // The all-reduce's doubles, for `sums` sums per tensor: 0 where no boundary cuts a tensor (the
    // states are not sharded, or every tensor lies within one rank's slice).
    std::size_t exchange_doubles(int sums) const {
      return static_cast<std::size_t>(sums) *
             (exchanged_leaves + (cut_leaves.size() + cut_blocks.size()) * block_size);
    }
  };

  // The shape of the layout's tensors where each rank updates its owned slice (`sharded`, stages 1-3)
  // or every element (stage 0).
  static shape shape_of(const layout& l, bool sharded) {
    shape s;
    for (std::size_t u = 0; u < l.num_units(); ++u) {
      const unit_layout& ul = l.unit(unit_id{u});
      for (const range& t : ul.tensors) {
        const std::size_t index = s.tensors.size(), leaves = (t.size() + leaf_size - 1) / leaf_size;
        s.tensors.push_back({u, t.begin, t.size(), s.leaves});
        s.leaves += leaves;
        if (!sharded) continue;
        for (int r = 1; r < l.ranks(); ++r) {
          const std::size_t at = l.owned(unit_id{u}, r).begin;  // where rank r's slice begins
          if (at <= t.begin || at >= t.end) continue;
          const std::size_t c = at - t.begin;
          if (s.tensors[index].first_exchanged == shape::not_cut) {
            s.tensors[index].first_exchanged = s.exchanged_leaves;
            s.exchanged_leaves += leaves;
          }
          if (c % leaf_size != 0) s.cut_leaves.emplace_back(index, c / leaf_size);
          if (c % block_size != 0) s.cut_blocks.emplace_back(index, c / block_size);
        }
      }
    }
    for (auto* v : {&s.cut_leaves, &s.cut_blocks}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
    return s;
  }

  // Rank `rank`'s sums: `sums` per tensor, over the elements it updates.
  tensor_sums(const layout& l, bool sharded, int rank, int sums)
      : shape_(shape_of(l, sharded)), sums_(static_cast<std::size_t>(sums)) {
    held_.reserve(shape_.tensors.size());
    first_block_.reserve(shape_.tensors.size());
    block_at_.reserve(shape_.tensors.size());
    for (const shape::tensor& t : shape_.tensors) {
      const range mine = intersect(range{t.begin, t.begin + t.size}, l.updated_real(unit_id{t.unit}, rank, sharded));
      const range held = mine.empty() ? range{0, 0} : range{mine.begin - t.begin, mine.end - t.begin};
      held_.push_back(held);
      first_block_.push_back(held.begin / block_size);
      block_at_.push_back(held_blocks_);
      if (!held.empty()) held_blocks_ += (held.end + block_size - 1) / block_size - held.begin / block_size;
    }
    blocks_.assign(held_blocks_ * sums_, 0.0);
    leaves_.assign(shape_.leaves * sums_, 0.0);
    totals_.assign(shape_.tensors.size() * sums_, 0.0);
  }

  const shape& layout_shape() const { return shape_; }

  // Before a step's adds: forgets the last step's blocks held in part. Every held block's sum is
  // written again by the step's adds.
  void begin_step() { parts_.clear(); }
  std::size_t tensors() const { return shape_.tensors.size(); }

  // Adds x[0, m), the values of sum k at tensor-local elements [at, at + m) of tensor t, which this
  // rank updates. Threads may add disjoint ranges at once. `sys` sums whole blocks
  // (square_block_sums: sys::host's).
  template <class System>
  void add(const System& sys, std::size_t t, std::size_t k, std::size_t at, const float* x, std::size_t m) {
    const range held = held_[t];
    ZERO_CHECK(at >= held.begin && at + m <= held.end, invalid_argument, "tensor_sums: elements [", at, ", ", at + m,
               ") of tensor ", t, " are not all in this rank's [", held.begin, ", ", held.end, ")");
    const std::size_t n = shape_.tensors[t].size, end = at + m;
    double* out = block_sums(t, k);
    for (std::size_t j = at; j < end;) {
      const std::size_t i = j / block_size, bb = i * block_size, be = std::min(bb + block_size, n);
      if (j == bb && be <= end) {
        if (be - bb < block_size) {  // the tensor's last block, shorter
          out[i] = square_blocks::sum(x + (j - at), be - bb);
          j = be;
          continue;
        }
        const std::size_t whole = (std::min(end, n) - j) / block_size;
        sys.square_block_sums(x + (j - at), whole, out + i);
        j += whole * block_size;
        continue;
      }
      const std::size_t hi = std::min(end, be);
      add_part(t, k, i, j, x + (j - at), hi - j);
      j = hi;
    }
  }

  // After every add: the all-reduce's operands (shape::exchange_doubles, empty where nothing is
  // cut). The caller sums them over the ranks in place, then calls complete().
  std::vector<double>& exchange() {
    const std::size_t K = sums_;
    wire_.assign(shape_.exchange_doubles(static_cast<int>(K)), 0.0);
    std::fill(leaves_.begin(), leaves_.end(), 0.0);
    for (std::size_t t = 0; t < tensors(); ++t) {
      const range held = held_[t];
      if (held.empty()) continue;
      const std::size_t n = shape_.tensors[t].size;
      for (std::size_t leaf = held.begin / leaf_size; leaf * leaf_size < held.end; ++leaf) {
        const std::size_t lb = leaf * leaf_size, le = std::min(lb + leaf_size, n);
        const std::size_t fb = lb / block_size, eb = (le + block_size - 1) / block_size;
        if (lb >= held.begin && le <= held.end) {
          for (std::size_t k = 0; k < K; ++k) {
            const double* b = block_sums(t, k);
            double s = 0.0;
            for (std::size_t i = fb; i < eb; ++i) s += b[i];
            leaf_entry(t, leaf, k) = s;
          }
          continue;
        }
        const std::size_t slot = find(shape_.cut_leaves, t, leaf, "leaf");
        for (std::size_t i = fb; i < eb; ++i) {
          if (i * block_size < held.begin || std::min(i * block_size + block_size, n) > held.end) continue;
          for (std::size_t k = 0; k < K; ++k) cut_leaf_entry(slot, k)[i - fb] = block_sums(t, k)[i];
        }
      }
    }
    for (const auto& [key, p] : parts_) {
      const std::size_t slot = find(shape_.cut_blocks, p.tensor, p.block, "block");
      double* sq = cut_block_entry(slot, p.sum);
      for (std::size_t q = 0; q < block_size; ++q)
        if (p.present & (std::uint64_t{1} << q)) sq[q] = p.squares[q];
    }
    for (const shape::tensor& t : shape_.tensors)
      if (t.first_exchanged != shape::not_cut)
        std::copy_n(leaves_.begin() + static_cast<std::ptrdiff_t>(t.first_leaf * K),
                    (t.size + leaf_size - 1) / leaf_size * K,
                    wire_.begin() + static_cast<std::ptrdiff_t>(t.first_exchanged * K));
    ZERO_CHECK(wire_.size() > 0 || parts_.empty(), protocol,
               "tensor_sums: a block is held in part where no shard boundary cuts a tensor");
    return wire_;
  }

  // After the exchange (or at once where it is empty): every tensor's sums.
  void complete() {
    const std::size_t K = sums_;
    if (!wire_.empty()) {
      for (const shape::tensor& t : shape_.tensors)
        if (t.first_exchanged != shape::not_cut)
          std::copy_n(wire_.begin() + static_cast<std::ptrdiff_t>(t.first_exchanged * K),
                      (t.size + leaf_size - 1) / leaf_size * K,
                      leaves_.begin() + static_cast<std::ptrdiff_t>(t.first_leaf * K));
      for (std::size_t s = 0; s < shape_.cut_blocks.size(); ++s) {
        const auto [t, i] = shape_.cut_blocks[s];
        const std::size_t n = shape_.tensors[t].size, leaf = i / leaf_blocks;
        const std::size_t slot = find(shape_.cut_leaves, t, leaf, "leaf");
        for (std::size_t k = 0; k < K; ++k)
          cut_leaf_entry(slot, k)[i - leaf * leaf_blocks] =
              square_blocks::sum_of(cut_block_entry(s, k), std::min(block_size, n - i * block_size));
      }
      for (std::size_t s = 0; s < shape_.cut_leaves.size(); ++s) {
        const auto [t, leaf] = shape_.cut_leaves[s];
        const std::size_t n = shape_.tensors[t].size;
        const std::size_t blocks = (std::min(leaf_size, n - leaf * leaf_size) + block_size - 1) / block_size;
        for (std::size_t k = 0; k < K; ++k) {
          const double* b = cut_leaf_entry(s, k);
          double sum = 0.0;
          for (std::size_t q = 0; q < blocks; ++q) sum += b[q];
          leaf_entry(t, leaf, k) = sum;
        }
      }
    }
    for (std::size_t t = 0; t < tensors(); ++t) {
      const std::size_t leaves = (shape_.tensors[t].size + leaf_size - 1) / leaf_size;
      for (std::size_t k = 0; k < K; ++k) {
        double sum = 0.0;
        for (std::size_t leaf = 0; leaf < leaves; ++leaf) sum += leaf_entry(t, leaf, k);
        totals_[t * K + k] = sum;
      }
    }
  }

  // Sum k of tensor t, after complete(): the same bits on every rank that holds part of t.
  double sum(std::size_t t, std::size_t k) const { return totals_[t * sums_ + k]; }

 private:
  // A block this rank holds in pieces (cut by a thread's range, an offload chunk or a shard
  // boundary): its squares so far.
  struct part {
    std::size_t tensor = 0, block = 0, sum = 0;
    std::uint64_t present = 0;  // bit q: element q of the block
    double squares[block_size] = {};
  };
  static_assert(block_size == 64, "part::present has a bit per element");

  // Sum k's block sums of tensor t, indexed by the tensor's block index (only the held ones exist).
  double* block_sums(std::size_t t, std::size_t k) {
    return blocks_.data() + k * held_blocks_ + block_at_[t] - first_block_[t];
  }
  double& leaf_entry(std::size_t t, std::size_t leaf, std::size_t k) {
    return leaves_[(shape_.tensors[t].first_leaf + leaf) * sums_ + k];
  }
  double* cut_leaf_entry(std::size_t slot, std::size_t k) {
    return wire_.data() + shape_.exchanged_leaves * sums_ + (slot * sums_ + k) * block_size;
  }
  double* cut_block_entry(std::size_t slot, std::size_t k) {
    return wire_.data() + (shape_.exchanged_leaves + shape_.cut_leaves.size() * block_size) * sums_ +
           (slot * sums_ + k) * block_size;
  }
  static std::size_t find(const std::vector<std::pair<std::size_t, std::size_t>>& v, std::size_t t, std::size_t i,
                          const char* what) {
    const auto it = std::lower_bound(v.begin(), v.end(), std::pair{t, i});
    const bool found = it != v.end() && it->first == t && it->second == i;
    ZERO_CHECK(found, protocol, "tensor_sums: ", what, " ", i, " of tensor ", t,
               " is held in part, but no shard boundary falls inside it");
    return static_cast<std::size_t>(it - v.begin());
  }

  // Elements [j, j + m) of block i (in part): their squares kept until the block is whole on this rank.
  void add_part(std::size_t t, std::size_t k, std::size_t i, std::size_t j, const float* x, std::size_t m) {
    const range held = held_[t];
    const std::size_t n = shape_.tensors[t].size, bb = i * block_size, be = std::min(bb + block_size, n);
    const std::size_t lo = std::max(bb, held.begin), hi = std::min(be, held.end);
    const std::uint64_t needed = bits(lo - bb, hi - bb);
    const std::lock_guard<std::mutex> lock(parts_lock_);
    part& p = parts_[(block_at_[t] + i - first_block_[t]) * sums_ + k];
    p.tensor = t;
    p.block = i;
    p.sum = k;
    for (std::size_t q = 0; q < m; ++q) p.squares[j - bb + q] = static_cast<double>(x[q]) * static_cast<double>(x[q]);
    p.present |= bits(j - bb, j - bb + m);
    if (p.present == needed && lo == bb && hi == be) {  // whole on this rank
      block_sums(t, k)[i] = square_blocks::sum_of(p.squares, be - bb);
      parts_.erase((block_at_[t] + i - first_block_[t]) * sums_ + k);
    }
  }
  static std::uint64_t bits(std::size_t from, std::size_t to) {
    const std::uint64_t upto = to >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << to) - 1;
    return upto & ~((std::uint64_t{1} << from) - 1);
  }

  shape shape_;
  std::size_t sums_;
  std::vector<range> held_;               // per tensor: the tensor-local elements this rank updates
  std::vector<std::size_t> first_block_;  // per tensor: the first held block
  std::vector<std::size_t> block_at_;     // per tensor: where its held blocks' sums begin
  std::size_t held_blocks_ = 0;
  std::vector<double> blocks_;  // per sum, the held blocks' sums
  std::vector<double> leaves_;  // every leaf's sum, per tensor and sum
  std::vector<double> wire_;    // the exchange: the cut tensors' leaves, the cut leaves' block sums, the cut blocks' squares
  std::vector<double> totals_;
  std::mutex parts_lock_;
  std::unordered_map<std::size_t, part> parts_;
};

}  // namespace zero
