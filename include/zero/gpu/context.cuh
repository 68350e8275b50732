// gpu::context: one rank's device state: compute and communication streams, handshake events, memory pool, host waits.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "zero/core/memory.hpp"
#include "zero/error.hpp"
#include "zero/gpu/check.cuh"

namespace zero::gpu {

// Called while the host waits for the device, with the time this wait has lasted. It throws to end a
// wait that can never finish (an NCCL peer that died): a plain cudaStreamSynchronize would hang.
using watchdog = std::function<void(std::chrono::milliseconds waited)>;

// Bytes one rank holds in device memory, as its pool sees them.
struct memory_stats {
  std::size_t live = 0;           // requested bytes currently allocated through this context
  std::size_t peak = 0;           // the most `live` ever was
  std::uint64_t pool_used = 0;    // cudaMemPoolAttrUsedMemCurrent: live bytes after the pool's rounding
  std::uint64_t pool_reserved = 0;  // cudaMemPoolAttrReservedMemCurrent: what the pool keeps from the driver
};

// Everything one rank does on the device goes through its context: the engine's buffers come from the
// context's memory pool in stream order on the compute stream; collectives run on the communication
// stream; the two streams meet through events, never through a device-wide synchronisation.
//
// The static allocation interface of a system (buffer<T, System> calls System::allocate) cannot carry
// a context, so a context is bound to the thread that drives the rank (binding below): comm backends
// bind theirs on the rank's thread, and sys::cuda's static calls use the bound one.
class context {
 public:
  explicit context(int device) : device_(device) {
    try {
      create();
    } catch (...) {
      destroy();
      throw;
    }
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() { destroy(); }

  int device() const { return device_; }
  int multiprocessors() const { return sms_; }
  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  cudaMemPool_t pool() const { return pool_; }

  // ---- memory: stream-ordered allocation from this rank's own pool ------------------------------

  // Why a pool per rank with cudaMallocFromPoolAsync rather than cudaMalloc or a hand-written arena:
  // cudaFree synchronises the whole device, and stage 3 allocates and frees a unit per gather. Freed
  // blocks stay in the pool (release threshold: never) and are reused in stream order without any
  // host synchronisation; a block freed on one stream is reused on another only after the driver's own
  // event dependency. One pool per rank keeps each rank's usage measurable on its own.
  // A device that cannot give the bytes is error_kind::out_of_memory (the engine's buffer adds the
  // rank and the category); every other failure is error_kind::device.
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t status = cudaMallocFromPoolAsync(&p, bytes, pool_, compute_);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      const memory_info m = available();
      fail(error_kind::out_of_memory, "cudaMallocFromPoolAsync of ", bytes, " bytes on ", m.space, ": ",
           cudaGetErrorString(status), " (", m.free, " bytes free of ", m.total, ")");
    }
    check(status, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
    live_ += bytes;
    if (live_ > peak_) peak_ = live_;
    return p;
  }
  // Stream-ordered on the compute stream: everything enqueued before (kernels reading the block, and
  // through the handshake events, collectives) finishes before the block is reused.
  void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    if (cudaFreeAsync(p, compute_) != cudaSuccess) (void)cudaGetLastError();  // noexcept: nothing to throw to
    live_ -= bytes;
  }
  // What this rank can allocate on its device: the device's free memory (cudaMemGetInfo) plus what
  // its own pool keeps unused, the device's size, and the live contexts of this process on the device
  // (comm::cuda_threads puts every rank on one).
  memory_info available() const {
    int previous = 0;
    ZERO_CUDA_CHECK(cudaGetDevice(&previous));
    ZERO_CUDA_CHECK(cudaSetDevice(device_));  // cudaMemGetInfo reads the calling thread's current device
    std::size_t free = 0, total = 0;
    const cudaError_t status = cudaMemGetInfo(&free, &total);
    ZERO_CUDA_CHECK(cudaSetDevice(previous));
    check(status, "cudaMemGetInfo", __FILE__, __LINE__);
    memory_info m;
    const memory_stats pool = memory();
    m.free = free + (pool.pool_reserved > pool.pool_used ? pool.pool_reserved - pool.pool_used : 0);
    m.total = total;
    m.sharers = contexts_on(device_);
    m.space = "CUDA device " + std::to_string(device_);
    return m;
  }
  // Live contexts of this process on `device`.
  static int contexts_on(int device) {
    const std::lock_guard<std::mutex> lock(registry_mutex());
    const auto it = registry().find(device);
    return it == registry().end() ? 0 : it->second;
  }

