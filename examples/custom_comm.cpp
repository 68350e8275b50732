// custom_comm: a user-defined CommBackend, a network model over comm::threads, plugged into the engine unchanged.
//
// A researcher who wants to know what ZeRO's traffic would cost on a given network writes a
// decorator like this one: it forwards every collective to a real backend (so training is real)
// and adds the time a ring algorithm would take on links of the given latency and bandwidth.
#include <cstdio>
#include <cstdint>
#include <string>

#include "mlp.hpp"
#include "zero/zero.hpp"

namespace {

// alpha-beta model of ring collectives: a reduce-scatter or all-gather is N-1 rounds of one
// message of buffer/N bytes; an all-reduce is both; a broadcast is pipelined, about one buffer.
template <zero::CommBackend Inner>
class modelled_network {
 public:
  using system = typename Inner::system;
  modelled_network(Inner& inner, double latency_s, double bytes_per_s)
      : inner_(&inner), latency_(latency_s), bandwidth_(bytes_per_s) {}

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  double seconds() const { return seconds_; }
  void reset() { seconds_ = 0; }

  template <class T>
  void all_reduce(const T* s, T* r, std::size_t count, zero::reduce_op op) {
    inner_->all_reduce(s, r, count, op);
    ring(2, count * sizeof(T));
  }
  template <class T>
  void reduce_scatter(const T* s, T* r, std::size_t count, zero::reduce_op op) {
    inner_->reduce_scatter(s, r, count, op);
    ring(1, count * sizeof(T) * static_cast<std::size_t>(size()));
  }
  template <class T>
  void all_gather(const T* s, T* r, std::size_t count) {
    inner_->all_gather(s, r, count);
    ring(1, count * sizeof(T) * static_cast<std::size_t>(size()));
  }
  template <class T>
  void broadcast(const T* s, T* r, std::size_t count, int root) {
    inner_->broadcast(s, r, count, root);
    if (size() > 1) seconds_ += latency_ + static_cast<double>(count * sizeof(T)) / bandwidth_;
  }
  void barrier() {
    inner_->barrier();
    seconds_ += latency_;
  }

 private:
  void ring(int passes, std::size_t buffer_bytes) {
    const int n = size();
    if (n == 1) return;
    const double chunk = static_cast<double>(buffer_bytes) / n;
    seconds_ += passes * (n - 1) * (latency_ + chunk / bandwidth_);
  }
  Inner* inner_;
  double latency_, bandwidth_;
  double seconds_ = 0;
};
static_assert(zero::CommBackend<modelled_network<zero::comm::threads>>);

struct outcome {
  double seconds_per_step = 0;
  std::uint64_t hash = 0;
};

template <class Stage>
outcome run(const mlp::config& cfg, int ranks, int steps, double latency, double bandwidth) {
  outcome out;
  zero::comm::threads::launch(ranks, [&](zero::comm::threads& threads) {
    modelled_network<zero::comm::threads> net(threads, latency, bandwidth);
    zero::engine<Stage, modelled_network<zero::comm::threads>, zero::optim::adamw> e(net, mlp::make_spec(cfg));
    e.initialize(mlp::initializer(cfg));
    net.reset();
    for (int t = 0; t < steps; ++t) mlp::train_step(e, cfg, static_cast<std::uint64_t>(t), threads.rank(), ranks);
    const double per_step = net.seconds() / steps;
    const auto params = e.full_params();
    if (threads.rank() == 0) out = {per_step, zero::fnv1a64(params.data(), params.size() * sizeof(float))};
  });
  return out;
}

}  // namespace

int main() {
  const mlp::config cfg{.layers = 4, .hidden = 128, .in = 64, .classes = 10, .batch = 32, .seed = 7};
  const int ranks = 4, steps = 5;
  const double latency = 5e-6, bandwidth = 10e9;  // 5 us, 10 GB/s links
  std::printf("modelled ring network: %d ranks, %.0f us latency, %.0f GB/s per link\n", ranks, latency * 1e6,
              bandwidth / 1e9);
  const outcome o[4] = {run<zero::stage0>(cfg, ranks, steps, latency, bandwidth),
                        run<zero::stage1>(cfg, ranks, steps, latency, bandwidth),
                        run<zero::stage2>(cfg, ranks, steps, latency, bandwidth),
                        run<zero::stage3>(cfg, ranks, steps, latency, bandwidth)};
  int failures = 0;
  for (int s = 0; s < 4; ++s) {
    std::printf("  stage %d: %8.1f us of communication per step, param_hash %016llx\n", s, o[s].seconds_per_step * 1e6,
                static_cast<unsigned long long>(o[s].hash));
    if (o[s].hash != o[0].hash) ++failures;
  }
  // The bandwidth terms are 2 Psi, 2 Psi, 2 Psi and 3 Psi: stage 3 must cost more than stage 1.
  if (!(o[3].seconds_per_step > o[1].seconds_per_step)) ++failures;
  std::printf("%s\n", failures ? "FAILED: stages disagree or the model is inconsistent" : "all stages agree");
  return failures ? 1 : 0;
}
