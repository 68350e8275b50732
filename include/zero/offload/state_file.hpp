// offload::state_file: one rank's offloaded arrays on disk, an anonymous preallocated file of aligned regions.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "zero/error.hpp"
#include "zero/io/posix_file.hpp"

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
      fail(error_kind::io, "rank ", rank, ": offload directory '", directory, "' cannot be used: ", io::errno_text(e));
    }
    ZERO_CHECK(S_ISDIR(st.st_mode), io, "rank ", rank, ": offload directory '", directory, "' is not a directory");
    name_ = detail::concat("anonymous file of rank ", rank, " in '", directory, "'");
    file_ = io::posix_file(open_anonymous(directory, how),
                           {detail::concat("rank ", rank, ": "), detail::concat("offload file (", name_, ")")});
    preallocate();
    if (direct) set_direct();
  }

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
    const std::uint64_t now = file_.size();
    ZERO_CHECK(now >= size_, io, "rank ", rank_, ": offload file (", name_, ") was truncated to ", now,
               " bytes while the engine used it (it holds ", size_,
               "): its optimizer states are lost; load the last checkpoint into a new engine");
  }

 private:
  // The descriptor of a new file in `directory` that has no name.
  int open_anonymous(const std::string& directory, anonymous_file how) {
    int tmpfile_errno = 0;
#ifdef O_TMPFILE
    if (how == anonymous_file::tmpfile_or_unlinked) {
      // O_EXCL: the file can never be linked into the directory (linkat through /proc/self/fd).
      int fd;
      do fd = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0600);
      while (fd < 0 && errno == EINTR);
      if (fd >= 0) return fd;
      tmpfile_errno = errno;  // EOPNOTSUPP (a file system without it), EISDIR/EINVAL (an old kernel), ...
    }
#endif
    // A fresh name no other engine uses (rank, process, a counter), taken with O_EXCL | O_NOFOLLOW so
    // nothing planted there is opened, unlinked before any data is written.
    static std::atomic<std::uint64_t> counter{0};
    const std::string dir = directory.back() == '/' ? directory : directory + "/";
    std::string path;
    int fd = -1;
    for (int attempt = 0;; ++attempt) {
      path = detail::concat(dir, "zero-offload-rank", rank_, "-", ::getpid(), "-", counter.fetch_add(1), ".unlinked");
      fd = io::create_exclusive(path, O_RDWR, 0600);
      if (fd >= 0 || fd != -EEXIST || attempt == 100) break;
    }
    if (fd < 0) {
      fail(error_kind::io, "rank ", rank_, ": cannot create the offload file in '", directory,
           "': ", io::errno_text(-fd),
           tmpfile_errno ? detail::concat(" (O_TMPFILE: ", io::errno_text(tmpfile_errno), ")") : std::string());
    }
    io::posix_file owned(fd, {});  // closes the file if it cannot be used
    unlinked_ = true;
    // Unlink the name only while it is still this file's: a file moved onto the name since is not
    // ours to remove (and ours then has no name already).
    struct stat mine {}, named {};
    if (::fstat(fd, &mine) == 0 && ::lstat(path.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
        mine.st_ino == named.st_ino) {
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        const int e = errno;
        fail(error_kind::io, "rank ", rank_, ": cannot unlink the offload file '", path,
             "' just created: ", io::errno_text(e));
      }
    }
    // Linked elsewhere in the instant it had a name: its data would outlive the engine there.
    if (::fstat(fd, &mine) != 0 || mine.st_nlink != 0) {
      fail(error_kind::io, "rank ", rank_, ": the offload file created as '", path,
           "' was given another name before it could be unlinked; refusing to write optimizer states to it");
    }
    return owned.release();
  }
  void preallocate() {
    if (size_ == 0) return;
    const int r = ::posix_fallocate(file_.fd(), 0, static_cast<off_t>(size_));
    if (r == 0) return;
    if (r == EOPNOTSUPP || r == EINVAL) {
      // A file system without preallocation: a sparse file of the right size; a full disk then shows
      // at the first write instead.
      if (::ftruncate(file_.fd(), static_cast<off_t>(size_)) == 0) return;
      const int e = errno;
      fail(error_kind::io, "rank ", rank_, ": cannot size the offload file (", name_, ") to ", size_,
           " bytes: ", io::errno_text(e));
    }
    fail(error_kind::io, "rank ", rank_, ": cannot preallocate ", size_, " bytes for the offload file (", name_,
         "): ", io::errno_text(r), r == ENOSPC ? " (the disk tier needs that much free space in its directory)" : "");
  }
  // O_DIRECT on the one descriptor, kept if the file system accepts it (tmpfs refuses: EINVAL).
  void set_direct() {
#ifdef O_DIRECT
    const int flags = ::fcntl(file_.fd(), F_GETFL);
    if (flags < 0) return;
    if (::fcntl(file_.fd(), F_SETFL, flags | O_DIRECT) == 0) direct_ = (::fcntl(file_.fd(), F_GETFL) & O_DIRECT) != 0;
#endif
  }
  // Reads and writes go through the POSIX layer, which names the file and the bytes on an error; a
  // read that finds the end of the file early means the file was truncated under the engine.
  void transfer(std::size_t region, std::size_t offset, void* buf, std::size_t bytes, bool writing) const {
    ZERO_CHECK(offset + bytes <= region_bytes_, invalid_argument, "rank ", rank_, ": offload file (", name_, "): ",
               writing ? "write" : "read", " of ", bytes, " bytes at ", offset, " passes the end of region ", region);
    const std::uint64_t at = region * region_bytes_ + offset;
    if (writing) return file_.pwrite_all(buf, bytes, at);
    const std::size_t got = file_.pread_full(buf, bytes, at);
    ZERO_CHECK(got == bytes, io, "rank ", rank_, ": offload file (", name_, ") ends at offset ", at + got,
               ", before the ", bytes - got, " bytes still to read (it was truncated while the engine used it): ",
               "its optimizer states are lost; load the last checkpoint into a new engine");
  }

  io::posix_file file_;  // the file has no name: closing its descriptor frees it
  int rank_ = -1;
  bool direct_ = false;
  bool unlinked_ = false;
  std::size_t region_bytes_ = 0;
  std::uint64_t size_ = 0;
  std::string name_;
};

}  // namespace zero::offload
