// The GPT example's CPU kernels (linear, layer norm, causal attention, GELU, cross-entropy): their declarations.
#pragma once

// Written for clarity first, speed second: every inner loop runs over contiguous memory, and a dot
// product keeps eight partial sums. Why eight: the library compiles with -ffp-contract=off and no
// -ffast-math, so the compiler may not reorder a float sum by itself; a single accumulator is then a
// chain of dependent additions (one every few cycles). Eight explicit partial sums, added in a fixed
// order, give it eight independent lanes it can vectorize, and the result is still one defined
// sequence of roundings: the same bits on every run, rank and ZeRO stage. No BLAS yet.
//
// Shapes: R rows (tokens: sequences x positions), C channels. A linear layer's weight is [out, in],
// row-major, as PyTorch's nn.Linear stores it (so an exported model reads like one).
//
// The loops live in gpt_kernels.cpp, a translation unit of their own that the build compiles at -O3
// (the vectorizer is what makes them fast) while train_gpt.cpp, 72 engine instantiations,
// compiles at the examples' level: the kernels' speed without paying -O3 for the engines.

#include <cstddef>

namespace gpt::kernels {

using std::size_t;

float dot(const float* a, const float* b, int n);

// y[i] += a * x[i]
void axpy(float* y, float a, const float* x, int n);

// y[i] += (a0 x0[i] + a1 x1[i]) + (a2 x2[i] + a3 x3[i]): four rows per pass over y, a quarter of
// the loads and stores of y that four axpy calls make (the backward's accumulations are bound by them).
void axpy4(float* y, const float* a, const float* const* x, int n);

// out[r][o] = b[o] + sum_i in[r][i] * w[o][i]   (b may be null)
void linear_forward(float* out, const float* in, const float* w, const float* b, int rows, int n_in, int n_out);

// dw[o][i] += sum_r dout[r][o] * in[r][i];  db[o] += sum_r dout[r][o];
// din[r][i] += sum_o dout[r][o] * w[o][i]   (din, db may be null)
void linear_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w, int rows,
                     int n_in, int n_out);

// out = (in - mean) / sqrt(var + 1e-5) * w + b per row; keeps mean and 1/std for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b, int rows,
                       int c);

// din += d(out)/d(in) dout;  dw += sum_r dout * xhat;  db += sum_r dout.
void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* mean,
                        const float* rstd, const float* w, int rows, int c);

// Causal multi-head self-attention over qkv[R][3C] (q, k, v of each position side by side), R = B x T.
// probs[b][h][t][t2] keeps the softmax (zero above the diagonal) for the backward; out is [R][C].
void attention_forward(float* out, float* probs, const float* qkv, int batch, int t_len, int c, int heads);

// dqkv += the gradient of attention_forward's out with respect to qkv, given dout.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int batch, int t_len,
                        int c, int heads);

// GELU, the tanh approximation GPT-2 uses.
inline constexpr float gelu_k = 0.7978845608028654f;  // sqrt(2 / pi)
void gelu_forward(float* out, const float* in, size_t n);
void gelu_backward(float* din, const float* in, const float* dout, size_t n);

// Softmax cross-entropy of each row of logits[R][V] against targets; returns the summed loss (nats)
// and counts the rows whose argmax is the target. With dlogits, writes (softmax - onehot) x grad_scale.
double cross_entropy(const float* logits, const int* targets, float* dlogits, float grad_scale, int rows, int vocab,
                     int& correct);

}  // namespace gpt::kernels
