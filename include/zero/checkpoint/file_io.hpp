// Durable file I/O for checkpoints: POSIX open/pread/write/fsync/rename with zero::error on every failure.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
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

  static file open_read(const fs::path& p) {
    int fd;
    do fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int e = errno;
      fail(error_kind::io, "checkpoint: cannot open '", p.string(), "' for reading: ", detail::errno_text(e));
    }
    return file(fd, p);
  }
  // Creates or truncates p for writing.
  static file create(const fs::path& p) {
    int fd;
    do fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int e = errno;
      fail(error_kind::io, "checkpoint: cannot create '", p.string(), "': ", detail::errno_text(e));
    }
    return file(fd, p);
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
  int fd;
  do fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int e = errno;
    fail(error_kind::io, "checkpoint: cannot open directory '", dir.string(), "': ", detail::errno_text(e));
  }
  int rc;
  do rc = ::fsync(fd);
  while (rc != 0 && errno == EINTR);
  const int e = errno;
  ::close(fd);
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

// The directory a path lives in, "." for a bare name: what to sync after creating or renaming it.
inline fs::path parent_of(const fs::path& p) {
  const fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// A file written under `final + ".tmp"`, hashed as it goes, and renamed into place by commit() only
// after an fsync; a writer destroyed before commit() removes its temporary file. A file under its
// final name is therefore always complete.
class durable_writer {
 public:
  explicit durable_writer(fs::path final_path)
      : final_(std::move(final_path)), tmp_(fs::path(final_).concat(".tmp")), f_(file::create(tmp_)) {}
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

  // fsync, close, rename into place, fsync the directory.
  void commit() {
    f_.sync();
    f_.close();
    rename_path(tmp_, final_);
    committed_ = true;
    sync_directory(parent_of(final_));
  }

 private:
  fs::path final_, tmp_;
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
