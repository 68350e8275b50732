// Collective tests: conformance of comm::threads and counted<threads>, bus-byte counting, thread-backend faults and waiting.
#include <doctest/doctest.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../core/isa_levels.hpp"
#include "../plain_threads.hpp"
#include "zero/comm/any_backend.hpp"
#include "zero/comm/conformance.hpp"
#include "zero/comm/mesh.hpp"
#include "zero/comm/call_label.hpp"
#include "zero/comm/counted.hpp"
#include "zero/comm/detail/combine.hpp"
#include "zero/comm/detail/streaming_copy.hpp"
#include "zero/comm/detail/threads_world.hpp"
#include "zero/comm/backends/modeled.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/comm/verified.hpp"
#include "zero/core/half_types.hpp"
#include "zero/core/numeric.hpp"
#include "zero/error.hpp"

namespace {

using zero::comm::counted;
using zero::comm::threads;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// A launch of N ranks on a backend: the type parameter of the conformance test cases.
template <int N>
struct threads_world {
  template <class F>
  static void launch(F f) {
    threads::launch(N, [&](threads& c) { f(c); });
  }
};
template <int N>
struct counted_world {
  template <class F>
  static void launch(F f) {
    threads::launch(N, [&](threads& t) {
      counted<threads> c(t);
      f(c);
    });
  }
};

}  // namespace

TYPE_TO_STRING_AS("threads x1", threads_world<1>);
TYPE_TO_STRING_AS("threads x2", threads_world<2>);
TYPE_TO_STRING_AS("threads x3", threads_world<3>);
TYPE_TO_STRING_AS("threads x4", threads_world<4>);
TYPE_TO_STRING_AS("threads x7", threads_world<7>);
TYPE_TO_STRING_AS("threads x8", threads_world<8>);
TYPE_TO_STRING_AS("counted<threads> x1", counted_world<1>);
TYPE_TO_STRING_AS("counted<threads> x2", counted_world<2>);
TYPE_TO_STRING_AS("counted<threads> x3", counted_world<3>);
TYPE_TO_STRING_AS("counted<threads> x4", counted_world<4>);
TYPE_TO_STRING_AS("counted<threads> x7", counted_world<7>);
TYPE_TO_STRING_AS("counted<threads> x8", counted_world<8>);

#define ZERO_WORLDS                                                                                           \
  threads_world<1>, threads_world<2>, threads_world<3>, threads_world<4>, threads_world<7>, threads_world<8>, \
      counted_world<1>, counted_world<2>, counted_world<3>, counted_world<4>, counted_world<7>, counted_world<8>

TEST_CASE_TEMPLATE("conformance: all_reduce", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::all_reduce(c); });
}
TEST_CASE_TEMPLATE("conformance: reduce_scatter", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::reduce_scatter(c); });
}
TEST_CASE_TEMPLATE("conformance: all_gather", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::all_gather(c); });
}
TEST_CASE_TEMPLATE("conformance: broadcast", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::broadcast(c); });
}
TEST_CASE_TEMPLATE("conformance: barrier", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::barrier(c); });
}
TEST_CASE_TEMPLATE("conformance: determinism", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::determinism(c); });
}
TEST_CASE_TEMPLATE("conformance: canonical NaNs", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::nan_canonical(c); });
}
TEST_CASE_TEMPLATE("conformance: the engine's other types (int64, bytes, all_to_all)", W, ZERO_WORLDS) {
  W::launch([](auto& c) { zero::conformance::engine_types(c); });
}

// The threads backend's group sums on packs (comm/detail/combine.hpp: sum_group) at every ISA level the
// CPU has: the bits of the scalar additions in rank order, a NaN reported wherever one sum is NaN,
// across whole packs and the tail, for each type the engine reduces.
namespace {
template <class T>
void check_group_sums(std::mt19937_64& rng) {
  for (std::size_t n : {std::size_t{2}, std::size_t{3}, std::size_t{5}}) {
    for (std::size_t g : {std::size_t{1}, std::size_t{7}, 256 / sizeof(T) - 1, 256 / sizeof(T)}) {
      const std::size_t at = 3;  // the group's first element in every input: packs not aligned
      std::vector<std::vector<T>> in(n, std::vector<T>(at + g));
      for (auto& v : in)
        for (T& x : v) {
          if constexpr (std::is_floating_point_v<T>)
            x = std::ldexp(static_cast<T>(std::uniform_real_distribution<double>(-1.0, 1.0)(rng)),
                           std::uniform_int_distribution<int>(-20, 20)(rng));
          else
            // Below 2^(bits - 5) in magnitude: five inputs never overflow (the engine's words never do).
            x = static_cast<T>(static_cast<std::int64_t>(rng() >> (69 - 8 * sizeof(T))) -
                               (std::int64_t{1} << (8 * sizeof(T) - 6)));
        }
      const bool with_nan = std::is_floating_point_v<T> && g > 1;
      if constexpr (std::is_floating_point_v<T>)
        if (with_nan) in[n - 1][at + g - 2] = std::numeric_limits<T>::quiet_NaN();
      std::vector<const void*> ins;
      for (const auto& v : in) ins.push_back(v.data());
      std::vector<T> want(g);
      for (std::size_t j = 0; j < g; ++j) {
        T s = in[0][at + j];
        for (std::size_t k = 1; k < n; ++k) {
          s += in[k][at + j];
        }
        want[j] = s;
      }
      for (zero::sys::host_loop::isa level : isa_levels::available()) {
        const isa_levels::cap_guard guard(level);
        INFO("level ", zero::sys::host_loop::name(level), ", inputs ", n, ", group ", g, ", ", sizeof(T), "-byte type");
        std::vector<T> got(g);
        const bool nan = zero::comm::detail::sum_group(got.data(), ins.data(), n, at, g);
        CHECK(nan == with_nan);
        for (std::size_t j = 0; j < g; ++j) {
          if (with_nan && j == g - 2) continue;  // a NaN: its bits are made canonical by the caller
          CHECK(std::memcmp(&got[j], &want[j], sizeof(T)) == 0);
        }
      }
    }
  }
}
}  // namespace

TEST_CASE("threads backend: a group's sums on packs have the scalar sums' bits at every ISA level") {
  std::mt19937_64 rng(20261205);
  check_group_sums<float>(rng);
  check_group_sums<double>(rng);
  check_group_sums<std::int64_t>(rng);
  check_group_sums<std::int32_t>(rng);
}

// ---- the suite catches broken backends ---------------------------------------------------------

namespace {

// comm::threads with one deliberate defect, to show that the suite is not vacuous.
enum class defect { reversed_sum, broadcast_from_rank0, writes_past_end };

template <defect D>
class mutant {
 public:
  using system = zero::sys::host;
  explicit mutant(threads& t) : t_(&t) {}
  int rank() const { return t_->rank(); }
  int size() const { return t_->size(); }

  template <class T>
  void all_reduce(const T* send, T* recv, std::size_t count, zero::reduce_op op) {
    if constexpr (D != defect::reversed_sum) return t_->all_reduce(send, recv, count, op);
    const auto n = static_cast<std::size_t>(size());
    std::vector<T> all(n * count);
    t_->all_gather(send, all.data(), count);
    for (std::size_t i = 0; i < count; ++i) {
      T acc = all[(n - 1) * count + i];
      for (std::size_t k = n - 1; k-- > 0;) zero::comm::detail::combine(&acc, &all[k * count + i], 1, op);
      recv[i] = acc;
    }
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t count, zero::reduce_op op) {
    if constexpr (D == defect::writes_past_end) {
      std::vector<T> full(count * static_cast<std::size_t>(size()) + 1);
      t_->all_reduce(send, full.data(), count * static_cast<std::size_t>(size()), op);
      std::memcpy(recv, full.data() + count * static_cast<std::size_t>(rank()), (count + 1) * sizeof(T));
    } else {
      t_->reduce_scatter(send, recv, count, op);
    }
  }
  template <class T>
  void all_gather(const T* send, T* recv, std::size_t count) {
    t_->all_gather(send, recv, count);
  }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t count, int root) {
    t_->broadcast(send, recv, count, D == defect::broadcast_from_rank0 ? 0 : root);
  }
  void barrier() { t_->barrier(); }

