// comm::nccl: collectives over NCCL on each rank's communication stream, bootstrapped from MPI, a unique id, or within one process.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(ZERO_WITH_MPI) && ZERO_WITH_MPI
#include "zero/comm/mpi_session.hpp"  // <mpi.h> without the deprecated C++ bindings
#endif

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/counted.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/comm/detail/threads_world.hpp"
#include "zero/comm/split.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/numeric.hpp"
#include "zero/error.hpp"
#include "zero/sys/cuda.cuh"

namespace zero::comm {

struct nccl_options {
  // true: sums in rank order, equal bit for bit to comm::threads and comm::mpi (grouped
  // ncclSend/ncclRecv moves every rank's slice to its owner, then a kernel sums the N slices as
  // acc = x0; acc += x1; ..., 2-byte floats in fp32). false: NCCL's own ring/tree reductions, which
  // move less data but sum in an order that depends on the algorithm and topology.
  bool deterministic = true;
  // How long a host wait for this rank's device work (or for NCCL to finish initialising or
  // enqueueing) may last before the communicator is aborted and the rank fails.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // launch(): create the in-process communicators non-blocking (ncclCommInitRankConfig in a group)
  // rather than with ncclCommInitAll. NCCL can only abort a hung call on a non-blocking communicator;
  // ncclCommInitAll is the simpler, blocking equivalent.
  bool nonblocking = true;
};

namespace detail {

template <class T>
inline constexpr bool nccl_type_supported =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16> ||
    std::is_same_v<T, int> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> ||
    std::is_same_v<T, std::int8_t>;

template <class T>
constexpr ncclDataType_t nccl_type() {
  static_assert(nccl_type_supported<T>, "comm::nccl collectives take float, double, zero::bf16, zero::fp16, int and "
                                        "std::int64_t (and bytes, std::uint8_t and std::int8_t, for quantized data)");
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, bf16>) return ncclBfloat16;  // bit-compatible with __nv_bfloat16
  else if constexpr (std::is_same_v<T, fp16>) return ncclFloat16;   // bit-compatible with __half
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;  // binned sums: exact in any order
  else if constexpr (std::is_same_v<T, std::uint8_t>) return ncclUint8;
  else if constexpr (std::is_same_v<T, std::int8_t>) return ncclInt8;
  else return ncclInt32;
}

inline ncclRedOp_t nccl_op(reduce_op op) { return op == reduce_op::sum ? ncclSum : ncclMax; }

}  // namespace detail

// One rank of an NCCL communicator, with its own gpu::context: collectives are enqueued on the
// context's communication stream after an event wait on its compute stream, and the compute stream
// waits on the collective through another event; the host never blocks in a collective except in
// barrier(). Communicators are non-blocking (except under launch() with nonblocking = false), so
// every NCCL call returns at once and this class polls: a failed peer shows as an asynchronous error
// (ncclCommGetAsyncError) or as a wait that outlasts the timeout, and either ends in ncclCommAbort
// and a zero::error (kind comm), never in a hang.
//
// The context is bound to the thread that creates the rank (sys::cuda's static calls use it): create,
// use and destroy a rank on one thread.
class nccl {
 public:
  using system = sys::cuda;
  using options = nccl_options;

  // A unique id for nccl(id, rank, size, device): created by one rank, sent to all by any means.
  static ncclUniqueId unique_id() {
    ncclUniqueId id{};
    check_call(ncclGetUniqueId(&id), "ncclGetUniqueId", -1);
    return id;
  }

