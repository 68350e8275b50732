// sys::host::for_each on SIMD packs against the plain per-element loop, and the blocked matrix products against the
// order one element at a time, bit for bit, on every ISA level this CPU has.
#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../threads_runner.hpp"
#include "isa_levels.hpp"
#include "zero/optim/newton_schulz.hpp"
#include "zero/sys/host_gemm.hpp"
#include "zero/zero.hpp"

namespace {

using namespace zero;
namespace hl = zero::sys::host_loop;

// Float inputs every rule sees: NaNs with several payloads and signs (quiet and signalling),
// infinities, zeros, subnormals, huge values, values at bf16 and fp16 rounding ties and overflow
// thresholds, then random values of mixed magnitudes.
std::vector<float> special_floats() {
  const std::uint32_t bits[] = {
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fc00001u, 0x7fffffffu, 0xffffffffu, 0x7fa00000u,
      0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu,
      0x00400000u, 0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f000000u, 0x3f808000u, 0x3f818000u, 0x3f80c000u,
      0x477fe000u, 0x477ff000u, 0xc77ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
      0x32ffffffu, 0x33800000u, 0x34400000u, 0x38000000u, 0x37800000u, 0x3f800000u, 0xbf800000u, 0x3a83126fu};
  std::vector<float> v;
  for (std::uint32_t b : bits) v.push_back(__builtin_bit_cast(float, b));
  return v;
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return T(x);
}

// n values of type T: the special floats first (cycled), then random ones; the 2-byte types also
// get raw bit patterns (their own NaNs with payloads, subnormals).
template <class T>
std::vector<T> inputs(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mag(-8.0f, 8.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  const std::vector<float> special = special_floats();
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int k = pick(rng);
    float x = std::ldexp(mag(rng), static_cast<int>(mag(rng) * 4));
    if (k < 2) x = special[(i + seed) % special.size()];
    if constexpr (std::is_same_v<T, float>) {
      v[i] = x;
    } else {
      v[i] = T(x);
      if (k == 2) v[i] = T::from_bits(static_cast<std::uint16_t>(rng()));
    }
  }
  return v;
}

// Runs `rule` over arrays (of the types of `init`) through sys::host::for_each at every level and
// through the per-element reference loop rule(j, ...), starting `offset` elements into each array,
// and requires the same bytes in every array. `mode` gives each operand's flags (in/out/inout).
template <class Rule, class... Ts>
void check_rule(const std::string& what, const Rule& rule, std::size_t n, std::size_t offset,
                const std::tuple<std::vector<Ts>...>& init, const std::array<int, sizeof...(Ts)>& modes) {
  constexpr std::size_t K = sizeof...(Ts);
  auto reference = init;
  std::apply([&](auto&... a) {
    for (std::size_t j = 0; j < n; ++j) rule(j, (a.data() + offset)...);
  }, reference);
  for (hl::isa level : isa_levels::available()) {
    const isa_levels::cap_guard g(level);
    auto got = init;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      auto op = [&](auto& a, int mode) {
        using T = typename std::remove_reference_t<decltype(a)>::value_type;
        return elementwise::operand<T>{a.data() + offset, mode != 1, mode != 0};
      };
      sys::host::for_each(n, rule, op(std::get<I>(got), modes[I])...);
    }(std::make_index_sequence<K>{});
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      auto same = [&](const auto& a, const auto& b, std::size_t k) {
        // The first element whose bytes differ (a.size() if none), to name in a failure.
        std::size_t first = 0;
        while (first < a.size() && std::memcmp(&a[first], &b[first], sizeof(a[0])) == 0) ++first;
        INFO(what, " n=", n, " offset=", offset, " level=", std::string(hl::name(level)), " array ", k,
             " element ", first);
        CHECK(first == a.size());
      };
      (same(std::get<I>(got), std::get<I>(reference), I), ...);
    }(std::make_index_sequence<K>{});
  }
}

constexpr std::size_t lengths[] = {0, 1, 7, 33, 1003};
constexpr std::size_t offsets[] = {0, 1, 3};
constexpr int in_mode = 0, out_mode = 1, inout_mode = 2;

// A user's optimizer written for float only (the concept's minimum): runs one element at a time.
struct user_scalar {
  static constexpr int slots = 1;
  static constexpr std::string_view name = "user_scalar";
  static constexpr std::array<std::string_view, slots> slot_names = {"acc"};
  float lr = 0.1f;
  static constexpr auto hyper_parameters() { return std::tuple{field("lr", &user_scalar::lr)}; }
  struct step_constants {
    float lr;
  };
  step_constants constants(std::uint64_t) const { return {lr}; }
  static void update(const step_constants& c, float& w, float g, float* s) {
    s[0] = fp::add(s[0], fp::mul(g, g));  // Adagrad
    w = fp::sub(w, fp::div(fp::mul(c.lr, g), fp::add(fp::sqrt(s[0]), 1e-10f)));
  }
};
static_assert(OptimizerState<user_scalar>);

// The same written over a value type, as the library's optimizers: runs on packs.
struct user_generic : user_scalar {
  template <class V>
  static void update(const step_constants& c, V& w, std::type_identity_t<V> g, V* s) {
    using namespace zero::fp;
    s[0] = add(s[0], mul(g, g));
    w = sub(w, div(mul(c.lr, g), add(sqrt(s[0]), 1e-10f)));
  }
};
static_assert(OptimizerState<user_generic>);

#if defined(ZERO_HOST_SIMD)
static_assert(hl::vectorizable<elementwise::update_rule<optim::adamw>, const bf16, float, fp16, float, float>);
static_assert(hl::vectorizable<elementwise::update_in_place_rule<user_generic>, const float, float, float>);
static_assert(!hl::vectorizable<elementwise::update_in_place_rule<user_scalar>, const float, float, float>);
static_assert(!hl::vectorizable<elementwise::accumulate_rule, double, const double>);  // not a lane type
#endif