 private:
  threads* t_;
};
static_assert(zero::CommBackend<mutant<defect::reversed_sum>>);

template <defect D, class Suite>
std::string failure_of(int n, Suite suite) {
  try {
    threads::launch(n, [&](threads& t) {
      mutant<D> m(t);
      suite(m);
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no failure)";
}

}  // namespace

TEST_CASE("conformance: the suite rejects a backend that sums out of rank order") {
  const std::string what = failure_of<defect::reversed_sum>(3, [](auto& c) { zero::conformance::all_reduce(c); });
  CHECK(what.find("all_reduce(sum, float") != std::string::npos);
  CHECK(what.find("bit-exact") != std::string::npos);
}
TEST_CASE("conformance: the suite rejects a broadcast that ignores the root") {
  const std::string what = failure_of<defect::broadcast_from_rank0>(2, [](auto& c) { zero::conformance::broadcast(c); });
  CHECK(what.find("root 1") != std::string::npos);
}
TEST_CASE("conformance: the suite rejects a collective that writes past the receive buffer") {
  const std::string what = failure_of<defect::writes_past_end>(2, [](auto& c) { zero::conformance::reduce_scatter(c); });
  CHECK(what.find("wrote outside the receive buffer") != std::string::npos);
}

// ---- verified: call agreement and data checks over any backend ---------------------------------

namespace {

// A verified backend over a mutant, built from the rank's threads communicator.
template <defect D>
struct verified_mutant {
  explicit verified_mutant(threads& t) : m(t), v(m) {}
  mutant<D> m;
  zero::comm::verified<mutant<D>> v;
};

// What every rank threw, by rank ("(no failure)" where it did not).
template <class F>
std::vector<std::string> failures(int n, F f) {
  std::vector<std::string> seen(static_cast<std::size_t>(n), "(no failure)");
  try {
    threads::launch(n, [&](threads& t) {
      try {
        f(t);
      } catch (const zero::error& e) {
        CHECK(e.kind() == zero::error_kind::comm);
        seen[static_cast<std::size_t>(t.rank())] = e.what();
        throw;
      }
    });
  } catch (const zero::error&) {
  }
  return seen;
}

}  // namespace

TEST_CASE("verified: comm::threads passes the conformance suite under it, with and without counted, and in a split") {
  threads::launch(3, [](threads& t) {
    zero::comm::verified<threads> v(t);
    zero::conformance::all(v);
    zero::conformance::engine_types(v);
    auto half = v.split(t.rank() == 2 ? 1 : 0);
    zero::conformance::all_reduce(*half);
    // One more call costs one agreement all-gather (13 words) and one data all-gather: for an
    // all_reduce of 100 elements, 64 sampled inputs, the checksum and 64 sampled results (129 words),
    // each word as two doubles, (N - 1)/N of N ranks' words by the bus-volume rule.
    const zero::comm::verified_stats before = v.stats();
    std::vector<float> x(100, 1.0f);
    v.all_reduce(x.data(), x.data(), 100, zero::reduce_op::sum);
    CHECK(v.stats().calls == before.calls + 1);
    CHECK(v.stats().collectives == before.collectives + 2);
    CHECK(v.stats().bytes - before.bytes == (13 + 129) * 16 * 2);
  });
  threads::launch(2, [](threads& t) {
    // Over a nonblocking backend (counted offers the interface), started calls are checked at wait.
    counted<threads> c(t);
    zero::comm::verified<counted<threads>> v(c);
    static_assert(zero::comm::check_nonblocking<zero::comm::verified<counted<threads>>>());
    std::vector<std::int64_t> s{1, 2, 3, 4}, r(2);
    auto q = v.start_reduce_scatter(s.data(), r.data(), 2, zero::reduce_op::sum);
    v.wait(q);
    CHECK(r[0] == 2 * (1 + 2 * t.rank()));
    // The wrapped counter sees the call and the two all-gathers of its checks; an engine's counters
    // sit above the verified backend (counted<verified<C>>) and see only the call.
    CHECK(c.stats().calls[static_cast<int>(zero::comm::collective::reduce_scatter)] == 1);
    CHECK(c.stats().calls[static_cast<int>(zero::comm::collective::all_gather)] == 2);
    CHECK(c.stats()[zero::comm::collective::all_gather] == v.stats().bytes);
  });
}

namespace {

// comm::threads without all_to_all and split (plain_threads.hpp): what any_backend must refuse at the call.
using zero_test::plain_threads;

}  // namespace

TEST_CASE("any_backend: a backend behind it passes the conformance suite, in a split too, and keeps its call labels") {
  using any = zero::comm::any_backend<zero::sys::host>;
  static_assert(zero::CommBackendForEngine<any, zero::bf16> && zero::CommBackendForEngine<any, zero::fp16>);
  static_assert(zero::comm::check_nonblocking<any, zero::bf16>() && zero::comm::check_split<any>() &&
                zero::comm::check_all_to_all<any>() && zero::comm::check_call_labels<any>());
  threads::launch(3, [](threads& t) {
    any a(t);
    CHECK(a.rank() == t.rank());
    CHECK(a.size() == 3);
    zero::conformance::all(a);
    zero::conformance::engine_types(a);
    std::unique_ptr<any> half = a.split(t.rank() == 2 ? 1 : 0);
    CHECK(half->size() == (t.rank() == 2 ? 1 : 2));
    zero::conformance::all_reduce(*half);
    // Labels reach comm::threads: ranks whose calls differ only in their labels are told so.
    const zero::comm::call_label previous = a.set_call_label({"reduce", t.rank() == 0 ? "fc1" : "fc2"});
    CHECK(previous.phase == nullptr);
    float x = 1;
    CHECK_THROWS_WITH_AS(a.all_reduce(&x, &x, 1, zero::reduce_op::sum), doctest::Contains("fc1"), zero::error);
  });
}

TEST_CASE("any_backend: its starts overlap where the wrapped backend's do, and missing members fail naming them") {
  using any = zero::comm::any_backend<zero::sys::host>;
  threads::launch(2, [](threads& t) {
    // comm::threads is blocking: a start completes in its call, and counted (the engine) sees no overlap.
    any a(t);
    CHECK_FALSE(a.overlaps());
    CHECK_FALSE(counted<any>(a).overlaps());
    std::vector<float> s{1, 2, 3, 4}, r(2);
    any::request q = a.start_reduce_scatter(s.data(), r.data(), 2, zero::reduce_op::sum);
    CHECK(r[0] == 2.0f * static_cast<float>(1 + 2 * t.rank()));
    a.wait(q);
    // comm::modeled is nonblocking: the request is its own, waited through any_backend's.
    zero::comm::modeled<threads> m(t);
    any b(m);
    CHECK(b.overlaps());
    CHECK(counted<any>(b).overlaps());
    std::vector<std::int64_t> si{5, 6}, ri(4);
    any::request g = b.start_all_gather(si.data(), ri.data(), 2);
    b.wait(g);
    CHECK(ri == std::vector<std::int64_t>{5, 6, 5, 6});
    CHECK(m.stats().calls == 1);
    // A backend without all_to_all or split: the call fails on every rank, naming the member.
    plain_threads p(t);
    any c(p);
    std::uint8_t u[2] = {1, 2}, v[2];
    CHECK_THROWS_WITH_AS(c.all_to_all(u, v, 1), doctest::Contains("has no all_to_all"), zero::error);
    CHECK_THROWS_WITH_AS((void)c.split(0), doctest::Contains("has no split"), zero::error);
    c.all_reduce(u, v, 2, zero::reduce_op::sum);
    CHECK(v[1] == 4);
  });
}

TEST_CASE("mesh: every dp x tp shape of 8 ranks: coordinates, groups of adjacent tensor-parallel ranks, rank order") {
  for (const zero::comm::mesh_shape shape : {zero::comm::mesh_shape{1, 8}, {2, 4}, {4, 2}, {8, 1}}) {
    CAPTURE(shape.dp);
    CAPTURE(shape.tp);
    threads::launch(8, [&](threads& t) {
      zero::comm::mesh<threads> m(t, shape);
      const zero::comm::mesh_coordinates at = m.coordinates();
      CHECK(at == zero::comm::mesh_coordinates{t.rank() / shape.tp, t.rank() % shape.tp});
      CHECK(zero::comm::mesh_rank_of(shape, at) == t.rank());
      CHECK(m.tp().size() == shape.tp);
      CHECK(m.tp().rank() == at.tp);
      CHECK(m.dp().size() == shape.dp);
      CHECK(m.dp().rank() == at.dp);
      // Each group gathers its members' world ranks in its own rank order: the tensor-parallel group
      // is tp consecutive ranks, the data-parallel group the ranks of equal tp index, tp apart.
      const int me = t.rank();
      std::vector<int> tp_members(static_cast<std::size_t>(shape.tp)), dp_members(static_cast<std::size_t>(shape.dp));
      m.tp().all_gather(&me, tp_members.data(), 1);
      m.dp().all_gather(&me, dp_members.data(), 1);
      for (int k = 0; k < shape.tp; ++k) CHECK(tp_members[static_cast<std::size_t>(k)] == at.dp * shape.tp + k);
      for (int k = 0; k < shape.dp; ++k) CHECK(dp_members[static_cast<std::size_t>(k)] == k * shape.tp + at.tp);
      // The groups are independent of each other and of the world: interleaved calls do not mix.
      zero::conformance::all_reduce(m.dp());
      zero::conformance::all_reduce(m.tp());
      m.world().barrier();
    });
  }
}

TEST_CASE("mesh: a shape that does not fit the world is refused on every rank before any collective, naming it") {
  struct bad {
    zero::comm::mesh_shape shape;
    const char* says;
  };
  for (const bad b : {bad{{3, 2}, "mesh 3 x 2 (dp x tp) has 6 ranks but the world has 4"},
                      bad{{0, 4}, "mesh 0 x 4 (dp x tp): each dimension must be at least 1"},
                      bad{{4, -1}, "must be at least 1"},
                      bad{{65536, 65536}, "has 4294967296 ranks but the world has 4"}}) {
    CAPTURE(b.says);
    std::atomic<int> refused{0};
    // No rank reaches a collective: a rank that did would wait for the others until the timeout.
    threads::launch(4, [&](threads& t) {
      CHECK_THROWS_WITH_AS(zero::comm::mesh<threads>(t, b.shape), doctest::Contains(b.says), zero::error);
      refused += 1;
    });
    CHECK(refused == 4);
  }
}

TEST_CASE("verified: a backend that sums out of rank order fails at its first all_reduce, naming the call and ranks") {
  for (int n : {3, 4}) {
    CAPTURE(n);
    const auto seen = failures(n, [](threads& t) {
      verified_mutant<defect::reversed_sum> b(t);
      std::vector<float> x = zero::conformance::input<float>(t.rank(), 1000, 5), y(1000);
      b.v.broadcast(x.data(), y.data(), 10, 0);  // a correct call first: it passes
      const zero::comm::scoped_label l(b.v, "reduce", "fc2");
      b.v.all_reduce(x.data(), y.data(), 1000, zero::reduce_op::sum);
    });
    for (const std::string& w : seen) {
      CAPTURE(w);
      CHECK(w.find("comm::verified rank ") == 0);
      CHECK(w.find("call #1 all_reduce(float x 1000, sum) for reduce unit 'fc2'") != std::string::npos);
      CHECK(w.find("is not the rank-ordered reduction of the ranks' inputs") != std::string::npos);
      CHECK(w.find(n == 3 ? "rank(s) 0, 1, 2" : "rank(s) 0, 1, 2, 3") != std::string::npos);
    }
  }
}

TEST_CASE("verified: ranks that make different calls, or receive wrong blocks, fail on every rank naming them") {
  SUBCASE("different counts and labels") {
    const auto seen = failures(3, [](threads& t) {
      zero::comm::verified<threads> v(t);
      std::vector<float> x(8, 1.0f);
      const zero::comm::scoped_label l(v, "reduce", t.rank() == 1 ? "b" : "a");
      v.all_reduce(x.data(), x.data(), t.rank() == 2 ? 7 : 8, zero::reduce_op::sum);
    });
    for (const std::string& w : seen) {
      CAPTURE(w);
      CHECK(w.find("call #0: the ranks' calls differ (in the count and the label): rank(s) 0 call #0 all_reduce(float "
                   "x 8, sum) for reduce unit 'a'; rank(s) 1 call #0 all_reduce(float x 8, sum) for reduce unit 'b'; "
                   "rank(s) 2 call #0 all_reduce(float x 7, sum) for reduce unit 'a'") != std::string::npos);
    }
  }
  SUBCASE("a broadcast from the wrong root") {
    const auto seen = failures(3, [](threads& t) {
      verified_mutant<defect::broadcast_from_rank0> b(t);
      std::vector<double> x(5, t.rank() + 1.0), y(5);
      b.v.broadcast(x.data(), y.data(), 5, 2);
    });
    for (const std::string& w : seen)
      CHECK(w.find("call #0 broadcast(double x 5, root 2): rank(s) 0, 1, 2 received wrong data (checksums): on rank "
                   "0, the result is not the root's send buffer") != std::string::npos);
  }
}

// ---- counted: bus bytes -----------------------------------------------------------------------

TEST_CASE("counted: bus bytes per collective follow the nccl-tests convention exactly") {
  for (int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    const auto N = static_cast<std::uint64_t>(n);
    constexpr std::size_t k = 24;  // elements per rank; every full buffer is a multiple of N
    std::vector<zero::comm::comm_stats> seen(static_cast<std::size_t>(n)), after_reset(static_cast<std::size_t>(n));
    threads::launch(n, [&](threads& t) {
      counted<threads> c(t);
      std::vector<float> f(N * k, 1.0f), g(N * k);
      std::vector<double> d(N * k, 1.0), e(N * k);
      c.all_reduce(f.data(), g.data(), N * k, zero::reduce_op::sum);  // buffer N k 4 bytes
      c.all_reduce(d.data(), d.data(), N * k, zero::reduce_op::max);  // buffer N k 8 bytes
      c.reduce_scatter(f.data(), g.data(), k, zero::reduce_op::sum);  // buffer N k 4 bytes
      c.all_gather(d.data(), e.data(), k);                             // buffer N k 8 bytes
      c.broadcast(f.data(), g.data(), k, 0);                           // buffer k 4 bytes
      c.broadcast(d.data(), d.data(), k, n - 1);                       // buffer k 8 bytes
      c.barrier();                                                     // moves no data
      seen[static_cast<std::size_t>(c.rank())] = c.stats();
      c.reset();
      after_reset[static_cast<std::size_t>(c.rank())] = c.stats();
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto& s = seen[static_cast<std::size_t>(r)];
      using zero::comm::collective;
      // 2(N-1)/N, (N-1)/N, (N-1)/N and 1 times the buffer; nothing at all for one rank.
      CHECK(s[collective::all_reduce] == (n > 1 ? 2 * (N - 1) * k * 4 + 2 * (N - 1) * k * 8 : 0));
      CHECK(s[collective::reduce_scatter] == (N - 1) * k * 4);
      CHECK(s[collective::all_gather] == (N - 1) * k * 8);
      CHECK(s[collective::broadcast] == (n > 1 ? k * 4 + k * 8 : 0));
      CHECK(s.total_bytes() == s[collective::all_reduce] + s[collective::reduce_scatter] +
                                   s[collective::all_gather] + s[collective::broadcast]);
      CHECK(s.calls[static_cast<int>(collective::all_reduce)] == 2);
      CHECK(s.calls[static_cast<int>(collective::reduce_scatter)] == 1);
      CHECK(s.calls[static_cast<int>(collective::all_gather)] == 1);
      CHECK(s.calls[static_cast<int>(collective::broadcast)] == 2);
      CHECK(after_reset[static_cast<std::size_t>(r)].total_bytes() == 0);
      const auto diff = s - zero::comm::comm_stats{};
      CHECK(diff.total_bytes() == s.total_bytes());
    }
  }
}

TEST_CASE("counted: bus bytes round down when N does not divide the buffer") {
  using zero::comm::collective;
  // 7 floats = 28 bytes on 3 ranks: 2 * 2/3 * 28 = 37.33 -> 37, and 2/3 * 84 = 56 exactly.
  CHECK(zero::comm::bus_bytes(collective::all_reduce, 28, 3) == 37);
  CHECK(zero::comm::bus_bytes(collective::reduce_scatter, 84, 3) == 56);
  CHECK(zero::comm::bus_bytes(collective::broadcast, 28, 3) == 28);
  CHECK(zero::comm::bus_bytes(collective::all_gather, 28, 1) == 0);
}

TEST_CASE("counted: bus_factor is the nccl-tests factor") {
  using zero::comm::bus_factor;
  using zero::comm::collective;
  CHECK(bus_factor(collective::all_reduce, 4) == 1.5);
  CHECK(bus_factor(collective::reduce_scatter, 4) == 0.75);
  CHECK(bus_factor(collective::all_gather, 8) == 0.875);
  CHECK(bus_factor(collective::broadcast, 8) == 1.0);
  CHECK(bus_factor(collective::all_reduce, 1) == 0.0);
  for (int n : {2, 3, 4, 8})
    for (auto c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast})
      CHECK(static_cast<double>(zero::comm::bus_bytes(c, 1ull << 30, n)) ==
            doctest::Approx(bus_factor(c, n) * double(1ull << 30)).epsilon(1e-9));
}

// ---- comm::threads faults: errors on every rank, in bounded time, never a hang ------------------

namespace {

// What one rank saw when its collective failed.
struct outcome {
  bool failed = false;
  zero::error_kind kind = zero::error_kind::invalid_argument;
  std::string what;
  double waited = 0;
};

template <class F>
void record(outcome& o, F&& collective) {
  const auto t0 = clock_type::now();
  try {
    collective();
  } catch (const zero::error& e) {
    o = {true, e.kind(), e.what(), seconds_since(t0)};
    throw;
  }
}

}  // namespace

TEST_CASE("threads: a rank that throws fails the others' pending collectives, well before the timeout") {
  constexpr int n = 4;
  threads::options opt;
  opt.timeout = std::chrono::seconds(60);
  std::vector<outcome> seen(n);
  std::string first;
  const auto t0 = clock_type::now();
  try {
    threads::launch(
        n,
        [&](threads& c) {
          if (c.rank() == 2) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting by then
            throw std::runtime_error("injected failure");
          }
          std::vector<float> x(100, 1.0f);
          record(seen[static_cast<std::size_t>(c.rank())],
                 [&] { c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum); });
        },
        opt);
  } catch (const std::exception& e) {
    first = e.what();
  }
  const double total = seconds_since(t0);
  CHECK(first == "injected failure");  // the cause, not one of its consequences
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    const auto& o = seen[static_cast<std::size_t>(r)];
    CHECK(o.failed);
    CHECK(o.kind == zero::error_kind::comm);
    CHECK(o.what.find("rank 2 failed: injected failure") != std::string::npos);
    // The call, by its fingerprint, and where every rank stood: rank 2 never reached a collective.
    CHECK(o.what.find("rank " + std::to_string(r) + ": #0 all_reduce(float x 100, sum) aborted") != std::string::npos);
    CHECK(o.what.find("rank 2: no collective yet, then threw") != std::string::npos);
    CHECK(o.what.find("rank 1: in #0 all_reduce(float x 100, sum) since +") != std::string::npos);
    CHECK(o.waited < 2.0);
  }
  CHECK(total < 5.0);
}

