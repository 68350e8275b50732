// Partitioned activation checkpoints (Pa, Pa+cpu) over a modeled link: how much of the restores' transfer the
// backward pass waits for, restoring each layer when it is needed against prefetching the next one during this
// one's recomputation. One JSON line.
//
// Usage: bench_activations [--tp T] [--layers L] [--mib M] [--recompute-ms R] [--latency-us A] [--gbps B]
//                          [--repeats K]
//   T ranks on threads form the tensor-parallel group, their collectives held to a link of latency A and
//   bandwidth B (comm::modeled); L checkpoints of M MiB each (bf16, whole); the recomputation of a layer is a
//   busy wait of R ms. Each loop runs over that link and over an instant one (no latency, no bandwidth
//   term): the difference of the time spent in restore() is the transfer the loop exposes, apart from
//   what a restore costs on any link (its buffer's allocation and first touch, the ranks meeting). The
//   median of K backward passes.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "zero/comm/backends/modeled.hpp"
#include "zero/zero.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using threads = zero::comm::threads;
using modeled_link = zero::comm::modeled<threads>;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

void busy_wait(double seconds) {
  const auto end = clock_type::now() + std::chrono::duration<double>(seconds);
  while (clock_type::now() < end) {
  }
}

struct timings {
  double backward_s = 0, restore_s = 0, prefetch_s = 0;
};
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One backward pass over `layers` saved checkpoints: restore (waiting for what is not there yet), optionally
// prefetch the next layer, recompute, release; rank 0's times.
timings backward(modeled_link& comm, zero::activation_mode mode, std::size_t layers, std::size_t elements, double recompute_s,
                 bool prefetch_next) {
  zero::activation_store<modeled_link> store(comm, mode);
  std::vector<zero::bf16> x(elements, zero::bf16(0.5f));
  for (std::size_t l = 0; l < layers; ++l) store.save(l, x.data(), x.size());
  comm.barrier();
  timings t;
  const auto start = clock_type::now();
  for (std::size_t l = layers; l-- > 0;) {
    auto t0 = clock_type::now();
    (void)store.restore<zero::bf16>(l);
    t.restore_s += seconds_since(t0);
    if (prefetch_next && l > 0) {
      t0 = clock_type::now();
      store.prefetch<zero::bf16>(l - 1);
      t.prefetch_s += seconds_since(t0);
    }
    busy_wait(recompute_s);
    store.release(l);
  }
  t.backward_s = seconds_since(start);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Partitioned activation checkpoints: the restores' exposed transfer, with and without prefetch"};
  int tp = 2;
  std::size_t layers = 12;
  double mib = 16, recompute_ms = 2, latency_us = 10, gbps = 12.5;
  int repeats = 5;
  app.add_option("--tp", tp, "ranks of the tensor-parallel group (threads)")->check(CLI::Range(2, 64));
  app.add_option("--layers", layers, "checkpoints per backward pass")->check(CLI::Range(2, 10000));
  app.add_option("--mib", mib, "MiB per checkpoint, whole")->check(CLI::Range(0.01, 4096.0));
  app.add_option("--recompute-ms", recompute_ms, "a layer's recomputation (busy wait), ms")->check(CLI::Range(0.0, 1e4));
  app.add_option("--latency-us", latency_us, "the modeled link's latency per collective, us")->check(CLI::Range(0.0, 1e6));
  app.add_option("--gbps", gbps, "the modeled link's bandwidth, GB/s")->check(CLI::Range(1e-3, 1e4));
  app.add_option("--repeats", repeats, "backward passes timed (the median is reported)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  const auto elements = static_cast<std::size_t>(mib * 1024 * 1024 / sizeof(zero::bf16));
  const zero::comm::link_model model = zero::comm::link_model::of(latency_us, gbps);
  const std::size_t slice = (elements + static_cast<std::size_t>(tp) - 1) / static_cast<std::size_t>(tp);
  // The modeled all-gather of one checkpoint: alpha + (tp - 1) slices / beta.
  const double gather_s = model.latency_s + static_cast<double>((tp - 1) * slice * sizeof(zero::bf16)) / model.bytes_per_s;

  nlohmann::json out = {{"tp", tp},
                        {"layers", layers},
                        {"checkpoint_mib", mib},
                        {"recompute_ms", recompute_ms},
                        {"link", {{"latency_us", latency_us}, {"gbps", gbps}}},
                        {"modeled_gather_ms", gather_s * 1e3}};
  const zero::comm::link_model instant{};
  for (zero::activation_mode mode : {zero::activation_mode::partitioned, zero::activation_mode::partitioned_cpu}) {
    nlohmann::json m;
    for (bool prefetch : {false, true}) {
      nlohmann::json loop;
      // Over the instant link and the modeled one alternately, pass after pass, so that both see the
      // machine in the same state; [0]: instant, [1]: the link.
      std::vector<double> backward_s[2], restore_s[2], prefetch_s[2];
      threads::launch(tp, [&](threads& base) {
        modeled_link over[2] = {modeled_link(base, instant), modeled_link(base, model)};
        for (auto& comm : over) backward(comm, mode, layers, elements, recompute_ms * 1e-3, prefetch);  // warm
        for (int k = 0; k < repeats; ++k)
          for (int l = 0; l < 2; ++l) {
            const timings r = backward(over[l], mode, layers, elements, recompute_ms * 1e-3, prefetch);
            if (base.rank() == 0) {
              backward_s[l].push_back(r.backward_s);
              restore_s[l].push_back(r.restore_s);
              prefetch_s[l].push_back(r.prefetch_s);
            }
          }
      });
      double restore_ms[2];
      for (int l = 0; l < 2; ++l) {
        restore_ms[l] = median(restore_s[l]) * 1e3;
        loop[l ? "link" : "instant"] = {{"backward_ms", median(backward_s[l]) * 1e3},
                                        {"restore_ms", restore_ms[l]},
                                        {"prefetch_ms", median(prefetch_s[l]) * 1e3}};
      }
      loop["exposed_transfer_ms"] = std::max(0.0, restore_ms[1] - restore_ms[0]);
      m[prefetch ? "prefetch_next" : "restore_only"] = loop;
    }
    const double alone = m["restore_only"]["exposed_transfer_ms"].get<double>();
    const double ahead = m["prefetch_next"]["exposed_transfer_ms"].get<double>();
    // The transfer the loop waits for with prefetch, over what it waits for restoring alone.
    m["exposed_ratio"] = alone > 0 ? ahead / alone : 0.0;
    out[zero::to_string(mode)] = m;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