template <class Opt, class G, class P>
void check_optimizer(const std::string& what, const typename Opt::step_constants& c, float divisor, float coef) {
  std::uint32_t seed = 1;
  for (std::size_t n : lengths)
    for (std::size_t off : offsets) {
      const std::size_t len = n + off;
      std::vector<std::vector<float>> slot_init;
      auto slots_tuple = [&]<std::size_t... K>(std::index_sequence<K...>) {
        return std::tuple{((void)K, inputs<float>(len, seed + 10 + K))...};
      }(std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{});
      const auto g = inputs<G>(len, seed);
      const auto w = inputs<float>(len, seed + 1);
      const auto p = inputs<P>(len, seed + 2);
      ++seed;
      auto slot_modes = [&]<std::size_t... K>(std::index_sequence<K...>) {
        return std::array<int, sizeof...(K)>{((void)K, inout_mode)...};
      }(std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{});
      // With a parameter copy (update_rule) and without (update_in_place_rule).
      {
        auto init = std::tuple_cat(std::tuple{g, w, p}, slots_tuple);
        std::array<int, 3 + Opt::slots> modes{in_mode, inout_mode, out_mode};
        for (int k = 0; k < Opt::slots; ++k) modes[3 + k] = slot_modes[k];
        check_rule(what + " update", elementwise::update_rule<Opt>{{c, divisor, coef}}, n, off, init, modes);
      }
      {
        auto init = std::tuple_cat(std::tuple{g, w}, slots_tuple);
        std::array<int, 2 + Opt::slots> modes{in_mode, inout_mode};
        for (int k = 0; k < Opt::slots; ++k) modes[2 + k] = slot_modes[k];
        check_rule(what + " in place", elementwise::update_in_place_rule<Opt>{c, divisor, coef}, n, off, init, modes);
      }
    }
}

template <class Opt>
void check_optimizer_all_types(const std::string& what, const typename Opt::step_constants& c) {
  for (float coef : {1.0f, 0.37f}) {
    check_optimizer<Opt, float, float>(what + " fp32", c, 3.0f, coef);
    check_optimizer<Opt, bf16, bf16>(what + " bf16", c, 3.0f, coef);
    check_optimizer<Opt, fp16, fp16>(what + " fp16", c, 1536.0f, coef);
    check_optimizer<Opt, float, bf16>(what + " fp32 grad, bf16 param", c, 2.0f, coef);
  }
}

}  // namespace

TEST_CASE("host loops: the levels this CPU runs") {
  std::string names;
  for (hl::isa l : isa_levels::available()) names += std::string(hl::name(l)) + " ";
  MESSAGE("levels checked: ", names);
#if defined(ZERO_HOST_SIMD)
  CHECK(hl::detected() >= hl::isa::sse2);  // x86-64's baseline
  {
    const isa_levels::cap_guard g(hl::isa::sse2);
    CHECK(hl::active() == hl::isa::sse2);
  }
  CHECK(hl::active() == hl::detected());
#endif
}

TEST_CASE("host loops: optimizer updates equal the per-element rule bit for bit") {
  {
    optim::sgd o;
    o.weight_decay = 0.01f;
    check_optimizer_all_types<optim::sgd>("sgd momentum first step", o.constants(1));
    check_optimizer_all_types<optim::sgd>("sgd momentum", o.constants(2));
    o.nesterov = true;
    check_optimizer_all_types<optim::sgd>("sgd nesterov", o.constants(3));
    o.nesterov = false;
    o.momentum = 0.0f;
    check_optimizer_all_types<optim::sgd>("sgd plain", o.constants(4));
  }
  {
    optim::adamw o;
    check_optimizer_all_types<optim::adamw>("adamw", o.constants(1));
    check_optimizer_all_types<optim::adamw>("adamw t=1000", o.constants(1000));
  }
  {
    // The slots' inputs are arbitrary words: both halves of every kind (NaN, Inf, subnormal) are met.
    optim::adamw_bf16 o;
    check_optimizer_all_types<optim::adamw_bf16>("adamw_bf16", o.constants(1));
    check_optimizer_all_types<optim::adamw_bf16>("adamw_bf16 t=2^32+7", o.constants((1ull << 32) + 7));
  }
  {
    optim::lion o;
    o.weight_decay = 0.1f;
    check_optimizer_all_types<optim::lion>("lion", o.constants(1));
  }
  check_optimizer_all_types<user_scalar>("user optimizer (float only)", user_scalar{}.constants(1));
  check_optimizer_all_types<user_generic>("user optimizer (generic)", user_generic{}.constants(1));
}

TEST_CASE_TEMPLATE("host loops: accumulation and casts equal the per-element rule bit for bit", D, float, bf16, fp16) {
  std::uint32_t seed = 100;
  for (std::size_t n : lengths)
    for (std::size_t off : offsets) {
      const std::size_t len = n + off;
      ++seed;
      for (bool first : {true, false}) {
        check_rule("accumulate from fp32", elementwise::accumulate_rule{first}, n, off,
                   std::tuple{inputs<D>(len, seed), inputs<float>(len, seed + 1)}, {inout_mode, in_mode});
        check_rule("accumulate from bf16", elementwise::accumulate_rule{first}, n, off,
                   std::tuple{inputs<D>(len, seed), inputs<bf16>(len, seed + 2)}, {inout_mode, in_mode});
        check_rule("accumulate from fp16", elementwise::accumulate_rule{first}, n, off,
                   std::tuple{inputs<D>(len, seed), inputs<fp16>(len, seed + 3)}, {inout_mode, in_mode});
      }
      check_rule("cast", elementwise::cast_rule{}, n, off, std::tuple{inputs<D>(len, seed), inputs<float>(len, seed + 4)},
                 {out_mode, in_mode});
    }
}

