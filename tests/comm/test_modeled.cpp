// comm::modeled: collectives take alpha + bytes / beta on the host clock, results stay the inner backend's bits.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "zero/comm/backends/modeled.hpp"
#include "zero/comm/backends/threads.hpp"
#include "zero/comm/conformance.hpp"
#include "zero/comm/counted.hpp"
#include "zero/error.hpp"

namespace {

using zero::comm::collective;
using zero::comm::counted;
using zero::comm::link_model;
using zero::comm::modeled;
using zero::comm::threads;
using clock_type = std::chrono::steady_clock;

static_assert(zero::CommBackend<modeled<threads>>);
static_assert(zero::CommBackendFor<modeled<threads>, zero::bf16>);
static_assert(zero::comm::labels_calls<modeled<threads>>, "modeled forwards call labels");

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Rank r's element i, the same on every run.
float value(int r, std::size_t i) {
  return static_cast<float>(zero::conformance::mix(static_cast<std::uint64_t>(r) * 1000003u + i) % 2001) * 0.001f - 1.0f;
}

}  // namespace

TEST_CASE("modeled: the bus bytes of comm::counted, per collective and in total") {
  threads::launch(3, [](threads& t) {
    counted<threads> c(t);
    modeled<counted<threads>> m(c, link_model::of(1.0, 100.0));
    std::vector<float> a(30, 1.0f), b(30);
    std::vector<double> d(7, 1.0);
    m.all_reduce(a.data(), b.data(), 30, zero::reduce_op::sum);
    m.reduce_scatter(a.data(), b.data(), 10, zero::reduce_op::sum);
    m.all_gather(a.data(), b.data(), 10);
    m.broadcast(d.data(), d.data(), 7, 0);
    m.barrier();
    // all_reduce 2(N-1)/N x 120 B, reduce_scatter and all_gather (N-1)/N x 120 B, broadcast 56 B.
    CHECK(m.stats().bytes == 160 + 80 + 80 + 56);
    CHECK(m.stats().bytes == c.stats().total_bytes());
    CHECK(m.stats().calls == 5);
    CHECK(m.bytes_of(collective::all_reduce, 120) == zero::comm::bus_bytes(collective::all_reduce, 120, 3));
    // The modeled seconds are the formula's: 5 x alpha plus the bytes over beta.
    CHECK(m.stats().modeled_s == doctest::Approx(5 * 1e-6 + 376 / 100e9).epsilon(1e-12));
  });
}

TEST_CASE("modeled: a collective's wall time is at least its modeled cost") {
  // 2 ms latency plus 256 KiB at 0.2 GB/s (1.31 ms): 3.31 ms per all_reduce of 64 Ki floats at N = 2.
  const link_model link = link_model::of(2000.0, 0.2);
  threads::launch(2, [&](threads& t) {
    modeled<threads> m(t, link);
    const std::size_t n = 64 * 1024;
    std::vector<float> a(n, 1.0f), b(n);
    const double cost = m.cost_of(collective::all_reduce, n * sizeof(float));
    CHECK(cost == doctest::Approx(2e-3 + 262144 / 0.2e9).epsilon(1e-12));
    for (int k = 0; k < 3; ++k) {
      const auto t0 = clock_type::now();
      m.all_reduce(a.data(), b.data(), n, zero::reduce_op::sum);
      const double wall = since(t0);
      CHECK(wall >= cost);
      CHECK(clock_type::now() >= m.link_free_at());
    }
    CHECK(m.stats().modeled_s == doctest::Approx(3 * cost).epsilon(1e-12));
    CHECK(m.stats().blocked_s >= m.stats().modeled_s);
    CHECK(m.stats().waited_s <= m.stats().blocked_s);
    CHECK(m.stats().waited_s > 0.0);
  });
}

