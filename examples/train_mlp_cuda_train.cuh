// train_mlp_cuda's training: the device model, its kernels and cuBLAS GEMMs, and train<Stage, Optimizer,
// Precision>; included by the three translation units of the engines, one per precision.
#pragma once
#include <CLI/CLI.hpp>
#include <cublas_v2.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mlp.hpp"
#include "progress.hpp"
#include "run_log.hpp"
#include "trainer_checkpoint.hpp"
#include "trainer_cli.hpp"
#include "zero/comm/any_backend.hpp"
#include "zero/zero_cuda.cuh"
#if ZERO_WITH_MPI
#include "zero/comm/mpi_session.hpp"
#endif

#include "train_mlp_cuda.hpp"

namespace {

using train_mlp_cuda::roofline;

using trainer::options;
using trainer::summary;

void blas_check(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    zero::fail(zero::error_kind::device, "cuBLAS: ", call, " failed: ", cublasGetStatusString(s));
}
#define CUBLAS_CHECK(call) blas_check((call), #call)

// A zero-filled device array from the rank's pool (the bound context).
template <class T>
class device_array {
 public:
  explicit device_array(std::size_t n) : n_(n), p_(static_cast<T*>(zero::sys::cuda::allocate(n * sizeof(T)))) {
    zero::sys::cuda::fill_zero(p_, n * sizeof(T));
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { zero::sys::cuda::deallocate(p_, n_ * sizeof(T)); }
  T* data() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_;
  T* p_;
};

// ---- the model's kernels (the GEMMs are cuBLAS's) ----------------------------------------------

// The parameter and gradient type T of a precision policy as cuBLAS names it.
template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, zero::bf16>) return CUDA_R_16BF;
  else if constexpr (std::is_same_v<T, zero::fp16>) return CUDA_R_16F;
  else return CUDA_R_32F;
}

// This rank's rows of a micro-batch, drawn on the device with the CPU trainer's generator (the same
// samples bit for bit: mlp::sample_feature never fuses its multiply-add).
__global__ void draw_batch(mlp::config c, std::uint64_t step, int first, int rows, float* x, int* y) {
  const std::size_t n = static_cast<std::size_t>(rows) * c.in;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / static_cast<std::size_t>(c.in)), j = static_cast<int>(i % static_cast<std::size_t>(c.in));
    const std::uint64_t sample = mlp::sample_index(c, step, first, r);
    const int label = mlp::sample_label(c, sample);
    x[i] = mlp::sample_feature(c, sample, label, j);
    if (j == 0) y[r] = label;
  }
}

// A copy of fp32 values in the GEMMs' type T (nothing to do when T is float).
template <class T>
__global__ void to_gemm_type(const float* src, T* dst, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = static_cast<T>(src[i]);
}

// out[r][o] += b[o], then ReLU below the last layer; also the result in T for the next GEMM.
template <class T>
__global__ void bias_relu(float* out, T* out_t, const T* bias, int rows, int n_out, bool relu) {
  const std::size_t n = static_cast<std::size_t>(rows) * n_out;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = out[i] + static_cast<float>(bias[i % static_cast<std::size_t>(n_out)]);
    const float a = relu && v < 0.0f ? 0.0f : v;
    out[i] = a;
    if constexpr (!std::is_same_v<T, float>) out_t[i] = static_cast<T>(a);
  }
}

// One thread per row: softmax cross-entropy, dlogits = (softmax - onehot) / rows x factor (the loss
// scale over the micro-batches), and a hit flag.
__global__ void softmax_xent(const float* logits, const int* y, float* dlogits, float* row_loss, int* row_hit,
                             int rows, int classes, float factor) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows) return;
  const float* z = logits + static_cast<std::size_t>(r) * classes;
  float* d = dlogits + static_cast<std::size_t>(r) * classes;
  int argmax = 0;
  for (int k = 1; k < classes; ++k)
    if (z[k] > z[argmax]) argmax = k;
  const float m = z[argmax];
  float sum = 0.0f;
  for (int k = 0; k < classes; ++k) sum += expf(z[k] - m);
  for (int k = 0; k < classes; ++k) d[k] = expf(z[k] - m) / sum / static_cast<float>(rows);
  d[y[r]] -= 1.0f / static_cast<float>(rows);
  for (int k = 0; k < classes; ++k) d[k] *= factor;
  row_loss[r] = logf(sum) - (z[y[r]] - m);
  row_hit[r] = argmax == y[r];
}

