// The safetensors format: building a header for streamed writing, and a strict parser for reading one back.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <set>
#include <string_view>
#include <vector>

#include "zero/checkpoint/bounded_json.hpp"
#include "zero/checkpoint/checksum.hpp"
#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/printable.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint::safetensors {

// Limits of the reference implementation: a header beyond 100 MB is refused there too.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
// Metadata member (a string, as all metadata) with the XXH64 of the data buffer that follows the
// header; zero_export writes it, a reader that knows it can verify the data.
inline constexpr std::string_view data_checksum_key = "zero.data_xxh64";

struct tensor_info {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data buffer
};

struct header {
  std::vector<tensor_info> tensors;  // in the order of their data
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  // 8 + header length
  std::uint64_t data_bytes = 0;
};

// Bytes per element of the dtypes the format defines; nullopt for an unknown one.
inline std::optional<std::uint64_t> dtype_size(std::string_view d) {
  static const std::map<std::string_view, std::uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(d);
  if (it == sizes.end()) return std::nullopt;
  return it->second;
}

// The header text for tensors laid out back to back in the given order: __metadata__ first, then
// each tensor; padded with spaces so the data buffer starts at a multiple of 8 bytes. Refused
// (before it grows further) when it would be longer than max_header_bytes: a file this library
// writes is always one its own reader, and the reference implementation, accept.
struct planned_tensor {
  std::string name;
  std::vector<std::uint64_t> shape;
};
inline std::string make_header(const std::vector<planned_tensor>& tensors,
                               const std::vector<std::pair<std::string, std::string>>& metadata) {
  using ojson = nlohmann::ordered_json;
  auto dump = [](const ojson& v) {
    try {
      return v.dump(-1, ' ', false, ojson::error_handler_t::strict);
    } catch (const nlohmann::json::exception& e) {
      fail(error_kind::invalid_argument, "safetensors: the header cannot be written as JSON (", e.what(),
           "); tensor names must be valid UTF-8");
    }
  };
  // The names alone may already be too long: refused before anything is built.
  std::uint64_t names = 0;
  for (const auto& t : tensors) names += t.name.size();
  ZERO_CHECK(names <= max_header_bytes, invalid_argument, "safetensors: the names of ", tensors.size(),
             " tensors take ", names, " bytes, more than the ", max_header_bytes, " bytes of header a reader accepts");
  std::string text = "{";
  auto append = [&](const std::string& member) {
    // 7: the closing brace and at most 6 spaces of padding.
    if (text.size() + 1 + member.size() + 7 > max_header_bytes)
      fail(error_kind::invalid_argument, "safetensors: the header of ", tensors.size(), " tensors would exceed the ",
           max_header_bytes, " bytes a reader accepts (names too long or too many tensors)");
    if (text.size() > 1) text += ',';
    text += member;
  };
  if (!metadata.empty()) {
    ojson meta = ojson::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    append("\"__metadata__\":" + dump(meta));
  }
  std::set<std::string_view> seen;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    ZERO_CHECK(t.name != "__metadata__" && seen.insert(t.name).second, invalid_argument, "safetensors: tensor name '",
               printable(t.name), "' is reserved or not unique");
    std::uint64_t n = 1;
    for (auto d : t.shape) n *= d;
    append(dump(ojson(t.name)) + ":" +
           dump(ojson{{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + 4 * n}}}));
    at += 4 * n;
  }
  text += '}';
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  return text;
}

