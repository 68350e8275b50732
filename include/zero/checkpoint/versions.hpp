// Checkpoint version directories: their names, which one is the checkpoint, and its data files, opened and verified.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/checkpoint/checksum.hpp"
#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/printable.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

// The largest version number: "v-" and 18 digits is the widest name a reader accepts, so a save
// never commits a version that readers would not see.
inline constexpr std::uint64_t max_version = 999'999'999'999'999'999;

// A checkpoint directory holds version directories "v-<number>"; each is complete once its
// manifest.json exists. The newest complete one is the checkpoint.
inline std::string version_name(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "v-%08llu", static_cast<unsigned long long>(v));
  return buf;
}
inline std::optional<std::uint64_t> parse_version_name(std::string_view n) {
  // At most 18 digits (max_version): every such number fits in 64 bits without overflow.
  if (n.size() < 3 || n.size() > 20 || n.substr(0, 2) != "v-") return std::nullopt;
  std::uint64_t v = 0;
  for (char c : n.substr(2)) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  // Only the spelling version_name() writes: every rank rebuilds the name from the number.
  if (version_name(v) != n) return std::nullopt;
  return v;
}
// "v-" and more digits than a reader accepts, without a leading zero: a version written by
// something else that this library cannot number, so it must not be passed over as if absent.
inline bool too_wide_version_name(std::string_view n) {
  if (n.size() <= 20 || n.substr(0, 2) != "v-" || n[2] == '0') return false;
  return std::all_of(n.begin() + 2, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}
inline std::string data_file_name(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.bin", rank, world);
  return buf;
}

struct version_entry {
  std::uint64_t number = 0;  // for a name too wide to number: the largest uint64
  fs::path path;
  bool committed = false;  // holds an entry named manifest.json
  // Why this version cannot be read, when it cannot: a symbolic link or a file rather than a
  // directory (never followed, never removed), a directory that cannot be searched, a number too
  // wide. Empty for a real directory whose state is known.
  std::string problem;
};

// Everything under dir named like a version, oldest first, looked at without following links.
inline std::vector<version_entry> list_versions(const fs::path& dir) {
  std::vector<version_entry> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  ZERO_CHECK(!ec, io, "checkpoint: cannot list '", dir.string(), "': ", ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    version_entry v;
    v.path = it->path();
    if (const auto n = parse_version_name(name)) {
      v.number = *n;
    } else if (too_wide_version_name(name)) {
      v.number = std::numeric_limits<std::uint64_t>::max();
      v.problem = "has a number wider than the 18 digits this library reads";
      out.push_back(std::move(v));
      continue;
    } else {
      continue;
    }
    struct stat st {};
    if (::lstat(v.path.c_str(), &st) != 0) {
      const int e = errno;
      if (e == ENOENT) continue;  // removed while listing
      v.problem = "cannot be inspected: " + detail::errno_text(e);
    } else if (!S_ISDIR(st.st_mode)) {
      v.problem = std::string("is ") + detail::type_name(st.st_mode) + ", not a directory (not followed)";
    } else if (::lstat((v.path / manifest_name).c_str(), &st) == 0) {
      v.committed = true;
    } else if (const int e = errno; e != ENOENT) {
      v.problem = "cannot be inspected: " + detail::errno_text(e);
    }
    out.push_back(std::move(v));
  }
  ZERO_CHECK(!ec, io, "checkpoint: cannot list '", dir.string(), "': ", ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.number < b.number; });
  return out;
}

