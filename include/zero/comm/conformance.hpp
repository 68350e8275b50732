// The collective conformance suite for backend authors: every collective checked on each rank of a launch, over any CommBackend.
#pragma once

// Use: call zero::conformance::all(comm) (or one collective's function) on every rank of a launch of
// the backend, with 1, 2, 3 and more ranks (odd counts and counts no N divides are in the cases):
//
//   zero::comm::threads::launch(3, [](zero::comm::threads& c) { zero::conformance::all(c); });
//
// It checks each collective out of place and in place (NCCL's in-place rules), for float and double,
// at counts from 0 to a few thousand, against a reference computed on every rank: sums bit for bit
// in rank order (acc = x0; acc += x1; ...; options::rank_ordered = false for a backend documented
// otherwise), max, that nothing is written outside the receive buffer or into the send buffer, that
// a broadcast reads only the root, that a barrier waits for the last rank, that the inputs do depend
// on the summation order (so the checks have teeth), and canonical NaNs (and bf16 and fp16 where the
// backend moves them). engine_types(c) checks the other types the engine moves (std::int64_t and
// std::uint8_t, all_to_all where the backend has it). Buffers live in the backend's system memory
// (System::allocate, System::copy), so a device backend is tested as it runs.
//
// Every check runs inside one rank and throws zero::error (kind comm) naming the rank, the
// collective, the element and both values, so the launcher (comm::threads::launch rethrows,
// comm::mpi::run aborts the job with the message) reports it. Each function runs the same collectives
// on every rank whatever the outcome of a check, up to the first throw, so a failure never strands a
// peer. Header-only, no test framework: call it from any test runner.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "zero/comm/all_to_all.hpp"
#include "zero/comm/fingerprint.hpp"
#include "zero/concepts/comm_backend.hpp"
#include "zero/core/fp.hpp"
#include "zero/core/half_types.hpp"
#include "zero/core/reduce_op.hpp"
#include "zero/error.hpp"

namespace zero::conformance {

struct options {
  // Sums must equal acc = x0; acc += x1; ... acc += x{N-1} bit for bit. False for a documented
  // non-deterministic mode (comm::mpi fast): sums are then held to the rounding-error bound of any
  // summation order, and the order-sensitivity checks are skipped.
  bool rank_ordered = true;
};

// Per-rank element counts: empty, single, odd, not divisible by any N under test, a few thousand.
inline constexpr std::size_t counts[] = {0, 1, 2, 3, 7, 64, 129, 1000, 3001, 4096};

enum class placement { out_of_place, in_place };
inline const char* to_string(placement p) { return p == placement::in_place ? "in place" : "out of place"; }

template <class T>
const char* type_name() {
  return comm::to_string(comm::wire_type_of<T>());
}

// splitmix64, so every rank can compute every other rank's input without communicating.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of rank r's input: a random sign and mantissa times 2^e with e in [-20, 20]. Addends
// that far apart in magnitude lose different low bits in each summation order, so a backend that
// sums out of rank order gives a different float (checked by order_sensitivity below).
// Integers: uniform over 40 bits (signed) or the type's range, so sums over any N in use stay exact.
template <class T>
T value(int rank, std::size_t i, std::uint64_t salt) {
  const std::uint64_t h = mix(salt ^ mix(static_cast<std::uint64_t>(rank) ^ mix(i)));
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) >= 8) {
    return static_cast<T>(static_cast<std::int64_t>(h >> 24) - (std::int64_t{1} << 39));
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(h);
  } else {
    constexpr int bits = std::numeric_limits<T>::digits - 1;
    const double mantissa = 1.0 + std::ldexp(static_cast<double>(h & ((1ull << bits) - 1)), -bits);
    const int exponent = static_cast<int>((h >> 53) % 41) - 20;
    const double v = std::ldexp(mantissa, exponent);
    return static_cast<T>((h >> 63) ? -v : v);  // exact: the mantissa has T's digits
  }
}

template <class T>
std::vector<T> input(int rank, std::size_t n, std::uint64_t salt) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(rank, i, salt);
  return v;
}

