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

// ZERO_HD for the functions of an element-wise rule that the host loop must see whole (an
// optimizer's update and what it calls on packs), always inlined: a square root of 8 or 16 lanes is a
// function of a wider target than the baseline, which GCC inlines into the loop of that target only
// through functions that were themselves inlined first (core/simd.hpp, sqrt_lanes).
#ifndef ZERO_HD_INLINE
#if defined(__CUDACC__)
#define ZERO_HD_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define ZERO_HD_INLINE __attribute__((always_inline)) inline
#else
#define ZERO_HD_INLINE inline
#endif
#endif

#define ZERO_VERSION_MAJOR 0
#define ZERO_VERSION_MINOR 1
#define ZERO_VERSION_PATCH 0
