// The element-wise rules of the engine, written once (ZERO_HD functors) for every system's one loop:
// sys::host::for_each and the device launcher.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "zero/config.hpp"
#include "zero/core/binned.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/numeric.hpp"
#include "zero/core/simd_lanes.hpp"

namespace zero::elementwise {

// ---- operands ----------------------------------------------------------------------------------

// One array a rule reads and/or writes, never null: an absent array is a different rule, so that on
// a device the rule's arrays are always a chunk's registers, never a pointer chosen at run time.
// The flags tell a device loop what to load and store; a host loop hands `data` to the rule.
template <class T>
struct operand {
  T* data;
  bool read, write;
};
template <class T>
operand<const T> in(const T* p) {
  return {p, true, false};
}
template <class T>
operand<T> out(T* p) {
  return {p, false, true};
}
template <class T>
operand<T> inout(T* p) {
  return {p, true, true};
}

// ---- element access ----------------------------------------------------------------------------

// A rule is written once over a value type V: float (element j) or, in the host loop, simd::pack<W>
// (elements j..j+W-1, core/simd.hpp), whose operations are the same IEEE ones lane by lane.
// load: the element(s) widened to float, exactly as static_cast<float>(a[j]).
template <class V, class T>
ZERO_HD inline V load(const T* a, std::size_t j) {
  if constexpr (std::is_same_v<V, float>) return static_cast<float>(a[j]);
#if defined(ZERO_HOST_SIMD)
  else return simd::load_lanes<V::width>(a + j);
#endif
}
// store: the value(s) written as store_as<T> does (rounded to T, every NaN canonical).
template <class T, class V>
ZERO_HD inline void store(T* a, std::size_t j, V x) {
  if constexpr (std::is_same_v<V, float>) a[j] = store_as<T>(x);
#if defined(ZERO_HOST_SIMD)
  else simd::store_lanes<V::width>(a + j, x);
#endif
}

// store of a float value that is already canonical (fp::canonical applied): its bits as they are, so
// a rule that keeps the canonical value (to write a parameter copy from it) does not pay the NaN
// check twice.
template <class V>
ZERO_HD inline void store_canonical(float* a, std::size_t j, V x) {
  if constexpr (std::is_same_v<V, float>) a[j] = x;
#if defined(ZERO_HOST_SIMD)
  else x.store(a + j);
#endif
}

// Whether optimizer Opt's update rule is written over a value type (a template, as optim::sgd,
// adamw and lion): then the host loop runs it on packs. An optimizer written for float only still
// works everywhere; the host runs it one element at a time.
template <class Opt, class V>
concept update_over = requires(const typename Opt::step_constants& c, V& w, V g, V* s) { Opt::update(c, w, g, s); };

// ---- rules -------------------------------------------------------------------------------------
// A rule is called as rule(j, arrays...) for each element j in [0, n), with the operands' arrays in
// the order they were passed to the system's for_each. It touches element j only, so any loop (in
// order, vectorized, a grid of device threads) computes the same bits. Every value stored is
// NaN-canonical (store_as), so a step that produces a NaN stores the same bits on every system.
// rule.apply<V>(j, arrays...) is the same step on value type V (see load above); rule(j, ...) is
// apply<float>. Calls are unqualified (with `using namespace zero::fp`) so that a pack's operations
// are found by argument-dependent lookup.

// How the update divides the gradient by N x loss scale. Where the divisor is a normal power of two whose
// reciprocal is a normal float (the loss scale always is a power of two, N often; a divisor of 1
// is one), by a multiplication with that exact reciprocal: x / 2^k and x * 2^-k are the same real
// number, rounded once, so the bits are those of the division, at the cost of a multiply. Any other
// divisor: one IEEE division. Built from the divisor on the host, where the rule is made.
struct gradient_divisor {
  float value = 1.0f;
  float inverse = 1.0f;
  bool by_inverse = true;
  // Implicit: a rule is built from the divisor as a float ({c, divisor, coef}).
  constexpr gradient_divisor(float d = 1.0f) : value(d) {  // NOLINT(google-explicit-constructor)
    const auto bits = std::bit_cast<std::uint32_t>(d);
    const std::uint32_t e = bits >> 23;  // the sign (0 for a positive divisor) and the exponent field
    // 2^(e - 127) with a zero significand; its reciprocal 2^(127 - e) is normal for e in [1, 253].
    by_inverse = (bits & 0x7fffffu) == 0 && e >= 1 && e <= 253;
    inverse = by_inverse ? std::bit_cast<float>((254u - e) << 23) : 0.0f;
  }
  template <class V>
  ZERO_HD V divide(V x) const {
    using namespace zero::fp;
    return by_inverse ? mul(x, V(inverse)) : div(x, V(value));
  }
};

// The optimizer step without a separate parameter copy (the master weights are the parameters):
// the averaged, unscaled (and clipped) gradient, then the optimizer's rule on the master weight and
// its slots. The gradient is divided by N x loss scale (gradient_divisor: the bits of one IEEE
// division).
// Arrays: gradient g, master weights w, then one array per optimizer slot.
template <class Opt>
struct update_in_place_rule {
  typename Opt::step_constants c;
  gradient_divisor divisor;
  float coef;

