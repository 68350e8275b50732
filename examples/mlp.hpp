// A small MLP classifier with its own CPU kernels, trained through any zero engine; shared by the examples.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "zero/zero.hpp"
#if MLP_WITH_OPENBLAS
#include "mlp_blas.hpp"
#endif

namespace mlp {

// The GEMM kernels of the linear layers: the loops below (everywhere), or OpenBLAS (mlp_blas.hpp,
// where the build found it). They sum in different orders, so a run's param_hash depends on the choice.
enum class gemm { loops, blas };
#if MLP_WITH_OPENBLAS
inline constexpr bool have_blas = true;
#else
inline constexpr bool have_blas = false;
#endif

struct config {
  int layers = 4;      // linear layers; ReLU between them
  int hidden = 256;
  int in = 64;
  int classes = 10;
  int batch = 64;      // global batch, split evenly over ranks
  std::uint64_t seed = 1;
};

// splitmix64: a counter-based generator, so any rank can draw sample k of step t without drawing
// the others, and every run with the same seed sees the same data. ZERO_HD: the GPU trainer draws the
// same samples on the device.
ZERO_HD inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
ZERO_HD inline std::uint64_t key(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0, std::uint64_t d = 0) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}
// Uniform in [-1, 1): exact in double (53 bits), rounded once to float, on host and device alike.
ZERO_HD inline float uniform(std::uint64_t k) {
  return static_cast<float>(static_cast<double>(k >> 11) * 0x1.0p-52 - 1.0);
}

inline int dim(const config& c, int l) { return l == 0 ? c.in : (l == c.layers ? c.classes : c.hidden); }

inline zero::model_spec make_spec(const config& c) {
  zero::model_spec spec;
  for (int l = 0; l < c.layers; ++l)
    spec.unit("layer" + std::to_string(l))
        .tensor("w", {static_cast<std::size_t>(dim(c, l + 1)), static_cast<std::size_t>(dim(c, l))})
        .tensor("b", {static_cast<std::size_t>(dim(c, l + 1))});
  return spec;
}

// He-uniform weights (limit sqrt(6 / fan_in)), zero biases. Element i of a tensor is a pure function
// of the seed, the unit and i (the counter-based generator), so a rank produces just the range the
// engine asks for, and the values do not depend on N, the stage or how the ranges are cut.
inline zero::init_range_fn initializer(const config& c) {
  return [c](const zero::unit_spec& u, const zero::tensor_spec& t, zero::range r, std::span<float> v) {
    if (t.name == "b") {
      std::fill(v.begin(), v.end(), 0.0f);
      return;
    }
    const float limit = std::sqrt(6.0f / static_cast<float>(t.shape[1]));
    const std::uint64_t unit_key = zero::fnv1a64(u.name.data(), u.name.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = limit * uniform(key(c.seed, 1, unit_key, r.begin + i));
  };
}

// FNV-1a of the fp32 parameters, tensors in declaration order (the same value as hashing
// e.full_params()), gathered one unit at a time so no rank ever holds the whole model on the host.
template <class Engine>
std::uint64_t param_hash(Engine& e) {
  std::uint64_t h = zero::fnv1a64(nullptr, 0);
  for (std::size_t u = 0; u < e.spec().num_units(); ++u) {
    const std::vector<float> p = e.full_params(zero::unit_id{u});
    h = zero::fnv1a64(p.data(), p.size() * sizeof(float), h);
  }
  return h;
}

// The synthetic task: each class has a prototype point; a sample is its class's prototype plus
// noise. Sample `index` of step `step` is the same whichever rank draws it.
struct batch {
  std::vector<float> x;  // rows x in
  std::vector<int> y;
  int rows = 0;
};
// The global index of row r of a batch drawn from `first` at `step`, its label, and its feature j
// (the prototype plus 1.5 x noise: one rounded multiply and one rounded add, never fused).
ZERO_HD inline std::uint64_t sample_index(const config& c, std::uint64_t step, int first, int r) {
  return step * static_cast<std::uint64_t>(c.batch) + static_cast<std::uint64_t>(first + r);
}
ZERO_HD inline int sample_label(const config& c, std::uint64_t sample) {
  return static_cast<int>(key(c.seed, 2, sample) % static_cast<std::uint64_t>(c.classes));
}
ZERO_HD inline float sample_feature(const config& c, std::uint64_t sample, int label, int j) {
  const float proto = uniform(key(c.seed, 3, static_cast<std::uint64_t>(label), static_cast<std::uint64_t>(j)));
  const float noise = uniform(key(c.seed, 4, sample, static_cast<std::uint64_t>(j)));
  return zero::fp::add(proto, zero::fp::mul(1.5f, noise));
}

inline batch make_batch(const config& c, std::uint64_t step, int first, int rows) {
  batch b;
  b.rows = rows;
  b.x.resize(static_cast<std::size_t>(rows) * c.in);
  b.y.resize(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    const std::uint64_t sample = sample_index(c, step, first, r);
    const int label = sample_label(c, sample);
    b.y[static_cast<std::size_t>(r)] = label;
    for (int j = 0; j < c.in; ++j) b.x[static_cast<std::size_t>(r) * c.in + j] = sample_feature(c, sample, label, j);
  }
  return b;
}

// out[r][o] = b[o] + sum_i in[r][i] * w[o][i]
template <class P>
void linear_forward(const float* in, const P* w, const P* bias, float* out, int rows, int n_in, int n_out) {
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < n_out; ++o) {
      float acc = static_cast<float>(bias[o]);
      const float* x = in + static_cast<std::size_t>(r) * n_in;
      const P* wr = w + static_cast<std::size_t>(o) * n_in;
      for (int i = 0; i < n_in; ++i) acc += x[i] * static_cast<float>(wr[i]);
      out[static_cast<std::size_t>(r) * n_out + o] = acc;
    }
}

