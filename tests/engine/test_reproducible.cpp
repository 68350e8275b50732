// The reproducible reduction mode: binned sums against an exact reference, and the same parameters at any world size.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../deferred_comm.hpp"
#include "../toy_model.hpp"
#include "zero/core/binned.hpp"

namespace {

// ---- an exact reference, independent of core/binned.hpp ------------------------------------------

// A sum of floats and doubles held exactly: a two's complement integer of 32-bit limbs in units of
// 2^-1120 (below every double's bits), wide enough for thousands of terms up to the double range.
class exact_sum {
 public:
  static constexpr int low = -1120, limbs = 72;  // 2304 bits: up to 2^1184

  template <class F>
  void add(F x) {
    if (!std::isfinite(x)) throw std::invalid_argument("exact_sum: a non-finite term");
    if (x == 0) return;
    int e = 0;
    const F fr = std::frexp(std::fabs(x), &e);  // |x| = fr 2^e, fr in [0.5, 1)
    constexpr int p = std::numeric_limits<F>::digits;
    const auto m = static_cast<std::uint64_t>(std::ldexp(fr, p));  // exact: |x| = m 2^(e - p)
    add_shifted(m, e - p - low, x < 0);
  }
  void add(const exact_sum& o) {
    std::uint64_t c = 0;
    for (int i = 0; i < limbs; ++i) {
      c += static_cast<std::uint64_t>(v_[i]) + o.v_[i];
      v_[i] = static_cast<std::uint32_t>(c);
      c >>= 32;
    }
  }
  bool negative() const { return (v_[limbs - 1] >> 31) != 0; }
  bool zero() const {
    return std::all_of(v_.begin(), v_.end(), [](std::uint32_t l) { return l == 0; });
  }
  exact_sum negated() const {
    exact_sum r = *this;
    std::uint64_t c = 1;
    for (int i = 0; i < limbs; ++i) {
      c += static_cast<std::uint64_t>(~r.v_[i]);
      r.v_[i] = static_cast<std::uint32_t>(c);
      c >>= 32;
    }
    return r;
  }
  exact_sum minus(const exact_sum& o) const {
    exact_sum r = *this;
    r.add(o.negated());
    return r;
  }
  exact_sum magnitude() const { return negative() ? negated() : *this; }
  // -1, 0, 1: this against o (two's complement compare).
  int compare(const exact_sum& o) const {
    const exact_sum d = minus(o);
    return d.zero() ? 0 : d.negative() ? -1 : 1;
  }
  // A value close to the sum (for choosing candidates only).
  long double approx() const {
    const exact_sum m = magnitude();
    long double a = 0;
    for (int i = limbs - 1; i >= 0; --i) a += std::ldexp(static_cast<long double>(m.v_[i]), 32 * i + low);
    return negative() ? -a : a;
  }
  // The float or double nearest to the sum, ties to even, overflow to infinity (as IEEE arithmetic
  // would round the exact value), found by comparing exact distances to the neighbours of an
  // approximation. An exact zero is +0.
  template <class F>
  F nearest() const {
    if (zero()) return F(0);
    const bool neg = negative();
    const exact_sum mag = magnitude();
    const F big = std::numeric_limits<F>::max();
    // 2^(emax+1), where a rounding up from the largest finite value goes: infinity.
    exact_sum beyond;
    beyond.add(std::ldexp(F(1), std::numeric_limits<F>::max_exponent - 1));
    beyond.add(std::ldexp(F(1), std::numeric_limits<F>::max_exponent - 1));
    long double a = std::fabs(mag.approx());
    F c = a >= static_cast<long double>(big) ? big : static_cast<F>(a);
    std::vector<F> candidates;
    F x = c;
    for (int k = 0; k < 3; ++k, x = std::nextafter(x, F(0))) candidates.push_back(x);
    x = c;
    for (int k = 0; k < 3 && std::isfinite(x); ++k) {
      x = std::nextafter(x, std::numeric_limits<F>::infinity());
      candidates.push_back(x);
    }
    F best = 0;
    exact_sum best_distance;
    bool have = false;
    for (F y : candidates) {
      const F x = y;
      exact_sum v;
      if (std::isinf(x))
        v = beyond;
      else
        v.add(x);
      const exact_sum d = v.minus(mag).magnitude();
      const int cmp = have ? d.compare(best_distance) : -1;
      const bool even = std::isinf(x) || (bits_of(x) & 1) == 0;
      if (cmp < 0 || (cmp == 0 && even)) {
        best = x;
        best_distance = d;
        have = true;
      }
    }
    return neg ? -best : best;
  }

