// bench_collectives: nccl-tests style time, algbw and busbw of every collective, per backend, as JSON lines.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "zero/comm/backends/threads.hpp"
#include "zero/comm/counted.hpp"
#if ZERO_WITH_MPI
#include "zero/comm/backends/mpi.hpp"
#endif

// Conventions, as in nccl-tests: `bytes` is the larger buffer of the collective (the full buffer
// of all_reduce and broadcast, the N-slice buffer of reduce_scatter and all_gather); time is the
// mean per call of the slowest rank, in the best of 3 rounds (mean_time_us averages the rounds);
// algbw = bytes / time; busbw = algbw * bus_factor(op, N), the rate each rank's link must sustain,
// comparable across N and across collectives. GB = 1e9 bytes.
//
// --latency-calls C adds, before the sweep, the distribution of single calls: C back-to-back
// all_reduces of --latency-bytes (1 KiB), each timed on every rank; a call's time is the slowest
// rank's, and the record gives the median, p10, p90 and mean over the calls (the mean includes the
// calls that lost their core to another process; the median does not).
//
// --ratio-calls C adds, after the sweep, C rounds of one all_reduce, one reduce_scatter and one
// all_gather of --max-bytes, each call timed on its own (slowest rank), and one "ratio" record: the
// busbw of reduce_scatter and all_gather over all_reduce's, per round (median, min, max) and from
// each one's best call. On a machine whose memory bandwidth drifts from second to second (a shared
// guest), the sweep measures the three collectives at different moments; calls side by side do not.

namespace {

using clock_type = std::chrono::steady_clock;
using zero::comm::collective;

struct settings {
  std::string backend = "threads";
  std::string mode = "deterministic";
  int ranks = 2;
  std::size_t min_bytes = 1 << 10, max_bytes = 64 << 20;
  int factor = 4;
  double target_ms = 60;  // time spent per measured point, after one warm-up call
  int max_iters = 1000;
  bool blocking = false;  // comm::mpi: blocking MPI collectives (no timeout) instead of polled nonblocking ones
  int latency_calls = 0;  // > 0: time that many single all_reduces of latency_bytes first
  std::size_t latency_bytes = 1 << 10;
  bool sweep = true;  // false: only the latency record
  int ratio_calls = 0;  // > 0: that many interleaved rounds of all_reduce, reduce_scatter, all_gather
};

double seconds(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown";
}

void emit(const nlohmann::json& j) { std::cout << j.dump() << std::endl; }

// A single thread copying `bytes` between two buffers: the yardstick of a memory-bound
// collective on this machine, measured at every size because caches make it size-dependent.
void bench_memcpy(const settings& s) {
  std::vector<unsigned char> src(s.max_bytes, 1), dst(s.max_bytes, 0);
  for (std::size_t bytes = s.min_bytes; bytes <= s.max_bytes; bytes *= static_cast<std::size_t>(s.factor)) {
    auto t0 = clock_type::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double warm = std::max(seconds(t0, clock_type::now()), 1e-9);
    const int iters = std::clamp(static_cast<int>(std::ceil(s.target_ms * 1e-3 / warm)), 2, 100 * s.max_iters);
    t0 = clock_type::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(dst.data(), src.data(), bytes);
      // Keeps the copies from being merged or dropped: each one feeds the next iteration's source.
      src[static_cast<std::size_t>(i) % bytes] = dst[(static_cast<std::size_t>(i) * 7) % bytes];
    }
    const double t = seconds(t0, clock_type::now()) / iters;
    emit({{"record", "memcpy"}, {"bytes", bytes}, {"iters", iters}, {"time_us", t * 1e6}, {"gbps", bytes / t / 1e9}});
  }
}

template <class Comm>
double max_over_ranks(Comm& c, double v) {
  c.all_reduce(&v, &v, 1, zero::reduce_op::max);
  return v;
}

