// sys::host: the memory space and loop of the CPU path: aligned allocation (huge pages for large arrays), copies, the
// element-wise loop, the norm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "zero/core/binned.hpp"
#include "zero/core/elementwise.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/half_types.hpp"
#include "zero/core/host_pages.hpp"
#include "zero/core/square_blocks.hpp"
#include "zero/sys/host_binned.hpp"
#include "zero/sys/host_loop.hpp"
#include "zero/sys/host_products.hpp"
#include "zero/sys/host_quantize.hpp"
#include "zero/sys/host_square_blocks.hpp"

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

  // Large arrays get huge pages (core/host_pages.hpp); deallocate is given the allocation's size.
  static void* allocate(std::size_t bytes) { return host_pages::allocate(bytes, alignment); }
  static void deallocate(void* p, std::size_t bytes) noexcept { host_pages::deallocate(p, bytes, alignment); }
  // The large freed blocks the calling thread keeps for reuse (core/host_pages.hpp), back to the library:
  // release_memory() calls it, so that what it frees leaves the process.
  static void release_spares() noexcept { host_pages::release_spares(); }
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
    // (the reproducible mode's int64 words: sys/host_binned.hpp's loops)
    if constexpr (host_binned::vectorized<Rule, Ts...>)
      host_binned::run(n, rule, ops.data...);
    else
      host_loop::run(n, rule, reads_of(ops...), ops.data...);
  }
  // Bit k set where operand k is read (host_loop prefetches those ahead).
  template <class... Ts>
  static std::uint32_t reads_of(const elementwise::operand<Ts>&... ops) {
    std::uint32_t bits = 0, bit = 1;
    ((bits |= ops.read ? bit : 0u, bit <<= 1), ...);
    return bits;
  }
  // The index loop: rule(j) for j in [0, n), for rules that hold their arrays and read more than
  // element j of them (core/quantize.hpp: a block's scale, a code's block). In order, except the
  // quantizer's rules, which run on packs with the same bytes (sys/host_quantize.hpp).
  template <class Rule>
  static void for_each_index(std::size_t n, const Rule& rule) {
    if constexpr (host_quantize::vectorized<Rule>)
      host_quantize::run(n, rule);
    else
      for (std::size_t j = 0; j < n; ++j) rule(j);
  }
  // The reproducible mode's cut and sum of several ranks' slices (elementwise::binned_cut_sum_rule) on
  // packs (sys/host_binned.hpp), the rule's bits.
  template <class G>
  static void for_each_index(std::size_t n, const elementwise::binned_cut_sum_rule<G>& rule) {
    host_binned::cut_sum(n, rule);
  }
  // A matrix optimizer's products (optional for a system; sys::cuda has none yet): C = A B in the fixed
  // order of sys/host_products.hpp, on packs, `rows(n, f)` running f over ranges of its row blocks.
  template <class RowRunner>
  static host_products<RowRunner> products(RowRunner rows) {
    return host_products<RowRunner>{rows};
  }
  // quant::quantize's scale and encode loops fused block by block (optional for a system; the same
  // bytes as the two index loops): each block of values is read from memory once.
  template <class T>
  static void quantize_blocks(std::size_t blocks, const quant::scale_rule<T>& scale,
                              const quant::encode_rule<T>& codes) {
    host_quantize::quantize_blocks(blocks, scale, codes);
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

  // Whole blocks' sums of squares in core/square_blocks.hpp's order: out[b] from x[64 b, 64 b + 64),
  // b < count (a tensor-wise optimizer's sums, engine/tensor_sums.hpp), on SIMD packs where the CPU
  // has AVX-512 or AVX2 (sys/host_square_blocks.hpp): the same bits.
  static void square_block_sums(const float* x, std::size_t count, double* out) {
    if (host_square_blocks::blocks(x, count, out)) return;
    for (std::size_t b = 0; b < count; ++b) out[b] = square_blocks::sum(x + b * square_blocks::size, square_blocks::size);
  }

  // The first pass of a tensor-wise optimizer (elementwise::advance_keeping_direction_rule) over
  // `blocks` whole blocks, fused with its K terms' block sums into sums[k] (sys/host_square_blocks.hpp);
  // false, with nothing done, where the CPU has no AVX-512 or AVX2 (the caller runs the pass, then the sums).
  template <int K, class Rule, class... Ts>
  static bool for_each_summing(std::size_t blocks, const Rule& rule, double* const* sums,
                               elementwise::operand<Ts>... ops) {
    return host_square_blocks::summing<K>(blocks, rule, sums, reads_of(ops...), ops.data...);
  }

  // ---- the reproducible reduction's reductions (core/binned.hpp; a system without them cannot run
  // engine_options::reproducible) ----

  // The summary of x, or of x / divisor where `divide`, over the values of several segments (x widened
  // to fp32): the bin of the largest finite magnitude, which is the largest bit pattern without the
  // sign (compared as integers, so that packs compare as one value does), and the non-finite flags;
  // `largest` is that magnitude.
  struct magnitude_summary : binned::summary {
    float largest = 0.0f;
  };
  template <class G>
  static magnitude_summary largest_magnitude(const G* const* segments, const std::size_t* sizes, std::size_t count,
                                             bool divide, float divisor) {
    std::uint32_t largest = 0, infinite = 0, nan = 0;
    for (std::size_t k = 0; k < count; ++k) {
      // whole SIMD packs first (sys/host_binned.hpp), the same comparisons lane by lane
      const std::size_t packed =
          host_binned::magnitudes(segments[k], sizes[k], divide, divisor, largest, infinite, nan);
      for (std::size_t j = packed; j < sizes[k]; ++j) {
        const float x = static_cast<float>(segments[k][j]);
        const float v = divide ? fp::div(x, divisor) : x;
        const std::uint32_t a = zero::detail::float_to_u32(v) & 0x7fffffffu;
        infinite |= a == 0x7f800000u;
        nan |= a > 0x7f800000u;
        const std::uint32_t finite = a < 0x7f800000u ? a : 0u;
        largest = finite > largest ? finite : largest;
      }
    }
    magnitude_summary s;
    s.largest = zero::detail::u32_to_float(largest);
    s.bin = binned::summary_of(s.largest).bin;
    s.flags = (infinite ? binned::summary::infinite : 0u) | (nan ? binned::summary::not_a_number : 0u);
    return s;
  }

  // The binned::summary (largest bin, non-finite flags) of n gradient values widened to fp32, packed.
  template <class G>
  static std::int64_t binned_summary(const G* g, std::size_t n) {
    return binned::pack(largest_magnitude(&g, &n, 1, false, 1.0f));
  }
  // The summary of the squares (in double, exact) of g[j] / divisor (an fp32 division, the gradient the
  // optimizer sees) over several segments, packed.
  template <class G>
  static std::int64_t binned_square_summary(const G* const* segments, const std::size_t* sizes, std::size_t count,
                                            float divisor) {
    // The largest square is the square of the largest magnitude.
    const magnitude_summary s = largest_magnitude(segments, sizes, count, true, divisor);
    const binned::summary sq = binned::summary_of(static_cast<double>(s.largest) * s.largest);
    return binned::pack(binned::summary{s.finite() ? sq.bin : -1, s.flags});
  }
  // The digits of the squares (in double, exact) of g[j] (of g[j] / divisor, an fp32 division, where
  // `divide`), j in [0, n), every one finite, in the bins top - 1, top - 2 and top - 3 (binned::format
  // <double>; top is above every square's bin), summed without carries and added to d[0..3): the
  // words binned::to_words gives each square below the top bin, added up. Each digit is below 2^32, so
  // a sum of fewer than 2^31 of them fits. Whole packs on AVX-512 (sys/host_binned.hpp), the rest
  // one at a time: integers, so the same sums.
  template <class G>
  static void binned_square_digits(const G* g, std::size_t n, bool divide, float divisor, int top,
                                   std::int64_t* d) {
    for (std::size_t j = host_binned::square_digits(g, n, divide, divisor, top, d); j < n; ++j) {
      const float x = static_cast<float>(g[j]);
      const double y = divide ? fp::div(x, divisor) : x;
      std::int64_t w[binned::words + 1];
      binned::to_words(y * y, top, w);
      for (int k = 0; k < binned::words; ++k) d[k] += w[k + 1];
    }
  }
  // The same squares of g[j] / divisor over several segments summed into binned::words + 1 words whose
  // top bin is `top` (one above the largest square's: it takes the carries), carried so that all words
  // but the top are below 2^32. Adds the words to words[0..binned::words]. The digits are carried every
  // 2^30 terms, before any could overflow: the carried words are the one representation of the exact
  // total, however it was added up.
  template <class G>
  static void binned_sum_of_squares(const G* const* segments, const std::size_t* sizes, std::size_t count,
                                    float divisor, int top, std::int64_t* words) {
    constexpr int K = binned::words + 1;
    constexpr std::size_t chunk = binned::max_terms / 2;
    std::int64_t acc[K] = {};
    for (std::size_t k = 0; k < count; ++k)
      for (std::size_t at = 0; at < sizes[k]; at += chunk) {
        const std::size_t n = sizes[k] - at < chunk ? sizes[k] - at : chunk;
        binned_square_digits(segments[k] + at, n, true, divisor, top, acc + 1);
        binned::carry(acc);
      }
    binned::carry(acc);
    for (int i = 0; i < K; ++i) words[i] += acc[i];
  }
};

}  // namespace zero::sys
