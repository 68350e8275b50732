// zero::tensor_sums: a tensor's sums of squares in the order its own indices fix, the same bits however its elements
// are cut over ranks, threads and chunks, on every SIMD level, and near the exact sum.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "../optimizer_step.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/tensor_sums.hpp"
#include "zero/optim/lamb.hpp"
#include "zero/sys/host.hpp"
#include "zero/sys/host_loop.hpp"

namespace {

constexpr int K = 2;  // sums per tensor, as optim::lamb's

using values = std::vector<std::vector<std::vector<float>>>;  // [tensor][sum][element]

// Magnitudes over 60 binades, signs mixed.
std::vector<float> random_values(std::size_t n, std::mt19937_64& rng) {
  std::vector<float> v(n);
  for (auto& x : v)
    x = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng),
                   std::uniform_int_distribution<int>(-30, 30)(rng));
  return v;
}

struct outcome {
  std::vector<std::vector<double>> sums;  // [rank][tensor x K + k]; NaN where the rank holds none of the tensor
  std::size_t exchanged = 0;              // the all-reduce's doubles
};

// Every rank of `ranks` adds the elements it updates in ranges cut at random points (as the threads'
// ranges and the offload chunks cut them), each range through one adder in calls cut at random points
// (the sweep's blocks), both sums a call at a time; the ranges in a random order. The exchanges are
// added in rank order, as the all-reduce adds them; each rank completes its sums.
outcome step_of(const zero::layout& l, std::deque<zero::tensor_sums>& rank_sums, bool sharded, const values& xs,
                std::mt19937_64& rng) {
  const int ranks = l.ranks();
  const auto cut = [&](std::size_t at, std::size_t end, std::size_t most) {
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    while (at < end) {
      std::size_t m = std::uniform_int_distribution<std::size_t>(1, most)(rng);
      if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) m = (m + 63) / 64 * 64;
      m = std::min(m, end - at);
      pieces.emplace_back(at, m);
      at += m;
    }
    return pieces;
  };
  for (int r = 0; r < ranks; ++r) {
    zero::tensor_sums& s = rank_sums[static_cast<std::size_t>(r)];
    s.begin_step();
    struct range_of {
      std::size_t t, at, m;
    };
    std::vector<range_of> ranges;
    for (std::size_t t = 0; t < s.tensors(); ++t) {
      const auto& tensor = s.layout_shape().tensors[t];
      const zero::range mine = zero::intersect(zero::range{tensor.begin, tensor.begin + tensor.size},
                                               l.updated_real(zero::unit_id{tensor.unit}, r, sharded));
      if (mine.empty()) continue;
      for (auto [at, m] : cut(mine.begin - tensor.begin, mine.end - tensor.begin, 9000)) ranges.push_back({t, at, m});
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    for (const range_of& g : ranges) {
      zero::tensor_sums::adder adder(s, g.t);
      for (auto [at, m] : cut(g.at, g.at + g.m, 1100))
        for (std::size_t k = 0; k < K; ++k) adder.add(zero::sys::host{}, k, at, xs[g.t][k].data() + at, m);
      adder.finish();
    }
  }
  outcome o;
  std::vector<double> total;
  for (auto& s : rank_sums) {
    const std::vector<double>& w = s.exchange();
    if (total.empty()) total.assign(w.size(), 0.0);
    REQUIRE(w.size() == total.size());
    for (std::size_t i = 0; i < w.size(); ++i) total[i] += w[i];
  }
  o.exchanged = total.size();
  for (int r = 0; r < ranks; ++r) {
    zero::tensor_sums& s = rank_sums[static_cast<std::size_t>(r)];
    s.exchange() = total;
    s.complete();
    std::vector<double> mine;
    for (std::size_t t = 0; t < s.tensors(); ++t) {
      const auto& tensor = s.layout_shape().tensors[t];
      const bool holds = !zero::intersect(zero::range{tensor.begin, tensor.begin + tensor.size},
                                          l.updated_real(zero::unit_id{tensor.unit}, r, sharded))
                              .empty();
      for (std::size_t k = 0; k < K; ++k) mine.push_back(holds ? s.sum(t, k) : std::nan(""));
    }
    o.sums.push_back(mine);
  }
  return o;
}