 private:
  static std::uint64_t bits_of(float x) { return __builtin_bit_cast(std::uint32_t, x); }
  static std::uint64_t bits_of(double x) { return __builtin_bit_cast(std::uint64_t, x); }
  void add_shifted(std::uint64_t m, int shift, bool neg) {
    if (shift < 0) throw std::invalid_argument("exact_sum: a term below 2^low");
    exact_sum t;
    const int limb = shift / 32, bit = shift % 32;
    // m << bit in three limbs (m < 2^53, bit < 32: below 2^85)
    const std::uint64_t lo = m << bit, hi = bit ? m >> (64 - bit) : 0;
    const std::uint32_t parts[3] = {static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(lo >> 32),
                                    static_cast<std::uint32_t>(hi)};
    for (int i = 0; i < 3 && limb + i < limbs; ++i) t.v_[limb + i] = parts[i];
    add(neg ? t.negated() : t);
  }
  std::array<std::uint32_t, limbs> v_{};
};

// The value x truncated toward zero to a multiple of 2^q: what a binned sum keeps of a term.
template <class F>
F truncated(F x, int q) {
  if (x == 0) return x;
  // Exact in long double (64-bit significand, 15-bit exponent): a power-of-two scaling and a truncation;
  // what remains is a subset of x's bits, so it is an F again.
  const long double scaled = std::ldexp(static_cast<long double>(x), -q);
  return static_cast<F>(std::ldexp(std::trunc(scaled), q));
}

// The binned sum of xs in an order and grouping: the terms split into `groups` consecutive groups,
// each summed with its own top bin, the groups' sums merged as the engine merges micro-batches.
template <int K = zero::binned::words>
float binned_sum(const std::vector<float>& xs, std::size_t groups, int* top_out = nullptr) {
  std::int64_t store[K] = {};
  int store_top = -1;
  const std::size_t per = (xs.size() + groups - 1) / groups;
  for (std::size_t g = 0; g * per < xs.size(); ++g) {
    zero::binned::summary s;
    const std::size_t end = std::min(xs.size(), (g + 1) * per);
    for (std::size_t i = g * per; i < end; ++i) s = zero::binned::merge(s, zero::binned::summary_of(xs[i]));
    REQUIRE(s.finite());
    std::int64_t w[K] = {};
    for (std::size_t i = g * per; i < end; ++i) {
      std::int64_t d[K];
      zero::binned::to_words(xs[i], s.bin, d);
      for (int k = 0; k < K; ++k) w[k] += d[k];
    }
    const int to = std::max(store_top, s.bin);
    zero::binned::realign(store, store_top, to);
    zero::binned::realign(w, s.bin, to);
    for (int k = 0; k < K; ++k) store[k] += w[k];
    store_top = to;
  }
  if (top_out) *top_out = store_top;
  return store_top < 0 ? 0.0f : zero::binned::round<float>(store, store_top);
}

std::uint32_t bits(float x) { return __builtin_bit_cast(std::uint32_t, x); }

// Random floats: signs at random, exponents uniform in [lo, hi] (subnormals where lo < -126), random
// significands.
std::vector<float> random_floats(std::mt19937_64& rng, std::size_t n, int lo, int hi) {
  std::vector<float> v(n);
  std::uniform_int_distribution<int> ex(lo, hi);
  std::uniform_int_distribution<std::uint32_t> mant(0, (1u << 24) - 1);
  for (auto& x : v) {
    const int e = ex(rng);
    x = std::ldexp(static_cast<float>(mant(rng) | (1u << 23)), e - 23);  // rounded once where subnormal
    if (rng() & 1) x = -x;
  }
  return v;
}

}  // namespace

