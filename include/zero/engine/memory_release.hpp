// engine::release_memory / restore_memory: an engine's model states moved out of the system's memory between steps and
// back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/core/memory.hpp"
#include "zero/error.hpp"
#include "zero/offload/checksum.hpp"
#include "zero/offload/host_block.hpp"
#include "zero/offload/state_file.hpp"

namespace zero {

// Where release_memory() keeps the engine's state while it is released.
enum class release_target {
  host,  // host memory (pinned where the system pins host memory)
  disk,  // a file without a name in `directory`, freed by the kernel however the process ends
};

struct release_options {
  release_target to = release_target::host;
  std::string directory;  // release_target::disk: a directory on a file system with room for the bytes
};

// What a release holds (engine::released()).
struct release_report {
  bool released = false;
  release_target to = release_target::host;
  std::uint64_t bytes = 0;  // the bytes moved out of the system's memory
};

namespace detail {

// The bytes of an engine's buffers while they are released, in one place: filled in one order by
// park(), given back in the same order by unpark(). Host memory is counted in `host_acct` under
// mem_category::offload where host memory is the system's own (null elsewhere); a disk target
// streams through a staging block of at most 4 MiB, each block checksummed when written and checked
// when read back.
template <class System>
class parked_buffers {
 public:
  parked_buffers(const System& sys, const release_options& o, int rank, std::uint64_t total,
                 memory_accounting* host_acct)
      : sys_(sys), to_(o.to), total_(total) {
    if (o.to == release_target::host) {
      host_ = offload::host_block<System>(
          total, [&] { return offload::accounted(host_acct, total); }, false);
      return;
    }
    ZERO_CHECK(!o.directory.empty(), invalid_argument, "rank ", rank,
               ": release_memory to disk needs release_options::directory");
    ZERO_CHECK(offload::slice_checksums, invalid_argument, "rank ", rank,
               ": release_memory to disk needs xxHash to checksum what it writes (built without <xxhash.h>)");
    const std::size_t region =
        (std::max<std::uint64_t>(total, 1) + offload::io_alignment - 1) / offload::io_alignment * offload::io_alignment;
    file_.emplace(o.directory, rank, 1, region, false);
    rank_ = rank;
    staging_ = offload::host_block<System>(std::min<std::uint64_t>(total, staging_bytes));
  }

  // Copies b out, then frees it: b is empty until unpark(b).
  template <class T>
  void park(buffer<T, System>& b) {
    entries_.push_back({b.size(), b.category()});
    move(b.data(), b.size() * sizeof(T), true);
    b.reset();
  }
  // Allocates b again, as it was, and copies its bytes back.
  template <class T>
  void unpark(buffer<T, System>& b, memory_accounting& acct) {
    const entry e = entries_.at(next_++);
    if (e.elements == 0) return;
    b = buffer<T, System>(e.elements, e.category, acct, uninitialized);
    move(b.data(), e.elements * sizeof(T), false);
  }
  // Before the first unpark(): from the start, in park()'s order (again, after a restore that failed).
  void rewind() { next_ = 0, at_ = 0, read_hash_ = 0; }
  std::uint64_t bytes() const { return total_; }

 private:
  struct entry {
    std::size_t elements;
    mem_category category;
  };
  static constexpr std::uint64_t staging_bytes = std::uint64_t{4} << 20;

  // out: system memory -> the parked place, at the cursor; else back.
  void move(void* system_memory, std::uint64_t bytes, bool out) {
    auto* p = static_cast<unsigned char*>(system_memory);
    if (to_ == release_target::host) {
      unsigned char* h = static_cast<unsigned char*>(host_.data()) + at_;
      if (bytes > 0) {
        if (out)
          sys_.copy_to_host(h, p, bytes);
        else
          sys_.copy_from_host(p, h, bytes);
      }
    } else {
      for (std::uint64_t done = 0; done < bytes; done += staging_bytes) {
        const std::uint64_t n = std::min(staging_bytes, bytes - done);
        if (out) {
          sys_.copy_to_host(staging_.data(), p + done, n);
          sys_.synchronize();
          hashes_.push_back(offload::slice_hash(staging_.data(), n));
          file_->write(0, at_ + done, staging_.data(), n);
        } else {
          file_->read(0, at_ + done, staging_.data(), n);
          // The file has no name, but a process that reaches its descriptor could change it.
          ZERO_CHECK(offload::slice_hash(staging_.data(), n) == hashes_.at(read_hash_++), io, "rank ", rank_,
                     ": restore_memory: the released state's file (", file_->name(),
                     ") read back other bytes than were "
                     "written at bytes ",
                     at_ + done, " to ", at_ + done + n);
          sys_.copy_from_host(p + done, staging_.data(), n);
          sys_.synchronize();
        }
      }
    }
    at_ += bytes;
    sys_.synchronize();
  }

  const System& sys_;
  release_target to_;
  std::uint64_t total_ = 0, at_ = 0;
  offload::host_block<System> host_, staging_;
  std::optional<offload::state_file> file_;
  std::vector<entry> entries_;
  std::size_t next_ = 0;
  std::vector<std::uint64_t> hashes_;  // disk: one per staged block written, in order
  std::size_t read_hash_ = 0;
  int rank_ = 0;
};

// An engine's model states while released (engine::release_memory): what is parked where, and the
// refusal of every call that needs them until they are back.
template <class System>
class released_memory {
 public:
  bool released() const { return parked_ != nullptr; }
  release_report report() const { return parked_ ? release_report{true, to_, parked_->bytes()} : release_report{}; }
  // Refuses `call` while released, and release_memory() itself.
  void check_held(int rank, const char* call) const {
    ZERO_CHECK(!parked_, protocol, "rank ", rank, ": ", call, "() while the engine's memory is released (",
               to_ == release_target::host ? "to host memory" : "to disk", "); call restore_memory() first");
  }
  void check_releasable(int rank) const {
    ZERO_CHECK(!parked_, protocol, "rank ", rank, ": release_memory() while the memory is released already");
  }
  // Copies out and frees every buffer `for_each(f)` hands f, in its order (host memory counted in
  // `host_acct` where it is the system's).
  template <class ForEach>
  void release(const System& sys, const release_options& o, int rank, memory_accounting* host_acct,
               ForEach&& for_each) {
    std::uint64_t total = 0;
    for_each([&](const auto& b) { total += b.size() * sizeof(*b.data()); });
    auto parked = std::make_unique<detail::parked_buffers<System>>(sys, o, rank, total, host_acct);
    for_each([&](auto& b) { parked->park(b); });
    parked_ = std::move(parked);
    to_ = o.to;
  }
  // Allocates them again, in the same order, and copies them back; still released until restored()
  // (a restore that failed for memory can be tried again).
  template <class ForEach>
  void restore(int rank, memory_accounting& acct, ForEach&& for_each) {
    ZERO_CHECK(parked_, protocol, "rank ", rank, ": restore_memory() without a release_memory() before it");
    parked_->rewind();
    for_each([&](auto& b) { parked_->unpark(b, acct); });
  }
  void restored() { parked_.reset(); }

 private:
  std::unique_ptr<detail::parked_buffers<System>> parked_;
  release_target to_ = release_target::host;
};

}  // namespace detail
}  // namespace zero
