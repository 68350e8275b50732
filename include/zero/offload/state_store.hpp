// offload::state_store: an engine's fp32 state arrays (master weights, optimizer slots) in the system's memory, in host memory or on disk, streamed slice by slice.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "zero/core/memory.hpp"
#include "zero/error.hpp"
#include "zero/offload/io_worker.hpp"
#include "zero/offload/options.hpp"
#include "zero/offload/state_file.hpp"
#include "zero/sys/host.hpp"

namespace zero {

inline const char* to_string(offload_tier t) {
  switch (t) {
    case offload_tier::none: return "none";
    case offload_tier::host: return "host";
    case offload_tier::disk: return "disk";
  }
  return "?";
}

// Bytes that moved between the tiers (disk <-> host memory, host memory <-> the system's memory).
struct offload_traffic {
  std::uint64_t disk_read = 0, disk_written = 0;  // the disk tier's pread/pwrite bytes
  std::uint64_t to_host = 0, from_host = 0;       // copies between the system's memory and host memory
  std::uint64_t total() const { return disk_read + disk_written + to_host + from_host; }
  offload_traffic operator-(const offload_traffic& o) const {
    return {disk_read - o.disk_read, disk_written - o.disk_written, to_host - o.to_host, from_host - o.from_host};
  }
};

// What an engine's offload tier holds and moves (engine::offload()); all zero with offload_tier::none.
struct offload_report {
  offload_tier tier = offload_tier::none;
  int arrays = 0;                 // fp32 arrays offloaded: the master weights (if kept apart), then each slot
  std::size_t elements = 0;       // elements per array (the rank's held state: Psi/N in stages 1-3, Psi in 0)
  std::uint64_t host_bytes = 0;   // host memory holding the arrays (host tier)
  std::uint64_t disk_bytes = 0;   // the file holding them (disk tier: arrays x region, preallocated)
  std::uint64_t staging_bytes = 0;  // host memory of the slices in flight (disk tier; device systems' copies)
  std::string file;               // disk tier: the rank's file
  bool direct_io = false;         // disk tier: opened with O_DIRECT
  offload_traffic total;          // since construction
  offload_traffic last_step;      // during the last step() that updated
};

namespace offload {

// Offloaded state is updated by the host: the host loop (vectorized, the device kernels' bits).
using host_loop = sys::host;

// Host memory aligned for direct I/O, zero-filled, and pinned (page-locked) where the system can
// pin it (System::allocate_pinned: sys::cuda), so that device copies run at full speed.
template <class System>
class host_block {
 public:
  host_block() = default;
  explicit host_block(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    if constexpr (requires { System::allocate_pinned(bytes); }) {
      p_ = System::allocate_pinned(bytes);
      pinned_ = true;
    } else {
      p_ = ::operator new(bytes, std::align_val_t{io_alignment});
    }
    std::memset(p_, 0, bytes);
  }
  host_block(host_block&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), pinned_(o.pinned_) {}
  host_block& operator=(host_block&& o) noexcept {
    host_block t(std::move(o));
    std::swap(p_, t.p_);
    std::swap(bytes_, t.bytes_);
    std::swap(pinned_, t.pinned_);
    return *this;
  }
  host_block(const host_block&) = delete;
  host_block& operator=(const host_block&) = delete;
  ~host_block() {
    if (!p_) return;
    if constexpr (requires { System::deallocate_pinned(p_); }) {
      if (pinned_) {
        System::deallocate_pinned(p_);
        return;
      }
    }
    ::operator delete(p_, std::align_val_t{io_alignment});
  }
  float* floats() const { return static_cast<float*>(p_); }
  void* data() const { return p_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  bool pinned_ = false;
};

// `arrays` fp32 arrays of `elements` each, in one tier:
//   none: buffer<float, System> in the system's memory, counted in the engine's memory() under each
//         array's category (what the engine always did);
//   host: host memory (pinned where System can), outside memory(), in the report's host_bytes;
//   disk: one state_file per rank, one region per array, outside memory(), streamed through three
//         sets of slice buffers (staging_bytes) by one I/O thread.
// data(a) addresses the none and host tiers directly; read()/write() copy any range of any tier to
// and from host memory; stream() visits every slice of every array in host memory, for the update.
template <class System>
class state_store {
 public:
  static constexpr int max_arrays = 8;