TEST_CASE("threads: a rank that returns while the others wait in a collective fails them") {
  constexpr int n = 3;
  threads::options opt;
  opt.timeout = std::chrono::seconds(60);
  std::vector<outcome> seen(n);
  std::string first;
  const auto t0 = clock_type::now();
  try {
    threads::launch(
        n,
        [&](threads& c) {
          std::vector<double> x(3, 1.0);
          c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
          if (c.rank() == 0) return;  // forgets the barrier
          record(seen[static_cast<std::size_t>(c.rank())], [&] { c.barrier(); });
        },
        opt);
  } catch (const zero::error& e) {
    first = e.what();
    CHECK(e.kind() == zero::error_kind::comm);
  }
  CHECK(first.find("rank 0 returned after 1 collective(s) while rank") != std::string::npos);
  for (int r : {1, 2}) {
    CAPTURE(r);
    const auto& o = seen[static_cast<std::size_t>(r)];
    CHECK(o.failed);
    CHECK(o.kind == zero::error_kind::comm);
    CHECK(o.what.find("rank " + std::to_string(r) + ": #1 barrier aborted: rank 0 returned after 1 collective(s)") !=
          std::string::npos);
    CHECK(o.what.find("rank 0: not in a collective since +") != std::string::npos);
    CHECK(o.what.find("(last: #0 all_reduce(double x 3, sum)), then returned") != std::string::npos);
    CHECK(o.waited < 2.0);
  }
  CHECK(seconds_since(t0) < 5.0);
}

