// sys::host: the memory space and loop of the CPU path: 64-byte aligned allocation, copies, the element-wise loop, the
// norm.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>

#include "zero/core/elementwise.hpp"
#include "zero/sys/host_loop.hpp"

namespace zero::sys {

// The system interface the engine uses (sys::cuda mirrors it with device memory, kernels and a
// stream): allocation, fills and copies within the space and to/from host memory, one element-wise
// loop (for_each) that runs any rule of core/elementwise.hpp, an index loop (for_each_index) for
// rules that own their arrays, and the gradient norm's reduction. Host memory is the
// host: every call completes before it returns.
//
// Optional: `memory_info available() const` (core/memory.hpp), the free memory the engine checks its
// model states against before it allocates them; sys::cuda has it. sys::host has not, on purpose:
// host memory is shared with the OS, its page cache and other processes, and Linux overcommits, so
// no reading of "free" predicts what will fit (it would refuse runs that fit, or pass runs the OOM
// killer ends). The host's limit is the budget the user states, engine_options::memory_limit_bytes.
// A failed allocation (std::bad_alloc) becomes error_kind::out_of_memory in the engine's buffer.
struct host {
  static constexpr std::size_t alignment = 64;  // a cache line; also the shard alignment in bytes
  // Its memory is the host's: the host loop may read and write it directly (an offloaded update).
  static constexpr bool host_addressable = true;

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
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  static void synchronize() {}

  // The one element-wise loop: rule(j, operands' arrays...) for j in [0, n) (the rules of
  // core/elementwise.hpp; any rule that touches only element j). Adding a step is adding a rule.
  // Vectorized for the CPU it runs on (sys/host_loop.hpp), with the bits of the in-order loop.
  template <class Rule, class... Ts>
  static void for_each(std::size_t n, const Rule& rule, elementwise::operand<Ts>... ops) {
    host_loop::run(n, rule, ops.data...);
  }
  // The index loop: rule(j) for j in [0, n), for rules that hold their arrays and read more than
  // element j of them (core/quantize.hpp: a block's scale, a code's block). In order.
  template <class Rule>
  static void for_each_index(std::size_t n, const Rule& rule) {
    for (std::size_t j = 0; j < n; ++j) rule(j);
  }
  // The gradient norm's reduction (elementwise::square per element).
  // Summed left to right: the engine depends on the order being fixed, not on it being this one.
  template <class G>
  static double sum_of_squares(const G* g, std::size_t n, float divisor) {
    double acc = 0.0;
    for (std::size_t j = 0; j < n; ++j) acc += elementwise::square(g, divisor, j);
    return acc;
  }
  // The same over several segments: each summed as above, the segment sums added in order starting
  // from 0 (one call, so a device system waits for its results once, not once per segment).
  template <class G>
  static double sum_of_squares(const G* const* segments, const std::size_t* sizes, std::size_t count, float divisor) {
    double acc = 0.0;
    for (std::size_t k = 0; k < count; ++k) acc += sum_of_squares(segments[k], sizes[k], divisor);
    return acc;
  }
};

}  // namespace zero::sys
