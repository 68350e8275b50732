// activation_store<Comm>: a layer's checkpointed input kept whole, as this rank's 1/tp slice (Pa), or as that slice in
// host memory (Pa+cpu), and given back whole for the recomputation.
#pragma once

// ZeRO-R's partitioned activation checkpointing. With activation checkpointing the forward pass keeps
// only each layer's input and the backward pass recomputes the layer from it. Under Megatron-style
// tensor parallelism every rank of a tensor-parallel group computes that input in full (it is the
// output of a row-parallel layer, all-reduced over the group, or the replicated embedding), so each
// rank would hold the same tensor tp times over. The store keeps one copy per group instead:
//
//   activation_mode::none             each rank keeps the whole tensor (the baseline).
//   activation_mode::partitioned      (Pa) rank t of the group keeps elements [t s, (t + 1) s) of it,
//                                     s = ceil(E / tp), the last slice zero-padded so the slices are
//                                     equal; restore() all-gathers the slices over the group in rank
//                                     order: the same bits that were saved.
//   activation_mode::partitioned_cpu  (Pa+cpu) the same slice, kept in host memory (pinned where the
//                                     system has pinned memory, as sys::cuda does); restore() copies it
//                                     back into its place in the system's memory, then all-gathers.
//
// Ranks of the group must save the same tensor under the same layer id (saves are local: their order
// may differ): the slices are cut from identical data, so no rank needs another's. The store does not
// compare the tensors across the group: doing so costs a read of every saved tensor and a collective
// per save.
// What each rank saved is checked where it is cheap: a restore's all-gather carries the layer, the
// element count and the type in the backend's call fingerprint where the backend compares one
// (comm::threads always, comm::mpi with mpi_options::verify), so ranks that disagree fail together;
// a tensor whose values differ across the group comes back as a mix of the ranks' slices.
//
// Calls per layer: save(layer, data, n) in the forward pass; optionally prefetch(layer) ahead of its
// use; restore<T>(layer) in the backward pass (a view valid until release); release(layer) when the
// recomputation is done, which frees the checkpoint and the restored tensor. In modes Pa and Pa+cpu,
// restore and prefetch are collectives over the group (every rank calls them for the same layers in
// the same order); save and release are always local.
//
// prefetch(layer) starts the restore's work ahead of restore(): it copies the slice back from host
// memory (Pa+cpu) and starts the all-gather, which runs while the caller computes where the backend
// overlaps (comm/nonblocking.hpp: comm::mpi, comm::nccl, comm::modeled; elsewhere it completes before
// prefetch returns). restore() then only waits for it. The copy from host memory is synchronous in the
// system interface (sys::host and sys::cuda's copy_from_host wait for it): prefetch moves it earlier,
// out of the restore. A prefetch in flight is a collective started: every rank of the group prefetches
// the same layers in the same order, among its restores; release() and clear() wait for one not
// restored before freeing its buffer.
//
// Memory is counted by the store itself (memory()): the checkpoints in the system's memory, the
// Pa+cpu slices in host memory (on a CPU system host memory is the system's: the two are the same
// RAM), and the restored tensors; every figure equals formula::activation_checkpoint_bytes and
// plan_activations. Traffic (traffic()) counts the all-gathers as comm::counted counts them and the
// bytes copied to and from host memory.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "zero/comm/call_label.hpp"
#include "zero/comm/counted.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/half_types.hpp"
#include "zero/error.hpp"

