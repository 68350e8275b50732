// The one JSON parser of the checkpoint headers: nlohmann's SAX interface building a document under limits on
// nesting depth, text size and memory, refusing repeated members, and failing with a short zero::error.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zero/checkpoint/printable.hpp"
#include "zero/error.hpp"

namespace zero::checkpoint {

// A parsed document. Objects are sorted maps: a repeated member is found in O(log n) as it is
// added, where an insertion-ordered map would make an object of n members cost O(n^2) to parse.
using parsed_json = nlohmann::json;

struct json_limits {
  // Arrays and objects nested deeper than this are refused. A manifest needs 9 levels and a
  // safetensors header 4; without a limit, code that walks the document recursively (dump, copy,
  // compare) runs out of stack on a small file of brackets.
  std::size_t max_depth = 32;
  // The text itself may not be longer.
  std::uint64_t max_bytes = 0;
  // The document may take at most this many bytes of memory per byte of text (estimated as it is
  // built, see detail::dom_builder::charge), plus 64 KiB: what a file can make its reader allocate
  // stays a fixed multiple of the file's size. Real manifests need about 8.
  std::uint64_t memory_per_byte = 16;
};

namespace detail {

// A SAX handler that builds a parsed_json the way nlohmann's own DOM parser does (a stack of the
// open containers), checking the limits at every event. A violation stops the parse by returning
// false, so no exception ever crosses the parser.
class dom_builder {
 public:
  using number_integer_t = parsed_json::number_integer_t;
  using number_unsigned_t = parsed_json::number_unsigned_t;
  using number_float_t = parsed_json::number_float_t;
  using string_t = parsed_json::string_t;
  using binary_t = parsed_json::binary_t;

  dom_builder(parsed_json& root, const json_limits& limits, std::uint64_t budget)
      : root_(root), limits_(limits), budget_(budget) {}

  bool null() { return add(parsed_json(nullptr)); }
  bool boolean(bool v) { return add(parsed_json(v)); }
  bool number_integer(number_integer_t v) { return add(parsed_json(v)); }
  bool number_unsigned(number_unsigned_t v) { return add(parsed_json(v)); }
  bool number_float(number_float_t v, const string_t&) { return add(parsed_json(v)); }
  bool string(string_t& v) {
    // A string value is a heap-allocated std::string behind the value, plus its characters.
    if (!charge(sizeof(string_t) + 16 + heap_bytes(v))) return false;
    return add(parsed_json(std::move(v)));
  }
  bool binary(binary_t&) { return refuse("binary values are not JSON"); }

  bool start_object(std::size_t) {
    if (!open() || !charge(48 + 16)) return false;  // the std::map header, allocated
    return push(parsed_json(parsed_json::value_t::object));
  }
  bool key(string_t& k) {
    auto& obj = *stack_.back()->get_ptr<parsed_json::object_t*>();
    if (obj.find(k) != obj.end()) return refuse("member \"" + printable(k, 80) + "\" appears twice in one object");
    // A map node: links, the key and the value, plus the key's characters.
    if (!charge(32 + sizeof(string_t) + sizeof(parsed_json) + 16 + heap_bytes(k))) return false;
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    if (!open() || !charge(sizeof(parsed_json::array_t) + 16)) return false;
    return push(parsed_json(parsed_json::value_t::array));
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& e) {
    // The library's message quotes the last token whole: an unterminated 100 MB string would
    // become a 100 MB message. Keep its head, escaped.
    problem_ = "not valid JSON at byte " + std::to_string(position) + ": " + printable(e.what(), 160, printable_mode::name);
    return false;
  }

  const std::string& problem() const { return problem_; }

 private:
  static std::size_t heap_bytes(const string_t& s) { return s.size() > 15 ? s.size() + 1 + 16 : 0; }

  bool refuse(std::string what) {
    problem_ = std::move(what);
    return false;
  }
  bool open() {
    if (stack_.size() >= limits_.max_depth)
      return refuse("arrays and objects nested deeper than " + std::to_string(limits_.max_depth) + " levels");
    return true;
  }
  bool charge(std::uint64_t bytes) {
    used_ += bytes;
    if (used_ > budget_)
      return refuse("the document needs more than " + std::to_string(budget_) + " bytes of memory, " +
                    std::to_string(limits_.memory_per_byte) + " per byte of text: refused as an amplification");
    return true;
  }
  // Adds a value to the innermost open container (or makes it the root); returns where it now lives.
  parsed_json* place(parsed_json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    parsed_json& top = *stack_.back();
    if (top.is_array()) {
      auto& arr = *top.get_ptr<parsed_json::array_t*>();
      arr.push_back(std::move(v));
      return &arr.back();
    }
    auto& obj = *top.get_ptr<parsed_json::object_t*>();
    return &obj.emplace(std::move(key_), std::move(v)).first->second;
  }
  bool add(parsed_json&& v) {
    // An array element: the value, and twice as much again: while the vector grows, its old and
    // new storage (up to twice the size) coexist.
    if (!stack_.empty() && stack_.back()->is_array() && !charge(3 * sizeof(parsed_json))) return false;
    place(std::move(v));
    return true;
  }
  bool push(parsed_json&& v) {
    if (!stack_.empty() && stack_.back()->is_array() && !charge(3 * sizeof(parsed_json))) return false;
    // Pointers into a container stay valid while it is open: only the innermost one grows.
    stack_.push_back(place(std::move(v)));
    return true;
  }

  parsed_json& root_;
  const json_limits& limits_;
  std::uint64_t budget_ = 0, used_ = 0;
  std::vector<parsed_json*> stack_;
  string_t key_;
  std::string problem_;
};

}  // namespace detail

// Parses `text` under `limits`; every refusal is a zero::error of kind corrupt whose message starts
// with `what` (e.g. "checkpoint: 'DIR/manifest.json'") and stays short, whatever the text holds.
inline parsed_json parse_json(std::string_view text, const json_limits& limits, const std::string& what) {
  ZERO_CHECK(text.size() <= limits.max_bytes, corrupt, what, ": ", text.size(), " bytes of JSON, more than the ",
             limits.max_bytes, " accepted");
  parsed_json root;
  const std::uint64_t budget = limits.memory_per_byte * static_cast<std::uint64_t>(text.size()) + (64u << 10);
  detail::dom_builder builder(root, limits, budget);
  bool ok = false;
  try {
    ok = parsed_json::sax_parse(text.begin(), text.end(), &builder, parsed_json::input_format_t::json, true, false);
  } catch (const std::bad_alloc&) {
    fail(error_kind::io, what, ": out of memory while parsing ", text.size(), " bytes of JSON");
  } catch (const nlohmann::json::exception& e) {
    fail(error_kind::corrupt, what, ": not valid JSON: ", printable(e.what(), 160));
  }
  if (!ok) fail(error_kind::corrupt, what, ": ", builder.problem().empty() ? "not valid JSON" : builder.problem());
  return root;
}

}  // namespace zero::checkpoint
