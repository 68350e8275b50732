// Tests for zero::bf16 / zero::fp16 conversions against independent exact-arithmetic references.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "zero/core/half_types.hpp"

namespace {

// Describes a 2-byte format so one reference implementation serves both types.
template <typename T, int ExpBits, int MantBits>
struct format {
  using type = T;
  static constexpr int exp_bits = ExpBits;
  static constexpr int mant_bits = MantBits;
  static constexpr int bias = (1 << (exp_bits - 1)) - 1;
  static constexpr std::uint32_t exp_max = (1u << exp_bits) - 1u;
  static constexpr std::uint32_t mant_mask = (1u << mant_bits) - 1u;
  static constexpr std::uint16_t inf_bits = static_cast<std::uint16_t>(exp_max << mant_bits);
  static constexpr std::uint16_t quiet_bit = static_cast<std::uint16_t>(1u << (mant_bits - 1));
  static constexpr std::uint16_t sign_bit = 0x8000;
};

using fp16_format = format<zero::fp16, 5, 10>;
using bf16_format = format<zero::bf16, 8, 7>;

std::uint32_t fbits(float f) { return std::bit_cast<std::uint32_t>(f); }
float bfloat(std::uint32_t u) { return std::bit_cast<float>(u); }

template <typename F>
bool is_nan_bits(std::uint16_t b) {
  return ((b >> F::mant_bits) & F::exp_max) == F::exp_max && (b & F::mant_mask) != 0;
}

// Exact value of a finite, non-negative pattern, computed with ldexp rather
// than bit shuffling so it is independent of the header's code.
template <typename F>
double exact_magnitude(std::uint16_t b) {
  const int e = static_cast<int>((b >> F::mant_bits) & F::exp_max);
  const auto m = static_cast<double>(b & F::mant_mask);
  if (e == 0) {
    return std::ldexp(m, 1 - F::bias - F::mant_bits);
  }
  return std::ldexp(m + std::ldexp(1.0, F::mant_bits), e - F::bias - F::mant_bits);
}

// values[i] is the exact value of bit pattern i for i < inf_bits (all
// non-negative finite values, ascending), plus one virtual entry
// values[inf_bits] = 2^(bias + 1): the value Inf takes the place of when
// rounding, which makes the overflow threshold (max + half ulp, tie to the
// even pattern inf_bits) fall out of the generic nearest-neighbour search.
template <typename F>
const std::vector<double>& value_table() {
  static const std::vector<double> table = [] {
    std::vector<double> t(static_cast<std::size_t>(F::inf_bits) + 1);
    for (std::uint32_t i = 0; i < F::inf_bits; ++i) {
      t[i] = exact_magnitude<F>(static_cast<std::uint16_t>(i));
    }
    t[F::inf_bits] = std::ldexp(1.0, F::bias + 1);
    return t;
  }();
  return table;
}

// Reference narrowing for non-NaN floats: nearest table entry, ties to the
// even pattern (an even pattern is an even mantissa, and inf_bits is even).
// The differences below are exact in double: a and the table entries have at
// most 24 significant bits and the neighbours are within a factor of two of a
// (or zero, or within the tiny fp16 subnormal grid).
template <typename F>
std::uint16_t reference_narrow(float f) {
  const std::uint16_t sign = std::signbit(f) ? F::sign_bit : 0;
  if (std::isinf(f)) {
    return static_cast<std::uint16_t>(sign | F::inf_bits);
  }
  const auto& t = value_table<F>();
  const double a = std::fabs(static_cast<double>(f));
  const auto it = std::upper_bound(t.begin(), t.end(), a);  // t[0] == 0 <= a
  if (it == t.end()) {
    return static_cast<std::uint16_t>(sign | F::inf_bits);
  }
  const auto hi = static_cast<std::size_t>(it - t.begin());
  const std::size_t lo = hi - 1;
  const double d_lo = a - t[lo];
  const double d_hi = t[hi] - a;
  std::size_t pick = 0;
  if (d_lo < d_hi) {
    pick = lo;
  } else if (d_hi < d_lo) {
    pick = hi;
  } else {
    pick = (lo % 2 == 0) ? lo : hi;
  }
  return static_cast<std::uint16_t>(sign | pick);
}

// Collects mismatches without a doctest assertion per sample (millions of
// samples), reporting the first few in detail.
struct mismatch_log {
  std::size_t count = 0;
  std::string first;

