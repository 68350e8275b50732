// FNV-1a 64-bit: the fingerprint that compares trained parameters across stages, backends and runs.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace zero
