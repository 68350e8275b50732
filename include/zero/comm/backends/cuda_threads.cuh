// comm::cuda_threads: N ranks as threads of one process sharing one GPU, with rank-ordered device collectives.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

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

struct cuda_threads_options {
  // How long a rank waits in a collective for its peers before the whole world fails.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  int device = 0;  // the GPU every rank shares
};

// The device engine with N ranks on a single GPU: each rank is a thread with its own gpu::context
// (compute and communication streams, memory pool), and a collective is one kernel per rank that
// reads its peers' buffers directly and sums them in rank order, as comm::threads does on the host
// (acc = x0; acc += x1; ...; 2-byte floats in fp32, rounded once). The host-side agreement, barrier
// and failure handling are comm::threads' own (detail::threads_world), so a rank that throws or
// returns early fails its peers' collectives instead of hanging them.
//
// Ordering without device-wide synchronisation, per collective:
//   enter: each rank records `compute ready` on its compute stream, announces its buffers and meets
//          the others at the host barrier; its communication stream then waits on every rank's
//          `compute ready` (the peers' inputs are written, its outputs no longer read).
//   work:  the rank's kernel or copies on its communication stream; it records `comm done`.
//   leave: a second host barrier; the rank's compute stream then waits on every rank's `comm done`
//          (its results are written, its inputs no longer read).
// An event is re-recorded only after the barrier that follows every peer's wait on it, so each wait
// sees the record meant for it. Nothing on the device waits for anything not yet enqueued, so the
// device cannot deadlock; only the host barrier waits, and it has the timeout.
class cuda_threads {
 public:
  using system = sys::cuda;
  using options = cuda_threads_options;
  static constexpr int max_ranks = gpu::max_peer_ranks;  // one kernel addresses every peer's buffer

  // Runs fn(comm) on n ranks, one thread and one context each, all on opt.device; returns when all
  // return. If any rank throws, the others' pending and later collectives fail, and the first
  // exception is rethrown here.
  static void launch(int n, const std::function<void(cuda_threads&)>& fn, options opt = {}) {
    ZERO_CHECK(n > 0 && n <= max_ranks, invalid_argument, "comm::cuda_threads::launch: world size must be in [1, ",
               max_ranks, "], got ", n);
    int devices = 0;
    ZERO_CUDA_CHECK(cudaGetDeviceCount(&devices));
    ZERO_CHECK(opt.device >= 0 && opt.device < devices, invalid_argument, "comm::cuda_threads::launch: device ",
               opt.device, " does not exist (", devices, " CUDA devices)");
    shared s(n, opt.timeout);
    detail::run_ranks(s.world, n, [&](int r) {
      auto& slot = s.contexts[static_cast<std::size_t>(r)];
      slot = std::make_unique<gpu::context>(opt.device);
      s.peers[static_cast<std::size_t>(r)] = slot.get();
      const gpu::context::binding bind(*slot);
      cuda_threads comm(s, r);
      // Every rank's context (and its events) exists before any rank reads a peer's.
      s.world.arrive_and_wait(r, detail::coll_kind::barrier);
      fn(comm);
      // The rank's device work is finished before the launch tears the contexts down.
      slot->wait_all();
    });
    // The contexts die with `s`, after every rank thread has joined: no peer can still be about to
    // wait on one of their events.
  }

  cuda_threads(const cuda_threads&) = delete;
  cuda_threads& operator=(const cuda_threads&) = delete;
  // A sub-communicator (split) leaves its world when destroyed, as comm::threads' does.
  ~cuda_threads() {
    if (owned_) owned_->world.depart(rank_);
  }

  int rank() const { return rank_; }
  int size() const { return s_->world.size(); }
  // Names the following collectives in their fingerprints, as comm::threads does.
  call_label set_call_label(call_label l) { return world().set_label(rank_, l); }

