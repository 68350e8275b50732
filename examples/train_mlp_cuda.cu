// train_mlp_cuda: train_mlp on the GPU with cuBLAS GEMMs, N ranks on one GPU (cuda_threads) or one GPU per MPI process (nccl).
#include <CLI/CLI.hpp>
#include <cublas_v2.h>
#include <nlohmann/json.hpp>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mlp.hpp"
#include "trainer_cli.hpp"
#include "zero/zero_cuda.cuh"
#if ZERO_WITH_MPI
#include "zero/comm/mpi_session.hpp"
#endif

namespace {

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

 private:
  std::size_t n_;
  T* p_;
};

// ---- the model's kernels (the GEMMs are cuBLAS's) ----------------------------------------------

// out[r][o] += b[o], then ReLU below the last layer.
__global__ void bias_relu(float* out, const float* bias, int rows, int n_out, bool relu) {
  const std::size_t n = static_cast<std::size_t>(rows) * n_out;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v = out[i] + bias[i % static_cast<std::size_t>(n_out)];
    out[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

// One thread per row: softmax cross-entropy, dlogits = (softmax - onehot) / rows, and a hit flag.
__global__ void softmax_xent(const float* logits, const int* y, float* dlogits, float* row_loss, int* row_hit,
                             int rows, int classes) {
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
  row_loss[r] = logf(sum) - (z[y[r]] - m);
  row_hit[r] = argmax == y[r];
}

// One thread: the step's mean loss and hits over this rank's rows, added in row order.
__global__ void step_totals(const float* row_loss, const int* row_hit, int rows, double* loss, double* hits) {
  double l = 0.0, h = 0.0;
  for (int r = 0; r < rows; ++r) {
    l += row_loss[r];
    h += row_hit[r];
  }
  *loss = l / rows;
  *hits = h;
}

// gb[o] += sum_r dout[r][o], rows in order.
__global__ void bias_grad(const float* dout, float* gb, int rows, int n_out) {
  const int o = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (o >= n_out) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += dout[static_cast<std::size_t>(r) * n_out + o];
  gb[o] += acc;
}

struct relu_grad {
  __host__ __device__ float operator()(float d, float a) const { return a > 0.0f ? d : 0.0f; }
};

unsigned blocks_for(std::size_t n, unsigned threads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

// One rank's activations, gradients of activations, labels and per-step results, all on the device,
// with a cuBLAS handle on the rank's compute stream.
class device_model {
 public:
  device_model(zero::gpu::context& ctx, const mlp::config& c, int rows, int steps)
      : ctx_(ctx), c_(c), rows_(rows), widest_(widest(c)), losses_(static_cast<std::size_t>(steps)),
        hits_(static_cast<std::size_t>(steps)), row_loss_(static_cast<std::size_t>(rows)),
        row_hit_(static_cast<std::size_t>(rows)), labels_(static_cast<std::size_t>(rows)),
        grad_a_(static_cast<std::size_t>(rows) * widest_), grad_b_(static_cast<std::size_t>(rows) * widest_) {
    for (int l = 0; l <= c.layers; ++l)
      acts_.emplace_back(std::make_unique<device_array<float>>(static_cast<std::size_t>(rows) * mlp::dim(c, l)));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, ctx.compute()));
    // Plain fp32 GEMMs (no TF32): the trainer's numbers stay comparable with the CPU trainer's.
    CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH));
    for (auto& s : staging_) {
      void* x = nullptr;
      void* y = nullptr;
      ZERO_CUDA_CHECK(cudaMallocHost(&x, static_cast<std::size_t>(rows) * c.in * sizeof(float)));
      ZERO_CUDA_CHECK(cudaMallocHost(&y, static_cast<std::size_t>(rows) * sizeof(int)));
      s.x = static_cast<float*>(x);
      s.y = static_cast<int*>(y);
      ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
    }
  }
  device_model(const device_model&) = delete;
  device_model& operator=(const device_model&) = delete;
  ~device_model() {
    (void)cudaStreamSynchronize(ctx_.compute());
    for (auto& s : staging_) {
      (void)cudaFreeHost(s.x);
      (void)cudaFreeHost(s.y);
      (void)cudaEventDestroy(s.copied);
    }
    (void)cublasDestroy(blas_);
  }

  // One step of this rank on its slice of the global batch, as mlp::train_step on the CPU.
  template <class Engine>
  void train_step(Engine& e, std::uint64_t step, int rank) {
    const cudaStream_t s = ctx_.compute();
    upload(mlp::make_batch(c_, step, rank * rows_, rows_), step);
    const float one = 1.0f, zero = 0.0f;
    for (int l = 0; l < c_.layers; ++l) {
      auto p = e.gather(zero::unit_id{static_cast<std::size_t>(l)});
      const int n_in = mlp::dim(c_, l), n_out = mlp::dim(c_, l + 1);
      float* out = act(l + 1);
      // Row-major out[rows][n_out] = in[rows][n_in] * W[n_out][n_in]^T, i.e. column-major out^T = W^T' * in^T.
      CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n_out, rows_, n_in, &one, p["w"].data(), n_in, act(l),
                               n_in, &zero, out, n_out));
      bias_relu<<<blocks_for(static_cast<std::size_t>(rows_) * n_out, 256), 256, 0, s>>>(out, p["b"].data(), rows_, n_out,
                                                                                       l + 1 < c_.layers);
      ZERO_CUDA_CHECK(cudaGetLastError());
      p.release();
    }
    float* dout = grad_a_.data();
    float* din = grad_b_.data();
    softmax_xent<<<blocks_for(static_cast<std::size_t>(rows_), 128), 128, 0, s>>>(
        act(c_.layers), labels_.data(), dout, row_loss_.data(), row_hit_.data(), rows_, c_.classes);
    step_totals<<<1, 1, 0, s>>>(row_loss_.data(), row_hit_.data(), rows_, losses_.data() + step, hits_.data() + step);
    ZERO_CUDA_CHECK(cudaGetLastError());
    for (int l = c_.layers - 1; l >= 0; --l) {
      const zero::unit_id u{static_cast<std::size_t>(l)};
      auto p = e.gather(u);
      auto g = e.grads(u);
      const int n_in = mlp::dim(c_, l), n_out = mlp::dim(c_, l + 1);
      // gW[n_out][n_in] += dout^T * in: column-major gW^T = in^T * dout.
      CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, n_in, n_out, rows_, &one, act(l), n_in, dout, n_out, &one,
                               g["w"].data(), n_in));
      bias_grad<<<blocks_for(static_cast<std::size_t>(n_out), 128), 128, 0, s>>>(dout, g["b"].data(), rows_, n_out);
      ZERO_CUDA_CHECK(cudaGetLastError());
      if (l > 0)  // din[rows][n_in] = dout * W: column-major din^T = W^T * dout^T.
        CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, n_in, rows_, n_out, &one, p["w"].data(), n_in, dout,
                                 n_out, &zero, din, n_in));
      e.reduce(u);
      p.release();
      if (l > 0) {  // through the ReLU of the layer below
        const std::size_t n = static_cast<std::size_t>(rows_) * n_in;
        thrust::transform(thrust::cuda::par_nosync.on(s), din, din + n, act(l), din, relu_grad{});
        std::swap(dout, din);
      }
    }
    e.step();
  }

  // Per step, this rank's mean loss and hits (summed over ranks at the end of training).
  double* losses() const { return losses_.data(); }
  double* hits() const { return hits_.data(); }

  // This rank's loss of `step` (waits for it): for progress lines only.
  double loss_of(std::uint64_t step) {
    ZERO_CUDA_CHECK(cudaMemcpyAsync(ctx_.host_scalar(), losses_.data() + step, sizeof(double), cudaMemcpyDeviceToHost,
                                    ctx_.compute()));
    ctx_.wait_compute();
    return *ctx_.host_scalar();
  }

 private:
  struct staging {
    float* x = nullptr;
    int* y = nullptr;
    cudaEvent_t copied = nullptr;
    bool pending = false;
  };
  static int widest(const mlp::config& c) {
    int w = 0;
    for (int l = 0; l <= c.layers; ++l) w = std::max(w, mlp::dim(c, l));
    return w;
  }
  float* act(int l) const { return acts_[static_cast<std::size_t>(l)]->data(); }

  // The batch goes through one of two pinned buffers, so the copy is asynchronous and the host only
  // waits (rarely) for the copy issued two steps ago before reusing its buffer.
  void upload(const mlp::batch& b, std::uint64_t step) {
    staging& st = staging_[step % 2];
    if (st.pending) ZERO_CUDA_CHECK(cudaEventSynchronize(st.copied));
    std::copy(b.x.begin(), b.x.end(), st.x);
    std::copy(b.y.begin(), b.y.end(), st.y);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(act(0), st.x, b.x.size() * sizeof(float), cudaMemcpyHostToDevice, ctx_.compute()));
    ZERO_CUDA_CHECK(cudaMemcpyAsync(labels_.data(), st.y, b.y.size() * sizeof(int), cudaMemcpyHostToDevice,
                                    ctx_.compute()));
    ZERO_CUDA_CHECK(cudaEventRecord(st.copied, ctx_.compute()));
    st.pending = true;
  }

  zero::gpu::context& ctx_;
  mlp::config c_;
  int rows_, widest_;
  cublasHandle_t blas_ = nullptr;
  std::vector<std::unique_ptr<device_array<float>>> acts_;
  staging staging_[2];
  device_array<double> losses_, hits_;
  device_array<float> row_loss_;
  device_array<int> row_hit_, labels_;
  device_array<float> grad_a_, grad_b_;
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