// Parses and validates a header: `bytes` holds at least the 8-byte length and the header (the rest of
// the file may follow), `file_size` is the size of the whole file. Every problem is a zero::error
// (kind corrupt) naming `source`; nothing in a damaged file can crash the parser.
inline header parse_header(std::string_view bytes, std::uint64_t file_size, const std::string& source) {
  auto bad = [&](const auto&... what) { fail(error_kind::corrupt, "safetensors: '", source, "': ", what...); };
  if (bytes.size() < 8 || file_size < 8) bad("shorter than the 8-byte header length");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian, as the host (asserted in file_io.hpp)
  if (n > max_header_bytes) bad("header length ", n, " exceeds the limit of ", max_header_bytes, " bytes");
  if (n < 2 || 8 + n > file_size) bad("header length ", n, " does not fit in a file of ", file_size, " bytes");
  if (bytes.size() < 8 + n) bad("the header is incomplete");
  const std::string_view text = bytes.substr(8, static_cast<std::size_t>(n));
  if (text[0] != '{') bad("the header does not start with '{'");
  json_limits limits;
  limits.max_bytes = max_header_bytes;
  parsed_json j = parse_json(text, limits, "safetensors: '" + source + "': the header");
  header h;
  h.data_start = 8 + n;
  h.data_bytes = file_size - h.data_start;
  try {
    if (!j.is_object()) bad("the header is not a JSON object");
    for (const auto& [name, v] : j.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) bad("__metadata__ is not an object");
        for (const auto& [k, s] : v.items()) {
          if (!s.is_string()) bad("__metadata__ member '", printable(k), "' is not a string");
          h.metadata[k] = s.get<std::string>();
        }
        continue;
      }
      if (!v.is_object() || v.size() != 3 || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        bad("tensor '", printable(name), "' must have exactly the members dtype, shape and data_offsets");
      tensor_info t;
      t.name = name;
      if (!v["dtype"].is_string()) bad("tensor '", printable(name), "': dtype is not a string");
      t.dtype = v["dtype"].get<std::string>();
      const auto size = dtype_size(t.dtype);
      if (!size) bad("tensor '", printable(name), "': unknown dtype '", printable(t.dtype), "'");
      const auto& shape = v["shape"];
      if (!shape.is_array() || shape.size() > 64) bad("tensor '", printable(name), "': shape is not an array of at most 64 dimensions");
      std::uint64_t numel = 1;
      for (const auto& d : shape) {
        if (!d.is_number_unsigned()) bad("tensor '", printable(name), "': a dimension is not a non-negative integer");
        const std::uint64_t dim = d.get<std::uint64_t>();
        if (dim != 0 && numel > (std::uint64_t{1} << 60) / dim) bad("tensor '", printable(name), "': the shape is too large");
        numel *= dim;
        t.shape.push_back(dim);
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        bad("tensor '", printable(name), "': data_offsets is not a pair of non-negative integers");
      t.begin = off[0].get<std::uint64_t>();
      t.end = off[1].get<std::uint64_t>();
      if (t.end < t.begin || t.end - t.begin != numel * *size)
        bad("tensor '", printable(name), "': data_offsets [", t.begin, ", ", t.end, ") do not match ", numel, " elements of ",
            t.dtype);
      h.tensors.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    bad("unexpected header content: ", printable(e.what(), 160));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // As in the reference implementation: the tensors fill the data buffer exactly, without holes or overlaps.
  std::uint64_t at = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != at) bad("tensor '", printable(t.name), "' starts at byte ", t.begin, " of the data, expected ", at);
    at = t.end;
  }
  if (at != h.data_bytes) bad("the tensors cover ", at, " bytes of a data buffer of ", h.data_bytes);
  return h;
}

// Reads and validates the header of a safetensors file.
inline header read_header(const fs::path& path) {
  file f = file::open_read(path, symlinks::follow);
  const std::uint64_t size = f.size();
  ZERO_CHECK(size >= 8, corrupt, "safetensors: '", path.string(), "' is shorter than the 8-byte header length");
  std::string bytes(8, '\0');
  f.pread_exact(bytes.data(), 8, 0);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ZERO_CHECK(n <= max_header_bytes && 8 + n <= size, corrupt, "safetensors: '", path.string(), "': header length ", n,
             " does not fit in a file of ", size, " bytes");
  bytes.resize(static_cast<std::size_t>(8 + n));
  f.pread_exact(bytes.data() + 8, static_cast<std::size_t>(n), 8);
  return parse_header(bytes, size, path.string());
}

// One F32 tensor's values.
inline std::vector<float> read_f32(const fs::path& path, const header& h, const tensor_info& t) {
  ZERO_CHECK(t.dtype == "F32", invalid_argument, "safetensors: '", path.string(), "': tensor '", printable(t.name), "' is ",
             printable(t.dtype), ", not F32");
  file f = file::open_read(path, symlinks::follow);
  std::vector<float> v(static_cast<std::size_t>((t.end - t.begin) / 4));
  f.pread_exact(v.data(), v.size() * sizeof(float), h.data_start + t.begin);
  return v;
}

// Verifies the data checksum in the metadata, when the file carries one; returns whether it did.
inline bool verify_data(const fs::path& path, const header& h) {
  const auto it = h.metadata.find(std::string(data_checksum_key));
  if (it == h.metadata.end()) return false;
  const auto want = from_hex(it->second);
  ZERO_CHECK(want.has_value(), corrupt, "safetensors: '", path.string(), "': ", data_checksum_key,
             " is not 16 lowercase hex digits");
  file f = file::open_read(path, symlinks::follow);
  xxh64_stream hs;
  std::vector<unsigned char> chunk(std::size_t{1} << 20);
  for (std::uint64_t at = 0; at < h.data_bytes;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), h.data_bytes - at));
    f.pread_exact(chunk.data(), n, h.data_start + at);
    hs.update(chunk.data(), n);
    at += n;
  }
  ZERO_CHECK(hs.digest() == *want, corrupt, "safetensors: '", path.string(), "': checksum mismatch in the data (",
             data_checksum_key, " says ", it->second, ", the data hashes to ", to_hex(hs.digest()), ")");
  return true;
}

}  // namespace zero::checkpoint::safetensors