// With `before`, the same objects first take a step over those values (what one step leaves must not
// reach the next).
outcome run(const zero::model_spec& spec, int ranks, bool sharded, const values& xs, std::mt19937_64& rng,
            const values* before = nullptr) {
  const zero::layout l = zero::layout::make(spec, ranks);
  std::deque<zero::tensor_sums> rank_sums;  // (not movable: a lock)
  for (int r = 0; r < ranks; ++r) rank_sums.emplace_back(l, sharded, r, K);
  outcome o;
  for (const values* step : {before, &xs}) {
    if (!step) continue;
    o = step_of(l, rank_sums, sharded, *step, rng);
  }
  return o;
}

// Tensors of many sizes around the blocks (64) and leaves (4096), in units whose slices cut them
// inside a block, on a block's edge, on a leaf's edge, or not at all.
zero::model_spec test_spec() {
  zero::model_spec spec;
  spec.unit("a").tensor("w", {5000}).tensor("b", {1}).tensor("c", {37}).tensor("d", {8192}).tensor("e", {64});
  spec.unit("b").tensor("w", {3 * 4096 + 17}).tensor("b", {100});
  spec.unit("c").tensor("w", {8192});  // slices at 2 ranks meet at a leaf's edge
  spec.unit("d").tensor("w", {40, 30});
  return spec;
}

values test_values(const zero::model_spec& spec, std::mt19937_64& rng) {
  values xs;
  for (const auto& u : spec.units())
    for (const auto& t : u.tensors) {
      xs.emplace_back();
      for (int k = 0; k < K; ++k) xs.back().push_back(random_values(t.numel, rng));
    }
  if (xs.size() < 3) return xs;
  std::fill(xs[1][1].begin(), xs[1][1].end(), 0.0f);  // a tensor of zeros
  xs[2][0][5] = std::numeric_limits<float>::denorm_min();
  xs[2][0][6] = std::numeric_limits<float>::max();
  return xs;
}

void check_against_definition(const outcome& o, const values& xs) {
  for (std::size_t r = 0; r < o.sums.size(); ++r)
    for (std::size_t t = 0; t < xs.size(); ++t)
      for (std::size_t k = 0; k < K; ++k) {
        const double got = o.sums[r][t * K + k];
        if (std::isnan(got)) continue;  // the rank holds none of the tensor
        CAPTURE(r);
        CAPTURE(t);
        CAPTURE(k);
        CHECK(std::bit_cast<std::uint64_t>(got) ==
              std::bit_cast<std::uint64_t>(testing::ordered_sum_of_squares(xs[t][k])));
      }
}

}  // namespace

TEST_CASE("tensor_sums: every cut over ranks, threads and chunks gives the definition's bits, in every stage") {
  std::mt19937_64 rng(7);
  const zero::model_spec spec = test_spec();
  const values xs = test_values(spec, rng), before = test_values(spec, rng);
  for (int ranks : {1, 2, 3, 4, 7})
    for (bool sharded : {true, false}) {
      CAPTURE(ranks);
      CAPTURE(sharded);
      const outcome o = run(spec, ranks, sharded, xs, rng, &before);  // a step over other values first
      check_against_definition(o, xs);
      // Every rank holds some tensor here, and each tensor's sums are on some rank.
      for (std::size_t t = 0; t < xs.size(); ++t) {
        bool somewhere = false;
        for (const auto& mine : o.sums) somewhere |= !std::isnan(mine[t * K]);
        CHECK(somewhere);
      }
      const zero::tensor_sums::shape shape = zero::tensor_sums::shape_of(zero::layout::make(spec, ranks), sharded);
      CHECK(o.exchanged == shape.exchange_doubles(K));
      if (!sharded || ranks == 1) CHECK(o.exchanged == 0);
      if (sharded && ranks > 1) CHECK(o.exchanged > 0);
    }
}