// The reference reduction: acc = x0; acc op= x1; ... in T's arithmetic, element by element.
template <class T>
std::vector<T> reduce_in_rank_order(const std::vector<std::vector<T>>& xs, zero::reduce_op op) {
  std::vector<T> acc = xs[0];
  for (std::size_t k = 1; k < xs.size(); ++k)
    for (std::size_t i = 0; i < acc.size(); ++i) {
      if (op == zero::reduce_op::sum) acc[i] += xs[k][i];
      else acc[i] = acc[i] < xs[k][i] ? xs[k][i] : acc[i];
    }
  return acc;
}

inline std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(v));
  return buf;
}

template <class T>
std::string hexfloat(T v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(v));
  return buf;
}

template <class... Args>
[[noreturn]] void fail(int rank, int size, const std::string& where, const Args&... what) {
  std::string msg = "conformance: rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " + where + ": ";
  ((msg += what), ...);
  throw zero::error(zero::error_kind::comm, msg);
}

// A buffer in the backend's memory space with guard zones on both sides, so a collective that
// writes outside [data, data + n) is caught. Data moves through System::copy, as in the engine.
template <class T, class System>
class guarded {
 public:
  static constexpr std::size_t guard = 16;
  static constexpr unsigned char pattern = 0xa5;

  explicit guarded(std::size_t n) : n_(n), bytes_((n + 2 * guard) * sizeof(T)) {
    raw_ = static_cast<T*>(System::allocate(bytes_));
    const std::vector<unsigned char> fill(bytes_, pattern);
    System::copy(raw_, fill.data(), bytes_);
  }
  guarded(const guarded&) = delete;
  guarded& operator=(const guarded&) = delete;
  ~guarded() { System::deallocate(raw_, bytes_); }

  T* data() { return raw_ + guard; }
  std::size_t size() const { return n_; }
  void write(const std::vector<T>& v, std::size_t at = 0) {
    System::copy(raw_ + guard + at, v.data(), v.size() * sizeof(T));
  }
  std::vector<T> read() const {
    std::vector<T> v(n_);
    System::copy(v.data(), raw_ + guard, n_ * sizeof(T));
    return v;
  }
  bool guards_intact() const {
    std::vector<unsigned char> all(bytes_);
    System::copy(all.data(), raw_, bytes_);
    const std::size_t g = guard * sizeof(T);
    return std::all_of(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(g),
                       [](unsigned char b) { return b == pattern; }) &&
           std::all_of(all.end() - static_cast<std::ptrdiff_t>(g), all.end(),
                       [](unsigned char b) { return b == pattern; });
  }

 private:
  std::size_t n_, bytes_;
  T* raw_ = nullptr;
};

// The checks of one rank, bound to its backend and options.
template <class Comm>
class checker {
 public:
  using system = typename Comm::system;
  template <class T>
  using buffer = guarded<T, system>;

  checker(Comm& c, options o) : c_(c), o_(o), rank_(c.rank()), size_(c.size()) {}

  int rank() const { return rank_; }
  int size() const { return size_; }

  // got == expected: bitwise when rank-ordered or when the op is exact (max, copies); otherwise
  // within the error bound of an arbitrary summation order, N eps sum|x_k| (plus a margin).
  template <class T>
  void expect_equal(const std::vector<T>& got, const std::vector<T>& expected, const std::string& where,
                    bool exact, const std::vector<std::vector<T>>* addends = nullptr, std::size_t addend_base = 0) {
    if (got.size() != expected.size())
      fail(rank_, size_, where, "got ", std::to_string(got.size()), " elements, expected ",
           std::to_string(expected.size()));
    for (std::size_t i = 0; i < got.size(); ++i) {
      bool ok;
      if (exact || !addends) {
        ok = std::memcmp(&got[i], &expected[i], sizeof(T)) == 0;
      } else {
        double magnitude = 0;
        for (const auto& x : *addends) magnitude += std::fabs(static_cast<double>(x[addend_base + i]));
        const double bound = 2.0 * size_ * std::numeric_limits<T>::epsilon() * magnitude;
        ok = std::fabs(static_cast<double>(got[i]) - static_cast<double>(expected[i])) <= bound;
      }
      if (!ok)
        fail(rank_, size_, where, "element ", std::to_string(i), " is ", hexfloat(got[i]), ", expected ",
             hexfloat(expected[i]),
             exact ? " (bit-exact: acc = x0; acc += x1; ... in rank order)" : " (beyond the rounding bound)");
    }
  }
  template <class T>
  void expect_guards(const buffer<T>& b, const std::string& where, const char* which) {
    if (!b.guards_intact()) fail(rank_, size_, where, "wrote outside the ", which, " buffer");
  }

