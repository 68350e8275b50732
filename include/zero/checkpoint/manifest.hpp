// The checkpoint manifest (schema version 1): what it holds, how it is written and how it is validated.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/checkpoint/bounded_json.hpp"
#include "zero/checkpoint/checksum.hpp"
#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/printable.hpp"
#include "zero/config.hpp"
#include "zero/core/model_spec.hpp"
#include "zero/engine/options.hpp"
#include "zero/engine/reports.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

// Insertion-ordered, so a manifest reads in the order docs/checkpoint-format.md lists its members.
// (Reading goes through parse_json() into a parsed_json.)
using json = nlohmann::ordered_json;

// The newest manifest schema this library reads and the one it writes; a manifest with a larger
// number is refused rather than misread.
inline constexpr std::uint64_t format_version = 1;
inline constexpr std::string_view format_name = "zero.checkpoint";
inline constexpr std::string_view manifest_name = "manifest.json";
inline constexpr std::string_view checksum_member = "manifest_xxh64";
inline constexpr std::string_view stored_dtype = "F32";  // every value in a data file: little-endian binary32
inline constexpr std::string_view master_slot = "master";
// Bounds on what a reader accepts, so a damaged manifest cannot make it allocate without limit.
inline constexpr std::uint64_t max_manifest_bytes = std::uint64_t{256} << 20;
inline constexpr std::uint64_t max_elements = std::uint64_t{1} << 60;  // per tensor; 4x fits in 64 bits
inline constexpr std::size_t max_slots = 64;
inline constexpr std::size_t max_hyper_parameters = 64;  // members, each a number, boolean or short string
inline constexpr std::size_t max_depth = 32;             // JSON nesting; a manifest needs 9 levels

struct file_entry {
  std::string name;  // a plain file name inside the version directory
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;  // of the whole file, seed 0
};

// Elements [begin, end) of one tensor (tensor-local, row-major, unpadded), stored in files[file];
// slot k (in manifest::slots order) starts at byte offsets[k] and holds end - begin float32 values.
// In a tensor saved in pieces (tensor_entry::parts > 1) the elements are the piece's (piece-local,
// row-major in the piece's shape).
struct segment {
  std::uint64_t begin = 0, end = 0;
  std::size_t file = 0;
  std::vector<std::uint64_t> offsets;
  std::uint32_t piece = 0;  // which piece, where the tensor was saved in pieces
};

struct tensor_entry {
  std::string name;
  std::vector<std::size_t> shape;
  std::uint64_t numel = 0;
  std::string dtype{stored_dtype};
  std::vector<segment> segments;  // sorted, tiling [0, numel), or each piece's [0, numel / parts) in piece order
  // Saved by a tensor-parallel mesh with the tensor split (tp_split): cut along split_dim into
  // `parts` equal pieces, each stored in its own coordinates. 1 piece (and split_dim -1) otherwise.
  int split_dim = -1;
  int parts = 1;
  // The tensor_spec of piece `index`, what runs_of and whole_index map to the whole tensor.
  tensor_spec piece_spec(int index) const {
    tensor_spec t{name, shape, numel, tensor_parallel{split_dim}, parts, index};
    if (parts > 1) {
      t.shape[static_cast<std::size_t>(split_dim)] /= static_cast<std::size_t>(parts);
      t.numel /= static_cast<std::uint64_t>(parts);
    }
    return t;
  }
};

struct unit_entry {
  std::string name;
  std::vector<tensor_entry> tensors;
};

// Everything a manifest says, after validation.
struct manifest {
  std::uint64_t version = format_version;
  std::string library;                     // the writer, for people: "zero 0.1.0"
  int world_size = 0;                      // at save time; a load may use any other
  int stage = 0;                           // at save time
  int tensor_parallel = 1;                 // the tensor-parallel size of the mesh that saved it (world = dp x tp)
  std::string precision;                   // Engine::precision::name at save time
  std::string optimizer;                   // Engine::optimizer::name
  json hyper_parameters = json::object();  // at most 64 members: numbers, booleans, short strings
  // engine_options::param_groups at save time (at most 64; absent from a manifest without any), e.g.
  // to resume with the same: engine_options::param_groups = m.param_groups.
  std::vector<param_group> param_groups;
  training_state state;
  std::vector<std::string> slots;  // "master", then the optimizer's state slots
  // The optimizer kind's own state (engine::optimizer_kind_state: the same on every rank, of a size
  // the model alone decides), where it keeps one: `floats` fp32 values, the whole of files[file]
  // (which no segment uses). Absent for the element-wise, tensor-wise and matrix kinds.
  struct kind_state {
    std::size_t file = 0;
    std::uint64_t floats = 0;
  };
  std::optional<kind_state> optimizer_state;
  std::vector<file_entry> files;
  std::vector<unit_entry> units;
};

