// offload::slice_hash: the 64-bit hash (xxHash's XXH3, header-only) that the disk tier keeps of every slice it writes, where <xxhash.h> is available.
#pragma once

#include <cstddef>
#include <cstdint>

// The core headers compile with the standard library alone. xxHash (a header-only package of
// record, as for the checkpoints) is used where the compiler finds <xxhash.h>; without it, or with
// ZERO_NO_XXHASH defined, slice_checksums is false and the disk tier refuses to be constructed
// (an offloaded state that cannot be verified is not offered); the host tier needs no hash.
#if !defined(ZERO_NO_XXHASH) && __has_include(<xxhash.h>)
// Every function inlined into the including translation unit: nothing to link (checkpoint/checksum.hpp
// does the same).
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>
#define ZERO_OFFLOAD_CHECKSUMS 1
#else
#define ZERO_OFFLOAD_CHECKSUMS 0
#endif

namespace zero::offload {

inline constexpr bool slice_checksums = ZERO_OFFLOAD_CHECKSUMS != 0;

// XXH3_64bits of `bytes` at p (0 without xxHash, where nothing calls it).
inline std::uint64_t slice_hash([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t bytes) {
#if ZERO_OFFLOAD_CHECKSUMS
  return XXH3_64bits(p, bytes);
#else
  return 0;
#endif
}

}  // namespace zero::offload
