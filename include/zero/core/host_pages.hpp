// host_pages: host memory for large arrays, on huge-page boundaries and advised as transparent huge pages.
#pragma once

#include <cstddef>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace zero::host_pages {

// Why: the host's update streams four to six arrays of a shard at once, and one core's loop over
// 4 KiB pages at cache-line alignment left a quarter of its speed in the page walks and the bases'
// placement. Measured on a Zen 4 (AdamW over 2^24 fp32 elements, one thread, the same run): 1.26 G
// elem/s at cache-line alignment, 1.59 with 2 MiB-aligned bases, 1.86 with huge pages as well
// (docs/performance.md, "Host loops"). Arrays of `huge_bytes` or more therefore start on a 2 MiB
// boundary and are advised as huge pages (Linux madvise; a kernel whose THP setting is "never"
// ignores the advice, and a refusal changes nothing). The padding before the boundary is address
// space that is never touched; accounts count the bytes asked for.
inline constexpr std::size_t huge_bytes = std::size_t{2} << 20;

// The alignment an array of `bytes` gets when it asks for at least `least`.
constexpr std::size_t alignment_of(std::size_t bytes, std::size_t least) {
  return bytes >= huge_bytes && least < huge_bytes ? huge_bytes : least;
}

// `bytes` of uninitialised memory (nullptr for 0); throws std::bad_alloc.
inline void* allocate(std::size_t bytes, std::size_t least_alignment) {
  if (bytes == 0) return nullptr;
  void* p = ::operator new(bytes, std::align_val_t{alignment_of(bytes, least_alignment)});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= huge_bytes) (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;
}
// Frees what allocate(bytes, least_alignment) returned, given the same two numbers.
inline void deallocate(void* p, std::size_t bytes, std::size_t least_alignment) noexcept {
  if (p) ::operator delete(p, std::align_val_t{alignment_of(bytes, least_alignment)});
}

}  // namespace zero::host_pages