TEST_CASE("binned sums: the correctly rounded sum of the kept bits, in any order and grouping, within the bound") {
  std::mt19937_64 rng(17);
  struct range_case {
    int lo, hi;
    std::size_t n;
  };
  // Within one window (exact), the full range (bits fall off), subnormals only, near overflow.
  const range_case cases[] = {{-20, 18, 1000}, {-149, 127, 1000}, {-149, -126, 500}, {100, 127, 64}, {-60, -1, 3}};
  int exact_cases = 0, truncated_cases = 0;
  for (const auto& c : cases) {
    for (int rep = 0; rep < 20; ++rep) {
      CAPTURE(c.lo);
      CAPTURE(c.hi);
      CAPTURE(rep);
      std::vector<float> xs = random_floats(rng, c.n, c.lo, c.hi);
      if (rep % 4 == 1)  // exact cancellation of most terms, leaving the small ones
        for (std::size_t i = 0; i + 1 < xs.size(); i += 3) xs[i + 1] = -xs[i];
      int top = 0;
      const float once = binned_sum(xs, 1, &top);
      // Any order and grouping: the same bits.
      for (std::size_t groups : {2u, 3u, 7u, 64u}) {
        std::vector<float> shuffled = xs;
        std::shuffle(shuffled.begin(), shuffled.end(), rng);
        CHECK(bits(binned_sum(shuffled, groups)) == bits(once));
      }
      // What is kept: every term truncated toward zero at the window's lowest bit 2^q.
      const int q = zero::binned::word_bits * (top - zero::binned::words + 1) + zero::binned::format<float>::lowest;
      exact_sum all, kept;
      bool within = true;
      float largest = 0;
      for (float x : xs) {
        all.add(x);
        const float t = truncated(x, q);
        kept.add(t);
        within = within && t == x;
        largest = std::max(largest, std::fabs(x));
      }
      // The window reaches at least 64 bits below the largest term's leading bit.
      int e = 0;
      std::frexp(largest, &e);
      CHECK(q <= e - 1 - 64);
      CHECK(bits(once) == bits(kept.nearest<float>()));  // rounded once from the exact sum of what is kept
      if (within) {
        ++exact_cases;
        CHECK(bits(once) == bits(all.nearest<float>()));  // the correctly rounded exact sum
      } else {
        ++truncated_cases;
      }
      // The bound: |sum - exact| <= ulp(sum)/2 + n 2^q (where the sum is finite).
      if (std::isfinite(once)) {
        exact_sum err;
        err.add(static_cast<double>(once));
        err = err.minus(all).magnitude();
        exact_sum bound;
        const int e_once = once == 0 ? -1000 : std::ilogb(once);
        bound.add(std::ldexp(1.0, std::max(e_once - 23, -149) - 1));  // half the ulp of the sum
        bound.add(std::ldexp(static_cast<double>(xs.size()), q));
        CHECK(err.compare(bound) <= 0);
      }
    }
  }
  CHECK(exact_cases > 0);
  CHECK(truncated_cases > 0);  // both sides of the bound were exercised
}

TEST_CASE("binned sums: ties to even, subnormals, overflow to infinity, signed and unsigned zeros") {
  const float one = 1.0f, half_ulp = std::ldexp(1.0f, -24);
  CHECK(binned_sum({one, half_ulp}, 1) == one);                                                // tie, even below
  CHECK(binned_sum({one, 3 * half_ulp}, 1) == std::nextafter(std::nextafter(one, 2.f), 2.f));  // tie, even above
  CHECK(binned_sum({std::nextafter(one, 2.f), half_ulp}, 1) == std::nextafter(std::nextafter(one, 2.f), 2.f));
  CHECK(binned_sum({one, half_ulp, std::ldexp(1.0f, -60)}, 1) == std::nextafter(one, 2.f));  // sticky bit
  CHECK(binned_sum({one, half_ulp, std::ldexp(1.0f, -100)}, 1) == one);  // below the window: dropped, a tie again
  const float tiny = std::numeric_limits<float>::denorm_min();
  CHECK(binned_sum({tiny, tiny, tiny}, 2) == 3 * tiny);
  CHECK(binned_sum({std::numeric_limits<float>::min(), -tiny}, 1) == std::numeric_limits<float>::min() - tiny);
  const float big = std::numeric_limits<float>::max();
  CHECK(binned_sum({big, big}, 1) == INFINITY);
  CHECK(binned_sum({-big, -big, big}, 3) == -big);
  // max + half an ulp is a tie between max (odd) and 2^128: infinity; just below, max.
  const float half_top = std::ldexp(1.0f, 103);
  CHECK(binned_sum({big, half_top}, 1) == INFINITY);
  CHECK(binned_sum({big, half_top, -std::ldexp(1.0f, 60)}, 1) == big);
  // An exact zero is +0, whatever the terms' signs.
  CHECK(bits(binned_sum({-0.0f, -0.0f}, 1)) == 0u);
  CHECK(bits(binned_sum({2.5f, -2.5f}, 2)) == 0u);
  CHECK(bits(binned_sum({-3.0f}, 1)) == bits(-3.0f));
}