  template <class T>
  std::vector<std::vector<T>> inputs(std::size_t n, std::uint64_t salt) const {
    std::vector<std::vector<T>> xs;
    for (int k = 0; k < size_; ++k) xs.push_back(input<T>(k, n, salt));
    return xs;
  }

  template <class T>
  void all_reduce_case(std::size_t count, zero::reduce_op op, placement p) {
    const std::string where = std::string("all_reduce(") + zero::to_string(op) + ", " + type_name<T>() +
                              ", count " + std::to_string(count) + ", " + to_string(p) + ")";
    const auto xs = inputs<T>(count, 0x100 + count);
    const auto expected = reduce_in_rank_order(xs, op);
    const bool exact = o_.rank_ordered || op == zero::reduce_op::max;
    const std::vector<T>& mine = xs[static_cast<std::size_t>(rank_)];
    buffer<T> send(count), recv(count);
    send.write(mine);
    if (p == placement::in_place) {
      c_.all_reduce(send.data(), send.data(), count, op);
      expect_equal(send.read(), expected, where, exact, &xs);
    } else {
      recv.write(input<T>(-1, count, 7));  // stale contents that must all be overwritten
      c_.all_reduce(send.data(), recv.data(), count, op);
      expect_equal(recv.read(), expected, where, exact, &xs);
      expect_equal(send.read(), mine, where + " [send buffer changed]", true);
      expect_guards(recv, where, "receive");
    }
    expect_guards(send, where, "send");
  }

  template <class T>
  void reduce_scatter_case(std::size_t count, zero::reduce_op op, placement p) {
    const std::string where = std::string("reduce_scatter(") + zero::to_string(op) + ", " + type_name<T>() +
                              ", count " + std::to_string(count) + ", " + to_string(p) + ")";
    const std::size_t total = count * static_cast<std::size_t>(size_);
    const auto xs = inputs<T>(total, 0x200 + count);
    const auto full = reduce_in_rank_order(xs, op);
    const std::size_t base = count * static_cast<std::size_t>(rank_);
    const std::vector<T> expected(full.begin() + static_cast<std::ptrdiff_t>(base),
                                  full.begin() + static_cast<std::ptrdiff_t>(base + count));
    const bool exact = o_.rank_ordered || op == zero::reduce_op::max;
    const std::vector<T>& mine = xs[static_cast<std::size_t>(rank_)];
    buffer<T> send(total), recv(count);
    send.write(mine);
    if (p == placement::in_place) {
      // NCCL's rule: in place when recv is this rank's slice of send.
      c_.reduce_scatter(send.data(), send.data() + base, count, op);
      const auto all = send.read();
      const std::vector<T> got(all.begin() + static_cast<std::ptrdiff_t>(base),
                               all.begin() + static_cast<std::ptrdiff_t>(base + count));
      expect_equal(got, expected, where, exact, &xs, base);
    } else {
      recv.write(input<T>(-1, count, 7));
      c_.reduce_scatter(send.data(), recv.data(), count, op);
      expect_equal(recv.read(), expected, where, exact, &xs, base);
      expect_equal(send.read(), mine, where + " [send buffer changed]", true);
      expect_guards(recv, where, "receive");
    }
    expect_guards(send, where, "send");
  }