// gw[o][i] += sum_r dout[r][o] * in[r][i]; gb[o] += sum_r dout[r][o]; din[r][i] = sum_o dout[r][o] * w[o][i]
template <class P, class G>
void linear_backward(const float* in, const P* w, const float* dout, G* gw, G* gb, float* din, int rows, int n_in,
                     int n_out) {
  for (int o = 0; o < n_out; ++o) {
    float db = 0.0f;
    for (int r = 0; r < rows; ++r) db += dout[static_cast<std::size_t>(r) * n_out + o];
    gb[o] = static_cast<G>(static_cast<float>(gb[o]) + db);
    G* gr = gw + static_cast<std::size_t>(o) * n_in;
    for (int i = 0; i < n_in; ++i) {
      float acc = 0.0f;
      for (int r = 0; r < rows; ++r) acc += dout[static_cast<std::size_t>(r) * n_out + o] * in[static_cast<std::size_t>(r) * n_in + i];
      gr[i] = static_cast<G>(static_cast<float>(gr[i]) + acc);
    }
  }
  if (!din) return;
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n_in; ++i) {
      float acc = 0.0f;
      for (int o = 0; o < n_out; ++o)
        acc += dout[static_cast<std::size_t>(r) * n_out + o] * static_cast<float>(w[static_cast<std::size_t>(o) * n_in + i]);
      din[static_cast<std::size_t>(r) * n_in + i] = acc;
    }
}

template <class P>
void linear_forward(gemm k, const float* in, const P* w, const P* bias, float* out, int rows, int n_in, int n_out) {
#if MLP_WITH_OPENBLAS
  if (k == gemm::blas) return blas::linear_forward(in, w, bias, out, rows, n_in, n_out);
#endif
  (void)k;
  linear_forward(in, w, bias, out, rows, n_in, n_out);
}
template <class P, class G>
void linear_backward(gemm k, const float* in, const P* w, const float* dout, G* gw, G* gb, float* din, int rows,
                     int n_in, int n_out) {
#if MLP_WITH_OPENBLAS
  if (k == gemm::blas) return blas::linear_backward(in, w, dout, gw, gb, din, rows, n_in, n_out);
#endif
  (void)k;
  linear_backward(in, w, dout, gw, gb, din, rows, n_in, n_out);
}

// Mean softmax cross-entropy over the rows; writes dlogits = (softmax - onehot) / rows and counts hits.
inline double softmax_xent(const float* logits, const int* y, float* dlogits, int rows, int classes, int& correct) {
  double loss = 0.0;
  correct = 0;
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<std::size_t>(r) * classes;
    float* d = dlogits + static_cast<std::size_t>(r) * classes;
    const int argmax = static_cast<int>(std::max_element(z, z + classes) - z);
    const float m = z[argmax];
    float sum = 0.0f;
    for (int k = 0; k < classes; ++k) sum += std::exp(z[k] - m);
    for (int k = 0; k < classes; ++k) d[k] = std::exp(z[k] - m) / sum / static_cast<float>(rows);
    d[y[r]] -= 1.0f / static_cast<float>(rows);
    loss += static_cast<double>(std::log(sum) - (z[y[r]] - m));
    correct += argmax == y[r];
  }
  return loss / rows;
}

// Where a rank's step went, in seconds: the engine's calls (their collectives included) and the kernels.
struct step_times {
  double gather = 0, reduce = 0, update = 0;  // gather(), reduce(), step()
  double compute = 0;                         // the forward and backward kernels, loss included
  // With step_options::comm_seconds: the time spent inside collectives during the step (every
  // engine call), and the part of it inside step(); 0 without.
  double comm = 0, update_comm = 0;
};