TEST_CASE(
    "binned rounding: the limb arithmetic (every system) and the host's 128-bit path agree with the exact value") {
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int> tops(0, zero::binned::format<float>::bins - 1), widths(0, 61);
  int compared = 0;
  for (int rep = 0; rep < 5000; ++rep) {
    std::int64_t w[zero::binned::words];
    for (auto& v : w) {
      const int bits = widths(rng);  // words of every size up to 2^61, either sign
      v = static_cast<std::int64_t>(rng() >> (64 - bits - 1)) * (rng() & 1 ? -1 : 1);
      if (bits == 0) v = 0;
    }
    const int top = tops(rng);
    exact_sum e;
    for (int k = 0; k < zero::binned::words; ++k) {
      // w[k] 2^(32 (top - k) + lowest), added as two halves that doubles hold exactly
      const int at = zero::binned::word_bits * (top - k) + zero::binned::format<float>::lowest;
      const std::int64_t hi = w[k] / (std::int64_t{1} << 32), lo = w[k] - hi * (std::int64_t{1} << 32);
      e.add(std::ldexp(static_cast<double>(hi), at + 32));
      e.add(std::ldexp(static_cast<double>(lo), at));
    }
    const float want = e.nearest<float>();
    CHECK(bits(zero::binned::round_limbs<float>(w, top)) == bits(want));
#if defined(__SIZEOF_INT128__)
    CHECK(bits(zero::binned::round_128<float>(w, top)) == bits(want));
#endif
    ++compared;
  }
  CHECK(compared == 5000);
}

TEST_CASE("binned sums of squares: carried words round once to the nearest double") {
  std::mt19937_64 rng(5);
  for (int rep = 0; rep < 20; ++rep) {
    const std::vector<float> xs = random_floats(rng, 2000, rep % 2 ? -149 : -40, rep % 2 ? 127 : 30);
    constexpr int K = zero::binned::words + 1;
    zero::binned::summary s;
    for (float x : xs) s = zero::binned::merge(s, zero::binned::summary_of(static_cast<double>(x) * x));
    const int top = s.bin + 1;
    std::int64_t w[K] = {};
    exact_sum kept;
    const int q = zero::binned::word_bits * (top - K + 1) + zero::binned::format<double>::lowest;
    for (float x : xs) {
      const double sq = static_cast<double>(x) * x;
      std::int64_t d[K];
      zero::binned::to_words(sq, top, d);
      CHECK(d[0] == 0);  // the top word takes carries only
      for (int k = 0; k < K; ++k) w[k] += d[k];
      zero::binned::carry(w);
      kept.add(truncated(sq, q));
    }
    CHECK(zero::binned::round<double>(w, top) == kept.nearest<double>());
  }
}

TEST_CASE("binned summaries: the largest bin and the non-finite flags travel in one int64") {
  using zero::binned::summary;
  CHECK(zero::binned::summary_of(0.0f) == summary{});
  CHECK(zero::binned::summary_of(std::numeric_limits<float>::denorm_min()).bin == 0);
  CHECK(zero::binned::summary_of(std::numeric_limits<float>::max()).bin == zero::binned::format<float>::bins - 1);
  CHECK(zero::binned::summary_of(INFINITY).flags == summary::infinite);
  CHECK(zero::binned::summary_of(-NAN).flags == summary::not_a_number);
  for (const summary s : {summary{}, summary{0, 0}, summary{65, 3}, summary{8, 1}})
    CHECK(zero::binned::unpack(zero::binned::pack(s)) == s);
}

// ---- the engine in the reproducible mode ----------------------------------------------------------