  template <class T>
  void all_gather_case(std::size_t count, placement p) {
    const std::string where = std::string("all_gather(") + type_name<T>() + ", count " + std::to_string(count) +
                              ", " + to_string(p) + ")";
    const std::size_t total = count * static_cast<std::size_t>(size_);
    const auto xs = inputs<T>(count, 0x300 + count);
    std::vector<T> expected;
    for (const auto& x : xs) expected.insert(expected.end(), x.begin(), x.end());
    const std::vector<T>& mine = xs[static_cast<std::size_t>(rank_)];
    buffer<T> send(count), recv(total);
    recv.write(input<T>(-1, total, 7));
    if (p == placement::in_place) {
      // NCCL's rule: in place when send is this rank's slot of recv.
      const std::size_t base = count * static_cast<std::size_t>(rank_);
      recv.write(mine, base);
      c_.all_gather(recv.data() + base, recv.data(), count);
    } else {
      send.write(mine);
      c_.all_gather(send.data(), recv.data(), count);
      expect_equal(send.read(), mine, where + " [send buffer changed]", true);
      expect_guards(send, where, "send");
    }
    expect_equal(recv.read(), expected, where, true);
    expect_guards(recv, where, "receive");
  }

  template <class T>
  void broadcast_case(std::size_t count, int root, placement p) {
    const std::string where = std::string("broadcast(") + type_name<T>() + ", count " + std::to_string(count) +
                              ", root " + std::to_string(root) + ", " + to_string(p) + ")";
    // Every rank passes different send data, so a backend that reads a non-root's send is caught.
    const auto xs = inputs<T>(count, 0x400 + count);
    const std::vector<T>& mine = xs[static_cast<std::size_t>(rank_)];
    const std::vector<T>& expected = xs[static_cast<std::size_t>(root)];
    buffer<T> send(count), recv(count);
    if (p == placement::in_place) {
      send.write(mine);
      c_.broadcast(send.data(), send.data(), count, root);
      expect_equal(send.read(), expected, where, true);
    } else {
      send.write(mine);
      recv.write(input<T>(-1, count, 7));
      c_.broadcast(send.data(), recv.data(), count, root);
      expect_equal(recv.read(), expected, where, true);
      expect_equal(send.read(), mine, where + " [send buffer changed]", true);
      expect_guards(recv, where, "receive");
    }
    expect_guards(send, where, "send");
  }

  // Block k of each rank's send goes to rank k: recv[k * count + i] = rank k's send[rank * count + i].
  template <class T>
  void all_to_all_case(std::size_t count) {
    const std::string where = std::string("all_to_all(") + type_name<T>() + ", count " + std::to_string(count) + ")";
    const std::size_t total = count * static_cast<std::size_t>(size_);
    const auto xs = inputs<T>(total, 0x600 + count);
    const std::vector<T>& mine = xs[static_cast<std::size_t>(rank_)];
    std::vector<T> expected;
    for (const auto& x : xs)
      expected.insert(expected.end(), x.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(rank_)),
                      x.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(rank_ + 1)));
    buffer<T> send(total), recv(total);
    send.write(mine);
    recv.write(input<T>(-1, total, 7));
    c_.all_to_all(send.data(), recv.data(), count);
    expect_equal(recv.read(), expected, where, true);
    expect_equal(send.read(), mine, where + " [send buffer changed]", true);
    expect_guards(recv, where, "receive");
    expect_guards(send, where, "send");
  }

  // Rank k arrives k * step late; nobody may leave before the last one arrived, so every rank
  // spends about (N-1) * step between its start and its exit. Measured on each rank's own clock
  // (which also holds across hosts), from its own exit of a first barrier: ranks leave that one at
  // slightly different moments on a loaded machine, so the bound is half of (N-1) * step. A
  // barrier that does not wait leaves after about zero.
  void barrier_timing() {
    constexpr auto step = std::chrono::milliseconds(15);
    c_.barrier();
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(step * rank_);
    c_.barrier();
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited < step * (size_ - 1) / 2)
      fail(rank_, size_, "barrier", "left after ",
           std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(waited).count()),
           " us, before the last rank arrived (", std::to_string((size_ - 1) * step.count()), " ms late)");
  }

  Comm& comm() { return c_; }
  const options& opts() const { return o_; }

 private:
  Comm& c_;
  options o_;
  int rank_, size_;
};

