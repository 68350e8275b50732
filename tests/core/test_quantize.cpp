// The blockwise quantizer (core/quantize.hpp) against an independent reference: scales, codes, ties, short blocks, zero and non-finite blocks, int4 packing, the rank-ordered sum.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "isa_levels.hpp"
#include "zero/core/quantize.hpp"
#include "zero/sys/host.hpp"

namespace {

namespace quant = zero::quant;
using zero::sys::host;

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
const float nan_canonical = [] {
  const std::uint32_t u = 0x7fc00000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}();

// The reference, written from the format's definition with the standard library (std::fabs,
// std::isfinite, std::nearbyint in the default rounding mode), not with the header's helpers.
struct reference {
  std::vector<float> scales;
  std::vector<int> codes;
  std::vector<float> values;  // dequantized
};
reference quantize_reference(const std::vector<float>& x, quant::format f) {
  const float qm = f.bits == 8 ? 127.0f : 7.0f;
  reference r;
  const std::size_t nb = (x.size() + f.block - 1) / f.block;
  for (std::size_t b = 0; b < nb; ++b) {
    float m = 0.0f;
    bool finite = true;
    for (std::size_t i = b * f.block; i < std::min(x.size(), (b + 1) * f.block); ++i) {
      if (!std::isfinite(x[i])) finite = false;
      else m = std::max(m, std::fabs(x[i]));
    }
    r.scales.push_back(finite ? m / qm : std::numeric_limits<float>::quiet_NaN());
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float s = r.scales[i / f.block];
    int q = 0;
    if (std::isfinite(s) && s > 0.0f) q = static_cast<int>(std::nearbyint(std::clamp(x[i] / s, -qm, qm)));
    r.codes.push_back(q);
    r.values.push_back(std::isnan(s) ? nan_canonical : static_cast<float>(q) * s);
  }
  return r;
}

// The codes in a wire, unpacked.
std::vector<int> codes_of(const std::vector<std::uint8_t>& wire, std::size_t n, quant::format f) {
  const std::uint8_t* c = wire.data() + 4 * quant::blocks(n, f);
  std::vector<int> q(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (f.bits == 8) {
      q[i] = static_cast<std::int8_t>(c[i]);
    } else {
      const int nib = (c[i / 2] >> (4 * (i % 2))) & 0xf;
      q[i] = nib >= 8 ? nib - 16 : nib;
    }
  }
  return q;
}
std::vector<float> scales_of(const std::vector<std::uint8_t>& wire, std::size_t n, quant::format f) {
  std::vector<float> s(quant::blocks(n, f));
  std::memcpy(s.data(), wire.data(), s.size() * 4);
  return s;
}

// Quantizes x on the host system, checks the wire against the reference bit for bit, and returns
// the dequantized values.
std::vector<float> round_trip(const std::vector<float>& x, quant::format f) {
  std::vector<std::uint8_t> wire(quant::wire_bytes(x.size(), f), 0xab);  // 0xab: the padding must be written
  quant::quantize(host{}, x.data(), x.size(), f, wire.data());
  const reference ref = quantize_reference(x, f);
  const auto scales = scales_of(wire, x.size(), f);
  REQUIRE(scales.size() == ref.scales.size());
  for (std::size_t b = 0; b < scales.size(); ++b) {
    CAPTURE(b);
    if (std::isnan(ref.scales[b])) CHECK(bits_of(scales[b]) == 0x7fc00000u);
    else CHECK(bits_of(scales[b]) == bits_of(ref.scales[b]));
  }
  CHECK(codes_of(wire, x.size(), f) == ref.codes);
  const std::size_t used = 4 * quant::blocks(x.size(), f) + quant::code_bytes(x.size(), f);
  for (std::size_t i = used; i < wire.size(); ++i) CHECK(wire[i] == 0);
  std::vector<float> y(x.size(), -1.0f);
  quant::dequantize(host{}, wire.data(), x.size(), f, y.data());
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(i);
    CHECK(bits_of(y[i]) == bits_of(ref.values[i]));
  }
  return y;
}

// ---- the host's packed loops (sys/host_quantize.hpp) against the rules run one index at a time ----

namespace hl = zero::sys::host_loop;

// The scalar reference: the rules of core/quantize.hpp run by a plain index loop, as the host ran
// them before its packed loops.
struct plain_system {
  template <class Rule>
  void for_each_index(std::size_t n, const Rule& rule) const {
    for (std::size_t j = 0; j < n; ++j) rule(j);
  }
  static void fill_zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
};

