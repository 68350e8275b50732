// host_pages: host memory for large arrays, on huge-page boundaries and advised as transparent huge pages.
#pragma once

#include <array>
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
// Blocks of this size or more are kept for reuse when freed (detail::spare_blocks): the C library
// serves them with mmap from its default threshold (128 KiB) on and gives them back on free, so each
// one allocated again comes through page faults. Measured on a Zen 4 (train_mlp, 8 layers of 512,
// stage 3 at N = 4): with only blocks of huge_bytes kept, the units' 1 MiB gathers and gradient
// buckets faulted 8,600 pages a step, a third of the step's time.
inline constexpr std::size_t spare_least_bytes = std::size_t{128} << 10;

// The alignment an array of `bytes` gets when it asks for at least `least`.
constexpr std::size_t alignment_of(std::size_t bytes, std::size_t least) {
  return bytes >= huge_bytes && least < huge_bytes ? huge_bytes : least;
}

// Whether freed large blocks are kept for reuse (detail::spare_blocks): not under AddressSanitizer,
// whose use-after-free reports need every block really freed.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool keeps_spares = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool keeps_spares = false;
#else
inline constexpr bool keeps_spares = true;
#endif
#else
inline constexpr bool keeps_spares = true;
#endif

namespace detail {

inline void* fresh(std::size_t bytes, std::size_t alignment) {
  void* p = ::operator new(bytes, std::align_val_t{alignment});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= huge_bytes) (void)::madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;
}

// Why: the engine allocates its transient buffers per unit (gradient buckets, gathered units, the
// reproducible mode's words) and frees each soon after; the C library hands blocks this large back to
// the kernel, and each new one comes back through page faults that zero it. Measured on a Zen 4
// (train_mlp, 8 layers of 512, stage 2 at N = 2, perf): the kernel's page zeroing was 22% of a
// reproducible step's time, and page faults with their zeroing 9% of a default stage-3 step's. So each
// thread keeps the last `count` large blocks it freed and gives one back to an allocation of the same
// size and alignment. An allocation that finds none first frees the oldest kept blocks, at least its
// own size of them (all, if they hold less), so the kept blocks never add to the thread's peak: a free
// moves bytes from the live buffers to the kept ones, a reuse moves them back, and a miss gives back
// at least what it asks the kernel for.
class spare_blocks {
 public:
  // 16: between two allocations of one size a stage-3 step frees gathered units, gradient buckets and
  // the reproducible mode's words of several sizes; with 4 kept, that mode still faulted about 160
  // pages a step (train_mlp, 8 layers of 512, N = 4), with 16 about 7.
  static constexpr std::size_t count = 16;
  spare_blocks() = default;
  spare_blocks(const spare_blocks&) = delete;
  spare_blocks& operator=(const spare_blocks&) = delete;
  ~spare_blocks() { release(); }

  void* take(std::size_t bytes, std::size_t alignment) {
    for (std::size_t i = used_; i-- > 0;)
      if (kept_[i].bytes == bytes && kept_[i].alignment == alignment) {
        void* p = kept_[i].p;
        for (std::size_t j = i; j + 1 < used_; ++j) kept_[j] = kept_[j + 1];
        --used_;
        return p;
      }
    // A miss: give back the oldest kept blocks, at least as many bytes as the new one, so that the
    // thread's live and kept bytes together stay where they were.
    std::size_t freed = 0, gone = 0;
    while (gone < used_ && freed < bytes) freed += kept_[gone].bytes, free_one(kept_[gone++]);
    for (std::size_t j = gone; j < used_; ++j) kept_[j - gone] = kept_[j];
    used_ -= gone;
    return nullptr;
  }
  // Keeps p (the most recent last); the oldest goes back to the library when all places are taken.
  void keep(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    if (used_ == count) {
      free_one(kept_[0]);
      for (std::size_t j = 0; j + 1 < used_; ++j) kept_[j] = kept_[j + 1];
      --used_;
    }
    kept_[used_++] = {p, bytes, alignment};
  }
  // Every kept block back to the library.
  void release() noexcept {
    for (std::size_t i = 0; i < used_; ++i) free_one(kept_[i]);
    used_ = 0;
  }
  std::size_t kept_bytes() const noexcept {
    std::size_t n = 0;
    for (std::size_t i = 0; i < used_; ++i) n += kept_[i].bytes;
    return n;
  }

 private:
  struct block {
    void* p = nullptr;
    std::size_t bytes = 0, alignment = 0;
  };
  static void free_one(const block& b) noexcept { ::operator delete(b.p, std::align_val_t{b.alignment}); }
  std::array<block, count> kept_{};
  std::size_t used_ = 0;
};

inline spare_blocks& spares() {
  thread_local spare_blocks s;
  return s;
}

}  // namespace detail

// `bytes` of uninitialised memory (nullptr for 0); throws std::bad_alloc.
inline void* allocate(std::size_t bytes, std::size_t least_alignment) {
  if (bytes == 0) return nullptr;
  const std::size_t alignment = alignment_of(bytes, least_alignment);
  if (keeps_spares && bytes >= spare_least_bytes)
    if (void* p = detail::spares().take(bytes, alignment)) return p;
  return detail::fresh(bytes, alignment);
}
// Frees what allocate(bytes, least_alignment) returned, given the same two numbers. A large block is
// kept by the calling thread for its next allocation of that size (detail::spare_blocks).
inline void deallocate(void* p, std::size_t bytes, std::size_t least_alignment) noexcept {
  if (!p) return;
  const std::size_t alignment = alignment_of(bytes, least_alignment);
  if (keeps_spares && bytes >= spare_least_bytes)
    detail::spares().keep(p, bytes, alignment);
  else
    ::operator delete(p, std::align_val_t{alignment});
}
// The large blocks the calling thread keeps, back to the library (and from it, to the kernel): for a
// thread that has freed large buffers and will not allocate again soon.
inline void release_spares() noexcept { detail::spares().release(); }
// The bytes of the blocks the calling thread keeps.
inline std::size_t spare_bytes() noexcept { return detail::spares().kept_bytes(); }

}  // namespace zero::host_pages