template <class T, class Comm>
void all_reduce_typed(checker<Comm>& ck) {
  for (std::size_t n : counts)
    for (auto op : {zero::reduce_op::sum, zero::reduce_op::max})
      for (auto p : {placement::out_of_place, placement::in_place}) ck.template all_reduce_case<T>(n, op, p);
}
template <class T, class Comm>
void reduce_scatter_typed(checker<Comm>& ck) {
  for (std::size_t n : counts)
    for (auto op : {zero::reduce_op::sum, zero::reduce_op::max})
      for (auto p : {placement::out_of_place, placement::in_place}) ck.template reduce_scatter_case<T>(n, op, p);
}
template <class T, class Comm>
void all_gather_typed(checker<Comm>& ck) {
  for (std::size_t n : counts)
    for (auto p : {placement::out_of_place, placement::in_place}) ck.template all_gather_case<T>(n, p);
}
template <class T, class Comm>
void broadcast_typed(checker<Comm>& ck) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{3001}})
    for (int root = 0; root < ck.size(); ++root)
      for (auto p : {placement::out_of_place, placement::in_place}) ck.template broadcast_case<T>(n, root, p);
}

// ---- the suite: one function per collective, each run by every rank of a launch ---------------

template <zero::CommBackend Comm>
void all_reduce(Comm& c, options o = {}) {
  checker<Comm> ck(c, o);
  all_reduce_typed<float>(ck);
  all_reduce_typed<double>(ck);
}

template <zero::CommBackend Comm>
void reduce_scatter(Comm& c, options o = {}) {
  checker<Comm> ck(c, o);
  reduce_scatter_typed<float>(ck);
  reduce_scatter_typed<double>(ck);
}

template <zero::CommBackend Comm>
void all_gather(Comm& c, options o = {}) {
  checker<Comm> ck(c, o);
  all_gather_typed<float>(ck);
  all_gather_typed<double>(ck);
}

template <zero::CommBackend Comm>
void broadcast(Comm& c, options o = {}) {
  checker<Comm> ck(c, o);
  broadcast_typed<float>(ck);
  broadcast_typed<double>(ck);
}

template <zero::CommBackend Comm>
void barrier(Comm& c, options o = {}) {
  checker<Comm> ck(c, o);
  for (int i = 0; i < 50; ++i) c.barrier();
  ck.barrier_timing();
  // A barrier between other collectives must not disturb them.
  ck.template all_reduce_case<float>(129, zero::reduce_op::sum, placement::out_of_place);
  c.barrier();
  ck.template all_gather_case<double>(7, placement::in_place);
}

// The determinism contract itself: repeated calls give the same bits; the inputs really do depend
// on the summation order (so the bit-exact checks above are not vacuous); all_reduce and
// reduce_scatter agree on every element, which is what makes stage 0 equal stages 1-3.
template <zero::CommBackend Comm>
void determinism(Comm& c, options o = {}) {
  checker<Comm> ck(c, o);
  const int r = c.rank(), n = c.size();
  const std::size_t count = 4096;
  const auto xs = ck.template inputs<float>(count * static_cast<std::size_t>(n), 0x500);
  const auto& mine = xs[static_cast<std::size_t>(r)];
  const std::size_t total = mine.size();

  guarded<float, typename Comm::system> buf(total), out(total), slice(count);
  // Same collectives on every rank whatever the mode; only the checks depend on it.
  std::vector<float> first;
  for (int rep = 0; rep < 3; ++rep) {
    buf.write(mine);
    c.all_reduce(buf.data(), out.data(), total, zero::reduce_op::sum);
    const auto got = out.read();
    if (rep == 0) first = got;
    else if (o.rank_ordered) ck.expect_equal(got, first, "all_reduce repeated " + std::to_string(rep) + " times", true);
  }
  buf.write(mine);
  c.reduce_scatter(buf.data(), slice.data(), count, zero::reduce_op::sum);
  if (o.rank_ordered) {
    const std::size_t base = count * static_cast<std::size_t>(r);
    const std::vector<float> from_all_reduce(first.begin() + static_cast<std::ptrdiff_t>(base),
                                             first.begin() + static_cast<std::ptrdiff_t>(base + count));
    ck.expect_equal(slice.read(), from_all_reduce, "reduce_scatter against all_reduce's slice", true);
    if (n >= 3) {
      std::vector<std::vector<float>> reversed(xs.rbegin(), xs.rend());
      const auto backwards = reduce_in_rank_order(reversed, zero::reduce_op::sum);
      const auto forwards = reduce_in_rank_order(xs, zero::reduce_op::sum);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < total; ++i) differ += std::memcmp(&forwards[i], &backwards[i], sizeof(float)) != 0;
      if (differ < total / 20)
        fail(r, n, "determinism", "only ", std::to_string(differ), " of ", std::to_string(total),
             " sums depend on the order: the inputs do not test rank order");
    }
  }
}

