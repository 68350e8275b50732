// Canonical NaNs: every element-wise rule and the engine store one NaN per type, whatever the hardware made.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../engine_instances.hpp"
#include "../optimizer_step.hpp"
#include "zero/zero.hpp"

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
std::uint64_t bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// NaNs as hardware makes them: Inf - Inf at run time (x86: 0xffc00000), CUDA's canonical
// 0x7fffffff, and a signed payload NaN as a user's buffer might hold.
std::vector<float> nans() {
  volatile float inf = std::numeric_limits<float>::infinity();
  return {inf - inf, from_bits(0x7fffffffu), from_bits(0xffc00001u), from_bits(0x7f800001u)};
}

constexpr std::uint32_t canonical32 = zero::fp::canonical_nan_bits32;

template <class T>
std::uint16_t bits16(T x) {
  return x.to_bits();
}

// The engine's accumulation and cast steps through the host system's one loop.
template <class D, class S>
void accumulate(D* dst, const S* src, std::size_t n, bool first) {
  zero::sys::host::for_each(n, zero::elementwise::accumulate_rule{first}, zero::elementwise::inout(dst),
                            zero::elementwise::in(src));
}
template <class D>
void cast_from_float(D* dst, const float* src, std::size_t n) {
  zero::sys::host::for_each(n, zero::elementwise::cast_rule{}, zero::elementwise::out(dst), zero::elementwise::in(src));
}

}  // namespace

TEST_CASE("the hardware's NaNs are not canonical (so the tests below are not vacuous)") {
  const auto n = nans();
  CHECK(bits(n[1]) != canonical32);
  CHECK(bits(n[2]) != canonical32);
  CHECK(bits(n[3]) != canonical32);
  CHECK(bits(zero::fp::canonical(n[2])) == canonical32);
  CHECK(bits(zero::fp::canonical(static_cast<double>(n[2]))) == zero::fp::canonical_nan_bits64);
  CHECK(bits(zero::fp::canonical(1.5f)) == bits(1.5f));
  CHECK(bits(zero::fp::canonical(-0.0f)) == bits(-0.0f));
  CHECK(std::isinf(zero::fp::canonical(-std::numeric_limits<float>::infinity())));
}