namespace {

constexpr int global_micro_batches = 8;  // per step, whatever N: M = 8 / N on each rank
constexpr int repro_steps = 4;

// The gradient of global micro-batch j for the parameter at global index i: the toy model's, spread
// over 13 binary orders of magnitude so that the bins of a unit see values far below its largest.
float micro_gradient(float w, int j, std::uint64_t t, std::size_t i) {
  return std::ldexp(toy::gradient(w, j, t, i), -static_cast<int>(i % 13));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct repro_result {
  std::vector<float> params;
  std::vector<zero::step_report> reports;  // rank 0's
  std::vector<zero::memory_report> memory;
  std::vector<zero::comm_report> comm;
  std::uint64_t model_state_formula = 0, comm_formula = 0, padded = 0;
  zero::overlap_report overlap;
  zero::offload_report offload;  // rank 0's
  std::uint64_t offload_formula = 0;
  zero::offload_traffic offload_traffic_formula;
  std::uint64_t persistent = 0;
};

template <class C>
using plain = C;

// One step of rank `rank` of N: its M micro-batches j = rank M + k, each a forward pass (gather,
// release) and a backward pass (gather, grads, reduce, release), the gradient not divided by M.
template <class Engine>
zero::step_report repro_step(Engine& e, int rank, int m, std::uint64_t t, float factor = 1.0f) {
  const auto& s = e.spec();
  const auto base = toy::unit_bases(s);
  using G = typename Engine::grad_type;
  const float scale = e.loss_scale() * factor;
  for (int k = 0; k < m; ++k) {
    const int j = rank * m + k;
    for (std::size_t u = 0; u < s.num_units(); ++u) e.gather(zero::unit_id{u}).release();
    for (std::size_t u = s.num_units(); u-- > 0;) {
      const zero::unit_id id{u};
      auto p = e.gather(id);
      auto g = e.grads(id);
      const auto pv = p.view();
      const auto gv = g.view();
      for (std::size_t q = 0; q < pv.size(); ++q)
        gv.data()[q] = static_cast<G>(micro_gradient(static_cast<float>(pv.data()[q]), j, t, base[u] + q) * scale);
      e.reduce(id);
    }
  }
  return e.step();
}

// Trains the toy model in the reproducible mode on N thread ranks (through Wrap<comm::threads>), 8
// global micro-batches per step.
template <class Stage, class Prec = zero::precision::fp32, template <class> class Wrap = plain>
repro_result run_repro(int n, zero::engine_options eo, int steps = repro_steps,
                       int micro_batches = global_micro_batches) {
  eo.reproducible = true;
  eo.micro_batches = micro_batches / n;
  repro_result res;
  res.memory.resize(static_cast<std::size_t>(n));
  res.comm.resize(static_cast<std::size_t>(n));
  const zero::model_spec s = toy::spec();
  zero::optim::adamw opt;
  opt.lr = 3e-3f;
  opt.weight_decay = 0.05f;
  zero::comm::threads::launch(n, [&](zero::comm::threads& base) {
    using Comm = Wrap<zero::comm::threads>;
    std::optional<Comm> wrapped;
    Comm& comm = [&]() -> Comm& {
      if constexpr (std::is_same_v<Comm, zero::comm::threads>)
        return base;
      else
        return wrapped.emplace(base);
    }();
    zero::engine<Stage, Comm, zero::optim::adamw, Prec> e(comm, s, opt, eo);
    e.initialize(toy::initializer());
    for (int t = 0; t < steps; ++t) {
      const auto r = repro_step(e, comm.rank(), eo.micro_batches, static_cast<std::uint64_t>(t));
      if (comm.rank() == 0) res.reports.push_back(r);
    }
    const auto rank = static_cast<std::size_t>(comm.rank());
    res.memory[rank] = e.memory();
    res.comm[rank] = e.comm();
    auto full = e.full_params();
    if (comm.rank() == 0) {
      res.params = std::move(full);
      res.model_state_formula = e.model_state_formula_bytes();
      res.comm_formula = e.comm_formula_bytes();
      res.padded = e.layout().padded();
      res.overlap = e.overlap();
      res.offload = e.offload();
      res.offload_formula = e.offload_formula_bytes();
      res.offload_traffic_formula = e.offload_formula_traffic();
      res.persistent = e.persistent_elements();
    }
  });
  return res;
}

zero::engine_options clipped(float clip = 0.5f) {
  zero::engine_options o;
  o.clip_norm = clip;
  return o;
}

// The same training in one process without an engine or bins: per element, the exact sum of the 8
// micro-batch gradients (exact_sum) rounded once, divided by 8, the norm of those quotients from the
// exact sum of their squares rounded once to double, then clipping and AdamW.
std::vector<float> reference_repro(float clip) {
  const zero::model_spec s = toy::spec();
  std::vector<float> w(s.numel());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = toy::initial(i);
  std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f), g(w.size());
  zero::optim::adamw opt;
  opt.lr = 3e-3f;
  opt.weight_decay = 0.05f;
  for (int t = 0; t < repro_steps; ++t) {
    exact_sum squares;
    for (std::size_t i = 0; i < w.size(); ++i) {
      exact_sum e;
      for (int j = 0; j < global_micro_batches; ++j) e.add(micro_gradient(w[i], j, static_cast<std::uint64_t>(t), i));
      g[i] = e.nearest<float>() / static_cast<float>(global_micro_batches);
      squares.add(static_cast<double>(g[i]) * g[i]);
    }
    const double norm = std::sqrt(squares.nearest<double>());
    const float coef = norm > clip ? static_cast<float>(static_cast<double>(clip) / (norm + 1e-6)) : 1.0f;
    const auto c = opt.constants(static_cast<std::uint64_t>(t) + 1);
    for (std::size_t i = 0; i < w.size(); ++i) {
      float st[2] = {m[i], v[i]};
      zero::optim::adamw::update(c, w[i], coef != 1.0f ? g[i] * coef : g[i], st);
      m[i] = st[0];
      v[i] = st[1];
    }
  }
  return w;
}

}  // namespace