// ---- canonical NaNs -----------------------------------------------------------------------------

// The bits of T's canonical NaN (zero::store_as): what every reducing collective must store for a
// NaN, whether the sum made it (Inf + -Inf: x86 makes 0xffc00000, CUDA 0x7fffffff) or an input
// carried one with a sign and a payload.
template <class T>
std::uint64_t canonical_nan_bits() {
  if constexpr (sizeof(T) == 2) return std::is_same_v<T, zero::bf16> ? zero::canonical_bf16_nan : zero::canonical_fp16_nan;
  else if constexpr (sizeof(T) == 4) return zero::fp::canonical_nan_bits32;
  else return zero::fp::canonical_nan_bits64;
}
template <class T>
std::uint64_t bits_of(T v) {
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(std::uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
// A NaN with the sign bit and a low payload bit set: not the canonical one in any width.
template <class T>
T signed_payload_nan() {
  if constexpr (sizeof(T) == 2) return from_bits<T>(std::is_same_v<T, zero::bf16> ? 0xffc1u : 0xfe01u);
  else if constexpr (sizeof(T) == 4) return from_bits<T>(0xffc00001u);
  else return from_bits<T>(0xfff8000000000001ull);
}

// Element 4i+0: +Inf on rank 0, -Inf on the others (their sum is a NaN made by the adder); 4i+1: a
// signed payload NaN on the last rank, 1 elsewhere; 4i+2: +Inf everywhere (stays +Inf); 4i+3: rank + 1.
template <class T>
std::vector<T> nan_pattern(int rank, int size, std::size_t n) {
  std::vector<T> v(n);
  const T inf = static_cast<T>(std::numeric_limits<float>::infinity());
  for (std::size_t i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0: v[i] = rank == 0 ? inf : static_cast<T>(-std::numeric_limits<float>::infinity()); break;
      case 1: v[i] = rank == size - 1 ? signed_payload_nan<T>() : static_cast<T>(1.0f); break;
      case 2: v[i] = inf; break;
      default: v[i] = static_cast<T>(static_cast<float>(rank + 1)); break;
    }
  }
  return v;
}

// Whether element i of a reduction of nan_pattern over `size` ranks must be the canonical NaN. max
// is std::max(acc, x) in rank order: a NaN met after the first rank compares false and is dropped,
// one on the first rank stays.
inline bool nan_expected(std::size_t i, int size, zero::reduce_op op) {
  const bool sum = op == zero::reduce_op::sum;
  if (i % 4 == 1) return sum || size == 1;  // the NaN input, on the last rank
  return i % 4 == 0 && size > 1 && sum;     // Inf + -Inf
}

template <class T, class Comm>
void nan_canonical_typed(checker<Comm>& ck, const char* type) {
  Comm& c = ck.comm();
  const int r = ck.rank(), n = ck.size();
  const std::size_t count = 4 * 9;  // per rank: every pattern, and a ragged length for the vector paths
  auto check = [&](const std::vector<T>& got, std::size_t base, const std::string& where, zero::reduce_op op) {
    for (std::size_t i = 0; i < got.size(); ++i) {
      const std::size_t g = base + i;
      if (nan_expected(g, n, op)) {
        if (bits_of(got[i]) != canonical_nan_bits<T>())
          fail(r, n, where, "element ", std::to_string(g), " has bits 0x", hex(bits_of(got[i])),
               ", expected the canonical NaN 0x", hex(canonical_nan_bits<T>()));
      } else if (static_cast<double>(static_cast<float>(got[i])) != static_cast<double>(static_cast<float>(got[i]))) {
        fail(r, n, where, "element ", std::to_string(g), " is a NaN where none is expected");
      }
    }
  };
  for (auto op : {zero::reduce_op::sum, zero::reduce_op::max}) {
    const std::string suffix = std::string(", ") + zero::to_string(op) + ", " + type + ")";
    guarded<T, typename Comm::system> send(count * static_cast<std::size_t>(n)), recv(count * static_cast<std::size_t>(n));
    const auto mine = nan_pattern<T>(r, n, count * static_cast<std::size_t>(n));
    send.write(mine);
    c.all_reduce(send.data(), recv.data(), count * static_cast<std::size_t>(n), op);
    check(recv.read(), 0, "all_reduce of NaN-making inputs (" + suffix.substr(2), op);
    send.write(mine);
    c.reduce_scatter(send.data(), recv.data(), count, op);
    auto slice = recv.read();
    slice.resize(count);
    check(slice, count * static_cast<std::size_t>(r), "reduce_scatter of NaN-making inputs (" + suffix.substr(2), op);
    // In place too (a world of one may take a shorter path there).
    send.write(mine);
    c.all_reduce(send.data(), send.data(), count * static_cast<std::size_t>(n), op);
    check(send.read(), 0, "in-place all_reduce of NaN-making inputs (" + suffix.substr(2), op);
    send.write(mine);
    c.reduce_scatter(send.data(), send.data() + count * static_cast<std::size_t>(r), count, op);
    auto all = send.read();
    check(std::vector<T>(all.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(r)),
                         all.begin() + static_cast<std::ptrdiff_t>(count * static_cast<std::size_t>(r + 1))),
          count * static_cast<std::size_t>(r), "in-place reduce_scatter of NaN-making inputs (" + suffix.substr(2), op);
  }
}

