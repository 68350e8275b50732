// The policies the library ships, as type lists: the trainers' dispatch, the device instantiations and the test matrices walk these.
#pragma once

#include "zero/core/type_list.hpp"
#include "zero/optim/adamw.hpp"
#include "zero/optim/adamw_bf16.hpp"
#include "zero/optim/lamb.hpp"
#include "zero/optim/lion.hpp"
#include "zero/optim/muon.hpp"
#include "zero/optim/sgd.hpp"
#include "zero/partition/stages.hpp"
#include "zero/precision/bf16.hpp"
#include "zero/precision/fp16.hpp"
#include "zero/precision/fp32.hpp"

namespace zero {

// Adding a policy of the library is one line here (and its header above): see docs/extending.md.
using optimizers = type_list<optim::sgd, optim::adamw, optim::adamw_bf16, optim::lion, optim::lamb, optim::muon>;
using precisions = type_list<precision::fp32, precision::bf16, precision::fp16>;
using stages = type_list<stage0, stage1, stage2, stage3>;

}  // namespace zero
