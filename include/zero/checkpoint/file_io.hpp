// Safe, durable file I/O for checkpoints: POSIX open/pread/write/fsync/rename with zero::error on every failure.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "zero/checkpoint/checksum.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

// Data files hold raw little-endian float32; on a little-endian host that is the memory image, so
// bytes go to and from disk without conversion.
static_assert(std::endian::native == std::endian::little,
              "zero checkpoints store little-endian float32: a big-endian host would need byte swapping");
static_assert(sizeof(float) == 4, "checkpoints store IEEE-754 binary32 values");

namespace fs = std::filesystem;

namespace detail {

inline std::string errno_text(int e) { return std::strerror(e); }

// Reads and writes move at most this much per system call: bounded buffers and progress on large files.
inline constexpr std::size_t io_chunk = std::size_t{1} << 20;

// Elements of master weights and optimizer slots staged at once by save and load (4 MiB per array):
// the host memory a checkpoint takes, whatever the units' sizes.
inline constexpr std::size_t state_chunk_elements = std::size_t{1} << 20;

}  // namespace detail

// Whether the last component of a path may be a symbolic link that is followed. Entries inside a
// checkpoint (manifest, data files, version directories) never are: a link there could lead a
// reader or a clean-up anywhere. A path the caller names itself (an output file, a directory to
// sync) is the caller's choice.
enum class symlinks { refuse, follow };

namespace detail {

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

// The one way the checkpoint headers open something that exists: never through a symbolic link in
// the last component (unless `links` allows it), never blocking (a FIFO or a device would block in
// open() itself, before any check), and only what `want` (S_IFREG or S_IFDIR) names, checked on the
// open descriptor, so an entry swapped between the look and the open is still refused. A FIFO,
// socket or device is refused before it is opened, since opening some devices has effects.
inline int open_existing(const fs::path& p, int access, mode_t want, symlinks links, const char* purpose) {
  auto refuse = [&](mode_t m) {
    fail(error_kind::io, "checkpoint: cannot open '", p.string(), "' ", purpose, ": it is ", type_name(m), ", not ",
         type_name(want), links == symlinks::refuse && S_ISLNK(m) ? " (symbolic links are not followed here)" : "");
  };
  struct stat st {};
  const int looked = links == symlinks::follow ? ::stat(p.c_str(), &st) : ::lstat(p.c_str(), &st);
  if (looked != 0) {
    const int e = errno;
    fail(error_kind::io, "checkpoint: cannot open '", p.string(), "' ", purpose, ": ", errno_text(e));
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
    fail(error_kind::io, "checkpoint: cannot open '", p.string(), "' ", purpose, ": ", errno_text(e));
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

}  // namespace detail

// An owned file descriptor.
class file {
 public:
  file() = default;
  file(int fd, fs::path path) : fd_(fd), path_(std::move(path)) {}
  file(file&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  file& operator=(file&& o) noexcept {
    if (this != &o) {
      close_quietly();
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
    }
    return *this;
  }
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() { close_quietly(); }

  // An existing regular file, for reading (see detail::open_existing).
  static file open_read(const fs::path& p, symlinks links = symlinks::refuse) {
    return file(detail::open_existing(p, O_RDONLY, S_IFREG, links, "for reading"), p);
  }
  // An existing directory, to sync it or to work inside it.
  static file open_directory(const fs::path& p, symlinks links = symlinks::follow) {
    return file(detail::open_existing(p, O_RDONLY, S_IFDIR, links, "as a directory"), p);
  }
  // A new file: O_EXCL, so nothing that exists under that name (a file, or a symbolic link planted
  // to redirect the write) is ever opened, truncated or written through.
  static file create_new(const fs::path& p) {
    const int fd = create_exclusive(p);
    if (fd < 0) fail_create(p, -fd);
    return file(fd, p);
  }
  // The descriptor of a new file, or -errno.
  static int create_exclusive(const fs::path& p) {
    int fd;
    do fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
  }
  [[noreturn]] static void fail_create(const fs::path& p, int e) {
    fail(error_kind::io, "checkpoint: cannot create '", p.string(), "': ", detail::errno_text(e),
         e == EEXIST ? " (something already exists under that name; it is left alone)" : "");
  }

  int fd() const { return fd_; }
  const fs::path& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      fail(error_kind::io, "checkpoint: cannot stat '", path_.string(), "': ", detail::errno_text(e));
    }
    ZERO_CHECK(S_ISREG(st.st_mode), io, "checkpoint: '", path_.string(), "' is not a regular file");
    return static_cast<std::uint64_t>(st.st_size);
  }

  // Reads exactly `bytes` at `offset`; a file that ends first is truncated (corrupt), not an I/O error.
  void pread_exact(void* dst, std::size_t bytes, std::uint64_t offset) const {
    auto* p = static_cast<unsigned char*>(dst);
    while (bytes > 0) {
      const std::size_t want = bytes < detail::io_chunk ? bytes : detail::io_chunk;
      const ssize_t got = ::pread(fd_, p, want, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        fail(error_kind::io, "checkpoint: cannot read '", path_.string(), "' at byte ", offset, ": ",
             detail::errno_text(e));
      }
      ZERO_CHECK(got > 0, corrupt, "checkpoint: '", path_.string(), "' is truncated: it ends at byte ", offset,
                 " but ", bytes, " more bytes were expected");
      p += got;
      bytes -= static_cast<std::size_t>(got);
      offset += static_cast<std::uint64_t>(got);
    }
  }

  void write_all(const void* src, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(src);
    while (bytes > 0) {
      const std::size_t want = bytes < detail::io_chunk ? bytes : detail::io_chunk;
      const ssize_t put = ::write(fd_, p, want);
      if (put < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        fail(error_kind::io, "checkpoint: cannot write '", path_.string(), "': ", detail::errno_text(e));
      }
      p += put;
      bytes -= static_cast<std::size_t>(put);
    }
  }

  void pwrite_all(const void* src, std::size_t bytes, std::uint64_t offset) {
    const auto* p = static_cast<const unsigned char*>(src);
    while (bytes > 0) {
      const ssize_t put = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
      if (put < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        fail(error_kind::io, "checkpoint: cannot write '", path_.string(), "': ", detail::errno_text(e));
      }
      p += put;
      bytes -= static_cast<std::size_t>(put);
      offset += static_cast<std::uint64_t>(put);
    }
  }

  // Forces the data to stable storage: without it a crash after the rename could expose an empty file.
  void sync() {
    int rc;
    do rc = ::fsync(fd_);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int e = errno;
      fail(error_kind::io, "checkpoint: fsync of '", path_.string(), "' failed: ", detail::errno_text(e));
    }
  }