  // The rank's context: its compute stream is where user kernels run.
  gpu::context& context() const { return *s_->peers[static_cast<std::size_t>(rank_)]; }
  cudaStream_t compute_stream() const { return context().compute(); }
  // What the engine uses as its system (zero::engine calls this).
  sys::cuda make_system() const { return sys::cuda(context()); }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    enqueue_all_reduce(send, recv, count, op);
    compute_waits_for_peers();
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    enqueue_reduce_scatter(send, recv, count, op);
    compute_waits_for_peers();
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    enqueue_all_gather(send, recv, count);
    compute_waits_for_peers();
  }

  // Nonblocking collectives (comm/nonblocking.hpp): start_* makes the host agreement and enqueues
  // the work as the blocking call does, but the compute stream does not wait for it until wait(r),
  // an event wait on the device (the host never blocks on the GPU): kernels enqueued in between run
  // while the collective moves data. wait(r) waits on every rank's `comm done` event as the blocking
  // call would. A peer may have re-recorded its event for a later collective by then; the wait is then
  // for that later record, which follows this collective's work on the peer's stream: a longer wait,
  // never a shorter one, and never a cycle (a record exists only for a collective this rank entered,
  // whose `compute ready` precedes the wait on this rank's compute stream). A request dropped without
  // wait waits in its destructor.
  class request {
   public:
    request() = default;
    request(request&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)) {}
    request& operator=(request&& o) noexcept {
      if (this != &o) {
        finish();
        owner_ = std::exchange(o.owner_, nullptr);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { finish(); }

   private:
    friend class cuda_threads;
    explicit request(cuda_threads* owner) : owner_(owner) {}
    void finish() noexcept {
      if (!owner_) return;
      try {
        owner_->compute_waits_for_peers();
      } catch (...) {  // a destructor: the next checked call reports a device error
      }
      owner_ = nullptr;
    }
    cuda_threads* owner_ = nullptr;
  };
  template <class T>
  request start_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    enqueue_all_reduce(send, recv, count, op);
    return request(this);
  }
  template <class T>
  request start_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    enqueue_reduce_scatter(send, recv, count, op);
    return request(this);
  }
  template <class T>
  request start_all_gather(const T* send, T* recv, std::size_t count) {
    enqueue_all_gather(send, recv, count);
    return request(this);
  }
  void wait(request& r) {
    if (!r.owner_) return;
    r.owner_ = nullptr;
    compute_waits_for_peers();
  }

  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    ZERO_CHECK(root >= 0 && root < size(), invalid_argument, "comm::cuda_threads rank ", rank_, ": broadcast root ",
               root, " is not in [0, ", size(), ")");
    enter<T>(detail::coll_kind::broadcast, send, recv, count, reduce_op::sum, root);
    const T* src = static_cast<const T*>(world().slot(root).send);
    if (src != recv && count > 0)
      ZERO_CUDA_CHECK(cudaMemcpyAsync(recv, src, count * sizeof(T), cudaMemcpyDeviceToDevice, context().comm()));
    leave(detail::coll_kind::broadcast);
    compute_waits_for_peers();
  }

  // Block k of send to rank k, recv[k*count..] from rank k (comm/all_to_all.hpp): copies on the
  // communication stream out of each peer's send buffer, so send and recv must not overlap.
  template <class T>
  void all_to_all(const T* send, T* recv, std::size_t count) {
    enqueue_all_to_all(send, recv, count);
    compute_waits_for_peers();
  }
  template <class T>
  request start_all_to_all(const T* send, T* recv, std::size_t count) {
    enqueue_all_to_all(send, recv, count);
    return request(this);
  }

  // The ranks that pass the same color form a world of their own on the same contexts (comm/split.hpp):
  // the colors meet on the host (no device memory involved), each group at one new world, which is
  // aborted whenever this one is.
  std::unique_ptr<cuda_threads> split(int color) {
    ZERO_CHECK(color >= 0, invalid_argument, "comm::cuda_threads rank ", rank_, ": split color must be >= 0, got ",
               color);
    world().announce<int>(rank_, detail::coll_kind::all_gather, &color, nullptr, 1, reduce_op::sum, 0);
    world().arrive_and_wait(rank_, detail::coll_kind::all_gather);
    detail::check_agreement(world(), rank_);
    int sub_rank = 0, members = 0;
    for (int k = 0; k < size(); ++k)
      if (*static_cast<const int*>(world().slot(k).send) == color) {
        if (k < rank_) ++sub_rank;
        ++members;
      }
    world().arrive_after_data_phase(rank_, detail::coll_kind::all_gather);  // every color read before any changes
    world().finish(rank_);
    detail::threads_world& parent = world();
    auto sub = parent.meet<shared>(
        parent.next_split(rank_), color, members, [&] { return std::make_shared<shared>(members, parent.timeout()); },
        [](const std::shared_ptr<shared>& p) { return std::shared_ptr<detail::threads_world>(p, &p->world); });
    sub->peers[static_cast<std::size_t>(sub_rank)] = &context();
    // Every member's context is in the table before any member reads a peer's.
    sub->world.arrive_and_wait(sub_rank, detail::coll_kind::barrier);
    return std::unique_ptr<cuda_threads>(new cuda_threads(std::move(sub), sub_rank));
  }

  // Host and device: no rank returns before all have arrived, and work any rank enqueued before the
  // barrier precedes work every rank enqueues after it.
  void barrier() {
    world().announce_barrier(rank_);
    context().record_compute_ready();
    world().arrive_and_wait(rank_, detail::coll_kind::barrier);
    detail::check_agreement(world(), rank_);
    for (int k = 0; k < size(); ++k)
      ZERO_CUDA_CHECK(cudaStreamWaitEvent(context().compute(), peer(k).compute_ready_event(), 0));
    world().arrive_after_data_phase(rank_, detail::coll_kind::barrier);
    world().finish(rank_);
  }

 private:
  template <class T>
  void enqueue_all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    enter<T>(detail::coll_kind::all_reduce, send, recv, count, op, 0);
    // Rank r reduces the r-th chunk and writes it to every rank: each element is summed once, in rank
    // order; chunks are disjoint, so in-place use is safe. Chunk edges are multiples of the kernel's
    // vector width, so a chunk of aligned buffers is aligned too.
    const std::size_t begin = edge(count, rank_), end = edge(count, rank_ + 1);
    if (end > begin) {
      gpu::peer_table<const T> in{};
      gpu::peer_table<T> out{};
      in.n = out.n = size();
      bool aligned = true;
      for (int k = 0; k < size(); ++k) {
        in.p[k] = static_cast<const T*>(world().slot(k).send) + begin;
        out.p[k] = static_cast<T*>(world().slot(k).recv) + begin;
        aligned = aligned && gpu::aligned_16(in.p[k]) && gpu::aligned_16(out.p[k]);
      }
      gpu::launch_rank_sum<T>(context().comm(), context().multiprocessors(), end - begin, in, out, op, aligned);
    }
    leave(detail::coll_kind::all_reduce);
  }

  template <class T>
  void enqueue_reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    enter<T>(detail::coll_kind::reduce_scatter, send, recv, count, op, 0);
    if (count > 0) {
      const std::size_t base = count * static_cast<std::size_t>(rank_);
      gpu::peer_table<const T> in{};
      gpu::peer_table<T> out{};
      in.n = size();
      out.n = 1;
      out.p[0] = recv;
      bool aligned = gpu::aligned_16(recv);
      for (int k = 0; k < size(); ++k) {
        in.p[k] = static_cast<const T*>(world().slot(k).send) + base;
        aligned = aligned && gpu::aligned_16(in.p[k]);
      }
      gpu::launch_rank_sum<T>(context().comm(), context().multiprocessors(), count, in, out, op, aligned);
    }
    leave(detail::coll_kind::reduce_scatter);
  }

  template <class T>
  void enqueue_all_gather(const T* send, T* recv, std::size_t count) {
    enter<T>(detail::coll_kind::all_gather, send, recv, count, reduce_op::sum, 0);
    for (int k = 0; k < size() && count > 0; ++k) {
      const T* src = static_cast<const T*>(world().slot(k).send);
      T* dst = recv + count * static_cast<std::size_t>(k);
      if (src != dst)
        ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToDevice, context().comm()));
    }
    leave(detail::coll_kind::all_gather);
  }

  template <class T>
  void enqueue_all_to_all(const T* send, T* recv, std::size_t count) {
    enter<T>(detail::coll_kind::all_to_all, send, recv, count, reduce_op::sum, 0);
    for (int k = 0; k < size() && count > 0; ++k) {
      const T* src = static_cast<const T*>(world().slot(k).send) + count * static_cast<std::size_t>(rank_);
      ZERO_CUDA_CHECK(cudaMemcpyAsync(recv + count * static_cast<std::size_t>(k), src, count * sizeof(T),
                                      cudaMemcpyDeviceToDevice, context().comm()));
    }
    leave(detail::coll_kind::all_to_all);
  }

  struct shared {
    shared(int n, std::chrono::milliseconds timeout)
        : world(n, timeout, "comm::cuda_threads"),
          contexts(static_cast<std::size_t>(n)),
          peers(static_cast<std::size_t>(n), nullptr) {}
    detail::threads_world world;
    std::vector<std::unique_ptr<gpu::context>> contexts;  // launch()'s, owned; a split's are its parent's
    std::vector<gpu::context*> peers;                     // every rank's context, by rank
  };

  cuda_threads(shared& s, int rank) : s_(&s), rank_(rank) {}
  cuda_threads(std::shared_ptr<shared> s, int rank) : s_(s.get()), rank_(rank), owned_(std::move(s)) {}

  detail::threads_world& world() const { return s_->world; }
  gpu::context& peer(int k) const { return *s_->peers[static_cast<std::size_t>(k)]; }

  // Where rank r's all_reduce chunk begins: count * r / N rounded down to the vector width.
  std::size_t edge(std::size_t count, int r) const {
    if (r >= size()) return count;
    const std::size_t e = count * static_cast<std::size_t>(r) / static_cast<std::size_t>(size());
    return e / gpu::chunk_elements * gpu::chunk_elements;
  }

  template <class T>
  void enter(detail::coll_kind kind, const T* send, T* recv, std::size_t count, reduce_op op, int root) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || is_half_v<T> ||
                      std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> ||
                      std::is_same_v<T, std::int8_t>,
                  "comm::cuda_threads collectives take float, double, zero::bf16, zero::fp16 and std::int64_t (and "
                  "bytes, std::uint8_t and std::int8_t, for the all-gather and all-to-all of quantized data)");
    world().announce(rank_, kind, send, recv, count, op, root);
    context().record_compute_ready();
    world().arrive_and_wait(rank_, kind);
    detail::check_agreement(world(), rank_);
    for (int k = 0; k < size(); ++k)
      ZERO_CUDA_CHECK(cudaStreamWaitEvent(context().comm(), peer(k).compute_ready_event(), 0));
  }
  // Every rank's work is enqueued and its `comm done` recorded before any rank leaves the host
  // agreement.
  void leave(detail::coll_kind kind) {
    context().record_comm_done();
    world().arrive_after_data_phase(rank_, kind);
    world().finish(rank_);
  }
  // Nobody's compute stream goes on (and reuses or frees a buffer) before every rank's part is done.
  void compute_waits_for_peers() {
    for (int k = 0; k < size(); ++k)
      ZERO_CUDA_CHECK(cudaStreamWaitEvent(context().compute(), peer(k).comm_done_event(), 0));
  }

  shared* s_;
  int rank_;
  std::shared_ptr<shared> owned_;  // a split's shared state
};
static_assert(CommBackend<cuda_threads>);
static_assert(CommBackend<counted<cuda_threads>>);
static_assert(nonblocking<cuda_threads>);
static_assert(has_all_to_all<cuda_threads> && nonblocking_all_to_all<cuda_threads> && splittable<cuda_threads>);

}  // namespace zero::comm
