// The MLP's linear layers through OpenBLAS's sgemm: train_mlp's kernels where a BLAS was found at build time.
#pragma once

// The same three products as mlp.hpp's loops (forward, weight gradient, input gradient), with the
// same inputs and outputs; only the order of the sums differs (the BLAS's blocking), so the bits
// differ from the loops' but depend only on the shapes: every stage, backend and rank count that
// gives a rank the same rows runs the same calls, and the stages stay bit-identical to each other.
// Weights in bf16/fp16 are converted to fp32 first (sgemm reads fp32 only), as the loops convert
// each element; a gradient in bf16/fp16 gets the fp32 product added and rounded once, as in the loops.

#include <cblas.h>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace mlp::blas {

// One thread per call: each rank is a thread (comm::threads) or a process of its own (MPI), so the
// ranks already fill the cores. Call before the ranks start.
inline void single_threaded() { openblas_set_num_threads(1); }

// `w` as fp32: itself, or its conversion in this thread's scratch buffer.
template <class P>
const float* as_float(const P* w, std::size_t n) {
  if constexpr (std::is_same_v<P, float>) {
    return w;
  } else {
    thread_local std::vector<float> scratch;
    scratch.resize(n);
    for (std::size_t i = 0; i < n; ++i) scratch[i] = static_cast<float>(w[i]);
    return scratch.data();
  }
}

// out[r][o] = b[o] + sum_i in[r][i] * w[o][i]: out starts as the bias, sgemm adds in x w^T.
template <class P>
void linear_forward(const float* in, const P* w, const P* bias, float* out, int rows, int n_in, int n_out) {
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < n_out; ++o) out[static_cast<std::size_t>(r) * n_out + o] = static_cast<float>(bias[o]);
  const float* wf = as_float(w, static_cast<std::size_t>(n_out) * n_in);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n_out, n_in, 1.0f, in, n_in, wf, n_in, 1.0f, out, n_out);
}

// gw[o][i] += sum_r dout[r][o] * in[r][i]; gb[o] += sum_r dout[r][o]; din[r][i] = sum_o dout[r][o] * w[o][i]
template <class P, class G>
void linear_backward(const float* in, const P* w, const float* dout, G* gw, G* gb, float* din, int rows, int n_in,
                     int n_out) {
  for (int o = 0; o < n_out; ++o) {  // the bias gradient: a column sum, as in the loops
    float db = 0.0f;
    for (int r = 0; r < rows; ++r) db += dout[static_cast<std::size_t>(r) * n_out + o];
    gb[o] = static_cast<G>(static_cast<float>(gb[o]) + db);
  }
  const std::size_t nw = static_cast<std::size_t>(n_out) * n_in;
  if constexpr (std::is_same_v<G, float>) {  // accumulate straight into the gradient: dout^T x in
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_out, n_in, rows, 1.0f, dout, n_out, in, n_in, 1.0f, gw,
                n_in);
  } else {
    thread_local std::vector<float> product;
    product.resize(nw);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_out, n_in, rows, 1.0f, dout, n_out, in, n_in, 0.0f,
                product.data(), n_in);
    for (std::size_t i = 0; i < nw; ++i) gw[i] = static_cast<G>(static_cast<float>(gw[i]) + product[i]);
  }
  if (!din) return;
  const float* wf = as_float(w, nw);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n_in, n_out, 1.0f, dout, n_out, wf, n_in, 0.0f, din,
              n_in);
}

}  // namespace mlp::blas
