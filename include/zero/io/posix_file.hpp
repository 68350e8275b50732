// zero::io: the POSIX file layer under checkpoint/ and offload/: descriptor, pread/pwrite, open policy, fsync, rename.
#pragma once

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "zero/error.hpp"

namespace zero::io {

namespace fs = std::filesystem;

inline std::string errno_text(int e) { return std::strerror(e); }

inline const char* type_name(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "of an unknown type";
}

// Whether the last component of a path may be a symbolic link that is followed. The caller decides:
// entries a program finds inside its own directories are never followed (a link there could lead a
// reader or a clean-up anywhere); a path the user names (an output file, a directory to sync) may be.
enum class symlinks { refuse, follow };

// How messages name a file and whose messages they are: `prefix` opens every message ("checkpoint: ",
// "rank 3: "), `name` is the file as a reader should know it: a quoted path, or for a file without
// one what it is ("offload file (anonymous file of rank 3 in '/scratch')").
struct file_label {
  std::string prefix;
  std::string name;
};

inline file_label path_label(std::string_view prefix, const fs::path& p) {
  return {std::string(prefix), "'" + p.string() + "'"};
}

// The one way to open something that exists: never through a symbolic link in the last component
// (unless `links` allows it), never blocking (a FIFO or a device would block in open() itself,
// before any check), and only what `want` (S_IFREG or S_IFDIR) names, checked on the open
// descriptor, so an entry swapped between the look and the open is still refused. A FIFO, socket
// or device is refused before it is opened, since opening some devices has effects.
inline int open_existing(const fs::path& p, int access, mode_t want, symlinks links, const char* purpose,
                         std::string_view prefix) {
  auto refuse = [&](mode_t m) {
    fail(error_kind::io, prefix, "cannot open '", p.string(), "' ", purpose, ": it is ", type_name(m), ", not ",
         type_name(want), links == symlinks::refuse && S_ISLNK(m) ? " (symbolic links are not followed here)" : "");
  };
  struct stat st {};
  const int looked = links == symlinks::follow ? ::stat(p.c_str(), &st) : ::lstat(p.c_str(), &st);
  if (looked != 0) {
    const int e = errno;
    fail(error_kind::io, prefix, "cannot open '", p.string(), "' ", purpose, ": ", errno_text(e));
  }
  if ((st.st_mode & S_IFMT) != want) refuse(st.st_mode);
  const int flags = access | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (links == symlinks::refuse ? O_NOFOLLOW : 0) |
                    (want == S_IFDIR ? O_DIRECTORY : 0);
  int fd;
  do fd = ::open(p.c_str(), flags);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP && links == symlinks::refuse) refuse(S_IFLNK);
    fail(error_kind::io, prefix, "cannot open '", p.string(), "' ", purpose, ": ", errno_text(e));
  }
  if (::fstat(fd, &st) != 0 || (st.st_mode & S_IFMT) != want) {
    const mode_t m = st.st_mode;
    ::close(fd);
    refuse(m);
  }
  // Reads and writes of a regular file block as usual from here on.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// The descriptor of a new file, or -errno: O_EXCL | O_NOFOLLOW, so nothing that exists under that