  // Rank `rank` of `size`, on CUDA device `device`, joining the communicator of `id`.
  nccl(const ncclUniqueId& id, int rank, int size, int device, options o = {}) : o_(o), rank_(rank), size_(size) {
    ZERO_CHECK(size > 0 && rank >= 0 && rank < size, invalid_argument, "comm::nccl: rank ", rank,
               " is not in a world of size ", size);
    start(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    settle(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
  }

#if defined(ZERO_WITH_MPI) && ZERO_WITH_MPI
  // One rank per MPI process of `c`: rank 0 creates the unique id and broadcasts it. The device is
  // the process's index among the processes of its node, modulo the node's devices.
  explicit nccl(MPI_Comm c, options o = {}) : nccl(mpi_bootstrap(c), o) {}
#endif

  // All ranks in this process, one thread and one device each (devices[r] for rank r): fn(comm) runs
  // on every rank as in comm::threads::launch. A rank that throws makes the others' waits fail (and
  // their communicators abort) at their next poll; the first exception is rethrown here.
  static void launch(const std::vector<int>& devices, const std::function<void(nccl&)>& fn, options o = {}) {
    const int n = static_cast<int>(devices.size());
    ZERO_CHECK(n > 0, invalid_argument, "comm::nccl::launch: at least one device is needed");
    std::vector<ncclComm_t> comms(static_cast<std::size_t>(n), nullptr);
    init_all(comms, devices, o);
    auto failed = std::make_shared<std::atomic<bool>>(false);
    detail::threads_world world(n, o.timeout, "comm::nccl");
    std::vector<char> taken(static_cast<std::size_t>(n), 0);
    try {
      detail::run_ranks(world, n, [&](int r) {
        taken[static_cast<std::size_t>(r)] = 1;  // from here on the rank's nccl object owns its communicator
        // The flag is raised before the rank's nccl object is destroyed: its destructor, and every
        // peer's, then aborts instead of waiting for work that will never complete.
        try {
          nccl comm(comms[static_cast<std::size_t>(r)], r, n, devices[static_cast<std::size_t>(r)], o, failed);
          try {
            fn(comm);
          } catch (...) {
            failed->store(true);
            throw;
          }
        } catch (...) {
          failed->store(true);
          throw;
        }
      });
    } catch (...) {
      for (int r = 0; r < n; ++r)
        if (!taken[static_cast<std::size_t>(r)] && comms[static_cast<std::size_t>(r)])
          (void)ncclCommAbort(comms[static_cast<std::size_t>(r)]);
      throw;
    }
  }

  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  ~nccl() { shut_down(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool deterministic() const { return o_.deterministic; }
  ncclComm_t handle() const { return comm_; }
  gpu::context& context() const { return *ctx_; }
  cudaStream_t compute_stream() const { return ctx_->compute(); }
  sys::cuda make_system() const { return sys::cuda(*ctx_); }
  // Device bytes of the deterministic mode's staging buffer (outside the engine's accounting).
  std::size_t workspace_bytes() const { return workspace_bytes_; }

  // A zero count skips NCCL on every rank alike (all ranks pass the same count).
  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    begin();
    enqueue_all_reduce(send, recv, count, op);
    end();
  }

  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    begin();
    enqueue_reduce_scatter(send, recv, count, op);
    end();
  }

  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    begin();
    enqueue_all_gather(send, recv, count);
    end();
  }

  // Nonblocking collectives (comm/nonblocking.hpp). start_* enqueues the collective on the
  // communication stream exactly as the blocking call does, but leaves the compute stream free: the
  // kernels the user enqueues between start and wait run while the collective moves data. wait(r)
  // makes the compute stream wait on the collective's event, on the device: the host never blocks.
  // A request dropped without wait does the same in its destructor, so a buffer freed afterwards on
  // the compute stream (stream-ordered) is never freed under the collective.
  class request {
   public:
    request() = default;
    request(request&& o) noexcept : compute_(o.compute_), event_(std::exchange(o.event_, nullptr)) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        finish();
        compute_ = o.compute_;
        event_ = std::exchange(o.event_, nullptr);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { finish(); }

   private:
    friend class nccl;
    request(cudaStream_t compute, cudaEvent_t done) : compute_(compute), event_(done) {}
    // The compute stream waits for the collective; the event is destroyed (CUDA releases it once the
    // wait no longer needs it). Errors cannot be thrown from here: the next checked call reports them.
    void finish() noexcept {
      if (!event_) return;
      (void)cudaStreamWaitEvent(compute_, event_, 0);
      (void)cudaEventDestroy(event_);
      event_ = nullptr;
    }
    cudaStream_t compute_ = nullptr;
    cudaEvent_t event_ = nullptr;
  };

  template <class T>
  request start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    begin();
    enqueue_all_reduce(send, recv, count, op);
    return issued();
  }
  template <class T>
  request start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    begin();
    enqueue_reduce_scatter(send, recv, count, op);
    return issued();
  }
  template <class T>
  request start_all_gather(const T* send, T* recv, std::size_t count) {
    begin();
    enqueue_all_gather(send, recv, count);
    return issued();
  }
  void wait(request& r) {
    if (!r.event_) return;
    usable();
    const cudaEvent_t e = std::exchange(r.event_, nullptr);
    const cudaError_t waited = cudaStreamWaitEvent(ctx_->compute(), e, 0);
    (void)cudaEventDestroy(e);
    ZERO_CUDA_CHECK(waited);
  }

  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ZERO_CHECK(root >= 0 && root < size_, invalid_argument, "comm::nccl rank ", rank_, ": broadcast root ", root,
               " is not in [0, ", size_, ")");
    begin();
    if (count > 0)
      settle(ncclBroadcast(send, recv, count, detail::nccl_type<T>(), root, comm_, ctx_->comm()), "ncclBroadcast");
    end();
  }

  // Block k of send to rank k, recv[k*count..] from rank k (comm/all_to_all.hpp): grouped
  // ncclSend/ncclRecv, this rank's own block copied on the communication stream.
  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count) {
    begin();
    enqueue_all_to_all(send, recv, count);
    end();
  }
  template <class T>
  request start_all_to_all(const T* send, T* recv, std::size_t count) {
    begin();
    enqueue_all_to_all(send, recv, count);
    return issued();
  }

  // The ranks that pass the same color form a new communicator (ncclCommSplit, key = rank, a
  // collective on this one) on this rank's context: the same device, streams and pool, so the
  // engine's buffers and events serve both (comm/split.hpp). Destroy it before this one.
  std::unique_ptr<nccl> split(int color) {
    ZERO_CHECK(color >= 0, invalid_argument, "comm::nccl rank ", rank_, ": split color must be >= 0, got ", color);
    usable();
    ctx_->wait_all();  // NCCL's split may synchronise; nothing of ours is left in flight
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t part = nullptr;
    settle(ncclCommSplit(comm_, color, rank_, &part, &config), "ncclCommSplit");
    // The new communicator initialises in the background: poll it until it is ready or fails.
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = part ? ncclCommGetAsyncError(part, &state) : ncclInvalidUsage;
      if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        if (part) (void)ncclCommAbort(part);
        fail_comm("ncclCommSplit (initialisation)", q != ncclSuccess ? q : state);
      }
      if (state == ncclSuccess) break;
      poll_health(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start),
                  "ncclCommSplit");
      std::this_thread::yield();
    }
    int sub_rank = 0, sub_size = 0;
    settle(ncclCommUserRank(part, &sub_rank), "ncclCommUserRank");
    settle(ncclCommCount(part, &sub_size), "ncclCommCount");
    return std::unique_ptr<nccl>(new nccl(part, sub_rank, sub_size, *ctx_, o_, peers_failed_));
  }

  // NCCL has no barrier: a one-word all-reduce the host waits for, so no rank returns before every
  // rank has contributed.
  void barrier() {
    begin();
    settle(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, ctx_->comm()),
           "ncclAllReduce (barrier)");
    end();
    ctx_->wait_compute();
  }

 private:
  struct bootstrap {
    ncclUniqueId id;
    int rank, size, device;
  };
  nccl(const bootstrap& b, options o) : nccl(b.id, b.rank, b.size, b.device, o) {}

  // A communicator made by split(): on the parent's context (not owned), with its own barrier word.
  nccl(ncclComm_t comm, int rank, int size, gpu::context& ctx, options o, std::shared_ptr<std::atomic<bool>> failed)
      : o_(o), rank_(rank), size_(size), ctx_(&ctx), comm_(comm), peers_failed_(std::move(failed)) {
    try {
      make_barrier_word();
    } catch (...) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  // A communicator made by launch(): this rank takes ownership of it.
  nccl(ncclComm_t comm, int rank, int size, int device, options o, std::shared_ptr<std::atomic<bool>> failed)
      : o_(o), rank_(rank), size_(size), comm_(comm), peers_failed_(std::move(failed)) {
    try {
      start(device);
    } catch (...) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

#if defined(ZERO_WITH_MPI) && ZERO_WITH_MPI
  static bootstrap mpi_bootstrap(MPI_Comm c) {
    bootstrap b{};
    MPI_Comm_rank(c, &b.rank);
    MPI_Comm_size(c, &b.size);
    MPI_Comm node;
    MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, b.rank, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    int devices = 0;
    const bool have_devices = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
    (void)cudaGetLastError();
    b.device = have_devices ? local % devices : 0;
    // Rank 0's id and whether it could make one travel together: a rank 0 that failed must not leave
    // the others waiting for an id that never comes.
    struct {
      ncclUniqueId id;
      int ok;
    } message{};
    if (b.rank == 0) message.ok = ncclGetUniqueId(&message.id) == ncclSuccess ? 1 : 0;
    MPI_Bcast(&message, static_cast<int>(sizeof message), MPI_BYTE, 0, c);
    ZERO_CHECK(have_devices, comm, "comm::nccl rank ", b.rank, ": no CUDA device on this node");
    ZERO_CHECK(message.ok == 1, comm, "comm::nccl rank ", b.rank, ": rank 0 could not create an NCCL unique id");
    b.id = message.id;
    return b;
  }
#endif

  // The in-process communicators: non-blocking ones created in a group (abortable), or ncclCommInitAll.
  static void init_all(std::vector<ncclComm_t>& comms, const std::vector<int>& devices, const options& o) {
    const int n = static_cast<int>(devices.size());
    if (!o.nonblocking) {
      check_call(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll", -1);
      return;
    }
    const ncclUniqueId id = unique_id();
    check_call(ncclGroupStart(), "ncclGroupStart", -1);
    for (int r = 0; r < n; ++r) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ZERO_CUDA_CHECK(cudaSetDevice(devices[static_cast<std::size_t>(r)]));
      const ncclResult_t res = ncclCommInitRankConfig(&comms[static_cast<std::size_t>(r)], n, id, r, &config);
      if (res != ncclSuccess && res != ncclInProgress) {
        (void)ncclGroupEnd();
        abort_all(comms);
        check_call(res, "ncclCommInitRankConfig", r);
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (end != ncclSuccess && end != ncclInProgress) {
      abort_all(comms);
      check_call(end, "ncclGroupEnd (communicator creation)", -1);
    }
    // Every communicator finishes initialising, or all are aborted.
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < n; ++r) {
      for (;;) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(comms[static_cast<std::size_t>(r)], &state);
        if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
          abort_all(comms);
          check_call(q != ncclSuccess ? q : state, "communicator initialisation", r);
        }
        if (state == ncclSuccess) break;
        if (std::chrono::steady_clock::now() - start > o.timeout) {
          abort_all(comms);
          fail(error_kind::comm, "comm::nccl::launch: the communicators did not finish initialising within ",
               o.timeout.count(), " ms");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }
  static void abort_all(std::vector<ncclComm_t>& comms) noexcept {
    for (auto& c : comms)
      if (c) {
        (void)ncclCommAbort(c);
        c = nullptr;
      }
  }

  // Throws for a failed call outside a communicator's life (no comm to abort); `rank` -1: none.
  static void check_call(ncclResult_t r, const char* what, int rank) {
    if (r == ncclSuccess) return;
    const char* last = ncclGetLastError(nullptr);
    fail(error_kind::comm, "comm::nccl", rank >= 0 ? detail_rank(rank) : std::string(), ": ", what, " failed: ",
         ncclGetErrorString(r), last && *last ? std::string(" (") + last + ")" : std::string());
  }
  static std::string detail_rank(int rank) { return " rank " + std::to_string(rank); }

  // The rank's context (bound to this thread), the watchdog that polls NCCL during host waits, and
  // the barrier's word.
  void start(int device) {
    own_ctx_ = std::make_unique<gpu::context>(device);
    ctx_ = own_ctx_.get();
    binding_ = std::make_unique<gpu::context::binding>(*ctx_);
    ctx_->set_watchdog([this](std::chrono::milliseconds waited) { poll_health(waited, "a wait for the device"); });
    make_barrier_word();
  }
  void make_barrier_word() {
    void* word = nullptr;
    ZERO_CUDA_CHECK(cudaMallocFromPoolAsync(&word, sizeof(int), ctx_->pool(), ctx_->comm()));
    ZERO_CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof(int), ctx_->comm()));
    barrier_word_ = static_cast<int*>(word);
  }

  void begin() {
    usable();
    ctx_->comm_waits_for_compute();
  }
  void end() { ctx_->compute_waits_for_comm(); }
  // A started collective's completion: an event of its own on the communication stream (the
  // context's shared event is re-recorded by every call, and a request may be waited for late).
  request issued() {
    cudaEvent_t e = nullptr;
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(e, ctx_->comm());
    if (recorded != cudaSuccess) {
      (void)cudaEventDestroy(e);
      ZERO_CUDA_CHECK(recorded);
    }
    return request(ctx_->compute(), e);
  }

  template <class T>
  void enqueue_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    if (count == 0) return;
    // Deterministic mode: every reducing collective, max and one rank included, goes through the
    // rank-ordered kernel, which also makes its NaNs canonical as on the host backends.
    if (o_.deterministic)
      ordered_all_reduce(send, recv, count, op);
    else
      settle(ncclAllReduce(send, recv, count, detail::nccl_type<T>(), detail::nccl_op(op), comm_, ctx_->comm()),
             "ncclAllReduce");
  }
  template <class T>
  void enqueue_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    if (count == 0) return;
    if (o_.deterministic)
      ordered_reduce_scatter(send, recv, count, op);
    else
      settle(ncclReduceScatter(send, recv, count, detail::nccl_type<T>(), detail::nccl_op(op), comm_, ctx_->comm()),
             "ncclReduceScatter");
  }
  // Copies are exact whatever NCCL's algorithm: the native collectives serve both modes.
  template <class T>
  void enqueue_all_to_all(const T* send, T* recv, std::size_t count) {
    if (count == 0) return;
    group_start();
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) continue;
      send_to(send + count * static_cast<std::size_t>(k), count, k);
      recv_from(recv + count * static_cast<std::size_t>(k), count, k);
    }
    group_end("ncclGroupEnd (all_to_all)");
    const std::size_t mine = count * static_cast<std::size_t>(rank_);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(recv + mine, send + mine, count * sizeof(T), cudaMemcpyDeviceToDevice,
                                    ctx_->comm()));
  }
  template <class T>
  void enqueue_all_gather(const T* send, T* recv, std::size_t count) {
    if (count > 0)
      settle(ncclAllGather(send, recv, count, detail::nccl_type<T>(), comm_, ctx_->comm()), "ncclAllGather");
  }
  void usable() const {
    ZERO_CHECK(comm_ != nullptr, comm, "comm::nccl rank ", rank_, ": the communicator was aborted after an earlier ",
               "failure; create a new one");
  }

  // A call's result: ncclInProgress (a non-blocking communicator still working) is polled until it
  // settles; any error aborts the communicator and throws.
  void settle(ncclResult_t r, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    while (r == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) fail_comm("ncclCommGetAsyncError", q);
      r = state;
      if (r != ncclInProgress) break;
      poll_health(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start), what);
      std::this_thread::yield();
    }
    if (r != ncclSuccess) fail_comm(what, r);
  }

  // Called while the host waits: an asynchronous NCCL error, a failed peer thread of the same
  // launch, or a wait past the timeout ends the communicator.
  void poll_health(std::chrono::milliseconds waited, const char* what) {
    usable();
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) fail_comm("ncclCommGetAsyncError", q);
    if (state != ncclSuccess && state != ncclInProgress) fail_comm(what, state);
    if (peers_failed_ && peers_failed_->load()) {
      abort_comm();
      fail(error_kind::comm, "comm::nccl rank ", rank_, ": ", what, " aborted: another rank of this launch failed");
    }
    if (waited > o_.timeout) {
      abort_comm();
      fail(error_kind::comm, "comm::nccl rank ", rank_, ": ", what, " waited ", waited.count(),
           " ms (timeout): a peer rank is missing, dead or stuck; the communicator was aborted");
    }
  }

  [[noreturn]] void fail_comm(const char* what, ncclResult_t r) {
    // ncclGetLastError first: the abort frees what it describes.
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    std::string msg = zero::detail::concat("comm::nccl rank ", rank_, ": ", what, " failed: ", ncclGetErrorString(r),
                                           last && *last ? std::string(" (") + last + ")" : std::string());
    abort_comm();
    if (peers_failed_) peers_failed_->store(true);
    fail(error_kind::comm, msg);
  }
  void abort_comm() noexcept {
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Flushes the rank's device work and finalizes the communicator; anything that fails or would hang
  // ends in an abort instead (a destructor must return).
  void shut_down() noexcept {
    if (comm_) {
      try {
        ctx_->wait_all();
        settle(ncclCommFinalize(comm_), "ncclCommFinalize");
        (void)ncclCommDestroy(comm_);
        comm_ = nullptr;
      } catch (...) {
        abort_comm();
      }
    }
    if (ctx_) {
      if (workspace_) (void)cudaFreeAsync(workspace_, ctx_->comm());
      if (barrier_word_) (void)cudaFreeAsync(barrier_word_, ctx_->comm());
      (void)cudaGetLastError();
    }
    workspace_ = nullptr;
    barrier_word_ = nullptr;
    binding_.reset();
    own_ctx_.reset();
    ctx_ = nullptr;
  }

  // The deterministic mode's staging buffer, grown on the communication stream (the only stream that
  // uses it, so stream order protects it).
  template <class T>
  T* workspace(std::size_t elems) {
    const std::size_t bytes = elems * sizeof(T);
    if (bytes > workspace_bytes_) {
      if (workspace_) ZERO_CUDA_CHECK(cudaFreeAsync(workspace_, ctx_->comm()));
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      ZERO_CUDA_CHECK(cudaMallocFromPoolAsync(&workspace_, bytes, ctx_->pool(), ctx_->comm()));
      workspace_bytes_ = bytes;
    }
    return static_cast<T*>(workspace_);
  }

  template <class T>
  void send_to(const T* buf, std::size_t n, int peer) {
    if (n) settle(ncclSend(buf, n, detail::nccl_type<T>(), peer, comm_, ctx_->comm()), "ncclSend");
  }
  template <class T>
  void recv_from(T* buf, std::size_t n, int peer) {
    if (n) settle(ncclRecv(buf, n, detail::nccl_type<T>(), peer, comm_, ctx_->comm()), "ncclRecv");
  }
  void group_start() { settle(ncclGroupStart(), "ncclGroupStart"); }
  void group_end(const char* what) { settle(ncclGroupEnd(), what); }

  // Where rank r's all_reduce chunk begins: count * r / N rounded down to the kernels' vector width.
  std::size_t edge(std::size_t count, int r) const {
    if (r >= size_) return count;
    const std::size_t e = count * static_cast<std::size_t>(r) / static_cast<std::size_t>(size_);
    return e / gpu::chunk_elements * gpu::chunk_elements;
  }

  // Rank r's slice of every rank's send arrives in a staging buffer (slice k from rank k), then one
  // kernel sums the N slices in rank order into recv. recv may be this rank's slice of send: the
  // exchange has finished (stream order) before the kernel writes.
  template <class T>
  void ordered_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    if (count == 0) return;
    T* staging = workspace<T>(count * static_cast<std::size_t>(size_));
    const std::size_t mine = count * static_cast<std::size_t>(rank_);
    group_start();
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) continue;
      send_to(send + count * static_cast<std::size_t>(k), count, k);
      recv_from(staging + count * static_cast<std::size_t>(k), count, k);
    }
    group_end("ncclGroupEnd (reduce_scatter exchange)");
    ZERO_CUDA_CHECK(cudaMemcpyAsync(staging + mine, send + mine, count * sizeof(T), cudaMemcpyDeviceToDevice,
                                    ctx_->comm()));
    sum_slices(staging, count, recv, op);
  }

  // Rank r reduces chunk r as in reduce_scatter, then sends it to every rank (send/recv, since the
  // chunks differ in length by up to the vector width).
  template <class T>
  void ordered_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    const std::size_t b = edge(count, rank_), len = edge(count, rank_ + 1) - b;
    T* staging = workspace<T>(len * static_cast<std::size_t>(size_));
    group_start();
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) continue;
      send_to(send + edge(count, k), edge(count, k + 1) - edge(count, k), k);
      recv_from(staging + len * static_cast<std::size_t>(k), len, k);
    }
    group_end("ncclGroupEnd (all_reduce exchange)");
    if (len) {
      ZERO_CUDA_CHECK(cudaMemcpyAsync(staging + len * static_cast<std::size_t>(rank_), send + b, len * sizeof(T),
                                      cudaMemcpyDeviceToDevice, ctx_->comm()));
      sum_slices(staging, len, recv + b, op);
    }
    group_start();
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) continue;
      send_to(recv + b, len, k);
      recv_from(recv + edge(count, k), edge(count, k + 1) - edge(count, k), k);
    }
    group_end("ncclGroupEnd (all_reduce distribution)");
  }

  template <class T>
  void sum_slices(const T* staging, std::size_t len, T* out, reduce_op op) {
    gpu::peer_slices<const T> in{staging, len, size_};
    gpu::peer_table<T> dst{};
    dst.p[0] = out;
    dst.n = 1;
    const bool aligned = gpu::aligned_16(staging) && (len * sizeof(T)) % 16 == 0 && gpu::aligned_16(out);
    gpu::launch_rank_sum<T>(ctx_->comm(), ctx_->multiprocessors(), len, in, dst, op, aligned);
  }

  options o_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<gpu::context> own_ctx_;  // null for a split, which runs on its parent's
  gpu::context* ctx_ = nullptr;
  std::unique_ptr<gpu::context::binding> binding_;
  ncclComm_t comm_ = nullptr;
  std::shared_ptr<std::atomic<bool>> peers_failed_;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  int* barrier_word_ = nullptr;
};
static_assert(CommBackend<nccl>);
static_assert(CommBackend<counted<nccl>>);
static_assert(nonblocking<nccl>);
static_assert(has_all_to_all<nccl> && nonblocking_all_to_all<nccl> && splittable<nccl>);

}  // namespace zero::comm
