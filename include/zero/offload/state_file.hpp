// offload::state_file: one rank's offloaded arrays on disk, an anonymous preallocated file of aligned regions read and written with pread/pwrite.
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

// How a state_file gets a file without a name.
enum class anonymous_file {
  tmpfile_or_unlinked,  // O_TMPFILE (never named), or where the file system refuses it, created and unlinked at once
  unlinked,             // always created under a fresh name and unlinked at once (the fallback, for tests)
};

// A file of `regions` regions of `region_bytes` (a multiple of io_alignment) each, in a directory,
// with no name: opened once, with O_TMPFILE | O_EXCL where the file system has it (the file never
// has a name and can never be given one), else created under a fresh name with O_EXCL | O_NOFOLLOW
// and unlinked before anything is written. The one descriptor is the file for the engine's life:
// no rename or link in the directory can redirect its writes, nothing is removed by name at the
// end, and a process killed at any point leaves nothing behind (the kernel frees an unlinked file
// with its last descriptor). Preallocated (a full disk is found at construction, not in the middle
// of a step) and zero-filled. O_DIRECT is set on that descriptor (fcntl) where the file system
// allows it (not tmpfs, for example): the page cache would otherwise hold a second copy of what the
// tier exists to keep out of memory. Every failure is zero::error (kind io) naming the rank and the
// directory: creation, preallocation (disk full), a read or write error, a short read (the file
// was truncated under the engine), and, through check(), a file truncated since.
class state_file {
 public:
  state_file() = default;
  state_file(const std::string& directory, int rank, std::size_t regions, std::size_t region_bytes, bool direct,
             anonymous_file how = anonymous_file::tmpfile_or_unlinked)
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
    name_ = detail::concat("anonymous file of rank ", rank, " in '", directory, "'");
    open_anonymous(directory, how);
    try {
      preallocate();
      if (direct) set_direct();
    } catch (...) {
      close();
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
  ~state_file() { close(); }

  // What names the file in reports and messages: it has no path ("anonymous file of rank R in 'D'").
  const std::string& name() const { return name_; }
  bool direct() const { return direct_; }
  bool named_then_unlinked() const { return unlinked_; }  // O_TMPFILE was refused: created, then unlinked
  std::uint64_t bytes() const { return size_; }           // the file's size, as preallocated

  // Reads `bytes` at `offset` of region `region` into dst. With direct I/O, offset, bytes and dst are
  // multiples of io_alignment (the callers' slices are).
  void read(std::size_t region, std::size_t offset, void* dst, std::size_t bytes) const {
    transfer(region, offset, dst, bytes, false);
  }
  void write(std::size_t region, std::size_t offset, const void* src, std::size_t bytes) const {
    transfer(region, offset, const_cast<void*>(src), bytes, true);
  }

  // Throws when the file was truncated since it was created: what pread would read as end of file.
  // (A file truncated and extended again reads as zeros at the right size: the store's checksums
  // find that.)
  void check() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      fail(error_kind::io, "rank ", rank_, ": offload file (", name_, "): fstat failed: ", std::strerror(e));
    }
    ZERO_CHECK(static_cast<std::uint64_t>(st.st_size) >= size_, io, "rank ", rank_, ": offload file (", name_,
               ") was truncated to ", st.st_size, " bytes while the engine used it (it holds ", size_,
               "): its optimizer states are lost; load the last checkpoint into a new engine");
  }

 private:
  void open_anonymous(const std::string& directory, anonymous_file how) {
    int tmpfile_errno = 0;
#ifdef O_TMPFILE
    if (how == anonymous_file::tmpfile_or_unlinked) {
      // O_EXCL: the file can never be linked into the directory (linkat through /proc/self/fd).
      do fd_ = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0600);
      while (fd_ < 0 && errno == EINTR);
      if (fd_ >= 0) return;
      tmpfile_errno = errno;  // EOPNOTSUPP (a file system without it), EISDIR/EINVAL (an old kernel), ...
    }