// Values of every class the format defines: random magnitudes over the whole range, subnormals, ±0,
// the largest finite values, exact ties of a scale-1 block (k + 1/2), and, in about one block in
// eight, an infinity or a NaN (a non-finite block); a few blocks all zero or underflowing.
std::vector<float> mixed_values(std::size_t n, std::size_t block, std::mt19937& gen) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-150, 127), pick(0, 15);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int kind = pick(gen);
    if (kind == 0)
      x[i] = std::ldexp(unit(gen), exponent(gen));
    else if (kind == 1)
      x[i] = __builtin_bit_cast(float, static_cast<std::uint32_t>(gen() & 0x807fffffu));  // subnormal
    else if (kind == 2)
      x[i] = (gen() & 1) ? -0.0f : 0.0f;
    else if (kind == 3)
      x[i] = (gen() & 1) ? -std::numeric_limits<float>::max() : std::numeric_limits<float>::max();
    else if (kind == 4)
      x[i] = static_cast<float>(static_cast<int>(gen() % 254) - 127) + 0.5f;
    else
      x[i] = unit(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 20) - 10);
  }
  for (std::size_t b = 0; b * block < n; ++b) {
    const std::size_t at = b * block + gen() % std::min(block, n - b * block);
    switch (gen() % 16) {
      case 0:
        x[at] = std::numeric_limits<float>::infinity();
        break;
      case 1:
        x[at] = -std::numeric_limits<float>::infinity();
        break;
      case 2:
        x[at] = __builtin_bit_cast(float, 0xffc01234u);
        break;  // a NaN with a payload
      case 3:
        x[at] = 127.0f;
        break;  // this block's ties are exact
      case 4:   // all zero, or so small that the scale underflows
        for (std::size_t i = b * block; i < std::min(n, (b + 1) * block); ++i)
          x[i] = (gen() & 1) ? -0.0f : __builtin_bit_cast(float, static_cast<std::uint32_t>(gen() % 64));
        break;
      default:
        break;
    }
  }
  return x;
}

// Quantizes, dequantizes and sums x (stored as T) with the host at `level` and with the plain loop,
// and checks every byte: wire (padding included), values, sums.
template <class T>
void check_levels_equal(const std::vector<float>& xf, quant::format f, hl::isa level) {
  const std::size_t n = xf.size();
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = T(xf[i]);
  const std::size_t wb = quant::wire_bytes(n, f);
  constexpr int sources = 3;
  std::vector<std::uint8_t> ref(sources * wb, 0xab), got(sources * wb, 0xcd);
  std::vector<T> y_ref(n), y_got(n), s_ref(n), s_got(n);
  for (int k = 0; k < sources; ++k) {
    std::vector<T> xk(x);
    for (std::size_t i = k; i < n; i += 3) xk[i] = T(-static_cast<float>(xk[i]) * static_cast<float>(k + 1));
    quant::quantize(plain_system{}, xk.data(), n, f, ref.data() + k * wb);
    const isa_levels::cap_guard cap(level);
    quant::quantize(host{}, xk.data(), n, f, got.data() + k * wb);
  }
  REQUIRE(ref == got);
  quant::dequantize(plain_system{}, ref.data(), n, f, y_ref.data());
  quant::dequantize_sum(plain_system{}, ref.data(), wb, sources, n, f, s_ref.data());
  {
    const isa_levels::cap_guard cap(level);
    quant::dequantize(host{}, ref.data(), n, f, y_got.data());
    quant::dequantize_sum(host{}, ref.data(), wb, sources, n, f, s_got.data());
  }
  // (n = 0: empty vectors, whose data() may be null, which memcmp must not be given)
  CHECK((n == 0 || std::memcmp(y_ref.data(), y_got.data(), n * sizeof(T)) == 0));
  CHECK((n == 0 || std::memcmp(s_ref.data(), s_got.data(), n * sizeof(T)) == 0));
}

}  // namespace

TEST_CASE("quantize: the wire's size, scales first and codes padded to 4 bytes") {
  const quant::format i8{8, 4}, i4{4, 4};
  CHECK(quant::blocks(10, i8) == 3);
  CHECK(quant::wire_bytes(10, i8) == 3 * 4 + 12);  // 10 codes padded to 12
  CHECK(quant::wire_bytes(10, i4) == 3 * 4 + 8);   // 5 bytes padded to 8
  CHECK(quant::wire_bytes(32, quant::format{8, 32}) == 4 + 32);
  CHECK(quant::wire_bytes(32, quant::format{4, 32}) == 4 + 16);
  CHECK(quant::wire_bytes(0, i8) == 0);
}

