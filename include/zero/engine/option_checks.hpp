// The options an engine accepts, and the combinations it refuses: one place, checked before anything is allocated.
#pragma once

#include <string>

#include "zero/concepts/partitioner.hpp"
#include "zero/core/quantize.hpp"
#include "zero/core/value_checks.hpp"
#include "zero/engine/options.hpp"
#include "zero/error.hpp"
#include "zero/precision/loss_scaler.hpp"

namespace zero::detail {

// What the engine refuses, by the part that refuses it (each message names the option, the rank, and
// what to set instead):
//   the options alone (checked_options)   values out of range; accumulation and fp32 accumulation
//                                         against the stage; the reproducible mode against
//                                         local_then_reduce, fp32_grad_accumulation and ZeRO++;
//                                         persistent units against ZeRO++; the offload tier's values
//   parameter placement and gathers       qwZ and hpZ outside stage 3, hpZ's node size, qwZ's format,
//   (check_zeropp)                        a backend without byte gathers (qwZ) or split (hpZ);
//                                         qgz_error_feedback without qgz; node_size against N
//   the gradient reducer                  its own accept() (engine/reduce/): qgZ outside stages 1-3,
//                                         its format, all_to_all and split; the reproducible mode's
//                                         int64 collectives, binned reductions and N x M <= 2^24
//   the memory check (memory_check.hpp)   model states that cannot fit the limit or the device

// Runs f, prefixing "rank R: " to the message of a zero::error it throws.
template <class F>
void with_rank(int rank, F f) {
  try {
    f();
  } catch (const error& e) {
    throw error(e.kind(), detail::concat("rank ", rank, ": ", e.what()));
  }
}

// engine_options on their own and against the stage, before the loss scaler is built.
template <Partitioner P>
engine_options checked_options(const engine_options& o, int rank) {
  ZERO_CHECK(o.micro_batches >= 1, invalid_argument, "rank ", rank,
             ": engine_options: micro_batches must be >= 1, got ", o.micro_batches);
  ZERO_CHECK(o.accumulate == accumulation::reduce_each_micro_batch || o.accumulate == accumulation::local_then_reduce,
             invalid_argument, "rank ", rank, ": engine_options: accumulate is not an accumulation value (",
             static_cast<int>(o.accumulate), ")");
  ZERO_CHECK(o.accumulate != accumulation::local_then_reduce || !P::shards_gradients, invalid_argument, "rank ", rank,
             ": local_then_reduce accumulation keeps every unit's full gradient until its single reduce; ZeRO "
             "stage ",
             P::stage, " shards gradients, so use reduce_each_micro_batch");
  ZERO_CHECK(!o.fp32_grad_accumulation || P::shards_gradients, invalid_argument, "rank ", rank,
             ": fp32_grad_accumulation applies to the gradient shard of stages 2 and 3; stage ", P::stage,
             " keeps full gradients in the precision's gradient type");
  ZERO_CHECK(!o.reproducible || o.accumulate == accumulation::reduce_each_micro_batch, invalid_argument, "rank ", rank,
             ": engine_options::reproducible sums every micro-batch's gradient exactly, so each must be "
             "reduced on its own: local_then_reduce would add them in fp32 first (use reduce_each_micro_batch)");
  ZERO_CHECK(!o.reproducible || !o.fp32_grad_accumulation, invalid_argument, "rank ", rank,
             ": engine_options::reproducible already keeps the gradient sum exact and rounds it once to fp32; "
             "fp32_grad_accumulation does not apply (turn it off)");
  with_rank(rank, [&] {
    detail::require_non_negative("engine_options", "clip_norm", o.clip_norm);
    // Checked whether or not the precision scales the loss: a bad value is a mistake either way.
    validate(o.loss_scale);
  });
  ZERO_CHECK(o.host_threads >= 1 && o.host_threads <= 1024, invalid_argument, "rank ", rank,
             ": engine_options: host_threads must be in [1, 1024] (1: the calling thread alone), got ", o.host_threads);
  ZERO_CHECK(o.init_chunk_elements > 0, invalid_argument, "rank ", rank,
             ": engine_options: init_chunk_elements must be > 0, got ", o.init_chunk_elements);
  ZERO_CHECK(o.prefetch_units >= 0, invalid_argument, "rank ", rank,
             ": engine_options: prefetch_units must be >= 0 (0: no prefetch), got ", o.prefetch_units);
  ZERO_CHECK(o.reduces_in_flight >= 1, invalid_argument, "rank ", rank,
             ": engine_options: reduces_in_flight must be >= 1, got ", o.reduces_in_flight);
  ZERO_CHECK(o.persist_below_elements == 0 || !(o.zeropp.qwz || o.zeropp.qgz || o.zeropp.hpz), invalid_argument,
             "rank ", rank,
             ": engine_options: persist_below_elements (stage 3's persistent units) and ZeRO++ "
             "(zeropp.qwz, qgz, hpz) cannot be combined yet: a persistent unit's gathers and its traffic would "
             "bypass the quantized and hierarchical paths; set one of them");
  ZERO_CHECK(o.gather_bucket_elements == 0 || !(o.zeropp.qwz || o.zeropp.hpz), invalid_argument, "rank ", rank,
             ": engine_options: gather_bucket_elements (stage 3's gather buckets) and ZeRO++'s gathers (zeropp.qwz, "
             "hpz) cannot be combined yet: a bucket all-gathers the exact shards on the data-parallel link; set one "
             "of them");
  // qgZ replaces the exact sum by a quantized one, and qwZ quantizes each rank's shard (blocks that
  // move with N): neither keeps the bits at another world size. hpZ is exact but not yet carried
  // through the binned path and its formulas.
  ZERO_CHECK(!o.reproducible || !(o.zeropp.qwz || o.zeropp.qgz || o.zeropp.hpz), invalid_argument, "rank ", rank,
             ": engine_options: reproducible and ZeRO++ (zeropp.qwz, qgz, hpz) cannot be combined: qgZ's quantized "
             "gradient sum and qwZ's shard-wise quantization depend on the world size, and hpZ is not yet carried "
             "through the binned reduction; set one of them");
  const offload_options& f = o.offload;
  ZERO_CHECK(f.tier == offload_tier::none || f.tier == offload_tier::host || f.tier == offload_tier::disk,
             invalid_argument, "rank ", rank, ": engine_options: offload.tier is not an offload_tier value (",
             static_cast<int>(f.tier), ")");
  ZERO_CHECK(f.slice_elements > 0 && f.slice_elements % 1024 == 0, invalid_argument, "rank ", rank,
             ": engine_options: offload.slice_elements must be a positive multiple of 1024 (4 KiB of fp32, the "
             "unit of direct I/O), got ",
             f.slice_elements);
  ZERO_CHECK(f.tier != offload_tier::disk || !f.directory.empty(), invalid_argument, "rank ", rank,
             ": engine_options: offload to disk needs offload.directory, an existing directory on a local file "
             "system");
  return o;
}

// ZeRO++'s placement and gather options against the stage, the world of n ranks and the backend
// (qgZ's are its reducer's: engine/reduce/quantized.hpp).
template <Partitioner P>
void check_zeropp(const engine_options& o, int n, int rank, bool can_qwz, bool can_split) {
  const zeropp_options& z = o.zeropp;
  const char* where = "engine_options::zeropp";
  ZERO_CHECK(z.node_size >= 0 && (z.node_size == 0 || n % z.node_size == 0), invalid_argument, "rank ", rank, ": ",
             where, ": node_size ", z.node_size, " does not divide the world size ", n,
             " (a node holds node_size consecutive ranks; 0: one node holds them all)");
  ZERO_CHECK(!z.qwz || P::shards_parameters, invalid_argument, "rank ", rank, ": ", where,
             ": qwZ quantizes the parameter all-gathers of stage 3; ZeRO stage ", P::stage, " gathers no parameters");
  ZERO_CHECK(!z.hpz || P::shards_parameters, invalid_argument, "rank ", rank, ": ", where,
             ": hpZ keeps a secondary partition of stage 3's sharded parameters; ZeRO stage ", P::stage,
             " does not shard them");
  ZERO_CHECK(!z.qgz_error_feedback || z.qgz, invalid_argument, "rank ", rank, ": ", where,
             ": qgz_error_feedback compensates qgZ's quantization: it needs qgz");
  ZERO_CHECK(!z.hpz || (z.node_size > 0 && z.node_size < n), invalid_argument, "rank ", rank, ": ", where,
             ": hpZ needs nodes smaller than the world (node_size in [1, N) dividing N = ", n, "), got node_size ",
             z.node_size, ": with one node the secondary partition is the primary one");
  with_rank(rank, [&] {
    if (z.qwz) quant::validate(z.weights, "engine_options::zeropp.weights");
  });
  ZERO_CHECK(!z.qwz || can_qwz, invalid_argument, "rank ", rank, ": ", where,
             ": qwZ needs a backend with a byte all_gather (std::uint8_t) and a system with for_each_index");
  ZERO_CHECK(!z.hpz || can_split, invalid_argument, "rank ", rank, ": ", where,
             ": hpZ needs a backend with split (comm/split.hpp)");
}

}  // namespace zero::detail