// How train_step runs, beyond the model: the GEMM kernels, and a clock of the time this rank has
// spent inside collectives so far (e.g. comm::modeled's stats().blocked_s), read at the step's start,
// around step() and at its end, so the step's time can be split into its parts.
struct step_options {
  gemm kernels = gemm::loops;
  std::function<double()> comm_seconds;  // empty: not measured
};

struct step_result {
  double loss = 0.0;  // mean over this rank's rows
  int correct = 0;
  zero::step_report report;  // what the engine's step() said
  step_times times;
};

// One training step of this rank on its slice of the global batch, in `micro_batches` equal
// micro-batches: for each, forward (gather, compute, release) and backward in reverse unit order
// (gather, grads, reduce, release); then the engine's step. The loss of a micro-batch is scaled by
// the engine's loss scale and divided by the number of micro-batches, so the accumulated gradient
// is that of the mean loss over the rank's rows. In the reproducible mode it is not divided (the
// engine averages over every rank's micro-batches), so each micro-batch's gradient is the same values
// whatever the world size.
template <class Engine>
step_result train_step(Engine& e, const config& c, std::uint64_t step, int rank, int ranks, int micro_batches = 1,
                       const step_options& so = {}) {
  using clock = std::chrono::steady_clock;
  auto comm_now = [&so] { return so.comm_seconds ? so.comm_seconds() : 0.0; };
  const double comm_start = comm_now();
  const int rows = c.batch / ranks / micro_batches;
  const batch full = make_batch(c, step, rank * rows * micro_batches, rows * micro_batches);
  step_result res;
  // Adds the time since the last mark to `into`: the step is cut into consecutive pieces.
  auto mark = clock::now();
  auto lap = [&mark](double& into) {
    const auto now = clock::now();
    into += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  std::vector<std::vector<float>> acts(static_cast<std::size_t>(c.layers) + 1);
  std::vector<float> dout, din;
  for (int k = 0; k < micro_batches; ++k) {
    const std::size_t first = static_cast<std::size_t>(k) * static_cast<std::size_t>(rows);
    acts[0].assign(full.x.begin() + static_cast<std::ptrdiff_t>(first * static_cast<std::size_t>(c.in)),
                   full.x.begin() + static_cast<std::ptrdiff_t>((first + static_cast<std::size_t>(rows)) * static_cast<std::size_t>(c.in)));
    for (int l = 0; l < c.layers; ++l) {
      lap(res.times.compute);
      auto p = e.gather(zero::unit_id{static_cast<std::size_t>(l)});
      lap(res.times.gather);
      const int n_in = dim(c, l), n_out = dim(c, l + 1);
      auto& out = acts[static_cast<std::size_t>(l) + 1];
      out.resize(static_cast<std::size_t>(rows) * n_out);
      linear_forward(so.kernels, acts[static_cast<std::size_t>(l)].data(), p["w"].data(), p["b"].data(), out.data(),
                     rows, n_in, n_out);
      if (l + 1 < c.layers)
        for (auto& v : out) v = v > 0.0f ? v : 0.0f;
      lap(res.times.compute);
      p.release();
      lap(res.times.gather);
    }
    dout.assign(static_cast<std::size_t>(rows) * c.classes, 0.0f);
    int correct = 0;
    res.loss += softmax_xent(acts.back().data(), full.y.data() + first, dout.data(), rows, c.classes, correct) /
                micro_batches;
    res.correct += correct;
    const float factor = e.options().reproducible ? e.loss_scale() : e.loss_scale() / static_cast<float>(micro_batches);
    for (auto& d : dout) d *= factor;
    for (int l = c.layers - 1; l >= 0; --l) {
      const zero::unit_id u{static_cast<std::size_t>(l)};
      lap(res.times.compute);
      auto p = e.gather(u);
      auto g = e.grads(u);
      lap(res.times.gather);
      const int n_in = dim(c, l), n_out = dim(c, l + 1);
      din.assign(l > 0 ? static_cast<std::size_t>(rows) * n_in : 0, 0.0f);
      linear_backward(so.kernels, acts[static_cast<std::size_t>(l)].data(), p["w"].data(), dout.data(),
                      g["w"].data(), g["b"].data(), l > 0 ? din.data() : nullptr, rows, n_in, n_out);
      lap(res.times.compute);
      e.reduce(u);
      lap(res.times.reduce);
      p.release();
      lap(res.times.gather);
      if (l > 0) {  // through the ReLU of the layer below
        const auto& a = acts[static_cast<std::size_t>(l)];
        for (std::size_t i = 0; i < din.size(); ++i) din[i] = a[i] > 0.0f ? din[i] : 0.0f;
        dout.swap(din);
      }
    }
  }
  lap(res.times.compute);
  const double comm_before_update = comm_now();
  res.report = e.step();
  lap(res.times.update);
  const double comm_end = comm_now();
  res.times.update_comm = comm_end - comm_before_update;
  res.times.comm = comm_end - comm_start;
  return res;
}

}  // namespace mlp