template <class Stage, class Opt, class Comm>
void train(Comm& comm, const options& o, const Opt& opt, summary& out) {
  const zero::model_spec spec = mlp::make_spec(o.model);
  zero::engine_options eo;
  eo.clip_norm = o.clip;
  eo.memory_limit_bytes = o.memory_limit;
  const auto setup_start = std::chrono::steady_clock::now();
  const double setup_cpu_start = trainer::thread_cpu_seconds();
  zero::engine<Stage, Comm, Opt> e(comm, spec, opt, eo);
  e.initialize(mlp::initializer(o.model));
  comm.context().wait_all();
  const double setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  const double setup_cpu_seconds = trainer::thread_cpu_seconds() - setup_cpu_start;
  const int rank = comm.rank(), ranks = comm.size();
  device_model m(comm.context(), o.model, o.model.batch / ranks, o.steps);
  comm.barrier();  // every rank starts the clock with its set-up done
  const auto start = std::chrono::steady_clock::now();
  auto last_print = start;
  for (int t = 0; t < o.steps; ++t) {
    m.train_step(e, static_cast<std::uint64_t>(t), rank);
    const auto now = std::chrono::steady_clock::now();
    if (rank == 0 && (now - last_print > std::chrono::milliseconds(500) || t + 1 == o.steps || t == 0)) {
      const double loss = m.loss_of(static_cast<std::uint64_t>(t));  // rank 0's own rows
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "step %5d/%d  loss %.4f (rank 0)  %.0f samples/s\n", t + 1, o.steps, loss,
                   secs > 0 ? (t + 1) * double(o.model.batch) / secs : 0.0);
      last_print = now;
    }
  }
  comm.context().wait_all();
  comm.barrier();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

  out.param_hash = mlp::param_hash(e);
  out.padded = e.layout().padded();
  out.numel = e.layout().numel();
  const auto& mem = e.memory();
  std::vector<double> maxima{static_cast<double>(mem.model_state_bytes()),
                             static_cast<double>(mem.peak[static_cast<int>(zero::mem_category::transient)]),
                             static_cast<double>(e.comm().last_step.total_bytes()), setup_seconds,
                             setup_cpu_seconds};
  for (int c = 0; c < zero::mem_category_count; ++c) maxima.push_back(static_cast<double>(mem.current[c]));
  maxima = reduce_over_ranks(comm, maxima, zero::reduce_op::max);
  out.model_state_bytes = maxima[0];
  out.transient_peak = maxima[1];
  out.comm_bytes = maxima[2];
  out.setup_seconds = maxima[3];
  out.setup_cpu_seconds = maxima[4];
  for (int c = 0; c < zero::mem_category_count; ++c) out.by_category[c] = maxima[5 + static_cast<std::size_t>(c)];
  out.model_state_formula = static_cast<double>(e.model_state_formula_bytes());
  out.comm_formula = static_cast<double>(e.comm_formula_bytes());
  out.device = device_name(comm.context().device());
  out.last_step = static_cast<std::uint64_t>(o.steps);
}

