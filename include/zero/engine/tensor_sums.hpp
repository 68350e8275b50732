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
//
// Within a rank: each thread adds its range of a piece through an adder, which keeps the block sums of
// the leaf it is in and writes the leaf's sum when it has them all. A block or a leaf that a thread's
// range or an offload chunk cuts waits in a shared map (its squares, or its block sums) for its other
// part. What is kept between steps is a double per leaf and sum: 16 bytes per 4096 elements for two
// sums.
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

  // Rank `rank`'s sums: `sums` (1 to 4) per tensor, over the elements it updates.
  tensor_sums(const layout& l, bool sharded, int rank, int sums)
      : shape_(shape_of(l, sharded)), sums_(static_cast<std::size_t>(sums)) {
    ZERO_CHECK(sums >= 1 && sums <= max_sums, invalid_argument, "tensor_sums: ", sums, " sums per tensor (1 to ",
               max_sums, ")");
    held_.reserve(shape_.tensors.size());
    for (const shape::tensor& t : shape_.tensors) {
      const range mine = intersect(range{t.begin, t.begin + t.size}, l.updated_real(unit_id{t.unit}, rank, sharded));
      held_.push_back(mine.empty() ? range{0, 0} : range{mine.begin - t.begin, mine.end - t.begin});
    }
    leaves_.assign(shape_.leaves * sums_, 0.0);
    totals_.assign(shape_.tensors.size() * sums_, 0.0);
  }

  static constexpr int max_sums = 4;
  const shape& layout_shape() const { return shape_; }
  std::size_t tensors() const { return shape_.tensors.size(); }

  // Before a step's adds.
  void begin_step() {
    parts_.clear();
    open_leaves_.clear();
    std::fill(leaves_.begin(), leaves_.end(), 0.0);
  }

 private:
  static constexpr std::size_t no_leaf = ~std::size_t{0};
  static_assert(block_size == 64 && leaf_blocks == 64, "a part's `present` has a bit per element or block");

  // A block this rank holds in pieces (cut by a thread's range, an offload chunk or a shard
  // boundary): its squares so far.
  struct block_part {
    std::size_t tensor = 0, block = 0, sum = 0;
    std::uint64_t present = 0;  // bit q: element q of the block
    double squares[block_size] = {};
  };
  // A leaf whose blocks' sums came from more than one thread (or whose blocks a boundary cuts).
  struct leaf_part {
    std::size_t tensor = 0, leaf = no_leaf, sum = 0;
    std::uint64_t present = 0;  // bit q: block q of the leaf
    double sums[leaf_blocks] = {};
  };


 public:
  // One thread's adds to tensor t: each sum's values in increasing order of their indices, as a
  // thread's range of a piece is added block after block. It keeps the blocks' sums of the leaf it is
  // in (a leaf it completes costs no lock); finish() hands over what is left of its leaves.
  class adder {
   public:
    adder(tensor_sums& s, std::size_t t) : s_(s), t_(t) {}
    adder(const adder&) = delete;
    adder& operator=(const adder&) = delete;

    // Adds x[0, m), the values of sum k at tensor-local elements [at, at + m), which this rank updates.
    // `sys` sums whole blocks (square_block_sums: sys::host's).
    template <class System>
    void add(const System& sys, std::size_t k, std::size_t at, const float* x, std::size_t m) {
      const range held = s_.held_[t_];
      ZERO_CHECK(at >= held.begin && at + m <= held.end, invalid_argument, "tensor_sums: elements [", at, ", ",
                 at + m, ") of tensor ", t_, " are not all in this rank's [", held.begin, ", ", held.end, ")");
      const std::size_t n = s_.shape_.tensors[t_].size, end = at + m;
      for (std::size_t j = at; j < end;) {
        const std::size_t i = j / block_size, bb = i * block_size, be = std::min(bb + block_size, n);
        if (j == bb && be <= end) {
          open(k, i / leaf_blocks);
          leaf_part& o = open_[k];
          if (be - bb < block_size) {  // the tensor's last block, shorter
            o.sums[i % leaf_blocks] = square_blocks::sum(x + (j - at), be - bb);
            o.present |= bits(i % leaf_blocks, i % leaf_blocks + 1);
            j = be;
            continue;
          }
          // The whole blocks from here to the range's end, the tensor's or the leaf's.
          const std::size_t whole = std::min((std::min(end, n) - j) / block_size, leaf_blocks - i % leaf_blocks);
          sys.square_block_sums(x + (j - at), whole, o.sums + i % leaf_blocks);
          o.present |= bits(i % leaf_blocks, i % leaf_blocks + whole);
          j += whole * block_size;
          continue;
        }
        const std::size_t hi = std::min(end, be);
        s_.add_part(t_, k, i, j, x + (j - at), hi - j);
        j = hi;
      }
    }
    // Adds the sums of `count` whole blocks of sum k from tensor-local element `at` on, a block's first
    // (square_block_sums over the values; the pass fused with its sums: sys/host_square_blocks.hpp).
    void add_block_sums(std::size_t k, std::size_t at, const double* block_sums, std::size_t count) {
      const range held = s_.held_[t_];
      const std::size_t end = at + count * block_size;
      ZERO_CHECK(at % block_size == 0 && at >= held.begin && end <= held.end, invalid_argument,
                 "tensor_sums: the whole blocks of elements [", at, ", ", end, ") of tensor ", t_,
                 " are not all in this rank's [", held.begin, ", ", held.end, ")");
      for (std::size_t i = at / block_size, b = 0; b < count;) {
        open(k, i / leaf_blocks);
        leaf_part& o = open_[k];
        const std::size_t whole = std::min(count - b, leaf_blocks - i % leaf_blocks);
        std::copy(block_sums + b, block_sums + b + whole, o.sums + i % leaf_blocks);
        o.present |= bits(i % leaf_blocks, i % leaf_blocks + whole);
        i += whole;
        b += whole;
      }
    }
    // The leaves this thread did not complete, to the shared state.
    void finish() {
      for (std::size_t k = 0; k < max_sums; ++k) close(k);
    }

   private:
    void open(std::size_t k, std::size_t leaf) {
      if (open_[k].leaf == leaf) return;
      close(k);
      open_[k].leaf = leaf;
      open_[k].present = 0;
    }
    void close(std::size_t k) {
      leaf_part& o = open_[k];
      if (o.leaf == no_leaf) return;
      if (o.present == s_.all_blocks(t_, o.leaf) && s_.held_whole(t_, o.leaf))
        s_.leaf_entry(t_, o.leaf, k) = sum_in_order(o.sums, o.present);
      else
        s_.merge_leaf(t_, k, o.leaf, o.sums, o.present);
      o.leaf = no_leaf;
    }

    tensor_sums& s_;
    std::size_t t_;
    leaf_part open_[max_sums];
  };

  // After every adder finished: the all-reduce's operands (shape::exchange_doubles, empty where no
  // boundary cuts a tensor). The caller sums them over the ranks in place, then calls complete().
  std::vector<double>& exchange() {
    const std::size_t K = sums_;
    wire_.assign(shape_.exchange_doubles(static_cast<int>(K)), 0.0);
    ZERO_CHECK(!wire_.empty() || (parts_.empty() && open_leaves_.empty()), protocol,
               "tensor_sums: ", parts_.size() + open_leaves_.size(),
               " blocks or leaves are held in part where no shard boundary cuts a tensor");
    for (const auto& [key, p] : open_leaves_) {
      double* to = cut_leaf_entry(find(shape_.cut_leaves, p.tensor, p.leaf, "leaf"), p.sum);
      for (std::size_t q = 0; q < leaf_blocks; ++q)
        if (p.present & (std::uint64_t{1} << q)) to[q] = p.sums[q];
    }
    for (const auto& [key, p] : parts_) {
      double* sq = cut_block_entry(find(shape_.cut_blocks, p.tensor, p.block, "block"), p.sum);
      for (std::size_t q = 0; q < block_size; ++q)
        if (p.present & (std::uint64_t{1} << q)) sq[q] = p.squares[q];
    }
    for (const shape::tensor& t : shape_.tensors)
      if (t.first_exchanged != shape::not_cut)
        std::copy_n(leaves_.begin() + static_cast<std::ptrdiff_t>(t.first_leaf * K),
                    (t.size + leaf_size - 1) / leaf_size * K,
                    wire_.begin() + static_cast<std::ptrdiff_t>(t.first_exchanged * K));
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
        for (std::size_t k = 0; k < K; ++k)
          leaf_entry(t, leaf, k) = sum_in_order(cut_leaf_entry(s, k), all_blocks(t, leaf));
      }
    }
    for (std::size_t t = 0; t < tensors(); ++t) complete_tensor(t);
  }

  // Whether tensor t is held whole by this rank and cut by no shard boundary: then its sums need
  // nothing from the other ranks, and complete_tensor(t) gives them as soon as every element of t was
  // added, before complete() (which gives the same bits again).
  bool local(std::size_t t) const {
    return shape_.tensors[t].first_exchanged == shape::not_cut && held_[t].begin == 0 &&
           held_[t].end == shape_.tensors[t].size;
  }
  // Tensor t's sums from its leaves, added in order: after complete()'s exchange, or for a local tensor
  // once every adder of its elements finished.
  void complete_tensor(std::size_t t) {
    const std::size_t leaves = (shape_.tensors[t].size + leaf_size - 1) / leaf_size;
    for (std::size_t k = 0; k < sums_; ++k) {
      double sum = 0.0;
      for (std::size_t leaf = 0; leaf < leaves; ++leaf) sum += leaf_entry(t, leaf, k);
      totals_[t * sums_ + k] = sum;
    }
  }

  // Sum k of tensor t, after complete(): the same bits on every rank that holds part of t.
  double sum(std::size_t t, std::size_t k) const { return totals_[t * sums_ + k]; }

 private:
  // The leaf's sum from its blocks' sums: added in order from 0.0.
  static double sum_in_order(const double* sums, std::uint64_t present) {
    double s = 0.0;
    for (std::size_t q = 0; q < leaf_blocks && (present >> q) != 0; ++q) s += sums[q];
    return s;
  }
  static std::uint64_t bits(std::size_t from, std::size_t to) {
    const std::uint64_t upto = to >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << to) - 1;
    return upto & ~((std::uint64_t{1} << from) - 1);
  }
  // Every block of the leaf (the tensor's last leaf may have fewer than 64).
  std::uint64_t all_blocks(std::size_t t, std::size_t leaf) const {
    const std::size_t n = shape_.tensors[t].size, lb = leaf * leaf_size;
    return bits(0, (std::min(lb + leaf_size, n) - lb + block_size - 1) / block_size);
  }
  bool held_whole(std::size_t t, std::size_t leaf) const {
    const std::size_t lb = leaf * leaf_size;
    return lb >= held_[t].begin && std::min(lb + leaf_size, shape_.tensors[t].size) <= held_[t].end;
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
  std::size_t key(std::size_t t, std::size_t k, std::size_t i) const {
    return (shape_.tensors[t].first_leaf * leaf_blocks + i) * sums_ + k;  // i: a block or a leaf, per map
  }

  // Elements [j, j + m) of block i (in part): their squares kept until the block is whole on this
  // rank, then its sum goes to its leaf.
  void add_part(std::size_t t, std::size_t k, std::size_t i, std::size_t j, const float* x, std::size_t m) {
    const range held = held_[t];
    const std::size_t n = shape_.tensors[t].size, bb = i * block_size, be = std::min(bb + block_size, n);
    const std::lock_guard<std::mutex> lock(lock_);
    block_part& p = parts_[key(t, k, i)];
    p.tensor = t;
    p.block = i;
    p.sum = k;
    for (std::size_t q = 0; q < m; ++q) p.squares[j - bb + q] = static_cast<double>(x[q]) * static_cast<double>(x[q]);
    p.present |= bits(j - bb, j - bb + m);
    if (bb >= held.begin && be <= held.end && p.present == bits(0, be - bb)) {  // whole on this rank
      double sum = square_blocks::sum_of(p.squares, be - bb);
      parts_.erase(key(t, k, i));
      const std::size_t q = i % leaf_blocks;
      double sums[leaf_blocks];
      sums[q] = sum;
      merge_leaf_locked(t, k, i / leaf_blocks, sums, bits(q, q + 1));
    }
  }
  // Blocks' sums of a leaf (where `present`) to the shared state; the leaf's sum once it has all.
  void merge_leaf(std::size_t t, std::size_t k, std::size_t leaf, const double* sums, std::uint64_t present) {
    const std::lock_guard<std::mutex> lock(lock_);
    merge_leaf_locked(t, k, leaf, sums, present);
  }
  void merge_leaf_locked(std::size_t t, std::size_t k, std::size_t leaf, const double* sums, std::uint64_t present) {
    leaf_part& p = open_leaves_[key(t, k, leaf)];
    p.tensor = t;
    p.leaf = leaf;
    p.sum = k;
    for (std::size_t q = 0; q < leaf_blocks; ++q)
      if (present & (std::uint64_t{1} << q)) p.sums[q] = sums[q];
    p.present |= present;
    if (p.present == all_blocks(t, leaf) && held_whole(t, leaf)) {
      leaf_entry(t, leaf, k) = sum_in_order(p.sums, p.present);
      open_leaves_.erase(key(t, k, leaf));
    }
  }

  shape shape_;
  std::size_t sums_;
  std::vector<range> held_;     // per tensor: the tensor-local elements this rank updates
  std::vector<double> leaves_;  // every leaf's sum, per tensor and sum
  std::vector<double> wire_;    // the exchange: the cut tensors' leaves, the cut leaves' block sums, the cut blocks' squares
  std::vector<double> totals_;
  std::mutex lock_;  // over the two maps
  std::unordered_map<std::size_t, block_part> parts_;
  std::unordered_map<std::size_t, leaf_part> open_leaves_;
};

}  // namespace zero
