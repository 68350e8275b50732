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

#include "zero/core/formulas.hpp"
#include "zero/core/memory.hpp"
#include "zero/error.hpp"
#include "zero/offload/checksum.hpp"
#include "zero/offload/host_block.hpp"
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
  std::uint64_t checksum_bytes = 0;  // disk tier: the slices' checksums in host memory (8 bytes per array and slice)
  // disk tier: what names the rank's file, which has no name: "anonymous file of rank R in 'D'"
  std::string file;
  bool direct_io = false;         // disk tier: opened with O_DIRECT
  offload_traffic total;          // since construction
  offload_traffic last_step;      // during the last step() that updated
};

namespace offload {

// Offloaded state is updated on the host, by the host system (sys::host: its vectorized loop gives
// the device kernels' bits).
using host_system = sys::host;

// `arrays` fp32 arrays of `elements` each, in one tier:
//   none: buffer<float, System> in the system's memory, counted in the engine's memory() under each
//         array's category (what the engine always did);
//   host: host memory (pinned where System can), in the report's host_bytes;
//   disk: one anonymous state_file per rank, one region per array, streamed through up to three sets
//         of slice buffers (staging_bytes) by one I/O thread; every slice written carries a checksum
//         (XXH3, computed as it is handed to the writer, kept in host memory: checksum_bytes) that is
//         checked when it is read back, so an overwritten, truncated or re-extended file is an io
//         error naming the rank, the file, the array and the slice, never different parameters.
// The host memory of the host and disk tiers is counted in the engine's accounting under
// mem_category::offload (and so held to memory_limit_bytes) where host memory is the system's own
// (System::host_addressable: the CPU systems); a device system's budget is its device memory, and
// there these bytes are in the report only.
// data(a) addresses the none and host tiers directly; read()/write() copy any range of any tier to
// and from host memory; stream() visits every slice of every array in host memory, for the update.
template <class System>
class state_store {
 public:
  static constexpr int max_arrays = 8;
  // Whether the tiers' host memory is counted in the engine's memory (see above).
  static constexpr bool counts_host_memory = requires { requires System::host_addressable; };

  // The host memory the tier of `o` holds that counts as the system's memory (mem_category::offload),
  // for `arrays` arrays of `elements`: what the constructor then holds, for the checks made before it.
  static std::uint64_t counted_host_bytes(const offload_options& o, int arrays, std::size_t elements) {
    if (!counts_host_memory) return 0;
    const auto n = static_cast<std::uint64_t>(arrays);
    if (o.tier == offload_tier::host) return n * elements * sizeof(float);
    if (o.tier == offload_tier::disk) return formula::disk_tier_host_memory(elements, n, o.slice_elements).total();
    return 0;
  }