// The conversions alone, far beyond what the rules' random inputs reach: every 2-byte pattern
// widened, and floats narrowed over every exponent with mantissas at and around each rounding tie.
TEST_CASE_TEMPLATE("host loops: 2-byte conversions equal the scalar ones for every pattern", T, bf16, fp16) {
  std::vector<T> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = T::from_bits(static_cast<std::uint16_t>(i));
  std::vector<float> floats;
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t e = 0; e < 256; ++e)
      for (std::uint32_t m : {0u, 1u, 2u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                              0x18000u, 0x400000u, 0x400001u, 0x7fffffu, 0x7ff000u, 0x7fe000u, 0x2aaaaau, 0x155555u})
        floats.push_back(__builtin_bit_cast(float, sign | (e << 23) | m));
  // The fp16 subnormal range (float exponents 102..112, shifts 24..14) at, below and above each tie.
  for (std::uint32_t e = 100; e < 114; ++e) {
    const std::uint32_t shift = e < 102 ? 24 : (e > 112 ? 14 : 126 - e), half = 1u << (shift - 1);
    for (std::uint32_t q = 0; q < 32; ++q)
      for (std::uint32_t r : {half - 1, half, half + 1})
        floats.push_back(__builtin_bit_cast(float, (e << 23) | ((0x800000u | (q << shift) | r) & 0x7fffffu)));
  }
  // And a stride over all 2^32 patterns.
  for (std::uint64_t u = 0; u < (1ull << 32); u += 40961) floats.push_back(__builtin_bit_cast(float, std::uint32_t(u)));
  const std::size_t n = floats.size();
  for (hl::isa level : isa_levels::available()) {
    const isa_levels::cap_guard g(level);
    INFO("level ", std::string(hl::name(level)));
    // Widening: accumulate_rule{first} stores static_cast<float>(src[j]) into a float array.
    std::vector<float> wide(all.size());
    sys::host::for_each(all.size(), elementwise::accumulate_rule{true}, elementwise::out(wide.data()),
                        elementwise::in(static_cast<const T*>(all.data())));
    int wrong = 0;
    for (std::size_t i = 0; i < all.size(); ++i)
      wrong += __builtin_bit_cast(std::uint32_t, wide[i]) !=
               __builtin_bit_cast(std::uint32_t, store_as<float>(static_cast<float>(all[i])));
    CHECK(wrong == 0);
    // Narrowing: cast_rule stores store_as<T>(src[j]).
    std::vector<T> narrow(n);
    sys::host::for_each(n, elementwise::cast_rule{}, elementwise::out(narrow.data()),
                        elementwise::in(static_cast<const float*>(floats.data())));
    wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += narrow[i].bits != T(floats[i]).bits;
    CHECK(wrong == 0);
  }
}

// ---- the reproducible mode's passes (sys/host_binned.hpp) ----------------------------------------

TEST_CASE_TEMPLATE("host loops: the binned cut into words equals the per-element rule bit for bit", G, float, bf16,
                   fp16) {
  std::uint32_t seed = 300;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                        std::size_t{33}, std::size_t{1003}})
    for (std::size_t off : offsets) {
      const std::size_t len = n + off;
      const std::vector<G> g = inputs<G>(len, ++seed);
      // The data's own top bin, the largest, and tops below some values' bins (their high bits drop as
      // in the scalar window) and far above (values below the kept words).
      int top = -1;
      for (const G& x : g) top = std::max(top, binned::summary_of(static_cast<float>(x)).bin);
      for (int t : {top, 8, 5, 3, 1, 0})
        if (t >= 0) {
          const std::vector<std::int64_t> w(len, 0x5a5a5a5a5a5a5a5all);
          check_rule("to_bins top " + std::to_string(t), elementwise::to_bins_rule{t}, n, off, std::tuple{g, w, w, w},
                     {in_mode, out_mode, out_mode, out_mode});
        }
    }
}

// The cut that adds a store's words (the slice a reduce lands in): the packed loop against the rule,
// and the rule against what it stands for, the cut at the values' own top merged into the store.
TEST_CASE_TEMPLATE("host loops: the binned cut adding a store's words equals the cut merged into the store", G, float,
                   bf16, fp16) {
  std::uint32_t seed = 700;
  std::mt19937_64 rng(17);
  const auto words = [&](std::size_t len) {
    std::vector<std::int64_t> v(len);
    for (auto& x : v) x = static_cast<std::int64_t>(rng() >> 22) - (std::int64_t{1} << 41);
    return v;
  };
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                        std::size_t{1003}})
    for (std::size_t off : offsets) {
      const std::size_t len = n + off;
      const std::vector<G> g = inputs<G>(len, ++seed);
      int own = -1;
      for (const G& x : g) own = std::max(own, binned::summary_of(static_cast<float>(x)).bin);
      if (own < 0) continue;
      // (cut top, store top): the store's top equal, below by 1, 2, 3+, empty; the cut above the values'.
      const std::pair<int, int> tops[] = {{own, own}, {own, own - 1}, {own + 1, own - 1}, {own + 2, own},
                                          {own + 4, own}, {own, -1}, {own + 1, own + 1}};
      for (auto [top, store_top] : tops) {
        if (store_top > top) continue;
        const std::string name = "to_bins adding " + std::to_string(top) + "," + std::to_string(store_top);
        const std::vector<std::int64_t> s0 = words(len), s1 = words(len), s2 = words(len);
        const std::vector<std::int64_t> w(len, 0x5a5a5a5a5a5a5a5all);
        check_rule(name, elementwise::to_bins_adding_rule{top, store_top}, n, off, std::tuple{g, s0, s1, s2, w, w, w},
                   {in_mode, in_mode, in_mode, in_mode, out_mode, out_mode, out_mode});
        // In place (the output is the store, as at one rank): the packed loop reads before it writes.
        {
          std::vector<std::int64_t> t0 = s0, t1 = s1, t2 = s2, e0(len), e1(len), e2(len);
          for (std::size_t j = 0; j < len; ++j)
            elementwise::to_bins_adding_rule{top, store_top}(j, g.data(), s0.data(), s1.data(), s2.data(), e0.data(),
                                                             e1.data(), e2.data());
          sys::host::for_each(len, elementwise::to_bins_adding_rule{top, store_top}, elementwise::in(g.data()),
                              elementwise::in(static_cast<const std::int64_t*>(t0.data())),
                              elementwise::in(static_cast<const std::int64_t*>(t1.data())),
                              elementwise::in(static_cast<const std::int64_t*>(t2.data())), elementwise::out(t0.data()),
                              elementwise::out(t1.data()), elementwise::out(t2.data()));
          const std::string in_place = name + " in place";
          CHECK_MESSAGE((t0 == e0 && t1 == e1 && t2 == e2), in_place);
        }
        // The rule is the store merged with the cut at the values' own top, for the larger top.
        std::size_t wrong = 0;
        for (std::size_t j = 0; j < len; ++j) {
          std::int64_t a0, a1, a2, c0, c1, c2;
          elementwise::to_bins_adding_rule{top, store_top}(0, g.data() + j, s0.data() + j, s1.data() + j,
                                                           s2.data() + j, &a0, &a1, &a2);
          elementwise::to_bins_rule{own}(0, g.data() + j, &c0, &c1, &c2);
          std::int64_t m0 = s0[j], m1 = s1[j], m2 = s2[j];
          elementwise::merge_bins_rule{store_top, own, std::max(store_top, own)}(0, &m0, &m1, &m2, &c0, &c1, &c2);
          std::int64_t r[binned::words] = {m0, m1, m2};
          if (top != std::max(store_top, own)) binned::realign(r, std::max(store_top, own), top);
          wrong += a0 != r[0] || a1 != r[1] || a2 != r[2];
        }
        CHECK_MESSAGE(wrong == 0, name);
      }
    }
}

