// Per-tensor sums of squares for a tensor-wise optimizer: exact (binned) over the rank's pieces, combined over the
// ranks in two all-reduces.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "zero/core/binned.hpp"

namespace zero {

// Why exact: a tensor's elements are cut over ranks differently in every stage and at every N, and
// a floating-point sum would depend on the cut. Each square (of a float, exact in double) goes into
// binned words (core/binned.hpp) below a top bin that every rank agrees on, so the words are integer
// sums whatever the cut and the order, and the sum is rounded once: the same bits in every stage, at
// every N, and in a world of one. The ranks agree in two steps, each one all-reduce of int64s:
//   1. summaries: per sum, the largest square's bin and the non-finite flags, packed
//      (flags << 32 | bin + 1) and reduced with max: the largest bin where every value is finite,
//      and a flag where any is not (which decides the sum: NaN or infinity);
//   2. words: each rank's words for that top bin, reduced with sum (exact integer additions).
// Sum s of tensor t is entry t x sums + s.
class tensor_sums {
 public:
  static constexpr int word_count = binned::words + 1;  // one word above the squares' top: the carries

  tensor_sums(std::size_t tensors, int sums)
      : sums_(static_cast<std::size_t>(sums)),
        largest_(tensors * sums_, 0.0f),
        flags_(tensors * sums_, 0u),
        tops_(tensors * sums_, -1),
        words_(tensors * sums_ * word_count, 0),
        since_carry_(tensors * sums_, 0) {}

  std::size_t entries() const { return largest_.size(); }
  std::size_t sums() const { return sums_; }

  // Pass 1: value x of sum s of tensor t.
  void see(std::size_t t, std::size_t s, float x) {
    const std::size_t e = t * sums_ + s;
    const float a = std::fabs(x);
    if (!(a <= std::numeric_limits<float>::max()))  // infinite or NaN
      flags_[e] |= x != x ? binned::summary::not_a_number : binned::summary::infinite;
    else if (a > largest_[e])
      largest_[e] = a;
  }
  // The summaries as the all-reduce's operands (max).
  std::vector<std::int64_t> packed_summaries() const {
    std::vector<std::int64_t> out(entries());
    for (std::size_t e = 0; e < out.size(); ++e) {
      const double sq = static_cast<double>(largest_[e]) * largest_[e];
      const binned::summary b = binned::summary_of(sq);
      out[e] = binned::pack(binned::summary{flags_[e] ? -1 : b.bin, flags_[e]});
    }
    return out;
  }
  // After the all-reduce: every rank's summaries merged.
  void agree(const std::vector<std::int64_t>& reduced) {
    for (std::size_t e = 0; e < entries(); ++e) {
      const binned::summary b = binned::unpack(reduced[e]);
      flags_[e] = b.flags;
      tops_[e] = b.flags || b.bin < 0 ? -1 : b.bin + 1;
    }
  }
  // Pass 2: the square of x into the words of sum s of tensor t (every value finite: the flags
  // already decide a sum that is not).
  void add(std::size_t t, std::size_t s, float x) {
    const std::size_t e = t * sums_ + s;
    if (tops_[e] < 0) return;
    const double y = static_cast<double>(x);
    std::int64_t w[word_count];
    binned::to_words(y * y, tops_[e], w);
    std::int64_t(&acc)[word_count] = *reinterpret_cast<std::int64_t(*)[word_count]>(words_.data() + e * word_count);
    for (int k = 0; k < word_count; ++k) acc[k] += w[k];
    if (++since_carry_[e] == binned::max_terms / 2) {  // before any word could overflow
      binned::carry(acc);
      since_carry_[e] = 0;
    }
  }
  // The words as the all-reduce's operands (sum), carried so that each rank adds words below 2^32.
  std::vector<std::int64_t>& words_to_reduce() {
    for (std::size_t e = 0; e < entries(); ++e)
      binned::carry(*reinterpret_cast<std::int64_t(*)[word_count]>(words_.data() + e * word_count));
    return words_;
  }
  // Sum s of tensor t, rounded once (after the words' all-reduce, or at once in a world of one): 0
  // for an empty or all-zero tensor, NaN or infinity where a value was.
  double sum(std::size_t t, std::size_t s) const {
    const std::size_t e = t * sums_ + s;
    if (flags_[e] & binned::summary::not_a_number) return std::numeric_limits<double>::quiet_NaN();
    if (flags_[e]) return std::numeric_limits<double>::infinity();
    if (tops_[e] < 0) return 0.0;
    std::int64_t w[word_count];
    for (int k = 0; k < word_count; ++k) w[k] = words_[e * word_count + static_cast<std::size_t>(k)];
    return binned::round<double>(w, tops_[e]);
  }

 private:
  std::size_t sums_;
  std::vector<float> largest_;  // the largest finite magnitude seen, per entry
  std::vector<unsigned> flags_;
  std::vector<int> tops_;  // the agreed top bin (one above the largest square's), -1: nothing to add
  std::vector<std::int64_t> words_;
  std::vector<std::uint64_t> since_carry_;
};

}  // namespace zero