TEST_CASE("tensor_sums: the exchange carries the cut tensors' leaves, and the cut leaves' and blocks' entries") {
  // One unit of one tensor of 8192 at 2 ranks: the slices meet at 4096, a leaf's edge, so two leaves
  // go over the wire and nothing else; a tensor of 8192 + 64 moves the boundary inside a leaf and a block.
  zero::model_spec edge;
  edge.unit("u").tensor("w", {8192});
  const auto s = zero::tensor_sums::shape_of(zero::layout::make(edge, 2), true);
  CHECK(s.exchanged_leaves == 2);
  CHECK(s.cut_leaves.empty());
  CHECK(s.cut_blocks.empty());
  CHECK(s.exchange_doubles(K) == 2 * K);
  zero::model_spec inside;
  inside.unit("u").tensor("b", {16}).tensor("w", {8192});  // the slices meet inside w, off its leaves' edges
  const zero::layout l = zero::layout::make(inside, 2);
  const auto c = zero::tensor_sums::shape_of(l, true);
  const std::size_t boundary = l.owned(zero::unit_id{0}, 1).begin - 16;  // in tensor w
  CHECK(c.exchanged_leaves == 2);
  CHECK(c.cut_leaves.size() == (boundary % 4096 != 0 ? 1u : 0u));
  CHECK(c.cut_blocks.size() == (boundary % 64 != 0 ? 1u : 0u));
  CHECK(c.exchange_doubles(K) == K * (2 + 64 * (c.cut_leaves.size() + c.cut_blocks.size())));
  // Not sharded: nothing to exchange.
  CHECK(zero::tensor_sums::shape_of(l, false).exchange_doubles(K) == 0);
}

TEST_CASE("tensor_sums: the blocks' packs give the scalar order's bits on every SIMD level") {
  std::mt19937_64 rng(3);
  std::vector<float> x = random_values(64 * 200, rng);
  for (std::size_t i = 0; i < x.size(); i += 97) x[i] = 0.0f;
  std::vector<double> want(200);
  for (std::size_t b = 0; b < want.size(); ++b)
    want[b] = testing::ordered_sum_of_squares(std::vector<float>(x.begin() + 64 * b, x.begin() + 64 * (b + 1)));
  using zero::sys::host_loop::isa;
  for (isa level : {isa::scalar, isa::sse2, isa::avx2, isa::avx512}) {
    CAPTURE(static_cast<int>(level));
    const isa before = zero::sys::host_loop::set_cap(level);
    std::vector<double> got(want.size());
    zero::sys::host::square_block_sums(x.data(), want.size(), got.data());
    zero::sys::host_loop::set_cap(before);
    for (std::size_t b = 0; b < want.size(); ++b)
      CHECK(std::bit_cast<std::uint64_t>(got[b]) == std::bit_cast<std::uint64_t>(want[b]));
  }
}

TEST_CASE("tensor_sums: within a few hundred roundings of the exact sum") {
  std::mt19937_64 rng(5);
  for (std::size_t n : {1u, 37u, 4096u, 100000u, 1u << 20}) {
    CAPTURE(n);
    const std::vector<float> x = random_values(n, rng);
    long double exact = 0;  // 64-bit significands, summed one square at a time
    for (float v : x) exact += static_cast<long double>(v) * static_cast<long double>(v);
    const double got = testing::ordered_sum_of_squares(x);
    CHECK(std::fabs(static_cast<long double>(got) - exact) <= 1e-13L * exact);
  }
}

TEST_CASE("tensor_sums: a NaN or an infinity anywhere decides the sum on every rank") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  zero::model_spec spec;
  spec.unit("u").tensor("a", {5000}).tensor("b", {5000});
  std::mt19937_64 rng(9);
  values xs = test_values(spec, rng);
  xs[0][0][4999] = inf;
  xs[0][1][17] = nan;
  xs[1][0][2500] = -inf;
  xs[1][1][0] = nan;
  xs[1][1][4000] = inf;
  for (int ranks : {1, 2, 4}) {
    CAPTURE(ranks);
    const outcome o = run(spec, ranks, true, xs, rng);
    for (const auto& mine : o.sums) {
      if (!std::isnan(mine[0])) CHECK(std::isinf(mine[0]));
      CHECK(std::isnan(mine[1]));  // NaN, or not held
      if (!std::isnan(mine[2])) CHECK(std::isinf(mine[2]));
      CHECK(std::isnan(mine[3]));
    }
  }
}