// One block of totals_threads: adds a micro-batch's mean loss (over its rows, divided by the
// micro-batches) and hits to the step's. Thread t sums rows t, t + totals_threads, ... and the
// partial sums meet in a fixed tree: the same order on every run.
constexpr int totals_threads = 256;
__global__ void __launch_bounds__(totals_threads) step_totals(const float* row_loss, const int* row_hit, int rows,
                                                              int micro_batches, double* loss, double* hits) {
  __shared__ double l[totals_threads], h[totals_threads];
  const int t = static_cast<int>(threadIdx.x);
  double ls = 0.0, hs = 0.0;
  for (int r = t; r < rows; r += totals_threads) {
    ls += row_loss[r];
    hs += row_hit[r];
  }
  l[t] = ls;
  h[t] = hs;
  __syncthreads();
  for (int half = totals_threads / 2; half > 0; half /= 2) {
    if (t < half) {
      l[t] += l[t + half];
      h[t] += h[t + half];
    }
    __syncthreads();
  }
  if (t == 0) {
    *loss += l[0] / rows / micro_batches;
    *hits += h[0];
  }
}

// gb[o] += sum_r dout[r][o] in fp32, rounded once to the gradient type. A block covers 32 columns
// (threadIdx.x, so each row's reads are coalesced) with 8 row groups (threadIdx.y: rows y, y + 8,
// ...), and the 8 partial sums of a column are added in group order: the same order on every run.
constexpr int bias_rows = 8;
template <class T>
__global__ void bias_grad(const float* dout, T* gb, int rows, int n_out) {
  __shared__ float part[bias_rows][32];
  const int o = static_cast<int>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x);
  float acc = 0.0f;
  if (o < n_out)
    for (int r = static_cast<int>(threadIdx.y); r < rows; r += bias_rows) acc += dout[static_cast<std::size_t>(r) * n_out + o];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < n_out) {
    float sum = part[0][threadIdx.x];
    for (int y = 1; y < bias_rows; ++y) sum += part[y][threadIdx.x];
    gb[o] = static_cast<T>(static_cast<float>(gb[o]) + sum);
  }
}

// Through the ReLU of the layer below: din = act > 0 ? din : 0, also in T for the next GEMM.
template <class T>
__global__ void relu_grad(float* din, T* din_t, const float* act, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float d = act[i] > 0.0f ? din[i] : 0.0f;
    din[i] = d;
    if constexpr (!std::is_same_v<T, float>) din_t[i] = static_cast<T>(d);
  }
}