// The per-call time distribution of a small all_reduce (see the comment at the top).
template <class Comm>
void bench_latency(Comm& c, const settings& s, const nlohmann::json& tags) {
  const std::size_t count = s.latency_bytes / sizeof(float);
  const auto calls = static_cast<std::size_t>(s.latency_calls);
  std::vector<float> send(count, 1.0f), recv(count, 0.0f);
  std::vector<double> mine(calls), all(calls * static_cast<std::size_t>(c.size()));
  for (int i = 0; i < 100; ++i) c.all_reduce(send.data(), recv.data(), count, zero::reduce_op::sum);  // warm-up
  c.barrier();
  for (std::size_t i = 0; i < calls; ++i) {
    const auto t0 = clock_type::now();
    c.all_reduce(send.data(), recv.data(), count, zero::reduce_op::sum);
    mine[i] = seconds(t0, clock_type::now());
  }
  c.all_gather(mine.data(), all.data(), calls);
  if (c.rank() != 0) return;
  std::vector<double> slowest(calls, 0.0);
  for (std::size_t k = 0; k < all.size(); ++k) slowest[k % calls] = std::max(slowest[k % calls], all[k]);
  double total = 0;
  for (double t : slowest) total += t;
  std::sort(slowest.begin(), slowest.end());
  auto quantile = [&](double q) { return slowest[static_cast<std::size_t>(q * static_cast<double>(calls - 1))] * 1e6; };
  nlohmann::json r = {{"record", "latency"},
                      {"ranks", c.size()},
                      {"op", "all_reduce"},
                      {"dtype", "float"},
                      {"bytes", count * sizeof(float)},
                      {"calls", calls},
                      {"median_us", quantile(0.5)},
                      {"p10_us", quantile(0.1)},
                      {"p90_us", quantile(0.9)},
                      {"mean_us", total / static_cast<double>(calls) * 1e6}};
  r.update(tags);
  emit(r);
}

// `tags` names the configuration (backend, mode, ...) in every record.
template <class Comm>
void bench_collectives(Comm& c, const settings& s, const nlohmann::json& tags) {
  constexpr int warmup = 2, rounds = 3;
  const int n = c.size();
  const auto N = static_cast<std::size_t>(n);
  // Two buffers of the largest size, written once so that no page fault lands in a measurement.
  std::vector<float> send(s.max_bytes / sizeof(float), 1.0f), recv(s.max_bytes / sizeof(float), 0.0f);
  for (collective op : {collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                        collective::broadcast}) {
    const bool sliced = op == collective::reduce_scatter || op == collective::all_gather;
    for (std::size_t size = s.min_bytes; size <= s.max_bytes; size *= static_cast<std::size_t>(s.factor)) {
      const std::size_t count = size / sizeof(float) / (sliced ? N : 1);  // elements per rank, as NCCL counts
      const std::size_t bytes = count * sizeof(float) * (sliced ? N : 1);
      float* in = send.data();
      float* out = recv.data();
      auto once = [&] {
        switch (op) {
          case collective::all_reduce: c.all_reduce(in, out, count, zero::reduce_op::sum); break;
          case collective::reduce_scatter: c.reduce_scatter(in, out, count, zero::reduce_op::sum); break;
          case collective::all_gather: c.all_gather(in, out, count); break;
          case collective::broadcast: c.broadcast(in, out, count, 0); break;
          case collective::all_to_all: break;  // not in this sweep (ZeRO++'s qgZ exchange; not every backend has it)
        }
      };
      // Warm-up: the first call at a size pays for page faults, a backend's scratch and MPI's
      // protocol switch, so it is not timed; the next ones, agreed over ranks, set the iteration
      // count, which must be the same on every rank.
      c.barrier();
      once();
      auto t0 = clock_type::now();
      for (int i = 0; i < warmup; ++i) once();
      const double warm = max_over_ranks(c, std::max(seconds(t0, clock_type::now()) / warmup, 1e-9));
      const double per_round = s.target_ms * 1e-3 / rounds;
      const int iters = std::clamp(static_cast<int>(std::ceil(per_round / warm)), 1, s.max_iters);
      // The best of a few rounds: on a shared 2-core machine a round can lose its core to an
      // unrelated process, and that says nothing about the collective.
      double best = 0, total = 0;
      for (int round = 0; round < rounds; ++round) {
        c.barrier();
        t0 = clock_type::now();
        for (int i = 0; i < iters; ++i) once();
        const double t = max_over_ranks(c, seconds(t0, clock_type::now()) / iters);
        best = round == 0 ? t : std::min(best, t);
        total += t;
      }
      const double t = best;
      const double algbw = bytes / t / 1e9;
      if (c.rank() == 0) {
        nlohmann::json r = {{"record", "collective"},
                            {"ranks", n},
                            {"op", zero::comm::to_string(op)},
                            {"dtype", "float"},
                            {"bytes", bytes},
                            {"count", count},
                            {"iters", iters},
                            {"rounds", rounds},
                            {"time_us", t * 1e6},
                            {"mean_time_us", total / rounds * 1e6},
                            {"algbw_gbps", algbw},
                            {"busbw_gbps", algbw * zero::comm::bus_factor(op, n)}};
        r.update(tags);
        emit(r);
      }
    }
  }
}