TEST_CASE("threads: a collective that waits longer than the timeout fails on every rank") {
  constexpr int n = 3;
  threads::options opt;
  opt.timeout = std::chrono::milliseconds(200);
  std::vector<outcome> seen(n);
  std::atomic<int> failed{0};
  try {
    threads::launch(
        n,
        [&](threads& c) {
          const auto r = static_cast<std::size_t>(c.rank());
          if (c.rank() == 0) {
            // Late, but alive: arrives only after the others have given up (or after 10 s).
            const auto t0 = clock_type::now();
            while (failed.load() < n - 1 && seconds_since(t0) < 10.0)
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          try {
            record(seen[r], [&] { c.barrier(); });
          } catch (...) {
            ++failed;
            throw;
          }
        },
        opt);
  } catch (const zero::error&) {
  }
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    const auto& o = seen[static_cast<std::size_t>(r)];
    CHECK(o.failed);
    CHECK(o.kind == zero::error_kind::comm);
    CHECK(o.what.find("waited 200 ms in #0 barrier but only 2 of 3 ranks arrived (missing: rank 0)") !=
          std::string::npos);
    if (r > 0) {
      CHECK(o.waited >= 0.19);
      CHECK(o.waited < 2.0);
    }
  }
}

TEST_CASE("threads: ranks that disagree on a collective all get an error naming both calls") {
  constexpr int n = 3;
  // Rank 1 deviates from the others in one respect per case; `names` is the part of the message that
  // must name both fingerprints and the field that differs.
  struct deviation {
    const char* name;
    void (*call)(threads&, bool deviate);
    const char* names;
  };
  const deviation cases[] = {
      {"count",
       [](threads& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         c.all_reduce(x.data(), x.data(), dev ? 5 : 4, zero::reduce_op::sum);
       },
       "rank 0 calls #0 all_reduce(float x 4, sum), rank 1 calls #0 all_reduce(float x 5, sum) (they differ in the "
       "count)"},
      {"op",
       [](threads& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         c.all_reduce(x.data(), x.data(), 4, dev ? zero::reduce_op::max : zero::reduce_op::sum);
       },
       "rank 1 calls #0 all_reduce(float x 4, max) (they differ in the reduction op)"},
      {"collective",
       [](threads& c, bool dev) {
         std::vector<float> x(32, 1.0f);
         if (dev) c.all_gather(x.data(), x.data() + 8, 4);
         else c.all_reduce(x.data(), x.data(), 4, zero::reduce_op::sum);
       },
       "rank 0 calls #0 all_reduce(float x 4, sum), rank 1 calls #0 all_gather(float x 4) (they differ in the "
       "operation)"},
      {"element type of the same size",
       [](threads& c, bool dev) {
         std::vector<float> f(8, 1.0f);
         std::vector<std::int32_t> i(8, 1);
         if (dev) c.all_reduce(i.data(), i.data(), 4, zero::reduce_op::sum);
         else c.all_reduce(f.data(), f.data(), 4, zero::reduce_op::sum);
       },
       "rank 1 calls #0 all_reduce(int32 x 4, sum) (they differ in the element type)"},
      {"root",
       [](threads& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         c.broadcast(x.data(), x.data(), 4, dev ? 1 : 0);
       },
       "rank 0 calls #0 broadcast(float x 4, root 0), rank 1 calls #0 broadcast(float x 4, root 1)"},
      // Issue 9, case 11: calls of equal shape for different units exchanged the wrong data silently.
      {"label",
       [](threads& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         const zero::comm::scoped_label l(c, "reduce", dev ? "fc1" : "fc2");
         c.all_reduce(x.data(), x.data(), 4, zero::reduce_op::sum);
       },
       "rank 0 calls #0 all_reduce(float x 4, sum) for reduce unit 'fc2', rank 1 calls #0 all_reduce(float x 4, sum) "
       "for reduce unit 'fc1' (they differ in the label)"},
      // A rank that skips a collective meets its peers in the next one: the sequence numbers agree (each
      // rank counts its own calls) but the calls do not.
      {"skipped collective",
       [](threads& c, bool dev) {
         std::vector<float> x(8, 1.0f);
         c.all_reduce(x.data(), x.data(), 4, zero::reduce_op::sum);
         if (!dev) c.all_reduce(x.data(), x.data(), 8, zero::reduce_op::sum);
         c.barrier();
       },
       "rank 0 calls #1 all_reduce(float x 8, sum), rank 1 calls #1 barrier (they differ in the operation, the element "
       "type and the count)"},
  };
  for (const auto& d : cases) {
    CAPTURE(d.name);
    std::vector<outcome> seen(n);
    threads::launch(n, [&](threads& c) {
      try {
        record(seen[static_cast<std::size_t>(c.rank())], [&] { d.call(c, c.rank() == 1); });
      } catch (const zero::error&) {
        // Expected on every rank; returning normally shows that no rank is left blocked.
      }
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto& o = seen[static_cast<std::size_t>(r)];
      CHECK(o.failed);
      CHECK(o.kind == zero::error_kind::comm);
      CHECK(o.what.find("comm::threads rank " + std::to_string(r) + ": ranks disagree on the collective: ") !=
            std::string::npos);
      CHECK(o.what.find(d.names) != std::string::npos);
      CHECK(o.what.find("last collectives of rank " + std::to_string(r)) != std::string::npos);
    }
  }
}

TEST_CASE("threads: a rank that skips the last collective fails the others naming it and their call") {
  constexpr int n = 3;
  std::vector<outcome> seen(n);
  try {
    threads::launch(n, [&](threads& c) {
      std::vector<float> x(16, 1.0f);
      c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
      if (c.rank() == 2) return;  // skips the all_gather below
      record(seen[static_cast<std::size_t>(c.rank())], [&] { c.all_gather(x.data(), x.data(), 4); });
    });
  } catch (const zero::error&) {
  }
  for (int r : {0, 1}) {
    CAPTURE(r);
    const auto& o = seen[static_cast<std::size_t>(r)];
    CHECK(o.failed);
    CHECK(o.what.find("rank 2 returned after 1 collective(s) while rank ") != std::string::npos);
    CHECK(o.what.find(" waits in #1 all_gather(float x 4)") != std::string::npos);
    CHECK(o.waited < 2.0);
  }
}

TEST_CASE("threads: the flight recorder keeps the last K collectives with start and end times") {
  threads::options opt;
  opt.timeout = std::chrono::milliseconds(300);
  opt.flight_recorder = 3;
  std::vector<std::string> what(2);
  std::atomic<bool> done{false};
  try {
    threads::launch(
        2,
        [&](threads& c) {
          std::vector<double> x(6, 1.0);
          for (int i = 0; i < 5; ++i) c.all_reduce(x.data(), x.data(), 1 + static_cast<std::size_t>(i), zero::reduce_op::sum);
          CHECK(c.recorder().recorded() == 5);
          CHECK(c.recorder().last().call.count == 5);
          CHECK(c.recorder().last().end_ns >= c.recorder().last().start_ns);
          if (c.rank() == 0) {
            try {
              c.broadcast(x.data(), x.data(), 2, 0);  // rank 1 stalls: a timeout
            } catch (const zero::error& e) {
              what[0] = e.what();
              done = true;
              throw;
            }
          } else {
            const auto t0 = clock_type::now();
            while (!done && seconds_since(t0) < 10.0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        },
        opt);
  } catch (const zero::error&) {
  }
  const std::string& w = what[0];
  CAPTURE(w);
  CHECK(w.find("#5 broadcast(double x 2, root 0) aborted: rank 0 waited 300 ms in #5 broadcast") != std::string::npos);
  CHECK(w.find("ranks arrived (missing: rank 1)") != std::string::npos);
  CHECK(w.find("rank 1: not in a collective since +") != std::string::npos);
  CHECK(w.find("(last: #4 all_reduce(double x 5, sum))\n") != std::string::npos);
  // Three entries, oldest first; the failed one never ended.
  const auto at3 = w.find("  #3 all_reduce(double x 4, sum): +");
  const auto at4 = w.find("  #4 all_reduce(double x 5, sum): +");
  const auto at5 = w.find("  #5 broadcast(double x 2, root 0): +");
  CHECK(w.find("  #2 all_reduce") == std::string::npos);
  CHECK(at3 != std::string::npos);
  CHECK(at4 > at3);
  CHECK(at5 > at4);
  CHECK(at4 != std::string::npos);
  CHECK(at5 != std::string::npos);
  CHECK(w.find(" s, not ended", at5) != std::string::npos);
  CHECK(w.find(" to +", at3) < at4);
}

namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

// Issue 9, case 12 (threads side): a rank that waits for a slow peer parks after a short spin.
TEST_CASE("threads: a rank waiting 2 s for a slow peer uses almost no CPU") {
  double waited = 0, thread_cpu = 0, process_cpu = 0;
  threads::launch(2, [&](threads& c) {
    std::vector<float> x(256, 1.0f);
    c.barrier();
    if (c.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(2));  // sleeping costs no CPU either
    } else {
      const double p0 = process_cpu_seconds(), t0 = thread_cpu_seconds();
      const auto w0 = clock_type::now();
      c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
      waited = seconds_since(w0);
      thread_cpu = thread_cpu_seconds() - t0;
      process_cpu = process_cpu_seconds() - p0;
      return;
    }
    c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
  });
  MESSAGE("waited ", waited, " s; CPU of the waiting rank ", thread_cpu * 1e3, " ms, of the process ", process_cpu * 1e3,
          " ms");
  CHECK(waited > 1.9);
  CHECK(thread_cpu < 0.02 * waited);  // spinning through the wait would be ~100%
  CHECK(process_cpu < 0.05 * waited);
}

TEST_CASE("threads: launch needs at least one rank") {
  for (int n : {0, -1}) {
    CAPTURE(n);
    bool ran = false;
    try {
      threads::launch(n, [&](threads&) { ran = true; });
      FAIL("launch(", n, ") returned normally");
    } catch (const zero::error& e) {
      CHECK(e.kind() == zero::error_kind::invalid_argument);
      CHECK(std::string(e.what()).find("world size must be positive") != std::string::npos);
    }
    CHECK_FALSE(ran);
  }
}

TEST_CASE("threads: a broadcast root outside the world is an error on every rank") {
  std::atomic<int> errors{0};
  threads::launch(3, [&](threads& c) {
    std::vector<float> x(4);
    try {
      c.broadcast(x.data(), x.data(), x.size(), 3);
    } catch (const zero::error& e) {
      if (e.kind() == zero::error_kind::invalid_argument) ++errors;
    }
  });
  CHECK(errors.load() == 3);
}

// The lock-free rendezvous (detail::arrivals) and the one-pass reduction (threads::reduce_range):
// long runs of back-to-back collectives of mixed kinds, types and sizes, against a reference
// computed on every rank from every rank's input, in rank order, bit for bit.
namespace {

// Element i of rank r's input in call `call`: random sign, mantissa and exponent (as in the
// conformance suite), with a NaN of an arbitrary payload or an infinity now and then, so that the
// canonical NaN and the rank order are both exercised.
template <class T>
T mixed_value(int rank, std::size_t i, std::uint64_t call) {
  const std::uint64_t h =
      zero::conformance::mix(call * 0x10001 ^ zero::conformance::mix(static_cast<std::uint64_t>(rank) ^ (i << 8)));
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::int64_t>(h % 2001) - 1000);
  } else {
    const int kind = static_cast<int>(h % 997);
    const double mantissa = 1.0 + std::ldexp(static_cast<double>(h >> 40), -24);
    const double v = std::ldexp(mantissa, static_cast<int>((h >> 20) % 31) - 15);
    const double s = (h >> 63) ? -v : v;
    if constexpr (std::is_same_v<T, zero::bf16> || std::is_same_v<T, zero::fp16>) {
      if (kind == 0) return T::from_bits(static_cast<std::uint16_t>(0x7f81u + (h >> 48) % 64));  // a NaN, not canonical
      if (kind == 1) return T(std::numeric_limits<float>::infinity());
      return T(static_cast<float>(s));
    } else {
      if (kind == 0) {  // a NaN with a payload, not the canonical one
        if constexpr (sizeof(T) == 4)
          return std::bit_cast<T>(0xffc00001u + static_cast<std::uint32_t>((h >> 40) % 1000));
        else return std::bit_cast<T>(0xfff0000000000001ull + (h >> 40) % 1000);
      }
      if (kind == 1) return (h & 2) ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
      return static_cast<T>(s);
    }
  }
}

template <class T>
std::vector<T> mixed_input(int rank, std::size_t n, std::uint64_t call) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = mixed_value<T>(rank, i, call);
  return v;
}