#endif
    // A fresh name no other engine uses (rank, process, a counter), taken with O_EXCL | O_NOFOLLOW so
    // nothing planted there is opened, unlinked before any data is written.
    static std::atomic<std::uint64_t> counter{0};
    const std::string dir = directory.back() == '/' ? directory : directory + "/";
    std::string path;
    for (int attempt = 0;; ++attempt) {
      path = detail::concat(dir, "zero-offload-rank", rank_, "-", ::getpid(), "-", counter.fetch_add(1), ".unlinked");
      do fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
      while (fd_ < 0 && errno == EINTR);
      if (fd_ >= 0 || errno != EEXIST || attempt == 100) break;
    }
    if (fd_ < 0) {
      const int e = errno;
      fail(error_kind::io, "rank ", rank_, ": cannot create the offload file in '", directory, "': ", std::strerror(e),
           tmpfile_errno ? detail::concat(" (O_TMPFILE: ", std::strerror(tmpfile_errno), ")") : std::string());
    }
    unlinked_ = true;
    // Unlink the name only while it is still this file's: a file moved onto the name since is not
    // ours to remove (and ours then has no name already).
    struct stat mine {}, named {};
    if (::fstat(fd_, &mine) == 0 && ::lstat(path.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
        mine.st_ino == named.st_ino) {
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        const int e = errno;
        close();
        fail(error_kind::io, "rank ", rank_, ": cannot unlink the offload file '", path, "' just created: ",
             std::strerror(e));
      }
    }
    // Linked elsewhere in the instant it had a name: its data would outlive the engine there.
    if (::fstat(fd_, &mine) != 0 || mine.st_nlink != 0) {
      close();
      fail(error_kind::io, "rank ", rank_, ": the offload file created as '", path,
           "' was given another name before it could be unlinked; refusing to write optimizer states to it");
    }
  }
  void preallocate() {
    if (size_ == 0) return;
    const int r = ::posix_fallocate(fd_, 0, static_cast<off_t>(size_));
    if (r == 0) return;
    if (r == EOPNOTSUPP || r == EINVAL) {
      // A file system without preallocation: a sparse file of the right size; a full disk then shows
      // at the first write instead.
      if (::ftruncate(fd_, static_cast<off_t>(size_)) == 0) return;
      const int e = errno;
      fail(error_kind::io, "rank ", rank_, ": cannot size the offload file (", name_, ") to ", size_, " bytes: ",
           std::strerror(e));
    }
    fail(error_kind::io, "rank ", rank_, ": cannot preallocate ", size_, " bytes for the offload file (", name_,
         "): ", std::strerror(r), r == ENOSPC ? " (the disk tier needs that much free space in its directory)" : "");
  }
  // O_DIRECT on the one descriptor, kept if the file system accepts it (tmpfs refuses: EINVAL).
  void set_direct() {
#ifdef O_DIRECT
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0) return;
    if (::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0) direct_ = (::fcntl(fd_, F_GETFL) & O_DIRECT) != 0;
#endif
  }
  void transfer(std::size_t region, std::size_t offset, void* buf, std::size_t bytes, bool writing) const {
    ZERO_CHECK(offset + bytes <= region_bytes_, invalid_argument, "rank ", rank_, ": offload file (", name_, "): ",
               writing ? "write" : "read", " of ", bytes, " bytes at ", offset, " passes the end of region ", region);
    auto* p = static_cast<char*>(buf);
    std::uint64_t at = region * region_bytes_ + offset;
    std::size_t left = bytes;
    while (left > 0) {
      const ssize_t n = writing ? ::pwrite(fd_, p, left, static_cast<off_t>(at)) : ::pread(fd_, p, left, static_cast<off_t>(at));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        fail(error_kind::io, "rank ", rank_, ": offload file (", name_, "): ", writing ? "writing " : "reading ", left,
             " bytes at offset ", at, " failed: ", std::strerror(e));
      }
      if (n == 0) {
        ZERO_CHECK(writing, io, "rank ", rank_, ": offload file (", name_, ") ends at offset ", at, ", before the ",
                   left, " bytes still to read (it was truncated while the engine used it): its optimizer states "
                   "are lost; load the last checkpoint into a new engine");
        fail(error_kind::io, "rank ", rank_, ": offload file (", name_, "): writing at offset ", at, " made no progress");
      }
      p += n;
      at += static_cast<std::uint64_t>(n);
      left -= static_cast<std::size_t>(n);
    }
  }
  // The file has no name: closing its last descriptor frees it.
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void swap(state_file& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(rank_, o.rank_);
    std::swap(direct_, o.direct_);
    std::swap(unlinked_, o.unlinked_);
    std::swap(region_bytes_, o.region_bytes_);
    std::swap(size_, o.size_);
    std::swap(name_, o.name_);
  }

  int fd_ = -1;
  int rank_ = -1;
  bool direct_ = false;
  bool unlinked_ = false;
  std::size_t region_bytes_ = 0;
  std::uint64_t size_ = 0;
  std::string name_;
};

}  // namespace zero::offload