// reduce_scatter and all_gather against all_reduce, call by call (see the comment at the top).
template <class Comm>
void bench_ratios(Comm& c, const settings& s, const nlohmann::json& tags) {
  const int n = c.size();
  const auto N = static_cast<std::size_t>(n);
  const std::size_t count = s.max_bytes / sizeof(float) / N * N;  // all_reduce's; N slices of count / N
  std::vector<float> send(count, 1.0f), recv(count, 0.0f);
  const collective ops[3] = {collective::all_reduce, collective::reduce_scatter, collective::all_gather};
  auto once = [&](collective op) {
    if (op == collective::all_reduce) c.all_reduce(send.data(), recv.data(), count, zero::reduce_op::sum);
    if (op == collective::reduce_scatter) c.reduce_scatter(send.data(), recv.data(), count / N, zero::reduce_op::sum);
    if (op == collective::all_gather) c.all_gather(send.data(), recv.data(), count / N);
  };
  for (collective op : ops) once(op);  // page faults and first touches, untimed
  const auto calls = static_cast<std::size_t>(s.ratio_calls);
  std::vector<double> t[3];
  for (std::size_t i = 0; i < calls; ++i)
    for (int k = 0; k < 3; ++k) {
      c.barrier();
      const auto t0 = clock_type::now();
      once(ops[k]);
      t[k].push_back(max_over_ranks(c, seconds(t0, clock_type::now())));
    }
  if (c.rank() != 0) return;
  const double bytes = static_cast<double>(count * sizeof(float));
  auto busbw = [&](int k, double time) { return bytes / time / 1e9 * zero::comm::bus_factor(ops[k], n); };
  auto spread = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return nlohmann::json{{"median", v[v.size() / 2]}, {"min", v.front()}, {"max", v.back()}};
  };
  nlohmann::json r = {{"record", "ratio"}, {"ranks", n}, {"dtype", "float"}, {"bytes", count * sizeof(float)},
                      {"calls", calls}};
  double best[3];
  for (int k = 0; k < 3; ++k) {
    best[k] = *std::min_element(t[k].begin(), t[k].end());
    r[std::string(zero::comm::to_string(ops[k])) + "_best_busbw_gbps"] = busbw(k, best[k]);
  }
  for (int k = 1; k < 3; ++k) {
    std::vector<double> per(calls);
    for (std::size_t i = 0; i < calls; ++i) per[i] = busbw(k, t[k][i]) / busbw(0, t[0][i]);
    const std::string name(zero::comm::to_string(ops[k]));
    r[name + "_over_all_reduce"] = spread(per);
    r[name + "_over_all_reduce_of_bests"] = busbw(k, best[k]) / busbw(0, best[0]);
  }
  r.update(tags);
  emit(r);
}