TEST_CASE("quantize: scale = max|x| / 127 per block, codes round to nearest even, short last block") {
  // Blocks of 4 over 10 values: the last block holds 2.
  const std::vector<float> x = {0.5f, -1.0f, 0.25f, 1.27f, 3.0f, -7.5f, 0.1f, 2.0f, -0.3f, 0.2f};
  const quant::format f{8, 4};
  const auto y = round_trip(x, f);
  std::vector<std::uint8_t> wire(quant::wire_bytes(x.size(), f));
  quant::quantize(host{}, x.data(), x.size(), f, wire.data());
  const auto s = scales_of(wire, x.size(), f);
  CHECK(s[0] == 1.27f / 127.0f);
  CHECK(s[1] == 7.5f / 127.0f);
  CHECK(s[2] == 0.3f / 127.0f);
  const auto q = codes_of(wire, x.size(), f);
  CHECK(q[3] == 127);   // the block's maximum maps to qmax
  CHECK(q[5] == -127);
  CHECK(q[8] == -127);
  // The error of every value is at most half a step of its block.
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(y[i] - x[i]) <= 0.5f * s[i / 4] * 1.0001f);
}

TEST_CASE("quantize: ties round to even (a block whose scale is exactly 1)") {
  // max 127 makes the scale 1, so x / scale is x and the halves are exact ties.
  const std::vector<float> x = {127.0f, 2.5f, 3.5f, -2.5f, 0.5f, -0.5f, 1.5f, -126.5f};
  const auto y = round_trip(x, quant::format{8, 8});
  CHECK(y == std::vector<float>{127.0f, 2.0f, 4.0f, -2.0f, 0.0f, 0.0f, 2.0f, -126.0f});
  CHECK(bits_of(y[5]) == 0);  // -0.5 rounds to code 0, which dequantizes to +0
  // int4: max 7 makes the scale 1.
  const std::vector<float> z = {7.0f, 2.5f, -3.5f, 0.5f, -6.5f, 1.5f};
  CHECK(round_trip(z, quant::format{4, 6}) == std::vector<float>{7.0f, 2.0f, -4.0f, 0.0f, -6.0f, 2.0f});
}

TEST_CASE("quantize: a zero block has scale 0 and dequantizes to +0; so does one whose scale underflows") {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {0.0f, -0.0f, 0.0f, 0.0f, 3.0f * tiny, -tiny, 0.0f, 2.0f * tiny, 1.0f, 0.0f, 0.0f, 0.0f};
  const quant::format f{8, 4};
  const auto y = round_trip(x, f);
  std::vector<std::uint8_t> wire(quant::wire_bytes(x.size(), f));
  quant::quantize(host{}, x.data(), x.size(), f, wire.data());
  const auto s = scales_of(wire, x.size(), f);
  CHECK(bits_of(s[0]) == 0);
  CHECK(bits_of(s[1]) == 0);  // 3 x denorm_min / 127 rounds to 0
  for (std::size_t i = 0; i < 8; ++i) CHECK(bits_of(y[i]) == 0);
  CHECK(y[8] == 1.0f);
}

TEST_CASE("quantize: a block with a NaN or an infinity dequantizes to the canonical NaN, the other blocks as usual") {
  const float inf = std::numeric_limits<float>::infinity();
  float payload;
  const std::uint32_t pb = 0xffc00001u;  // a negative NaN with a payload
  std::memcpy(&payload, &pb, 4);
  for (const int bits : {8, 4}) {
    CAPTURE(bits);
    const std::vector<float> x = {1.0f, inf, 2.0f, 3.0f, 0.5f, 0.25f, -1.0f, 4.0f, payload, 1.0f, -inf, 0.0f};
    const quant::format f{bits, 4};
    const auto y = round_trip(x, f);
    for (std::size_t i : {0, 1, 2, 3, 8, 9, 10, 11}) CHECK(bits_of(y[i]) == 0x7fc00000u);
    for (std::size_t i = 4; i < 8; ++i) CHECK(std::isfinite(y[i]));
  }
}

TEST_CASE("quantize: random blocks of every size against the reference, int8 and int4, within half a step") {
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const quant::format f : {quant::format{8, 1}, quant::format{8, 32}, quant::format{8, 256}, quant::format{4, 2},
                                quant::format{4, 64}}) {
    for (const std::size_t n : {1u, 31u, 32u, 33u, 1000u}) {
      CAPTURE(f.bits);
      CAPTURE(f.block);
      CAPTURE(n);
      std::vector<float> x(n);
      for (auto& v : x) v = dist(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 20) - 10);
      const auto y = round_trip(x, f);
      const auto ref = quantize_reference(x, f);
      for (std::size_t i = 0; i < n; ++i) CHECK(std::fabs(y[i] - x[i]) <= 0.5f * ref.scales[i / f.block] * 1.0001f);
    }
  }
}