  template <class G, class... Slots>
  ZERO_HD void operator()(std::size_t j, const G* g, float* w, Slots*... slots) const {
    (void)step<float>(j, g, w, slots...);
  }
  template <class V, class G, class... Slots>
    requires update_over<Opt, V>
  ZERO_HD void apply(std::size_t j, const G* g, float* w, Slots*... slots) const {
    (void)step<V>(j, g, w, slots...);
  }

  // The step on element(s) j; returns the new (canonical) master weight.
  template <class V, class G, class... Slots>
  ZERO_HD V step(std::size_t j, const G* g, float* w, Slots*... slots) const {
    static_assert(sizeof...(Slots) == static_cast<std::size_t>(Opt::slots), "one array per optimizer slot");
    using namespace zero::fp;
    V gj = divisor.divide(load<V>(g, j));
    if (coef != 1.0f) gj = mul(gj, V(coef));
    V s[Opt::slots > 0 ? Opt::slots : 1] = {load<V>(slots, j)...};
    V wj = load<V>(w, j);
    Opt::update(c, wj, gj, s);
    wj = canonical(wj);
    store_canonical(w, j, wj);
    int k = 0;
    (store(slots, j, s[k++]), ...);
    return wj;
  }
};

// The same with a separate parameter copy p, written from the new master weight.
// Arrays: gradient g, master weights w, parameters p, then one array per optimizer slot.
template <class Opt>
struct update_rule : update_in_place_rule<Opt> {
  template <class G, class P, class... Slots>
  ZERO_HD void operator()(std::size_t j, const G* g, float* w, P* p, Slots*... slots) const {
    store(p, j, this->template step<float>(j, g, w, slots...));
  }
  template <class V, class G, class P, class... Slots>
    requires update_over<Opt, V>
  ZERO_HD void apply(std::size_t j, const G* g, float* w, P* p, Slots*... slots) const {
    store(p, j, this->template step<V>(j, g, w, slots...));
  }
};

// ---- a tensor-wise optimizer's element-wise passes (concepts/optimizer_state.hpp) -------------
// Whether optimizer Opt's passes are written over a value type (templates, as optim::lamb).
template <class Opt, class V>
concept tensorwise_over = requires(const typename Opt::step_constants& c, V& w, V g, V* s, float f) {
  Opt::advance(c, static_cast<const V&>(w), g, s);
  Opt::apply(c, f, w, static_cast<const V*>(s));
};

// The first pass: the slots advanced from the averaged, unscaled (and clipped) gradient, as
// update_in_place_rule forms it. Arrays: gradient g, master weights w (read), then one per slot.
template <class Opt>
struct advance_rule {
  typename Opt::step_constants c;
  gradient_divisor divisor;
  float coef;