// The 1-minute load average when the run started: other work on the machine shares the cores, and
// the numbers are only as quiet as the machine was.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double one = -1;
  in >> one;
  return one;
}

// What distinguishes one configuration's records from another's.
nlohmann::json tags(const settings& s) {
  if (s.backend == "threads") return {{"backend", "threads"}};
  if (s.backend == "memcpy") return {{"backend", "memcpy"}};
  return {{"backend", s.backend}, {"mode", s.mode}, {"blocking", s.blocking}};
}

nlohmann::json machine(const settings& s, int ranks) {
  nlohmann::json m = {{"record", "machine"},
                      {"ranks", ranks},
                      {"cores", std::thread::hardware_concurrency()},
                      {"cpu", cpu_model()},
                      {"load_average", load_average()}};
  m.update(tags(s));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  CLI::App app{"Collective benchmark in the style of nccl-tests: one JSON line per (collective, size)."};
  app.add_option("--backend", s.backend, "threads, mpi (run under mpirun) or memcpy (the single-thread yardstick)")
      ->check(CLI::IsMember({"threads", "mpi", "memcpy"}))
      ->capture_default_str();
  app.add_option("--ranks", s.ranks, "ranks of the threads backend")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--mode", s.mode, "comm::mpi mode")
      ->check(CLI::IsMember({"deterministic", "fast"}))
      ->capture_default_str();
  app.add_option("--min-bytes", s.min_bytes, "smallest size")->check(CLI::Range(64, 1 << 30))->capture_default_str();
  app.add_option("--max-bytes", s.max_bytes, "largest size")->check(CLI::Range(64, 1 << 30))->capture_default_str();
  app.add_option("--factor", s.factor, "size step")->check(CLI::Range(2, 16))->capture_default_str();
  app.add_option("--target-ms", s.target_ms, "measured time per point")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--latency-calls", s.latency_calls, "time this many single all_reduces of --latency-bytes first")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  app.add_option("--latency-bytes", s.latency_bytes, "size of the timed single all_reduces")
      ->check(CLI::Range(4, 1 << 30))
      ->capture_default_str();
  app.add_flag("!--no-sweep", s.sweep, "only the latency record, no size sweep");
  app.add_option("--ratio-calls", s.ratio_calls,
                 "threads: this many rounds of all_reduce, reduce_scatter and all_gather of --max-bytes, timed call by "
                 "call, for their busbw ratios")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_flag("--blocking", s.blocking,
               "comm::mpi with timeout 0: MPI's blocking collectives rather than nonblocking ones polled against "
               "the timeout");
  CLI11_PARSE(app, argc, argv);

  try {
    if (s.backend == "memcpy") {
      emit(machine(s, 1));
      bench_memcpy(s);
    } else if (s.backend == "threads") {
      emit(machine(s, s.ranks));
      zero::comm::threads::launch(s.ranks, [&](zero::comm::threads& c) {
        if (s.latency_calls > 0) bench_latency(c, s, tags(s));
        if (s.sweep) bench_collectives(c, s, tags(s));
        if (s.ratio_calls > 0) bench_ratios(c, s, tags(s));
      });
    } else {
#if ZERO_WITH_MPI
      zero::comm::mpi_session session(argc, argv);
      zero::comm::mpi_options opt;
      if (s.mode == "fast") opt.mode = zero::comm::mpi_mode::fast;
      if (s.blocking) opt.timeout = std::chrono::milliseconds(0);
      zero::comm::mpi::run(
          [&](zero::comm::mpi& c) {
            if (c.rank() == 0) emit(machine(s, c.size()));
            if (s.latency_calls > 0) bench_latency(c, s, tags(s));
            if (s.sweep) bench_collectives(c, s, tags(s));
          },
          opt);
#else
      std::cerr << "bench_collectives: built without MPI; --backend mpi is unavailable\n";
      return 2;
#endif
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_collectives: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
