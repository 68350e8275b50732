// The host loop's ISA levels for tests that run a check at each: the levels this CPU has, and a guard on the cap.
#pragma once

#include <vector>

#include "zero/sys/host_loop.hpp"

namespace isa_levels {

namespace hl = zero::sys::host_loop;

// Every level up to what the CPU has (scalar: the fallback loop, the rules themselves).
inline std::vector<hl::isa> available() {
  std::vector<hl::isa> r{hl::isa::scalar};
#if defined(ZERO_HOST_SIMD)
  for (hl::isa i : {hl::isa::sse2, hl::isa::avx2, hl::isa::avx512})
    if (i <= hl::detected()) r.push_back(i);
#endif
  return r;
}

// Caps the host loop at `level` while it lives; restores the process-wide cap when a check ends
// (also when it throws).
struct cap_guard {
  hl::isa previous;
  explicit cap_guard(hl::isa level) : previous(hl::set_cap(level)) {}
  ~cap_guard() { hl::set_cap(previous); }
  cap_guard(const cap_guard&) = delete;
  cap_guard& operator=(const cap_guard&) = delete;
};

}  // namespace isa_levels