  template <class G, class... Slots>
  ZERO_HD void operator()(std::size_t j, const G* g, const float* w, Slots*... slots) const {
    step<float>(j, g, w, slots...);
  }
  template <class V, class G, class... Slots>
  requires tensorwise_over<Opt, V> ZERO_HD void apply(std::size_t j, const G* g, const float* w,
                                                      Slots*... slots) const {
    step<V>(j, g, w, slots...);
  }
  // Element j's slots (a[0..slots), read and written) advanced into s from its averaged gradient and
  // its weight, which it returns: the first pass of every rule below that also takes the norm terms.
  template <class V, class G>
  ZERO_HD V advance_into(std::size_t j, const G* g, const float* w, float* const* a, V* s) const {
    using namespace zero::fp;
    V gj = divisor.divide(load<V>(g, j));
    if (coef != 1.0f) gj = mul(gj, V(coef));
    for (int k = 0; k < Opt::slots; ++k) s[k] = load<V>(a[k], j);
    const V wj = load<V>(w, j);
    Opt::advance(c, wj, gj, s);
    for (int k = 0; k < Opt::slots; ++k) store(a[k], j, s[k]);
    return wj;
  }
  template <class V, class G, class... Slots>
  ZERO_HD void step(std::size_t j, const G* g, const float* w, Slots*... slots) const {
    static_assert(sizeof...(Slots) == static_cast<std::size_t>(Opt::slots), "one array per optimizer slot");
    using namespace zero::fp;
    V gj = divisor.divide(load<V>(g, j));
    if (coef != 1.0f) gj = mul(gj, V(coef));
    V s[Opt::slots > 0 ? Opt::slots : 1] = {load<V>(slots, j)...};
    const V wj = load<V>(w, j);
    Opt::advance(c, wj, gj, s);
    int k = 0;
    (store(slots, j, s[k++]), ...);
  }
};

// The first pass with the norm terms of each element (Opt::norm_terms of the weight and the advanced
// slots) stored as well, so that the sums over them need no second pass over the state. Arrays:
// gradient g, master weights w (read), one per slot, then one per term (written; a block buffer).
template <class Opt, class V>
concept tensorwise_terms_over = tensorwise_over<Opt, V> && requires(const typename Opt::step_constants& c, const V& w,
                                                                      const V* s, V* x) {
  Opt::norm_terms(c, w, s, x);
};
template <class Opt>
struct advance_terms_rule : advance_rule<Opt> {
  template <class G, class... Arrays>
  ZERO_HD void operator()(std::size_t j, const G* g, const float* w, Arrays*... arrays) const {
    step_terms<float>(j, g, w, arrays...);
  }
  template <class V, class G, class... Arrays>
  requires tensorwise_terms_over<Opt, V> ZERO_HD void apply(std::size_t j, const G* g, const float* w,
                                                            Arrays*... arrays) const {
    step_terms<V>(j, g, w, arrays...);
  }
  template <class V, class G, class... Arrays>
  ZERO_HD void step_terms(std::size_t j, const G* g, const float* w, Arrays*... arrays) const {
    constexpr int S = Opt::slots, K = Opt::tensor_sums;
    static_assert(sizeof...(Arrays) == static_cast<std::size_t>(S + K), "one array per slot, then one per term");
    float* const a[] = {arrays...};
    V s[S > 0 ? S : 1];
    const V wj = this->template advance_into<V>(j, g, w, a, s);
    V x[K];
    Opt::norm_terms(this->c, wj, static_cast<const V*>(s), x);
    for (int k = 0; k < K; ++k) store(a[S + k], j, x[k]);
  }
};

// The index of the norm term that is the weight itself (concepts/optimizer_state.hpp:
// TensorwiseWeightTerm), -1 where the optimizer names none.
template <class Opt>
inline constexpr int weight_term_of = [] {
  if constexpr (requires { Opt::weight_term; })
    return static_cast<int>(Opt::weight_term);
  else
    return -1;
}();
// The norm terms the first pass keeping the direction stores in block buffers: all but the direction
// (left in the gradient element) and the weight (whose squares are summed from the weights).
template <class Opt>
inline constexpr int buffered_terms = Opt::tensor_sums - 1 - (weight_term_of<Opt> >= 0 ? 1 : 0);

// The first pass keeping the direction (concepts/optimizer_state.hpp: TensorwiseDirection) in the
// fp32 gradient element it read, instead of zeroing it, and the terms other than the direction and the
// weight in block buffers. Arrays: gradient g (read and written), master weights w (read), one per slot,
// then one per buffered term (buffered_terms, in the terms' order).
template <class Opt>
struct advance_keeping_direction_rule : advance_rule<Opt> {
  static_assert(weight_term_of<Opt> != Opt::direction_term, "the direction and the weight are different terms");
  template <class... Arrays>
  ZERO_HD void operator()(std::size_t j, float* g, const float* w, Arrays*... arrays) const {
    keep<float>(j, g, w, arrays...);
  }
  template <class V, class... Arrays>
  requires tensorwise_terms_over<Opt, V> ZERO_HD void apply(std::size_t j, float* g, const float* w,
                                                            Arrays*... arrays) const {
    keep<V>(j, g, w, arrays...);
  }
  template <class V, class... Arrays>
  ZERO_HD void keep(std::size_t j, float* g, const float* w, Arrays*... arrays) const {
    V x[Opt::tensor_sums];
    advance_terms<V>(j, x, g, w, arrays...);
  }
  // The pass at element j, with the element's terms left in x[0..tensor_sums) as well (the pass fused
  // with the terms' sums: sys/host_square_blocks.hpp).
  template <class V, class... Arrays>
  ZERO_HD void advance_terms(std::size_t j, V* x, float* g, const float* w, Arrays*... arrays) const {
    constexpr int S = Opt::slots, K = Opt::tensor_sums;
    static_assert(sizeof...(Arrays) == static_cast<std::size_t>(S + buffered_terms<Opt>),
                  "one array per slot, then one per buffered term");
    float* const a[] = {arrays..., nullptr};
    V s[S > 0 ? S : 1];
    const V wj = this->template advance_into<V>(j, g, w, a, s);
    Opt::norm_terms(this->c, wj, static_cast<const V*>(s), x);
    store(g, j, x[Opt::direction_term]);
    for (int k = 0, b = S; k < K; ++k)
      if (k != Opt::direction_term && k != weight_term_of<Opt>) store(a[b++], j, x[k]);
  }
};

// The last pass from the kept direction d (in the gradient element, which it zeroes): the weight from
// the tensor's factor f and d, and the parameter copy p from it where the precision keeps one apart.
// Arrays: d (read, then zeroed), w, [p].
template <class Opt>
struct apply_direction_rule {
  typename Opt::step_constants c;
  float f;