TEST_CASE("tensor_sums: LAMB's first pass fused with its block sums gives the separate passes' bits on every level") {
  // The fused pass (sys/host_square_blocks.hpp) against the pass alone and then the blocks' sums of the
  // values it left: the slots, the kept direction and every block sum bit for bit, with zeros, NaN and
  // infinities among the gradients. Where the level has no fused loop (SSE2, scalar) it does nothing.
  using zero::optim::lamb;
  constexpr std::size_t blocks = 48, n = 64 * blocks;
  std::mt19937_64 rng(11);
  const std::vector<float> g0 = random_values(n, rng), w = random_values(n, rng);
  std::vector<float> m0 = random_values(n, rng), v0 = random_values(n, rng);
  for (float& x : v0) x = std::fabs(x);
  std::vector<float> g_in = g0;
  for (std::size_t i = 0; i < n; i += 89) g_in[i] = 0.0f;
  g_in[5] = std::numeric_limits<float>::quiet_NaN();
  g_in[700] = std::numeric_limits<float>::infinity();
  const lamb opt{.lr = 0.01f, .weight_decay = 0.1f};
  const auto c = opt.constants(3);
  using zero::sys::host_loop::isa;
  for (isa level : {isa::scalar, isa::sse2, isa::avx2, isa::avx512}) {
    CAPTURE(static_cast<int>(level));
    const isa before = zero::sys::host_loop::set_cap(level);
    // The separate passes.
    std::vector<float> g1 = g_in, m1 = m0, v1 = v0;
    float* s1[] = {m1.data(), v1.data()};
    zero::elementwise::advance_keeping_direction<lamb>(zero::sys::host{}, c, g1.data(), 2.0f, 0.5f, w.data(), s1,
                                                        nullptr, n);
    std::vector<double> want_w(blocks), want_d(blocks);
    zero::sys::host::square_block_sums(w.data(), blocks, want_w.data());
    zero::sys::host::square_block_sums(g1.data(), blocks, want_d.data());
    // The fused pass.
    std::vector<float> g2 = g_in, m2 = m0, v2 = v0;
    float* s2[] = {m2.data(), v2.data()};
    std::vector<double> got_w(blocks, -1.0), got_d(blocks, -1.0);
    double* sums[] = {got_w.data(), got_d.data()};  // lamb's terms: the weight, then the direction
    const bool fused = zero::elementwise::advance_keeping_direction_summed<lamb>(
        zero::sys::host{}, c, g2.data(), 2.0f, 0.5f, w.data(), s2, nullptr, blocks, sums);
    zero::sys::host_loop::set_cap(before);
    const bool wide = std::min(level, zero::sys::host_loop::detected()) >= isa::avx2;
    CHECK(fused == wide);
    const auto same = [](const auto& a, const auto& b) {
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof a[i]) != 0) {
          MESSAGE("first difference at ", i);
          return false;
        }
      return true;
    };
    if (!fused) {
      CHECK(same(g2, g_in));  // nothing done
      continue;
    }
    CHECK(same(g2, g1));
    CHECK(same(m2, m1));
    CHECK(same(v2, v1));
    CHECK(same(got_w, want_w));
    // A NaN sum is NaN (its payload depends on which NaN the additions meet first; the factor of a
    // sum that is not finite is NaN whatever the bits), every other one the same bits.
    for (std::size_t b = 0; b < blocks; ++b) {
      CAPTURE(b);
      if (std::isnan(want_d[b]))
        CHECK(std::isnan(got_d[b]));
      else
        CHECK(std::bit_cast<std::uint64_t>(got_d[b]) == std::bit_cast<std::uint64_t>(want_d[b]));
    }
    CHECK(std::isnan(got_d[0]));    // the NaN gradient's block
    CHECK(std::isnan(got_d[10]));   // the infinite one's: inf / inf
    CHECK(!std::isnan(got_d[20]));
  }
}