// name (a file, or a symbolic link planted to redirect the write) is ever opened or truncated.
inline int create_exclusive(const fs::path& p, int access = O_WRONLY, mode_t mode = 0644) {
  int fd;
  do fd = ::open(p.c_str(), access | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  while (fd < 0 && errno == EINTR);
  return fd < 0 ? -errno : fd;
}

[[noreturn]] inline void fail_create(const fs::path& p, int e, std::string_view prefix) {
  fail(error_kind::io, prefix, "cannot create '", p.string(), "': ", errno_text(e),
       e == EEXIST ? " (something already exists under that name; it is left alone)" : "");
}

// An owned file descriptor and the label its messages name it by. Reads and writes move the whole
// length asked for (retrying after EINTR and short transfers); every failure is zero::error naming
// the file and the bytes.
class posix_file {
 public:
  posix_file() = default;
  posix_file(int fd, file_label label) : fd_(fd), label_(std::move(label)) {}
  posix_file(posix_file&& o) noexcept : fd_(std::exchange(o.fd_, -1)), label_(std::move(o.label_)) {}
  posix_file& operator=(posix_file&& o) noexcept {
    if (this != &o) {
      close_quietly();
      fd_ = std::exchange(o.fd_, -1);
      label_ = std::move(o.label_);
    }
    return *this;
  }
  posix_file(const posix_file&) = delete;
  posix_file& operator=(const posix_file&) = delete;
  ~posix_file() { close_quietly(); }

  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  const file_label& label() const { return label_; }
  // Gives up ownership: the descriptor is the caller's to close.
  int release() noexcept { return std::exchange(fd_, -1); }

  // The size of the file, which must be a regular file.
  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      fail(error_kind::io, label_.prefix, "cannot stat ", label_.name, ": ", errno_text(e));
    }
    ZERO_CHECK(S_ISREG(st.st_mode), io, label_.prefix, label_.name, " is not a regular file");
    return static_cast<std::uint64_t>(st.st_size);
  }

  // Reads `bytes` at `offset`, fewer only where the file ends first; returns how many were read.
  std::size_t pread_full(void* dst, std::size_t bytes, std::uint64_t offset) const {
    auto* p = static_cast<unsigned char*>(dst);
    std::size_t done = 0;
    while (done < bytes) {
      const ssize_t got = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        fail(error_kind::io, label_.prefix, "cannot read ", label_.name, ", bytes ", offset + done, " to ",
             offset + bytes, ": ", errno_text(e));
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  // Reads exactly `bytes` at `offset`; a file that ends first is truncated (kind corrupt: its content
  // is not what was written), not an I/O error.
  void pread_exact(void* dst, std::size_t bytes, std::uint64_t offset) const {
    const std::size_t got = pread_full(dst, bytes, offset);
    ZERO_CHECK(got == bytes, corrupt, label_.prefix, label_.name, " is truncated: it ends at byte ", offset + got,
               " but ", bytes - got, " more bytes were expected");
  }

  // Writes all `bytes` at `offset`.
  void pwrite_all(const void* src, std::size_t bytes, std::uint64_t offset) const {
    (void)write_loop(src, bytes, offset, false);
  }
  // The same, except that where the kernel refuses a write as invalid (EINVAL: with O_DIRECT set, an
  // address, offset or size the device's blocks do not allow) it stops there: the bytes written.
  std::size_t pwrite_until_refused(const void* src, std::size_t bytes, std::uint64_t offset) const {
    return write_loop(src, bytes, offset, true);
  }
  // Sets or clears O_DIRECT (writes from the caller's memory to the device, past the page cache) on
  // this descriptor; whether it is set afterwards (a file system without it, tmpfs for one, refuses).
  bool set_direct(bool on) const {
#ifdef O_DIRECT
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0) return false;
    (void)::fcntl(fd_, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT);
    return (::fcntl(fd_, F_GETFL) & O_DIRECT) != 0;
#else
    (void)on;
    return false;
#endif
  }

  // Forces the data to stable storage.
  void sync() const {
    int rc;
    do rc = ::fsync(fd_);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int e = errno;
      fail(error_kind::io, label_.prefix, "fsync of ", label_.name, " failed: ", errno_text(e));
    }
  }

  void close() {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    // After close() fails on Linux the descriptor is gone either way.
    if (::close(fd) != 0 && errno != EINTR) {
      const int e = errno;
      fail(error_kind::io, label_.prefix, "cannot close ", label_.name, ": ", errno_text(e));
    }
  }

 private:
  std::size_t write_loop(const void* src, std::size_t bytes, std::uint64_t offset, bool stop_if_refused) const {
    const auto* p = static_cast<const unsigned char*>(src);
    std::size_t done = 0;
    while (done < bytes) {
      const ssize_t put = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0 && errno == EINVAL && stop_if_refused) return done;
      if (put <= 0) {
        const int e = put < 0 ? errno : 0;
        fail(error_kind::io, label_.prefix, "cannot write ", label_.name, ", bytes ", offset + done, " to ",
             offset + bytes, ": ", e ? errno_text(e) : std::string("no progress"));
      }
      done += static_cast<std::size_t>(put);
    }
    return done;
  }

  void close_quietly() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  int fd_ = -1;
  file_label label_;
};

// Makes the entries of a directory (files created or renamed in it) durable.
inline void sync_directory(const fs::path& dir, std::string_view prefix) {
  const posix_file d(open_existing(dir, O_RDONLY, S_IFDIR, symlinks::follow, "as a directory", prefix),
                     path_label(prefix, dir));
  int rc;
  do rc = ::fsync(d.fd());
  while (rc != 0 && errno == EINTR);
  const int e = errno;
  // Some file systems cannot sync a directory (EINVAL); their renames are then as durable as they get.
  if (rc != 0 && e != EINVAL)
    fail(error_kind::io, prefix, "fsync of directory '", dir.string(), "' failed: ", errno_text(e));
}

inline void rename_path(const fs::path& from, const fs::path& to, std::string_view prefix) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int e = errno;
    fail(error_kind::io, prefix, "cannot rename '", from.string(), "' to '", to.string(), "': ", errno_text(e));
  }
}

// Renames `from` to `to` only if nothing exists under `to`, atomically: the check and the rename
// cannot be separated by another process creating `to`.
inline void rename_no_replace(const fs::path& from, const fs::path& to, std::string_view prefix) {
  int rc = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
    // A file system without RENAME_NOREPLACE: link() refuses an existing name just as well.
    rc = ::link(from.c_str(), to.c_str());
    if (rc == 0) {
      ::unlink(from.c_str());
    } else if (errno == EPERM || errno == EOPNOTSUPP || errno == ENOSYS) {
      // Nor hard links (some FUSE and FAT file systems): look, then rename. Not atomic, but still
      // never replaces what was there when it looked.
      struct stat st {};
      if (::lstat(to.c_str(), &st) == 0)
        errno = EEXIST;
      else
        rc = ::rename(from.c_str(), to.c_str());
    }
  }
  if (rc != 0) {
    const int e = errno;
    fail(error_kind::io, prefix, "cannot rename '", from.string(), "' to '", to.string(), "': ", errno_text(e),
         e == EEXIST ? " (it exists and is not replaced)" : "");
  }
}

// The directory a path lives in, "." for a bare name: what to sync after creating or renaming it.
inline fs::path parent_of(const fs::path& p) {
  const fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

}  // namespace zero::io