  void close() {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    // After close() fails on Linux the descriptor is gone either way; the data is already synced.
    if (::close(fd) != 0 && errno != EINTR) {
      const int e = errno;
      fail(error_kind::io, "checkpoint: cannot close '", path_.string(), "': ", detail::errno_text(e));
    }
  }

 private:
  void close_quietly() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }
  int fd_ = -1;
  fs::path path_;
};

// Makes the entries of a directory (files created or renamed in it) durable.
inline void sync_directory(const fs::path& dir) {
  file d = file::open_directory(dir);
  int rc;
  do rc = ::fsync(d.fd());
  while (rc != 0 && errno == EINTR);
  const int e = errno;
  // Some file systems cannot sync a directory (EINVAL); their renames are then as durable as they get.
  if (rc != 0 && e != EINVAL)
    fail(error_kind::io, "checkpoint: fsync of directory '", dir.string(), "' failed: ", detail::errno_text(e));
}

inline void rename_path(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int e = errno;
    fail(error_kind::io, "checkpoint: cannot rename '", from.string(), "' to '", to.string(), "': ",
         detail::errno_text(e));
  }
}

// Renames `from` to `to` only if nothing exists under `to`, atomically: the check and the rename
// cannot be separated by another process creating `to`.
inline void rename_no_replace(const fs::path& from, const fs::path& to) {
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
      if (::lstat(to.c_str(), &st) == 0) errno = EEXIST;
      else rc = ::rename(from.c_str(), to.c_str());
    }
  }
  if (rc != 0) {
    const int e = errno;
    fail(error_kind::io, "checkpoint: cannot rename '", from.string(), "' to '", to.string(), "': ",
         detail::errno_text(e), e == EEXIST ? " (it exists and is not replaced)" : "");
  }
}

// The directory a path lives in, "." for a bare name: what to sync after creating or renaming it.
inline fs::path parent_of(const fs::path& p) {
  const fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

namespace detail {

// 64 bits nobody can predict (std::random_device is getrandom(2) on Linux): a temporary name that
// another user cannot prepare a file or link for in advance.
inline std::uint64_t unpredictable_u64() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
}

}  // namespace detail

// What commit() does when a file already exists under the final name.
enum class existing_file { replace, refuse };

// A file written under a temporary name beside its final one (`final.tmp-<16 random hex digits>`,
// created with O_EXCL), hashed as it goes, and renamed into place by commit() only after an fsync;
// a writer destroyed before commit() removes its temporary file. A file under its final name is
// therefore always complete, and no existing file or planted link is ever written through.
class durable_writer {
 public:
  explicit durable_writer(fs::path final_path, existing_file existing = existing_file::replace)
      : final_(std::move(final_path)), existing_(existing) {
    for (int attempt = 0;; ++attempt) {
      tmp_ = fs::path(final_).concat(".tmp-" + to_hex(detail::unpredictable_u64()));
      const int fd = file::create_exclusive(tmp_);
      if (fd >= 0) {
        f_ = file(fd, tmp_);
        return;
      }
      // A collision with 64 random bits means someone is guessing: give up after a few.
      if (-fd != EEXIST || attempt >= 3) file::fail_create(tmp_, -fd);
    }
  }
  durable_writer(const durable_writer&) = delete;
  durable_writer& operator=(const durable_writer&) = delete;
  ~durable_writer() {
    if (!committed_) {
      f_ = file();
      ::unlink(tmp_.c_str());
    }
  }