// acc = x0; acc op= x1; ... per element (2-byte floats in fp32, rounded once), stored as store_as
// stores it: the determinism contract, written independently of the backend's code.
template <class T>
std::vector<T> rank_order_reference(int n, std::size_t count, std::uint64_t call, zero::reduce_op op) {
  using A = zero::accumulate_as_t<T>;
  std::vector<A> acc(count);
  for (int k = 0; k < n; ++k) {
    const auto x = mixed_input<T>(k, count, call);
    for (std::size_t i = 0; i < count; ++i) {
      const A v = static_cast<A>(x[i]);
      if (k == 0) acc[i] = v;
      else if (op == zero::reduce_op::sum) acc[i] = acc[i] + v;
      else acc[i] = std::max(acc[i], v);
    }
  }
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = zero::store_as<T>(acc[i]);
  return out;
}

template <class T>
void expect_bits(const std::vector<T>& got, const T* want, std::size_t count, int rank, std::uint64_t call,
                 const char* what) {
  for (std::size_t i = 0; i < count; ++i)
    if (std::memcmp(&got[i], want + i, sizeof(T)) != 0)
      throw std::runtime_error("rank " + std::to_string(rank) + ", call " + std::to_string(call) + " (" + what +
                               "): element " + std::to_string(i) + " of " + std::to_string(count) +
                               " differs from the rank-order reference");
}

