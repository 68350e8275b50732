// sys::host_loop: the host's element-wise loop, run on simd::packs of the widest ISA the CPU has (AVX-512, AVX2, SSE2), chosen at run time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

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
// saves the wide registers). The avx2 level is AVX2 with FMA.
inline isa detected() {
  static const isa level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
      return isa::avx512;
    // With FMA: the AVX2 copies of the sums of squares fuse each exact square with its add (the same
    // bits: a float's square is exact in double). Every CPU with AVX2 has it; one without takes SSE2.
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return isa::avx2;
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
// The rule is copied into the loop's frame first: read through the caller's reference, its step
// constants may alias the arrays the loop stores to, so the compiler reloads and broadcasts each of
// them on every block (a dozen loads per block of AdamW); a local copy whose address never escapes
// cannot alias, and they stay in registers.
//
// Each block also asks for the lines prefetch_bytes ahead of it in every array the rule reads (bit k
// of `reads`: operand k): the hardware's stream prefetchers alone left one core's AdamW at 0.90 of
// DeepSpeed's CPU Adam on the same tensors, and 256 to 512 bytes ahead brought it to 0.99 (Zen 4; 1 KiB
// and more fell back). An array only written is left to the store: a prefetch of it fetched lines
// that full-line stores would not have read (the fp32 cast: 0.72x). An address past an array's end is
// only prefetched, never read: a prefetch does not fault.
inline constexpr std::uintptr_t prefetch_bytes = 512;

// The line prefetch_bytes ahead of element j where the array is read, else `idle` (a line in L1): the
// choice is a select, not a branch (branches per array measured 2-4% slower on AdamW).
template <class T>
ZERO_SIMD_INLINE void prefetch_ahead(T* p, std::size_t j, bool read, const void* idle) {
  const auto ahead = reinterpret_cast<std::uintptr_t>(p + j) + prefetch_bytes;
  __builtin_prefetch(read ? reinterpret_cast<const void*>(ahead) : idle, 1);
}

template <int W, class Rule, class... Ts>
ZERO_SIMD_INLINE void blocks(std::size_t n, const Rule& caller_rule, std::uint32_t reads, Ts*... p) {
  const Rule rule = caller_rule;
  // One prefetch per array and 16 elements (a line of fp32): SSE2's packs of 4 asking four times per
  // line ran SGD at 0.6x.
  constexpr std::size_t line = W < 16 ? 16 : W;
  std::size_t j = 0;
  for (; j + line <= n; j += line) {
    int k = 0;
    (prefetch_ahead(p, j, (reads >> k++) & 1u, &rule), ...);
    for (std::size_t i = 0; i < line; i += W) rule.template apply<simd::pack<W>>(j + i, p...);
  }
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
                                                                                       std::uint32_t reads, Ts*... p) {
  blocks<16>(n, rule, reads, p...);
  _mm256_zeroupper();
}
template <class Rule, class... Ts>
__attribute__((target("avx2"), flatten)) void run_avx2(std::size_t n, const Rule& rule, std::uint32_t reads, Ts*... p) {
  blocks<8>(n, rule, reads, p...);
  _mm256_zeroupper();
}
template <class Rule, class... Ts>
__attribute__((flatten)) void run_sse2(std::size_t n, const Rule& rule, std::uint32_t reads, Ts*... p) {
  blocks<4>(n, rule, reads, p...);
}

#endif

// rule(j, p...) for j in [0, n): on packs where the rule allows it, else one element at a time. Bit k of
// `reads` says that the rule reads array k (prefetched ahead on packs).
template <class Rule, class... Ts>
void run(std::size_t n, const Rule& rule, std::uint32_t reads, Ts*... p) {
  static_assert(sizeof...(Ts) <= 32, "one bit of `reads` per array");
#if defined(ZERO_HOST_SIMD)
  if constexpr (vectorizable<Rule, Ts...>) {
    switch (active()) {
      case isa::avx512: return run_avx512(n, rule, reads, p...);
      case isa::avx2: return run_avx2(n, rule, reads, p...);
      case isa::sse2: return run_sse2(n, rule, reads, p...);
      case isa::scalar: break;
    }
  }
#endif
  (void)reads;
  for (std::size_t j = 0; j < n; ++j) rule(j, p...);
}

}  // namespace zero::sys::host_loop