namespace detail {

inline std::string library_name() {
  return "zero " + std::to_string(ZERO_VERSION_MAJOR) + "." + std::to_string(ZERO_VERSION_MINOR) + "." +
         std::to_string(ZERO_VERSION_PATCH);
}

// Checked accessors: every failure names the file and the member path. J is parsed_json (what
// parse_json() returns) or json (the hyper-parameters a manifest keeps).
struct reader {
  std::string source;  // the manifest's path, for messages

  // What a value is, in a few words: a message must stay short and safe to print whatever the
  // manifest holds (a container is described, never dumped).
  template <class J>
  static std::string brief(const J& v) {
    if (v.is_object()) return "an object of " + std::to_string(v.size()) + " members";
    if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
    if (v.is_string()) return "the string \"" + printable(v.template get_ref<const std::string&>(), 48) + "\"";
    return v.dump();  // a number, a boolean or null: a few characters
  }

  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail(error_kind::corrupt, "checkpoint: '", source, "': ", where, ": ", what);
  }
  template <class J>
  const J& member(const J& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) bad(where, "expected a JSON object, found " + brief(obj));
    auto it = obj.find(key);
    if (it == obj.end()) bad(where, std::string("missing member '") + key + "'");
    return *it;
  }
  template <class J>
  std::uint64_t u64(const J& v, const std::string& where) const {
    // A JSON integer without a sign parses as unsigned; a negative one or a fraction is refused.
    if (!v.is_number_unsigned()) bad(where, "expected a non-negative integer, found " + brief(v));
    return v.template get<std::uint64_t>();
  }
  template <class J>
  std::uint64_t u64(const J& obj, const char* key, const std::string& where) const {
    return u64(member(obj, key, where), where + "." + key);
  }
  template <class J>
  std::string str(const J& v, const std::string& where) const {
    if (!v.is_string()) bad(where, "expected a string, found " + brief(v));
    return v.template get<std::string>();
  }
  template <class J>
  std::string str(const J& obj, const char* key, const std::string& where) const {
    return str(member(obj, key, where), where + "." + key);
  }
  template <class J>
  double number(const J& v, const std::string& where) const {
    if (!v.is_number()) bad(where, "expected a number, found " + brief(v));
    const double d = v.template get<double>();
    if (!std::isfinite(d)) bad(where, "expected a finite number");
    return d;
  }
  template <class J>
  const J& array(const J& obj, const char* key, const std::string& where) const {
    const J& v = member(obj, key, where);
    if (!v.is_array()) bad(where + "." + key, "expected an array, found " + brief(v));
    return v;
  }
};

