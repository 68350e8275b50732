// zero::tensor_sums: a tensor's sums of squares, the same bits however its elements are cut over ranks, and within a
// rounding of the exact sum.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zero/engine/tensor_sums.hpp"
#include "zero/sys/host.hpp"

namespace {

// The sums of squares of xs[t] (one tensor each, sum 0) with the values cut into `parts` contiguous
// pieces, each piece's sums kept apart as a rank keeps its own and added in blocks of `block` values
// (the sweep's blocks; each cut below its own top), then combined as the engine's all-reduces combine
// them: the summaries with max, the words with sum.
std::vector<double> cut_sums(const std::vector<std::vector<float>>& xs, int parts, std::size_t block = 1024) {
  const std::size_t tensors = xs.size();
  std::vector<zero::tensor_sums> ranks(static_cast<std::size_t>(parts), zero::tensor_sums(tensors, 1));
  const auto piece = [&](std::size_t t, int r) {
    const std::size_t n = xs[t].size();
    return std::pair{n * static_cast<std::size_t>(r) / static_cast<std::size_t>(parts),
                     n * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(parts)};
  };
  for (int r = 0; r < parts; ++r)
    for (std::size_t t = 0; t < tensors; ++t)
      for (auto [b, e] = piece(t, r); b < e; b += block)
        ranks[static_cast<std::size_t>(r)].add(zero::sys::host{}, t, 0, xs[t].data() + b, std::min(block, e - b));
  std::vector<std::int64_t> summary = ranks[0].packed_summaries();
  for (int r = 1; r < parts; ++r) {
    const auto mine = ranks[static_cast<std::size_t>(r)].packed_summaries();
    for (std::size_t e = 0; e < summary.size(); ++e) summary[e] = std::max(summary[e], mine[e]);
  }
  for (auto& rank : ranks) rank.agree(summary);
  std::vector<std::int64_t> words(ranks[0].words_to_reduce().size(), 0);
  for (auto& rank : ranks) {
    const auto& w = rank.words_to_reduce();
    for (std::size_t k = 0; k < words.size(); ++k) words[k] += w[k];
  }
  for (auto& rank : ranks) rank.words_to_reduce() = words;
  std::vector<double> out;
  for (std::size_t t = 0; t < tensors; ++t) out.push_back(ranks[0].sum(t, 0));
  // Every rank rounds the same words: the same sums.
  for (auto& rank : ranks)
    for (std::size_t t = 0; t < tensors; ++t)
      CHECK(std::bit_cast<std::uint64_t>(rank.sum(t, 0)) == std::bit_cast<std::uint64_t>(out[t]));
  return out;
}

// The definition the blocks must equal: every square cut below the tensor's top (one above its
// largest square's bin) one value at a time, the words added up, carried, and rounded once.
double cut_below_the_top(const std::vector<float>& xs) {
  float largest = 0.0f;
  for (float x : xs) largest = std::max(largest, std::fabs(x));
  if (largest == 0.0f) return 0.0;
  const int top = zero::binned::summary_of(static_cast<double>(largest) * largest).bin + 1;
  std::int64_t acc[zero::tensor_sums::word_count] = {};
  for (float x : xs) {
    std::int64_t w[zero::tensor_sums::word_count];
    zero::binned::to_words(static_cast<double>(x) * x, top, w);
    for (int k = 0; k < zero::tensor_sums::word_count; ++k) acc[k] += w[k];
  }
  zero::binned::carry(acc);
  return zero::binned::round<double>(acc, top);
}

}  // namespace

TEST_CASE("tensor_sums: every cut of the tensors over ranks gives the same bits, near the exact sum") {
  std::mt19937_64 rng(7);
  std::vector<std::vector<float>> xs;
  // Magnitudes over 60 binades, a tensor of one value, one of zeros, one with a subnormal, an empty one.
  for (std::size_t n : {1000u, 1u, 37u, 4096u}) {
    std::vector<float> v(n);
    for (auto& x : v)
      x = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng),
                     std::uniform_int_distribution<int>(-30, 30)(rng));
    xs.push_back(v);
  }
  xs.push_back(std::vector<float>(50, 0.0f));
  xs.push_back({std::numeric_limits<float>::denorm_min(), 3.0f});
  xs.push_back({});
  const std::vector<double> one = cut_sums(xs, 1);
  for (int parts : {2, 3, 4, 7}) {
    CAPTURE(parts);
    const std::vector<double> cut = cut_sums(xs, parts);
    for (std::size_t t = 0; t < xs.size(); ++t)
      CHECK(std::bit_cast<std::uint64_t>(cut[t]) == std::bit_cast<std::uint64_t>(one[t]));
  }
  for (std::size_t t = 0; t < xs.size(); ++t) {
    CAPTURE(t);
    long double exact = 0;  // 64-bit significands: far closer than the double result's rounding here
    for (float x : xs[t]) exact += static_cast<long double>(x) * static_cast<long double>(x);
    CHECK(std::fabs(static_cast<long double>(one[t]) - exact) <= 2e-16L * exact);
  }
  CHECK(one[4] == 0.0);
  CHECK(one[6] == 0.0);
  CHECK(one[1] == static_cast<double>(xs[1][0]) * xs[1][0]);
}

TEST_CASE("tensor_sums: blocks cut below their own tops give the bits of every value cut below the tensor's") {
  // Blocks whose tops differ from the tensor's by several bins: the tiny values' squares fall below the
  // tensor's kept bins (dropped, as the definition drops them) and the huge ones set the top; blocks of
  // 1 value, of a few, and of the sweep's 1024, over one rank and several.
  std::mt19937_64 rng(11);
  std::vector<std::vector<float>> xs;
  for (int spread : {2, 20, 60, 120}) {
    std::vector<float> v(3000);
    for (auto& x : v)
      x = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng),
                     std::uniform_int_distribution<int>(-spread, spread)(rng));
    xs.push_back(v);
  }
  std::vector<float> ramp(2500);  // magnitudes rising along the tensor: each block's top is higher
  for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8, static_cast<int>(i / 20) - 70);
  xs.push_back(ramp);
  xs.push_back({std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(), -1e-30f, 1.0f});
  for (std::size_t block : {std::size_t{1}, std::size_t{5}, std::size_t{64}, std::size_t{1024}})
    for (int parts : {1, 3}) {
      CAPTURE(block);
      CAPTURE(parts);
      const std::vector<double> got = cut_sums(xs, parts, block);
      for (std::size_t t = 0; t < xs.size(); ++t) {
        CAPTURE(t);
        CHECK(std::bit_cast<std::uint64_t>(got[t]) == std::bit_cast<std::uint64_t>(cut_below_the_top(xs[t])));
      }
    }
}

TEST_CASE("tensor_sums: a NaN or an infinity anywhere decides the sum on every rank") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> xs = {{1.0f, 2.0f, inf, 4.0f}, {1.0f, nan, 3.0f, inf}, {1.0f, 2.0f, 3.0f, 4.0f}};
  for (int parts : {1, 2, 4}) {
    CAPTURE(parts);
    const auto s = cut_sums(xs, parts);
    CHECK(std::isinf(s[0]));
    CHECK(std::isnan(s[1]));
    CHECK(s[2] == 30.0);
  }
}