TEST_CASE("reproducible: N = 1, 2, 4, 8, every stage and precision, clipping on: identical parameters") {
  zero::precisions::for_each([&]<class Prec>() {
    CAPTURE(Prec::name);
    const repro_result first = run_repro<zero::stage0, Prec>(1, clipped());
    REQUIRE(first.params.size() == toy::spec().numel());
    // fp32 and bf16 at every N; fp16 (the loss scale's decisions) at N = 2 and 8, to keep the suite short.
    const std::vector<int> ns = Prec::loss_scaling ? std::vector<int>{2, 8} : std::vector<int>{1, 2, 4, 8};
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(Stage::stage);
      for (int n : ns) {
        CAPTURE(n);
        const repro_result r = run_repro<Stage, Prec>(n, clipped());
        CHECK(same_bits(r.params, first.params));
        for (int t = 0; t < repro_steps; ++t) {
          const auto& a = r.reports[static_cast<std::size_t>(t)];
          const auto& b = first.reports[static_cast<std::size_t>(t)];
          CHECK(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)) == 0);
          CHECK(a.skipped == b.skipped);
          CHECK(a.loss_scale == b.loss_scale);
        }
      }
    });
    // Clipping applied (the norm is above 0.5), and under fp16 the loss scale overflowed at least once.
    CHECK(first.reports[0].grad_norm > 0.5);
    if constexpr (Prec::loss_scaling) CHECK(first.reports[0].skipped);
  });
}

TEST_CASE("reproducible: equal to an exact single-process reference (fp32, clipping on)") {
  const auto ref = reference_repro(0.5f);
  const repro_result r = run_repro<zero::stage3>(4, clipped());
  CHECK(same_bits(r.params, ref));
  // Without clipping too (a different path through the step).
  CHECK(same_bits(run_repro<zero::stage1>(2, clipped(0.0f)).params, reference_repro(INFINITY)));
}

TEST_CASE("reproducible: the default mode is not, so the equality above means something") {
  // The default mode at N = 1 and N = 4 with the same 8 micro-batches, each divided by M as a trainer
  // does (a power of two: exact), so the same mean, summed in other groupings: a + b + ... + h on one
  // rank, (a + b) + (c + d) + ... over four.
  auto run_default = [](int n) {
    std::vector<float> out;
    zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
      zero::engine_options eo;
      eo.micro_batches = global_micro_batches / n;
      zero::engine<zero::stage2, zero::comm::threads, zero::optim::adamw> e(c, toy::spec(), {}, eo);
      e.initialize(toy::initializer());
      for (int t = 0; t < repro_steps; ++t)
        repro_step(e, c.rank(), eo.micro_batches, static_cast<std::uint64_t>(t),
                   1.0f / static_cast<float>(eo.micro_batches));
      auto p = e.full_params();
      if (c.rank() == 0) out = p;
    });
    return out;
  };
  CHECK_FALSE(same_bits(run_default(1), run_default(4)));
}

TEST_CASE("reproducible: overlap, reduces in flight, fused reduce and gather buckets give the same bits") {
  const repro_result base = run_repro<zero::stage0>(1, clipped());
  zero::stages::for_each([&]<class Stage>() {
    CAPTURE(Stage::stage);
    for (std::size_t bucket : {std::size_t{0}, std::size_t{1024}}) {
      CAPTURE(bucket);
      zero::engine_options eo = clipped();
      eo.reduce_bucket_elements = bucket;
      eo.gather_bucket_elements = bucket;  // stage 3's gathers too (no effect elsewhere)
      eo.reduces_in_flight = 2;
      const repro_result r = run_repro<Stage, zero::precision::fp32, testing::deferred>(4, eo);
      CHECK(same_bits(r.params, base.params));
      CHECK(r.overlap.active);
      CHECK(r.overlap.reduces_started > 0);
      if (Stage::stage >= 2 && bucket > 0) CHECK(r.overlap.fused_reduces > 0);
      if (Stage::stage == 3) CHECK((r.overlap.gather_buckets > 0) == (bucket > 0));
      if (Stage::stage == 3) CHECK(r.overlap.prefetch_hits > 0);
      for (const auto& c : r.comm) CHECK(c.last_step.total_bytes() == r.comm_formula);
    }
  });
}

