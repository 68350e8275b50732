// Layout: padding, shard boundaries and alignment, including the edge cases of tiny units and large N.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "zero/zero.hpp"

using zero::layout;
using zero::model_spec;

namespace {

void check_invariants(const model_spec& spec, const layout& l) {
  const int n = l.ranks();
  std::size_t offset = 0, shard_offset = 0, numel = 0;
  for (std::size_t u = 0; u < spec.num_units(); ++u) {
    const auto& ul = l.unit(zero::unit_id{u});
    CHECK(ul.offset == offset);
    CHECK(ul.shard_offset == shard_offset);
    CHECK(ul.numel == spec.units()[u].numel);
    CHECK(ul.padded >= ul.numel);
    CHECK(ul.padded % (static_cast<std::size_t>(n) * zero::shard_alignment_elements) == 0);
    CHECK(ul.padded - ul.numel < static_cast<std::size_t>(n) * zero::shard_alignment_elements);
    CHECK(ul.shard * static_cast<std::size_t>(n) == ul.padded);
    // Every shard starts on a 64-byte boundary for 2- and 4-byte elements.
    CHECK((ul.shard_offset * 2) % 64 == 0);
    CHECK((ul.offset * 2) % 64 == 0);
    std::size_t covered = 0;
    for (int r = 0; r < n; ++r) {
      const auto o = l.owned(zero::unit_id{u}, r);
      CHECK(o.begin == covered);
      covered = o.end;
      const auto real = l.owned_real(zero::unit_id{u}, r);
      if (!real.empty()) CHECK(real.end <= ul.numel);
      if (!real.empty()) CHECK(real.begin == o.begin);
      CHECK(real.size() <= o.size());
    }
    CHECK(covered == ul.padded);
    // Tensors are contiguous, in declaration order, and never reach into the padding.
    std::size_t at = 0;
    for (std::size_t t = 0; t < ul.tensors.size(); ++t) {
      CHECK(ul.tensors[t].begin == at);
      CHECK(ul.tensors[t].size() == spec.units()[u].tensors[t].numel);
      at = ul.tensors[t].end;
    }
    CHECK(at == ul.numel);
    offset += ul.padded;
    shard_offset += ul.shard;
    numel += ul.numel;
  }
  CHECK(l.padded() == offset);
  CHECK(l.shard_total() == shard_offset);
  CHECK(l.shard_total() * static_cast<std::size_t>(n) == l.padded());
  CHECK(l.numel() == numel);
}

}  // namespace

TEST_CASE("layout pads each unit to a multiple of N x alignment and splits it evenly") {
  model_spec spec;
  spec.unit("a").tensor("w", {7, 5}).tensor("b", {7});
  spec.unit("tiny").tensor("s", {1});
  spec.unit("one_element_tensors").tensor("x", {1}).tensor("y", {1}).tensor("z", {1});
  spec.unit("big").tensor("w", {300, 17});
  for (int n : {1, 2, 3, 4, 7, 8, 64, 1000}) {
    CAPTURE(n);
    const auto l = layout::make(spec, n);
    check_invariants(spec, l);
  }
}

TEST_CASE("layout edge cases: N = 1, a unit smaller than N, N larger than the element count") {
  model_spec spec;
  spec.unit("u").tensor("w", {3});
  SUBCASE("N = 1 pads to one alignment quantum") {
    const auto l = layout::make(spec, 1);
    CHECK(l.padded() == zero::shard_alignment_elements);
    CHECK(l.owned_real(zero::unit_id{0}, 0) == zero::range{0, 3});
  }
  SUBCASE("N = 8 > 3 elements: rank 0 owns all real elements, the others only padding") {
    const auto l = layout::make(spec, 8);
    CHECK(l.padded() == 8 * zero::shard_alignment_elements);
    CHECK(l.owned_real(zero::unit_id{0}, 0) == zero::range{0, 3});
    for (int r = 1; r < 8; ++r) CHECK(l.owned_real(zero::unit_id{0}, r).empty());
  }
  SUBCASE("a real element count that is an exact multiple needs no padding") {
    model_spec exact;
    exact.unit("u").tensor("w", {4 * zero::shard_alignment_elements});
    const auto l = layout::make(exact, 4);
    CHECK(l.padded() == l.numel());
    for (int r = 0; r < 4; ++r) CHECK(l.owned_real(zero::unit_id{0}, r).size() == zero::shard_alignment_elements);
  }
}

TEST_CASE("layout and model_spec reject bad input with a message naming what is wrong") {
  model_spec empty;
  CHECK_THROWS_WITH_AS(layout::make(empty, 2), doctest::Contains("no units"), zero::error);
  model_spec no_tensors;
  no_tensors.unit("u");
  CHECK_THROWS_WITH_AS(layout::make(no_tensors, 2), doctest::Contains("'u' has no tensors"),
                       zero::error);
  model_spec ok;
  ok.unit("u").tensor("w", {2});
  CHECK_THROWS_WITH_AS(layout::make(ok, 0), doctest::Contains("world size must be positive"),
                       zero::error);
  CHECK_THROWS_WITH_AS(ok.unit("u"), doctest::Contains("'u' is declared twice"), zero::error);
  CHECK_THROWS_WITH_AS(ok.unit("v").tensor("w", {2}).tensor("w", {3}), doctest::Contains("'w' is declared twice"),
                       zero::error);
  CHECK_THROWS_WITH_AS(ok.unit("z").tensor("w", {2, 0}), doctest::Contains("zero dimension"), zero::error);
  CHECK_THROWS_WITH_AS(ok.unit("e").tensor("w", std::vector<std::size_t>{}), doctest::Contains("empty shape"),
                       zero::error);
  CHECK_THROWS_WITH_AS(ok.find("nope"), doctest::Contains("unknown unit 'nope'"), zero::error);
}