// A data file name must stay inside the version directory: no separators, no "..", nothing hidden.
inline bool plain_file_name(const std::string& n) {
  if (n.empty() || n.size() > 255 || n[0] == '.') return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

inline std::string shape_text(const std::vector<std::size_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace detail

// ---- writing ---------------------------------------------------------------------------------

// The manifest as JSON text, with its own checksum filled in (see docs/checkpoint-format.md).
inline std::string serialize_manifest(const manifest& m) {
  json j;
  j["format"] = format_name;
  j["format_version"] = m.version;
  j[std::string(checksum_member)] = std::string(16, '0');  // replaced below by the checksum of the text
  j["library"] = m.library;
  j["saved_by"] = json{{"world_size", m.world_size}, {"stage", m.stage}};
  if (m.tensor_parallel > 1) j["saved_by"]["tensor_parallel"] = m.tensor_parallel;
  j["precision"] = m.precision;
  j["optimizer"] = json{{"name", m.optimizer}, {"hyper_parameters", m.hyper_parameters}};
  if (!m.param_groups.empty()) {
    json groups = json::array();
    for (const param_group& g : m.param_groups) {
      json e{{"name", g.name}, {"lr_scale", static_cast<double>(g.lr_scale)}};
      if (g.weight_decay) e["weight_decay"] = static_cast<double>(*g.weight_decay);
      if (g.element_wise) e["element_wise"] = true;
      groups.push_back(std::move(e));
    }
    j["optimizer"]["param_groups"] = std::move(groups);
  }
  j["training_state"] = json{{"step", m.state.step},
                             {"loss_scale", static_cast<double>(m.state.loss_scale)},
                             {"clean_steps", m.state.clean_steps},
                             {"hysteresis_left", m.state.hysteresis_left},
                             {"skipped_steps", m.state.skipped_steps}};
  j["slots"] = m.slots;
  if (m.optimizer_state)
    j["optimizer_state"] = json{{"file", m.optimizer_state->file}, {"floats", m.optimizer_state->floats}};
  json files = json::array();
  for (const auto& f : m.files) files.push_back(json{{"name", f.name}, {"bytes", f.bytes}, {"xxh64", to_hex(f.xxh64)}});
  j["files"] = std::move(files);
  json units = json::array();
  for (const auto& u : m.units) {
    json tensors = json::array();
    for (const auto& t : u.tensors) {
      json segs = json::array();
      for (const auto& s : t.segments) {
        segs.push_back(json{{"begin", s.begin}, {"end", s.end}, {"file", s.file}, {"offsets", s.offsets}});
        if (t.parts > 1) segs.back()["piece"] = s.piece;
      }
      json te{{"name", t.name}, {"shape", t.shape}, {"dtype", t.dtype}};
      if (t.parts > 1) {
        te["tp_split"] = t.split_dim;
        te["tp_parts"] = t.parts;
      }
      te["segments"] = std::move(segs);
      tensors.push_back(std::move(te));
    }
    units.push_back(json{{"name", u.name}, {"tensors", std::move(tensors)}});
  }
  j["model"] = json{{"units", std::move(units)}};

  // One member per line, one file and one tensor per line: readable, and a few lines per tensor
  // rather than dozens, whatever the number of ranks.
  std::string text;
  try {
    auto compact = [](const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::strict); };
    auto list = [&](const json& items, const std::string& indent) {
      std::string t = "[";
      for (std::size_t i = 0; i < items.size(); ++i) t += (i ? ",\n" : "\n") + indent + "  " + compact(items[i]);
      return t + (items.empty() ? "]" : "\n" + indent + "]");
    };
    text = "{\n";
    for (auto it = j.begin(); it != j.end(); ++it) {
      text += "  " + compact(it.key()) + ": ";
      if (it.key() == "files") {
        text += list(*it, "  ");
      } else if (it.key() == "model") {
        text += "{\"units\": [";
        const json& us = (*it)["units"];
        for (std::size_t u = 0; u < us.size(); ++u)
          text += std::string(u ? ",\n" : "\n") + "    {\"name\": " + compact(us[u]["name"]) +
                  ", \"tensors\": " + list(us[u]["tensors"], "    ") + "}";
        text += "\n  ]}";
      } else {
        text += compact(*it);
      }
      text += std::next(it) == j.end() ? "\n" : ",\n";
    }
    text += "}\n";
  } catch (const json::exception& e) {
    fail(error_kind::invalid_argument, "checkpoint: the manifest cannot be written as JSON (", e.what(),
         "); unit and tensor names must be valid UTF-8");
  }
  const auto at = locate_hex_member(text, checksum_member);
  ZERO_CHECK(at.has_value(), invalid_argument, "checkpoint: the manifest text has no unique ", checksum_member);
  const std::string hex = to_hex(xxh64_with_zeroed(text, *at));
  text.replace(*at, 16, hex);
  return text;
}

// ---- reading ---------------------------------------------------------------------------------

namespace detail {

// Every byte of every data file holds exactly one value of one slot of one segment: no two segments
// share bytes (a 1 MB manifest could otherwise describe a huge tensor with 4 MiB of data, read the
// same bytes again and again), and no byte is left over (work and memory stay bounded by the data
// the manifest describes, and a reader never hashes bytes it does not use).
inline void check_file_tiling(const manifest& m, const reader& rd) {
  struct piece {
    std::uint64_t begin, end;
    std::uint32_t file, unit, tensor, slot;
  };
  std::vector<piece> pieces;
  for (std::size_t u = 0; u < m.units.size(); ++u)
    for (std::size_t t = 0; t < m.units[u].tensors.size(); ++t)
      for (const segment& s : m.units[u].tensors[t].segments)
        for (std::size_t k = 0; k < s.offsets.size(); ++k)
          pieces.push_back({s.offsets[k], s.offsets[k] + (s.end - s.begin) * 4, static_cast<std::uint32_t>(s.file),
                            static_cast<std::uint32_t>(u), static_cast<std::uint32_t>(t),
                            static_cast<std::uint32_t>(k)});
  std::sort(pieces.begin(), pieces.end(),
            [](const piece& a, const piece& b) { return a.file != b.file ? a.file < b.file : a.begin < b.begin; });
  auto what = [&](const piece& p) {
    return "tensor " + quote_name(m.units[p.unit].name + "." + m.units[p.unit].tensors[p.tensor].name) + " slot " +
           quote_name(m.slots[p.slot]);
  };
  std::size_t i = 0;
  for (std::uint32_t f = 0; f < m.files.size(); ++f) {
    const std::string fname = quote_name(m.files[f].name);
    if (m.optimizer_state && m.optimizer_state->file == f) {
      // The optimizer kind's state: the whole file (its size checked with the member), no segment's.
      if (i < pieces.size() && pieces[i].file == f)
        rd.bad("manifest.model", fname + " holds the optimizer's state and " + what(pieces[i]) +
                                     ": segments must not share bytes");
      continue;
    }
    std::uint64_t at = 0;
    const piece* prev = nullptr;
    for (; i < pieces.size() && pieces[i].file == f; ++i) {
      const piece& p = pieces[i];
      if (p.begin < at)
        rd.bad("manifest.model", "bytes [" + std::to_string(p.begin) + ", " + std::to_string(at) + ") of " + fname +
                                     " hold both " + what(*prev) + " and " + what(p) +
                                     ": segments must not share bytes");
      if (p.begin > at)
        rd.bad("manifest.model", "bytes [" + std::to_string(at) + ", " + std::to_string(p.begin) + ") of " + fname +
                                     " belong to no segment: every byte of a data file holds one value");
      at = p.end;
      prev = &p;
    }
    if (at != m.files[f].bytes)
      rd.bad("manifest.files[" + std::to_string(f) + "]",
             "bytes [" + std::to_string(at) + ", " + std::to_string(m.files[f].bytes) + ") of " + fname +
                 " belong to no segment: every byte of a data file holds one value");
  }
}

}  // namespace detail

// Parses and validates manifest text; every problem is a zero::error (kind corrupt) naming `source`.
// The text goes through parse_json() (depth, size and memory limits; repeated members refused).
// check_checksum = false is for tools that inspect a damaged manifest, never for loading.
inline manifest parse_manifest(std::string_view text, const std::string& source, bool check_checksum = true) {
  const detail::reader rd{source};
  json_limits limits;
  limits.max_depth = max_depth;
  limits.max_bytes = max_manifest_bytes;
  const parsed_json j = parse_json(text, limits, "checkpoint: '" + source + "'");
  try {
    manifest m;
    if (!j.is_object()) rd.bad("manifest", "expected a JSON object at the top level");
    if (rd.str(j, "format", "manifest") != format_name)
      rd.bad("manifest.format", "expected \"" + std::string(format_name) + "\": this is not a zero checkpoint");
    m.version = rd.u64(j, "format_version", "manifest");
    if (m.version > format_version)
      fail(error_kind::corrupt, "checkpoint: '", source, "' has format version ", m.version,
           ", newer than the newest this library reads (", format_version, "); use a newer zero");
    if (m.version == 0) rd.bad("manifest.format_version", "version 0 does not exist");

    // Before any other member is trusted: the checksum covers every byte of the text.
    if (check_checksum) {
      const auto at = locate_hex_member(text, checksum_member);
      if (!at)
        rd.bad("manifest",
               "member '" + std::string(checksum_member) + "' is missing, repeated, or not a 16-digit hex string");
      const auto stored = from_hex(text.substr(*at, 16));
      if (!stored) rd.bad(std::string(checksum_member), "not 16 lowercase hex digits");
      const std::uint64_t actual = xxh64_with_zeroed(text, *at);
      if (*stored != actual)
        fail(error_kind::corrupt, "checkpoint: '", source, "': checksum mismatch (the manifest says ", to_hex(*stored),
             ", its content hashes to ", to_hex(actual), "): the manifest is damaged");
    }

    m.library = rd.str(j, "library", "manifest");
    const parsed_json& by = rd.member(j, "saved_by", "manifest");
    const std::uint64_t ws = rd.u64(by, "world_size", "manifest.saved_by");
    const std::uint64_t st = rd.u64(by, "stage", "manifest.saved_by");
    if (ws == 0 || ws > (1u << 24)) rd.bad("manifest.saved_by.world_size", "out of range: " + std::to_string(ws));
    if (st > 1000) rd.bad("manifest.saved_by.stage", "out of range: " + std::to_string(st));
    m.world_size = static_cast<int>(ws);
    m.stage = static_cast<int>(st);
    if (by.find("tensor_parallel") != by.end()) {
      const std::uint64_t tp = rd.u64(by, "tensor_parallel", "manifest.saved_by");
      if (tp < 2 || tp > ws || ws % tp != 0)
        rd.bad("manifest.saved_by.tensor_parallel",
               std::to_string(tp) + " does not divide the world size " + std::to_string(ws) + " (or is below 2)");
      m.tensor_parallel = static_cast<int>(tp);
    }
    m.precision = rd.str(j, "precision", "manifest");

    const parsed_json& opt = rd.member(j, "optimizer", "manifest");
    m.optimizer = rd.str(opt, "name", "manifest.optimizer");
    if (m.optimizer.empty()) rd.bad("manifest.optimizer.name", "empty");
    const parsed_json& hp = rd.member(opt, "hyper_parameters", "manifest.optimizer");
    const std::string hw = "manifest.optimizer.hyper_parameters";
    if (!hp.is_object()) rd.bad(hw, "expected a JSON object, found " + rd.brief(hp));
    if (hp.size() > max_hyper_parameters) rd.bad(hw, "more than " + std::to_string(max_hyper_parameters) + " members");
    for (const auto& [key, v] : hp.items()) {
      // Settings are scalars: nothing a manifest keeps (and copies into every load_result) can be large.
      if (key.size() > 256 ||
          !(v.is_number() || v.is_boolean() || (v.is_string() && v.get_ref<const std::string&>().size() <= 256)))
        rd.bad(hw + "." + printable(key, 64),
               "expected a number, a boolean or a string of at most 256 bytes, found " + rd.brief(v));
      m.hyper_parameters[key] = json(v);
    }

    if (opt.find("param_groups") != opt.end()) {
      const std::string gw = "manifest.optimizer.param_groups";
      const parsed_json& groups = rd.array(opt, "param_groups", "manifest.optimizer");
      if (groups.size() > max_hyper_parameters)
        rd.bad(gw, "more than " + std::to_string(max_hyper_parameters) + " groups");
      // A value a group may take: finite, >= 0 and a float (what engine_options::param_groups accepts).
      const auto value = [&](const parsed_json& v, const std::string& where) {
        const double d = rd.number(v, where);
        if (!(d >= 0.0) || d > static_cast<double>(std::numeric_limits<float>::max()))
          rd.bad(where, "expected a finite float >= 0");
        return static_cast<float>(d);
      };
      for (std::size_t k = 0; k < groups.size(); ++k) {
        const std::string w = gw + "[" + std::to_string(k) + "]";
        param_group g;
        g.name = rd.str(groups[k], "name", w);
        if (g.name.empty() || g.name.size() > 256) rd.bad(w + ".name", "expected 1 to 256 bytes");
        g.lr_scale = value(rd.member(groups[k], "lr_scale", w), w + ".lr_scale");
        if (groups[k].find("weight_decay") != groups[k].end())
          g.weight_decay = value(rd.member(groups[k], "weight_decay", w), w + ".weight_decay");
        if (groups[k].find("element_wise") != groups[k].end()) {
          const parsed_json& v = rd.member(groups[k], "element_wise", w);
          if (!v.is_boolean()) rd.bad(w + ".element_wise", "expected true or false, found " + rd.brief(v));
          g.element_wise = v.get<bool>();
        }
        m.param_groups.push_back(std::move(g));
      }
    }

    const parsed_json& ts = rd.member(j, "training_state", "manifest");
    const std::string tw = "manifest.training_state";
    m.state.step = rd.u64(ts, "step", tw);
    const double ls = rd.number(rd.member(ts, "loss_scale", tw), tw + ".loss_scale");
    if (!(ls > 0.0) || ls > static_cast<double>(std::numeric_limits<float>::max()))
      rd.bad(tw + ".loss_scale", "expected a positive finite float");
    m.state.loss_scale = static_cast<float>(ls);
    m.state.clean_steps = rd.u64(ts, "clean_steps", tw);
    const std::uint64_t hl = rd.u64(ts, "hysteresis_left", tw);
    if (hl > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) rd.bad(tw + ".hysteresis_left", "too large");
    m.state.hysteresis_left = static_cast<int>(hl);
    m.state.skipped_steps = rd.u64(ts, "skipped_steps", tw);
    // Bounded by what a run can reach (training_state::max_steps), so that nothing derived from them
    // (the bias correction's powers, the data position step + skipped_steps) is inexact or wraps.
    constexpr std::uint64_t most = training_state::max_steps;
    for (const auto& [field, value] :
         {std::pair{"step", m.state.step}, std::pair{"skipped_steps", m.state.skipped_steps},
          std::pair{"clean_steps", m.state.clean_steps}})
      if (value > most)
        rd.bad(tw + "." + field,
               std::to_string(value) + " is more than a run can reach (2^53 = " + std::to_string(most) + ")");
    if (m.state.step + m.state.skipped_steps > most)
      rd.bad(tw + ".skipped_steps", "step + skipped_steps = " + std::to_string(m.state.step + m.state.skipped_steps) +
                                        " is more than a run can reach (2^53 = " + std::to_string(most) + ")");

    const parsed_json& slots = rd.array(j, "slots", "manifest");
    if (slots.empty() || slots.size() > max_slots) rd.bad("manifest.slots", "expected 1 to 64 slot names");
    for (std::size_t k = 0; k < slots.size(); ++k) {
      m.slots.push_back(rd.str(slots[k], "manifest.slots[" + std::to_string(k) + "]"));
      if (m.slots.back().empty()) rd.bad("manifest.slots", "a slot name is empty");
    }
    if (m.slots[0] != master_slot) rd.bad("manifest.slots", "the first slot must be \"master\"");
    if (std::set<std::string>(m.slots.begin(), m.slots.end()).size() != m.slots.size())
      rd.bad("manifest.slots", "slot names repeat");

    const parsed_json& files = rd.array(j, "files", "manifest");
    std::set<std::string> file_names;
    for (std::size_t i = 0; i < files.size(); ++i) {
      const std::string w = "manifest.files[" + std::to_string(i) + "]";
      file_entry f;
      f.name = rd.str(files[i], "name", w);
      if (!detail::plain_file_name(f.name))
        rd.bad(w + ".name", quote_name(f.name) + " is not a plain file name inside the checkpoint");
      if (!file_names.insert(f.name).second) rd.bad(w + ".name", quote_name(f.name) + " is listed twice");
      f.bytes = rd.u64(files[i], "bytes", w);
      const auto h = from_hex(rd.str(files[i], "xxh64", w));
      if (!h) rd.bad(w + ".xxh64", "expected 16 lowercase hex digits");
      f.xxh64 = *h;
      m.files.push_back(std::move(f));
    }
    if (j.find("optimizer_state") != j.end()) {
      const parsed_json& os = rd.member(j, "optimizer_state", "manifest");
      manifest::kind_state k;
      const std::uint64_t fi = rd.u64(os, "file", "manifest.optimizer_state");
      if (fi >= m.files.size())
        rd.bad("manifest.optimizer_state.file", "file index " + std::to_string(fi) + " out of range");
      k.file = static_cast<std::size_t>(fi);
      k.floats = rd.u64(os, "floats", "manifest.optimizer_state");
      if (k.floats == 0 || k.floats > max_elements || k.floats * 4 != m.files[k.file].bytes)
        rd.bad("manifest.optimizer_state.floats", std::to_string(k.floats) + " floats, but " +
                                                      quote_name(m.files[k.file].name) + " has " +
                                                      std::to_string(m.files[k.file].bytes) + " bytes");
      m.optimizer_state = k;
    }

    const parsed_json& model = rd.member(j, "model", "manifest");
    const parsed_json& units = rd.array(model, "units", "manifest.model");
    if (units.empty()) rd.bad("manifest.model.units", "the model has no units");
    std::set<std::string> unit_names;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const std::string uw = "manifest.model.units[" + std::to_string(u) + "]";
      unit_entry ue;
      ue.name = rd.str(units[u], "name", uw);
      if (ue.name.empty() || !unit_names.insert(ue.name).second) rd.bad(uw + ".name", "empty or repeated unit name");
      const parsed_json& tensors = rd.array(units[u], "tensors", uw);
      if (tensors.empty()) rd.bad(uw + ".tensors", "the unit has no tensors");
      std::set<std::string> tensor_names;
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        const std::string tw2 = uw + ".tensors[" + std::to_string(t) + "]";
        tensor_entry te;
        te.name = rd.str(tensors[t], "name", tw2);
        if (te.name.empty() || !tensor_names.insert(te.name).second)
          rd.bad(tw2 + ".name", "empty or repeated tensor name");
        const std::string tn = "tensor " + quote_name(ue.name + "." + te.name);
        const parsed_json& shape = rd.array(tensors[t], "shape", tw2);
        if (shape.empty() || shape.size() > 64) rd.bad(tw2 + ".shape", "expected 1 to 64 dimensions");
        te.numel = 1;
        for (std::size_t d = 0; d < shape.size(); ++d) {
          const std::uint64_t dim = rd.u64(shape[d], tw2 + ".shape");
          if (dim == 0 || dim > max_elements / te.numel)
            rd.bad(tw2 + ".shape", tn + " has a zero or oversized dimension");
          te.numel *= dim;
          te.shape.push_back(static_cast<std::size_t>(dim));
        }
        te.dtype = rd.str(tensors[t], "dtype", tw2);
        if (te.dtype != stored_dtype)
          rd.bad(tw2 + ".dtype", tn + " has dtype " + quote_name(te.dtype) + "; format version 1 stores F32 only");
        if (tensors[t].find("tp_parts") != tensors[t].end()) {
          const std::uint64_t parts = rd.u64(tensors[t], "tp_parts", tw2);
          const std::uint64_t dim = rd.u64(tensors[t], "tp_split", tw2);
          if (parts < 2 || parts != static_cast<std::uint64_t>(m.tensor_parallel))
            rd.bad(tw2 + ".tp_parts", tn + ": " + std::to_string(parts) + " pieces, but the mesh that saved it has " +
                                          std::to_string(m.tensor_parallel) + " tensor-parallel ranks");
          if (dim >= te.shape.size() || te.shape[dim] % parts != 0)
            rd.bad(tw2 + ".tp_split", tn + ": dimension " + std::to_string(dim) + " cannot be cut into " +
                                          std::to_string(parts) + " equal pieces");
          te.parts = static_cast<int>(parts);
          te.split_dim = static_cast<int>(dim);
        }
        // Each piece's segments tile it in order, the pieces in order (one piece: the tensor).
        const std::uint64_t piece_numel = te.numel / static_cast<std::uint64_t>(te.parts);
        const parsed_json& segs = rd.array(tensors[t], "segments", tw2);
        std::uint64_t covered = 0, piece = 0;
        for (std::size_t s = 0; s < segs.size(); ++s) {
          const std::string sw = tw2 + ".segments[" + std::to_string(s) + "]";
          segment sg;
          sg.begin = rd.u64(segs[s], "begin", sw);
          sg.end = rd.u64(segs[s], "end", sw);
          const std::uint64_t fi = rd.u64(segs[s], "file", sw);
          if (covered == piece_numel && te.parts > 1) covered = 0, ++piece;
          if (te.parts > 1 && rd.u64(segs[s], "piece", sw) != piece)
            rd.bad(sw + ".piece",
                   tn + ": segments must tile the pieces in order; expected piece " + std::to_string(piece));
          sg.piece = static_cast<std::uint32_t>(piece);
          if (sg.begin != covered)
            rd.bad(sw, tn + ": segments must tile the tensor in order; expected begin " + std::to_string(covered) +
                           ", found " + std::to_string(sg.begin));
          if (sg.end <= sg.begin || sg.end > piece_numel) rd.bad(sw, tn + ": segment end out of range");
          if (fi >= m.files.size()) rd.bad(sw + ".file", tn + ": file index " + std::to_string(fi) + " out of range");
          sg.file = static_cast<std::size_t>(fi);
          const parsed_json& offs = rd.array(segs[s], "offsets", sw);
          if (offs.size() != m.slots.size()) rd.bad(sw + ".offsets", "expected one offset per slot");
          const std::uint64_t len = (sg.end - sg.begin) * 4;
          for (std::size_t k = 0; k < offs.size(); ++k) {
            const std::uint64_t o = rd.u64(offs[k], sw + ".offsets");
            if (o > m.files[sg.file].bytes || len > m.files[sg.file].bytes - o)
              rd.bad(sw + ".offsets", tn + ": slot " + quote_name(m.slots[k]) + " lies beyond the end of " +
                                          quote_name(m.files[sg.file].name));
            sg.offsets.push_back(o);
          }
          covered = sg.end;
          te.segments.push_back(std::move(sg));
        }
        if (covered != piece_numel || piece + 1 != static_cast<std::uint64_t>(te.parts))
          rd.bad(tw2 + ".segments", tn + ": the segments cover " + std::to_string(piece * piece_numel + covered) +
                                        " of " + std::to_string(te.numel) + " elements");
        ue.tensors.push_back(std::move(te));
      }
      m.units.push_back(std::move(ue));
    }
    detail::check_file_tiling(m, rd);
    return m;
  } catch (const nlohmann::json::exception& e) {
    // A member of an unexpected type that slipped past the checks above: still a damaged manifest.
    fail(error_kind::corrupt, "checkpoint: '", source, "': unexpected content: ", printable(e.what(), 160));
  }
}

