// The quantized gradient reducer with error feedback: each rank's quantization error joins its next contribution.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/config.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/link_formulas.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/quantize.hpp"
#include "zero/engine/reduce/quantized.hpp"
#include "zero/engine/reduce/reducer.hpp"
#include "zero/engine/reduce/summing.hpp"

namespace zero::reduce {

namespace detail {
// e = e + g; g = e: the gradient with the error its rank's last quantization left (fp32; g then holds it
// rounded to its own type, which the next error accounts for too).
struct add_error_rule {
  template <class E, class G>
  ZERO_HD void operator()(std::size_t j, E* e, G* g) const {
    apply<float>(j, e, g);
  }
  template <class V, class E, class G>
  ZERO_HD void apply(std::size_t j, E* e, G* g) const {
    using namespace zero::fp;
    using zero::elementwise::load, zero::elementwise::store;
    const V v = add(load<V>(e, j), load<V>(g, j));
    store(e, j, v);
    store(g, j, v);
  }
};
// e = e - d: what the codes sent did not carry.
struct subtract_rule {
  template <class E, class D>
  ZERO_HD void operator()(std::size_t j, E* e, const D* d) const {
    apply<float>(j, e, d);
  }
  template <class V, class E, class D>
  ZERO_HD void apply(std::size_t j, E* e, const D* d) const {
    using namespace zero::fp;
    using zero::elementwise::load, zero::elementwise::store;
    store(e, j, sub(load<V>(e, j), load<V>(d, j)));
  }
};
}  // namespace detail

// engine_options::zeropp.qgz_error_feedback, on qgZ (the compensation of 1-bit Adam and LoCo applied to
// qgZ's int8/int4 codes): each rank keeps, per element of every unit it contributes (the whole padded
// model, fp32: 4 Psi bytes, in the gradient category), what its last quantized contribution lacked, and
// adds it to its next contribution before quantizing: e += g; send Q(e); e -= D(Q(e)). The error
// quantization leaves is carried rather than lost, so it averages out over steps. Only the first
// quantization is compensated: in two hops the node sums' second quantization is not. The buffer starts
// at zero with the engine (and after a checkpoint load: it is not saved, a residual of at most one
// quantization step per element). The bits stay identical across stages 1-3 and deterministic backends.
template <class Ctx>
class qgz_feedback_wire : public qgz_wire<Ctx> {
  using base = qgz_wire<Ctx>;

 public:
  using typename base::state;
  using system = typename Ctx::system;
  static constexpr const char* name = "qgZ with error feedback";
  static bool chosen(const engine_options& o) { return o.zeropp.qgz && o.zeropp.qgz_error_feedback; }
  static std::uint64_t extra_state_bytes(const engine_options&, std::uint64_t padded) {
    return formula::qgz_error_state_bytes(padded);
  }

  explicit qgz_feedback_wire(Ctx& c) : base(c), ctx_(c), error_(c.layout.padded(), mem_category::grads, c.acct) {}

  typename Ctx::request start(state& f, const std::vector<unit_id>& units, typename Ctx::grad_type* g,
                              std::size_t count) {
    const auto n = static_cast<std::size_t>(ctx_.ranks());
    for_each_block(units, count, [&](float* e, std::size_t at, std::size_t shard) {
      ctx_.sys.for_each(shard, detail::add_error_rule{}, elementwise::inout(e), elementwise::inout(g + at));
    });
    typename Ctx::request r = base::start(f, units, g, count);
    // The codes just sent (the collective only reads them), dequantized slice by slice: what each
    // slice carried, taken from its error.
    ctx_.make_room(formula::qgz_feedback_transient_bytes(count));
    buffer<float, system> sent(count, mem_category::transient, ctx_.acct);
    const std::vector<std::size_t> order = base::send_order();
    std::vector<const std::uint8_t*> wire_of(n);
    for (std::size_t p = 0; p < n; ++p) wire_of[order[p]] = f.send_wire.data() + p * f.slice.wire;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint8_t* w = wire_of[k];
      float* d = sent.data();
      for (std::size_t seg : f.slice.segments) {
        quant::dequantize(ctx_.sys, w, seg, f.slice.format, d);
        w += quant::wire_bytes(seg, f.slice.format);
        d += seg;
      }
      std::size_t off = 0;
      for (unit_id v : units) {
        const unit_layout& ul = ctx_.layout.unit(v);
        ctx_.sys.for_each(ul.shard, detail::subtract_rule{},
                          elementwise::inout(error_.data() + ul.offset + k * ul.shard),
                          elementwise::in(sent.data() + off));
        off += ul.shard;
      }
    }
    return r;
  }

 private:
  // f(error block, position in g, elements) for each slice k and each unit of the slice: unit v's part
  // of slice k is its elements [k shard, (k+1) shard), at k x count + (the units before it) in g.
  template <class F>
  void for_each_block(const std::vector<unit_id>& units, std::size_t count, F f) {
    for (std::size_t k = 0; k < static_cast<std::size_t>(ctx_.ranks()); ++k) {
      std::size_t off = 0;
      for (unit_id v : units) {
        const unit_layout& ul = ctx_.layout.unit(v);
        f(error_.data() + ul.offset + k * ul.shard, k * count + off, ul.shard);
        off += ul.shard;
      }
    }
  }

  Ctx& ctx_;
  buffer<float, system> error_;  // per element of the padded model: this rank's carried quantization error
};

template <class Ctx>
using feedback_reducer = reducer<Ctx, summing<Ctx, qgz_feedback_wire<Ctx>>>;

}  // namespace zero::reduce