// The device kernels of this trainer are fp32; main() refuses the other precisions before this.
template <class Comm>
void dispatch(Comm& comm, const options& o, summary& out) {
  trainer::dispatch(o, [&]<class S, class O, class P>(const O& opt) {
    if constexpr (std::is_same_v<P, zero::precision::fp32>) train<S, O>(comm, o, opt, out);
  });
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.backend = "cuda_threads";
  CLI::App app{"Train a small MLP classifier with ZeRO on the GPU: N ranks sharing this process's GPU "
               "(comm::cuda_threads) or one GPU per MPI process started by mpirun (comm::nccl)."};
  [[maybe_unused]] auto* ranks_flag =
      app.add_option("--ranks", o.ranks, "number of ranks (with --backend nccl: the MPI communicator's size)")
          ->check(CLI::Range(1, zero::comm::cuda_threads::max_ranks))
          ->capture_default_str();
  app.add_option("--backend", o.backend,
                 "cuda_threads: ranks as threads sharing one GPU; nccl: one rank and one GPU per MPI process")
      ->check(CLI::IsMember({"cuda_threads", "nccl"}))
      ->capture_default_str();
  trainer::add_common_flags(app, o);
  if (const auto code = trainer::parse(app, argc, argv)) return *code;
  auto usage_error = [&](const std::string& msg) { return trainer::usage_error(app, msg); };
  const std::string batch_rule = "the global batch " + std::to_string(o.model.batch) + " must be a multiple of ";
  // What the GPU trainer does not do yet: its kernels are fp32 and one batch per step, and it has no
  // checkpoint wiring. Refused rather than ignored.
  if (o.precision != "fp32") return usage_error("--precision " + o.precision + ": train_mlp_cuda trains in fp32 only");
  if (o.accum != 1) return usage_error("--accum: train_mlp_cuda takes one micro-batch per step");
  if (!o.save.empty() || !o.resume.empty() || !o.export_file.empty())
    return usage_error("--save, --resume and --export are train_mlp's; train_mlp_cuda does not checkpoint yet");

  summary s;
  if (o.backend == "nccl") {
#if ZERO_WITH_MPI && ZERO_WITH_NCCL
    zero::comm::mpi_session session(argc, argv);
    const int world = session.world_size(), rank = session.world_rank();
    std::string problem;
    if (ranks_flag->count() > 0 && o.ranks != world)
      problem = "--ranks " + std::to_string(o.ranks) + " contradicts the " + std::to_string(world) +
                " MPI processes (under --backend nccl the ranks are the processes mpirun starts; drop --ranks)";
    else if (o.model.batch % world != 0)
      problem = batch_rule + "the number of MPI processes " + std::to_string(world);
    if (!problem.empty()) return rank == 0 ? usage_error(problem) : 2;
    o.ranks = world;
    try {
      zero::comm::nccl comm(MPI_COMM_WORLD);
      dispatch(comm, o, s);
    } catch (const std::exception& e) {
      // Peers blocked in NCCL would otherwise wait for their watchdog's timeout.
      std::cerr << "train_mlp_cuda rank " << rank << ": " << e.what() << "\n";
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank != 0) return 0;  // every rank holds the reduced summary; rank 0 reports it
#else
    return usage_error("--backend nccl: this train_mlp_cuda was built without MPI or NCCL");
#endif
  } else {
    if (o.model.batch % o.ranks != 0) return usage_error(batch_rule + "--ranks " + std::to_string(o.ranks));
    try {
      zero::comm::cuda_threads::launch(o.ranks, [&](zero::comm::cuda_threads& comm) {
        summary local;
        dispatch(comm, o, local);
        if (comm.rank() == 0) s = local;
      });
    } catch (const std::exception& e) {
      std::cerr << "train_mlp_cuda: " << e.what() << "\n";
      return 1;
    }
  }
  trainer::print_summary(o, s);
  if (o.json) {
    const nlohmann::json j = trainer::summary_json(o, s);
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