TEST_CASE("reproducible: persistent units and offloaded states keep the bits; the formulas hold") {
  const repro_result base = run_repro<zero::stage0>(1, clipped());
  // Stage 3 with the units of at most 400 elements persistent (tiny and head; not embed or block).
  for (int n : {2, 4}) {
    CAPTURE(n);
    zero::engine_options eo = clipped();
    eo.persist_below_elements = 400;
    const repro_result r = run_repro<zero::stage3>(n, eo);
    CHECK(same_bits(r.params, base.params));
    REQUIRE(r.persistent > 0);
    CHECK(r.persistent < r.padded);
    for (const auto& mem : r.memory) CHECK(mem.model_state_bytes() == r.model_state_formula);
    CHECK(r.model_state_formula == zero::formula::reproducible_model_state_bytes(
                                       3, r.padded, n, {4, 0, 8}, r.persistent));
    for (const auto& c : r.comm) CHECK(c.last_step.total_bytes() == r.comm_formula);
    CHECK(r.comm_formula ==
          zero::formula::reproducible_comm_bytes_per_step(3, r.padded, n, 4, 8 / n, 4, 0, r.persistent, 4));
  }
  // Master weights and moments in host memory and on disk, stages 1 and 3.
  // A fresh directory for the disk tier's files (each engine removes its own).
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zero-repro-offload-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (zero::offload_tier tier : {zero::offload_tier::host, zero::offload_tier::disk}) {
    CAPTURE(static_cast<int>(tier));
    zero::engine_options eo = clipped();
    eo.offload.tier = tier;
    eo.offload.directory = dir.string();
    eo.offload.slice_elements = 1024;
    auto check = [&](const repro_result& r) {
      CHECK(same_bits(r.params, base.params));
      CHECK(r.offload.tier == tier);
      CHECK(r.offload.host_bytes + r.offload.disk_bytes == r.offload_formula);
      CHECK(r.offload.last_step.disk_read == r.offload_traffic_formula.disk_read);
      CHECK(r.offload.last_step.disk_written == r.offload_traffic_formula.disk_written);
      for (const auto& mem : r.memory) CHECK(mem.model_state_bytes() == r.model_state_formula);
      for (const auto& c : r.comm) CHECK(c.last_step.total_bytes() == r.comm_formula);
    };
    check(run_repro<zero::stage1>(2, eo));
    check(run_repro<zero::stage3>(4, eo));
  }
  CHECK(std::filesystem::is_empty(dir));
  std::filesystem::remove(dir);
}

TEST_CASE("reproducible: model states and bytes per step equal the formulas, every stage, N = 1-4, M = 1 and 2") {
  // N = 1-4 (3: Psi/N (N-1) not a power of two), one and two micro-batches per rank.
  for (const std::pair<int, int>& nm : {std::pair{1, 2}, std::pair{2, 1}, std::pair{3, 2}, std::pair{4, 1}}) {
    const int n = nm.first, m = nm.second;
    CAPTURE(n);
    CAPTURE(m);
    zero::stages::for_each([&]<class Stage>() {
      CAPTURE(Stage::stage);
      const repro_result r = run_repro<Stage, zero::precision::bf16>(n, clipped(), 2, n * m);
      const std::uint64_t psi = r.padded, nn = static_cast<std::uint64_t>(n), mm = static_cast<std::uint64_t>(m);
      // Written out: bf16 parameters (2), fp32 master and two AdamW slots (12), 28 bytes per gradient
      // element the rank updates (three int64 words and the fp32 rounding).
      const std::uint64_t states = Stage::stage == 0   ? (2 + 28 + 12) * psi
                                   : Stage::stage == 3 ? (2 + 28 + 12) * psi / nn
                                                       : 2 * psi + (28 + 12) * psi / nn;
      CHECK(r.model_state_formula == states);
      for (const auto& mem : r.memory) CHECK(mem.model_state_bytes() == states);
      // Per element reduced: every stage sends the bf16 values to their slices' owners (all_to_all), 2
      // bytes; 8 (N - 1) per unit and micro-batch for the bins; then the bf16 parameter all-gathers as
      // in the default mode, and in stage 0 the all-gather of the rounded fp32 gradient, once; 4 units.
      const std::uint64_t part = psi / nn * (nn - 1);
      const std::uint64_t grads = mm * (2 * part + 8 * (nn - 1) * 4);
      const std::uint64_t params = Stage::stage == 0 ? 4 * part : Stage::stage == 3 ? 2 * mm * 2 * part : 2 * part;
      CHECK(r.comm_formula == grads + params);
      CHECK(r.comm_formula ==
            zero::formula::reproducible_comm_bytes_per_step(Stage::stage, psi, n, 2, m, 4, 0, 0, n > 1 ? 2 : 0));
      for (const auto& c : r.comm) {
        CHECK(c.last_step.total_bytes() == grads + params);
        // The norm's agreement: one summary, the optimizer's hash and four words per rank, all-gathered
        // (stages 1-3); stage 0 adds its squares locally, and the optimizer's fingerprint (8 doubles)
        // has an all-reduce of its own.
        CHECK(c.control.total_bytes() ==
              (Stage::stage == 0 ? 2 * (2 * (nn - 1) * 64 / nn) : 2 * (8 + 8 + 32) * (nn - 1)));
      }
    });
  }
}