// One call of the sequence: its kind, type, size, placement and (some calls) a rank that arrives
// late, all drawn from the call number alone so that every rank makes the same call.
template <class T>
void mixed_call(threads& c, std::uint64_t call, std::uint64_t h) {
  const int n = c.size(), r = c.rank();
  // Mostly small (the rendezvous dominates), sometimes large enough for many reduction groups and
  // uneven chunks: 0, 1, odd, a few thousand, up to 70 000.
  static constexpr std::size_t sizes[] = {0, 1, 3, 17, 64, 65, 255, 1000, 4097, 70001};
  const std::size_t size = sizes[(h >> 8) % (sizeof sizes / sizeof sizes[0])];
  const auto N = static_cast<std::size_t>(n);
  const auto kind = (h >> 20) % 5;
  // reduce_scatter and all_gather take a count per rank: their whole buffer is about `size`.
  const std::size_t count = (kind == 1 || kind == 2) ? (size + N - 1) / N : size;
  const bool in_place = (h >> 16) & 1;
  const zero::reduce_op op = ((h >> 17) % 4 == 0) ? zero::reduce_op::max : zero::reduce_op::sum;
  switch (kind) {
    case 0: {  // all_reduce
      const auto want = rank_order_reference<T>(n, count, call, op);
      auto send = mixed_input<T>(r, count, call);
      if (in_place) {
        c.all_reduce(send.data(), send.data(), count, op);
        expect_bits(send, want.data(), count, r, call, "all_reduce in place");
      } else {
        std::vector<T> recv(count);
        c.all_reduce(send.data(), recv.data(), count, op);
        expect_bits(recv, want.data(), count, r, call, "all_reduce");
      }
      break;
    }
    case 1: {  // reduce_scatter: count per rank
      const auto want = rank_order_reference<T>(n, count * N, call, op);
      auto send = mixed_input<T>(r, count * N, call);
      const std::size_t base = count * static_cast<std::size_t>(r);
      std::vector<T> recv(count);
      if (in_place) {
        c.reduce_scatter(send.data(), send.data() + base, count, op);
        recv.assign(send.begin() + static_cast<std::ptrdiff_t>(base),
                    send.begin() + static_cast<std::ptrdiff_t>(base + count));
      } else {
        c.reduce_scatter(send.data(), recv.data(), count, op);
      }
      expect_bits(recv, want.data() + base, count, r, call, "reduce_scatter");
      break;
    }
    case 2: {  // all_gather
      std::vector<T> recv(count * N), want;
      for (int k = 0; k < n; ++k) {
        const auto x = mixed_input<T>(k, count, call);
        want.insert(want.end(), x.begin(), x.end());
      }
      const auto mine = mixed_input<T>(r, count, call);
      if (in_place) {
        const std::size_t base = count * static_cast<std::size_t>(r);
        std::copy(mine.begin(), mine.end(), recv.begin() + static_cast<std::ptrdiff_t>(base));
        c.all_gather(recv.data() + count * static_cast<std::size_t>(r), recv.data(), count);
      } else {
        c.all_gather(mine.data(), recv.data(), count);
      }
      expect_bits(recv, want.data(), count * N, r, call, "all_gather");
      break;
    }
    case 3: {  // broadcast
      const int root = static_cast<int>((h >> 24) % N);
      const auto want = mixed_input<T>(root, count, call);
      auto send = mixed_input<T>(r, count, call);
      std::vector<T> recv(count);
      c.broadcast(send.data(), in_place ? send.data() : recv.data(), count, root);
      expect_bits(in_place ? send : recv, want.data(), count, r, call, "broadcast");
      break;
    }
    default: c.barrier();
  }
}