// Words as a store holds them, sums of many terms of either sign (up to about 2^42 in magnitude):
// carries between planes, cancellations, ties.
static std::vector<std::int64_t> summed_words(std::mt19937_64& rng, std::size_t len) {
  std::vector<std::int64_t> v(len);
  for (auto& x : v) x = static_cast<std::int64_t>(rng() >> (22 + rng() % 30)) - (std::int64_t{1} << 30);
  return v;
}

// The cut rounded at once (a unit's last reduce at one rank): the packed loop against the rule, and
// the rule against the two passes it replaces, the cut adding the store's words, then the rounding.
TEST_CASE_TEMPLATE("host loops: the binned cut rounded at once equals the cut into the store, then rounded", G, float,
                   bf16, fp16) {
  std::uint32_t seed = 900;
  std::mt19937_64 rng(23);
  const auto words = [&](std::size_t len) { return summed_words(rng, len); };
  std::size_t checked = 0;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{1003}})
    for (std::size_t off : offsets) {
      const std::size_t len = n + off;
      const std::vector<G> g = inputs<G>(len, ++seed);
      int own = -1;
      for (const G& x : g) own = std::max(own, binned::summary_of(static_cast<float>(x)).bin);
      if (own < 0) continue;
      // (cut top, store top): no store, equal, the store below by 1, 2, 3+, the cut above the values'.
      const std::pair<int, int> tops[] = {{own, -1},          {own + 1, -1},  {own, own},        {own, own - 1},
                                          {own + 1, own - 1}, {own + 3, own}, {own + 1, own + 1}};
      for (auto [top, store_top] : tops) {
        if (store_top > top || top > 8) continue;
        const std::string name = "to_bins rounding " + std::to_string(top) + "," + std::to_string(store_top);
        const std::vector<std::int64_t> s0 = words(len), s1 = words(len), s2 = words(len);
        check_rule(name, elementwise::to_bins_rounding_rule{top, store_top}, n, off,
                   std::tuple{g, s0, s1, s2, std::vector<float>(len, -1.0f)},
                   {in_mode, in_mode, in_mode, in_mode, out_mode});
        std::size_t wrong = 0;
        for (std::size_t j = 0; j < len; ++j) {
          float once = 0.0f, twice = 0.0f;
          elementwise::to_bins_rounding_rule{top, store_top}(0, g.data() + j, s0.data() + j, s1.data() + j,
                                                             s2.data() + j, &once);
          std::int64_t w0, w1, w2;
          if (store_top < 0)
            elementwise::to_bins_rule{top}(0, g.data() + j, &w0, &w1, &w2);
          else
            elementwise::to_bins_adding_rule{top, store_top}(0, g.data() + j, s0.data() + j, s1.data() + j,
                                                             s2.data() + j, &w0, &w1, &w2);
          elementwise::round_bins_rule{top}(0, &twice, &w0, &w1, &w2);
          wrong += std::bit_cast<std::uint32_t>(once) != std::bit_cast<std::uint32_t>(twice);
          ++checked;
        }
        CHECK_MESSAGE(wrong == 0, name);
      }
    }
  CHECK(checked > 1000);
}

// The owner's cut and sum of N ranks' values (the reduce that exchanges values): the packed loop
// against the rule at every level, and the rule against what it stands for, each rank's cut merged
// into the store one after the other (the words a reduce-scatter would have summed), then rounded.
TEST_CASE_TEMPLATE("host loops: the binned cut and sum of N slices equals the slices' cuts merged into the store", G,
                   float, bf16, fp16) {
  std::uint32_t seed = 1200;
  std::mt19937_64 rng(29);
  const auto words = [&](std::size_t len) { return summed_words(rng, len); };
  std::size_t checked = 0;
  for (std::size_t ranks : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{8}})
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{1003}}) {
      std::vector<std::vector<G>> values;
      int own = -1;
      for (std::size_t r = 0; r < ranks; ++r) {
        values.push_back(inputs<G>(n, ++seed));
        for (const G& x : values.back()) own = std::max(own, binned::summary_of(static_cast<float>(x)).bin);
      }
      if (own < 0) continue;
      std::vector<const G*> slices;
      for (const auto& v : values) slices.push_back(v.data());
      // (cut top, store top): no store, equal, the store below by 1 and 3+, the cut above the values',
      // and below them (their bits above the top bin drop, as the cut's rule drops them).
      const std::pair<int, int> tops[] = {{own, -1},          {own, own},         {own, own - 1},
                                          {own + 1, own - 3}, {own + 1, own + 1}, {own - 1, -1}};
      for (auto [top, store_top] : tops)
        for (bool round : {false, true}) {
          if (store_top > top || top > 8 || top < 0) continue;
          const std::string name = "cut sum of " + std::to_string(ranks) + " top " + std::to_string(top) + "," +
                                   std::to_string(store_top) + (round ? " rounded" : "");
          const std::vector<std::int64_t> s0 = words(n), s1 = words(n), s2 = words(n);
          // The reference: the store (re-expressed for top; empty: zeros), each slice's cut added in turn.
          std::vector<std::int64_t> e0(n), e1(n), e2(n);
          std::vector<float> rounded_ref(n);
          for (std::size_t j = 0; j < n; ++j) {
            std::int64_t w[binned::words] = {s0[j], s1[j], s2[j]};
            binned::realign(w, store_top, top);
            for (std::size_t r = 0; r < ranks; ++r) {
              std::int64_t c0, c1, c2;
              elementwise::to_bins_rule{top}(0, values[r].data() + j, &c0, &c1, &c2);
              elementwise::merge_bins_rule{top, top, top}(0, &w[0], &w[1], &w[2], &c0, &c1, &c2);
            }
            e0[j] = w[0], e1[j] = w[1], e2[j] = w[2];
            elementwise::round_bins_rule{top}(0, &rounded_ref[j], &w[0], &w[1], &w[2]);
          }
          for (hl::isa level : isa_levels::available()) {
            const isa_levels::cap_guard g(level);
            std::vector<std::int64_t> t0 = s0, t1 = s1, t2 = s2;
            std::vector<float> out(n, -1.0f);
            sys::host::for_each_index(
                n, elementwise::binned_cut_sum_rule<G>{slices.data(), ranks, top, store_top, t0.data(), t1.data(),
                                                       t2.data(), round ? out.data() : nullptr});
            INFO(name, " n=", n, " level=", std::string(hl::name(level)));
            if (round) {
              CHECK(std::memcmp(out.data(), rounded_ref.data(), n * sizeof(float)) == 0);
              CHECK((t0 == s0 && t1 == s1 && t2 == s2));  // the store is only read
            } else {
              CHECK((t0 == e0 && t1 == e1 && t2 == e2));
            }
            checked += n;
          }
        }
    }
  CHECK(checked > 10000);
}

