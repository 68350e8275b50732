// The definitions engine_instances.hpp declares: the shared engine types, compiled once for every unit suite.
#include "engine_instances.hpp"

#ifndef __OPTIMIZE__
#define ZERO_TEST_DEFINE_ENGINE(S, C, O, P) template class zero::engine<zero::S, C, zero::optim::O, zero::precision::P>;
ZERO_TEST_SHARED_ENGINES(ZERO_TEST_DEFINE_ENGINE)
#undef ZERO_TEST_DEFINE_ENGINE
#endif
