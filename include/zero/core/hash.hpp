// FNV-1a 64-bit: the fingerprint that compares trained parameters across stages, backends and runs; and a fast hash for
// values compared between the ranks of one run.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

// xxHash is optional here: with it, run_hash64 is XXH3 (header-only, as checkpoint/checksum.hpp uses it);
// without it, a word-wise hash written below. The core headers build either way.
#if defined(__has_include)
#if __has_include(<xxhash.h>) && !defined(ZERO_NO_XXHASH)
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>
#define ZERO_HAVE_XXH3 1
#endif
#endif

namespace zero {

// FNV-1a over raw bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3). Used on the
// consolidated fp32 parameters, tensors in declaration order, little-endian, padding excluded.
inline std::uint64_t fnv1a64(const void* data, std::size_t bytes, std::uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace detail {

// 8 bytes per multiply instead of FNV-1a's one: a seeded multiply-rotate over little-endian words, the
// tail packed into one more word, the length mixed in, then a murmur3 finalizer.
inline std::uint64_t wordwise_hash64(const void* data, std::size_t bytes, std::uint64_t seed) {
  constexpr std::uint64_t k1 = 0x9e3779b97f4a7c15ull, k2 = 0x87c37b91114253d5ull;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = seed ^ (static_cast<std::uint64_t>(bytes) * k1);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = std::rotl(h ^ (w * k2), 31) * k1;
  }
  if (i < bytes) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, bytes - i);
    h = std::rotl(h ^ (w * k2), 31) * k1;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

}  // namespace detail

// A fast 64-bit hash of bytes, chained through `seed` (hash a chunk with the previous chunk's hash as
// the seed). Only for values compared between the ranks of one run, which all run the same build: it
// is XXH3 where <xxhash.h> is available and the word-wise hash above otherwise, so it is never stored
// nor compared across runs (param_hash and the checkpoints' checksums are fixed algorithms).
inline std::uint64_t run_hash64(const void* data, std::size_t bytes, std::uint64_t seed = 0) {
#ifdef ZERO_HAVE_XXH3
  return XXH3_64bits_withSeed(data, bytes, seed);
#else
  return detail::wordwise_hash64(data, bytes, seed);
#endif
}

}  // namespace zero
