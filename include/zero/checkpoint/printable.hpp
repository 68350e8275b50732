// Text that came from a file, made safe to print: control characters and invalid UTF-8 escaped, length capped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace zero::checkpoint {

enum class printable_mode {
  name,     // a name from a file, quoted in a message: every control character and '\' escaped
  message,  // a whole message at a program's boundary: newlines and tabs kept, '\' kept as it is
};

// `s` as it may reach a terminal or a log: printable ASCII and valid UTF-8 stay as they are;
// control characters (C0, DEL, C1), bidirectional-text controls and bytes that are not valid UTF-8
// become \xHH or \u{HHHH}, so no escape sequence from a manifest or header can drive a terminal.
// At most max_bytes of s are shown, then "..." and the number of bytes left out: a hostile 100 MB
// name must not become a 100 MB message.
inline std::string printable(std::string_view s, std::size_t max_bytes = 200, printable_mode mode = printable_mode::name) {
  std::string out;
  out.reserve(s.size() < max_bytes ? s.size() : max_bytes);
  auto hex_byte = [&](unsigned char c) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02X", static_cast<unsigned>(c));
    out += b;
  };
  std::size_t i = 0;
  while (i < s.size()) {
    if (i >= max_bytes) {
      out += "...(" + std::to_string(s.size() - i) + " more bytes)";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      const bool keep = (c >= 0x20 && c < 0x7f && (c != '\\' || mode == printable_mode::message)) ||
                        (mode == printable_mode::message && (c == '\n' || c == '\t'));
      if (keep) out += static_cast<char>(c);
      else if (c == '\\') out += "\\\\";
      else hex_byte(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then the rules of RFC 3629 (no overlong
    // forms, no surrogates, nothing above U+10FFFF).
    std::size_t len = 0;
    std::uint32_t cp = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1Fu;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0Fu, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07u, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    bool valid = len > 0 && i + len <= s.size();
    for (std::size_t k = 1; valid && k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) valid = false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if (!valid) {
      hex_byte(c);
      ++i;
      continue;
    }
    // C1 controls, and the characters that reorder text on screen (a name could hide what follows).
    const bool control = cp <= 0x9F || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
                         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
    if (control) {
      char b[16];
      std::snprintf(b, sizeof b, "\\u{%04X}", static_cast<unsigned>(cp));
      out += b;
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

// A name from a file, between single quotes and escaped, for a message.
inline std::string quote_name(std::string_view name) { return "'" + printable(name, 120) + "'"; }

}  // namespace zero::checkpoint
