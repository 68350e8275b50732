// peer_process: which process a rank is, and whether a peer on the same machine is alive, stopped or gone (/proc).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "zero/core/fixed_text.hpp"
#include "zero/core/hash.hpp"

namespace zero::comm {

// A process and the machine it runs on. `machine` identifies one kernel and PID namespace (the boot
// id and the namespace's inode), so two ranks with equal `machine` can look at each other's pid in
// /proc; hosts with the same name (containers) or different network namespaces of one host are told
// apart or recognised correctly. 0 when unknown (no /proc): such a peer is never looked up.
struct process_id {
  std::int64_t pid = 0;
  std::uint64_t machine = 0;
};

inline std::uint64_t machine_id() {
  char boot[64] = {};
  std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  if (!f) return 0;
  const std::size_t n = std::fread(boot, 1, sizeof boot - 1, f);
  std::fclose(f);
  struct stat ns {};
  if (n == 0 || ::stat("/proc/self/ns/pid", &ns) != 0) return 0;
  std::uint64_t h = fnv1a64(boot, n);
  const auto ino = static_cast<std::uint64_t>(ns.st_ino);
  h = fnv1a64(&ino, sizeof ino, h);
  return h ? h : 1;
}

inline process_id this_process() { return {static_cast<std::int64_t>(::getpid()), machine_id()}; }

enum class process_state { unknown, alive, stopped, exited };

inline const char* to_string(process_state s) {
  switch (s) {
    case process_state::unknown: return "state unknown";
    case process_state::alive: return "alive";
    case process_state::stopped: return "stopped (SIGSTOP or a debugger)";
    case process_state::exited: return "exited";
  }
  return "?";
}

// The state of process `pid` on this machine, from /proc/<pid>/stat. Async-signal-safe (open, read,
// close only), so a SIGTERM handler can say which peer is gone.
inline process_state state_of(std::int64_t pid) {
  char path[48];
  fixed_text p(path, sizeof path);
  p << "/proc/" << pid << "/stat";
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return process_state::exited;  // reaped
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return process_state::unknown;
  // "pid (comm) S ...": comm may hold spaces and parentheses, so the state follows the last ')'.
  ssize_t close_paren = -1;
  for (ssize_t i = 0; i < n; ++i)
    if (buf[i] == ')') close_paren = i;
  if (close_paren < 0 || close_paren + 2 >= n) return process_state::unknown;
  switch (buf[close_paren + 2]) {
    case 'T':
    case 't': return process_state::stopped;
    case 'Z':
    case 'X':
    case 'x': return process_state::exited;
    default: return process_state::alive;
  }
}

}  // namespace zero::comm