TEST_CASE("modeled: the link is serial: a collective starts no earlier than the previous one's end") {
  threads::launch(2, [](threads& t) {
    modeled<threads> m(t, link_model::of(0.0, 1.0));
    const auto t0 = clock_type::now();
    using std::chrono::milliseconds;
    CHECK(m.reserve(0.003, t0) == t0 + milliseconds(3));
    CHECK(m.reserve(0.002, t0) == t0 + milliseconds(5));                     // queued behind the first
    CHECK(m.reserve(0.001, t0 + milliseconds(10)) == t0 + milliseconds(11));  // the link was idle
    CHECK(m.link_free_at() == t0 + milliseconds(11));
    CHECK(m.stats().modeled_s == doctest::Approx(0.006).epsilon(1e-12));
    m.wait_until(t0 + milliseconds(11));
    CHECK(clock_type::now() >= t0 + milliseconds(11));
  });
}

TEST_CASE("modeled: results are the inner backend's, bit for bit") {
  for (int n : {2, 3, 4}) {
    threads::launch(n, [](threads& t) {
      const std::size_t count = 1001;
      const auto size = static_cast<std::size_t>(t.size());
      std::vector<float> send(count * size);
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(t.rank(), i);
      std::vector<float> plain_ar(count * size), plain_rs(count), plain_ag(count * size);
      t.all_reduce(send.data(), plain_ar.data(), count * size, zero::reduce_op::sum);
      t.reduce_scatter(send.data(), plain_rs.data(), count, zero::reduce_op::sum);
      t.all_gather(send.data(), plain_ag.data(), count);
      modeled<threads> m(t, link_model::of(10.0, 50.0));
      std::vector<float> ar(count * size), rs(count), ag(count * size);
      m.all_reduce(send.data(), ar.data(), count * size, zero::reduce_op::sum);
      m.reduce_scatter(send.data(), rs.data(), count, zero::reduce_op::sum);
      m.all_gather(send.data(), ag.data(), count);
      CHECK(std::memcmp(ar.data(), plain_ar.data(), ar.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(rs.data(), plain_rs.data(), rs.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(ag.data(), plain_ag.data(), ag.size() * sizeof(float)) == 0);
    });
  }
  // And the whole conformance suite through a modeled link of 1 us per call.
  threads::launch(3, [](threads& t) {
    modeled<threads> m(t, link_model::of(1.0, 100.0));
    zero::conformance::all(m);
  });
}

TEST_CASE("modeled: one rank has no link, and a default link only times the calls") {
  threads::launch(1, [](threads& t) {
    modeled<threads> m(t, link_model::of(5000.0, 0.001));
    float x = 1.0f;
    m.all_reduce(&x, &x, 1, zero::reduce_op::sum);
    CHECK(m.stats().modeled_s == 0.0);
    CHECK(m.stats().waited_s == 0.0);
    CHECK(m.stats().calls == 1);
  });
  threads::launch(2, [](threads& t) {
    modeled<threads> m(t);
    CHECK_FALSE(m.link().enabled());
    float x = 1.0f;
    m.all_reduce(&x, &x, 1, zero::reduce_op::sum);
    CHECK(m.stats().modeled_s == 0.0);
    CHECK(m.stats().waited_s == 0.0);
    CHECK(m.stats().blocked_s > 0.0);
    CHECK(m.stats().bytes == 4);
  });
}

TEST_CASE("modeled: a link of negative latency or no bandwidth is refused") {
  CHECK_THROWS_WITH_AS(link_model::of(-1.0, 1.0), doctest::Contains("latency must be"), zero::error);
  CHECK_THROWS_WITH_AS(link_model::of(1.0, 0.0), doctest::Contains("bandwidth must be > 0 GB/s, got 0"), zero::error);
  CHECK_THROWS_AS(link_model::of(std::nan(""), 1.0), zero::error);
  CHECK(link_model::of(3.0, std::numeric_limits<double>::infinity()).enabled());  // latency only
  CHECK(link_model::of(3.0, std::numeric_limits<double>::infinity()).seconds(1 << 20, 2) == 3e-6);
  CHECK(link_model::of(0.0, 2.0).seconds(4000000000ull, 4) == 2.0);
}
