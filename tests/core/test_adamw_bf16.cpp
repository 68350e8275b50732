// optim::adamw_bf16 and its parts: stochastic rounding to bf16 (unbiased, with uniform draws), two bf16 in one
// word (special values), moments that round-to-nearest would stall, and the engine's memory with one slot.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zero/comm/backends/threads.hpp"
#include "zero/core/stochastic_rounding.hpp"
#include "zero/optim/adamw_bf16.hpp"
#include "zero/zero.hpp"

namespace {

namespace st = zero::stochastic;

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// The two bf16 values a slot word holds, widened.
std::array<float, 2> unpacked(float word) {
  float hi = 0, lo = 0;
  st::unpack_pair(word, hi, lo);
  return {hi, lo};
}

// A float nearest to x as bf16 (round to nearest even), widened: what a bf16 slot without stochastic
// rounding would keep.
float nearest_bf16(float x) { return static_cast<float>(zero::bf16(x)); }

}  // namespace

TEST_CASE("stochastic rounding to bf16: over every 16-bit draw the mean is the value, exactly") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-4.0f, 4.0f);
  std::vector<float> xs = {1.0f,      -1.0f,           0.0f,
                           -0.0f,     1.0f + 0x1p-20f, 0.999f,
                           -3.14159f, 0x1.fffffep-1f,  std::numeric_limits<float>::denorm_min(),
                           1e-40f,    -2.5e-39f,       0x1.fffffep+126f};
  for (int i = 0; i < 200; ++i) xs.push_back(std::ldexp(mag(rng), static_cast<int>(mag(rng) * 8)));
  for (float x : xs) {
    CAPTURE(x);
    double sum = 0.0;  // exact: each term has 8 significant bits, 65536 of them add up in 40
    int up = 0;
    const float down = from_bits(bits(x) & 0xffff0000u);
    for (std::uint32_t r = 0; r < 65536; ++r) {
      std::uint32_t u = bits(x);
      st::round_to_bf16_bits(u, r);
      const float y = from_bits(u);
      REQUIRE((y == down || std::fabs(y) > std::fabs(down)));
      up += y != down;
      sum += y;
    }
    CHECK(sum == 65536.0 * static_cast<double>(x));
    CHECK(up == static_cast<int>(bits(x) & 0xffffu));  // up exactly with the fraction dropped
  }
}

TEST_CASE("stochastic rounding's draws: each half of the hash is uniform over distinct values and steps") {
  // Chi-square of the top 4 bits of each 16-bit half over 16 bins, 64k draws from neighbouring weights
  // (the hardest case: inputs that differ in a few low bits). The 0.999 quantile of chi-square with 15
  // degrees of freedom is 37.7.
  for (std::uint64_t t : {1ull, 2ull, 1000ull, (1ull << 32) + 1}) {
    CAPTURE(t);
    std::array<int, 16> hi{}, lo{};
    const std::uint32_t key = st::step_key(t);
    for (std::uint32_t i = 0; i < 65536; ++i) {
      std::uint32_t h = 0;
      st::hash(from_bits(bits(0.5f) + i), 0.25f, 1e-3f, key, h);
      ++hi[h >> 28];
      ++lo[(h >> 12) & 15u];
    }
    for (const auto* counts : {&hi, &lo}) {
      double chi2 = 0.0;
      for (int c : *counts) chi2 += (c - 4096.0) * (c - 4096.0) / 4096.0;
      CHECK(chi2 < 37.7);
    }
  }
  CHECK(st::step_key(1) != st::step_key(2));
  CHECK(st::step_key(1) != st::step_key((1ull << 32) + 1));
}

