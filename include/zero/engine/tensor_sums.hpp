// Per-tensor sums of squares for a tensor-wise optimizer: exact (binned) over the rank's pieces, taken in the same pass
// as the values, combined over the ranks in two all-reduces.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "zero/core/binned.hpp"
#include "zero/error.hpp"

namespace zero {

// Why exact: a tensor's elements are cut over ranks differently in every stage and at every N, and
// a floating-point sum would depend on the cut. Each square (of a float, exact in double) is cut into
// binned words (core/binned.hpp) below a top bin that every rank agrees on, so the words are integer
// sums whatever the cut and the order, and the sum is rounded once: the same bits in every stage, at
// every N, and in a world of one.
//
// Why in one pass: the agreed top is known only after an all-reduce, but the bins are absolute (bin b
// holds the bits of weight 2^(32 b + lowest) of every value), and the words a top keeps are the bins
// from it down, three of them. So a block of values is cut below its own top (its largest square's bin
// + 1), and each bin's digits are summed apart, without carries: the agreed top is at or above every
// block's, so every bin it keeps was kept by every block that has bits there, and the bins below it are
// dropped whole, as a cut below the agreed top drops them from each value. The words are then the
// digit sums of the kept bins, exactly what cutting each value below the agreed top and adding gives.
// The ranks agree in two steps, each one all-reduce of int64s:
//   1. summaries: per sum, the largest square's bin and the non-finite flags, packed
//      (flags << 32 | bin + 1) and reduced with max: the largest bin where every value is finite,
//      and a flag where any is not (which decides the sum: NaN or infinity);
//   2. words: each rank's words for that top bin, reduced with sum (exact integer additions).
// Sum s of tensor t is entry t x sums + s.
class tensor_sums {
 public:
  static constexpr int word_count = binned::words + 1;  // one word above the squares' top: the carries

  // The bins a float's square can reach (format<double>): from three below the smallest one's top
  // (the smallest subnormal's square, 2^-298) to the largest finite one's (below 2^256).
  static constexpr int lowest_bin =
      (2 * binned::format<float>::min_exponent - binned::format<double>::lowest) / binned::word_bits + 1 -
      binned::words;
  static constexpr int highest_bin = (2 * 128 - 1 - binned::format<double>::lowest) / binned::word_bits;
  static constexpr int bin_count = highest_bin - lowest_bin + 1;
  // The most values of one sum a rank adds: each digit is below 2^32 and a bin's digits are summed in
  // an int64 without carries (a carry would move bits out of a bin the agreed top may drop).
  static constexpr std::uint64_t max_values = std::uint64_t{1} << 31;

  tensor_sums(std::size_t tensors, int sums)
      : sums_(static_cast<std::size_t>(sums)),
        largest_(tensors * sums_, 0.0f),
        flags_(tensors * sums_, 0u),
        counts_(tensors * sums_, 0),
        bins_(tensors * sums_ * bin_count, 0),
        tops_(tensors * sums_, -1),
        words_(tensors * sums_ * word_count, 0) {}

  std::size_t entries() const { return largest_.size(); }
  std::size_t sums() const { return sums_; }

  // What a block of values adds: its largest finite magnitude, its non-finite flags, and (where every
  // value is finite and one is not zero) its squares' digits in the three bins below its own top.
  struct block {
    std::size_t values = 0;
    float largest = 0.0f;
    unsigned flags = 0;
    int top = -1;
    std::int64_t digits[binned::words] = {};  // bins top - 1, top - 2, top - 3
  };
  // The block of x[0, n) in the memory of `sys`, a system with the reproducible mode's reductions
  // (largest_magnitude, binned_square_digits: sys::host's): touches nothing shared, so threads cut
  // their blocks at once.
  template <class System>
  static block cut(const System& sys, const float* x, std::size_t n) {
    block b;
    b.values = n;
    if (n == 0) return b;
    const auto m = sys.largest_magnitude(&x, &n, 1, false, 1.0f);
    b.largest = m.largest;
    b.flags = m.flags;
    if (m.finite() && m.largest > 0.0f) {
      b.top = binned::summary_of(static_cast<double>(m.largest) * m.largest).bin + 1;
      sys.binned_square_digits(x, n, false, 1.0f, b.top, b.digits);
    }
    return b;
  }
  // Adds a block to sum s of tensor t (blocks in any order and any split give the same sum; the
  // caller serializes the calls).
  void add(std::size_t t, std::size_t s, const block& b) {
    const std::size_t e = t * sums_ + s;
    counts_[e] += b.values;
    ZERO_CHECK(counts_[e] < max_values, invalid_argument, "tensor_sums: tensor ", t, " has ", counts_[e],
               " elements on this rank; a tensor-wise optimizer's exact sums take fewer than 2^31");
    flags_[e] |= b.flags;
    if (b.largest > largest_[e]) largest_[e] = b.largest;
    if (b.top < 0) return;
    for (int k = 0; k < binned::words; ++k) bins_[e * bin_count + bin_at(b.top - 1 - k)] += b.digits[k];
  }
  template <class System>
  void add(const System& sys, std::size_t t, std::size_t s, const float* x, std::size_t n) {
    add(t, s, cut(sys, x, n));
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
  // After the all-reduce: every rank's summaries merged, and this rank's words for the agreed tops
  // (the digit sums of the three bins below each top).
  void agree(const std::vector<std::int64_t>& reduced) {
    for (std::size_t e = 0; e < entries(); ++e) {
      const binned::summary b = binned::unpack(reduced[e]);
      flags_[e] = b.flags;
      tops_[e] = b.flags || b.bin < 0 ? -1 : b.bin + 1;
      std::int64_t* w = words_.data() + e * word_count;
      for (int k = 0; k < word_count; ++k) w[k] = 0;
      if (tops_[e] < 0) continue;
      for (int k = 1; k < word_count; ++k) {
        const int bin = tops_[e] - k;
        if (bin >= lowest_bin && bin <= highest_bin) w[k] = bins_[e * bin_count + bin_at(bin)];
      }
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
  static std::size_t bin_at(int bin) { return static_cast<std::size_t>(bin - lowest_bin); }

  std::size_t sums_;
  std::vector<float> largest_;  // the largest finite magnitude seen, per entry
  std::vector<unsigned> flags_;
  std::vector<std::uint64_t> counts_;  // the values added, per entry
  std::vector<std::int64_t> bins_;     // per entry, bin_count digit sums from lowest_bin up (uncarried)
  std::vector<int> tops_;              // the agreed top bin (one above the largest square's), -1: nothing to add
  std::vector<std::int64_t> words_;
};

}  // namespace zero
