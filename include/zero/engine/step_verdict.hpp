// What step() decides before it updates: the divisor of the summed gradients, the global norm, the skip and the clipping coefficient.
#pragma once

#include <cmath>
#include <limits>

#include "zero/concepts/partitioner.hpp"
#include "zero/core/fp.hpp"

namespace zero::detail {

struct step_verdict {
  // The gradient the optimizer sees is the reduced sum divided by this: N (or, reproducible, the
  // global number of micro-batches N x M) times the loss scale, in one IEEE division. The product is
  // exact: the scale is a power of two, and N x M <= 2^24 (checked at construction).
  float divisor = 1.0f;
  float coef = 1.0f;  // the clipping coefficient the optimizer multiplies the gradient by
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // when computed
  bool skipped = false;  // the norm is not finite on some rank: every rank skips the update
};

// Whether step() computes the global gradient norm: a separate master copy (its overflow check),
// clipping, a request for it, and the reproducible mode (the overflow check of an exact sum). In a
// tensor-parallel mesh too: the norm's exchange is where the mesh agrees on the skip and the optimizer
// and checks the replicated tensors' gradients.
template <class Prec, class Ctx>
bool needs_grad_norm(const Ctx& ctx) {
  const auto& o = ctx.options;
  return Prec::separate_master || o.clip_norm > 0.0f || o.compute_grad_norm || o.reproducible || ctx.tp_size > 1;
}

// The optimizer's fingerprint rides on the norm's all-reduce where the step makes one (stages 1-3
// computing the norm); elsewhere (stage 0, or no norm) on an all-reduce of its own, started at the
// step's first reduce() (nonblocking where the backend overlaps) and completed by step(). With
// replicated shard groups the norm's all-reduce is the group's: the check is always its own, over
// every data-parallel rank.
template <Partitioner P, class Prec, class Ctx>
bool separate_agreement_check(const Ctx& ctx) {
  return ctx.dp_size() > 1 &&
         (!(P::shards_optimizer_states && needs_grad_norm<Prec>(ctx)) || ctx.replica_count > 1);
}

// The verdict once every reduce has completed: the norm from the reducer's sum of squares (which
// carries the ranks' optimizer fingerprints, `agreement` judging them), the skip where it is not
// finite, and clip_norm's coefficient.
template <class Prec, class Ctx, class Reducer, class Agreement, class Opt>
step_verdict judge_step(const Ctx& ctx, Reducer& reducer, Agreement& agreement, const Opt& opt, float loss_scale) {
  step_verdict v;
  v.divisor = fp::mul(static_cast<float>(reducer.averaging_count()), loss_scale);
  if (!needs_grad_norm<Prec>(ctx)) return v;
  const auto n = reducer.sum_of_squares(v.divisor, agreement.terms());
  if (!n.optimizers_agree) agreement.optimizers_disagree(opt);
  const double sq = n.sum_of_squares;
  v.grad_norm = fp::canonical(std::sqrt(sq));  // a NaN norm reports the same bits on every system
  v.skipped = !std::isfinite(sq);
  const float clip = ctx.options.clip_norm;
  if (!v.skipped && clip > 0.0f && v.grad_norm > clip)
    v.coef = static_cast<float>(static_cast<double>(clip) / (v.grad_norm + 1e-6));
  return v;
}

}  // namespace zero::detail