  ZERO_HD void operator()(std::size_t j, float* d, float* w) const { (void)step<float>(j, d, w); }
  template <class P>
  ZERO_HD void operator()(std::size_t j, float* d, float* w, P* p) const {
    store(p, j, step<float>(j, d, w));
  }
  template <class V>
  ZERO_HD void apply(std::size_t j, float* d, float* w) const {
    (void)step<V>(j, d, w);
  }
  template <class V, class P>
  ZERO_HD void apply(std::size_t j, float* d, float* w, P* p) const {
    store(p, j, step<V>(j, d, w));
  }
  template <class V>
  ZERO_HD V step(std::size_t j, float* d, float* w) const {
    using namespace zero::fp;
    V wj = load<V>(w, j);
    Opt::apply_direction(c, f, wj, load<V>(d, j));
    wj = canonical(wj);
    store_canonical(w, j, wj);
    store(d, j, V(0.0f));
    return wj;
  }
};

// The last pass: the weight from the tensor's factor f and the slots, and the parameter copy p from
// it where the precision keeps one apart. Arrays: w, [p,] then one per slot (read).
template <class Opt>
struct apply_in_place_rule {
  typename Opt::step_constants c;
  float f;

  template <class... Slots>
  ZERO_HD void operator()(std::size_t j, float* w, const Slots*... slots) const {
    (void)step<float>(j, w, slots...);
  }
  template <class V, class... Slots>
  requires tensorwise_over<Opt, V> ZERO_HD void apply(std::size_t j, float* w, const Slots*... slots) const {
    (void)step<V>(j, w, slots...);
  }
  template <class V, class... Slots>
  ZERO_HD V step(std::size_t j, float* w, const Slots*... slots) const {
    using namespace zero::fp;
    const V s[Opt::slots > 0 ? Opt::slots : 1] = {load<V>(slots, j)...};
    V wj = load<V>(w, j);
    Opt::apply(c, f, wj, s);
    wj = canonical(wj);
    store_canonical(w, j, wj);
    return wj;
  }
};
template <class Opt>
struct apply_rule : apply_in_place_rule<Opt> {
  template <class P, class... Slots>
  ZERO_HD void operator()(std::size_t j, float* w, P* p, const Slots*... slots) const {
    store(p, j, this->template step<float>(j, w, slots...));
  }
  template <class V, class P, class... Slots>
  requires tensorwise_over<Opt, V> ZERO_HD void apply(std::size_t j, float* w, P* p, const Slots*... slots) const {
    store(p, j, this->template step<V>(j, w, slots...));
  }
};

// An update rule that also zeroes each gradient element once it has read it: the engine's gradient
// store left ready for the next step by the pass that reads it last, instead of by a second pass.
// +0 is stored, the bits fill_zero writes. Arrays: those of Rule, the gradient now read and written.
template <class Rule>
struct clearing_gradient : Rule {
  template <class G, class... Rest>
  ZERO_HD void operator()(std::size_t j, G* g, Rest*... rest) const {
    Rule::operator()(j, static_cast<const G*>(g), rest...);
    store(g, j, 0.0f);
  }
  // Present where Rule's apply<V> is (host_loop::vectorizable asks).
  template <class V, class G, class... Rest>
  ZERO_HD auto apply(std::size_t j, G* g, Rest*... rest) const
      -> decltype(this->Rule::template apply<V>(j, static_cast<const G*>(g), rest...)) {
    Rule::template apply<V>(j, static_cast<const G*>(g), rest...);
    store(g, j, V(0.0f));
  }
};

// Gradient accumulation: the first micro-batch is stored (a copy: 0 + (-0) would turn a negative
// zero positive), later ones added in fp32 and rounded once to the store's type.
// Arrays: the store dst (read only when !first), the reduced micro-batch src.
struct accumulate_rule {
  bool first;
  template <class D, class S>
  ZERO_HD void operator()(std::size_t j, D* dst, const S* src) const {
    apply<float>(j, dst, src);
  }
  template <class V, class D, class S>
  ZERO_HD void apply(std::size_t j, D* dst, const S* src) const {
    using namespace zero::fp;
    store(dst, j, first ? load<V>(src, j) : add(load<V>(dst, j), load<V>(src, j)));
  }
};

// A cast from fp32 (master weights into a parameter copy after a checkpoint load). Arrays: dst, src.
struct cast_rule {
  template <class D>
  ZERO_HD void operator()(std::size_t j, D* dst, const float* src) const {
    apply<float>(j, dst, src);
  }
  template <class V, class D>
  ZERO_HD void apply(std::size_t j, D* dst, const float* src) const {
    store(dst, j, load<V>(src, j));
  }
};

// ---- the reproducible reduction (core/binned.hpp, docs/reproducibility.md) -----------------------
// Three planes of int64 words, one per kept bin (plane k: bin top - k), element j of each. Written for
// binned::words == 3; the rules take the planes as separate operands so that a device loop moves
// element j of each as it moves any other operand.
static_assert(binned::words == 3, "the binned rules take one operand per word plane");

// A gradient (widened to fp32, exactly) into its words for a sum whose top bin is `top`.
// Arrays: g, then the three word planes.
struct to_bins_rule {
  int top;
  template <class G>
  ZERO_HD void operator()(std::size_t j, const G* g, std::int64_t* w0, std::int64_t* w1, std::int64_t* w2) const {
    std::int64_t w[binned::words];
    binned::to_words(static_cast<float>(g[j]), top, w);
    w0[j] = w[0];
    w1[j] = w[1];
    w2[j] = w[2];
  }
};

// The same cut, with the words a sum already holds for element j added (top bin `store_top` <= top,
// re-expressed for `top`): what a reduce sends from the slice whose sum lands in that store, so that
// the sum received is the store's new value and no merge follows (engine/reduce/binned.hpp). Exact:
// the words are integers, and a word of a value depends on the value and its bin only, so cutting at
// the larger top is re-expressing the cut for it. Arrays: g, the store's three planes, the three
// planes written (which may be the store's: element j is read before it is written).
struct to_bins_adding_rule {
  int top, store_top;
  template <class G>
  ZERO_HD void operator()(std::size_t j, const G* g, const std::int64_t* s0, const std::int64_t* s1,
                          const std::int64_t* s2, std::int64_t* w0, std::int64_t* w1, std::int64_t* w2) const {
    std::int64_t w[binned::words], s[binned::words] = {s0[j], s1[j], s2[j]};
    binned::to_words(static_cast<float>(g[j]), top, w);
    if (store_top != top) binned::realign(s, store_top, top);
    w0[j] = w[0] + s[0];
    w1[j] = w[1] + s[1];
    w2[j] = w[2] + s[2];
  }
};

// A sum's words (top bin `store_top`, -1: empty) plus another's (top `in_top`), both re-expressed for
// the larger top `to` first: exact integer additions, so the order of merges never matters.
// Arrays: the store's three planes (read and written), the incoming three planes.
struct merge_bins_rule {
  int store_top, in_top, to;
  ZERO_HD void operator()(std::size_t j, std::int64_t* s0, std::int64_t* s1, std::int64_t* s2, const std::int64_t* w0,
                          const std::int64_t* w1, const std::int64_t* w2) const {
    std::int64_t s[binned::words] = {s0[j], s1[j], s2[j]}, w[binned::words] = {w0[j], w1[j], w2[j]};
    if (store_top != to) binned::realign(s, store_top, to);  // the common case, equal tops, adds at once
    if (in_top != to) binned::realign(w, in_top, to);
    s0[j] = s[0] + w[0];
    s1[j] = s[1] + w[1];
    s2[j] = s[2] + w[2];
  }
};

// The sum held by the words (top bin `top`), rounded once to fp32. Arrays: the fp32 gradient g, the
// three planes.
struct round_bins_rule {
  int top;
  ZERO_HD void operator()(std::size_t j, float* g, const std::int64_t* w0, const std::int64_t* w1,
                          const std::int64_t* w2) const {
    const std::int64_t w[binned::words] = {w0[j], w1[j], w2[j]};
    g[j] = binned::round<float>(w, top);
  }
};

// The cut, with a store's words added as to_bins_adding_rule does (store_top < 0: no store, the cut
// alone), rounded at once to fp32 as round_bins_rule rounds: a unit's last reduce of the step where its
// sum is complete on this rank, so that the words are neither stored nor read back at step(). The
// same integers rounded the same way: the same bits as the three passes. Arrays: g, the store's three
// planes (not read when store_top < 0), the fp32 gradient written.
struct to_bins_rounding_rule {
  int top, store_top;
  template <class G>
  ZERO_HD void operator()(std::size_t j, const G* g, const std::int64_t* s0, const std::int64_t* s1,
                          const std::int64_t* s2, float* out) const {
    std::int64_t w[binned::words];
    binned::to_words(static_cast<float>(g[j]), top, w);
    if (store_top >= 0) {
      std::int64_t s[binned::words] = {s0[j], s1[j], s2[j]};
      if (store_top != top) binned::realign(s, store_top, top);
      w[0] += s[0];
      w[1] += s[1];
      w[2] += s[2];
    }
    out[j] = binned::round<float>(w, top);
  }
};

// The reduce that exchanges values (engine/reduce/binned.hpp): element j of `count` ranks' slices,
// each cut into the words of top bin `top` and summed as integers, plus the store's words (store_top
// < 0: none, the store not read), written back to the store's planes or, where `rounded` is given,
// rounded once to fp32 there (the unit's sum complete). Exact integer sums: the order of the slices,
// and whether the words pass through memory, change no bit. An index rule (it holds its arrays).
template <class G>
struct binned_cut_sum_rule {
  const G* const* slices;
  std::size_t count;
  int top, store_top;
  std::int64_t *s0, *s1, *s2;
  float* rounded;  // nullptr: the sum stays in words, in the store
  ZERO_HD void operator()(std::size_t j) const {
    std::int64_t w[binned::words] = {0, 0, 0};
    for (std::size_t r = 0; r < count; ++r) {
      std::int64_t c[binned::words];
      binned::to_words(static_cast<float>(slices[r][j]), top, c);
      w[0] += c[0];
      w[1] += c[1];
      w[2] += c[2];
    }
    if (store_top >= 0) {
      std::int64_t st[binned::words] = {s0[j], s1[j], s2[j]};
      if (store_top != top) binned::realign(st, store_top, top);
      w[0] += st[0];
      w[1] += st[1];
      w[2] += st[2];
    }
    if (rounded) {
      rounded[j] = binned::round<float>(w, top);
    } else {
      s0[j] = w[0];
      s1[j] = w[1];
      s2[j] = w[2];
    }
  }
};

// The square of element j of the averaged, unscaled gradient, in double: the term the systems'
// sum_of_squares (a reduction, not a for_each) adds up for the gradient norm.
template <class G>
ZERO_HD inline double square(const G* g, float divisor, std::size_t j) {
  const double x = fp::div(static_cast<float>(g[j]), divisor);
  return x * x;
}

// ---- the optimizer step on a system ------------------------------------------------------------

// Runs the optimizer step over n elements on `sys` (any system: sys.for_each(n, rule, operands...)),
// with the slot arrays slots[0..Opt::slots) as operands; p == nullptr: no separate parameter copy.
template <class Opt, class System, class G, class P>
void update(const System& sys, const typename Opt::step_constants& c, const G* g, float divisor, float coef, float* w,
            float* const* slots, P* p, std::size_t n) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    if (p)
      sys.for_each(n, update_rule<Opt>{{c, divisor, coef}}, in(g), inout(w), out(p), inout(slots[K])...);
    else
      sys.for_each(n, update_in_place_rule<Opt>{c, divisor, coef}, in(g), inout(w), inout(slots[K])...);
  }
  (std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{});
}
// The same step, leaving the n gradient elements it read zero (clearing_gradient).
template <class Opt, class System, class G, class P>
void update_and_clear(const System& sys, const typename Opt::step_constants& c, G* g, float divisor, float coef,
                      float* w, float* const* slots, P* p, std::size_t n) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    if (p)
      sys.for_each(n, clearing_gradient<update_rule<Opt>>{{{c, divisor, coef}}}, inout(g), inout(w), out(p),
                   inout(slots[K])...);
    else
      sys.for_each(n, clearing_gradient<update_in_place_rule<Opt>>{{c, divisor, coef}}, inout(g), inout(w),
                   inout(slots[K])...);
  }
  (std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{});
}