// `calls` collectives on n ranks. Every 7th call one rank (chosen by the call) arrives `late`: the
// others then spin, yield and park, and the late rank must wake them.
void run_mixed(int n, int calls, std::chrono::microseconds late, threads::options opt = {}) {
  threads::launch(
      n,
      [&](threads& c) {
        for (int i = 0; i < calls; ++i) {
          const auto call = static_cast<std::uint64_t>(i);
          const std::uint64_t h = zero::conformance::mix(call ^ 0xc0ffee);
          if (late.count() > 0 && i % 7 == 3 && static_cast<int>(h % static_cast<std::uint64_t>(n)) == c.rank())
            std::this_thread::sleep_for(late);
          switch (h % 6) {
            case 0: mixed_call<double>(c, call, h); break;
            case 1: mixed_call<zero::bf16>(c, call, h); break;
            case 2: mixed_call<std::int32_t>(c, call, h); break;
            case 3: mixed_call<zero::fp16>(c, call, h); break;
            default: mixed_call<float>(c, call, h);
          }
        }
        CHECK(c.recorder().recorded() == static_cast<std::uint64_t>(calls));
      },
      opt);
}

}  // namespace

TEST_CASE("threads: back-to-back collectives of mixed kinds, types and sizes equal the rank-order reference") {
  threads::options opt;
  opt.timeout = std::chrono::seconds(20);  // a lost wake-up fails the test instead of hanging it
  for (int n : {2, 3, 4, 8}) {
    CAPTURE(n);
    const auto t0 = clock_type::now();
    const int calls = n == 8 ? 100 : 300;
    run_mixed(n, calls, std::chrono::microseconds(0), opt);
    MESSAGE("N = ", n, ": ", calls, " mixed collectives in ", seconds_since(t0), " s");
  }
}

TEST_CASE("threads: ranks arriving late (spin, yield and park paths) still get the rank-order result") {
  threads::options opt;
  opt.timeout = std::chrono::seconds(20);
  for (int n : {2, 3, 4, 8}) {
    CAPTURE(n);
    run_mixed(n, 120, std::chrono::microseconds(n == 8 ? 300 : 1500), opt);  // past the 20 us spin: parked
  }
  // No spin at all: every wait parks at once, every arrival that completes a rendezvous wakes.
  opt.spin = std::chrono::microseconds(0);
  for (int n : {2, 4}) {
    CAPTURE(n);
    run_mixed(n, 200, std::chrono::microseconds(0), opt);
    run_mixed(n, 60, std::chrono::microseconds(500), opt);
  }
}

TEST_CASE("threads: a rank that stops after many collectives still ends its peers' wait at the timeout") {
  threads::options opt;
  opt.timeout = std::chrono::milliseconds(250);
  std::vector<outcome> seen(2);
  std::atomic<bool> gave_up{false};
  try {
    threads::launch(
        2,
        [&](threads& c) {
          std::vector<float> x(300, 1.0f);
          for (int i = 0; i < 1000; ++i) c.all_reduce(x.data(), x.data(), x.size(), zero::reduce_op::sum);
          if (c.rank() == 1) {  // alive but stopped, until the peer has given up (at most 10 s)
            const auto t0 = clock_type::now();
            while (!gave_up && seconds_since(t0) < 10.0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            return;
          }
          try {
            record(seen[0], [&] { c.all_gather(x.data(), x.data(), 100); });
          } catch (...) {
            gave_up = true;
            throw;
          }
        },
        opt);
  } catch (const zero::error&) {
  }
  const outcome& o = seen[0];
  CHECK(o.failed);
  CHECK(o.kind == zero::error_kind::comm);
  CHECK(o.what.find("rank 0 waited 250 ms in #1000 all_gather(float x 100) but only 1 of 2 ranks arrived (missing: "
                    "rank 1)") != std::string::npos);
  CHECK(o.waited >= 0.24);
  CHECK(o.waited < 2.0);
}

TEST_CASE("streaming_copy: the bytes of memcpy at every alignment and length, nothing outside") {
  std::vector<unsigned char> src(256), dst(256);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  for (std::size_t d = 0; d < 20; ++d)
    for (std::size_t s = 0; s < 20; ++s)
      for (std::size_t len = 0; len < 100; ++len) {
        std::fill(dst.begin(), dst.end(), static_cast<unsigned char>(0xa5));
        zero::comm::detail::streaming_copy(dst.data() + d, src.data() + s, len);
        zero::comm::detail::streaming_fence();
        bool ok = true;
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= d && i < d + len;
          ok = ok && dst[i] == (inside ? src[s + i - d] : 0xa5);
        }
        if (!ok) FAIL("streaming_copy(dst + ", d, ", src + ", s, ", ", len, ") wrote the wrong bytes");
      }
}

// Outputs of at least detail::streaming_threshold bytes per rank take the non-temporal path: same
// bits, at an odd alignment (head and tail of plain stores), in place and out of place.
TEST_CASE("threads: outputs above the streaming threshold are bit-identical to the rank-order reference") {
  constexpr std::size_t floats = zero::comm::detail::streaming_threshold / sizeof(float);
  threads::options opt;
  opt.timeout = std::chrono::seconds(60);
  threads::launch(
      2,
      [&](threads& c) {
        const int r = c.rank();
        {  // all_reduce: each rank writes its half to both ranks, count * 4 bytes in all
          const std::size_t count = floats + 5;
          const auto want = rank_order_reference<float>(2, count, 1001, zero::reduce_op::sum);
          const auto send = mixed_input<float>(r, count, 1001);
          std::vector<float> recv(count + 1);
          c.all_reduce(send.data(), recv.data() + 1, count, zero::reduce_op::sum);  // 4 bytes past alignment
          const std::vector<float> got(recv.begin() + 1, recv.end());
          expect_bits(got, want.data(), count, r, 1001, "streaming all_reduce");
        }
        {  // reduce_scatter in place: recv is this rank's slice of send, odd count so rank 1's is unaligned
          const std::size_t count = floats + 1;
          const auto want = rank_order_reference<float>(2, 2 * count, 1002, zero::reduce_op::sum);
          auto send = mixed_input<float>(r, 2 * count, 1002);
          const std::size_t base = count * static_cast<std::size_t>(r);
          c.reduce_scatter(send.data(), send.data() + base, count, zero::reduce_op::sum);
          const std::vector<float> got(send.begin() + static_cast<std::ptrdiff_t>(base),
                                       send.begin() + static_cast<std::ptrdiff_t>(base + count));
          expect_bits(got, want.data() + base, count, r, 1002, "streaming reduce_scatter in place");
        }
        {  // all_gather of bf16, 2 bytes past alignment
          const std::size_t count = floats + 3;  // bf16 per rank: 8 MiB each, 16 MiB written
          std::vector<zero::bf16> want;
          for (int k = 0; k < 2; ++k) {
            const auto x = mixed_input<zero::bf16>(k, count, 1003);
            want.insert(want.end(), x.begin(), x.end());
          }
          const auto mine = mixed_input<zero::bf16>(r, count, 1003);
          std::vector<zero::bf16> recv(2 * count + 1);
          c.all_gather(mine.data(), recv.data() + 1, count);
          const std::vector<zero::bf16> got(recv.begin() + 1, recv.end());
          expect_bits(got, want.data(), 2 * count, r, 1003, "streaming all_gather");
        }
        {  // broadcast from rank 1
          const std::size_t count = floats + 7;
          const auto want = mixed_input<float>(1, count, 1004);
          const auto send = mixed_input<float>(r, count, 1004);
          std::vector<float> recv(count + 3);
          c.broadcast(send.data(), recv.data() + 3, count, 1);
          const std::vector<float> got(recv.begin() + 3, recv.end());
          expect_bits(got, want.data(), count, r, 1004, "streaming broadcast");
        }
      },
      opt);
}

// ---- all_to_all, split and bytes per link level ---------------------------------------------------