namespace zero {

enum class activation_mode : int { none, partitioned, partitioned_cpu };

inline const char* to_string(activation_mode m) {
  switch (m) {
    case activation_mode::none:
      return "none";
    case activation_mode::partitioned:
      return "Pa";
    case activation_mode::partitioned_cpu:
      return "Pa+cpu";
  }
  return "?";
}

// The element types a checkpoint may have, and their names in messages.
template <class T>
inline constexpr bool activation_element =
    std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

template <class T>
constexpr const char* activation_type_name() {
  if constexpr (std::is_same_v<T, float>)
    return "fp32";
  else if constexpr (std::is_same_v<T, bf16>)
    return "bf16";
  else
    return "fp16";
}

// Bytes the store holds on this rank, now and at most.
struct activation_memory {
  std::uint64_t saved = 0;     // checkpoints in the system's memory: whole tensors (none) or slices (Pa)
  std::uint64_t host = 0;      // Pa+cpu: the slices in host memory (pinned on a device system)
  std::uint64_t restored = 0;  // restored or prefetched tensors not yet released, padded (Pa, Pa+cpu)
  std::uint64_t peak_saved = 0, peak_host = 0, peak_restored = 0;
  std::uint64_t peak_system = 0;  // the most of saved + restored held at once: the system's memory
};

// What the store has moved on this rank.
struct activation_traffic {
  comm::comm_stats gather;            // the restores' all-gathers over the group, as comm::counted counts them
  std::uint64_t to_host_bytes = 0;    // Pa+cpu: slices copied to host memory by save()
  std::uint64_t from_host_bytes = 0;  // Pa+cpu: slices copied back by restore() or prefetch()
  std::uint64_t saves = 0, restores = 0, prefetches = 0;
};

template <CommBackend Comm>
class activation_store {
 public:
  using system = typename Comm::system;
  using request = typename comm::counted<Comm>::request;

  // `group`: the ranks that hold the same activations, the mesh's tensor-parallel group (m.tp()); it
  // must outlive the store. Mode none makes no collective and may be given any communicator.
  activation_store(Comm& group, activation_mode mode) : comm_(group), mode_(mode), sys_(system_of(group)) {
    ZERO_CHECK(mode == activation_mode::none || mode == activation_mode::partitioned ||
                   mode == activation_mode::partitioned_cpu,
               invalid_argument, "activation_store rank ", group.rank(), ": unknown mode ", static_cast<int>(mode));
  }
  activation_store(const activation_store&) = delete;
  activation_store& operator=(const activation_store&) = delete;
  ~activation_store() { clear(); }

  activation_mode mode() const { return mode_; }
  int group_size() const { return comm_.size(); }
  int group_rank() const { return comm_.rank(); }
  // The elements each rank keeps of a checkpoint of n elements: n (none) or ceil(n / tp).
  std::size_t kept_elements(std::size_t n) const {
    if (mode_ == activation_mode::none) return n;
    const auto tp = static_cast<std::size_t>(comm_.size());
    return n / tp + (n % tp != 0);
  }

  // Keeps `layer`'s checkpoint: the n elements at `data` (in the system's memory; the same tensor on
  // every rank of the group). Local: copies this rank's part, then `data` may be reused. A layer that
  // is already held is refused (release it first).
  template <class T>
  void save(std::size_t layer, const T* data, std::size_t n) {
    static_assert(activation_element<T>, "zero::activation_store: checkpoints are float, zero::bf16 or zero::fp16");
    ZERO_CHECK(!layers_.contains(layer), protocol, who(), "layer ", layer,
               " is already saved; release it before saving it again");
    ZERO_CHECK(n > 0, invalid_argument, who(), "layer ", layer, ": a checkpoint of 0 elements");
    ZERO_CHECK(data != nullptr, invalid_argument, who(), "layer ", layer, ": the data of ", n, " elements is null");
    entry e;
    e.elements = n;
    e.element_bytes = sizeof(T);
    e.type = activation_type_name<T>();
    const std::size_t slice = kept_elements(n);
    const std::size_t bytes = slice * sizeof(T);
    const std::size_t begin =
        mode_ == activation_mode::none ? 0 : std::min(n, slice * static_cast<std::size_t>(group_rank()));
    const std::size_t real = std::min(n - begin, slice);  // the rest of the last slice is padding
    const auto* src = reinterpret_cast<const unsigned char*>(data + begin);
    const std::size_t real_bytes = real * sizeof(T);
    const bool host = mode_ == activation_mode::partitioned_cpu;
    e.kept = allocate(layer, bytes, host);
    e.kept_bytes = bytes;
    try {
      if (host) {
        if (real) sys_.copy_to_host(e.kept, src, real_bytes);
        if (real < slice) std::memset(static_cast<unsigned char*>(e.kept) + real_bytes, 0, bytes - real_bytes);
      } else {
        if (real) system::copy(e.kept, src, real_bytes);
        if (real < slice) system::fill_zero(static_cast<unsigned char*>(e.kept) + real_bytes, bytes - real_bytes);
      }
      layers_.emplace(layer, std::move(e));  // (on a throw nothing was moved: e is freed below)
    } catch (...) {
      free_kept(e);
      throw;
    }
    if (host) {
      traffic_.to_host_bytes += bytes;
      add(memory_.host, memory_.peak_host, bytes);
    } else {
      add(memory_.saved, memory_.peak_saved, bytes);
    }
    ++traffic_.saves;
    note_system_peak();
  }

