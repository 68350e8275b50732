// The engine types most unit suites use, compiled once (engine_instances.cpp) instead of in every suite that uses them.
#pragma once

// A suite that includes this header before it uses these engines compiles none of their member
// functions at -O0, the suites' level (and ASan's): the explicit instantiation declarations below say
// they are compiled in engine_instances.cpp, which the unit suites (the CUDA ones too, whose host code
// is at -O0) link. An optimizing build (a suite at the release level) instantiates what it inlines
// anyway, so there the declarations and the definitions are both left out: each suite compiles its
// own, as without this header. The list: the types four or more suites instantiate.

#include "deferred_comm.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/zero.hpp"

// X(stage, backend, optimizer, precision) for each shared engine type.
#define ZERO_TEST_SHARED_ENGINES(X)                                           \
  X(stage0, zero::comm::threads, adamw, fp32)                                 \
  X(stage1, zero::comm::threads, adamw, fp32)                                 \
  X(stage2, zero::comm::threads, adamw, fp32)                                 \
  X(stage3, zero::comm::threads, adamw, fp32)                                 \
  X(stage0, zero::comm::threads, adamw, bf16)                                 \
  X(stage1, zero::comm::threads, adamw, bf16)                                 \
  X(stage2, zero::comm::threads, adamw, bf16)                                 \
  X(stage3, zero::comm::threads, adamw, bf16)                                 \
  X(stage0, zero::comm::threads, adamw, fp16)                                 \
  X(stage1, zero::comm::threads, adamw, fp16)                                 \
  X(stage2, zero::comm::threads, adamw, fp16)                                 \
  X(stage3, zero::comm::threads, adamw, fp16)                                 \
  X(stage0, zero::comm::threads, sgd, fp32)                                   \
  X(stage1, zero::comm::threads, sgd, fp32)                                   \
  X(stage2, zero::comm::threads, sgd, fp32)                                   \
  X(stage3, zero::comm::threads, sgd, fp32)                                   \
  X(stage0, zero::comm::threads, lion, fp32)                                  \
  X(stage1, zero::comm::threads, lion, fp32)                                  \
  X(stage2, zero::comm::threads, lion, fp32)                                  \
  X(stage3, zero::comm::threads, lion, fp32)                                  \
  X(stage0, testing::deferred<zero::comm::threads>, adamw, fp32)              \
  X(stage1, testing::deferred<zero::comm::threads>, adamw, fp32)              \
  X(stage2, testing::deferred<zero::comm::threads>, adamw, fp32)              \
  X(stage3, testing::deferred<zero::comm::threads>, adamw, fp32)

#ifndef __OPTIMIZE__
#define ZERO_TEST_DECLARE_ENGINE(S, C, O, P) \
  extern template class zero::engine<zero::S, C, zero::optim::O, zero::precision::P>;
ZERO_TEST_SHARED_ENGINES(ZERO_TEST_DECLARE_ENGINE)
#undef ZERO_TEST_DECLARE_ENGINE
#endif