unsigned blocks_for(std::size_t n, unsigned threads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

// An fp32 array and, when T is a 2-byte type, its copy in T for the GEMMs (T = float: the same array).
template <class T>
class dual_array {
 public:
  explicit dual_array(std::size_t n) : f32_(n), t_(std::is_same_v<T, float> ? 0 : n) {}
  float* f32() const { return f32_.data(); }
  T* t() const {
    if constexpr (std::is_same_v<T, float>) return f32_.data();
    else return t_.data();
  }

 private:
  device_array<float> f32_;
  device_array<T> t_;
};

// One rank's activations, gradients of activations, labels and per-step results, all on the device,
// with a cuBLAS handle on the rank's compute stream. T: the precision's parameter and gradient type;
// the GEMMs take T operands and accumulate in fp32 (tensor cores for bf16 and fp16), activations and
// their gradients are kept in fp32 and copied to T for the GEMMs.
template <class T>
class device_model {
 public:
  device_model(zero::gpu::context& ctx, const mlp::config& c, int rows, int micro_batches, int steps)
      : ctx_(ctx), c_(c), rows_(rows), micro_(micro_batches), widest_(widest(c)),
        losses_(static_cast<std::size_t>(steps > 0 ? steps : 1)), hits_(static_cast<std::size_t>(steps > 0 ? steps : 1)),
        row_loss_(static_cast<std::size_t>(rows)), row_hit_(static_cast<std::size_t>(rows)),
        labels_(static_cast<std::size_t>(rows)), grad_a_(static_cast<std::size_t>(rows) * widest_),
        grad_b_(static_cast<std::size_t>(rows) * widest_) {
    for (int l = 0; l <= c.layers; ++l)
      acts_.emplace_back(std::make_unique<dual_array<T>>(static_cast<std::size_t>(rows) * mlp::dim(c, l)));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, ctx.compute()));
    // fp32: plain fp32 GEMMs (no TF32), so the numbers stay comparable with the CPU trainer's. 2-byte
    // types: the default math mode, which runs them on tensor cores with fp32 accumulation.
    CUBLAS_CHECK(cublasSetMathMode(blas_, std::is_same_v<T, float> ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
  }
  device_model(const device_model&) = delete;
  device_model& operator=(const device_model&) = delete;
  ~device_model() {
    (void)cudaStreamSynchronize(ctx_.compute());
    (void)cublasDestroy(blas_);
  }

  // One step of this rank on its slice of the global batch, in micro-batches, as mlp::train_step on
  // the CPU: forward and backward of each micro-batch, each unit reduced once per micro-batch, then
  // the engine's step.
  // `slot`: where this run keeps the step's loss and hits (the run's own step count, from 0).
  template <class Engine>
  zero::step_report train_step(Engine& e, std::uint64_t step, int rank, std::size_t slot) {
    for (int k = 0; k < micro_; ++k) micro_batch(e, step, rank * rows_ * micro_ + k * rows_, slot);
    return e.step();
  }

  // The GEMMs of one step alone (every micro-batch's forward, dW and dX products, same shapes, same
  // stream) on a scratch weight: the compute floor of the step.
  void step_gemms(T* weight, T* grad) {
    for (int k = 0; k < micro_; ++k) {
      for (int l = 0; l < c_.layers; ++l)
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, mlp::dim(c_, l + 1), rows_, mlp::dim(c_, l), weight, mlp::dim(c_, l),
             act(l).t(), mlp::dim(c_, l), 0.0f, act(l + 1).f32(), CUDA_R_32F, mlp::dim(c_, l + 1));
      for (int l = c_.layers - 1; l >= 0; --l) {
        const int n_in = mlp::dim(c_, l), n_out = mlp::dim(c_, l + 1);
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, n_in, n_out, rows_, act(l).t(), n_in, grad_a_.t(), n_out, 1.0f, grad, cuda_type<T>(),
             n_in);
        if (l > 0)
          gemm(CUBLAS_OP_N, CUBLAS_OP_N, n_in, rows_, n_out, weight, n_in, grad_a_.t(), n_out, 0.0f, grad_b_.f32(),
               CUDA_R_32F, n_in);
      }
    }
  }

  // Per step, this rank's mean loss and hits (summed over ranks at the end of training).
  double* losses() const { return losses_.data(); }
  double* hits() const { return hits_.data(); }

  // This rank's loss of the run's step `slot` (waits for it): for progress lines only.
  double loss_of(std::size_t slot) {
    ZERO_CUDA_CHECK(cudaMemcpyAsync(ctx_.host_scalar(), losses_.data() + slot, sizeof(double), cudaMemcpyDeviceToHost,
                                    ctx_.compute()));
    ctx_.wait_compute();
    return *ctx_.host_scalar();
  }

 private:
  static int widest(const mlp::config& c) {
    int w = 0;
    for (int l = 0; l <= c.layers; ++l) w = std::max(w, mlp::dim(c, l));
    return w;
  }
  const dual_array<T>& act(int l) const { return *acts_[static_cast<std::size_t>(l)]; }

  // C = A(op) x B(op) (+ C when beta is 1), column-major, T operands, fp32 accumulation; C in fp32 or T.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const T* a, int lda, const T* b, int ldb,
            float beta, void* c, cudaDataType_t c_type, int ldc) {
    const float one = 1.0f;
    if constexpr (std::is_same_v<T, float>)
      CUBLAS_CHECK(cublasSgemm(blas_, ta, tb, m, n, k, &one, a, lda, b, ldb, &beta, static_cast<float*>(c), ldc));
    else
      CUBLAS_CHECK(cublasGemmEx(blas_, ta, tb, m, n, k, &one, a, cuda_type<T>(), lda, b, cuda_type<T>(), ldb, &beta, c,
                                c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  template <class Engine>
  void micro_batch(Engine& e, std::uint64_t step, int first, std::size_t slot) {
    const cudaStream_t s = ctx_.compute();
    draw_batch<<<blocks_for(static_cast<std::size_t>(rows_) * c_.in, 256), 256, 0, s>>>(c_, step, first, rows_,
                                                                                          act(0).f32(), labels_.data());
    if constexpr (!std::is_same_v<T, float>)
      to_gemm_type<<<blocks_for(static_cast<std::size_t>(rows_) * c_.in, 256), 256, 0, s>>>(
          act(0).f32(), act(0).t(), static_cast<std::size_t>(rows_) * c_.in);
    ZERO_CUDA_CHECK(cudaGetLastError());
    for (int l = 0; l < c_.layers; ++l) {
      auto p = e.gather(zero::unit_id{static_cast<std::size_t>(l)});
      const int n_in = mlp::dim(c_, l), n_out = mlp::dim(c_, l + 1);
      // Row-major out[rows][n_out] = in[rows][n_in] * W[n_out][n_in]^T, i.e. column-major out^T = W^T' * in^T.
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, n_out, rows_, n_in, p["w"].data(), n_in, act(l).t(), n_in, 0.0f, act(l + 1).f32(),
           CUDA_R_32F, n_out);
      bias_relu<<<blocks_for(static_cast<std::size_t>(rows_) * n_out, 256), 256, 0, s>>>(
          act(l + 1).f32(), act(l + 1).t(), p["b"].data(), rows_, n_out, l + 1 < c_.layers);
      ZERO_CUDA_CHECK(cudaGetLastError());
      p.release();
    }
    const dual_array<T>* dout = &grad_a_;
    const dual_array<T>* din = &grad_b_;
    const float factor = e.loss_scale() / static_cast<float>(micro_);
    softmax_xent<<<blocks_for(static_cast<std::size_t>(rows_), 128), 128, 0, s>>>(
        act(c_.layers).f32(), labels_.data(), dout->f32(), row_loss_.data(), row_hit_.data(), rows_, c_.classes, factor);
    if constexpr (!std::is_same_v<T, float>)
      to_gemm_type<<<blocks_for(static_cast<std::size_t>(rows_) * c_.classes, 256), 256, 0, s>>>(
          dout->f32(), dout->t(), static_cast<std::size_t>(rows_) * c_.classes);
    step_totals<<<1, totals_threads, 0, s>>>(row_loss_.data(), row_hit_.data(), rows_, micro_, losses_.data() + slot,
                                             hits_.data() + slot);
    ZERO_CUDA_CHECK(cudaGetLastError());
    for (int l = c_.layers - 1; l >= 0; --l) {
      const zero::unit_id u{static_cast<std::size_t>(l)};
      auto p = e.gather(u);
      auto g = e.grads(u);
      const int n_in = mlp::dim(c_, l), n_out = mlp::dim(c_, l + 1);
      // gW[n_out][n_in] += dout^T * in: column-major gW^T = in^T * dout.
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, n_in, n_out, rows_, act(l).t(), n_in, dout->t(), n_out, 1.0f, g["w"].data(),
           cuda_type<T>(), n_in);
      bias_grad<<<static_cast<unsigned>((n_out + 31) / 32), dim3(32, bias_rows), 0, s>>>(dout->f32(), g["b"].data(), rows_,
                                                                                          n_out);
      ZERO_CUDA_CHECK(cudaGetLastError());
      if (l > 0)  // din[rows][n_in] = dout * W: column-major din^T = W^T * dout^T.
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, n_in, rows_, n_out, p["w"].data(), n_in, dout->t(), n_out, 0.0f, din->f32(),
             CUDA_R_32F, n_in);
      e.reduce(u);
      p.release();
      if (l > 0) {
        const std::size_t n = static_cast<std::size_t>(rows_) * n_in;
        relu_grad<<<blocks_for(n, 256), 256, 0, s>>>(din->f32(), din->t(), act(l).f32(), n);
        ZERO_CUDA_CHECK(cudaGetLastError());
        std::swap(dout, din);
      }
    }
  }
  zero::gpu::context& ctx_;
  mlp::config c_;
  int rows_, micro_, widest_;
  cublasHandle_t blas_ = nullptr;
  std::vector<std::unique_ptr<dual_array<T>>> acts_;
  device_array<double> losses_, hits_;
  device_array<float> row_loss_;
  device_array<int> row_hit_, labels_;
  dual_array<T> grad_a_, grad_b_;
};

