// comm::detail::streaming_copy: copies with non-temporal stores, for collective outputs too large to stay in the caches.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace zero::comm::detail {

// A collective that writes at least this many bytes on one rank in one call writes them with
// non-temporal stores. Output that large does not stay in the caches anyway, and a plain store
// first reads every destination line (read for ownership): a third of a copy's memory traffic. On a
// 2-vCPU Xeon guest whose two cores share little memory bandwidth (a standalone loop, at a load
// average of 11), the 64 MiB reduce_scatter pattern at N = 2 took 0.56-0.89 of the time with
// streaming stores and the all_gather pattern 0.67-0.89. Below the threshold, plain stores keep the
// output in cache for whoever reads it next.
inline constexpr std::size_t streaming_threshold = std::size_t{16} << 20;

// memcpy with non-temporal stores where the platform has them (x86: SSE2, which every x86-64 has);
// the bytes written are the same. Call streaming_fence() before another thread may read dst.
inline void streaming_copy(void* dst, const void* src, std::size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Plain stores up to the first 16-byte boundary of dst and after the last one.
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 16; d += 16, s += 16, bytes -= 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  std::memcpy(d, s, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Copies src to each of the n destinations, reading src once: a block of it is copied to every
// destination while it is in L1, so a fan-out of S bytes to N buffers reads S bytes from memory, not
// N x S. `streaming`: non-temporal stores (see above). A destination's pieces end where its own
// address is a multiple of 64, so with non-temporal stores no cache line is written in part by two
// pieces (a plain store into a line the previous piece streamed would read it back from memory).
inline void copy_to_each(void* const* dst, std::size_t n, const void* src, std::size_t bytes, bool streaming) {
  constexpr std::size_t block = 4096;  // a multiple of the 64-byte line, well inside L1
  const auto* s = static_cast<const unsigned char*>(src);
  for (std::size_t b = 0; b <= bytes / block; ++b)
    for (std::size_t k = 0; k < n; ++k) {
      auto* d = static_cast<unsigned char*>(dst[k]);
      const std::size_t shift = (64 - reinterpret_cast<std::uintptr_t>(d) % 64) % 64;
      const std::size_t lo = b == 0 ? 0 : std::min(bytes, b * block + shift);
      const std::size_t hi = std::min(bytes, (b + 1) * block + shift);
      if (lo >= hi) continue;
      if (streaming) streaming_copy(d + lo, s + lo, hi - lo);
      else std::memcpy(d + lo, s + lo, hi - lo);
    }
}

// Non-temporal stores are weakly ordered (x86): this makes them visible before anything stored
// after it, such as the rendezvous count that lets the peers read the output.
inline void streaming_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace zero::comm::detail
