// sys::host_gemm: C = A B with each sum in the fixed order of optim::newton_schulz, blocked and packed as a BLAS is, on packs of one ISA.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>

#include "zero/core/elementwise.hpp"
#include "zero/core/fp.hpp"
#include "zero/sys/host_loop.hpp"

// Why a blocked, packed product in a fixed order: Muon's orthogonalization must give the same bits on
// every rank, ISA and thread count (optim/newton_schulz.hpp), so each C(i, j) is summed from +0 over
// q = 0, 1, ..., k - 1, each product and sum rounded (a multiply, then an add: never a fused
// multiply-add). A BLAS reorders nothing inside one such sum either; what makes it fast is where the
// operands are while the sums run, and that is free to copy:
//
// - A tile of mr rows x nr columns of C is held in registers (nr a few packs wide) while the sum runs
//   over a block of kc values of q: per q, one row of the tile's B columns (nr floats, contiguous)
//   and mr broadcast values of A feed mr x nr multiply-adds, and C is not touched inside the sum. Two
//   instructions per multiply-add instead of sgemm's one fused: Zen 4 issues the multiplies to its two
//   FMA pipes and the adds to two pipes of their own, so the pair still retires a multiply-add per lane
//   and cycle (the 8 x 32 tile ran at sgemm's rate, about 100 G FLOP/s on one core).
// - The sum is cut over q into blocks of kc: the first block starts each sum from +0, a later one
//   reloads the partial sum it stored in C and goes on with the same chain. A float stored and read
//   back is the same float, so the cut changes no bit; a NaN stays a NaN through the rest of the sum,
//   so it is canonicalised where it is stored, as elementwise::store does.
// - B's block of kc rows x nc columns is copied once into micro-panels of kc x nr (each q's nr floats
//   next to the next q's): a tile then reads its B sequentially, from L2 (the block is 512 KiB), where
//   the unblocked loop re-read a strided column strip of B from memory for every tile. A is read in
//   place (a tile's mr rows, one value of each per q, broadcast): copying A's mr x kc panel as well,
//   as a BLAS does, measured slower (0.70 of this speed on 64 x 256 x 64, 0.93 on 1024^3, Zen 4),
//   since a panel serves only m / nr tiles.
// - The tiles at the edges (n, m not multiples of mr, nr) are computed whole, on zero-padded operands
//   (B's micro-panel, a copy of A's last rows), into a tile-sized buffer whose valid part is copied to
//   C: the padded lanes are summed (an inf times a padded +0 may make a NaN there) and never stored.
// - kc = 256, nc = 512: kc from 128 to 1024 and nc from 256 to 1024 were within 5% of each other on
//   1024^3 and 768^3 (Zen 4), this one among the best.
#if defined(ZERO_HOST_SIMD)
#define ZERO_GEMM_INLINE ZERO_SIMD_INLINE
#else
#define ZERO_GEMM_INLINE inline
#endif
// The tile's loops unrolled whole, so that its accumulators live in registers. nvcc's front end does
// not know GCC's spelling and warns on every use; a CUDA translation unit never runs these products
// (matrix optimizers run on host systems), so there it unrolls nothing.
#if defined(__CUDACC__)
#define ZERO_GEMM_UNROLL
#else
#define ZERO_GEMM_UNROLL _Pragma("GCC unroll 64")
#endif

namespace zero::sys::host_gemm {

// How the product is blocked: kc values of q per block of the sums, nc columns of B per packed block
// (rounded up to whole tiles).
struct blocking {
  std::size_t kc, nc;
};
inline constexpr blocking default_blocking{256, 512};

// A thread's packing buffers, kept across calls and grown to the largest block asked (the packed B
// block, kc x nc floats, 512 KiB, and the padded copy of A's last rows): no allocation per call once a
// thread has run the largest shape. Per thread, so that the threads of a product never share one.
class workspace {
 public:
  float* b(std::size_t floats) { return b_.reserve(floats); }
  float* a(std::size_t floats) { return a_.reserve(floats); }
  static workspace& of_this_thread() {
    static thread_local workspace w;
    return w;
  }