// Host values reduced over ranks through a device buffer (a device backend reads device memory only).
template <class Comm>
std::vector<double> reduce_over_ranks(Comm& comm, std::vector<double> v, zero::reduce_op op) {
  device_array<double> wire(v.size());
  zero::sys::cuda::copy(wire.data(), v.data(), v.size() * sizeof(double));
  comm.all_reduce(wire.data(), wire.data(), v.size(), op);
  zero::sys::cuda::copy(v.data(), wire.data(), v.size() * sizeof(double));
  return v;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  ZERO_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}


// Median seconds of `reps` runs of f on stream s, after a warm-up run.
template <class F>
double median_seconds(cudaStream_t s, int reps, F f) {
  cudaEvent_t a = nullptr, b = nullptr;
  ZERO_CUDA_CHECK(cudaEventCreate(&a));
  ZERO_CUDA_CHECK(cudaEventCreate(&b));
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    ZERO_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    ZERO_CUDA_CHECK(cudaEventRecord(b, s));
    ZERO_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    ZERO_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class T, class Engine>
void measure_floor(zero::gpu::context& ctx, device_model<T>& m, const Engine& e, const mlp::config& c, roofline& rl) {
  std::size_t widest_w = 0;
  for (int l = 0; l < c.layers; ++l)
    widest_w = std::max(widest_w, static_cast<std::size_t>(mlp::dim(c, l)) * static_cast<std::size_t>(mlp::dim(c, l + 1)));
  {
    device_array<T> w(widest_w), g(widest_w);
    rl.gemm_s = median_seconds(ctx.compute(), 10, [&] { m.step_gemms(w.data(), g.data()); });
  }
  // Read + write of a 256 MiB device-to-device copy.
  const std::size_t bytes = std::size_t{256} << 20;
  device_array<unsigned char> a(bytes), b(bytes);
  const double copy_s = median_seconds(ctx.compute(), 10, [&] {
    ZERO_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, ctx.compute()));
  });
  rl.copy_gbps = 2.0 * static_cast<double>(bytes) / copy_s * 1e-9;
  // What the optimizer moves per element: the gradient read; master weight and every slot read and
  // written; a separate parameter copy written.
  using Prec = typename Engine::precision;
  rl.bytes_per_element = static_cast<double>(sizeof(typename Prec::grad_type)) + 2.0 * sizeof(float) * (1 + Engine::optimizer::slots) +
                         (Prec::separate_master ? static_cast<double>(sizeof(typename Prec::param_type)) : 0.0);
  rl.updated_elements = Engine::partitioner::shards_optimizer_states ? e.layout().shard_total() : e.layout().padded();
  rl.optimizer_at_copy_s = rl.bytes_per_element * static_cast<double>(rl.updated_elements) / (rl.copy_gbps * 1e9);
}

