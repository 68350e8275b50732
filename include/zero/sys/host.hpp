// sys::host: the memory space of the CPU path: 64-byte aligned allocation, fills and copies.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>

namespace zero::sys {

struct host {
  static constexpr std::size_t alignment = 64;  // a cache line; also the shard alignment in bytes

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return ::operator new(bytes, std::align_val_t{alignment});
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) ::operator delete(p, std::align_val_t{alignment});
  }
  static void fill_zero(void* p, std::size_t bytes) {
    if (bytes) std::memset(p, 0, bytes);
  }
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
};

}  // namespace zero::sys
