// fingerprint: what identifies one collective call (sequence number, kind, element type, count, label) across ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "zero/comm/call_label.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/core/fixed_text.hpp"
#include "zero/core/hash.hpp"
#include "zero/core/half_types.hpp"

namespace zero::comm {

enum class coll_kind : int { all_reduce, reduce_scatter, all_gather, broadcast, barrier, all_to_all };

inline const char* to_string(coll_kind k) {
  switch (k) {
    case coll_kind::all_reduce: return "all_reduce";
    case coll_kind::reduce_scatter: return "reduce_scatter";
    case coll_kind::all_gather: return "all_gather";
    case coll_kind::broadcast: return "broadcast";
    case coll_kind::barrier: return "barrier";
    case coll_kind::all_to_all: return "all_to_all";
  }
  return "?";
}

// The element type of a collective, by name: two types of one size (int32 and float) are different
// calls, which comparing sizes alone would miss.
enum class wire_type : int {
  none, boolean, i8, u8, i16, u16, i32, u32, i64, u64, f32, f64, f80, bf16, fp16, character, other
};

inline const char* to_string(wire_type t) {
  switch (t) {
    case wire_type::none: return "none";
    case wire_type::boolean: return "bool";
    case wire_type::i8: return "int8";
    case wire_type::u8: return "uint8";
    case wire_type::i16: return "int16";
    case wire_type::u16: return "uint16";
    case wire_type::i32: return "int32";
    case wire_type::u32: return "uint32";
    case wire_type::i64: return "int64";
    case wire_type::u64: return "uint64";
    case wire_type::f32: return "float";
    case wire_type::f64: return "double";
    case wire_type::f80: return "long double";
    case wire_type::bf16: return "bf16";
    case wire_type::fp16: return "fp16";
    case wire_type::character: return "char";
    case wire_type::other: return "other";
  }
  return "?";
}

template <class T>
constexpr wire_type wire_type_of() {
  if constexpr (std::is_same_v<T, float>) return wire_type::f32;
  else if constexpr (std::is_same_v<T, double>) return wire_type::f64;
  else if constexpr (std::is_same_v<T, long double>) return wire_type::f80;
  else if constexpr (std::is_same_v<T, bf16>) return wire_type::bf16;
  else if constexpr (std::is_same_v<T, fp16>) return wire_type::fp16;
  else if constexpr (std::is_same_v<T, bool>) return wire_type::boolean;
  else if constexpr (std::is_same_v<T, char>) return wire_type::character;
  else if constexpr (std::is_integral_v<T>) {
    constexpr bool s = std::is_signed_v<T>;
    if constexpr (sizeof(T) == 1) return s ? wire_type::i8 : wire_type::u8;
    else if constexpr (sizeof(T) == 2) return s ? wire_type::i16 : wire_type::u16;
    else if constexpr (sizeof(T) == 4) return s ? wire_type::i32 : wire_type::u32;
    else if constexpr (sizeof(T) == 8) return s ? wire_type::i64 : wire_type::u64;
    else return wire_type::other;
  } else {
    return wire_type::other;
  }
}

// One collective call as its rank sees it. Trivially copyable and fixed-size, so it can travel as
// bytes between processes (comm::mpi's verify mode gathers the ranks' fingerprints to name both sides
// of a mismatch) and be formatted in a signal handler. The label is compared through a hash of its
// full text; the copy kept for messages is truncated.
struct fingerprint {
  std::uint64_t seq = 0;         // this rank's collectives on the communicator before this one
  std::uint64_t count = 0;       // elements per rank, as in the call
  std::uint64_t label_hash = 0;  // of phase and unit; 0 without a label
  coll_kind kind = coll_kind::barrier;
  wire_type type = wire_type::none;
  reduce_op op = reduce_op::sum;
  int root = 0;
  char phase[16] = {};
  char unit[48] = {};