  memory_stats memory() const {
    memory_stats m{live_, peak_, 0, 0};
    std::uint64_t v = 0;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &v) == cudaSuccess) m.pool_used = v;
    if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v) == cudaSuccess) m.pool_reserved = v;
    return m;
  }

  // A grow-only scratch block for library temporaries (CUB's reduction storage), used on the compute
  // stream only, so stream order alone protects it.
  void* compute_scratch(std::size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) ZERO_CUDA_CHECK(cudaFreeAsync(scratch_, compute_));
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      ZERO_CUDA_CHECK(cudaMallocFromPoolAsync(&scratch_, bytes, pool_, compute_));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }
  // Pinned host memory for small results copied back from the device (a norm): a pageable
  // destination would make the copy synchronous with respect to the whole stream queue.
  double* host_scalar() const { return host_scalar_; }

  // ---- ordering between the streams --------------------------------------------------------------

  // The communication stream waits for what the compute stream has enqueued so far (gradients written,
  // buffers allocated and zeroed): an event, so the host never blocks.
  void comm_waits_for_compute() {
    record_compute_ready();
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(comm_, compute_ready_, 0));
  }
  // The compute stream waits for the collectives enqueued so far (parameters gathered, gradients reduced).
  void compute_waits_for_comm() {
    record_comm_done();
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_done_, 0));
  }
  // The same two events for other ranks sharing the device (comm::cuda_threads): each records its
  // own, and the peers' streams wait on them.
  void record_compute_ready() { ZERO_CUDA_CHECK(cudaEventRecord(compute_ready_, compute_)); }
  void record_comm_done() { ZERO_CUDA_CHECK(cudaEventRecord(comm_done_, comm_)); }
  cudaEvent_t compute_ready_event() const { return compute_ready_; }
  cudaEvent_t comm_done_event() const { return comm_done_; }

  // ---- host waits ------------------------------------------------------------------------------

  // Blocks until the work enqueued on `stream` so far has run. Polls an event instead of calling
  // cudaStreamSynchronize so that the watchdog can end a wait that would otherwise never return.
  void wait(cudaStream_t stream) {
    ZERO_CUDA_CHECK(cudaEventRecord(host_wait_, stream));
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      const cudaError_t status = cudaEventQuery(host_wait_);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) check(status, "cudaEventQuery (waiting for the device)", __FILE__, __LINE__);
      if (watchdog_)
        watchdog_(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start));
      // Short waits (a norm, a small copy) return within microseconds; long ones stop burning a core.
      if (polls < 2000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void wait_compute() { wait(compute_); }
  void wait_all() {
    wait(comm_);
    wait(compute_);
  }
  void set_watchdog(watchdog w) { watchdog_ = std::move(w); }

  // ---- the calling thread's context ----------------------------------------------------------

  // The context bound to the calling thread, or nullptr.
  static context* current() noexcept { return bound(); }

  // Binds a context to the calling thread for its lifetime (and restores the previous binding).
  class binding {
   public:
    explicit binding(context& c) : previous_(bound()) { bound() = &c; }
    binding(const binding&) = delete;
    binding& operator=(const binding&) = delete;
    ~binding() { bound() = previous_; }

   private:
    context* previous_;
  };

 private:
  static context*& bound() noexcept {
    thread_local context* c = nullptr;
    return c;
  }

  void create() {
    ZERO_CUDA_CHECK(cudaSetDevice(device_));
    ZERO_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_));
    // Non-blocking streams never serialise with the legacy default stream that user code may use.
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    // Events that only order work: without timing they are the cheapest kind to record and wait on.
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
    ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&host_wait_, cudaEventDisableTiming));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    ZERO_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    std::uint64_t keep = UINT64_MAX;  // freed blocks stay cached for reuse; the pool dies with the context
    ZERO_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    void* pinned = nullptr;
    ZERO_CUDA_CHECK(cudaMallocHost(&pinned, sizeof(double)));
    host_scalar_ = static_cast<double*>(pinned);
    const std::lock_guard<std::mutex> lock(registry_mutex());
    ++registry()[device_];
    registered_ = true;
  }
  static std::map<int, int>& registry() {
    static std::map<int, int> contexts;  // device -> live contexts of this process
    return contexts;
  }
  static std::mutex& registry_mutex() {
    static std::mutex m;
    return m;
  }
  // Finishes the rank's device work, then releases everything; errors are ignored (a destructor, and
  // after a failure the device state of the rank is being discarded anyway).
  void destroy() noexcept {
    if (registered_) {
      const std::lock_guard<std::mutex> lock(registry_mutex());
      --registry()[device_];
      registered_ = false;
    }
    if (scratch_ && compute_) (void)cudaFreeAsync(scratch_, compute_);
    if (comm_) (void)cudaStreamSynchronize(comm_);
    if (compute_) (void)cudaStreamSynchronize(compute_);
    if (host_scalar_) (void)cudaFreeHost(host_scalar_);
    for (cudaEvent_t e : {compute_ready_, comm_done_, host_wait_})
      if (e) (void)cudaEventDestroy(e);
    if (comm_) (void)cudaStreamDestroy(comm_);
    if (compute_) (void)cudaStreamDestroy(compute_);
    if (pool_) (void)cudaMemPoolDestroy(pool_);
    (void)cudaGetLastError();
    scratch_ = nullptr;
    host_scalar_ = nullptr;
    compute_ready_ = comm_done_ = host_wait_ = nullptr;
    comm_ = compute_ = nullptr;
    pool_ = nullptr;
  }

  int device_ = 0;
  int sms_ = 1;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr, comm_done_ = nullptr, host_wait_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  double* host_scalar_ = nullptr;
  std::size_t live_ = 0, peak_ = 0;
  bool registered_ = false;  // counted in registry() (create() succeeded)
  watchdog watchdog_;
};

}  // namespace zero::gpu
