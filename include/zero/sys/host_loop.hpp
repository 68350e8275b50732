// sys::host_loop: the host's element-wise loop, run on simd::packs of the widest ISA the CPU has (AVX-512, AVX2, SSE2), chosen at run time.
#pragma once

#include <atomic>
#include <cstddef>

#include "zero/core/elementwise.hpp"

// Why run-time dispatch: zero is header-only and its users build without -march (a binary that
// runs on any x86-64), so the compiler may only assume SSE2. The loop is therefore compiled three
// times from the same template, each copy under a target attribute (the only place where an ISA is
// named), and the copy the CPU supports is picked per call. `flatten` inlines the rule, the
// optimizer's update and the pack operations into each copy, so a pack of 16 floats lives in one
// AVX-512 register there instead of being passed between functions compiled for another target.
// Results do not depend on the copy: each performs the rule's IEEE operations lane by lane.
namespace zero::sys::host_loop {

// Ordered: a level includes the ones below it.
enum class isa : int { scalar = 0, sse2 = 1, avx2 = 2, avx512 = 3 };

inline const char* name(isa i) {
  switch (i) {
    case isa::scalar: return "scalar";
    case isa::sse2: return "sse2";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "?";
}

#if defined(ZERO_HOST_SIMD)

// The best level of this CPU (cpuid through the compiler's runtime, which also checks that the OS
// saves the wide registers).
inline isa detected() {
  static const isa level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
      return isa::avx512;
    if (__builtin_cpu_supports("avx2")) return isa::avx2;
    return isa::sse2;
  }();
  return level;
}

// A cap on the level used (tests and the bench run every level the CPU has): the loop runs
// min(cap, detected()). Process-wide; the default is no cap.
inline std::atomic<isa>& cap_storage() {
  static std::atomic<isa> cap{isa::avx512};
  return cap;
}
// Sets the cap and returns the previous one.
inline isa set_cap(isa level) { return cap_storage().exchange(level, std::memory_order_relaxed); }

inline isa active() {
  const isa c = cap_storage().load(std::memory_order_relaxed);
  const isa d = detected();
  return c < d ? c : d;
}

// Whether the rule runs on packs: it has apply<pack> for these operands (an optimizer whose update
// is written for float only has not, see elementwise::update_over) and every operand is a float,
// bf16 or fp16 array.
template <class Rule, class... Ts>
concept vectorizable = (simd::lane_type<Ts> && ...) && requires(const Rule& r, std::size_t j, Ts*... p) {
  r.template apply<simd::pack<4>>(j, p...);
};

// Blocks of W elements on packs, then the last n mod W one at a time (the same operations on float).
template <int W, class Rule, class... Ts>
ZERO_SIMD_INLINE void blocks(std::size_t n, const Rule& rule, Ts*... p) {
  std::size_t j = 0;
  for (; j + W <= n; j += W) rule.template apply<simd::pack<W>>(j, p...);
  for (; j < n; ++j) rule.template apply<float>(j, p...);
}

// Each wide loop ends with vzeroupper, written out: compilers insert it on leaving AVX code only when
// optimizing (g++ from -O2), and a caller compiled at -O0/-O1 would otherwise go on with the upper
// halves of the vector registers dirty, which makes every later SSE instruction of the program (its
// own loops compiled for the baseline ISA, libm's expf and tanhf) pay a merge: measured 3x slower on
// the GPT example's kernels after an AVX-512 optimizer step.
template <class Rule, class... Ts>
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) void run_avx512(std::size_t n, const Rule& rule,
                                                                                       Ts*... p) {
  blocks<16>(n, rule, p...);
  _mm256_zeroupper();
}
template <class Rule, class... Ts>
__attribute__((target("avx2"), flatten)) void run_avx2(std::size_t n, const Rule& rule, Ts*... p) {
  blocks<8>(n, rule, p...);
  _mm256_zeroupper();
}
template <class Rule, class... Ts>
__attribute__((flatten)) void run_sse2(std::size_t n, const Rule& rule, Ts*... p) {
  blocks<4>(n, rule, p...);
}

#endif

// rule(j, p...) for j in [0, n): on packs where the rule allows it, else one element at a time.
template <class Rule, class... Ts>
void run(std::size_t n, const Rule& rule, Ts*... p) {
#if defined(ZERO_HOST_SIMD)
  if constexpr (vectorizable<Rule, Ts...>) {
    switch (active()) {
      case isa::avx512: return run_avx512(n, rule, p...);
      case isa::avx2: return run_avx2(n, rule, p...);
      case isa::sse2: return run_sse2(n, rule, p...);
      case isa::scalar: break;
    }
  }
#endif
  for (std::size_t j = 0; j < n; ++j) rule(j, p...);
}

}  // namespace zero::sys::host_loop