TEST_CASE("quantize: 2-byte inputs and outputs widen and round as store_as does") {
  const std::vector<float> xf = {0.5f, -1.25f, 3.0f, 0.1f, -0.7f};
  std::vector<zero::bf16> xb(xf.size());
  std::vector<float> widened(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) {
    xb[i] = zero::bf16(xf[i]);
    widened[i] = static_cast<float>(xb[i]);
  }
  const quant::format f{8, 4};
  std::vector<std::uint8_t> wb(quant::wire_bytes(xf.size(), f)), wf(wb.size());
  quant::quantize(host{}, xb.data(), xb.size(), f, wb.data());
  quant::quantize(host{}, widened.data(), widened.size(), f, wf.data());
  CHECK(wb == wf);  // quantizing bf16 is quantizing its float value
  std::vector<zero::bf16> yb(xf.size());
  std::vector<float> yf(xf.size());
  quant::dequantize(host{}, wb.data(), xf.size(), f, yb.data());
  quant::dequantize(host{}, wb.data(), xf.size(), f, yf.data());
  for (std::size_t i = 0; i < xf.size(); ++i) CHECK(zero::bf16(yf[i]).bits == yb[i].bits);
}

TEST_CASE("quantize: dequantize_sum adds the sources' values in source order, in fp32, rounded once") {
  const std::size_t n = 37;
  const int sources = 4;
  const quant::format f{8, 8};
  const std::size_t stride = quant::wire_bytes(n, f);
  std::vector<std::uint8_t> wires(stride * sources);
  std::vector<std::vector<float>> deq(sources, std::vector<float>(n));
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (int k = 0; k < sources; ++k) {
    std::vector<float> x(n);
    for (auto& v : x) v = dist(gen) * static_cast<float>(k + 1);
    quant::quantize(host{}, x.data(), n, f, wires.data() + stride * static_cast<std::size_t>(k));
    quant::dequantize(host{}, wires.data() + stride * static_cast<std::size_t>(k), n, f, deq[k].data());
  }
  std::vector<float> sum(n);
  std::vector<zero::bf16> sum_bf16(n);
  quant::dequantize_sum(host{}, wires.data(), stride, sources, n, f, sum.data());
  quant::dequantize_sum(host{}, wires.data(), stride, sources, n, f, sum_bf16.data());
  for (std::size_t i = 0; i < n; ++i) {
    float acc = deq[0][i];
    for (int k = 1; k < sources; ++k) acc += deq[k][i];
    CHECK(bits_of(sum[i]) == bits_of(acc));
    CHECK(sum_bf16[i].bits == zero::bf16(acc).bits);
  }
}

TEST_CASE("quantize: formats the rules cannot represent are refused with the setting's name") {
  CHECK_THROWS_WITH_AS(quant::validate(quant::format{6, 32}, "qwz"), "qwz: quantization bits must be 8 or 4, got 6",
                       zero::error);
  CHECK_THROWS_WITH_AS(quant::validate(quant::format{8, 0}, "qgz"),
                       "qgz: the quantization block must hold at least 1 value, got 0", zero::error);
  CHECK_THROWS_WITH_AS(quant::validate(quant::format{4, 33}, "qgz"),
                       "qgz: int4 packs two values per byte, so the block must be even, got 33", zero::error);
  CHECK_NOTHROW(quant::validate(quant::format{4, 2}, "qgz"));
}

TEST_CASE("quantize: the host's packed loops write the plain loop's bytes at every ISA level") {
  std::mt19937 gen(26);
  // Sizes around every pack width (4, 8, 16 values; 2, 4, 8 int4 bytes) and odd tails, and blocks
  // shorter than, equal to and longer than a pack, not multiples of it.
  const std::size_t sizes[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 255, 256, 257, 1001, 4099, 20000};
  const std::size_t blocks[] = {2, 6, 16, 34, 256};
  for (hl::isa level : isa_levels::available()) {
    for (std::size_t n : sizes)
      for (std::size_t block : blocks)
        for (int bits : {8, 4}) {
          CAPTURE(std::string(hl::name(level)));
          CAPTURE(n);
          CAPTURE(block);
          CAPTURE(bits);
          const quant::format f{bits, block};
          const std::vector<float> x = mixed_values(n, block, gen);
          check_levels_equal<float>(x, f, level);
          if (n <= 4099) {
            check_levels_equal<zero::bf16>(x, f, level);
            check_levels_equal<zero::fp16>(x, f, level);
          }
        }
    // An odd block for int8, and block 1 (every value its own scale).
    for (std::size_t block : {std::size_t{1}, std::size_t{37}}) {
      const std::vector<float> x = mixed_values(1000, block, gen);
      check_levels_equal<float>(x, quant::format{8, block}, level);
    }
  }
}