 private:
  struct buffer {
    float* data = nullptr;
    std::size_t size = 0;
    float* reserve(std::size_t floats) {
      if (floats > size) {
        release();
        data = static_cast<float*>(::operator new(floats * sizeof(float), std::align_val_t{64}));
        size = floats;
      }
      return data;
    }
    void release() {
      if (data) ::operator delete(data, std::align_val_t{64});
      data = nullptr;
      size = 0;
    }
    ~buffer() { release(); }
  };
  buffer b_, a_;
};

// The width of a value type: 1 for float, W for simd::pack<W>.
template <class V>
inline constexpr std::size_t width_of = 1;
#if defined(ZERO_HOST_SIMD)
template <int W>
inline constexpr std::size_t width_of<simd::pack<W>> = W;
#endif

// B's rows [0, kc) x columns [0, nc) (row length ldb) into micro-panels of nr columns: panel p holds,
// for each q, columns p nr .. p nr + nr - 1 of row q, contiguous; the columns past nc are +0 (their
// lanes are computed and never stored).
template <std::size_t NR>
ZERO_GEMM_INLINE void pack_b(const float* b, std::size_t ldb, std::size_t kc, std::size_t nc, float* to) {
  for (std::size_t j = 0; j < nc; j += NR, to += kc * NR) {
    const std::size_t cols = std::min(NR, nc - j);
    for (std::size_t q = 0; q < kc; ++q) {
      std::memcpy(to + q * NR, b + q * ldb + j, cols * sizeof(float));
      if (cols < NR) std::memset(to + q * NR + cols, 0, (NR - cols) * sizeof(float));
    }
  }
}

// A's last rows [0, rows), rows < MR, x columns [0, kc) (row length lda) into a panel of kc x MR: for
// each q, the MR rows' values side by side, the rows past `rows` +0.
template <std::size_t MR>
ZERO_GEMM_INLINE void pack_a(const float* a, std::size_t lda, std::size_t rows, std::size_t kc, float* to) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t q = 0; q < kc; ++q) to[q * MR + r] = a[r * lda + q];
  for (std::size_t r = rows; r < MR; ++r)
    for (std::size_t q = 0; q < kc; ++q) to[q * MR + r] = 0.0f;
}

// The register tile: C's MR rows x NP packs (row length ldc) summed over kc values of q, from +0
// (first) or from the partial sums C holds, and stored with every NaN canonical. Row r's value of A at
// q is a[r a_row + q a_q] (A in place: a_row = k, a_q = 1; its padded copy: 1, MR); b is a packed
// micro-panel. Per q and row, a multiply then an add, each rounded: the sum's order, lane by lane.
template <class V, std::size_t MR, std::size_t NP>
ZERO_GEMM_INLINE void tile(const float* a, std::size_t a_row, std::size_t a_q, const float* b, std::size_t kc, float* c,
                           std::size_t ldc, bool first) {
  using namespace zero::fp;
  constexpr std::size_t W = width_of<V>, NR = NP * W;
  V acc[MR][NP];
ZERO_GEMM_UNROLL
  for (std::size_t r = 0; r < MR; ++r)
ZERO_GEMM_UNROLL
    for (std::size_t p = 0; p < NP; ++p) acc[r][p] = first ? V(0.0f) : elementwise::load<V>(c + r * ldc, p * W);
  for (std::size_t q = 0; q < kc; ++q, a += a_q, b += NR) {
    V bq[NP];
ZERO_GEMM_UNROLL
    for (std::size_t p = 0; p < NP; ++p) bq[p] = elementwise::load<V>(b, p * W);
ZERO_GEMM_UNROLL
    for (std::size_t r = 0; r < MR; ++r) {
      const V ar(a[r * a_row]);
ZERO_GEMM_UNROLL
      for (std::size_t p = 0; p < NP; ++p) acc[r][p] = add(acc[r][p], mul(ar, bq[p]));
    }
  }
ZERO_GEMM_UNROLL
  for (std::size_t r = 0; r < MR; ++r)
ZERO_GEMM_UNROLL
    for (std::size_t p = 0; p < NP; ++p) elementwise::store(c + r * ldc, p * W, acc[r][p]);
}

