// offload::state_file: one rank's offloaded arrays on disk, a preallocated file of aligned regions read and written with pread/pwrite.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "zero/error.hpp"

namespace zero::offload {

// Offsets, lengths and buffer addresses of direct I/O are multiples of this (the page and the
// logical block size of every common file system and NVMe drive).
inline constexpr std::size_t io_alignment = 4096;

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// A file of `regions` regions of `region_bytes` (a multiple of io_alignment) each, created fresh in
// a directory, preallocated (so a full disk is found at construction, not in the middle of a step),
// zero-filled, and removed when the object is destroyed. Opened with O_DIRECT where the file system
// allows it (not tmpfs, for example): the page cache would otherwise hold a second copy of what the
// tier exists to keep out of memory. Every failure is zero::error (kind io) naming the rank and the
// file: creation, preallocation (disk full), a read or write error, a short read (the file was
// truncated under the engine), and, through check(), a file removed or truncated since.
class state_file {
 public:
  state_file() = default;
  state_file(const std::string& directory, int rank, std::size_t regions, std::size_t region_bytes, bool direct)
      : rank_(rank), region_bytes_(region_bytes), size_(regions * region_bytes) {
    ZERO_CHECK(region_bytes % io_alignment == 0, invalid_argument, "offload: region size ", region_bytes,
               " is not a multiple of ", io_alignment);
    ZERO_CHECK(!directory.empty(), invalid_argument, "rank ", rank,
               ": offload to disk needs a directory (offload_options::directory)");
    struct stat st {};
    if (::stat(directory.c_str(), &st) != 0) {
      const int e = errno;
      fail(error_kind::io, "rank ", rank, ": offload directory '", directory, "' cannot be used: ", std::strerror(e));
    }
    ZERO_CHECK(S_ISDIR(st.st_mode), io, "rank ", rank, ": offload directory '", directory, "' is not a directory");
    // A name no other engine of this or another process uses: rank, process, and a counter.
    static std::atomic<std::uint64_t> counter{0};
    path_ = detail::concat(directory, directory.back() == '/' ? "" : "/", "zero-offload-rank", rank, "-", ::getpid(),
                           "-", counter.fetch_add(1), ".state");
    do fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) {
      const int e = errno;
      fail(error_kind::io, "rank ", rank, ": cannot create the offload file '", path_, "': ", std::strerror(e));
    }
    try {
      preallocate();
      if (direct) open_direct();
    } catch (...) {
      close_and_remove();
      throw;
    }
  }
  state_file(state_file&& o) noexcept { swap(o); }
  state_file& operator=(state_file&& o) noexcept {
    state_file t(std::move(o));
    swap(t);
    return *this;
  }
  state_file(const state_file&) = delete;
  state_file& operator=(const state_file&) = delete;
  ~state_file() { close_and_remove(); }

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  std::uint64_t bytes() const { return size_; }  // the file's size, as preallocated

  // Reads `bytes` at `offset` of region `region` into dst. With direct I/O, offset, bytes and dst are
  // multiples of io_alignment (the callers' slices are).
  void read(std::size_t region, std::size_t offset, void* dst, std::size_t bytes) const {
    transfer(region, offset, dst, bytes, false);
  }
  void write(std::size_t region, std::size_t offset, const void* src, std::size_t bytes) const {
    transfer(region, offset, const_cast<void*>(src), bytes, true);
  }

  // Throws when the file was removed (its last name unlinked: another process or a clean-up), or
  // truncated, since it was created: what pread would otherwise read as zeros or end of file.
  void check() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      fail(error_kind::io, "rank ", rank_, ": offload file '", path_, "': fstat failed: ", std::strerror(e));
    }
    ZERO_CHECK(st.st_nlink > 0, io, "rank ", rank_, ": offload file '", path_,
               "' was removed while the engine used it: the optimizer states it held are gone with this engine; "
               "load the last checkpoint into a new engine");
    ZERO_CHECK(static_cast<std::uint64_t>(st.st_size) >= size_, io, "rank ", rank_, ": offload file '", path_,
               "' was truncated to ", st.st_size, " bytes while the engine used it (it holds ", size_,
               "): its optimizer states are lost; load the last checkpoint into a new engine");
  }

 private:
  void preallocate() {
    if (size_ == 0) return;
    const int r = ::posix_fallocate(fd_, 0, static_cast<off_t>(size_));
    if (r == 0) return;
    if (r == EOPNOTSUPP || r == EINVAL) {
      // A file system without preallocation: a sparse file of the right size; a full disk then shows
      // at the first write instead.
      if (::ftruncate(fd_, static_cast<off_t>(size_)) == 0) return;
      const int e = errno;
      fail(error_kind::io, "rank ", rank_, ": cannot size the offload file '", path_, "' to ", size_, " bytes: ",
           std::strerror(e));
    }
    fail(error_kind::io, "rank ", rank_, ": cannot preallocate ", size_, " bytes for the offload file '", path_,
         "': ", std::strerror(r), r == ENOSPC ? " (the disk tier needs that much free space in its directory)" : "");
  }
  // A second descriptor with O_DIRECT, kept if the file system accepts it (tmpfs refuses: EINVAL).
  void open_direct() {
#ifdef O_DIRECT
    int fd;
    do fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return;
    ::close(fd_);
    fd_ = fd;
    direct_ = true;
#endif
  }
  void transfer(std::size_t region, std::size_t offset, void* buf, std::size_t bytes, bool writing) const {
    ZERO_CHECK(offset + bytes <= region_bytes_, invalid_argument, "rank ", rank_, ": offload file '", path_, "': ",
               writing ? "write" : "read", " of ", bytes, " bytes at ", offset, " passes the end of region ", region);
    auto* p = static_cast<char*>(buf);
    std::uint64_t at = region * region_bytes_ + offset;
    std::size_t left = bytes;
    while (left > 0) {
      const ssize_t n = writing ? ::pwrite(fd_, p, left, static_cast<off_t>(at)) : ::pread(fd_, p, left, static_cast<off_t>(at));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        fail(error_kind::io, "rank ", rank_, ": offload file '", path_, "': ", writing ? "writing " : "reading ", left,
             " bytes at offset ", at, " failed: ", std::strerror(e));
      }
      if (n == 0) {
        ZERO_CHECK(writing, io, "rank ", rank_, ": offload file '", path_, "' ends at offset ", at, ", before the ",
                   left, " bytes still to read (it was truncated while the engine used it): its optimizer states "
                   "are lost; load the last checkpoint into a new engine");
        fail(error_kind::io, "rank ", rank_, ": offload file '", path_, "': writing at offset ", at, " made no progress");
      }
      p += n;
      at += static_cast<std::uint64_t>(n);
      left -= static_cast<std::size_t>(n);
    }
  }
  void close_and_remove() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
    }
    fd_ = -1;
  }
  void swap(state_file& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(rank_, o.rank_);
    std::swap(direct_, o.direct_);
    std::swap(region_bytes_, o.region_bytes_);
    std::swap(size_, o.size_);
    std::swap(path_, o.path_);
  }

  int fd_ = -1;
  int rank_ = -1;
  bool direct_ = false;
  std::size_t region_bytes_ = 0;
  std::uint64_t size_ = 0;
  std::string path_;
};

}  // namespace zero::offload