  void add(const std::string& what) {
    if (count++ < 8) {
      first += what + "\n";
    }
  }
  void check(const char* label) const {
    INFO(label << ": " << count << " mismatches; first:\n" << first);
    CHECK(count == 0);
  }
};

std::string hex(std::uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// Checks T(f) against the reference. Every NaN input must give the one
// canonical quiet NaN (positive, no payload), whatever its sign and payload.
template <typename F>
void check_narrow(float f, mismatch_log& log) {
  using T = typename F::type;
  const std::uint16_t got = T(f).bits;
  const std::uint32_t u = fbits(f);
  if (std::isnan(f)) {
    const auto expected = static_cast<std::uint16_t>(F::inf_bits | F::quiet_bit);
    if (got != expected) {
      log.add("NaN in=" + hex(u) + " got=" + hex(got) + " want=" + hex(expected));
    }
    return;
  }
  const std::uint16_t want = reference_narrow<F>(f);
  if (got != want) {
    log.add("in=" + hex(u) + " got=" + hex(got) + " want=" + hex(want));
  }
}

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename F>
void check_exhaustive_widening_and_round_trip() {
  using T = typename F::type;
  mismatch_log widen_log;
  mismatch_log trip_log;
  for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    const T x = T::from_bits(b);
    const float w = static_cast<float>(x);
    if (fbits(zero::to_float(x)) != fbits(w) || x.to_bits() != b) {
      widen_log.add("to_float/to_bits disagree for " + hex(b));
    }
    const bool neg = (b & F::sign_bit) != 0;
    const auto mag = static_cast<std::uint16_t>(b & 0x7fffu);
    if (is_nan_bits<F>(b)) {
      // Widening keeps sign and the whole payload (left-aligned).
      const std::uint32_t want = (neg ? 0x80000000u : 0u) | 0x7f800000u |
                                 (static_cast<std::uint32_t>(b & F::mant_mask) << (23 - F::mant_bits));
      if (!std::isnan(w) || fbits(w) != want) {
        widen_log.add("NaN " + hex(b) + " widened to " + hex(fbits(w)));
      }
      // Narrowing makes every NaN the canonical one.
      const auto back = T(w).bits;
      if (back != (F::inf_bits | F::quiet_bit)) {
        trip_log.add("NaN " + hex(b) + " came back as " + hex(back));
      }
      continue;
    }
    double ref = mag == F::inf_bits ? std::numeric_limits<double>::infinity() : exact_magnitude<F>(mag);
    ref = neg ? -ref : ref;                      // gives -0.0 for the negative zero pattern
    const auto ref_f = static_cast<float>(ref);  // exact: every value is a float
    if (static_cast<double>(ref_f) != ref || fbits(w) != fbits(ref_f)) {
      widen_log.add(hex(b) + " widened to " + hex(fbits(w)) + " want " + hex(fbits(ref_f)));
    }
    const auto back = T(w).bits;
    if (back != b) {
      trip_log.add(hex(b) + " came back as " + hex(back));
    }
  }
  widen_log.check("widening");
  trip_log.check("round trip");
}

// Every representable value, every midpoint between adjacent values
// (including max/Inf), and the floats just either side of each, both signs.
template <typename F>
void check_midpoints() {
  const auto& t = value_table<F>();
  mismatch_log log;
  std::size_t not_exact = 0;
  auto around = [&](float v) {
    for (const float s : {v, -v}) {
      check_narrow<F>(s, log);
      check_narrow<F>(std::nextafter(s, 0.0f), log);
      check_narrow<F>(std::nextafter(s, s < 0 ? -INFINITY : INFINITY), log);
    }
  };
  for (std::size_t i = 0; i + 1 < t.size(); ++i) {
    around(static_cast<float>(t[i]));
    const double mid = (t[i] + t[i + 1]) / 2;  // exact in double
    const auto mid_f = static_cast<float>(mid);
    if (static_cast<double>(mid_f) != mid) {
      ++not_exact;
    }
    around(mid_f);
  }
  CHECK(not_exact == 0);
  log.check("midpoints");
}

template <typename F>
void check_random(std::size_t n_raw, std::size_t n_ranged) {
  mismatch_log log;
  std::uint64_t state = 0x5eed0f16b16f0001ull;
  // Arbitrary bit patterns: covers NaN payloads, huge and tiny floats.
  for (std::size_t i = 0; i < n_raw; ++i) {
    check_narrow<F>(bfloat(static_cast<std::uint32_t>(splitmix64(state))), log);
  }
  // Exponents restricted to around the target's finite range, where the
  // interesting rounding happens (for bf16 the raw patterns already are).
  constexpr auto lo_exp = static_cast<std::uint32_t>(std::max(0, 127 - F::bias - F::mant_bits - 3));
  constexpr auto hi_exp = static_cast<std::uint32_t>(std::min(255, 127 + F::bias + 2));
  for (std::size_t i = 0; i < n_ranged; ++i) {
    const std::uint64_t r = splitmix64(state);
    const auto exp = static_cast<std::uint32_t>(lo_exp + (r >> 40) % (hi_exp - lo_exp + 1));
    const auto u = static_cast<std::uint32_t>((r & 0x807fffffu) | (exp << 23));
    check_narrow<F>(bfloat(u), log);
  }
  log.check("random");
}

std::uint16_t h(float f) { return zero::fp16(f).bits; }
std::uint16_t b(float f) { return zero::bf16(f).bits; }
std::uint16_t h_u(std::uint32_t u) { return h(bfloat(u)); }
std::uint16_t b_u(std::uint32_t u) { return b(bfloat(u)); }

}  // namespace