TEST_CASE("threads: all_to_all gives rank r block r of every rank's send, in rank order") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    threads::launch(n, [&](threads& t) {
      counted<threads> c(t);
      const auto N = static_cast<std::size_t>(n), r = static_cast<std::size_t>(c.rank());
      constexpr std::size_t k = 5;
      // Element i of block b from rank s: s * 100 + b * 10 + i, as bytes and as floats.
      std::vector<std::uint8_t> send(N * k), recv(N * k, 0xff);
      std::vector<float> fsend(N * k), frecv(N * k, -1.0f);
      for (std::size_t b = 0; b < N; ++b)
        for (std::size_t i = 0; i < k; ++i) {
          send[b * k + i] = static_cast<std::uint8_t>(r * 50 + b * 10 + i);
          fsend[b * k + i] = static_cast<float>(r * 100 + b * 10 + i);
        }
      c.all_to_all(send.data(), recv.data(), k);
      auto req = c.start_all_to_all(fsend.data(), frecv.data(), k);
      c.wait(req);
      for (std::size_t s = 0; s < N; ++s)
        for (std::size_t i = 0; i < k; ++i) {
          CHECK(recv[s * k + i] == static_cast<std::uint8_t>(s * 50 + r * 10 + i));
          CHECK(frecv[s * k + i] == static_cast<float>(s * 100 + r * 10 + i));
        }
      using zero::comm::collective;
      CHECK(c.stats()[collective::all_to_all] == (N - 1) * k * (1 + 4));
      CHECK(c.stats().calls[static_cast<int>(collective::all_to_all)] == 2);
    });
  }
}

TEST_CASE("counted: the inter-node part of each collective by the direct model, for every node size") {
  using zero::comm::collective;
  const int n = 4;
  for (int g : {1, 2, 4}) {
    CAPTURE(g);
    const auto N = static_cast<std::uint64_t>(n), G = static_cast<std::uint64_t>(g);
    threads::launch(n, [&](threads& t) {
      counted<threads> c(t);
      c.set_node_size(g);
      constexpr std::size_t k = 24;
      std::vector<float> f(n * k, 1.0f), h(n * k);
      std::vector<std::uint8_t> b(n * k, 1), e(n * k);
      c.all_reduce(f.data(), h.data(), n * k, zero::reduce_op::sum);  // buffer N k 4
      c.reduce_scatter(f.data(), h.data(), k, zero::reduce_op::sum);  // N k 4
      c.all_gather(b.data(), e.data(), k);                             // N k 1
      c.all_to_all(b.data(), e.data(), k);                             // N k 1
      c.broadcast(f.data(), h.data(), 3 * k, 0);                       // 3 k 4
      const auto& s = c.stats();
      const auto inter = [&](collective x) { return s.inter[static_cast<int>(x)]; };
      // Each peer on another node gets its block: N - G of the N - 1 peers.
      CHECK(inter(collective::all_reduce) == 2 * (N - G) * k * 4);
      CHECK(inter(collective::reduce_scatter) == (N - G) * k * 4);
      CHECK(inter(collective::all_gather) == (N - G) * k);
      CHECK(inter(collective::all_to_all) == (N - G) * k);
      CHECK(inter(collective::broadcast) == (N - G) * 3 * k * 4 / (N - 1));
      CHECK(s.inter_node_bytes() + s.intra_node_bytes() == s.total_bytes());
      CHECK(s.intra_node_bytes() == (G - 1) * k * (2 * 4 + 4 + 1 + 1) + 3 * k * 4 * (G - 1) / (N - 1));
    });
  }
  // One node (the default) sends nothing between nodes; a node size that does not divide N is refused.
  threads::launch(2, [](threads& t) {
    counted<threads> c(t);
    CHECK(c.node_size() == 2);
    float x = 1.0f, y[2];
    c.all_gather(&x, y, 1);
    CHECK(c.stats().inter_node_bytes() == 0);
    CHECK_THROWS_WITH_AS(c.set_node_size(3), doctest::Contains("node size 3 does not divide the world size 2"),
                         zero::error);
  });
}

TEST_CASE("threads: split forms worlds of equal colors, ranked in the parent's order, independent of it") {
  constexpr int n = 4;
  threads::launch(n, [](threads& c) {
    // Nodes of two consecutive ranks, and the ranks of equal position across nodes.
    auto node = c.split(c.rank() / 2);
    auto across = c.split(c.rank() % 2);
    CHECK(node->size() == 2);
    CHECK(node->rank() == c.rank() % 2);
    CHECK(across->size() == 2);
    CHECK(across->rank() == c.rank() / 2);
    double x = c.rank() + 1.0, y = 0.0;
    node->all_reduce(&x, &y, 1, zero::reduce_op::sum);
    CHECK(y == (c.rank() < 2 ? 3.0 : 7.0));
    across->all_reduce(&x, &y, 1, zero::reduce_op::sum);
    CHECK(y == (c.rank() % 2 == 0 ? 4.0 : 6.0));
    c.all_reduce(&x, &y, 1, zero::reduce_op::sum);  // the parent goes on by itself
    CHECK(y == 10.0);
    auto alone = c.split(c.rank());  // every rank a world of one
    CHECK(alone->size() == 1);
    alone->all_reduce(&x, &y, 1, zero::reduce_op::sum);
    CHECK(y == x);
  });
}

TEST_CASE("threads: a rank that throws or leaves ends its peers' waits inside a split world") {
  threads::options opt;
  opt.timeout = std::chrono::seconds(60);
  for (const bool leave : {false, true}) {
    CAPTURE(leave);
    std::vector<outcome> seen(2);
    const auto t0 = clock_type::now();
    try {
      threads::launch(
          2,
          [&](threads& c) {
            auto node = c.split(0);
            if (c.rank() == 0) {
              std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 1 waits by then
              if (leave) return;  // destroys its part of the split world
              throw std::runtime_error("injected failure");
            }
            float x = 1.0f;
            record(seen[1], [&] { node->all_reduce(&x, &x, 1, zero::reduce_op::sum); });
          },
          opt);
    } catch (const std::exception&) {
    }
    CHECK(seen[1].failed);
    CHECK(seen[1].kind == zero::error_kind::comm);
    CHECK(seconds_since(t0) < 10.0);
  }
}

// The rendezvous that ends a data phase (where ranks write into each other's buffers) holds a rank until
// every peer has arrived, even when the world is aborted meanwhile: a rank released at once would unwind
// and free its output while a slower peer still copies into it.
TEST_CASE("threads_world: an abort during a data phase releases no rank before its peers have arrived") {
  zero::comm::detail::threads_world world(2, std::chrono::seconds(60));
  std::atomic<bool> peer_done{false};
  bool saw_peer_done = false, threw = false;
  std::thread peer([&] {
    world.arrive_and_wait(1, zero::comm::detail::coll_kind::all_gather);  // the data phase begins
    std::this_thread::sleep_for(std::chrono::milliseconds(100));         // still writing
    peer_done.store(true);
    world.arrive_after_data_phase(1, zero::comm::detail::coll_kind::all_gather);
  });
  world.arrive_and_wait(0, zero::comm::detail::coll_kind::all_gather);
  world.abort("injected: another rank failed");
  try {
    world.arrive_after_data_phase(0, zero::comm::detail::coll_kind::all_gather);
    saw_peer_done = peer_done.load();
  } catch (const zero::error&) {
    threw = true;
  }
  peer.join();
  CHECK_FALSE(threw);
  CHECK(saw_peer_done);
  // The abort is reported at the next rendezvous.
  CHECK_THROWS_AS(world.arrive_and_wait(0, zero::comm::detail::coll_kind::all_gather), zero::error);
}

TEST_CASE("threads_world: a peer that fails inside a data phase ends the wait at its end with an error") {
  zero::comm::detail::threads_world world(2, std::chrono::seconds(60));
  const auto t0 = clock_type::now();
  std::thread peer([&] {
    world.arrive_and_wait(1, zero::comm::detail::coll_kind::all_gather);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    world.record_failure(1, std::make_exception_ptr(std::runtime_error("injected")), "injected");
  });
  world.arrive_and_wait(0, zero::comm::detail::coll_kind::all_gather);
  CHECK_THROWS_AS(world.arrive_after_data_phase(0, zero::comm::detail::coll_kind::all_gather), zero::error);
  peer.join();
  CHECK(seconds_since(t0) < 10.0);
}
