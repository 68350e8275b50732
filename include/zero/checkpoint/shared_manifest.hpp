// A manifest parsed once per process: ranks that are threads of one process share one parse of one file.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/versions.hpp"

namespace zero::checkpoint {

namespace detail {

// Parsing builds a document several times the size of the text; N thread-ranks each parsing the
// same manifest would need N of them at once. Instead the first rank to ask parses it and the
// others wait for, and share, its result, for as long as any of them holds it. A file is known by
// its identity on the open descriptor (device, inode, size, modification and change times): a
// manifest replaced or rewritten is a different file and is parsed afresh.
class manifest_registry {
 public:
  static manifest_registry& instance() {
    static manifest_registry r;
    return r;
  }

  std::shared_ptr<const manifest> get(const fs::path& path) {
    file f = file::open_read(path);
    struct stat st {};
    if (::fstat(f.fd(), &st) != 0) {
      const int e = errno;
      fail(error_kind::io, "checkpoint: cannot stat '", path.string(), "': ", errno_text(e));
    }
    const key k{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec,
                st.st_ctim.tv_nsec};
    const std::shared_ptr<slot> s = take(k);
    // Given back after the slot's own lock is released (destroyed in reverse order).
    const struct giver {
      manifest_registry& r;
      slot& s;
      ~giver() { r.give_back(s); }
    } give{*this, *s};
    std::lock_guard<std::mutex> lock(s->mutex);
    if (s->error) std::rethrow_exception(s->error);
    if (auto held = s->value.lock()) return held;
    try {
      const std::uint64_t n = f.size();
      ZERO_CHECK(n <= max_manifest_bytes, corrupt, "checkpoint: '", path.string(), "' has ", n,
                 " bytes, more than the ", max_manifest_bytes, " a manifest may have");
      std::string text(static_cast<std::size_t>(n), '\0');
      f.pread_exact(text.data(), text.size(), 0);
      ++parses_;
      auto parsed = std::make_shared<const manifest>(parse_manifest(text, path.string()));
      s->value = parsed;
      return parsed;
    } catch (const zero::error& e) {
      if (e.kind() == error_kind::corrupt) s->error = std::current_exception();
      throw;
    }
  }

  // How many manifests this process has parsed through the registry (tests watch it).
  std::size_t parses() const { return parses_.load(); }

 private:
  using key = std::tuple<dev_t, ino_t, off_t, time_t, long, time_t, long>;
  struct slot {
    std::mutex mutex;                  // guards value and error
    std::weak_ptr<const manifest> value;
    std::exception_ptr error;
    int users = 0;                     // ranks inside get() for this file; guarded by the registry's mutex_
  };

  // The slot for file `k`, counted as in use. Entries nobody uses any more go first: no rank inside
  // get() for them and no parse result still held. A failed parse stays (its error is small), so
  // that every rank reports it without parsing again. The user count, not shared_ptr::use_count(),
  // decides: a count read without the lock that orders its changes is a data race.
  std::shared_ptr<slot> take(const key& k) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      bool unused = false;
      if (it->second->users == 0) {
        // Nobody holds this slot's lock: users == 0 and a new user must first pass mutex_.
        std::lock_guard<std::mutex> slot_lock(it->second->mutex);
        unused = !it->second->error && it->second->value.expired();
      }
      it = unused ? slots_.erase(it) : std::next(it);
    }
    auto& entry = slots_[k];
    if (!entry) entry = std::make_shared<slot>();
    ++entry->users;
    return entry;
  }

  void give_back(slot& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    --s.users;
  }
  std::mutex mutex_;
  std::map<key, std::shared_ptr<slot>> slots_;
  std::atomic<std::size_t> parses_{0};
};

}  // namespace detail

// The validated manifest at `path` (a version directory's manifest.json), parsed once per process
// however many thread-ranks ask for it at the same time.
inline std::shared_ptr<const manifest> read_manifest_shared(const fs::path& path) {
  return detail::manifest_registry::instance().get(path);
}

}  // namespace zero::checkpoint