// A tensor-wise optimizer's first pass over n elements (advance_rule), zeroing the gradient elements it
// reads where g is writable (clearing_gradient).
template <class Opt, class System, class G>
void advance(const System& sys, const typename Opt::step_constants& c, G* g, float divisor, float coef, const float* w,
             float* const* slots, std::size_t n) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    if constexpr (std::is_const_v<G>)
      sys.for_each(n, advance_rule<Opt>{c, divisor, coef}, in(g), in(w), inout(slots[K])...);
    else
      sys.for_each(n, clearing_gradient<advance_rule<Opt>>{{c, divisor, coef}}, inout(g), in(w), inout(slots[K])...);
  }
  (std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{});
}
// The same pass storing each element's norm terms in terms[0..Opt::tensor_sums) (advance_terms_rule).
template <class Opt, class System, class G>
void advance_with_terms(const System& sys, const typename Opt::step_constants& c, G* g, float divisor, float coef,
                        const float* w, float* const* slots, float* const* terms, std::size_t n) {
  [&]<std::size_t... K, std::size_t... T>(std::index_sequence<K...>, std::index_sequence<T...>) {
    if constexpr (std::is_const_v<G>)
      sys.for_each(n, advance_terms_rule<Opt>{{c, divisor, coef}}, in(g), in(w), inout(slots[K])..., out(terms[T])...);
    else
      sys.for_each(n, clearing_gradient<advance_terms_rule<Opt>>{{{c, divisor, coef}}}, inout(g), in(w),
                   inout(slots[K])..., out(terms[T])...);
  }
  (std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{},
   std::make_index_sequence<static_cast<std::size_t>(Opt::tensor_sums)>{});
}
// The first pass keeping the direction in the fp32 gradient elements (advance_keeping_direction_rule);
// buffers[0..buffered_terms): the terms it stores apart.
template <class Opt, class System>
void advance_keeping_direction(const System& sys, const typename Opt::step_constants& c, float* g, float divisor,
                               float coef, const float* w, float* const* slots, float* const* buffers, std::size_t n) {
  [&]<std::size_t... K, std::size_t... T>(std::index_sequence<K...>, std::index_sequence<T...>) {
    sys.for_each(n, advance_keeping_direction_rule<Opt>{{c, divisor, coef}}, inout(g), in(w), inout(slots[K])...,
                 out(buffers[T])...);
  }
  (std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{},
   std::make_index_sequence<static_cast<std::size_t>(buffered_terms<Opt>)>{});
}
// The same pass over `blocks` whole blocks of square_blocks::size elements with each term's block sums
// of squares into sums[k][0..blocks) (core/square_blocks.hpp's order), where the system fuses them
// (sys::host on AVX-512 and AVX2: each term's squares added while it is in a register); false, with
// nothing done, where it does not.
template <class Opt, class System>
bool advance_keeping_direction_summed(const System& sys, const typename Opt::step_constants& c, float* g,
                                      float divisor, float coef, const float* w, float* const* slots,
                                      float* const* buffers, std::size_t blocks, double* const* sums) {
  if constexpr (requires { sys.template for_each_summing<Opt::tensor_sums>(blocks, advance_keeping_direction_rule<Opt>{}, sums); }) {
    return [&]<std::size_t... K, std::size_t... T>(std::index_sequence<K...>, std::index_sequence<T...>) {
      return sys.template for_each_summing<Opt::tensor_sums>(blocks, advance_keeping_direction_rule<Opt>{{c, divisor, coef}},
                                                             sums, inout(g), in(w), inout(slots[K])..., out(buffers[T])...);
    }(std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{},
           std::make_index_sequence<static_cast<std::size_t>(buffered_terms<Opt>)>{});
  } else {
    return false;
  }
}
// The last pass from the kept direction d, zeroing it (apply_direction_rule); p == nullptr: no
// separate parameter copy.
template <class Opt, class System, class P>
void apply_direction(const System& sys, const typename Opt::step_constants& c, float f, float* d, float* w, P* p,
                     std::size_t n) {
  if (p)
    sys.for_each(n, apply_direction_rule<Opt>{c, f}, inout(d), inout(w), out(p));
  else
    sys.for_each(n, apply_direction_rule<Opt>{c, f}, inout(d), inout(w));
}
// Its last pass over n elements with the tensor's factor f (apply_rule); p == nullptr: no separate
// parameter copy.
template <class Opt, class System, class P>
void apply_factor(const System& sys, const typename Opt::step_constants& c, float f, float* w,
                  const float* const* slots, P* p, std::size_t n) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    if (p)
      sys.for_each(n, apply_rule<Opt>{{c, f}}, inout(w), out(p), in(slots[K])...);
    else
      sys.for_each(n, apply_in_place_rule<Opt>{c, f}, inout(w), in(slots[K])...);
  }
  (std::make_index_sequence<static_cast<std::size_t>(Opt::slots)>{});
}

}  // namespace zero::elementwise
