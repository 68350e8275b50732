// engine_options: clipping, gradient norm, gradient accumulation and loss-scale settings of an engine.
#pragma once

#include "zero/precision/loss_scaler.hpp"

namespace zero {

// How M micro-batches per step are accumulated.
enum class accumulation {
  // reduce(u) after every micro-batch; the reduced result is added into the rank's gradient shard.
  // Works in every stage; sends M times the gradient traffic.
  reduce_each_micro_batch,
  // Kernels accumulate into grads(u) over the micro-batches and reduce(u) is called once. Needs the
  // full gradient kept between micro-batches, so stages 0 and 1 only.
  local_then_reduce,
};

struct engine_options {
  float clip_norm = 0.0f;          // clip the global gradient L2 norm to this value; 0: no clipping
  bool compute_grad_norm = false;  // compute the norm even without clipping (always done for bf16/fp16)
  int micro_batches = 1;           // M: reduce(u) calls per unit per step under reduce_each_micro_batch
  accumulation accumulate = accumulation::reduce_each_micro_batch;
  bool fp32_grad_accumulation = false;  // stages 2-3: the gradient shard is fp32 (+2 Psi/N bytes for 2-byte grads)
  loss_scale_options loss_scale{};      // used when the precision policy scales the loss
};

}  // namespace zero