  // Starts bringing `layer`'s checkpoint back whole ahead of restore() (Pa and Pa+cpu: a collective over
  // the group, left in flight where the backend overlaps; none: nothing to do). A layer already
  // prefetched or restored is not gathered again.
  template <class T>
  void prefetch(std::size_t layer) {
    static_assert(activation_element<T>, "zero::activation_store: checkpoints are float, zero::bf16 or zero::fp16");
    entry& e = find<T>(layer, "prefetch");
    if (mode_ != activation_mode::none && !e.whole) gather<T>(layer, e);
    ++traffic_.prefetches;
  }

  // `layer`'s checkpoint, whole (n elements, bit for bit what was saved), in the system's memory,
  // valid until release(layer). Pa and Pa+cpu: a collective over the group unless prefetched.
  template <class T>
  std::span<const T> restore(std::size_t layer) {
    static_assert(activation_element<T>, "zero::activation_store: checkpoints are float, zero::bf16 or zero::fp16");
    entry& e = find<T>(layer, "restore");
    ++traffic_.restores;
    if (mode_ == activation_mode::none) return {static_cast<const T*>(e.kept), e.elements};
    if (!e.whole) gather<T>(layer, e);
    if (e.in_flight) {
      e.in_flight = false;
      comm_.wait(e.pending);
    }
    return {static_cast<const T*>(e.whole), e.elements};
  }

  // Frees `layer`'s checkpoint and its restored tensor (the backward pass is done with the layer). A
  // prefetch never restored is waited for first; its failure is thrown after the layer is freed.
  void release(std::size_t layer) {
    auto it = layers_.find(layer);
    ZERO_CHECK(it != layers_.end(), protocol, who(), "release of layer ", layer, ", which is not saved");
    struct erase_on_exit {
      activation_store& s;
      decltype(it) at;
      ~erase_on_exit() {
        s.drop(at->second);
        s.layers_.erase(at);
      }
    } erase{*this, it};
    if (it->second.in_flight) {
      it->second.in_flight = false;
      comm_.wait(it->second.pending);
    }
  }
  // Frees every checkpoint (an abandoned step).
  void clear() noexcept {
    for (auto& [layer, e] : layers_) drop(e);
    layers_.clear();
  }
  bool holds(std::size_t layer) const { return layers_.contains(layer); }
  std::size_t layers_held() const { return layers_.size(); }

  const activation_memory& memory() const { return memory_; }
  activation_traffic traffic() const {
    activation_traffic t = traffic_;
    t.gather = comm_.stats();
    return t;
  }
  // Zeroes the traffic counters (the memory peaks stay).
  void reset_traffic() {
    traffic_ = {};
    comm_.reset();
  }

 private:
  struct entry {
    std::size_t elements = 0, element_bytes = 0;
    const char* type = "";
    void* kept = nullptr;  // the whole tensor (none), the slice (Pa: system memory; Pa+cpu: host memory)
    std::size_t kept_bytes = 0;
    void* whole = nullptr;  // the restored tensor, padded to tp slices (Pa, Pa+cpu), until release
    std::size_t whole_bytes = 0;
    request pending{};       // the all-gather into `whole`, started by prefetch and not yet waited for
    bool in_flight = false;
  };

  static system system_of(Comm& c) {
    if constexpr (requires { c.make_system(); })
      return c.make_system();
    else
      return system{};
  }
  std::string who() const {
    return detail::concat("activation_store rank ", comm_.rank(), " (", to_string(mode_), "): ");
  }

