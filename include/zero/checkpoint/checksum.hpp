// Checkpoint checksums: xxHash64 (seed 0) of whole files and byte spans, written as 16 lowercase hex digits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

// Header-only use of the xxHash library: every function is inlined into the including translation
// unit, so neither the library nor the users of these headers link against libxxhash.
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace zero::checkpoint {

// Incremental XXH64 with seed 0: the checksum of every data file and of the manifest.
class xxh64_stream {
 public:
  xxh64_stream() { XXH64_reset(&state_, 0); }
  void update(const void* data, std::size_t bytes) {
    if (bytes) XXH64_update(&state_, data, bytes);
  }
  std::uint64_t digest() const { return XXH64_digest(&state_); }

 private:
  XXH64_state_t state_;
};

inline std::uint64_t xxh64(const void* data, std::size_t bytes) { return XXH64(data, bytes, 0); }

// Fixed width, lowercase: the spelling in manifests and safetensors metadata.
inline std::string to_hex(std::uint64_t h) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) s[static_cast<std::size_t>(i)] = digits[h & 0xf];
  return s;
}

// Accepts exactly 16 lowercase hex digits; anything else is a malformed checksum.
inline std::optional<std::uint64_t> from_hex(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  std::uint64_t h = 0;
  for (char c : s) {
    std::uint64_t d = 0;
    if (c >= '0' && c <= '9') d = static_cast<std::uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<std::uint64_t>(c - 'a' + 10);
    else return std::nullopt;
    h = (h << 4) | d;
  }
  return h;
}

// The position of the 16-digit value of the JSON member `"key": "<hex>"` in raw JSON text, if the
// member occurs exactly once. The manifest and the safetensors metadata carry a checksum of the
// bytes around it: the checksum is computed with those 16 characters replaced by '0'. A key can
// only be followed by ':' (a string value never is), and quotes inside strings are escaped, so the
// search cannot be fooled by a tensor or unit name.
inline std::optional<std::size_t> locate_hex_member(std::string_view text, std::string_view key) {
  const std::string quoted = std::string("\"").append(key).append("\"");
  auto is_ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  std::optional<std::size_t> found;
  int count = 0;
  for (std::size_t at = text.find(quoted); at != std::string_view::npos; at = text.find(quoted, at + 1)) {
    std::size_t i = at + quoted.size();
    while (i < text.size() && is_ws(text[i])) ++i;
    if (i >= text.size() || text[i] != ':') continue;  // a string value equal to the key, not the key
    ++count;
    ++i;
    while (i < text.size() && is_ws(text[i])) ++i;
    if (i + 18 <= text.size() && text[i] == '"' && text[i + 17] == '"') found = i + 1;
    else found.reset();
  }
  if (count != 1) return std::nullopt;
  return found;
}

// The checksum of `text` with the 16 characters at `at` taken as '0'.
inline std::uint64_t xxh64_with_zeroed(std::string_view text, std::size_t at) {
  static constexpr char zeros[16] = {'0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0', '0'};
  xxh64_stream h;
  h.update(text.data(), at);
  h.update(zeros, 16);
  h.update(text.data() + at + 16, text.size() - at - 16);
  return h.digest();
}

}  // namespace zero::checkpoint