// Refuses a manifest of another model: unit and tensor names, order and shapes must all agree.
inline void check_model(const manifest& m, const model_spec& spec, const std::string& source) {
  auto refuse = [&](const auto&... what) {
    fail(error_kind::corrupt, "checkpoint: '", source, "' holds another model: ", what...);
  };
  if (m.units.size() != spec.num_units())
    refuse("it has ", m.units.size(), " units, the engine's model has ", spec.num_units());
  for (std::size_t u = 0; u < m.units.size(); ++u) {
    const unit_entry& a = m.units[u];
    const unit_spec& b = spec.units()[u];
    if (a.name != b.name)
      refuse("unit ", u, " is ", quote_name(a.name), " in the checkpoint but ", quote_name(b.name), " in the model");
    if (a.tensors.size() != b.tensors.size())
      refuse("unit ", quote_name(a.name), " has ", a.tensors.size(), " tensors in the checkpoint but ",
             b.tensors.size(), " in the model");
    for (std::size_t t = 0; t < a.tensors.size(); ++t) {
      const tensor_entry& x = a.tensors[t];
      const tensor_spec& y = b.tensors[t];
      if (x.name != y.name)
        refuse("tensor ", t, " of unit ", quote_name(a.name), " is ", quote_name(x.name), " in the checkpoint but ",
               quote_name(y.name), " in the model");
      if (x.shape != y.shape)
        refuse("tensor ", quote_name(a.name + "." + x.name), " has shape ", detail::shape_text(x.shape),
               " in the checkpoint but ", detail::shape_text(y.shape), " in the model");
    }
  }
}

// The model a manifest describes, for tools that build an engine from a checkpoint alone.
inline model_spec spec_of(const manifest& m) {
  model_spec s;
  for (const auto& u : m.units) {
    auto b = s.unit(u.name);
    for (const auto& t : u.tensors) b.tensor(t.name, t.shape, tensor_parallel{t.parts > 1 ? t.split_dim : -1});
  }
  return s;
}

}  // namespace zero::checkpoint