  state_store() = default;
  state_store(const offload_options& o, int rank, int arrays, std::size_t elements, const mem_category* categories,
              memory_accounting& acct)
      : o_(o), rank_(rank), arrays_(arrays), elements_(elements) {
    ZERO_CHECK(arrays >= 0 && arrays <= max_arrays, invalid_argument, "offload: ", arrays, " state arrays (at most ",
               max_arrays, ")");
    report_.tier = o.tier;
    report_.elements = elements;
    switch (o.tier) {
      case offload_tier::none:
        for (int a = 0; a < arrays; ++a) system_[a] = buffer<float, System>(elements, categories[a], acct);
        return;
      case offload_tier::host:
        report_.arrays = arrays;
        for (int a = 0; a < arrays; ++a) host_[a] = host_block<System>(elements * sizeof(float));
        report_.host_bytes = static_cast<std::uint64_t>(arrays) * elements * sizeof(float);
        return;
      case offload_tier::disk: {
        report_.arrays = arrays;
        region_bytes_ = round_up(elements * sizeof(float), io_alignment);
        file_ = std::make_unique<state_file>(o.directory, rank, static_cast<std::size_t>(arrays), region_bytes_,
                                             o.direct_io);
        worker_ = std::make_unique<io_worker>();
        const std::size_t slice = std::min(o.slice_elements, round_up(elements, io_alignment / sizeof(float)));
        for (auto& set : staging_) set = host_block<System>(static_cast<std::size_t>(arrays) * slice * sizeof(float));
        slice_ = slice;
        report_.disk_bytes = file_->bytes();
        report_.file = file_->path();
        report_.direct_io = file_->direct();
        report_.staging_bytes = staging_.size() * static_cast<std::uint64_t>(arrays) * slice * sizeof(float);
        return;
      }
    }
    fail(error_kind::invalid_argument, "rank ", rank, ": offload_options::tier is not an offload_tier value (",
         static_cast<int>(o.tier), ")");
  }

  offload_tier tier() const { return o_.tier; }
  bool offloaded() const { return o_.tier != offload_tier::none; }
  int arrays() const { return arrays_; }
  std::size_t elements() const { return elements_; }

  // The array's memory: the system's (tier none) or host memory (tier host); nullptr on disk.
  float* data(int a) const {
    if (o_.tier == offload_tier::none) return system_[a].data();
    if (o_.tier == offload_tier::host) return host_[a].floats();
    return nullptr;
  }

  // Copies elements [at, at + n) of array a to host memory (any alignment; on disk through the
  // first slice set, so not while a stream() runs).
  void read(const System& sys, int a, std::size_t at, std::size_t n, float* host) {
    if (n == 0) return;
    switch (o_.tier) {
      case offload_tier::none: return sys.copy_to_host(host, system_[a].data() + at, n * sizeof(float));
      case offload_tier::host: std::memcpy(host, host_[a].floats() + at, n * sizeof(float)); return;
      case offload_tier::disk: return through_blocks(a, at, n, host, nullptr);
    }
  }
  void write(const System& sys, int a, std::size_t at, std::size_t n, const float* host) {
    if (n == 0) return;
    switch (o_.tier) {
      case offload_tier::none: return sys.copy_from_host(system_[a].data() + at, host, n * sizeof(float));
      case offload_tier::host: std::memcpy(host_[a].floats() + at, host, n * sizeof(float)); return;
      case offload_tier::disk: return through_blocks(a, at, n, nullptr, host);
    }
  }

  // Calls f(begin, end, arrays) for consecutive slices [begin, end) covering [0, elements()), in
  // order, where arrays[a] points at element `begin` of array a in host memory, and what f writes
  // there is kept. On disk, slice k + 1 is read and slice k - 1 written by the I/O thread while f
  // runs on slice k; three sets of slice buffers. Every read and write covers whole 4 KiB blocks of
  // each array's region (the last slice is rounded up: region_bytes), so a step moves exactly
  // arrays x region bytes each way. The none and host tiers pass the arrays themselves (one slice).
  // write_back = false: f only reads, nothing is written (a load's cast of the master weights).
  template <class F>
  void stream(F&& f, bool write_back = true) {
    float* direct[max_arrays] = {};
    if (o_.tier != offload_tier::disk) {
      for (int a = 0; a < arrays_; ++a) direct[a] = data(a);
      if (elements_ > 0) f(std::size_t{0}, elements_, direct);
      return;
    }
    if (elements_ == 0) return;
    file_->check();
    const std::size_t slices = (elements_ + slice_ - 1) / slice_;
    if (slices == 0) return;
    std::vector<std::uint64_t> read_done(slices, 0);
    auto set_of = [&](std::size_t k) -> host_block<System>& { return staging_[k % staging_.size()]; };
    auto queue_read = [&](std::size_t k) { read_done[k] = worker_->submit([this, k, &set_of] { move_slice(k, set_of(k), false); }); };
    try {
      for (std::size_t k = 0; k < std::min<std::size_t>(2, slices); ++k) queue_read(k);
      for (std::size_t k = 0; k < slices; ++k) {
        worker_->wait(read_done[k]);
        float* at[max_arrays] = {};
        for (int a = 0; a < arrays_; ++a) at[a] = set_of(k).floats() + static_cast<std::size_t>(a) * slice_;
        const std::size_t begin = k * slice_, end = std::min(elements_, begin + slice_);
        f(begin, end, at);
        if (write_back) worker_->submit([this, k, &set_of] { move_slice(k, set_of(k), true); });
        // The set of slice k + 2 is that of slice k - 1, whose write was queued before: the worker
        // runs jobs in order, so the read starts after the write has finished.
        if (k + 2 < slices) queue_read(k + 2);
      }
      worker_->wait_all();
    } catch (...) {
      // A failed job: drain the queue so no job refers to this frame, then report the failure.
      worker_->reset();
      throw;
    }
  }