template <class Stage, class Opt, class Prec, class Comm>
void train(Comm& comm, const options& o, const Opt& opt, summary& out, roofline& rl) {
  using T = typename Prec::param_type;
  const zero::model_spec spec = mlp::make_spec(o.model);
  const zero::engine_options eo = trainer::engine_options_of(o);
  const auto setup_start = std::chrono::steady_clock::now();
  const double setup_cpu_start = trainer::thread_cpu_seconds();
  zero::engine<Stage, Comm, Opt, Prec> e(comm, spec, opt, eo);
  // A resumed run continues from the checkpoint's weights, optimizer state and data position,
  // whichever trainer, world size and stage saved it.
  const std::uint64_t t0 = trainer::resume_or_initialize(e, comm, o, mlp::initializer(o.model));
  zero::gpu::context& device = comm.make_system().context();  // the rank's device, streams and watchdog
  device.wait_all();
  const double setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  const double setup_cpu_seconds = trainer::thread_cpu_seconds() - setup_cpu_start;
  const int rank = comm.rank(), ranks = comm.size();
  device_model<T> m(device, o.model, o.model.batch / ranks / o.accum, o.accum, o.steps);
  comm.barrier();  // every rank starts the clock with its set-up done
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 reports: the progress line on stderr (its own rows' loss, which costs a wait, so only
  // when the line is drawn), and the --log file, written after training when the losses of every
  // rank are summed; until then each step's engine side is kept.
  std::optional<trainer::progress> bar;
  std::optional<trainer::run_log> log;
  std::vector<trainer::step_record> records;
  trainer::checkpoints saves;  // --save-every and the last --save, blocking or --save-async
  if (rank == 0) {
    bar.emplace(stderr, t0, t0 + static_cast<std::uint64_t>(o.steps), static_cast<double>(o.model.batch));
    if (!o.log.empty()) {
      log.emplace(o.log, trainer::log_mode_of(o));
      log->run("train_mlp_cuda", o, e, t0,
               {{"batch", o.model.batch},
                {"device", device_name(device.device())},
                {"model", {{"layers", o.model.layers}, {"hidden", o.model.hidden}, {"in", o.model.in},
                           {"classes", o.model.classes}}}});
      records.reserve(static_cast<std::size_t>(o.steps));
    }
  }
  // The steady state, for --roofline: the steps after the first few (allocator pools and cuBLAS warm up).
  const int warm = std::min(5, o.steps / 2);
  auto steady_start = start;
  out.first_step = out.last_step = t0;
  trainer::step_traffic step_bytes;  // what the summary reports as the step's traffic
  for (int i = 0; i < o.steps; ++i) {
    if (rl.wanted && i == warm) {
      device.wait_all();
      steady_start = std::chrono::steady_clock::now();
    }
    const std::uint64_t t = t0 + static_cast<std::uint64_t>(i);
    const auto step_start = std::chrono::steady_clock::now();
    const zero::step_report r = m.train_step(e, t, rank, static_cast<std::size_t>(i));
    const auto step_end = std::chrono::steady_clock::now();
    out.grad_norm = r.grad_norm;
    out.loss_scale = r.loss_scale;
    out.overflow_steps += r.skipped ? 1 : 0;
    step_bytes.add(r);
    out.last_step = t + 1;
    if (log) {
      // The host's view of the step: kernels queued on the stream may still run after it.
      trainer::step_record rec = trainer::engine_record(e, r);
      rec.step = t + 1;
      const double secs = std::chrono::duration<double>(step_end - step_start).count();
      rec.items_per_s = secs > 0 ? o.model.batch / secs : 0.0;
      rec.step_ms = secs * 1e3;
      rec.elapsed_s = std::chrono::duration<double>(step_end - start).count();
      records.push_back(rec);
    }
    if (bar && bar->due(t + 1))
      bar->update(t + 1, m.loss_of(static_cast<std::size_t>(i)),
                  r.skipped ? "  (rank 0's rows; skipped: non-finite gradients)" : "  (rank 0's rows)");
    saves.after_step(e, comm, o, i);
    trainer::report(saves, bar ? &*bar : nullptr, static_cast<trainer::run_log*>(nullptr));  // saves: logged below
  }
  if (bar) bar->finish();
  device.wait_all();
  const auto end = std::chrono::steady_clock::now();
  comm.barrier();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rl.wanted && o.steps > warm) rl.step_s = std::chrono::duration<double>(end - steady_start).count() / (o.steps - warm);
  if (o.steps > 0) {
    // Per-step losses and hits, summed over ranks in one collective each.
    const auto steps = static_cast<std::size_t>(o.steps);
    comm.all_reduce(m.losses(), m.losses(), steps, zero::reduce_op::sum);
    comm.all_reduce(m.hits(), m.hits(), steps, zero::reduce_op::sum);
    std::vector<double> losses(steps), hits(steps);
    zero::sys::cuda::copy(losses.data(), m.losses(), steps * sizeof(double));
    zero::sys::cuda::copy(hits.data(), m.hits(), steps * sizeof(double));
    out.loss_first = losses.front() / ranks;
    out.loss_last = losses.back() / ranks;
    out.accuracy_last = hits.back() / o.model.batch;
    for (auto& rec : records) {
      const std::size_t i = static_cast<std::size_t>(rec.step - t0 - 1);
      rec.loss = losses[i] / ranks;
      rec.accuracy = hits[i] / o.model.batch;
      log->step(rec);
    }
  }

  out.param_hash = mlp::param_hash(e);
  out.padded = e.layout().padded();
  out.numel = e.layout().numel();
  const auto& mem = e.memory();
  std::vector<double> maxima{static_cast<double>(mem.model_state_bytes()),
                             static_cast<double>(mem.peak[static_cast<int>(zero::mem_category::transient)]),
                             static_cast<double>(step_bytes.bytes), setup_seconds,
                             setup_cpu_seconds, static_cast<double>(step_bytes.inter)};
  for (int c = 0; c < zero::mem_category_count; ++c) maxima.push_back(static_cast<double>(mem.current[c]));
  maxima = reduce_over_ranks(comm, maxima, zero::reduce_op::max);
  out.model_state_bytes = maxima[0];
  out.transient_peak = maxima[1];
  out.comm_bytes = maxima[2];
  out.setup_seconds = maxima[3];
  out.setup_cpu_seconds = maxima[4];
  out.comm_inter_bytes = maxima[5];
  for (int c = 0; c < zero::mem_category_count; ++c) out.by_category[c] = maxima[6 + static_cast<std::size_t>(c)];
  out.model_state_formula = static_cast<double>(e.model_state_formula_bytes());
  out.comm_formula = static_cast<double>(e.comm_formula_bytes());
  trainer::offload_summary(e, out, [&](double v) { return reduce_over_ranks(comm, {v}, zero::reduce_op::max)[0]; });
  out.comm_inter_formula = static_cast<double>(e.comm_formula_by_level().inter);
  out.device = device_name(device.device());
  trainer::finish(e, comm, o, saves);
  trainer::report(saves, bar ? &*bar : nullptr, static_cast<trainer::run_log*>(nullptr));
  if (log)
    for (const auto& r : saves.records()) log->save(r);
  out.checkpoints = saves.summary();
  if (rl.wanted && rank == 0) measure_floor(device, m, e, o.model, rl);
  comm.barrier();
}

// Trains if the options' precision is Wanted: the engines of one precision, in the unit that calls it.
template <class Wanted>
void dispatch_precision(train_mlp_cuda::comm_type& comm, const options& o, summary& out, roofline& rl) {
  trainer::with_printable_errors([&] {
    trainer::dispatch(o, [&]<class S, class O, class P>(const O& opt) {
      if constexpr (std::is_same_v<P, Wanted> && zero::ElementwiseOptimizer<O>)
        train<S, O, P>(comm, o, opt, out, rl);  // (--optimizer refuses the others)
    });
  });
}

}  // namespace