  state_store() = default;
  state_store(const offload_options& o, int rank, int arrays, std::size_t elements, const mem_category* categories,
              memory_accounting& acct)
      : o_(o), rank_(rank), arrays_(arrays), elements_(elements) {
    ZERO_CHECK(arrays >= 0 && arrays <= max_arrays, invalid_argument, "offload: ", arrays, " state arrays (at most ",
               max_arrays, ")");
    report_.tier = o.tier;
    report_.elements = elements;
    memory_accounting* host_acct = counts_host_memory ? &acct : nullptr;
    for (int a = 0; a < arrays; ++a) categories_[a] = categories[a];
    switch (o.tier) {
      case offload_tier::none:
        for (int a = 0; a < arrays; ++a) system_[a] = buffer<float, System>(elements, categories[a], acct);
        return;
      case offload_tier::host:
        report_.arrays = arrays;
        for (int a = 0; a < arrays; ++a) host_[a] = host_block<System>(elements * sizeof(float), host_acct);
        report_.host_bytes = static_cast<std::uint64_t>(arrays) * elements * sizeof(float);
        return;
      case offload_tier::disk: {
        ZERO_CHECK(slice_checksums, invalid_argument, "rank ", rank,
                   ": offload to disk needs xxHash to checksum the slices it writes, and this program was compiled "
                   "without <xxhash.h> (or with ZERO_NO_XXHASH): install xxHash (Debian: libxxhash-dev) and "
                   "rebuild, or use offload_tier::host");
        report_.arrays = arrays;
        region_bytes_ = round_up(elements * sizeof(float), io_alignment);
        const auto host = formula::disk_tier_host_memory(elements, static_cast<std::size_t>(arrays), o.slice_elements);
        slice_ = std::min(o.slice_elements, round_up(elements, io_alignment / sizeof(float)));
        slices_ = slice_ == 0 ? 0 : (elements + slice_ - 1) / slice_;
        // Counted before anything is allocated, the file included.
        hashes_held_ = accounted(host_acct, static_cast<std::size_t>(host.checksums));
        const std::size_t sets = std::min<std::size_t>(staging_.size(), slices_);
        for (std::size_t i = 0; i < sets; ++i)
          staging_[i] = host_block<System>(static_cast<std::size_t>(arrays) * slice_ * sizeof(float), host_acct);
        file_ = std::make_unique<state_file>(o.directory, rank, static_cast<std::size_t>(arrays), region_bytes_,
                                             o.direct_io);
        worker_ = std::make_unique<io_worker>();
        // The file starts as zeros: each slice's checksum is that of its zero bytes (the staging sets
        // are zero-filled), hashed once for every whole slice and once for the last, which may be shorter.
        hashes_.resize(static_cast<std::size_t>(arrays) * slices_);
        if (slices_ > 0) {
          const std::uint64_t whole = slice_hash(staging_[0].data(), slice_bytes(0));
          const std::uint64_t last = slice_hash(staging_[0].data(), slice_bytes(slices_ - 1));
          for (std::size_t k = 0; k < slices_; ++k)
            for (int a = 0; a < arrays; ++a) hashes_[hash_index(a, k)] = k + 1 == slices_ ? last : whole;
        }
        report_.disk_bytes = file_->bytes();
        report_.file = file_->name();
        report_.direct_io = file_->direct();
        report_.staging_bytes = host.staging;
        report_.checksum_bytes = host.checksums;
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
      case offload_tier::disk: return through_slices(a, at, n, host, nullptr);
    }
  }
  void write(const System& sys, int a, std::size_t at, std::size_t n, const float* host) {
    if (n == 0) return;
    switch (o_.tier) {
      case offload_tier::none: return sys.copy_from_host(system_[a].data() + at, host, n * sizeof(float));
      case offload_tier::host: std::memcpy(host_[a].floats() + at, host, n * sizeof(float)); return;
      case offload_tier::disk: return through_slices(a, at, n, nullptr, host);
    }
  }

  // Calls f(begin, end, arrays) for consecutive slices [begin, end) covering [0, elements()), in
  // order, where arrays[a] points at element `begin` of array a in host memory, and what f writes
  // there is kept. On disk, slice k + 1 is read and slice k - 1 written by the I/O thread while f
  // runs on slice k; up to three sets of slice buffers. Every read and write covers whole 4 KiB
  // blocks of each array's region (the last slice is rounded up: region_bytes), so a step moves
  // exactly arrays x region bytes each way. The none and host tiers pass the arrays themselves (one
  // slice). write_back = false: f only reads, nothing is written (a load's cast of the master weights).
  template <class F>
  void stream(F&& f, bool write_back = true) {
    float* direct[max_arrays] = {};
    if (o_.tier != offload_tier::disk) {
      for (int a = 0; a < arrays_; ++a) direct[a] = data(a);
      if (elements_ > 0) f(std::size_t{0}, elements_, direct);
      return;
    }
    if (elements_ == 0) return;
    flush();  // read()/write()'s slices, held in the first set, to the file: the stream reuses the set
    file_->check();
    const std::size_t slices = slices_;
    std::vector<std::uint64_t> read_done(slices, 0);
    auto set_of = [&](std::size_t k) -> host_block<System>& { return staging_[k % staging_.size()]; };
    auto queue_read = [&](std::size_t k) { read_done[k] = worker_->submit([this, k, &set_of] { move_slice(k, set_of(k), false); }); };
    try {
      for (std::size_t k = 0; k < std::min<std::size_t>(2, slices); ++k) queue_read(k);
      for (std::size_t k = 0; k < slices; ++k) {
        worker_->wait(read_done[k]);
        float* at[max_arrays] = {};
        for (int a = 0; a < arrays_; ++a) at[a] = set_of(k).floats() + static_cast<std::size_t>(a) * slice_;
        // The checksums are computed here, not on the I/O thread: the rank would otherwise wait for
        // them, since the thread's reads are what the step waits on; here they overlap its next I/O.
        for (int a = 0; a < arrays_; ++a) verify_slice(a, k, reinterpret_cast<const char*>(at[a]));
        const std::size_t begin = k * slice_, end = std::min(elements_, begin + slice_);
        f(begin, end, at);
        if (write_back) {
          std::array<std::uint64_t, max_arrays> written{};
          for (int a = 0; a < arrays_; ++a) written[a] = slice_hash(at[a], slice_bytes(k));
          worker_->submit([this, k, written, &set_of] {
            move_slice(k, set_of(k), true);
            for (int a = 0; a < arrays_; ++a) hashes_[hash_index(a, k)] = written[a];
          });
        }
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
  // Marks the start and the end of a step's traffic (last_step = the difference). The slices that
  // read()/write() hold are written first, so their bytes are not counted as the step's.
  void begin_step() {
    flush();
    step_start_ = report_.total;
  }
  void end_step() { report_.last_step = report_.total - step_start_; }
  const offload_report& report() const { return report_; }
  // The disk tier's bytes per region (each array's elements rounded up to 4 KiB), 0 elsewhere.
  std::size_t region_bytes() const { return region_bytes_; }

  // Visits the arrays kept in the system's memory (offload_tier::none; empty buffers otherwise), in
  // one order (engine::release_memory parks them).
  template <class F>
  void for_each_system_buffer(F&& f) {
    for (auto& b : system_) f(b);
  }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  static constexpr std::array<std::size_t, max_arrays> filled(std::size_t v) {
    std::array<std::size_t, max_arrays> r{};
    for (auto& x : r) x = v;
    return r;
  }

  std::size_t hash_index(int a, std::size_t k) const { return static_cast<std::size_t>(a) * slices_ + k; }
  // Slice k's bytes in every region: whole blocks, the last slice up to the region's end.
  std::size_t slice_bytes(std::size_t k) const {
    const std::size_t begin = k * slice_ * sizeof(float);
    return std::min(region_bytes_ - begin, slice_ * sizeof(float));
  }

  // Reads (or writes) slice k of array a between the file and buf, checking (or recording) its
  // checksum: every byte the tier reads back is what it wrote.
  void transfer_slice(int a, std::size_t k, char* buf, bool writing) {
    const std::size_t begin = k * slice_ * sizeof(float), bytes = slice_bytes(k);
    if (writing) {
      const std::uint64_t h = slice_hash(buf, bytes);
      file_->write(static_cast<std::size_t>(a), begin, buf, bytes);
      hashes_[hash_index(a, k)] = h;
      return;
    }
    file_->read(static_cast<std::size_t>(a), begin, buf, bytes);
    verify_slice(a, k, buf);
  }
  // Throws when slice k of array a, as read into buf, is not what was written there.
  void verify_slice(int a, std::size_t k, const char* buf) {
    const std::size_t begin = k * slice_ * sizeof(float), bytes = slice_bytes(k);
    const std::uint64_t h = slice_hash(buf, bytes), want = hashes_[hash_index(a, k)];
    if (h != want) {
      file_->check();  // a truncation names itself
      fail(error_kind::io, "rank ", rank_, ": offload file (", file_->name(), "): state array ", a, " (",
           to_string(categories_[a]), "), slice ", k, " of ", slices_, " (bytes ", begin, " to ", begin + bytes,
           " of its region, elements ", k * slice_, " to ", std::min(elements_, (k + 1) * slice_),
           "): read back other bytes than were written (checksum ", hex(h), ", written ", hex(want),
           "): the file was overwritten, or truncated and extended, while the engine used it; its optimizer "
           "states are lost: load the last checkpoint into a new engine");
    }
  }
  // Slice k of every array between the file and a staging set (the I/O thread's job; stream()
  // checks and computes the checksums).
  void move_slice(std::size_t k, host_block<System>& set, bool writing) {
    const std::size_t begin = k * slice_ * sizeof(float), bytes = slice_bytes(k);
    for (int a = 0; a < arrays_; ++a) {
      char* buf = reinterpret_cast<char*>(set.floats() + static_cast<std::size_t>(a) * slice_);
      if (writing) file_->write(static_cast<std::size_t>(a), begin, buf, bytes);
      else file_->read(static_cast<std::size_t>(a), begin, buf, bytes);
    }
    (writing ? report_.total.disk_written : report_.total.disk_read) +=
        static_cast<std::uint64_t>(arrays_) * slice_bytes(k);
  }

  // Any range of one array on disk, slice by slice through array a's place in the first staging
  // set, which keeps the last slice it read (checked) until another slice of that array is needed
  // or a stream begins: then it is written back (with its new checksum) if it was changed.
  // Initialization and checkpoints go through here one tensor or unit at a time, so a slice is
  // read and written once per pass, not once per call. Outside the step, so these bytes are
  // counted in the totals but not as a step's.
  void through_slices(int a, std::size_t at, std::size_t n, float* out, const float* in) {
    float* held = staging_[0].floats() + static_cast<std::size_t>(a) * slice_;
    std::size_t done = 0;
    while (done < n) {
      const std::size_t k = (at + done) / slice_, skip = at + done - k * slice_;
      const std::size_t take = std::min(n - done, slice_ - skip);
      if (cached_[a] != k) {
        flush(a);
        file_->check();
        transfer_slice(a, k, reinterpret_cast<char*>(held), false);
        report_.total.disk_read += slice_bytes(k);
        cached_[a] = k;
      }
      if (out) {
        std::memcpy(out + done, held + skip, take * sizeof(float));
      } else {
        std::memcpy(held + skip, in + done, take * sizeof(float));
        dirty_[a] = true;
      }
      done += take;
    }
  }
  // Writes array a's held slice back if it changed, and forgets it.
  void flush(int a) {
    if (cached_[a] == none) return;
    if (dirty_[a]) {
      transfer_slice(a, cached_[a], reinterpret_cast<char*>(staging_[0].floats() + static_cast<std::size_t>(a) * slice_),
                     true);
      report_.total.disk_written += slice_bytes(cached_[a]);
    }
    cached_[a] = none;
    dirty_[a] = false;
  }
  void flush() {
    if (o_.tier != offload_tier::disk) return;
    for (int a = 0; a < arrays_; ++a) flush(a);
  }
  static std::string hex(std::uint64_t h) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(16, '0');
    for (int k = 15; k >= 0; --k, h >>= 4) s[static_cast<std::size_t>(k)] = digits[h & 0xf];
    return s;
  }

  offload_options o_;
  int rank_ = -1;
  int arrays_ = 0;
  std::size_t elements_ = 0;
  std::array<mem_category, max_arrays> categories_{};
  std::array<buffer<float, System>, max_arrays> system_{};
  std::array<host_block<System>, max_arrays> host_{};
  std::unique_ptr<state_file> file_;
  std::size_t region_bytes_ = 0, slice_ = 0, slices_ = 0;
  std::array<host_block<System>, 3> staging_{};
  std::vector<std::uint64_t> hashes_;  // per array and slice: XXH3 of what the file holds there
  accounted hashes_held_;
  std::array<std::size_t, max_arrays> cached_ = filled(none);  // through_slices: the slice each array holds
  std::array<bool, max_arrays> dirty_{};
  std::unique_ptr<io_worker> worker_;  // after the buffers its jobs use: stops (and drains) first
  offload_report report_;
  offload_traffic step_start_;

};

}  // namespace offload
}  // namespace zero
