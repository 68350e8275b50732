// Durable files for checkpoints over the POSIX layer (zero/io/posix_file.hpp): atomic writes, tree removal, hashing.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/checkpoint/checksum.hpp"
#include "zero/error.hpp"
#include "zero/io/posix_file.hpp"

namespace zero::checkpoint {

// Data files hold raw little-endian float32; on a little-endian host that is the memory image, so
// bytes go to and from disk without conversion.
static_assert(std::endian::native == std::endian::little,
              "zero checkpoints store little-endian float32: a big-endian host would need byte swapping");
static_assert(sizeof(float) == 4, "checkpoints store IEEE-754 binary32 values");

namespace fs = std::filesystem;

// Entries inside a checkpoint (manifest, data files, version directories) are opened with
// symlinks::refuse; a path the caller names itself (an output file, a directory to sync) is the
// caller's choice.
using io::symlinks;

namespace detail {

using io::errno_text;
using io::type_name;

// What opens every message of the checkpoint's file operations.
inline constexpr std::string_view io_prefix = "checkpoint: ";

// Elements of master weights and optimizer slots staged at once by save and load (4 MiB per array):
// the host memory a checkpoint takes, whatever the units' sizes.
inline constexpr std::size_t state_chunk_elements = std::size_t{1} << 20;

// The address, offset and size a block written past the page cache (O_DIRECT) is a multiple of: the
// logical block of every common device, and the page.
inline constexpr std::size_t direct_io_alignment = 4096;

// A staging buffer of `count` floats at an address aligned for writes past the page cache.
class aligned_floats {
 public:
  explicit aligned_floats(std::size_t count)
      : p_(static_cast<float*>(std::aligned_alloc(
            direct_io_alignment,
            (count * sizeof(float) + direct_io_alignment - 1) / direct_io_alignment * direct_io_alignment))),
        count_(count) {
    if (!p_) throw std::bad_alloc();
  }
  aligned_floats(const aligned_floats&) = delete;
  aligned_floats& operator=(const aligned_floats&) = delete;
  ~aligned_floats() { std::free(p_); }
  float* data() const { return p_; }
  std::size_t size() const { return count_; }

 private:
  float* p_;
  std::size_t count_;
};

// Bytes hashed at once by hash_file: a bounded buffer whatever the file's size.
inline constexpr std::size_t hash_chunk = std::size_t{1} << 20;

}  // namespace detail

// A file of a checkpoint: the POSIX layer's descriptor, named by its path in every message.
class file : public io::posix_file {
 public:
  file() = default;
  file(int fd, fs::path path) : posix_file(fd, io::path_label(detail::io_prefix, path)), path_(std::move(path)) {}

  // An existing regular file, for reading (see io::open_existing).
  static file open_read(const fs::path& p, symlinks links = symlinks::refuse) {
    return file(io::open_existing(p, O_RDONLY, S_IFREG, links, "for reading", detail::io_prefix), p);
  }
  // An existing directory, to sync it or to work inside it.
  static file open_directory(const fs::path& p, symlinks links = symlinks::follow) {
    return file(io::open_existing(p, O_RDONLY, S_IFDIR, links, "as a directory", detail::io_prefix), p);
  }
  // A new file: O_EXCL, so nothing that exists under that name (a file, or a symbolic link planted
  // to redirect the write) is ever opened, truncated or written through.
  static file create_new(const fs::path& p) {
    const int fd = io::create_exclusive(p);
    if (fd < 0) fail_create(p, -fd);
    return file(fd, p);
  }
  [[noreturn]] static void fail_create(const fs::path& p, int e) { io::fail_create(p, e, detail::io_prefix); }

  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Makes the entries of a directory (files created or renamed in it) durable.
inline void sync_directory(const fs::path& dir) { io::sync_directory(dir, detail::io_prefix); }

inline void rename_path(const fs::path& from, const fs::path& to) { io::rename_path(from, to, detail::io_prefix); }

// Renames `from` to `to` only if nothing exists under `to`, atomically.
inline void rename_no_replace(const fs::path& from, const fs::path& to) {
  io::rename_no_replace(from, to, detail::io_prefix);
}

using io::parent_of;

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
      const int fd = io::create_exclusive(tmp_);
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
    std::size_t done = 0;
    if (direct_) {
      if (direct_block(data, bytes)) done = f_.pwrite_until_refused(data, bytes, bytes_);
      direct_bytes_ += done;
      if (done < bytes) direct_ = f_.set_direct(false);  // the rest through the page cache
    }
    if (done < bytes) f_.pwrite_all(static_cast<const unsigned char*>(data) + done, bytes - done, bytes_ + done);
    hash_.update(data, bytes);
    bytes_ += bytes;
  }
  // From here on, write() sends each block given at an address, file offset and size that are
  // multiples of direct_alignment from the caller's memory to the device (O_DIRECT), where the file
  // system allows it; the first other block, or one the device refuses, goes through the page cache,
  // and so does everything after it. Why: a large file written beside training (an asynchronous
  // save's data file) costs, through the page cache, a copy of every byte and the kernel's writeback:
  // CPU time and memory bandwidth that the training threads pay for. Whether it is on.
  bool bypass_page_cache() {
    direct_ = f_.set_direct(true);
    return direct_;
  }
  // The bytes that went past the page cache (bypass_page_cache).
  std::uint64_t direct_bytes() const { return direct_bytes_; }
  static constexpr std::size_t direct_alignment = detail::direct_io_alignment;
  // Bytes outside the running checksum (a header that will carry the checksum of what follows it).
  void write_unhashed(const void* data, std::size_t bytes) {
    if (direct_) direct_ = f_.set_direct(false);
    f_.pwrite_all(data, bytes, bytes_);
    bytes_ += bytes;
  }
  // Replaces bytes already written (a checksum placeholder), before commit().
  void overwrite(const void* data, std::size_t bytes, std::uint64_t offset) {
    if (direct_) direct_ = f_.set_direct(false);
    f_.pwrite_all(data, bytes, offset);
  }

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
  bool direct_block(const void* data, std::size_t bytes) const {
    return reinterpret_cast<std::uintptr_t>(data) % direct_alignment == 0 && bytes_ % direct_alignment == 0 &&
           bytes % direct_alignment == 0;
  }

  fs::path final_, tmp_;
  existing_file existing_;
  file f_;
  xxh64_stream hash_;
  std::uint64_t bytes_ = 0, direct_bytes_ = 0;
  bool committed_ = false;
  bool direct_ = false;
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
  std::vector<unsigned char> chunk(static_cast<std::size_t>(bytes < detail::hash_chunk ? bytes : detail::hash_chunk));
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
