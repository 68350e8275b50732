// The umbrella header of the host-only library: engine, policies, thread backend and reports.
#pragma once

#include "zero/catalog.hpp"  // every optimizer, precision and stage of the library
#include "zero/config.hpp"
#include "zero/error.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/concepts/optimizer_state.hpp"
#include "zero/concepts/partitioner.hpp"
#include "zero/concepts/precision_policy.hpp"
#include "zero/core/formulas.hpp"
#include "zero/core/quantize.hpp"
#include "zero/core/hash.hpp"
#include "zero/core/layout.hpp"
#include "zero/core/memory.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/core/schedule.hpp"
#include "zero/comm/counted.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/engine/engine.hpp"
#include "zero/kinds/whole_tensor_sweep.hpp"  // the kind of optim::adafactor (and of any whole-tensor optimizer)
#include "zero/optim/adafactor.hpp"  // an optimizer outside the catalog, through the kind seam
#include "zero/core/half_types.hpp"
#include "zero/precision/loss_scaler.hpp"
#include "zero/core/numeric.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/plan.hpp"
#include "zero/plan_by_name.hpp"  // plan()'s description of a catalog policy by its name
#include "zero/sys/host.hpp"
