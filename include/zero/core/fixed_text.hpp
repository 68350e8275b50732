// fixed_text: a fixed-capacity text buffer that formats without allocating, usable in a signal handler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zero {

// Appends strings, integers and fixed-point numbers into a caller-owned array and silently stops at
// its capacity. Nothing here allocates, locks or touches locale state, so the same code formats a
// collective's description in an exception message and in a SIGTERM handler (where only
// async-signal-safe functions may run).
class fixed_text {
 public:
  fixed_text(char* buf, std::size_t cap) : buf_(buf), cap_(cap) {
    if (cap_ > 0) buf_[0] = '\0';
  }

  fixed_text& operator<<(char c) {
    if (len_ + 1 < cap_) {
      buf_[len_++] = c;
      buf_[len_] = '\0';
    }
    return *this;
  }
  fixed_text& operator<<(const char* s) {
    if (!s) return *this;
    while (*s) *this << *s++;
    return *this;
  }
  fixed_text& operator<<(std::string_view s) {
    for (char c : s) *this << c;
    return *this;
  }
  fixed_text& operator<<(std::uint64_t v) {
    char digits[20];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v);
    while (n) *this << digits[--n];
    return *this;
  }
  fixed_text& operator<<(std::int64_t v) {
    if (v < 0) {
      *this << '-';
      return *this << (~static_cast<std::uint64_t>(v) + 1);
    }
    return *this << static_cast<std::uint64_t>(v);
  }
  fixed_text& operator<<(int v) { return *this << static_cast<std::int64_t>(v); }

  // ns as seconds with `decimals` digits after the point (truncated), e.g. 1234567 -> "0.001".
  fixed_text& seconds(std::int64_t ns, int decimals = 3) {
    if (ns < 0) {
      *this << '-';
      ns = -ns;
    }
    std::uint64_t unit = 1000000000;
    *this << static_cast<std::uint64_t>(ns) / unit;
    if (decimals <= 0) return *this;
    *this << '.';
    std::uint64_t frac = static_cast<std::uint64_t>(ns) % unit;
    for (int d = 0; d < decimals && d < 9; ++d) {
      unit /= 10;
      *this << static_cast<char>('0' + frac / unit);
      frac %= unit;
    }
    return *this;
  }

  const char* c_str() const { return cap_ ? buf_ : ""; }
  std::size_t size() const { return len_; }
  std::string str() const { return std::string(buf_, len_); }

 private:
  char* buf_;
  std::size_t cap_;
  std::size_t len_ = 0;
};

}  // namespace zero
