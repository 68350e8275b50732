// The files the tools name: opened without blocking or following links, outputs proved by creating, names escaped.
//
// Every file a tool names is looked at and opened without blocking (a FIFO is refused, not waited
// on) and without following a link it should not follow; every output place is proved before any
// work starts by creating something there (access(2) is no proof: root passes it everywhere). The
// same rules as the checkpoint headers' open (zero/io/posix_file.hpp), with the tools' messages.
// No CLI11 here: the example models' headers include it too.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <system_error>

#include "zero/checkpoint/printable.hpp"
#include "zero/error.hpp"
#include "zero/io/posix_file.hpp"

namespace toolcli {

// ---- text shown to the user ---------------------------------------------------------------------

// A value from the command line or a file, quoted and escaped for a message: control characters
// (a terminal's escape sequences), invalid UTF-8 and '\' become visible escapes, the length is capped.
inline std::string quote(std::string_view s) { return "'" + zero::checkpoint::printable(s, 200) + "'"; }

// A whole message at the program's boundary: newlines and tabs kept, every other control escaped.
inline std::string printable_message(std::string_view s) {
  return zero::checkpoint::printable(s, 4096, zero::checkpoint::printable_mode::message);
}

// The name a flag's messages use: the first long name of "--a,--b".
inline std::string flag_name(const std::string& names) { return names.substr(0, names.find(',')); }

// ---- files the tools name ----------------------------------------------------------------------

namespace fs = std::filesystem;

using zero::io::type_name;

// Why `text` is not an existing file of type `want` (S_IFREG or S_IFDIR) to read, or "". A link the
// user names is followed (it is the user's choice); a FIFO or device is refused before anything
// opens it (opening a FIFO blocks until a writer comes).
inline std::string input_problem(const std::string& text, mode_t want) {
  if (text.empty()) return "an empty path";
  struct stat st {};
  if (::stat(text.c_str(), &st) != 0) return quote(text) + ": " + std::strerror(errno);
  if ((st.st_mode & S_IFMT) != want) return quote(text) + " is " + type_name(st.st_mode) + ", not " + type_name(want);
  if (::access(text.c_str(), R_OK) != 0) return quote(text) + " is not readable (" + std::strerror(errno) + ")";
  return "";
}

// Opens an existing regular file for reading: never blocking (O_NONBLOCK: a FIFO swapped in after
// the look is refused, not waited on), its type checked on the descriptor, its size at most
// max_bytes (`limit` says what sets that bound). Failures are zero::error naming `what` and the path.
inline int open_input(const std::string& what, const std::string& path, std::uint64_t max_bytes,
                      std::uint64_t* size = nullptr, const std::string& limit = "this tool reads") {
  int fd;
  do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int e = errno;
    zero::fail(zero::error_kind::io, what, ": cannot open ", quote(path), ": ", std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t m = st.st_mode;
    ::close(fd);
    zero::fail(zero::error_kind::io, what, ": ", quote(path), " is ", type_name(m), ", not a regular file");
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    zero::fail(zero::error_kind::invalid_argument, what, ": ", quote(path), " has ", st.st_size,
               " bytes, more than the ", max_bytes, " bytes ", limit);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (size) *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

// Appends a regular file opened by open_input to `out`, read in bounded chunks: at most max_bytes,
// even if the file grows while it is read. Returns the bytes read.
inline std::uint64_t append_input(const std::string& what, const std::string& path, std::uint64_t max_bytes,
                                  std::string& out, const std::string& limit = "this tool reads") {
  std::uint64_t size = 0;
  const int fd = open_input(what, path, max_bytes, &size, limit);
  const std::size_t start = out.size();
  try {
    out.reserve(start + static_cast<std::size_t>(size));
    char buf[1 << 16];
    while (true) {
      const ssize_t got = ::read(fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        const int e = errno;
        zero::fail(zero::error_kind::io, what, ": cannot read ", quote(path), ": ", std::strerror(e));
      }
      if (got == 0) break;
      if (out.size() - start + static_cast<std::size_t>(got) > max_bytes)
        zero::fail(zero::error_kind::invalid_argument, what, ": ", quote(path), " grew past the ", max_bytes, " bytes ",
                   limit, " while it was read");
      out.append(buf, static_cast<std::size_t>(got));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out.size() - start;
}

// The whole of a small regular file (see append_input).
inline std::string read_input(const std::string& what, const std::string& path, std::uint64_t max_bytes) {
  std::string out;
  append_input(what, path, max_bytes, out);
  return out;
}

// 64 bits nobody can predict: the name of a probe file nobody can prepare a link for.
inline std::string unpredictable_hex() {
  std::random_device rd;
  const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Why nothing can be created in the existing directory `dir`, or "": proved by creating (O_EXCL,
// never through a link) and removing a probe file there. access(2) is not proof: root passes it
// everywhere, and /proc or a read-only mount refuse what it allows.
inline std::string cannot_create_in(const fs::path& dir) {
  const fs::path probe = dir / (".zero-probe-" + unpredictable_hex());
  int fd;
  do fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return "nothing can be created in " + quote(dir.string()) + " (" + std::strerror(errno) + ")";
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

// The nearest existing ancestor of a path that does not exist ("." for a relative one).
inline fs::path nearest_existing(fs::path p) {
  std::error_code ec;
  while (true) {
    p = p.has_relative_path() ? p.parent_path() : p;
    if (p.empty()) return ".";
    if (fs::exists(fs::symlink_status(p, ec))) return p;
    if (!p.has_relative_path()) return p;  // the root
  }
}

// A directory to write into, created with its parents if missing (the proof that it can be), and a
// probe file created in it. `is_leaf_problem` may refuse an existing directory for the caller's
// own reason (it is given the path and returns the reason, or "").
template <class LeafCheck>
std::string output_directory_problem(const std::string& text, const char* empty, LeafCheck&& is_leaf_problem) {
  if (text.empty()) return empty;
  const fs::path p = text;
  std::error_code ec;
  const auto st = fs::status(p, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) return quote(text) + " exists and is not a directory";
    if (std::string why = is_leaf_problem(p); !why.empty()) return why;
    return cannot_create_in(p);
  }
  if (fs::exists(fs::symlink_status(p, ec))) return quote(text) + " is a symbolic link to nothing";
  const fs::path base = nearest_existing(p);
  if (!fs::is_directory(base, ec)) return quote(base.string()) + " is not a directory";
  fs::create_directories(p, ec);
  if (ec) return "cannot create the directory " + quote(text) + " (" + ec.message() + ")";
  return cannot_create_in(p);
}

// The name of a checkpoint version's manifest (zero::checkpoint::manifest_name, which the trainers
// check equal): spelled out here for the tools that build without the checkpoint headers.
inline constexpr std::string_view checkpoint_manifest = "manifest.json";

// A --save directory of checkpoint versions: created with its parents now, not at the first save
// after hours of training; one version directory itself is refused (save into its parent).
inline std::string save_directory_problem(const std::string& text) {
  return output_directory_problem(
      text, "an empty path; give the directory to save checkpoints into", [&](const fs::path& p) {
        std::error_code ec;
        if (fs::exists(p / checkpoint_manifest, ec))
          return quote(text) + " is one checkpoint version (it holds " + std::string(checkpoint_manifest) +
                 "); save into a directory of versions (for example its parent)";
        return std::string();
      });
}

// A file to be written into an existing directory: why it cannot be, or "". An existing file of
// another type (a FIFO, a device) is refused; so is a symbolic link unless `links_ok`.
inline std::string output_file_problem(const std::string& text, const char* empty, bool links_ok = true) {
  if (text.empty()) return empty;
  const fs::path p = text;
  std::error_code ec;
  if (!links_ok && fs::is_symlink(fs::symlink_status(p, ec)))
    return quote(text) + " is a symbolic link, which is not followed here; name the file itself";
  const auto st = fs::status(p, ec);
  if (fs::is_directory(st) || !p.has_filename()) return quote(text) + " is a directory; give a file name";
  if (fs::exists(st) && !fs::is_regular_file(st))
    return quote(text) + " exists and is not a regular file (it would be replaced)";
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const auto pst = fs::status(parent, ec);
  if (!fs::exists(pst)) return "the directory " + quote(parent.string()) + " does not exist";
  if (!fs::is_directory(pst)) return quote(parent.string()) + " is not a directory";
  if (std::string why = cannot_create_in(parent); !why.empty()) return "cannot create " + quote(text) + ": " + why;
  return "";
}

// How a tool's log (or any append-only record) is opened.
enum class log_mode {
  fresh,      // a new run: the file must not exist or be empty
  append,     // a resumed run: what is there stays, the new lines follow it
  overwrite,  // asked for: what is there is discarded
};

// Opens (creating if missing) a log file without following a symbolic link (a dangling link's
// target is never created), without blocking (a FIFO is refused), only a regular file, then
// according to `mode`. Failures are zero::error (io) naming `what` and the path.
inline int open_log(const std::string& what, const std::string& path, log_mode mode) {
  int fd;
  do fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0644);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int e = errno;
    zero::fail(zero::error_kind::io, what, ": cannot open ", quote(path), ": ",
               e == ELOOP ? "it is a symbolic link (not followed: name the file itself)" : std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t m = st.st_mode;
    ::close(fd);
    zero::fail(zero::error_kind::io, what, ": ", quote(path), " is ", type_name(m), ", not a regular file");
  }
  if (mode == log_mode::fresh && st.st_size > 0) {
    ::close(fd);
    zero::fail(zero::error_kind::io, what, ": ", quote(path), " already holds ", st.st_size,
               " bytes of another run; a new run neither mixes into it nor discards it");
  }
  if (mode == log_mode::overwrite && ::ftruncate(fd, 0) != 0) {
    const int e = errno;
    ::close(fd);
    zero::fail(zero::error_kind::io, what, ": cannot truncate ", quote(path), ": ", std::strerror(e));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace toolcli
