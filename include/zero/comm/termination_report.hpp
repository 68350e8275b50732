// termination_report: on SIGTERM, each registered communicator writes where its rank stood, then the process dies.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace zero::comm {

// When one MPI rank dies (exit, abort, a signal), the launcher (mpirun) ends the others with SIGTERM
// while they wait in a collective. Without a report they vanish silently; with one, each says which
// collective it was in, for how long, and which of its peers on the same machine are gone or stopped.
//
// Communicators register a writer for as long as they live; the SIGTERM handler is installed only by
// an explicit guard (comm::mpi::run holds one), and only where SIGTERM still has its default action,
// so a program's own handler is never replaced. The writers run inside the handler and must be
// async-signal-safe (no allocation, no locks, no stdio): they format into fixed buffers and write(2).
namespace termination {

using writer = void (*)(const void* context, int fd, int signal);

struct entry {
  std::atomic<writer> fn{nullptr};
  std::atomic<const void*> context{nullptr};
};
inline constexpr int max_entries = 16;
inline entry entries[max_entries];
inline std::atomic<int> installs{0};

inline void handler(int sig) {
  for (auto& e : entries) {
    const writer fn = e.fn.load();
    const void* ctx = e.context.load();
    if (fn && ctx) fn(ctx, STDERR_FILENO, sig);
  }
  // Die of the same signal, so the launcher sees the real cause: with the default action restored,
  // the re-raised signal is delivered when the handler returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

// Returns a slot for unregister(), or -1 when all are taken (the communicator is then not reported).
inline int add(writer fn, const void* context) {
  for (int i = 0; i < max_entries; ++i) {
    const void* expected = nullptr;
    if (entries[i].context.compare_exchange_strong(expected, context)) {
      entries[i].fn.store(fn);
      return i;
    }
  }
  return -1;
}
inline void remove(int slot) {
  if (slot < 0 || slot >= max_entries) return;
  entries[slot].fn.store(nullptr);
  entries[slot].context.store(nullptr);
}

// Installs the SIGTERM handler for its lifetime if SIGTERM has its default action (guards nest).
class guard {
 public:
  guard() {
    struct sigaction current {};
    if (sigaction(SIGTERM, nullptr, &current) != 0) return;
    const bool ours = installs.load() > 0 && current.sa_handler == &handler;
    if (!ours && current.sa_handler != SIG_DFL) return;  // the program handles SIGTERM itself
    if (!ours) {
      struct sigaction sa {};
      sa.sa_handler = &handler;
      sigemptyset(&sa.sa_mask);
      if (sigaction(SIGTERM, &sa, nullptr) != 0) return;
    }
    installs.fetch_add(1);
    installed_ = true;
  }
  ~guard() {
    if (!installed_) return;
    if (installs.fetch_sub(1) == 1) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(SIGTERM, &dfl, nullptr);
    }
  }
  guard(const guard&) = delete;
  guard& operator=(const guard&) = delete;
  bool installed() const { return installed_; }

 private:
  bool installed_ = false;
};

}  // namespace termination
}  // namespace zero::comm
