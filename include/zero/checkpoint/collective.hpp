// The few collectives a checkpoint needs, in doubles through the backend's own memory space, and the
// agreement step that makes every rank of a save or load succeed or fail together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "zero/concepts/comm_backend.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint::detail {

// A host-side vector of doubles moved through a buffer of Comm::system, since a device backend
// cannot read host memory in its collectives.
template <CommBackend Comm>
class wire {
 public:
  using system = typename Comm::system;
  explicit wire(std::size_t n) : n_(n), p_(static_cast<double*>(system::allocate(n * sizeof(double)))) {}
  wire(const wire&) = delete;
  wire& operator=(const wire&) = delete;
  ~wire() { system::deallocate(p_, n_ * sizeof(double)); }
  double* data() { return p_; }
  void put(const double* host, std::size_t n, std::size_t at = 0) { system::copy(p_ + at, host, n * sizeof(double)); }
  void get(double* host, std::size_t n, std::size_t at = 0) const { system::copy(host, p_ + at, n * sizeof(double)); }

 private:
  std::size_t n_;
  double* p_;
};

template <CommBackend Comm>
void broadcast(Comm& comm, std::vector<double>& v, int root) {
  wire<Comm> w(v.size());
  w.put(v.data(), v.size());
  comm.broadcast(w.data(), w.data(), v.size(), root);
  w.get(v.data(), v.size());
}

// Every rank's `mine` (all of one length), concatenated in rank order.
template <CommBackend Comm>
std::vector<double> all_gather(Comm& comm, const std::vector<double>& mine) {
  const std::size_t n = mine.size(), ranks = static_cast<std::size_t>(comm.size());
  wire<Comm> w(n * ranks);
  w.put(mine.data(), n, n * static_cast<std::size_t>(comm.rank()));
  comm.all_gather(w.data() + n * static_cast<std::size_t>(comm.rank()), w.data(), n);
  std::vector<double> all(n * ranks);
  w.get(all.data(), all.size());
  return all;
}

// 64-bit values (checksums, sizes) travel as two doubles of 32 bits each: exact, whatever the value.
inline void put_u64(std::vector<double>& v, std::size_t at, std::uint64_t x) {
  v[at] = static_cast<double>(x >> 32);
  v[at + 1] = static_cast<double>(x & 0xffffffffu);
}
inline std::uint64_t get_u64(const std::vector<double>& v, std::size_t at) {
  return (static_cast<std::uint64_t>(v[at]) << 32) | static_cast<std::uint64_t>(v[at + 1]);
}

// What one rank's part of a phase came to: its exception, if any, and the kind and text to tell the others.
struct outcome {
  std::exception_ptr error;
  error_kind kind = error_kind::io;
  std::string message;
};

template <class F>
outcome attempt(F&& f) {
  outcome o;
  try {
    f();
  } catch (const zero::error& e) {
    o.error = std::current_exception();
    o.kind = e.kind();
    o.message = e.what();
  } catch (const std::exception& e) {
    o.error = std::current_exception();
    o.message = e.what();
  } catch (...) {
    o.error = std::current_exception();
    o.message = "unknown exception";
  }
  return o;
}

// An outcome on the wire: [0 for success or 1 + error_kind, message length, the message's first
// bytes packed 4 to a double]. Every rank then throws with the cause, not just "rank r failed".
inline constexpr std::size_t message_bytes = 400;
inline constexpr std::size_t status_doubles = 2 + message_bytes / 4;

inline void encode(const outcome& o, double* out) {
  for (std::size_t i = 0; i < status_doubles; ++i) out[i] = 0.0;
  if (!o.error) return;
  out[0] = 1.0 + static_cast<double>(static_cast<int>(o.kind));
  const std::size_t n = o.message.size() < message_bytes ? o.message.size() : message_bytes;
  out[1] = static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto byte = static_cast<std::uint32_t>(static_cast<unsigned char>(o.message[i]));
    const std::uint32_t word = static_cast<std::uint32_t>(out[2 + i / 4]) | (byte << (8 * (i % 4)));
    out[2 + i / 4] = static_cast<double>(word);
  }
}

// Ends a phase on every rank alike: a rank that failed rethrows its own error; the others throw the
// first failed rank's kind and message, so no rank goes on to a collective the others never reach.
// `all` holds one status block per rank, `stride` doubles apart.
inline void settle(const outcome& mine, const std::vector<double>& all, std::size_t stride, const char* what) {
  if (mine.error) std::rethrow_exception(mine.error);
  for (std::size_t r = 0; r * stride < all.size(); ++r) {
    const double* s = all.data() + r * stride;
    if (s[0] == 0.0) continue;
    std::string text;
    const auto n = static_cast<std::size_t>(s[1]);
    for (std::size_t i = 0; i < n && i < message_bytes; ++i)
      text += static_cast<char>((static_cast<std::uint32_t>(s[2 + i / 4]) >> (8 * (i % 4))) & 0xffu);
    fail(static_cast<error_kind>(static_cast<int>(s[0]) - 1), text, n >= message_bytes ? "..." : "", " (checkpoint ",
         what, " failed on rank ", r, ")");
  }
}

// Agreement on one outcome per rank; the result is the same on every rank.
template <CommBackend Comm>
void agree(Comm& comm, const outcome& mine, const char* what) {
  std::vector<double> block(status_doubles);
  encode(mine, block.data());
  settle(mine, all_gather(comm, block), status_doubles, what);
}

}  // namespace zero::checkpoint::detail