  template <class T>
  static fingerprint make(std::uint64_t seq, coll_kind kind, std::size_t count, reduce_op op, int root,
                          const call_label& label) {
    fingerprint f;
    f.seq = seq;
    f.kind = kind;
    f.type = wire_type_of<T>();
    f.count = count;
    f.op = op;
    f.root = root;
    f.set_label(label);
    return f;
  }
  static fingerprint make_barrier(std::uint64_t seq, const call_label& label) {
    fingerprint f;
    f.seq = seq;
    f.set_label(label);
    return f;
  }

  void set_label(const call_label& l) {
    if (!l.phase) return;
    copy_truncated(phase, sizeof phase, l.phase);
    copy_truncated(unit, sizeof unit, l.unit);
    label_hash = fnv1a64(l.phase, std::strlen(l.phase));
    label_hash = fnv1a64("\0", 1, label_hash);
    label_hash = fnv1a64(l.unit.data(), l.unit.size(), label_hash);
    if (label_hash == 0) label_hash = 1;  // 0 means "no label"
  }

  bool same_call(const fingerprint& o) const { return differences(o) == 0; }

  // A bit per field that differs: the order of field_names().
  unsigned differences(const fingerprint& o) const {
    unsigned d = 0;
    if (seq != o.seq) d |= 1u << 0;
    if (kind != o.kind) d |= 1u << 1;
    if (type != o.type) d |= 1u << 2;
    if (count != o.count) d |= 1u << 3;
    if (uses_op() && op != o.op) d |= 1u << 4;
    if (kind == coll_kind::broadcast && root != o.root) d |= 1u << 5;
    if (label_hash != o.label_hash) d |= 1u << 6;
    return d;
  }
  static constexpr int field_count = 7;
  static const char* field_name(int i) {
    static const char* const names[field_count] = {"the sequence number", "the operation", "the element type",
                                                    "the count", "the reduction op", "the root", "the label"};
    return names[i];
  }
  // "the count and the label"
  static std::string describe(unsigned diff) {
    std::string s;
    int left = 0;
    for (int i = 0; i < field_count; ++i) left += (diff >> i) & 1u;
    for (int i = 0; i < field_count; ++i)
      if ((diff >> i) & 1u) {
        s += field_name(i);
        --left;
        if (left > 1) s += ", ";
        else if (left == 1) s += " and ";
      }
    return s;
  }

  bool uses_op() const { return kind == coll_kind::all_reduce || kind == coll_kind::reduce_scatter; }

  // "#12 reduce_scatter(float x 4096, sum) for reduce unit 'fc2'"
  void format(fixed_text& t) const {
    t << '#' << seq << ' ' << to_string(kind);
    if (kind != coll_kind::barrier) {
      t << '(' << to_string(type) << " x " << count;
      if (uses_op()) t << ", " << to_string(op);
      if (kind == coll_kind::broadcast) t << ", root " << root;
      t << ')';
    }
    if (phase[0]) {
      t << " for ";
      printable(t, phase, sizeof phase);
      if (unit[0]) {
        t << " unit '";
        printable(t, unit, sizeof unit);
        t << '\'';
      }
    }
  }
  std::string str() const {
    char buf[160];
    fixed_text t(buf, sizeof buf);
    format(t);
    return t.str();
  }

 private:
  static void copy_truncated(char* dst, std::size_t cap, std::string_view src) {
    const std::size_t n = src.size() < cap - 1 ? src.size() : cap - 1;
    if (n != 0) std::memcpy(dst, src.data(), n);  // an empty view may hold a null pointer
    dst[n] = '\0';
  }
  // The field as text, even if a peer sent bytes without a terminator; control characters (a
  // terminal escape in a unit name) become '?'.
  static void printable(fixed_text& t, const char* s, std::size_t cap) {
    for (std::size_t i = 0; i < cap && s[i]; ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      t << (c < 0x20 || c == 0x7f ? '?' : s[i]);
    }
  }
};
static_assert(std::is_trivially_copyable_v<fingerprint>);

}  // namespace zero::comm