// The version directory `dir` names: dir itself when it holds a manifest.json (one version, passed
// directly), else its newest committed version. Never an older one when something newer exists
// that cannot be read: that is reported, not passed over (a version that merely lacks its
// manifest is an interrupted save, and is passed over).
inline fs::path resolve(const fs::path& dir) {
  std::error_code ec;
  ZERO_CHECK(fs::is_directory(dir, ec), io, "checkpoint: '", dir.string(), "' does not exist or is not a directory");
  struct stat st {};
  if (::lstat((dir / manifest_name).c_str(), &st) == 0) return dir;
  if (const int e = errno; e != ENOENT)
    fail(error_kind::io, "checkpoint: cannot inspect '", (dir / manifest_name).string(), "': ", detail::errno_text(e));
  const auto versions = list_versions(dir);
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (!it->problem.empty())
      fail(error_kind::io, "checkpoint: '", dir.string(), "': the newest version ",
           quote_name(it->path.filename().string()), " ", it->problem,
           "; not falling back to an older version (name an older version directory to load it)");
    if (it->committed) return it->path;
  }
  fail(error_kind::io, "checkpoint: '", dir.string(), "' holds no committed checkpoint (no v-*/", manifest_name,
       versions.empty() ? ")" : "; the versions there are incomplete saves)");
}

namespace detail {

// Opens a data file and checks its size against the manifest.
inline file open_sized(const fs::path& vdir, const file_entry& f) {
  file fd = file::open_read(vdir / f.name);
  const std::uint64_t size = fd.size();
  ZERO_CHECK(size == f.bytes, corrupt, "checkpoint: '", fd.path().string(), "' has ", size,
             " bytes, the manifest says ", f.bytes, size < f.bytes ? " (truncated)" : " (extended)");
  return fd;
}

// Opens a data file and checks its size and checksum against the manifest before anything in it is used.
inline file open_verified(const fs::path& vdir, const file_entry& f) {
  file fd = open_sized(vdir, f);
  const std::uint64_t size = f.bytes;
  const std::uint64_t h = hash_file(fd, size);
  ZERO_CHECK(h == f.xxh64, corrupt, "checkpoint: '", fd.path().string(), "': checksum mismatch (the manifest says ",
             to_hex(f.xxh64), ", the file hashes to ", to_hex(h), "): the file is damaged");
  return fd;
}

// The data files of one version, each verified (size and checksum) the first time it is used. At
// most max_open stay open at once: a checkpoint saved by thousands of ranks must not exhaust the
// descriptors of a reader that needs all of their files.
class data_files {
 public:
  static constexpr std::size_t max_open = 64;
  data_files(fs::path vdir, const std::vector<file_entry>& entries)
      : vdir_(std::move(vdir)), entries_(&entries), verified_(entries.size(), false) {}

  const file& get(std::size_t i) {
    if (auto it = open_.find(i); it != open_.end()) return it->second;
    if (open_.size() >= max_open) open_.erase(open_.begin());
    const file_entry& f = (*entries_)[i];
    file fd;
    if (verified_[i]) {
      // Reopened after verification: the size at least must still be what was verified.
      fd = file::open_read(vdir_ / f.name);
      ZERO_CHECK(fd.size() == f.bytes, corrupt, "checkpoint: '", fd.path().string(), "' changed while being read");
    } else {
      fd = open_verified(vdir_, f);
      verified_[i] = true;
    }
    return open_.emplace(i, std::move(fd)).first->second;
  }
  void verify(std::size_t i) { (void)get(i); }
  // Verifies the files `which` lists: first every size (a stat each), then every checksum, so a
  // file of the wrong size is reported at once rather than after hashing all the others.
  void verify(const std::vector<std::size_t>& which) {
    for (std::size_t i : which) (void)open_sized(vdir_, (*entries_)[i]);
    for (std::size_t i : which) verify(i);
  }
  void verify_all() {
    std::vector<std::size_t> all(entries_->size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    verify(all);
  }

 private:
  fs::path vdir_;
  const std::vector<file_entry>* entries_;
  std::vector<bool> verified_;
  std::map<std::size_t, file> open_;
};

}  // namespace detail

// Reads and validates the manifest of the checkpoint `dir` names (see resolve()).
inline manifest read_manifest(const fs::path& dir) {
  const fs::path p = resolve(dir) / manifest_name;
  return parse_manifest(read_small_file(p, max_manifest_bytes), p.string());
}

}  // namespace zero::checkpoint