  template <class T>
  entry& find(std::size_t layer, const char* call) {
    auto it = layers_.find(layer);
    ZERO_CHECK(it != layers_.end(), protocol, who(), call, " of layer ", layer,
               ", which is not saved (or was released)");
    entry& e = it->second;
    ZERO_CHECK(e.element_bytes == sizeof(T) && std::string(e.type) == activation_type_name<T>(), invalid_argument,
               who(), call, " of layer ", layer, " as ", activation_type_name<T>(), ": it was saved as ", e.type);
    return e;
  }

  // The whole tensor from the group's slices: this rank's slice into its place (from host memory for
  // Pa+cpu), then an in-place all-gather in rank order, started (restore() waits for it; on a backend
  // that does not overlap it has completed on return).
  template <class T>
  void gather(std::size_t layer, entry& e) {
    const std::size_t slice = kept_elements(e.elements);
    const std::size_t bytes = slice * sizeof(T) * static_cast<std::size_t>(group_size());
    void* whole = allocate(layer, bytes, false);
    T* out = static_cast<T*>(whole);
    T* mine = out + slice * static_cast<std::size_t>(group_rank());
    // The layer in the call's fingerprint, where the backend compares one: ranks restoring different
    // layers fail together instead of exchanging slices of different tensors.
    const std::string layer_name = "layer " + std::to_string(layer);
    comm::scoped_label<Comm> label(comm_.inner(), "restore", layer_name);
    try {
      if (mode_ == activation_mode::partitioned_cpu) {
        sys_.copy_from_host(mine, e.kept, e.kept_bytes);
        traffic_.from_host_bytes += e.kept_bytes;
        e.pending = comm_.start_all_gather(static_cast<const T*>(mine), out, slice);
      } else {
        e.pending = comm_.start_all_gather(static_cast<const T*>(e.kept), out, slice);
      }
      e.in_flight = true;
    } catch (...) {
      system::deallocate(whole, bytes);
      throw;
    }
    e.whole = whole;
    e.whole_bytes = bytes;
    add(memory_.restored, memory_.peak_restored, bytes);
    note_system_peak();
  }

  void* allocate(std::size_t layer, std::size_t bytes, bool host) {
    try {
      if (!host) return system::allocate(bytes);
      if constexpr (requires { system::allocate_pinned(bytes); })
        return system::allocate_pinned(bytes);
      else
        return ::operator new (bytes, std::align_val_t{64});
    } catch (const std::bad_alloc& x) {
      fail(error_kind::out_of_memory, who(), "layer ", layer, ": allocating ", bytes, " bytes of ",
           host ? "host" : "system", " memory failed (", x.what(), ")");
    }
  }
  void drop(entry& e) noexcept {
    if (e.in_flight) {  // an abandoned prefetch: the backend must stop writing before the buffer is freed
      e.in_flight = false;
      try {
        comm_.wait(e.pending);
      } catch (...) {  // (the step is being abandoned: its error is the one that matters)
      }
    }
    if (e.whole) {
      system::deallocate(e.whole, e.whole_bytes);
      memory_.restored -= e.whole_bytes;
      e.whole = nullptr;
    }
    if (!e.kept) return;
    (mode_ == activation_mode::partitioned_cpu ? memory_.host : memory_.saved) -= e.kept_bytes;
    free_kept(e);
  }
  void free_kept(entry& e) noexcept {
    if (mode_ == activation_mode::partitioned_cpu) {
      if constexpr (requires { system::deallocate_pinned(e.kept); })
        system::deallocate_pinned(e.kept);
      else
        ::operator delete (e.kept, std::align_val_t{64});
    } else {
      system::deallocate(e.kept, e.kept_bytes);
    }
    e.kept = nullptr;
  }
  static void add(std::uint64_t& current, std::uint64_t& peak, std::uint64_t bytes) {
    current += bytes;
    if (current > peak) peak = current;
  }
  void note_system_peak() {
    const std::uint64_t system_bytes = memory_.saved + memory_.restored;
    if (system_bytes > memory_.peak_system) memory_.peak_system = system_bytes;
  }

  comm::counted<Comm> comm_;
  activation_mode mode_;
  system sys_;
  std::map<std::size_t, entry> layers_;
  activation_memory memory_;
  activation_traffic traffic_;
};

}  // namespace zero