// Reducing collectives store one canonical NaN per type, whatever the hardware made or the inputs
// carried, so host and device backends agree bit for bit in a step that overflows.
template <zero::CommBackend Comm>
void nan_canonical(Comm& c, options o = {}) {
  checker<Comm> ck(c, o);
  nan_canonical_typed<float>(ck, "float");
  nan_canonical_typed<double>(ck, "double");
  if constexpr (requires(zero::bf16* p) { c.all_reduce(p, p, std::size_t{1}, zero::reduce_op::sum); }) {
    nan_canonical_typed<zero::bf16>(ck, "bf16");
    nan_canonical_typed<zero::fp16>(ck, "fp16");
  }
}

// The other element types the engine moves (concepts/comm_backend.hpp, CommBackendForEngine): the
// settings check's and the reproducible mode's std::int64_t all_gather, all_reduce and reduce_scatter
// (sums exact in any order: checked bit for bit whatever options::rank_ordered says), and where the
// backend has them, qwZ's std::uint8_t all_gather and qgZ's std::uint8_t all_to_all.
template <zero::CommBackend Comm>
void engine_types(Comm& c, options o = {}) {
  o.rank_ordered = true;  // integer sums are exact in every order
  checker<Comm> ck(c, o);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{129}, std::size_t{1000}}) {
    for (auto p : {placement::out_of_place, placement::in_place}) {
      ck.template all_gather_case<std::int64_t>(n, p);
      ck.template all_reduce_case<std::int64_t>(n, zero::reduce_op::sum, p);
      ck.template reduce_scatter_case<std::int64_t>(n, zero::reduce_op::sum, p);
      if constexpr (comm::moves_bytes<Comm>) ck.template all_gather_case<std::uint8_t>(n, p);
    }
    if constexpr (comm::has_all_to_all<Comm>) ck.template all_to_all_case<std::uint8_t>(n);
  }
}

// Everything above, in one call.
template <zero::CommBackend Comm>
void all(Comm& c, options o = {}) {
  all_reduce(c, o);
  reduce_scatter(c, o);
  all_gather(c, o);
  broadcast(c, o);
  barrier(c, o);
  determinism(c, o);
  if (o.rank_ordered) nan_canonical(c, o);
}

}  // namespace zero::conformance