  // Adds to the copies between the system's memory and host memory (the engine's staged operands).
  void count_transfer(std::uint64_t to_host, std::uint64_t from_host) {
    report_.total.to_host += to_host;
    report_.total.from_host += from_host;
  }
  void add_staging(std::uint64_t bytes) { report_.staging_bytes += bytes; }
  // Marks the start and the end of a step's traffic (last_step = the difference).
  void begin_step() { step_start_ = report_.total; }
  void end_step() { report_.last_step = report_.total - step_start_; }
  const offload_report& report() const { return report_; }
  // The disk tier's bytes per region (each array's elements rounded up to 4 KiB), 0 elsewhere.
  std::size_t region_bytes() const { return region_bytes_; }

 private:
  // Reads (or writes) slice k of every array between the file and a staging set, whole blocks.
  void move_slice(std::size_t k, host_block<System>& set, bool writing) {
    const std::size_t begin = k * slice_ * sizeof(float);
    const std::size_t bytes = std::min(region_bytes_ - begin, slice_ * sizeof(float));
    for (int a = 0; a < arrays_; ++a) {
      char* buf = reinterpret_cast<char*>(set.floats() + static_cast<std::size_t>(a) * slice_);
      if (writing) file_->write(static_cast<std::size_t>(a), begin, buf, bytes);
      else file_->read(static_cast<std::size_t>(a), begin, buf, bytes);
    }
    (writing ? report_.total.disk_written : report_.total.disk_read) += static_cast<std::uint64_t>(arrays_) * bytes;
  }

  // An unaligned range of one array on disk, through whole blocks of the first staging set: read
  // into `out`, or read, modified with `in` and written back. Outside the step (initialization,
  // checkpoints), so these bytes are counted in the totals but not as a step's.
  void through_blocks(int a, std::size_t at, std::size_t n, float* out, const float* in) {
    file_->check();
    constexpr std::size_t block = io_alignment / sizeof(float);
    char* buf = static_cast<char*>(staging_[0].data());
    const std::size_t cap = slice_;  // floats per pass: one array's share of the set
    std::size_t done = 0;
    while (done < n) {
      const std::size_t first = (at + done) / block * block;
      const std::size_t skip = at + done - first;
      const std::size_t take = std::min(n - done, cap - skip);
      const std::size_t span = round_up(skip + take, block);
      const std::size_t bytes = std::min(span * sizeof(float), region_bytes_ - first * sizeof(float));
      file_->read(static_cast<std::size_t>(a), first * sizeof(float), buf, bytes);
      report_.total.disk_read += bytes;
      float* f = reinterpret_cast<float*>(buf);
      if (out) {
        std::memcpy(out + done, f + skip, take * sizeof(float));
      } else {
        std::memcpy(f + skip, in + done, take * sizeof(float));
        file_->write(static_cast<std::size_t>(a), first * sizeof(float), buf, bytes);
        report_.total.disk_written += bytes;
      }
      done += take;
    }
  }

  offload_options o_;
  int rank_ = -1;
  int arrays_ = 0;
  std::size_t elements_ = 0;
  std::array<buffer<float, System>, max_arrays> system_{};
  std::array<host_block<System>, max_arrays> host_{};
  std::unique_ptr<state_file> file_;
  std::size_t region_bytes_ = 0, slice_ = 0;
  std::array<host_block<System>, 3> staging_{};
  std::unique_ptr<io_worker> worker_;  // after the buffers its jobs use: stops (and drains) first
  offload_report report_;
  offload_traffic step_start_;
};

}  // namespace offload
}  // namespace zero
