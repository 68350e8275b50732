// The GPT example's CPU kernels (gpt_kernels.hpp), compiled on their own at -O3: see the header for why.
#include "gpt_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace gpt::kernels {

namespace {

// The inner loops, inline as in one translation unit with their callers: called per row and output
// with short lengths, a call would cost more than the loop, and inlined the compiler hoists and
// vectorizes across them.
inline float dot_loop(const float* a, const float* b, int n) {
  float s[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + tail;
}

inline void axpy_loop(float* y, float a, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

inline void axpy4_loop(float* y, const float* a, const float* const* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += (a[0] * x[0][i] + a[1] * x[1][i]) + (a[2] * x[2][i] + a[3] * x[3][i]);
}

}  // namespace

float dot(const float* a, const float* b, int n) { return dot_loop(a, b, n); }
void axpy(float* y, float a, const float* x, int n) { axpy_loop(y, a, x, n); }
void axpy4(float* y, const float* a, const float* const* x, int n) { axpy4_loop(y, a, x, n); }

void linear_forward(float* out, const float* in, const float* w, const float* b, int rows, int n_in, int n_out) {
  for (int r = 0; r < rows; ++r) {
    const float* x = in + size_t(r) * n_in;
    float* y = out + size_t(r) * n_out;
    for (int o = 0; o < n_out; ++o) y[o] = (b ? b[o] : 0.0f) + dot_loop(x, w + size_t(o) * n_in, n_in);
  }
}

void linear_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w, int rows,
                     int n_in, int n_out) {
  for (int o = 0; o < n_out; ++o) {
    float* g = dw + size_t(o) * n_in;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      const float a[4] = {dout[size_t(r) * n_out + o], dout[size_t(r + 1) * n_out + o], dout[size_t(r + 2) * n_out + o],
                          dout[size_t(r + 3) * n_out + o]};
      const float* x[4] = {in + size_t(r) * n_in, in + size_t(r + 1) * n_in, in + size_t(r + 2) * n_in,
                           in + size_t(r + 3) * n_in};
      axpy4_loop(g, a, x, n_in);
    }
    for (; r < rows; ++r) axpy_loop(g, dout[size_t(r) * n_out + o], in + size_t(r) * n_in, n_in);
  }
  if (db)
    for (int r = 0; r < rows; ++r) axpy_loop(db, 1.0f, dout + size_t(r) * n_out, n_out);
  if (din)
    for (int r = 0; r < rows; ++r) {
      const float* d = dout + size_t(r) * n_out;
      float* y = din + size_t(r) * n_in;
      int o = 0;
      for (; o + 4 <= n_out; o += 4) {
        const float* x[4] = {w + size_t(o) * n_in, w + size_t(o + 1) * n_in, w + size_t(o + 2) * n_in,
                             w + size_t(o + 3) * n_in};
        axpy4_loop(y, d + o, x, n_in);
      }
      for (; o < n_out; ++o) axpy_loop(y, d[o], w + size_t(o) * n_in, n_in);
    }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b, int rows,
                       int c) {
  for (int r = 0; r < rows; ++r) {
    const float* x = in + size_t(r) * c;
    float m = 0.0f;
    for (int i = 0; i < c; ++i) m += x[i];
    m /= static_cast<float>(c);
    float v = 0.0f;
    for (int i = 0; i < c; ++i) v += (x[i] - m) * (x[i] - m);
    v /= static_cast<float>(c);
    const float s = 1.0f / std::sqrt(v + 1e-5f);
    float* y = out + size_t(r) * c;
    for (int i = 0; i < c; ++i) y[i] = (x[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* mean,
                        const float* rstd, const float* w, int rows, int c) {
  for (int r = 0; r < rows; ++r) {
    const float* x = in + size_t(r) * c;
    const float* d = dout + size_t(r) * c;
    float* dx = din + size_t(r) * c;
    const float m = mean[r], s = rstd[r];
    // the means of dxhat and of dxhat * xhat over the row
    float a = 0.0f, bsum = 0.0f;
    for (int i = 0; i < c; ++i) {
      const float xhat = (x[i] - m) * s;
      const float dxhat = d[i] * w[i];
      a += dxhat;
      bsum += dxhat * xhat;
    }
    a /= static_cast<float>(c);
    bsum /= static_cast<float>(c);
    for (int i = 0; i < c; ++i) {
      const float xhat = (x[i] - m) * s;
      dw[i] += d[i] * xhat;
      db[i] += d[i];
      dx[i] += (d[i] * w[i] - a - xhat * bsum) * s;
    }
  }
}

void attention_forward(float* out, float* probs, const float* qkv, int batch, int t_len, int c, int heads) {
  const int hs = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::fill(out, out + size_t(batch) * t_len * c, 0.0f);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int t = 0; t < t_len; ++t) {
        const float* q = qkv + (size_t(b) * t_len + t) * 3 * c + size_t(h) * hs;
        float* p = probs + ((size_t(b) * heads + h) * t_len + t) * t_len;
        float max = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (size_t(b) * t_len + t2) * 3 * c + c + size_t(h) * hs;
          p[t2] = dot_loop(q, k, hs) * scale;
          max = std::max(max, p[t2]);
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          p[t2] = std::exp(p[t2] - max);
          sum += p[t2];
        }
        const float inv = 1.0f / sum;
        float* y = out + (size_t(b) * t_len + t) * c + size_t(h) * hs;
        for (int t2 = 0; t2 <= t; ++t2) {
          p[t2] *= inv;
          axpy_loop(y, p[t2], qkv + (size_t(b) * t_len + t2) * 3 * c + 2 * c + size_t(h) * hs, hs);
        }
        std::fill(p + t + 1, p + t_len, 0.0f);
      }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int batch, int t_len,
                        int c, int heads) {
  const int hs = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> dp(size_t(t_len), 0.0f);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int t = 0; t < t_len; ++t) {
        const size_t row = size_t(b) * t_len + t;
        const float* d = dout + row * c + size_t(h) * hs;
        const float* q = qkv + row * 3 * c + size_t(h) * hs;
        float* dq = dqkv + row * 3 * c + size_t(h) * hs;
        const float* p = probs + ((size_t(b) * heads + h) * t_len + t) * t_len;
        // through out = sum p v: dp = dout . v, dv += p dout
        float pdp = 0.0f;  // sum over t2 of p * dp, the softmax's correction term
        for (int t2 = 0; t2 <= t; ++t2) {
          const size_t row2 = size_t(b) * t_len + t2;
          dp[t2] = dot_loop(d, qkv + row2 * 3 * c + 2 * c + size_t(h) * hs, hs);
          axpy_loop(dqkv + row2 * 3 * c + 2 * c + size_t(h) * hs, p[t2], d, hs);
          pdp += p[t2] * dp[t2];
        }
        // through the softmax and the scaled scores q . k
        for (int t2 = 0; t2 <= t; ++t2) {
          const size_t row2 = size_t(b) * t_len + t2;
          const float ds = p[t2] * (dp[t2] - pdp) * scale;
          axpy_loop(dq, ds, qkv + row2 * 3 * c + c + size_t(h) * hs, hs);
          axpy_loop(dqkv + row2 * 3 * c + c + size_t(h) * hs, ds, q, hs);
        }
      }
}

void gelu_forward(float* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = in[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(gelu_k * (x + 0.044715f * x * x * x)));
  }
}

void gelu_backward(float* din, const float* in, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = in[i];
    const float u = gelu_k * (x + 0.044715f * x * x * x);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float du = gelu_k * (1.0f + 3.0f * 0.044715f * x * x);
    din[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
  }
}

double cross_entropy(const float* logits, const int* targets, float* dlogits, float grad_scale, int rows, int vocab,
                     int& correct) {
  double loss = 0.0;
  correct = 0;
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + size_t(r) * vocab;
    const int argmax = static_cast<int>(std::max_element(z, z + vocab) - z);
    const float m = z[argmax];
    float sum = 0.0f;
    for (int k = 0; k < vocab; ++k) sum += std::exp(z[k] - m);
    loss += static_cast<double>(std::log(sum) - (z[targets[r]] - m));
    correct += argmax == targets[r];
    if (!dlogits) continue;
    float* d = dlogits + size_t(r) * vocab;
    for (int k = 0; k < vocab; ++k) d[k] = std::exp(z[k] - m) / sum * grad_scale;
    d[targets[r]] -= grad_scale;
  }
  return loss;
}

}  // namespace gpt::kernels