#if defined(ZERO_HOST_SIMD)
// The rounded cut and sum without a store (a unit's only reduce, or its second with the first one's
// values held) runs in doubles where a lane's values are whole at the cut and span few enough binades
// for the double sum to be exact (host_binned's sum_in_doubles), else as words. Values drawn so that
// lanes fall on both sides of each bound: fields within bands of 0 (subnormals) to 254 (sums past
// the largest float), spans at and around 29 - ceil(log2 count), zeros of both signs, exact
// cancellations, a double rounding's trap, values below the cut; tops at and above the values'. Every level gives the
// rule's bits, and the MXCSR state of the caller changes none of them.
TEST_CASE_TEMPLATE("host loops: the rounded cut and sum without a store equals the rule, in doubles or in words", G,
                   float, bf16, fp16) {
  std::mt19937 rng(41);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const unsigned saved = _mm_getcsr();
  std::size_t checked = 0, lanes_in_span = 0;
  for (std::size_t count : {1, 2, 3, 4, 5, 8, 16})
    for (int band : {0, 60, 120, 150, 170, 185, 200, 224}) {
      int log2_count = 0;
      while ((std::size_t{1} << log2_count) < count) ++log2_count;
      const int span = 29 - log2_count;
      const std::size_t n = 203;
      std::vector<std::vector<G>> values(count, std::vector<G>(n));
      const auto set = [&](std::size_t r, std::size_t j, std::uint32_t bits) {
        values[r][j] = from_float<G>(__builtin_bit_cast(float, bits));
      };
      const auto sign = [&] { return uniform(0, 1) ? 0x80000000u : 0u; };
      // By packs of 8 lanes (the widest pack's): every lane within the span, worst cases at and past
      // it (count - 1 full significands at the top field, one lowest bit at the bottom, one sign),
      // zeros and cancellations, double rounding traps, or spans drawn per lane.
      for (std::size_t first = 0; first < n; first += 8) {
        const int mode = uniform(0, 4);
        for (std::size_t j = first; j < std::min(n, first + 8); ++j) {
          const int spread =
              mode == 1 ? span + uniform(0, 2)
              : mode == 0
                  ? std::array{0, 3, span - 1, span}[static_cast<std::size_t>(uniform(0, 3))]
                  : std::array{0, 3, span - 1, span, span + 1, span + 2}[static_cast<std::size_t>(uniform(0, 5))];
          const int base = std::min(band + uniform(0, 30), 254 - spread);
          lanes_in_span += spread <= span;
          const std::uint32_t s = sign();
          for (std::size_t r = 0; r < count; ++r) {
            const auto random_bits = [&](int field) {
              return static_cast<std::uint32_t>(field) << 23 | (static_cast<std::uint32_t>(rng()) & 0x7fffffu) | sign();
            };
            if (mode == 4) {
              // A double rounding's trap: 2^E + 2^(E-24) (a float's midpoint) + 2^(E-54), the last from
              // -2^(E-31) + (2^(E-31) + 2^(E-54)); rounded to double first, it would fall on the
              // midpoint and round to even, down, where the rule rounds up. Its span is 31 fields.
              const std::uint32_t f = static_cast<std::uint32_t>(std::max(base, 32));
              const std::uint32_t trap[] = {f << 23, (f - 24) << 23, 0x80000000u | (f - 31) << 23, (f - 31) << 23 | 1u};
              set(r, j, r < 4 && count >= 4 ? s ^ trap[r] : 0u);
            } else if (mode == 1)
              set(r, j,
                  r + 1 < count ? s | static_cast<std::uint32_t>(base + spread) << 23 | 0x7fffffu
                                : s | static_cast<std::uint32_t>(base) << 23 | 1u |
                                      (static_cast<std::uint32_t>(rng()) & 0x7ffffeu));
            else if (mode == 2)
              set(r, j,
                  r % 2 == 1 && uniform(0, 1)
                      ? __builtin_bit_cast(std::uint32_t, static_cast<float>(values[r - 1][j])) ^ 0x80000000u
                  : uniform(0, 3) ? sign()
                                  : random_bits(base));
            else if (uniform(0, 19) == 0)
              set(r, j, sign());  // a zero of either sign
            else
              set(r, j, random_bits(r == 0 ? base + spread : base + uniform(0, spread)));  // the lane's span reached
          }
        }
      }
      int own = -1;
      std::vector<const G*> slices;
      for (const auto& v : values) {
        slices.push_back(v.data());
        for (const G& x : v) own = std::max(own, binned::summary_of(static_cast<float>(x)).bin);
      }
      for (int top : {own, own + 1, own + 2}) {
        if (own < 0 || top > 8) continue;
        std::vector<float> expected(n);
        for (std::size_t j = 0; j < n; ++j) {
          std::int64_t w[binned::words] = {0, 0, 0};
          for (std::size_t r = 0; r < count; ++r) {
            std::int64_t c[binned::words];
            binned::to_words(static_cast<float>(values[r][j]), top, c);
            for (int k = 0; k < binned::words; ++k) w[k] += c[k];
          }
          expected[j] = binned::round<float>(w, top);
        }
        for (unsigned csr : {saved, 0x1f80u | 0x8000u | 0x0040u | 0x6000u})  // and FTZ, DAZ, toward zero
          for (hl::isa level : isa_levels::available()) {
            const isa_levels::cap_guard g(level);
            std::vector<std::int64_t> unused(n, 7);
            std::vector<float> out(n, -1.0f);
            _mm_setcsr(csr);
            sys::host::for_each_index(
                n, elementwise::binned_cut_sum_rule<G>{slices.data(), count, top, -1, unused.data(), unused.data(),
                                                       unused.data(), out.data()});
            const unsigned after = _mm_getcsr();
            _mm_setcsr(saved);
            INFO("count ", count, " band ", band, " top ", top, " mxcsr ", csr, " level ",
                 std::string(hl::name(level)));
            CHECK(after == csr);
            CHECK(std::memcmp(out.data(), expected.data(), n * sizeof(float)) == 0);
            CHECK(unused == std::vector<std::int64_t>(n, 7));
            checked += n;
          }
      }
    }
  CHECK(checked > 50000);
  CHECK(lanes_in_span > 1000);
}