// The conversions are constexpr, so they can be used in constant expressions.
static_assert(zero::fp16(1.0f).bits == 0x3c00);
static_assert(zero::bf16(1.0f).bits == 0x3f80);
static_assert(static_cast<float>(zero::fp16::from_bits(0x0001)) == 0x1p-24f);
static_assert(zero::to_float(zero::bf16::from_bits(0xc000)) == -2.0f);

TEST_SUITE("half_types") {
  TEST_CASE("type properties") {
    using zero::bf16;
    using zero::fp16;
    CHECK(sizeof(bf16) == 2);
    CHECK(sizeof(fp16) == 2);
    CHECK(alignof(bf16) == 2);
    CHECK(alignof(fp16) == 2);
    CHECK(std::is_trivially_copyable_v<bf16>);
    CHECK(std::is_trivially_copyable_v<fp16>);
    CHECK(std::is_standard_layout_v<bf16>);
    CHECK(std::is_standard_layout_v<fp16>);
    CHECK(std::is_trivially_default_constructible_v<fp16>);
    // Conversions are explicit in both directions.
    CHECK(std::is_constructible_v<fp16, float>);
    CHECK_FALSE(std::is_convertible_v<float, fp16>);
    CHECK_FALSE(std::is_convertible_v<float, bf16>);
    CHECK_FALSE(std::is_convertible_v<fp16, float>);
    CHECK_FALSE(std::is_convertible_v<bf16, float>);
    CHECK(fp16::from_bits(0x1234).to_bits() == 0x1234);
    CHECK(bf16::from_bits(0xabcd).bits == 0xabcd);
  }

  TEST_CASE("reference tables are strictly increasing") {
    const auto& th = value_table<fp16_format>();
    const auto& tb = value_table<bf16_format>();
    CHECK(std::adjacent_find(th.begin(), th.end(), std::greater_equal<>()) == th.end());
    CHECK(std::adjacent_find(tb.begin(), tb.end(), std::greater_equal<>()) == tb.end());
    CHECK(th[0x7bff] == 65504.0);
    CHECK(th[0x0001] == 0x1p-24);
    CHECK(tb[0x0001] == 0x1p-133);
    CHECK(tb[0x7f7f] == static_cast<double>(bfloat(0x7f7f0000u)));
  }

  TEST_CASE("fp16 special cases") {
    CHECK(h(0.0f) == 0x0000);
    CHECK(h(-0.0f) == 0x8000);
    CHECK(h(INFINITY) == 0x7c00);
    CHECK(h(-INFINITY) == 0xfc00);
    CHECK(h(1.0f) == 0x3c00);
    CHECK(h(-2.0f) == 0xc000);
    CHECK(h(0.1f) == 0x2e66);
    CHECK(h(1.0f / 3.0f) == 0x3555);
    CHECK(h(1.0f + 0x1p-11f) == 0x3c00);      // tie, even stays
    CHECK(h(1.0f + 3 * 0x1p-11f) == 0x3c02);  // tie, odd rounds up
    // Every NaN becomes the canonical quiet NaN: x86's default NaN (0xffc00000) and CUDA's
    // (0x7fffffff) alike, signaling ones and low-bit payloads too.
    CHECK(h_u(0x7fc00000u) == 0x7e00);
    CHECK(h_u(0xffc00000u) == 0x7e00);
    CHECK(h_u(0x7f800001u) == 0x7e00);
    CHECK(h_u(0xff800001u) == 0x7e00);
    CHECK(h_u(0x7f801fffu) == 0x7e00);
    CHECK(h_u(0x7fa00000u) == 0x7e00);
    CHECK(h_u(0x7fffffffu) == 0x7e00);
    CHECK(zero::canonical_fp16_nan == 0x7e00);
    // Overflow: max finite 65504, threshold 65520 (tie goes to Inf).
    CHECK(h(65504.0f) == 0x7bff);
    CHECK(h(65519.0f) == 0x7bff);
    CHECK(h(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
    CHECK(h(65520.0f) == 0x7c00);
    CHECK(h(-65520.0f) == 0xfc00);
    CHECK(h(65536.0f) == 0x7c00);
    CHECK(h(std::numeric_limits<float>::max()) == 0x7c00);
    CHECK(h(std::numeric_limits<float>::lowest()) == 0xfc00);
    // Subnormals.
    CHECK(h(0x1p-24f) == 0x0001);
    CHECK(h(-0x1p-24f) == 0x8001);
    CHECK(h(0x1p-25f) == 0x0000);  // tie to even zero
    CHECK(h(-0x1p-25f) == 0x8000);
    CHECK(h(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
    CHECK(h(1.5f * 0x1p-24f) == 0x0002);     // tie, odd rounds up
    CHECK(h(2.5f * 0x1p-24f) == 0x0002);     // tie, even stays
    CHECK(h(1023.0f * 0x1p-24f) == 0x03ff);  // largest subnormal
    CHECK(h(1023.5f * 0x1p-24f) == 0x0400);  // rounds up into normal
    CHECK(h(std::nextafter(0x1p-14f, 0.0f)) == 0x0400);
    CHECK(h(0x1p-14f) == 0x0400);
    CHECK(h(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(h(-std::numeric_limits<float>::denorm_min()) == 0x8000);
    CHECK(h(std::numeric_limits<float>::min()) == 0x0000);
    // Widening.
    CHECK(static_cast<float>(zero::fp16::from_bits(0x7bff)) == 65504.0f);
    CHECK(static_cast<float>(zero::fp16::from_bits(0x0001)) == 0x1p-24f);
    CHECK(static_cast<float>(zero::fp16::from_bits(0x03ff)) == 1023.0f * 0x1p-24f);
    CHECK(fbits(static_cast<float>(zero::fp16::from_bits(0x8000))) == 0x80000000u);
    CHECK(std::isinf(static_cast<float>(zero::fp16::from_bits(0xfc00))));
    CHECK(std::isnan(zero::to_float(zero::fp16::from_bits(0x7c01))));
  }

  TEST_CASE("bf16 special cases") {
    CHECK(b(0.0f) == 0x0000);
    CHECK(b(-0.0f) == 0x8000);
    CHECK(b(INFINITY) == 0x7f80);
    CHECK(b(-INFINITY) == 0xff80);
    CHECK(b(1.0f) == 0x3f80);
    CHECK(b(0.1f) == 0x3dcd);
    CHECK(b_u(0x3f808000u) == 0x3f80);  // tie, even stays
    CHECK(b_u(0x3f818000u) == 0x3f82);  // tie, odd rounds up
    CHECK(b_u(0x3f808001u) == 0x3f81);
    CHECK(b_u(0x3f807fffu) == 0x3f80);
    // NaNs: a payload only in the low 16 bits must not truncate to Inf, the
    // all-ones NaN must not carry into the sign bit, and every NaN is the
    // canonical one.
    CHECK(b_u(0x7f800001u) == 0x7fc0);
    CHECK(b_u(0xff800001u) == 0x7fc0);
    CHECK(b_u(0x7f80ffffu) == 0x7fc0);
    CHECK(b_u(0x7fffffffu) == 0x7fc0);
    CHECK(b_u(0xffffffffu) == 0x7fc0);
    CHECK(b_u(0xffc00000u) == 0x7fc0);
    CHECK(b_u(0x7fc00000u) == 0x7fc0);
    CHECK(b_u(0x7f810000u) == 0x7fc0);
    CHECK(zero::canonical_bf16_nan == 0x7fc0);
    // Overflow: max finite 0x7f7f; max + half ulp (0x7f7f8000) ties to Inf.
    CHECK(b_u(0x7f7f0000u) == 0x7f7f);
    CHECK(b_u(0x7f7f7fffu) == 0x7f7f);
    CHECK(b_u(0x7f7f8000u) == 0x7f80);
    CHECK(b(std::numeric_limits<float>::max()) == 0x7f80);
    CHECK(b(std::numeric_limits<float>::lowest()) == 0xff80);
    // Subnormals.
    CHECK(b_u(0x00010000u) == 0x0001);
    CHECK(b_u(0x00008000u) == 0x0000);  // tie to even zero
    CHECK(b_u(0x80008000u) == 0x8000);
    CHECK(b_u(0x00008001u) == 0x0001);
    CHECK(b_u(0x00018000u) == 0x0002);
    CHECK(b_u(0x007f8000u) == 0x0080);  // rounds up into normal
    CHECK(b(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(b(-std::numeric_limits<float>::denorm_min()) == 0x8000);
    // Widening.
    CHECK(fbits(static_cast<float>(zero::bf16::from_bits(0x7f7f))) == 0x7f7f0000u);
    CHECK(fbits(zero::to_float(zero::bf16::from_bits(0x8001))) == 0x80010000u);
    CHECK(std::isnan(static_cast<float>(zero::bf16::from_bits(0xffc1))));
  }

  TEST_CASE("fp16 exhaustive widening and round trip") { check_exhaustive_widening_and_round_trip<fp16_format>(); }

  TEST_CASE("bf16 exhaustive widening and round trip") {
    check_exhaustive_widening_and_round_trip<bf16_format>();
    // bf16 widening is the 16-bit shift into the top half of a binary32.
    mismatch_log log;
    for (std::uint32_t i = 0; i <= 0xffffu; ++i) {
      const float w = static_cast<float>(zero::bf16::from_bits(static_cast<std::uint16_t>(i)));
      if (fbits(w) != i << 16) {
        log.add(hex(i));
      }
    }
    log.check("bf16 shift widening");
  }

  TEST_CASE("fp16 narrowing at every midpoint") { check_midpoints<fp16_format>(); }
  TEST_CASE("bf16 narrowing at every midpoint") { check_midpoints<bf16_format>(); }

  TEST_CASE("fp16 narrowing of pseudo-random floats") { check_random<fp16_format>(2'000'000, 2'000'000); }
  TEST_CASE("bf16 narrowing of pseudo-random floats") { check_random<bf16_format>(2'000'000, 1'000'000); }

}  // TEST_SUITE