// Rows [row_begin, row_end) of C (n x m) = A (n x k) B (k x m), row-major, on one thread: tiles of
// MR rows x NP packs of V. Loops from the outside: nc columns of C (B's block packed per block of
// kc), then tiles of MR rows, each over the block's columns, A's MR x kc in L1 across them.
template <class V, std::size_t MR, std::size_t NP>
ZERO_GEMM_INLINE void multiply_rows(const float* A, const float* B, float* C, std::size_t k, std::size_t m,
                                    std::size_t row_begin, std::size_t row_end, blocking blk, workspace& ws) {
  constexpr std::size_t NR = NP * width_of<V>;
  if (row_begin >= row_end) return;
  if (k == 0) {  // a sum of nothing: +0
    for (std::size_t i = row_begin; i < row_end; ++i) std::fill(C + i * m, C + (i + 1) * m, 0.0f);
    return;
  }
  const std::size_t kc = std::min(blk.kc, k), nc = std::min((blk.nc + NR - 1) / NR * NR, (m + NR - 1) / NR * NR);
  float* bp = ws.b(kc * nc);
  float* ap = ws.a(kc * MR);
  alignas(64) float edge[MR * NR];
  for (std::size_t jc = 0; jc < m; jc += nc) {
    const std::size_t nb = std::min(nc, m - jc);
    for (std::size_t pc = 0; pc < k; pc += kc) {
      const std::size_t kb = std::min(kc, k - pc);
      const bool first = pc == 0;
      pack_b<NR>(B + pc * m + jc, m, kb, nb, bp);
      for (std::size_t i = row_begin; i < row_end; i += MR) {
        const std::size_t rows = std::min(MR, row_end - i);
        if (rows < MR) pack_a<MR>(A + i * k + pc, k, rows, kb, ap);  // the last tile of rows, padded
        for (std::size_t jr = 0; jr < nb; jr += NR) {
          const std::size_t cols = std::min(NR, nb - jr);
          float* c = C + i * m + jc + jr;
          const float* b = bp + jr * kb;
          if (rows == MR && cols == NR) {
            tile<V, MR, NP>(A + i * k + pc, k, 1, b, kb, c, m, first);
            continue;
          }
          std::fill(edge, edge + MR * NR, 0.0f);
          if (!first)
            for (std::size_t r = 0; r < rows; ++r) std::memcpy(edge + r * NR, c + r * m, cols * sizeof(float));
          if (rows == MR) tile<V, MR, NP>(A + i * k + pc, k, 1, b, kb, edge, NR, first);
          else tile<V, MR, NP>(ap, 1, MR, b, kb, edge, NR, first);
          for (std::size_t r = 0; r < rows; ++r) std::memcpy(c + r * m, edge + r * NR, cols * sizeof(float));
        }
      }
    }
  }
}

// One entry per ISA level, each compiled for its target with everything inlined (`flatten`, as
// sys/host_loop.hpp's loops): the tile's packs then live in that level's registers. The tiles: 8 x 32
// on AVX-512 (16 accumulators of its 32 registers), 6 x 16 on AVX2 and 6 x 8 on SSE2 (12 of 16),
// 4 x 4 floats on the scalar level. The tile changes which register holds a sum, never its order:
// every level gives the same bits.
#if defined(ZERO_HOST_SIMD)
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"), flatten)) inline void rows_avx512(
    const float* A, const float* B, float* C, std::size_t k, std::size_t m, std::size_t begin, std::size_t end,
    blocking blk, workspace& ws) {
  multiply_rows<simd::pack<16>, 8, 2>(A, B, C, k, m, begin, end, blk, ws);
  _mm256_zeroupper();  // as host_loop's wide loops, for callers compiled below -O2
}
__attribute__((target("avx2"), flatten)) inline void rows_avx2(const float* A, const float* B, float* C, std::size_t k,
                                                               std::size_t m, std::size_t begin, std::size_t end,
                                                               blocking blk, workspace& ws) {
  multiply_rows<simd::pack<8>, 6, 2>(A, B, C, k, m, begin, end, blk, ws);
  _mm256_zeroupper();
}
__attribute__((flatten)) inline void rows_sse2(const float* A, const float* B, float* C, std::size_t k, std::size_t m,
                                               std::size_t begin, std::size_t end, blocking blk, workspace& ws) {
  multiply_rows<simd::pack<4>, 6, 2>(A, B, C, k, m, begin, end, blk, ws);
}
#endif
__attribute__((flatten)) inline void rows_scalar(const float* A, const float* B, float* C, std::size_t k, std::size_t m,
                                                 std::size_t begin, std::size_t end, blocking blk, workspace& ws) {
  multiply_rows<float, 4, 4>(A, B, C, k, m, begin, end, blk, ws);
}

// The rows of a level's tile: a thread's share of C is whole tiles of rows.
inline std::size_t tile_rows(host_loop::isa level) {
  switch (level) {
    case host_loop::isa::avx512: return 8;
    case host_loop::isa::avx2:
    case host_loop::isa::sse2: return 6;
    case host_loop::isa::scalar: break;
  }
  return 4;
}

// Rows [begin, end) of C = A B on the calling thread at `level` (begin a multiple of tile_rows(level)).
inline void multiply_rows(host_loop::isa level, const float* A, const float* B, float* C, std::size_t k, std::size_t m,
                          std::size_t begin, std::size_t end, blocking blk = default_blocking) {
  workspace& ws = workspace::of_this_thread();
  switch (level) {
#if defined(ZERO_HOST_SIMD)
    case host_loop::isa::avx512: return rows_avx512(A, B, C, k, m, begin, end, blk, ws);
    case host_loop::isa::avx2: return rows_avx2(A, B, C, k, m, begin, end, blk, ws);
    case host_loop::isa::sse2: return rows_sse2(A, B, C, k, m, begin, end, blk, ws);
#endif
    default: return rows_scalar(A, B, C, k, m, begin, end, blk, ws);
  }
}

}  // namespace zero::sys::host_gemm