// The packed cut and rounding compute in doubles, which MXCSR's denormals-are-zero, flush-to-zero and
// rounding mode would change: they run under the IEEE default and give the rules' bits (integers only)
// whatever state the caller's thread is in, which they leave as it was.
TEST_CASE("host loops: the binned cut and rounding keep their bits under any MXCSR state, which they restore") {
  const unsigned saved = _mm_getcsr();
  const unsigned hostile = 0x1f80u | 0x8000u | 0x0040u | 0x6000u;  // flush-to-zero, denormals-are-zero, toward zero
  std::mt19937_64 rng(5);
  const auto small_words = [&](std::size_t len) {  // the digits of sums of a few terms: the double path's inputs
    std::vector<std::int64_t> v(len);
    for (auto& x : v) x = static_cast<std::int64_t>(rng() >> 30) - (std::int64_t{1} << 33);
    return v;
  };
  _mm_setcsr(hostile);
  for (std::size_t n : {std::size_t{33}, std::size_t{1003}}) {
    const std::vector<float> g = inputs<float>(n, 77 + static_cast<std::uint32_t>(n));  // subnormals among them
    for (int top : {0, 1}) {  // where subnormals' bits are kept, and sums round to subnormals
      const std::vector<std::int64_t> w(n, 0);
      check_rule("to_bins under DAZ top " + std::to_string(top), elementwise::to_bins_rule{top}, n, 0,
                 std::tuple{g, w, w, w}, {in_mode, out_mode, out_mode, out_mode});
      check_rule("round under FTZ top " + std::to_string(top), elementwise::round_bins_rule{top}, n, 0,
                 std::tuple{std::vector<float>(n, -1.0f), small_words(n), small_words(n), small_words(n)},
                 {out_mode, in_mode, in_mode, in_mode});
    }
  }
  const unsigned after = _mm_getcsr();
  _mm_setcsr(saved);
  CHECK((after & ~0x3fu) == (hostile & ~0x3fu));  // the caller's mode bits back (the exception flags are sticky)
}
#endif

TEST_CASE("host loops: the binned merge equals the per-element rule bit for bit") {
  std::mt19937_64 rng(7);
  const auto words = [&](std::size_t len) {
    std::vector<std::int64_t> v(len);
    for (auto& x : v) x = static_cast<std::int64_t>(rng() >> 20) - (std::int64_t{1} << 43);
    return v;
  };
  // (store top, incoming top): equal (the common case), either one empty, either one lower, by 1, 2, 3+.
  const std::pair<int, int> tops[] = {{4, 4}, {-1, 4}, {4, -1}, {3, 4}, {4, 3}, {2, 4}, {4, 2}, {0, 6}, {7, 1}};
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{17}, std::size_t{1003}})
    for (std::size_t off : offsets)
      for (auto [st, in] : tops) {
        const std::size_t len = n + off;
        check_rule("merge " + std::to_string(st) + "," + std::to_string(in),
                   elementwise::merge_bins_rule{st, in, std::max(st, in)}, n, off,
                   std::tuple{words(len), words(len), words(len), words(len), words(len), words(len)},
                   {inout_mode, inout_mode, inout_mode, in_mode, in_mode, in_mode});
      }
}

TEST_CASE("host loops: the binned rounding equals the per-element rule bit for bit") {
  std::mt19937_64 rng(11);
  // Words of every size up to 2^61 with either sign, and small ones (0, ±1, ±2^31, 2^32 - 1) that
  // make exact ties, carries between words, cancellations to zero and sums that need a borrow.
  const auto word = [&]() -> std::int64_t {
    const std::int64_t small[] = {0,
                                  1,
                                  -1,
                                  std::int64_t{1} << 31,
                                  -(std::int64_t{1} << 31),
                                  (std::int64_t{1} << 32) - 1,
                                  -(std::int64_t{1} << 32)};
    if (rng() % 3 == 0) return small[rng() % 7];
    const auto v = static_cast<std::int64_t>(rng() >> (3 + rng() % 61));
    return rng() % 2 ? v : -v;
  };
  const auto words = [&](std::size_t len) {
    std::vector<std::int64_t> v(len);
    for (auto& x : v) x = word();
    return v;
  };
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{2003}})
    for (std::size_t off : offsets)
      for (int top : {0, 1, 2, 4, 7, 8}) {  // subnormal results at the low tops, overflow at the high ones
        const std::size_t len = n + off;
        check_rule("round top " + std::to_string(top), elementwise::round_bins_rule{top}, n, off,
                   std::tuple{std::vector<float>(len, -1.0f), words(len), words(len), words(len)},
                   {out_mode, in_mode, in_mode, in_mode});
      }
}

TEST_CASE_TEMPLATE("host loops: the binned summaries equal the plain loop's at every level", G, float, bf16, fp16) {
  // The plain loop the summaries ran before their packed form: the largest finite magnitude's bits and
  // the non-finite flags, one value at a time.
  const auto reference = [](const std::vector<const G*>& segs, const std::vector<std::size_t>& sizes, bool divide,
                            float divisor) {
    std::uint32_t largest = 0, infinite = 0, nan = 0;
    for (std::size_t k = 0; k < segs.size(); ++k)
      for (std::size_t j = 0; j < sizes[k]; ++j) {
        const float x = static_cast<float>(segs[k][j]);
        const std::uint32_t a = __builtin_bit_cast(std::uint32_t, divide ? fp::div(x, divisor) : x) & 0x7fffffffu;
        infinite |= a == 0x7f800000u;
        nan |= a > 0x7f800000u;
        if (a < 0x7f800000u && a > largest) largest = a;
      }
    return std::array<std::uint32_t, 3>{largest, infinite, nan};
  };
  std::uint32_t seed = 500;
  for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{16}, std::size_t{31}, std::size_t{1003}})
    for (int finite_only : {0, 1}) {
      std::vector<G> a = inputs<G>(n, ++seed), b = inputs<G>(n / 2 + 5, ++seed);
      if (finite_only)  // so that the largest magnitude, not only the flags, decides
        for (auto* v : {&a, &b})
          for (auto& x : *v)
            if (!std::isfinite(static_cast<float>(x))) x = from_float<G>(0.5f);
      const std::vector<const G*> segs = {a.data(), b.data()};
      const std::vector<std::size_t> sizes = {a.size(), b.size()};
      for (hl::isa level : isa_levels::available()) {
        const isa_levels::cap_guard guard(level);
        INFO("n=", n, " level=", std::string(hl::name(level)));
        for (float divisor : {1.0f, 3.0f, 1e-30f}) {
          const auto r = reference(segs, sizes, true, divisor);
          const auto s = sys::host::largest_magnitude(segs.data(), sizes.data(), 2, true, divisor);
          CHECK(__builtin_bit_cast(std::uint32_t, s.largest) == r[0]);
          CHECK(s.flags == ((r[1] ? binned::summary::infinite : 0u) | (r[2] ? binned::summary::not_a_number : 0u)));
        }
        const auto r = reference({a.data()}, {a.size()}, false, 1.0f);
        const binned::summary s = binned::unpack(sys::host::binned_summary(a.data(), a.size()));
        CHECK(s.flags == ((r[1] ? binned::summary::infinite : 0u) | (r[2] ? binned::summary::not_a_number : 0u)));
        if (!(r[1] | r[2])) CHECK(s.bin == binned::summary_of(__builtin_bit_cast(float, r[0])).bin);
      }
    }
}