TEST_CASE("reproducible: a resume at another N continues bit-identically (the checkpoint's state)") {
  // The first half of the steps at N = 2 (stage 2), then the master weights and AdamW slots move to
  // N = 4 (stage 1) through read_state/write_state, as a checkpoint does, and the second half runs
  // there; the result equals every step at N = 1 (stage 3).
  const zero::model_spec s = toy::spec();
  zero::engine_options eo = clipped();
  eo.reproducible = true;
  zero::optim::adamw opt;
  opt.lr = 3e-3f;
  opt.weight_decay = 0.05f;
  std::vector<float> master(s.numel()), m1(s.numel()), m2(s.numel());
  zero::training_state ts;
  const auto bases = toy::unit_bases(s);
  auto half = [&](int n, int t0, bool load, bool save) {
    std::vector<float> out;
    zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
      zero::engine_options o = eo;
      o.micro_batches = global_micro_batches / n;
      auto go = [&]<class Stage>() {
        zero::engine<Stage, zero::comm::threads, zero::optim::adamw> e(c, s, opt, o);
        if (load) {
          for (std::size_t u = 0; u < s.num_units(); ++u) {
            const zero::range r = e.held_range(zero::unit_id{u});
            const float* slots[2] = {m1.data() + bases[u] + r.begin, m2.data() + bases[u] + r.begin};
            e.write_state(zero::unit_id{u}, r, master.data() + bases[u] + r.begin, slots);
          }
          e.finish_load(ts);
        } else {
          e.initialize(toy::initializer());
        }
        for (int t = t0; t < t0 + repro_steps / 2; ++t)
          repro_step(e, c.rank(), o.micro_batches, static_cast<std::uint64_t>(t));
        if (save) {
          for (std::size_t u = 0; u < s.num_units(); ++u) {
            const zero::range r = e.canonical_range(zero::unit_id{u});
            float* slots[2] = {m1.data() + bases[u] + r.begin, m2.data() + bases[u] + r.begin};
            e.read_state(zero::unit_id{u}, r, master.data() + bases[u] + r.begin, slots);
          }
          if (c.rank() == 0) ts = e.state();
        }
        auto p = e.full_params();
        if (c.rank() == 0) out = p;
      };
      if (n == 2)
        go.template operator()<zero::stage2>();
      else
        go.template operator()<zero::stage1>();
    });
    return out;
  };
  half(2, 0, false, true);
  const auto resumed = half(4, repro_steps / 2, true, false);
  const repro_result whole = run_repro<zero::stage3>(1, clipped());
  CHECK(ts.step == repro_steps / 2);
  CHECK(same_bits(resumed, whole.params));
}

TEST_CASE("reproducible: combinations it cannot honour are refused, naming the option") {
  auto refused = [](zero::engine_options o, int n = 1) {
    std::string what;
    o.reproducible = true;
    try {
      zero::comm::threads::launch(n, [&](zero::comm::threads& c) {
        zero::engine<zero::stage2, zero::comm::threads, zero::optim::sgd> e(c, toy::spec(), {}, o);
      });
    } catch (const zero::error& e) {
      CHECK(e.kind() == zero::error_kind::invalid_argument);
      what = e.what();
    }
    return what;
  };
  zero::engine_options local;
  local.accumulate = zero::accumulation::local_then_reduce;
  local.micro_batches = 2;
  // (Stage 2 refuses local_then_reduce for its own reason first; the reproducible check comes from
  // the stages that allow it.)
  std::string what;
  try {
    zero::comm::threads::launch(1, [&](zero::comm::threads& c) {
      local.reproducible = true;
      zero::engine<zero::stage0, zero::comm::threads, zero::optim::sgd> e(c, toy::spec(), {}, local);
    });
  } catch (const zero::error& e) {
    what = e.what();
  }
  CHECK(what.find("local_then_reduce would add them in fp32 first") != std::string::npos);
  zero::engine_options fp32;
  fp32.fp32_grad_accumulation = true;
  CHECK(refused(fp32).find("fp32_grad_accumulation does not apply") != std::string::npos);
  zero::engine_options many;
  many.micro_batches = (1 << 23) + 1;
  const std::string m = refused(many, 2);
  CHECK(m.find("N x micro_batches = 2 x 8388609 = 16777218 micro-batches, more than 2^24") != std::string::npos);
  CHECK(m.find("rank ") == 0);
  for (int which = 0; which < 3; ++which) {
    zero::engine_options z;
    (which == 0 ? z.zeropp.qwz : which == 1 ? z.zeropp.qgz : z.zeropp.hpz) = true;
    z.zeropp.node_size = 1;
    CHECK(refused(z, 2).find("reproducible and ZeRO++ (zeropp.qwz, qgz, hpz) cannot be combined") != std::string::npos);
  }
}