  void write(const void* data, std::size_t bytes) {
    f_.write_all(data, bytes);
    hash_.update(data, bytes);
    bytes_ += bytes;
  }
  // Bytes outside the running checksum (a header that will carry the checksum of what follows it).
  void write_unhashed(const void* data, std::size_t bytes) {
    f_.write_all(data, bytes);
    bytes_ += bytes;
  }
  // Replaces bytes already written (a checksum placeholder), before commit().
  void overwrite(const void* data, std::size_t bytes, std::uint64_t offset) { f_.pwrite_all(data, bytes, offset); }

  std::uint64_t bytes() const { return bytes_; }
  std::uint64_t checksum() const { return hash_.digest(); }
  const fs::path& final_path() const { return final_; }
  const fs::path& temporary_path() const { return tmp_; }

  // fsync, close, rename into place, fsync the directory.
  void commit() {
    f_.sync();
    f_.close();
    if (existing_ == existing_file::replace) rename_path(tmp_, final_);
    else rename_no_replace(tmp_, final_);
    committed_ = true;
    sync_directory(parent_of(final_));
  }

 private:
  fs::path final_, tmp_;
  existing_file existing_;
  file f_;
  xxh64_stream hash_;
  std::uint64_t bytes_ = 0;
  bool committed_ = false;
};

// Replaces `path` atomically and durably with `bytes`.
inline void write_file_atomically(const fs::path& path, const std::string& bytes) {
  durable_writer w(path);
  w.write(bytes.data(), bytes.size());
  w.commit();
}

// The whole content of a small file (a manifest), refusing anything larger than max_bytes so a bad
// file cannot make the reader allocate without bound.
inline std::string read_small_file(const fs::path& path, std::uint64_t max_bytes) {
  file f = file::open_read(path);
  const std::uint64_t n = f.size();
  ZERO_CHECK(n <= max_bytes, corrupt, "checkpoint: '", path.string(), "' has ", n, " bytes, more than the ",
             max_bytes, " a file of its kind may have");
  std::string s(static_cast<std::size_t>(n), '\0');
  f.pread_exact(s.data(), s.size(), 0);
  return s;
}

namespace detail {

// The type of the entry `name` of the open directory `dirfd`, without following a link; 0 when it
// cannot be looked at (gone, or no permission), with errno set.
inline mode_t entry_type(int dirfd, const char* name) {
  struct stat st {};
  if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
  return st.st_mode & S_IFMT;
}

// Removes the directory `name` inside the open directory `parent` and everything in it, working
// only through descriptors opened with O_NOFOLLOW: a symbolic link inside is removed as a link, its
// target is never touched, and if `name` itself is (or becomes, in a race) anything but a real
// directory, nothing is removed. `first` (the commit record) goes before anything else. Returns
// whether `name` is gone. At most `depth` levels of subdirectories are entered.
inline bool remove_tree_at(int parent, const std::string& name, const char* first = nullptr, int depth = 8) noexcept {
  int fd;
  do fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno == ENOENT;
  if (first && ::unlinkat(fd, first, 0) == 0) ::fsync(fd);
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return false;
  }
  // Names first, removal after: a directory is not changed while it is being read.
  std::vector<std::string> names;
  try {
    while (const dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  } catch (...) {
    ::closedir(d);
    return false;
  }
  bool ok = true;
  for (const auto& n : names) {
    if (entry_type(fd, n.c_str()) == S_IFDIR) ok = (depth > 0 && remove_tree_at(fd, n, nullptr, depth - 1)) && ok;
    else if (::unlinkat(fd, n.c_str(), 0) != 0 && errno != ENOENT) ok = false;
  }
  ::closedir(d);
  return ok && (::unlinkat(parent, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT);
}

}  // namespace detail

// XXH64 of the first `bytes` bytes of an open file, read in bounded chunks.
inline std::uint64_t hash_file(const file& f, std::uint64_t bytes) {
  std::vector<unsigned char> chunk(static_cast<std::size_t>(bytes < detail::io_chunk ? bytes : detail::io_chunk));
  xxh64_stream h;
  std::uint64_t at = 0;
  while (at < bytes) {
    const std::size_t n = static_cast<std::size_t>(bytes - at < chunk.size() ? bytes - at : chunk.size());
    f.pread_exact(chunk.data(), n, at);
    h.update(chunk.data(), n);
    at += n;
  }
  return h.digest();
}

}  // namespace zero::checkpoint