TEST_CASE_TEMPLATE("host loops: the squares' binned digits equal the per-element cut at every level", G, float, bf16,
                   fp16) {
  // The per-element form: each square (in double) cut by binned::to_words below `top`, its words below
  // the top added up; and the gradient norm's sum of squares as it was, carried every 2^30 terms.
  const auto reference = [](const G* g, std::size_t n, bool divide, float divisor, int top) {
    std::array<std::int64_t, binned::words> d{};
    for (std::size_t j = 0; j < n; ++j) {
      const float x = static_cast<float>(g[j]);
      const double y = divide ? fp::div(x, divisor) : x;
      std::int64_t w[binned::words + 1];
      binned::to_words(y * y, top, w);
      CHECK(w[0] == 0);
      for (int k = 0; k < binned::words; ++k) d[static_cast<std::size_t>(k)] += w[k + 1];
    }
    return d;
  };
  std::uint32_t seed = 900;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{33}, std::size_t{2003}}) {
    std::vector<G> a = inputs<G>(n, ++seed);
    for (auto& x : a)  // finite values only: the summary's flags decide a sum with others
      if (!std::isfinite(static_cast<float>(x))) x = from_float<G>(-0.75f);
    for (float divisor : {1.0f, 3.0f, 1e-30f}) {
      const G* seg = a.data();
      const sys::host::magnitude_summary m = sys::host::largest_magnitude(&seg, &n, 1, true, divisor);
      if (!m.finite() || m.largest == 0.0f) continue;  // (a division that overflows: the flags decide)
      const int least = binned::summary_of(static_cast<double>(m.largest) * m.largest).bin + 1;
      for (int top : {least, least + 1, least + 2, least + 5}) {
        const auto r = reference(a.data(), n, true, divisor, top);
        for (hl::isa level : isa_levels::available()) {
          const isa_levels::cap_guard guard(level);
          INFO("n=", n, " divisor=", divisor, " top=", top, " level=", std::string(hl::name(level)));
          std::int64_t d[binned::words] = {};
          sys::host::binned_square_digits(a.data(), n, true, divisor, top, d);
          for (int k = 0; k < binned::words; ++k) CHECK(d[k] == r[static_cast<std::size_t>(k)]);
          std::int64_t words[binned::words + 1] = {}, expected[binned::words + 1] = {0, r[0], r[1], r[2]};
          binned::carry(expected);
          sys::host::binned_sum_of_squares(&seg, &n, 1, divisor, top, words);
          for (int k = 0; k <= binned::words; ++k) CHECK(words[k] == expected[k]);
        }
      }
    }
  }
}

// The memory the loops run on: sys::host::allocate's arrays of 2 MiB or more start on a 2 MiB boundary
// and, where the kernel gives transparent huge pages on advice, are eligible for them; smaller ones are
// cache-line aligned. Every byte asked for is usable and freed with the size it was asked with.
namespace {

// (An empty vector's data() may be null, which memcmp must not be given, even for 0 bytes.)
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A rows x cols matrix of values that make the products' edge cases: random values, -0 often (a product
// -0 is added to a sum), one row (or, with `by_column`, one column) of the special floats (NaNs with
// payloads, infinities, subnormals, the largest finite) and one of values near 2^127 (sums that overflow),
// the rest of the results ordinary sums.
std::vector<float> product_operand(std::size_t rows, std::size_t cols, std::uint32_t seed, bool by_column) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  const std::vector<float> special = special_floats();
  std::vector<float> v(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      float x = val(rng);
      if (pick(rng) == 0) x = -0.0f;
      const std::size_t line = by_column ? j : i, lines = by_column ? cols : rows;
      if (line == 3 % lines) x = std::ldexp(x, 127);  // sums past the largest float: infinities
      if (line == 1 % lines) x = special[(i + j + seed) % special.size()];
      v[i * cols + j] = x;
    }
  return v;
}

using testing::threads_runner;

}  // namespace

TEST_CASE("host products: the blocked, packed products give the order's bits at every level, block and thread split") {
  // n x k x m. The tiles are 8 x 32 (AVX-512), 6 x 16 (AVX2), 6 x 8 (SSE2), 4 x 4 (scalar); blocks of
  // kc = 256 values of q and nc = 512 columns: shapes below, at and past each, k = 0 (every sum empty:
  // +0) and empty results.
  struct shape {
    std::size_t n, k, m;
  };
  const shape shapes[] = {{1, 1, 1},     {3, 5, 2},      {3, 1, 5},      {17, 33, 9},  {8, 256, 32}, {9, 257, 33},
                          {13, 7, 100},  {7, 300, 1},    {1, 300, 600},  {6, 255, 17}, {50, 0, 3},   {0, 5, 5},
                          {5, 5, 0},     {64, 256, 64},  {16, 512, 512}, {25, 513, 545}, {49, 97, 1030}};
  for (const shape s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.k);
    CAPTURE(s.m);
    const std::vector<float> a = product_operand(s.n, s.k, 1 + static_cast<std::uint32_t>(s.n * 7 + s.k), false);
    const std::vector<float> b = product_operand(s.k, s.m, 2 + static_cast<std::uint32_t>(s.m * 5 + s.k), true);
    std::vector<float> want(s.n * s.m, 1.0f);
    optim::newton_schulz::ordered_products{}.multiply(a.data(), b.data(), want.data(), s.n, s.k, s.m);
    for (hl::isa level : isa_levels::available()) {
      CAPTURE(hl::name(level));
      const isa_levels::cap_guard g(level);
      for (int parts : {1, 2, 3}) {
        CAPTURE(parts);
        // min_parallel_madds 0: every product goes through the runner, small ones included.
        const sys::host_products<threads_runner> products{threads_runner{parts}, 0};
        std::vector<float> c(s.n * s.m, 7.0f);  // every element written, whatever C held
        products.multiply(a.data(), b.data(), c.data(), s.n, s.k, s.m);
        CHECK(same_bits(c, want));
      }
      // Blocks smaller than the tiles and than the shapes: every kc and nc boundary crossed, partial sums
      // stored and reloaded many times.
      for (const sys::host_gemm::blocking blk : {sys::host_gemm::blocking{1, 1}, sys::host_gemm::blocking{5, 40},
                                                  sys::host_gemm::blocking{64, 100}}) {
        CAPTURE(blk.kc);
        std::vector<float> c(s.n * s.m, 7.0f);
        sys::host_gemm::multiply_rows(level, a.data(), b.data(), c.data(), s.k, s.m, 0, s.n, blk);
        CHECK(same_bits(c, want));
      }
    }
  }
}

