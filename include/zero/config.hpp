// Compile-time configuration: the ZERO_HD qualifier and feature detection shared by every header.
#pragma once

// Element-wise rules are written once and run on host and device; under nvcc they need
// both qualifiers, under a host compiler neither exists.
#ifndef ZERO_HD
#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__
#else
#define ZERO_HD
#endif
#endif

#define ZERO_VERSION_MAJOR 0
#define ZERO_VERSION_MINOR 1
#define ZERO_VERSION_PATCH 0
