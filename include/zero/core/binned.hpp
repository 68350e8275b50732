// binned: an exact, order-independent sum of floats in fixed, absolutely aligned bins of 32 bits (ReproBLAS-style), rounded once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/config.hpp"

// Why bins: a floating-point sum depends on the order and grouping of its terms, so a gradient summed
// over 8 micro-batches on one rank differs in its last bits from the same gradient summed over 8 ranks.
// Integer sums do not. Each value is cut into words, each word holding the value's bits that fall in
// one fixed bin of the binary exponent range (bin b holds the bits of weight 2^(32 b + lowest) up to
// 2^(32 b + lowest + 31)), signed like the value. Only `words` bins are kept, from a top bin down: the
// bin of the largest magnitude among all the terms of the sum, which every party can agree on with a
// max (order-independent too). Dropping the bins below the kept ones is the same as dropping them
// from every term, so each kept word of a sum is the exact integer sum of the terms' words, whatever
// the order, the grouping, or the word size of the machine that added them. A word holds a digit below
// 2^32 per term in an int64, so 2^31 terms add without overflow. The sum is rounded once, to nearest
// even (subnormals and overflow to infinity included), from the exact integer the words make.
//
// Every function here is ZERO_HD and uses integer operations only, so a device computes the same bits.
namespace zero::binned {

inline constexpr int word_bits = 32;  // W: the width of a bin
inline constexpr int words = 3;       // K: bins kept per value in a gradient sum
// The most terms a word adds without overflow: each term's digit is below 2^W, a word is an int64.
inline constexpr std::uint64_t max_terms = std::uint64_t{1} << (63 - word_bits);

// The bins of a floating-point type: bin 0's lowest bit is 2^lowest, at or below the type's smallest
// subnormal, and bins 0..bins-1 hold every finite value.
template <class F>
struct format;
template <>
struct format<float> {
  using bits_type = std::uint32_t;
  static constexpr int precision = 24;       // significand bits
  static constexpr int min_exponent = -149;  // the weight of the smallest subnormal's bit
  static constexpr int exponent_bits = 8;
  static constexpr int lowest = -160;  // 2^lowest: bin 0's lowest bit
  static constexpr int bins = 9;       // up to 2^127, the largest finite bit
};
template <>
struct format<double> {
  using bits_type = std::uint64_t;
  static constexpr int precision = 53;
  static constexpr int min_exponent = -1074;
  static constexpr int exponent_bits = 11;
  static constexpr int lowest = -1088;
  static constexpr int bins = 66;  // up to 2^1023
};

// What a set of values needs for agreement: the bin of the largest magnitude (-1: every value is
// zero) and whether an infinity or a NaN was among them (a sum that bins cannot hold).
struct summary {
  int bin = -1;
  unsigned flags = 0;
  static constexpr unsigned infinite = 1, not_a_number = 2;
  ZERO_HD bool finite() const { return flags == 0; }
  friend bool operator==(const summary&, const summary&) = default;
};
// Of the union of two sets: the larger bin, both sets' flags.
ZERO_HD inline summary merge(summary a, summary b) { return summary{a.bin > b.bin ? a.bin : b.bin, a.flags | b.flags}; }
// One int64 on the wire: flags in the high half, bin + 1 in the low half.
ZERO_HD inline std::int64_t pack(summary s) {
  return static_cast<std::int64_t>((static_cast<std::uint64_t>(s.flags) << 32) | static_cast<std::uint32_t>(s.bin + 1));
}
ZERO_HD inline summary unpack(std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  return summary{static_cast<int>(static_cast<std::uint32_t>(u)) - 1, static_cast<unsigned>(u >> 32)};
}

// A finite value as sign, integer significand m and exponent e: |x| = m x 2^e.
struct decomposed {
  bool negative = false;
  std::uint64_t m = 0;
  int e = 0;
};
template <class F>
ZERO_HD inline decomposed decompose(F x) {
  using fmt = format<F>;
  using U = typename fmt::bits_type;
  constexpr int frac_bits = fmt::precision - 1;
  const U u = __builtin_bit_cast(U, x);
  const U field = (u >> frac_bits) & ((U{1} << fmt::exponent_bits) - 1);
  decomposed d;
  d.negative = (u >> (8 * sizeof(U) - 1)) != 0;
  d.m = static_cast<std::uint64_t>(u & ((U{1} << frac_bits) - 1));
  if (field == 0) {
    d.e = fmt::min_exponent;
  } else {
    d.m |= std::uint64_t{1} << frac_bits;
    d.e = static_cast<int>(field) + fmt::min_exponent - 1;
  }
  return d;
}

ZERO_HD inline int bit_length(std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  return v ? 64 - __clzll(static_cast<long long>(v)) : 0;
#else
  return v ? 64 - __builtin_clzll(v) : 0;
#endif
}

// The summary of one value: the bin of its leading bit, or its flag.
template <class F>
ZERO_HD inline summary summary_of(F x) {
  using fmt = format<F>;
  using U = typename fmt::bits_type;
  const U a = __builtin_bit_cast(U, x) & ~(U{1} << (8 * sizeof(U) - 1));
  const U inf = ((U{1} << fmt::exponent_bits) - 1) << (fmt::precision - 1);
  if (a > inf) return summary{-1, summary::not_a_number};
  if (a == inf) return summary{-1, summary::infinite};
  if (a == 0) return summary{};
  const decomposed d = decompose(x);
  const int lead = d.e + bit_length(d.m) - 1;
  return summary{(lead - fmt::lowest) / word_bits, 0};
}

// The K words of a value for a sum whose top bin is `top`: w[0] is bin top, w[k] bin top - k, each the
// value's bits in that bin as an integer below 2^32 with the value's sign (a word of a value depends
// on the value and its bin only, never on `top`). Bits below bin top - K + 1 are dropped, which
// truncates the value toward zero. A value whose bits reach above the top bin must not be given (the
// top is the largest bin of all terms). An infinity or NaN gives zeros (its summary carries it).
// Straight from the bits, without branches on the data but the shift's range (the bins a value reaches
// vary from element to element).
template <class F, int K>
ZERO_HD inline void to_words(F x, int top, std::int64_t (&w)[K]) {
  static_assert(K >= 1 && K <= 4, "binned::to_words: the words of a value fit a 128-bit window");
  using fmt = format<F>;
  using U = typename fmt::bits_type;
  constexpr int frac_bits = fmt::precision - 1;
  constexpr U max_field = (U{1} << fmt::exponent_bits) - 1;
  const U u = __builtin_bit_cast(U, x);
  const U a = u & ~(U{1} << (8 * sizeof(U) - 1)), field = a >> frac_bits;
  // |x| = m 2^e: a subnormal's significand is its fraction, with the exponent of field 1
  const std::uint64_t m = field == max_field ? 0 : field ? (a & ((U{1} << frac_bits) - 1)) | (U{1} << frac_bits) : a;
  const int e = static_cast<int>(field ? field : 1) + fmt::min_exponent - 1;
  // m placed in the window of the K words (bit 0: the lowest bit of bin top - K + 1) as a 128-bit
  // integer hi:lo; p < 0 drops m's lowest -p bits.
  const int p = e - (word_bits * (top - K + 1) + fmt::lowest);
  std::uint64_t lo = 0, hi = 0;
  if (p >= 64) {
    hi = p < 128 ? m << (p - 64) : 0;  // (only a zero, whose m is 0, can sit that high)
  } else if (p > 0) {
    lo = m << p;
    hi = m >> (64 - p);
  } else if (p > -64) {
    lo = m >> -p;
  }
  const std::uint64_t parts[4] = {lo & 0xffffffffu, lo >> 32, hi & 0xffffffffu, hi >> 32};
  const std::int64_t sign = -static_cast<std::int64_t>(u >> (8 * sizeof(U) - 1));  // 0 or -1
  for (int k = 0; k < K; ++k) w[k] = (static_cast<std::int64_t>(parts[K - 1 - k]) ^ sign) - sign;
}

// Words of a sum with top bin `from`, re-expressed for a larger top bin `to`: the words shift down by
// to - from places and the lowest fall off (from = -1, an empty sum: all words become zero).
template <int K>
ZERO_HD inline void realign(std::int64_t (&w)[K], int from, int to) {
  const int d = from < 0 ? K : to - from;
  for (int k = K - 1; k >= 0; --k) w[k] = k - d >= 0 ? w[k - d] : 0;
}

// Carries of non-negative words into the word above, so that every word but the top is below 2^32
// (the value is unchanged). Sums of squares use it to add more than max_terms terms: their top word
// is one bin above every term's and takes only carries.
template <int K>
ZERO_HD inline void carry(std::int64_t (&w)[K]) {
  for (int k = K - 1; k > 0; --k) {
    w[k - 1] += w[k] >> word_bits;
    w[k] &= 0xffffffff;
  }
}

// The sum the words hold, rounded once to F: to nearest, ties to even, subnormals and overflow to
// infinity as IEEE arithmetic on the exact value. An exact zero is +0. Words of at most 2^61 in
// magnitude (sums of up to 2^29 terms, or carried words; the engine allows 2^24 terms).
template <class F, int K>
ZERO_HD inline F round(const std::int64_t (&w)[K], int top);

// q x 2^quantum with `sign` as IEEE bits of F, q the rounded significand: a normal q (2^(precision-1) <=
// q <= 2^precision) adds the biased exponent, a subnormal (quantum = min_exponent) is q itself, and a
// result past the largest finite value is infinity.
template <class F>
ZERO_HD inline F from_quantum(typename format<F>::bits_type sign, int quantum, std::uint64_t q) {
  using fmt = format<F>;
  using U = typename fmt::bits_type;
  const U inf = ((U{1} << fmt::exponent_bits) - 1) << (fmt::precision - 1);
  const long long e = static_cast<long long>(quantum) - fmt::min_exponent;
  if (e >= (1ll << fmt::exponent_bits)) return __builtin_bit_cast(F, static_cast<U>(sign | inf));
  const std::uint64_t bits = (static_cast<std::uint64_t>(e) << (fmt::precision - 1)) + q;
  if (bits >= inf) return __builtin_bit_cast(F, static_cast<U>(sign | inf));
  return __builtin_bit_cast(F, static_cast<U>(sign | static_cast<U>(bits)));
}

#if defined(__SIZEOF_INT128__) && !defined(__CUDA_ARCH__)
// The same for K <= 3 words, with the compiler's 128-bit integers (the host's fast path; the tests hold
// it equal to the limb arithmetic below, which every system runs otherwise).
__extension__ typedef __int128 int128;
__extension__ typedef unsigned __int128 uint128;
template <class F, int K>
inline F round_128(const std::int64_t (&w)[K], int top) {
  static_assert(K <= 3, "binned::round_128: words of at most 2^61 each make at most 2^126");
  using fmt = format<F>;
  using U = typename fmt::bits_type;
  int128 v = 0;
  for (int k = 0; k < K; ++k) v += static_cast<int128>(w[k]) * (static_cast<int128>(1) << (word_bits * (K - 1 - k)));
  const bool negative = v < 0;
  const uint128 mag = negative ? -static_cast<uint128>(v) : static_cast<uint128>(v);
  const U sign = negative ? U{1} << (8 * sizeof(U) - 1) : U{0};
  if (mag == 0) return __builtin_bit_cast(F, U{0});
  const auto hi = static_cast<std::uint64_t>(mag >> 64), lo = static_cast<std::uint64_t>(mag);
  const int lead = hi ? 64 + bit_length(hi) - 1 : bit_length(lo) - 1;
  const int lsb = word_bits * (top - K + 1) + fmt::lowest;
  int quantum = lsb + lead - (fmt::precision - 1);
  if (quantum < fmt::min_exponent) quantum = fmt::min_exponent;
  const int r = quantum - lsb;
  std::uint64_t q = 0;
  if (r <= 0) {
    q = lo << -r;
  } else {
    q = static_cast<std::uint64_t>(mag >> r);
    const uint128 rest = mag & ((static_cast<uint128>(1) << r) - 1), half = static_cast<uint128>(1) << (r - 1);
    if (rest > half || (rest == half && (q & 1))) ++q;
  }
  return from_quantum<F>(sign, quantum, q);
}
#endif

// The limb arithmetic of round(), for any K: every system can run it.
template <class F, int K>
ZERO_HD inline F round_limbs(const std::int64_t (&w)[K], int top) {
  using fmt = format<F>;
  using U = typename fmt::bits_type;
  // Carry every word but the top into the one above, so the lower words are digits in [0, 2^32) and
  // the value is t 2^(32 (K-1)) + the digits, t signed. Then the value as a two's complement integer of
  // K + 1 32-bit limbs (least significant first), times 2^lsb.
  std::uint32_t limb[K + 1];
  std::int64_t c = 0;
  for (int k = K - 1; k > 0; --k) {
    const std::int64_t v = w[k] + c;
    limb[K - 1 - k] = static_cast<std::uint32_t>(v);
    c = v >> 32;  // arithmetic: floor(v / 2^32)
  }
  const std::int64_t t = w[0] + c;
  limb[K - 1] = static_cast<std::uint32_t>(t);
  limb[K] = static_cast<std::uint32_t>(static_cast<std::uint64_t>(t) >> 32);
  const bool negative = t < 0;
  if (negative) {  // the magnitude: invert and add one
    std::uint64_t carry = 1;
    for (int i = 0; i <= K; ++i) {
      carry += static_cast<std::uint32_t>(~limb[i]);
      limb[i] = static_cast<std::uint32_t>(carry);
      carry >>= 32;
    }
  }
  int high = K;
  while (high >= 0 && limb[high] == 0) --high;
  const U sign = negative ? U{1} << (8 * sizeof(U) - 1) : U{0};
  if (high < 0) return __builtin_bit_cast(F, U{0});  // +0, whatever the terms' signs
  // The 64 bits of the magnitude from bit i up (i >= 0), and whether any bit below i is set.
  auto bits_from = [&](int i) -> std::uint64_t {
    const int at = i / 32, o = i % 32;
    auto l = [&](int j) -> std::uint64_t { return j <= K ? limb[j] : 0; };
    const std::uint64_t low = l(at) | (l(at + 1) << 32);
    return o ? (low >> o) | (l(at + 2) << (64 - o)) : low;
  };
  auto any_below = [&](int i) {
    bool any = (i % 32) != 0 && (limb[i / 32] & ((std::uint32_t{1} << (i % 32)) - 1)) != 0;
    for (int j = 0; j < i / 32; ++j) any = any || limb[j] != 0;
    return any;
  };
  const int lsb = word_bits * (top - K + 1) + fmt::lowest;  // the weight of the integer's bit 0
  const int lead = 32 * high + bit_length(limb[high]) - 1;  // the magnitude's leading bit
  // The weight of q's lowest bit: `precision` bits down from the leading one, or the subnormals' fixed
  // quantum, whichever is higher.
  int quantum = lsb + lead - (fmt::precision - 1);
  if (quantum < fmt::min_exponent) quantum = fmt::min_exponent;
  const int r = quantum - lsb;  // bits of the integer below the quantum
  std::uint64_t q = 0;
  if (r <= 0) {
    q = bits_from(0) << -r;  // exact: at most `precision` bits (lead - r < precision)
  } else {
    // (lead < r - 1 only below half the smallest subnormal: q is 0 and the rounding decides)
    q = lead >= r ? bits_from(r) & ((std::uint64_t{1} << (lead - r + 1)) - 1) : 0;
    const bool half = ((bits_from(r - 1)) & 1) != 0, sticky = any_below(r - 1);
    if (half && (sticky || (q & 1))) ++q;  // to nearest, ties to even; 2^precision carries into the exponent
  }
  return from_quantum<F>(sign, quantum, q);
}

template <class F, int K>
ZERO_HD inline F round(const std::int64_t (&w)[K], int top) {
#if defined(__SIZEOF_INT128__) && !defined(__CUDA_ARCH__)
  if constexpr (K <= 3) return round_128<F>(w, top);
#endif
  return round_limbs<F>(w, top);
}

}  // namespace zero::binned