TEST_CASE("two bf16 in a word: the values, and every non-finite case canonical") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // bf16 values need no rounding: they come back whatever the draw.
  for (std::uint32_t r : {0u, 0xffffffffu, 0x12345678u}) {
    const float w = st::pack_pair(-1.5f, 0x1p-100f, r);
    CHECK(unpacked(w) == std::array<float, 2>{-1.5f, 0x1p-100f});
    CHECK(w == doctest::Approx(-1.5f).epsilon(0x1p-8));  // read as a float: the upper value
    CHECK(bits(unpacked(st::pack_pair(-0.0f, inf, r))[0]) == bits(-0.0f));
    CHECK(unpacked(st::pack_pair(2.0f, inf, r))[1] == inf);  // the lower value Inf: the word stays finite
    CHECK(std::isfinite(st::pack_pair(2.0f, inf, r)));
    // The upper value NaN or Inf, or the lower NaN: the canonical NaN, and the upper value reads NaN.
    for (auto [hi, lo] : std::array<std::array<float, 2>, 5>{
             {{nan, 1.0f}, {-nan, 1.0f}, {inf, inf}, {-inf, 0.0f}, {1.0f, from_bits(0xffc00001u)}}}) {
      const float w2 = st::pack_pair(hi, lo, r);
      CHECK(bits(w2) == zero::fp::canonical_nan_bits32);
      CHECK(std::isnan(unpacked(w2)[0]));
    }
  }
  // NaN bits that a carry would take into the sign bit, or wrap around.
  CHECK(bits(st::pack_pair(from_bits(0x7fffffffu), 1.0f, 0xffffffffu)) == zero::fp::canonical_nan_bits32);
  CHECK(bits(st::pack_pair(from_bits(0xffffffffu), 1.0f, 0xffffffffu)) == zero::fp::canonical_nan_bits32);
  // The largest float rounded up becomes Inf: canonical too, never a NaN with a payload.
  CHECK(bits(st::pack_pair(std::numeric_limits<float>::max(), 1.0f, 0xffffffffu)) == zero::fp::canonical_nan_bits32);
  CHECK(unpacked(st::pack_pair(std::numeric_limits<float>::max(), 1.0f, 0u))[0] == 0x1.fep+127f);
}

TEST_CASE("adamw_bf16: a slow moment still converges, where round-to-nearest stalls it") {
  // v = b2 v + (1 - b2) g^2 with b2 = 0.999 and g = 1 adds less than half a bf16 ulp per step once v
  // passes 1/4: rounded to nearest it stays there for good. Rounded stochastically it follows the fp32
  // moment (its error is a random walk, about ulp / sqrt(2 (1 - b2)), a few percent here).
  zero::optim::adamw_bf16 o;
  o.weight_decay = 0.0f;
  zero::optim::adamw fp32{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
  constexpr int steps = 3000;
  const std::array<float, 4> w0 = {0.5f, -0.25f, 0.125f, 1.5f};
  for (float w_start : w0) {
    CAPTURE(w_start);
    float w = w_start, word = 0.0f, w32 = w_start, nearest_v = 0.0f;
    float s32[2] = {0.0f, 0.0f};
    for (int t = 1; t <= steps; ++t) {
      zero::optim::adamw_bf16::update(o.constants(static_cast<std::uint64_t>(t)), w, 1.0f, &word);
      zero::optim::adamw::update(fp32.constants(static_cast<std::uint64_t>(t)), w32, 1.0f, s32);
      nearest_v = nearest_bf16(o.beta2 * nearest_v + (1.0f - o.beta2));
    }
    const auto [m, v] = unpacked(word);
    CHECK(m == 1.0f);
    CHECK(std::fabs(v - s32[1]) < 0.08f * s32[1]);
    CHECK(nearest_v == 0.25f);
    CHECK(s32[1] > 0.9f);
    CHECK(std::fabs(w - w32) < 0.05f * std::fabs(w32 - w_start));  // the weights' paths agree within 5%
  }
}

TEST_CASE("adamw_bf16: one 4-byte slot, so the optimizer states take two thirds of AdamW's (bf16) or half (fp32)") {
  zero::model_spec spec;
  spec.unit("a").tensor("w", {96, 10});
  spec.unit("b").tensor("w", {10, 48});
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
      auto measure = [&]<class Opt, class P>() {
        zero::engine<zero::stage1, zero::comm::threads, Opt, P> e(c, spec, Opt{});
        return e.memory();
      };
      const auto bf16_moments = measure.template operator()<zero::optim::adamw_bf16, zero::precision::bf16>();
      const auto fp32_moments = measure.template operator()<zero::optim::adamw, zero::precision::bf16>();
      using zero::mem_category;
      // Master weights (4 bytes) and one slot (4) against master and two slots (12 bytes).
      CHECK(2 * bf16_moments.bytes(mem_category::optimizer_states) ==
            fp32_moments.bytes(mem_category::optimizer_states));
      CHECK(3 * (bf16_moments.bytes(mem_category::master) + bf16_moments.bytes(mem_category::optimizer_states)) ==
            2 * (fp32_moments.bytes(mem_category::master) + fp32_moments.bytes(mem_category::optimizer_states)));
      CHECK(bf16_moments.block_count(mem_category::optimizer_states) == 1);
    });
  }
}