// Every optimizer of zero/catalog.hpp.
TEST_CASE_TEMPLATE_DEFINE("the optimizer rules store canonical NaNs in master, slots and parameter copy", Opt,
                          canonical_nans_per_optimizer) {
  CAPTURE(Opt::name);
  static_assert(Opt::slots <= 2, "the slot arrays below hold two");
  Opt opt;
  if constexpr (std::is_same_v<Opt, zero::optim::sgd>) opt.momentum = 0.9f;
  const auto c = opt.constants(1);
  for (float nan : nans()) {
    // A NaN gradient, and a finite gradient on a NaN master weight.
    for (int which : {0, 1}) {
      CAPTURE(which);
      float g = which == 0 ? nan : 0.5f;
      float w = which == 0 ? 1.0f : nan;
      float s0 = 0.0f, s1 = 0.0f;
      float* slots[] = {&s0, &s1};
      zero::bf16 pb{};
      zero::fp16 ph{};
      float pf = 0.0f;
      float w2 = w, w3 = w, t0 = 0.0f, t1 = 0.0f, u0 = 0.0f, u1 = 0.0f;
      float* slots2[] = {&t0, &t1};
      float* slots3[] = {&u0, &u1};
      testing::tensor_step<Opt>(c, &g, &w, slots, &pb, 1);
      testing::tensor_step<Opt>(c, &g, &w2, slots2, &ph, 1);
      testing::tensor_step<Opt>(c, &g, &w3, slots3, &pf, 1);
      CHECK(bits(w) == canonical32);
      CHECK(bits16(pb) == zero::canonical_bf16_nan);
      CHECK(bits16(ph) == zero::canonical_fp16_nan);
      CHECK(bits(pf) == canonical32);
      for (int k = 0; k < Opt::slots; ++k)
        if (std::isnan(*slots[k])) CHECK(bits(*slots[k]) == canonical32);
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(canonical_nans_per_optimizer, zero::optimizers::tuple);

TEST_CASE("accumulation stores canonical NaNs: Inf + -Inf in fp32, bf16 and fp16") {
  const float inf = std::numeric_limits<float>::infinity();
  float d32[2] = {inf, 1.0f};
  const float s32[2] = {-inf, nans()[2]};
  accumulate(d32, s32, 2, false);
  CHECK(bits(d32[0]) == canonical32);
  CHECK(bits(d32[1]) == canonical32);
  accumulate(d32, s32 + 1, 1, true);  // the first micro-batch is a copy: canonical too
  CHECK(bits(d32[0]) == canonical32);

  zero::bf16 db[1] = {zero::bf16(inf)};
  const zero::bf16 sb[1] = {zero::bf16(-inf)};
  accumulate(db, sb, 1, false);
  CHECK(bits16(db[0]) == zero::canonical_bf16_nan);
  zero::fp16 dh[1] = {zero::fp16(inf)};
  const zero::fp16 sh[1] = {zero::fp16(-inf)};
  accumulate(dh, sh, 1, false);
  CHECK(bits16(dh[0]) == zero::canonical_fp16_nan);
  // A bf16 gradient accumulated into an fp32 store.
  float d[1] = {inf};
  accumulate(d, sb, 1, false);
  CHECK(bits(d[0]) == canonical32);
}

TEST_CASE("casts from fp32 store canonical NaNs") {
  for (float nan : nans()) {
    float f = 0.0f;
    zero::bf16 b{};
    zero::fp16 h{};
    cast_from_float(&f, &nan, 1);
    cast_from_float(&b, &nan, 1);
    cast_from_float(&h, &nan, 1);
    CHECK(bits(f) == canonical32);
    CHECK(bits16(b) == zero::canonical_bf16_nan);
    CHECK(bits16(h) == zero::canonical_fp16_nan);
  }
}

// End to end: rank 0 writes +Inf and rank 1 -Inf into one gradient element. fp32 without a norm
// does not skip the step, so the NaN reaches the parameters: the same canonical bits in every stage.
TEST_CASE("an fp32 step whose summed gradient is Inf - Inf stores the canonical NaN in every stage") {
  zero::model_spec spec;
  const zero::unit_id u = spec.unit("fc").tensor("w", {8, 8});
  auto run = [&]<class Stage>(Stage) {
    std::vector<float> params;
    zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
      zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(comm, spec);
      e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i);
      });
      {
        auto p = e.gather(u);
        auto g = e.grads(u);
        for (float& x : g["w"]) x = 0.25f;
        g["w"][5] = comm.rank() == 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
        e.reduce(u);
      }
      e.step();
      auto full = e.full_params();
      if (comm.rank() == 0) params = full;
    });
    return params;
  };
  const auto p0 = run(zero::stage0{}), p1 = run(zero::stage1{}), p2 = run(zero::stage2{}), p3 = run(zero::stage3{});
  REQUIRE(p0.size() == 64);
  CHECK(bits(p0[5]) == canonical32);
  CHECK(std::isfinite(p0[4]));
  CHECK(std::memcmp(p0.data(), p1.data(), 64 * sizeof(float)) == 0);
  CHECK(std::memcmp(p0.data(), p2.data(), 64 * sizeof(float)) == 0);
  CHECK(std::memcmp(p0.data(), p3.data(), 64 * sizeof(float)) == 0);
}

TEST_CASE("a NaN gradient norm is reported as the canonical NaN, and the step is skipped") {
  zero::model_spec spec;
  const zero::unit_id u = spec.unit("fc").tensor("w", {4, 16});
  zero::comm::threads::launch(2, [&](zero::comm::threads& comm) {
    zero::engine_options o;
    o.compute_grad_norm = true;
    zero::engine<zero::stage2, zero::comm::threads, zero::optim::adamw, zero::precision::bf16> e(
        comm, spec, zero::optim::adamw{}, o);
    e.initialize([](const zero::unit_spec&, const zero::tensor_spec&, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5f;
    });
    {
      auto p = e.gather(u);
      auto g = e.grads(u);
      for (auto& x : g["w"]) x = zero::bf16(0.0f);
      g["w"][3] = zero::bf16(comm.rank() == 0 ? std::numeric_limits<float>::infinity()
                                              : -std::numeric_limits<float>::infinity());
      e.reduce(u);
    }
    const auto r = e.step();
    CHECK(r.skipped);
    CHECK(bits(r.grad_norm) == zero::fp::canonical_nan_bits64);
  });
}
