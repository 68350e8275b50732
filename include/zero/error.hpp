// zero::error, the one exception type of the library, and ZERO_CHECK for validating input.
#pragma once

#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace zero {

// What went wrong, so a caller can react without parsing the message.
enum class error_kind {
  invalid_argument,  // bad input: shapes, names, sizes, flags
  protocol,          // engine calls in the wrong order (gather of a released unit, step too early)
  comm,              // a collective failed, timed out, or a peer rank failed
  io,                // a file could not be read or written
  corrupt,           // data failed validation (checksum, truncated file, wrong model)
  device,            // a device runtime call failed (CUDA: launch failure, no device)
  out_of_memory,     // model states or a buffer do not fit the memory (device, or the configured budget)
};

inline const char* to_string(error_kind k) {
  switch (k) {
    case error_kind::invalid_argument: return "invalid argument";
    case error_kind::protocol: return "protocol";
    case error_kind::comm: return "comm";
    case error_kind::io: return "io";
    case error_kind::corrupt: return "corrupt";
    case error_kind::device: return "device";
    case error_kind::out_of_memory: return "out of memory";
  }
  return "unknown";
}

class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  error_kind kind() const noexcept { return kind_; }

 private:
  error_kind kind_;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws zero::error of the given kind with the streamed message parts.
template <class... Args>
[[noreturn]] void fail(error_kind kind, Args&&... args) {
  throw error(kind, detail::concat(std::forward<Args>(args)...));
}

// Any exception as a zero::error, for a program's boundary, where every failure must end in one
// message and an exit status rather than an abort: zero::error as it is, std::bad_alloc as an io
// error "out of memory", anything else as an io error naming what it was.
inline error as_error(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const error& e) {
    return e;
  } catch (const std::bad_alloc&) {
    return error(error_kind::io, "out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return error(error_kind::io, std::string("unexpected failure: ") + e.what());
  } catch (...) {
    return error(error_kind::io, "unexpected failure (an exception of unknown type)");
  }
}

}  // namespace zero

// ZERO_CHECK(cond, kind, message parts...): throws zero::error(kind, message) when cond is false.
#define ZERO_CHECK(cond, kind, ...)                        \
  do {                                                     \
    if (!(cond)) ::zero::fail(::zero::error_kind::kind, __VA_ARGS__); \
  } while (0)