TEST_CASE("host products: a product's result holds ordinary sums and every kind of special value") {
  // The operands of the test above make results of each kind; a check that they do (else it would
  // compare NaN with NaN and little else).
  const std::size_t n = 25, k = 513, m = 545;
  const std::vector<float> a = product_operand(n, k, 3, false), b = product_operand(k, m, 4, true);
  std::vector<float> c(n * m);
  optim::newton_schulz::ordered_products{}.multiply(a.data(), b.data(), c.data(), n, k, m);
  std::size_t nan = 0, inf = 0, finite = 0;
  for (float x : c) (x != x ? nan : std::isinf(x) ? inf : finite) += 1;
  CHECK(nan > 0);
  CHECK(inf > 0);
  CHECK(finite > c.size() / 2);
  MESSAGE("NaN ", nan, ", inf ", inf, ", finite ", finite);
}

TEST_CASE("sys::host::allocate: large arrays on huge-page boundaries, advised as huge pages") {
  using host = sys::host;
  for (std::size_t bytes : {std::size_t{64}, std::size_t{4096}, host_pages::huge_bytes - 64, host_pages::huge_bytes,
                            host_pages::huge_bytes * 3 + 4096}) {
    INFO("bytes=", bytes);
    auto* p = static_cast<unsigned char*>(host::allocate(bytes));
    REQUIRE(p != nullptr);
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    CHECK(address % host::alignment == 0);
    if (bytes >= host_pages::huge_bytes) CHECK(address % host_pages::huge_bytes == 0);
    std::memset(p, 0xab, bytes);
    CHECK(p[bytes - 1] == 0xab);
    if (bytes >= host_pages::huge_bytes) {
      // The kernel's THP mode decides whether advice is taken ("[always] madvise never" marks it).
      std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
      std::string modes;
      std::getline(mode, modes);
      std::ifstream smaps("/proc/self/smaps");
      if (smaps && (modes.find("[madvise]") != std::string::npos || modes.find("[always]") != std::string::npos)) {
        // The mapping that holds p, and its THPeligible line.
        std::string line;
        bool inside = false;
        int eligible = -1;
        while (std::getline(smaps, line)) {
          unsigned long long lo = 0, hi = 0;
          if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
            inside = lo <= address && address < hi;
            continue;
          }
          if (inside && line.rfind("THPeligible:", 0) == 0) eligible = std::atoi(line.c_str() + 12);
        }
        if (eligible != -1) CHECK(eligible == 1);
      }
    }
    host::deallocate(p, bytes);
  }
  CHECK(host::allocate(0) == nullptr);
  host::deallocate(nullptr, 0);
}

TEST_CASE("sys::host::allocate: a freed large block serves the next allocation of its size; a miss frees every kept block") {
  using host = sys::host;
  if (!host_pages::keeps_spares) return;  // (AddressSanitizer: every block really freed)
  host_pages::release_spares();
  // From spare_least_bytes on (where the C library maps blocks and unmaps them on free) a freed block
  // is kept, below it never.
  void* least = host::allocate(host_pages::spare_least_bytes);
  host::deallocate(least, host_pages::spare_least_bytes);
  CHECK(host_pages::spare_bytes() == host_pages::spare_least_bytes);
  void* below = host::allocate(host_pages::spare_least_bytes - 64);
  host::deallocate(below, host_pages::spare_least_bytes - 64);
  CHECK(host_pages::spare_bytes() == host_pages::spare_least_bytes);
  CHECK(host::allocate(host_pages::spare_least_bytes) == least);
  host::deallocate(least, host_pages::spare_least_bytes);
  host_pages::release_spares();
  const std::size_t big = host_pages::huge_bytes * 2, other = host_pages::huge_bytes * 3;
  void* a = host::allocate(big);
  host::deallocate(a, big);
  CHECK(host_pages::spare_bytes() == big);
  void* b = host::allocate(big);
  CHECK(b == a);  // reused, not faulted in again
  CHECK(host_pages::spare_bytes() == 0);
  host::deallocate(b, big);
  // Another size finds none: kept blocks of at least its size go back first (here the one, smaller),
  // so the thread never holds more than its peak.
  void* c = host::allocate(other);
  CHECK(host_pages::spare_bytes() == 0);
  host::deallocate(c, other);
  host_pages::release_spares();
  // At most spare_blocks::count kept, the oldest freed first; small blocks are never kept.
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < host_pages::detail::spare_blocks::count + 2; ++i) blocks.push_back(host::allocate(big));
  for (void* p : blocks) host::deallocate(p, big);
  CHECK(host_pages::spare_bytes() == host_pages::detail::spare_blocks::count * big);
  void* small = host::allocate(4096);
  host::deallocate(small, 4096);
  CHECK(host_pages::spare_bytes() == host_pages::detail::spare_blocks::count * big);
  // The most recently freed comes back first.
  void* last = host::allocate(big);
  CHECK(last == blocks.back());
  host::deallocate(last, big);
  // A miss of 3 huge pages gives back the two oldest kept blocks (4 pages), no more.
  void* c2 = host::allocate(other);
  CHECK(host_pages::spare_bytes() == (host_pages::detail::spare_blocks::count - 2) * big);
  host::deallocate(c2, other);
  host_pages::release_spares();
  CHECK(host_pages::spare_bytes() == 0);
}