TEST_CASE("the split: padded to N x alignment, N equal rank-ordered slices, one address rule") {
  static_assert(zero::padded_extent(1, 4) == 4 * zero::shard_alignment_elements);
  static_assert(zero::padded_extent(128, 4) == 128);
  static_assert(zero::padded_extent(129, 4) == 256);
  model_spec spec;
  spec.unit("a").tensor("w", {100});
  spec.unit("b").tensor("w", {300});
  const auto l = layout::make(spec, 3);
  const auto& b = l.unit(zero::unit_id{1});
  CHECK(l.owned(zero::unit_id{1}, 2) == zero::range{2 * b.shard, 3 * b.shard});
  // Element 2 x shard + 5 of unit b: in a full buffer after unit a; in rank 2's slices after a's slice.
  CHECK(zero::element_index(b, 2 * b.shard + 5, false, 2) == l.unit(zero::unit_id{0}).padded + 2 * b.shard + 5);
  CHECK(zero::element_index(b, 2 * b.shard + 5, true, 2) == l.unit(zero::unit_id{0}).shard + 5);
}

// The stage number is what the flags make, so the per-stage formulas describe what the engine holds.
struct says_stage_one_shards_gradients {
  static constexpr int stage = 1;
  static constexpr bool shards_optimizer_states = true;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = false;
};
struct shards_gradients_only {
  static constexpr int stage = 2;
  static constexpr bool shards_optimizer_states = false;
  static constexpr bool shards_gradients = true;
  static constexpr bool shards_parameters = false;
};
static_assert(!zero::Partitioner<says_stage_one_shards_gradients>);
static_assert(!zero::Partitioner<shards_gradients_only>);
static_assert(zero::updates_every_element<zero::stage0> && !zero::updates_every_element<zero::stage1>);
static_assert(zero::gathers_parameters_after_update<zero::stage1> && zero::gathers_parameters_after_update<zero::stage2>);
static_assert(!zero::gathers_parameters_after_update<zero::stage0> && !zero::gathers_parameters_after_update<zero::stage3>);

TEST_CASE("shapes whose sizes would wrap are refused, naming the unit, the tensor and the shape") {
  constexpr std::size_t two32 = std::size_t{1} << 32, two63 = std::size_t{1} << 63;
  model_spec s;
  // 2^32 x 2^32 wraps size_t to 0; (2^63 + 1) x 2 wraps to 2.
  CHECK_THROWS_WITH_AS(s.unit("a").tensor("w", {two32, two32}),
                       doctest::Contains("unit 'a', tensor 'w': shape [4294967296, 4294967296]"), zero::error);
  CHECK_THROWS_WITH_AS(s.unit("b").tensor("w", {two63 + 1, 2}),
                       doctest::Contains("shape [9223372036854775809, 2] has more than 2^50"), zero::error);
  // Each tensor fits, the model does not: the sum is checked too.
  model_spec sum;
  sum.unit("c").tensor("w", {model_spec::max_elements});
  CHECK_THROWS_WITH_AS(sum.unit("d").tensor("v", {1}), doctest::Contains("unit 'd', tensor 'v'"), zero::error);
  CHECK(sum.numel() == model_spec::max_elements);
  // The largest model still lays out (the padding is checked, not wrapped), and every byte count of it fits.
  model_spec largest;
  largest.unit("c").tensor("w", {model_spec::max_elements});
  const layout l = layout::make(largest, 1 << 20);
  CHECK(l.padded() >= model_spec::max_elements);
  CHECK(l.padded() <= layout::max_padded_elements);
  CHECK(zero::formula::model_state_bytes(0, l.padded(), 1 << 20, {4, 4, 8}) == 16 * l.padded());
  // A per-step count that would wrap is refused by the formulas.
  CHECK_THROWS_WITH_AS(zero::formula::comm_bytes_per_step(3, l.padded(), 1 << 20, 4, 1 << 30),
                       doctest::Contains("formula"), zero::error);
}

TEST_CASE("declaring units costs O(1) each: 100k units in well under a second, duplicates still refused") {
  model_spec s;
  const auto start = std::chrono::steady_clock::now();
  for (int u = 0; u < 100000; ++u) s.unit("u" + std::to_string(u)).tensor("w", {2}).tensor("b", {1});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 5.0);  // quadratic: 100k units took over a minute
  CHECK(s.numel() == 300000);
  CHECK(s.find("u99999").index == 99999);
  CHECK_THROWS_WITH_AS(s.unit("u5"), doctest::Contains("'u5' is declared twice"), zero::error);
  CHECK_THROWS_WITH_AS(s.unit("x").tensor("w", {1}).tensor("w", {1}), doctest::Contains("'w' is declared twice"),
                       zero::error);
}
